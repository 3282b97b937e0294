/* mc_scan.h — memcached's text protocol, for the shim's lease reads
 * (issue 26): which bytes a client sent are whole read-only requests (get,
 * gets, mg) the leader may answer without the log, and, in a connection's
 * two byte streams, which replies answer those requests, so that the shim
 * can leave exactly those bytes out of the output stream it hashes
 * (shim_unchecked.c): the backups never see a lease read.
 *
 * The same shape as resp_scan.h, for the other wire protocol. Requests are
 * scanned as the server reads them, numbering those that get a reply (in
 * memcached's text protocol every request gets exactly one, unless it asks
 * for none: `noreply`, a meta command's `q`); replies are scanned as the
 * server sends them, counting complete replies. A reply is recognised from
 * its own bytes: "VALUE ... <bytes>" and "STAT" lines open a reply that
 * "END" (or an error line) closes, "VA <bytes>" carries a value, and any
 * other line is a whole reply. Both scanners are driven by the bytes alone,
 * so every replica that read and sent the same bytes numbers the same
 * replies. Anything whose reply count or shape is not certain from the
 * request alone (noreply and quiet requests, whose errors still answer;
 * storage lines memcached refuses without swallowing their value; ms;
 * stats subcommands that list other things; watch, lru_crawler, quit; the
 * binary protocol; lines memcached would refuse as too long) ends the
 * scanning for that connection: no more lease reads on it, and its output
 * is then checked in full. Stopping is always safe, never wrong.
 *
 * One reply is compared in a form of its own: `stats cachedump`'s (the
 * state probe's key lists, apps/memcached/state_probe.py). It lists a slab
 * class's items in LRU order, and a lease read moves an item untouched for
 * 60 s to its LRU's head on the leader only; so its ITEM lines are hashed
 * each on its own and summed, and the sum (MC_CANON_LEN bytes) stands in the
 * compared stream for the reply: the same items in any order compare equal,
 * any other item list does not.
 *
 * Plain C11, header-only, no allocation, no locks, bounded work per byte:
 * the caller owns the state and serializes each scanner. Included by the
 * shim, guard/common/config.cc (to check a profile's list) and the test. */
#ifndef LOCKSTEP_MC_SCAN_H
#define LOCKSTEP_MC_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MC_WORD 16        /* longest word kept (command, stats argument), with its NUL */
#define MC_QUEUE 32       /* lease-read replies awaiting their turn, per connection */
#define MC_KEY 250        /* memcached's KEY_MAX_LENGTH */
#define MC_LINE 1024      /* memcached closes a connection on a longer line ... */
#define MC_GET_LINE 65536 /* ... but a get's, which it reads on: ours stops here */
/* A queue entry's flag: the reply is a stats cachedump's, compared in its
 * canonical form; without it the reply is left out (a lease read's). */
#define MC_CANON ((uint64_t)1 << 63)
#define MC_CANON_LEN 18 /* the form: 16 hex digits of the sum and "\r\n" */

/* ------------------------------------------------------------ the list */

/* The commands a lease may serve: only those whose reply this scanner knows
 * and that change nothing a later request could see (not gat/gats: they
 * touch). */
enum { MC_CMD_GET = 1, MC_CMD_GETS = 2, MC_CMD_MG = 4 };

struct mc_list {
  uint32_t cmds; /* MC_CMD_* */
};

static inline int mc_word_is(const char* w, size_t len, const char* s) {
  return strlen(s) == len && memcmp(w, s, len) == 0;
}

static inline uint32_t mc_lease_cmd(const char* w, size_t len) {
  if (mc_word_is(w, len, "get")) return MC_CMD_GET;
  if (mc_word_is(w, len, "gets")) return MC_CMD_GETS;
  if (mc_word_is(w, len, "mg")) return MC_CMD_MG;
  return 0;
}

/* Parses "get, gets, mg" into l (memcached's commands are lower case and
 * case-sensitive). 0: fine; -1: an entry that is empty or not one of get,
 * gets, mg, with l left empty. */
static inline int mc_list_parse(struct mc_list* l, const char* text) {
  l->cmds = 0;
  const char* p = text;
  while (*p) {
    while (*p == ' ' || *p == '\t') p++;
    const char* w = p;
    while (*p && *p != ',' && *p != ' ' && *p != '\t') p++;
    uint32_t cmd = mc_lease_cmd(w, (size_t)(p - w));
    while (*p == ' ' || *p == '\t') p++;
    if (!cmd || (*p && *p != ',')) goto bad;
    l->cmds |= cmd;
    if (*p == ',' && !*++p) goto bad; /* a trailing comma: an empty entry */
  }
  return 0;
bad:
  l->cmds = 0;
  return -1;
}

/* ------------------------------------------------------------ requests */

enum mc_in_state {
  MC_IN_START = 0, /* at the start of a request */
  MC_IN_LINE,      /* its command line, up to '\n' */
  MC_IN_DATA,      /* a storage command's value */
  MC_IN_DATA_CR,   /* the value's "\r\n" */
  MC_IN_DATA_LF,
  MC_IN_OFF /* scanning has ended on this connection */
};

struct mc_in {
  uint8_t state;
  uint8_t in_token; /* inside a word of the line */
  uint8_t cr;       /* the last byte was '\r': only '\n' may follow */
  uint8_t bad;      /* a word that had to be a number is not */
  uint8_t key_over; /* the key is longer than memcached takes */
  uint8_t any_q;    /* a word "q" past the key: a quiet meta command */
  uint8_t word_len, arg_len, tok_len, value_digits;
  char word[MC_WORD]; /* the command; word_len MC_WORD: longer */
  char arg[MC_WORD];  /* its first argument (stats'); arg_len MC_WORD: longer */
  char tok[8];        /* the current word's first bytes ("q", "noreply") */
  uint32_t tokens;    /* words of the line so far */
  uint32_t token_len; /* bytes of the current word */
  uint32_t line_len;
  uint64_t value;     /* a storage command's <bytes> */
  uint64_t data_left; /* of the value, before its "\r\n" */
  uint64_t requests;  /* requests read that get a reply: kept from one to the next */
  /* A stats cachedump was read: the state probe's connection (apps/memcached/
   * state_probe.py), whose reads must go through the log to be compared on
   * every replica. Kept, as requests. */
  uint8_t no_lease;
};

/* What the request scanner hands over to the reply scanner: the numbers of
 * the replies to leave out, oldest first (as resp_queue). */
struct mc_queue {
  uint64_t at[MC_QUEUE];
};

static inline int mc_is_storage(const struct mc_in* in) {
  const char* w = in->word;
  size_t n = in->word_len;
  return mc_word_is(w, n, "set") || mc_word_is(w, n, "add") || mc_word_is(w, n, "replace") ||
         mc_word_is(w, n, "append") || mc_word_is(w, n, "prepend") || mc_word_is(w, n, "cas");
}

/* Byte c, the len-th of word t (0: the command) of the current line. */
static inline void mc_token_byte(struct mc_in* in, uint32_t t, unsigned char c, uint32_t len) {
  if (t == 0) {
    if (in->word_len < MC_WORD - 1)
      in->word[in->word_len++] = (char)c;
    else
      in->word_len = MC_WORD;
    return;
  }
  if (t == 1) {
    if (len > MC_KEY) in->key_over = 1;
    if (in->arg_len < MC_WORD - 1)
      in->arg[in->arg_len++] = (char)c;
    else
      in->arg_len = MC_WORD;
    return;
  }
  if (!mc_is_storage(in)) return;
  /* set k <flags> <exptime> <bytes>, cas k <flags> <exptime> <bytes> <cas>:
   * memcached answers a word that is not a number with an error and then
   * reads the value as a command line; ours stops instead. */
  int digit = c >= '0' && c <= '9';
  if (t == 3 && c == '-' && len == 1) return; /* a negative exptime */
  if ((t == 2 || t == 3 || t == 5) && !digit) in->bad = 1;
  if (t == 4) {
    if (!digit || in->value_digits >= 10) {
      in->bad = 1;
      return;
    }
    in->value = in->value * 10 + (uint64_t)(c - '0');
    in->value_digits++;
  }
}

/* The command line is complete. Returns the state to go on in, and sets
 * *reply when the request gets one (2: one compared in its canonical form). */
static inline int mc_line_done(struct mc_in* in, int* reply) {
  const char* w = in->word;
  size_t n = in->word_len;
  *reply = 0;
  if (in->tokens == 0 || n >= MC_WORD) return MC_IN_OFF;
  int get = mc_word_is(w, n, "get") || mc_word_is(w, n, "gets") || mc_word_is(w, n, "gat") ||
            mc_word_is(w, n, "gats");
  if (in->line_len > (get ? MC_GET_LINE : MC_LINE)) return MC_IN_OFF;
  if (get) { /* a key named "q" or "noreply" is just a key */
    *reply = 1;
    return MC_IN_START;
  }
  /* memcached reads "noreply" (or a meta command's "q") as the line's last
   * word: no reply, except an error's. */
  int quiet = in->tokens >= 2 && (mc_word_is(in->tok, in->tok_len, "q") ||
                                  mc_word_is(in->tok, in->tok_len, "noreply"));
  if (quiet || in->any_q) return MC_IN_OFF;
  if (mc_is_storage(in)) {
    uint32_t want = mc_word_is(w, n, "cas") ? 6 : 5;
    if (in->tokens != want || in->bad || in->key_over || !in->value_digits) return MC_IN_OFF;
    in->data_left = in->value;
    *reply = 1;
    return in->data_left ? MC_IN_DATA : MC_IN_DATA_CR;
  }
  if (mc_word_is(w, n, "mg") || mc_word_is(w, n, "md") || mc_word_is(w, n, "ma") ||
      mc_word_is(w, n, "me") || mc_word_is(w, n, "mn") || mc_word_is(w, n, "delete") ||
      mc_word_is(w, n, "incr") || mc_word_is(w, n, "decr") || mc_word_is(w, n, "touch") ||
      mc_word_is(w, n, "version") || mc_word_is(w, n, "verbosity") ||
      mc_word_is(w, n, "flush_all")) {
    *reply = 1;
    return MC_IN_START;
  }
  if (mc_word_is(w, n, "stats")) { /* those answered with STAT lines and END */
    const char* a = in->arg;
    size_t k = in->arg_len;
    if (in->tokens == 4 && mc_word_is(a, k, "cachedump")) { /* ITEM lines and END */
      *reply = 2;
      in->no_lease = 1;
      return MC_IN_START;
    }
    if (in->tokens == 1 ||
        (in->tokens == 2 &&
         (mc_word_is(a, k, "settings") || mc_word_is(a, k, "items") || mc_word_is(a, k, "slabs") ||
          mc_word_is(a, k, "sizes") || mc_word_is(a, k, "conns")))) {
      *reply = 1;
      return MC_IN_START;
    }
  }
  return MC_IN_OFF;
}

/* Scans n request bytes. For each request that gets a reply, when skip_all
 * (a lease read's bytes), push(ctx, number); for a stats cachedump,
 * push(ctx, number | MC_CANON). push returns 0 when its queue is full
 * (scanning then ends). Once scanning ends it reads nothing more. */
static inline void mc_scan_requests(int skip_all, struct mc_in* in, const unsigned char* p,
                                    size_t n, int (*push)(void* ctx, uint64_t number), void* ctx) {
  size_t i = 0;
  while (i < n && in->state != MC_IN_OFF) {
    unsigned char c = p[i];
    switch (in->state) {
      case MC_IN_START:
        if (c == 0x80) { /* the binary protocol's magic */
          in->state = MC_IN_OFF;
          break;
        }
        memset(in, 0, offsetof(struct mc_in, requests));
        in->state = MC_IN_LINE;
        break; /* c is read in MC_IN_LINE */
      case MC_IN_LINE: {
        i++;
        in->line_len++;
        if (in->cr && c != '\n') { /* memcached would take the '\r' as part of a word */
          in->state = MC_IN_OFF;
          break;
        }
        in->cr = c == '\r';
        if (c == '\n') {
          int reply = 0;
          int next = mc_line_done(in, &reply);
          if (reply) {
            uint64_t number = in->requests++;
            if (reply == 2 && !skip_all) number |= MC_CANON;
            if ((skip_all || reply == 2) && !push(ctx, number)) next = MC_IN_OFF;
          }
          in->state = (uint8_t)next;
          break;
        }
        if (in->line_len > MC_GET_LINE) {
          in->state = MC_IN_OFF;
          break;
        }
        if (c == ' ' || c == '\r') {
          if (in->in_token && in->tokens >= 3 && mc_word_is(in->tok, in->tok_len, "q"))
            in->any_q = 1;
          in->in_token = 0;
          break;
        }
        if (!in->in_token) {
          in->in_token = 1;
          in->tokens++;
          in->token_len = 0;
          in->tok_len = 0;
        }
        in->token_len++;
        if (in->tok_len < sizeof in->tok) in->tok[in->tok_len++] = (char)c;
        mc_token_byte(in, in->tokens - 1, c, in->token_len);
        break;
      }
      case MC_IN_DATA: {
        size_t take = n - i < in->data_left ? n - i : (size_t)in->data_left;
        i += take;
        in->data_left -= take;
        if (!in->data_left) in->state = MC_IN_DATA_CR;
        break;
      }
      case MC_IN_DATA_CR: in->state = p[i++] == '\r' ? MC_IN_DATA_LF : MC_IN_OFF; break;
      case MC_IN_DATA_LF: in->state = p[i++] == '\n' ? MC_IN_START : MC_IN_OFF; break;
      default: in->state = MC_IN_OFF;
    }
  }
}

/* ------------------------------------------------------------ lease reads */

/* The mg flags a lease read may carry: those that only return something.
 * Not q (a miss would answer nothing), T, N, E, I (they write), h, l (they
 * report accesses, which lease reads make differ between replicas), nor any
 * other. */
static inline int mc_mg_flag_ok(unsigned char f) {
  return f == 'b' || f == 'c' || f == 'f' || f == 'k' || f == 'O' || f == 's' || f == 't' ||
         f == 'v';
}

/* n bytes a client sent, read at once: how many requests they hold when they
 * are all whole command lines of the listed commands (get/gets with 1 or
 * more keys of at most MC_KEY bytes; mg with a key and only mc_mg_flag_ok
 * flags), each ending in "\r\n" or "\n"; 0 otherwise. Bounded: one pass. */
static inline int mc_lease_requests(const struct mc_list* l, const unsigned char* p, size_t n) {
  int requests = 0;
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    while (end < n && p[end] != '\n' && end - i <= MC_LINE) end++;
    if (end >= n || p[end] != '\n') return 0; /* not whole, or too long for ours */
    size_t stop = end > i && p[end - 1] == '\r' ? end - 1 : end;
    uint32_t cmd = 0, tokens = 0;
    for (size_t t = i; t < stop;) {
      while (t < stop && p[t] == ' ') t++;
      if (t == stop) break;
      size_t s = t;
      while (t < stop && p[t] != ' ') t++;
      size_t len = t - s;
      if (tokens == 0) {
        cmd = mc_lease_cmd((const char*)p + s, len) & l->cmds;
        if (!cmd) return 0;
      } else if (tokens == 1 || cmd != MC_CMD_MG) {
        if (len > MC_KEY) return 0; /* memcached refuses it */
      } else if (!mc_mg_flag_ok(p[s]) || (p[s] != 'O' && len != 1)) {
        return 0;
      }
      for (size_t k = s; k < t; k++)
        if (p[k] == '\r') return 0; /* a stray '\r': not a plain line */
      tokens++;
    }
    if (tokens < 2) return 0;
    requests++;
    i = end + 1;
  }
  return requests;
}

/* ------------------------------------------------------------ replies */

enum mc_out_state {
  MC_OUT_LINE = 0, /* a reply line, up to '\n' */
  MC_OUT_DATA,     /* a value's bytes and "\r\n" */
  MC_OUT_OFF       /* skipping has ended on this connection */
};

struct mc_out {
  uint8_t state;
  uint8_t open;  /* a top-level reply has begun */
  uint8_t multi; /* inside VALUE/STAT lines, until END */
  uint8_t va;    /* the value read is a meta VA reply's: its end ends the reply */
  uint8_t skip;  /* the current reply is left out */
  uint8_t canon; /* the current reply is compared in its canonical form */
  uint8_t in_token, word_len, num_bad, num_digits;
  char word[MC_WORD];
  uint32_t tokens;
  uint64_t num; /* VALUE's <bytes> (4th word), VA's <size> (2nd) */
  uint64_t data_left;
  uint64_t replies;        /* replies complete */
  uint64_t head;           /* entries of the queue consumed */
  uint64_t line_hash, sum; /* canon: the current line's FNV-1a, the lines' sum */
  char form[MC_CANON_LEN]; /* canon: what stands for the reply, once it ends */
};

static inline void mc_canon_form(struct mc_out* o) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) o->form[i] = hex[(o->sum >> (60 - 4 * i)) & 15];
  o->form[16] = '\r';
  o->form[17] = '\n';
}

/* A reply line is complete. 1: the reply is complete with it; 0: it goes on;
 * -1: not a reply this scanner knows. */
static inline int mc_reply_line(struct mc_out* o) {
  const char* w = o->word;
  size_t n = o->word_len;
  if (mc_word_is(w, n, "END") || mc_word_is(w, n, "ERROR") || mc_word_is(w, n, "CLIENT_ERROR") ||
      mc_word_is(w, n, "SERVER_ERROR"))
    return 1;
  if (mc_word_is(w, n, "VALUE") || mc_word_is(w, n, "VA")) {
    if (o->num_bad || !o->num_digits || o->tokens < (n == 2 ? 2u : 4u)) return -1;
    o->data_left = o->num + 2;
    o->va = n == 2;
    o->multi = o->multi || !o->va;
    if (o->va && o->multi) return -1;
    o->state = MC_OUT_DATA;
    return 0;
  }
  if (mc_word_is(w, n, "STAT")) {
    o->multi = 1;
    return 0;
  }
  return o->multi ? -1 : 1;
}

/* One run of output at p: its length (> 0 when n > 0), all of it skipped
 * (*skipped = 1) or all checked. tail: entries the request scanner has
 * queued so far. A run ends where a reply ends (as resp_output_run). A
 * stats cachedump's reply is skipped, and the run that ends it sets *form
 * to the MC_CANON_LEN bytes compared in its place (else *form is NULL). */
static inline size_t mc_output_run(struct mc_out* o, const struct mc_queue* q, uint64_t tail,
                                   const unsigned char* p, size_t n, int* skipped,
                                   const char** form) {
  *skipped = 0;
  *form = NULL;
  if (o->state == MC_OUT_OFF || n == 0) return n;
  if (!o->open) { /* a reply begins */
    while (o->head != tail && (q->at[o->head % MC_QUEUE] & ~MC_CANON) < o->replies) o->head++;
    uint64_t at = o->head != tail ? q->at[o->head % MC_QUEUE] : 0;
    int ours = o->head != tail && (at & ~MC_CANON) == o->replies;
    o->canon = ours && (at & MC_CANON);
    o->skip = (uint8_t)ours;
    o->open = 1;
    o->multi = 0;
    o->sum = 0;
    o->line_hash = 14695981039346656037ull;
  }
  *skipped = o->skip;
  size_t i = 0;
  while (i < n) {
    int done = 0;
    if (o->state == MC_OUT_DATA) {
      size_t take = n - i < o->data_left ? n - i : (size_t)o->data_left;
      i += take;
      o->data_left -= take;
      if (o->data_left) continue;
      o->state = MC_OUT_LINE;
      o->tokens = o->word_len = o->in_token = 0;
      if (!o->va) continue;
      done = 1;
    } else {
      unsigned char c = p[i++];
      if (o->canon) { /* every byte of a line counts, in order; lines in any order */
        o->line_hash = (o->line_hash ^ c) * 1099511628211ull;
        if (c == '\n') {
          o->sum += o->line_hash;
          o->line_hash = 14695981039346656037ull;
          /* its END, or an error instead of a list, ends it */
          done = mc_word_is(o->word, o->word_len, "END") ||
                 mc_word_is(o->word, o->word_len, "ERROR") ||
                 mc_word_is(o->word, o->word_len, "CLIENT_ERROR") ||
                 mc_word_is(o->word, o->word_len, "SERVER_ERROR");
          o->tokens = o->word_len = o->in_token = 0;
          if (done) {
            mc_canon_form(o);
            *form = o->form;
          }
        } else if (c == ' ' || c == '\r') {
          o->in_token = 0;
          if (o->word_len) o->tokens = 2; /* past the first word */
        } else if (o->tokens == 0) {
          if (o->word_len < MC_WORD - 1)
            o->word[o->word_len++] = (char)c;
          else
            o->word_len = MC_WORD;
        }
      } else if (c == '\n') {
        int r = mc_reply_line(o);
        if (r < 0) { /* what follows is checked in full */
          o->state = MC_OUT_OFF;
          return i;
        }
        if (o->state == MC_OUT_LINE) o->tokens = o->word_len = o->in_token = 0;
        o->num = o->num_digits = o->num_bad = 0;
        done = r == 1;
      } else if (c == ' ' || c == '\r') {
        o->in_token = 0;
      } else {
        if (!o->in_token) {
          o->in_token = 1;
          o->tokens++;
        }
        if (o->tokens == 1) {
          if (o->word_len < MC_WORD - 1)
            o->word[o->word_len++] = (char)c;
          else
            o->word_len = MC_WORD;
        } else if ((o->tokens == 4 && mc_word_is(o->word, o->word_len, "VALUE")) ||
                   (o->tokens == 2 && mc_word_is(o->word, o->word_len, "VA"))) {
          if (c < '0' || c > '9' || o->num_digits >= 12)
            o->num_bad = 1;
          else
            o->num = o->num * 10 + (uint64_t)(c - '0'), o->num_digits++;
        }
      }
    }
    if (!done) continue;
    if (o->skip) o->head++; /* a canonical one's entry too */
    o->replies++;
    o->open = 0;
    o->multi = 0;
    return i;
  }
  return i;
}

#endif
