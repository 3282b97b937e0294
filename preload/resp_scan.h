/* resp_scan.h — finds, in a connection's two byte streams, the replies to
 * the commands an app profile leaves unchecked (redis INFO, CLIENT LIST:
 * pids, ports, uptimes and memory figures differ between replicas by
 * nature), so that the shim can leave exactly those bytes out of the
 * output stream it hashes (shim_unchecked.c).
 *
 * The protocol is redis's RESP. Requests are scanned as the server reads
 * them (multibulk and inline), numbering those that get a reply; replies are
 * scanned as the server sends them (RESP2 and RESP3 types, nested
 * aggregates, attributes; RESP3 pushes are not replies), counting complete
 * replies. A request numbered k that names an unchecked command is queued,
 * and the reply numbered k is skipped. Both scanners are driven by the bytes
 * alone, so every replica that read and sent the same bytes skips the same
 * ones; a stream that stops making sense to a scanner (not RESP, or a
 * command after which replies stop matching requests one to one: SUBSCRIBE,
 * MONITOR, CLIENT REPLY) ends the skipping for that connection, and its
 * output is then checked in full.
 *
 * Plain C11, header-only, no allocation, no locks: the caller owns the
 * state and serializes each scanner. Included by the shim and its test. */
#ifndef LOCKSTEP_RESP_SCAN_H
#define LOCKSTEP_RESP_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define RESP_WORD 24  /* longest command word matched, with its NUL */
#define RESP_LIST 32  /* unchecked commands in a list */
#define RESP_QUEUE 32 /* unchecked requests awaiting their reply, per connection */

/* ------------------------------------------------------------ the list */

/* Unchecked commands: "INFO" matches INFO with any arguments, "CLIENT LIST"
 * only that subcommand. Upper case. */
struct resp_list {
  struct {
    char word[2][RESP_WORD];
    uint8_t len[2]; /* strlen of each word: compared first, on every request */
    uint8_t words;  /* 1 or 2 */
  } cmd[RESP_LIST];
  uint32_t count;
};

static inline char resp_upper(char c) {
  return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
}

/* Parses "INFO, CLIENT LIST, MEMORY" into l. 0: fine; -1: a bad entry (empty,
 * more than two words, a word too long or not [A-Za-z0-9_|-], or too many
 * entries), with l left empty. */
static inline int resp_list_parse(struct resp_list* l, const char* text) {
  memset(l, 0, sizeof *l);
  const char* p = text;
  while (*p) {
    if (l->count == RESP_LIST) goto bad;
    unsigned words = 0, len = 0, in_word = 0;
    for (; *p && *p != ','; p++) {
      char c = *p;
      if (c == ' ' || c == '\t') {
        in_word = 0;
        continue;
      }
      int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-' || c == '|';
      if (!ok) goto bad;
      if (!in_word) {
        if (++words > 2) goto bad;
        in_word = 1;
        len = 0;
      }
      if (len + 1 >= RESP_WORD) goto bad;
      l->cmd[l->count].word[words - 1][len++] = resp_upper(c);
      l->cmd[l->count].len[words - 1] = (uint8_t)len;
    }
    if (!words) goto bad;
    l->cmd[l->count++].words = (uint8_t)words;
    if (*p == ',') {
      p++;
      if (!*p) goto bad; /* a trailing comma: an empty entry */
    }
  }
  return 0;
bad:
  memset(l, 0, sizeof *l);
  return -1;
}

/* ------------------------------------------------------------ numbers */

/* A RESP length line being read: digits, maybe a leading '-', up to '\n'
 * ('\r' is passed over). */
struct resp_num {
  int64_t value;
  uint8_t digits, negative;
};

/* 0: more to come; 1: complete; -1: malformed. */
static inline int resp_num_step(struct resp_num* n, unsigned char c) {
  if (c >= '0' && c <= '9') {
    if (n->value > ((int64_t)1 << 40)) return -1; /* no server sends that much */
    n->value = n->value * 10 + (c - '0');
    n->digits++;
    return 0;
  }
  if (c == '-' && !n->digits && !n->negative) {
    n->negative = 1;
    return 0;
  }
  if (c == '\r') return 0;
  if (c == '\n' && n->digits) {
    if (n->negative) n->value = -n->value;
    return 1;
  }
  return -1;
}

/* ------------------------------------------------------------ requests */

enum resp_in_state {
  RESP_IN_START = 0, /* at the start of a request */
  RESP_IN_COUNT,     /* "*<count>" */
  RESP_IN_ARG_HDR,   /* expecting '$' */
  RESP_IN_ARG_LEN,   /* "$<len>" */
  RESP_IN_ARG_DATA,  /* the argument's bytes */
  RESP_IN_ARG_CR,    /* its "\r\n" */
  RESP_IN_ARG_LF,
  RESP_IN_INLINE, /* an inline command line, up to '\n' */
  RESP_IN_OFF     /* skipping has ended on this connection */
};

struct resp_in {
  uint8_t state;
  uint8_t in_multi, multi_unchecked; /* inside MULTI; an unchecked command was queued */
  uint8_t in_word;                   /* inline: inside a word */
  struct resp_num num;
  int64_t args_left;  /* multibulk arguments still to read */
  uint64_t data_left; /* bytes of the current argument still to read */
  uint32_t argc;      /* arguments read so far (inline: words) */
  uint32_t line_len;  /* inline: bytes of the line so far */
  char word[2][RESP_WORD];
  uint8_t word_len[2]; /* RESP_WORD: longer than any listed word */
  uint64_t requests;   /* requests read that get a reply */
};

/* What the request scanner hands over to the reply scanner: the numbers of
 * unchecked requests, oldest first. The reader appends at tail, the writer
 * consumes at head; the caller makes these atomic when they are two
 * threads (shim_unchecked.c). */
struct resp_queue {
  uint64_t at[RESP_QUEUE];
};

static inline void resp_word_add(struct resp_in* in, uint32_t which, unsigned char c) {
  if (which > 1 || in->word_len[which] >= RESP_WORD) return;
  if (in->word_len[which] == RESP_WORD - 1) {
    in->word_len[which] = RESP_WORD; /* too long to be one of ours */
    return;
  }
  in->word[which][in->word_len[which]++] = resp_upper((char)c);
}

static inline int resp_word_is(const struct resp_in* in, uint32_t which, const char* w) {
  size_t n = strlen(w);
  return in->word_len[which] == n && memcmp(in->word[which], w, n) == 0;
}

static inline int resp_word_eq(const struct resp_in* in, uint32_t which, const char* w,
                               uint8_t len) {
  return in->word_len[which] == len && memcmp(in->word[which], w, len) == 0;
}

static inline int resp_listed(const struct resp_list* l, const struct resp_in* in) {
  for (uint32_t i = 0; i < l->count; i++) {
    if (!resp_word_eq(in, 0, l->cmd[i].word[0], l->cmd[i].len[0])) continue;
    if (l->cmd[i].words == 1 ||
        (in->argc > 1 && resp_word_eq(in, 1, l->cmd[i].word[1], l->cmd[i].len[1])))
      return 1;
  }
  return 0;
}

/* A whole request was read (argc arguments). Returns 1 when it is an
 * unchecked one (its number is in *number), 0 when not, -1 when skipping
 * must end here (see the file comment). */
static inline int resp_request_done(const struct resp_list* l, struct resp_in* in,
                                    uint64_t* number) {
  if (in->argc == 0) return 0; /* an empty request: redis sends no reply */
  *number = in->requests++;
  if (resp_word_is(in, 0, "SUBSCRIBE") || resp_word_is(in, 0, "PSUBSCRIBE") ||
      resp_word_is(in, 0, "SSUBSCRIBE") || resp_word_is(in, 0, "UNSUBSCRIBE") ||
      resp_word_is(in, 0, "PUNSUBSCRIBE") || resp_word_is(in, 0, "SUNSUBSCRIBE") ||
      resp_word_is(in, 0, "MONITOR") ||
      (resp_word_is(in, 0, "CLIENT") && in->argc > 1 && resp_word_is(in, 1, "REPLY")))
    return -1;
  int unchecked = l ? resp_listed(l, in) : 1; /* NULL: every request (a lease read's) */
  /* In a transaction the command's reply is "+QUEUED" and its real reply
   * is an element of EXEC's: EXEC's whole reply is then left unchecked. */
  if (resp_word_is(in, 0, "MULTI")) {
    in->in_multi = 1;
    in->multi_unchecked = 0;
  } else if (resp_word_is(in, 0, "EXEC")) {
    unchecked = in->in_multi && in->multi_unchecked;
    in->in_multi = 0;
  } else if (resp_word_is(in, 0, "DISCARD")) {
    in->in_multi = 0;
  } else if (in->in_multi && unchecked) {
    in->multi_unchecked = 1;
    unchecked = 0;
  }
  return unchecked;
}

/* A whole request was read: the scanner starts the next, or stops (see
 * resp_request_done; and when push finds its queue full). */
static inline void resp_end_request(const struct resp_list* l, struct resp_in* in,
                                    int (*push)(void* ctx, uint64_t number), void* ctx) {
  uint64_t number = 0;
  int r = resp_request_done(l, in, &number);
  in->state = r < 0 ? RESP_IN_OFF : RESP_IN_START;
  if (r == 1 && !push(ctx, number)) in->state = RESP_IN_OFF;
}

/* A length line's digits and "\r\n" at p[*i] in p[0..n), in the one form
 * clients send: 1 to 12 digits. 1 with *i past it; 0 for anything else (not
 * all of it here, a sign, a stray '\r'), which the byte-wise scan reads. */
static inline int resp_plain_num(const unsigned char* p, size_t n, size_t* i, uint64_t* value) {
  size_t k = *i;
  uint64_t v = 0;
  while (k < n && k - *i < 12 && p[k] >= '0' && p[k] <= '9') v = v * 10 + (uint64_t)(p[k++] - '0');
  if (k == *i || n - k < 2 || p[k] != '\r' || p[k + 1] != '\n') return 0;
  *value = v;
  *i = k + 2;
  return 1;
}

/* A whole multibulk request at the start of p[0..n), read at once: its
 * length, with in->argc and in->word as the byte-wise scan leaves them;
 * 0 when it is not all here or not in the plain form (the byte-wise scan
 * then reads it, from in->word emptied again). The common case costs a
 * pass over its length lines. */
static inline size_t resp_whole_request(struct resp_in* in, const unsigned char* p, size_t n) {
  size_t i = 1;
  uint64_t count, len;
  if (p[0] != '*' || !resp_plain_num(p, n, &i, &count) || count == 0) return 0;
  for (uint64_t a = 0; a < count; a++) {
    if (i >= n || p[i] != '$') return 0;
    i++;
    if (!resp_plain_num(p, n, &i, &len) || len > n - i || n - i - len < 2 || p[i + len] != '\r' ||
        p[i + len + 1] != '\n')
      return 0;
    if (a < 2) {
      if (len >= RESP_WORD) {
        in->word_len[a] = RESP_WORD; /* too long to be one of ours */
      } else {
        for (size_t k = 0; k < len; k++) in->word[a][k] = resp_upper((char)p[i + k]);
        in->word_len[a] = (uint8_t)len;
      }
    }
    i += len + 2;
  }
  in->argc = (uint32_t)count;
  return i;
}

/* Scans n request bytes. For each unchecked request (every one when l is
 * NULL), push(ctx, number);
 * push returns 0 when its queue is full (skipping then ends). Once skipping
 * ends the scanner reads nothing more. */
static inline void resp_scan_requests(const struct resp_list* l, struct resp_in* in,
                                      const unsigned char* p, size_t n,
                                      int (*push)(void* ctx, uint64_t number), void* ctx) {
  size_t i = 0;
  while (i < n && in->state != RESP_IN_OFF) {
    int r;
    switch (in->state) {
      case RESP_IN_START: {
        size_t whole = resp_whole_request(in, p + i, n - i);
        if (whole > 0) {
          i += whole;
          resp_end_request(l, in, push, ctx);
          break;
        }
        in->argc = 0; /* and the words resp_whole_request may have begun */
        in->word_len[0] = in->word_len[1] = 0;
        if (p[i] == '*') {
          memset(&in->num, 0, sizeof in->num);
          in->state = RESP_IN_COUNT;
          i++;
        } else {
          in->line_len = 0;
          in->in_word = 0;
          in->state = RESP_IN_INLINE;
        }
        break;
      }
      case RESP_IN_COUNT:
        r = resp_num_step(&in->num, p[i++]);
        if (r < 0) {
          in->state = RESP_IN_OFF;
        } else if (r == 1) {
          if (in->num.value <= 0) { /* "*0", "*-1": no command, no reply */
            in->state = RESP_IN_START;
          } else {
            in->args_left = in->num.value;
            in->state = RESP_IN_ARG_HDR;
          }
        }
        break;
      case RESP_IN_ARG_HDR:
        if (p[i++] != '$') {
          in->state = RESP_IN_OFF; /* redis answers a protocol error and closes */
        } else {
          memset(&in->num, 0, sizeof in->num);
          in->state = RESP_IN_ARG_LEN;
        }
        break;
      case RESP_IN_ARG_LEN:
        r = resp_num_step(&in->num, p[i++]);
        if (r < 0 || (r == 1 && in->num.value < 0)) {
          in->state = RESP_IN_OFF;
        } else if (r == 1) {
          in->data_left = (uint64_t)in->num.value;
          in->state = in->data_left ? RESP_IN_ARG_DATA : RESP_IN_ARG_CR;
        }
        break;
      case RESP_IN_ARG_DATA: {
        size_t take = n - i < in->data_left ? n - i : (size_t)in->data_left;
        if (in->argc < 2)
          for (size_t k = 0; k < take && in->word_len[in->argc] < RESP_WORD; k++)
            resp_word_add(in, in->argc, p[i + k]);
        i += take;
        in->data_left -= take;
        if (!in->data_left) in->state = RESP_IN_ARG_CR;
        break;
      }
      case RESP_IN_ARG_CR: in->state = p[i++] == '\r' ? RESP_IN_ARG_LF : RESP_IN_OFF; break;
      case RESP_IN_ARG_LF:
        if (p[i++] != '\n') {
          in->state = RESP_IN_OFF;
          break;
        }
        in->argc++;
        if (--in->args_left > 0) {
          in->state = RESP_IN_ARG_HDR;
          break;
        }
        resp_end_request(l, in, push, ctx);
        break;
      case RESP_IN_INLINE: {
        unsigned char c = p[i++];
        if (c == '\n') {
          resp_end_request(l, in, push, ctx);
        } else if (c == ' ' || c == '\t' || c == '\r') {
          in->in_word = 0;
        } else {
          if (!in->in_word) {
            in->in_word = 1;
            in->argc++;
          }
          resp_word_add(in, in->argc - 1, c);
        }
        if (in->state == RESP_IN_INLINE && ++in->line_len > 65536)
          in->state = RESP_IN_OFF; /* redis refuses such a line */
        break;
      }
      default: in->state = RESP_IN_OFF;
    }
  }
}

/* ------------------------------------------------------------ replies */

enum resp_out_state {
  RESP_OUT_TYPE = 0, /* at a value's type byte */
  RESP_OUT_LINE,     /* a simple value, up to '\n' */
  RESP_OUT_NUM,      /* a length or count line */
  RESP_OUT_BLOB,     /* a bulk value's bytes and "\r\n" */
  RESP_OUT_OFF       /* skipping has ended on this connection */
};

struct resp_out {
  uint8_t state, type;
  uint8_t push, skip; /* the current top-level value is a RESP3 push; is skipped */
  struct resp_num num;
  uint64_t blob_left;
  uint64_t pending; /* values still to read in the current top-level one; 0: between */
  uint64_t replies; /* replies (not pushes) complete */
  uint64_t head;    /* entries of the queue consumed */
};

/* The reply scanner gives up at p[at]: the run ends before that byte (or,
 * when that is the run's first byte, the whole rest is one checked run). */
static inline size_t resp_output_off(struct resp_out* o, size_t at, size_t n, int* skipped) {
  o->state = RESP_OUT_OFF;
  if (at > 0) return at;
  *skipped = 0;
  return n;
}

/* One run of output at p: its length (> 0 when n > 0), all of it skipped
 * (*skipped = 1) or all checked. tail: entries the request scanner has
 * queued so far. A run ends where a reply ends, so that the next one can be
 * judged on its own. */
static inline size_t resp_output_run(struct resp_out* o, const struct resp_queue* q, uint64_t tail,
                                     const unsigned char* p, size_t n, int* skipped) {
  *skipped = 0;
  if (o->state == RESP_OUT_OFF || n == 0) return n;
  if (o->pending == 0) { /* a top-level value begins */
    while (o->head != tail && q->at[o->head % RESP_QUEUE] < o->replies)
      o->head++; /* never the case while both scanners agree; do not stall on it */
    o->push = p[0] == '>';
    /* Replies come in request order, so the oldest queued number is the
     * only one the next reply can be; one past it means it was missed. */
    o->skip = !o->push && o->head != tail && q->at[o->head % RESP_QUEUE] == o->replies;
    o->pending = 1;
  }
  *skipped = o->skip;
  size_t i = 0;
  while (i < n) {
    int r, done = 0;
    switch (o->state) {
      case RESP_OUT_TYPE:
        o->type = p[i++];
        switch (o->type) {
          case '+':
          case '-':
          case ':':
          case '_':
          case ',':
          case '#':
          case '(': o->state = RESP_OUT_LINE; break;
          case '$':
          case '!':
          case '=':
          case '*':
          case '~':
          case '>':
          case '%':
          case '|':
            memset(&o->num, 0, sizeof o->num);
            o->state = RESP_OUT_NUM;
            break;
          default: /* not RESP: check everything from here on */
            return resp_output_off(o, i - 1, n, skipped);
        }
        break;
      case RESP_OUT_LINE:
        if (p[i++] == '\n') done = 1;
        break;
      case RESP_OUT_NUM:
        r = resp_num_step(&o->num, p[i++]);
        if (r < 0) return resp_output_off(o, i - 1, n, skipped);
        if (r == 0) break;
        switch (o->type) {
          case '$':
          case '!':
          case '=':
            if (o->num.value < 0) {
              done = 1; /* a null */
            } else {
              o->blob_left = (uint64_t)o->num.value + 2;
              o->state = RESP_OUT_BLOB;
            }
            break;
          case '%':
            if (o->num.value > 0) o->pending += 2 * (uint64_t)o->num.value;
            done = 1;
            break;
          case '|': /* attributes: pairs, then the value they describe */
            if (o->num.value > 0) o->pending += 2 * (uint64_t)o->num.value;
            o->state = RESP_OUT_TYPE;
            break;
          default: /* an array, set or push */
            if (o->num.value > 0) o->pending += (uint64_t)o->num.value;
            done = 1;
        }
        break;
      case RESP_OUT_BLOB: {
        size_t take = n - i < o->blob_left ? n - i : (size_t)o->blob_left;
        i += take;
        o->blob_left -= take;
        if (!o->blob_left) done = 1;
        break;
      }
      default: return i;
    }
    if (!done) continue;
    o->state = RESP_OUT_TYPE;
    if (--o->pending == 0) { /* the top-level value is complete */
      if (!o->push) {
        if (o->skip) o->head++;
        o->replies++;
      }
      return i;
    }
  }
  return i;
}

#endif
