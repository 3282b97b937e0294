// loadgen — a closed-loop (and, for redis, memcached and tarantool, open-loop) load generator
// for redis (RESP), memcached (text protocol), LDAPv3 servers such as slapd (hand-written BER,
// no libldap), ClamAV's clamd (INSTREAM) and Tarantool (iproto, hand-written MessagePack, no
// msgpuck). The same program drives every mode of scripts/bench (unreplicated, lockstep,
// aof-always, redis-wait), so the numbers compare like with like.
//
//   loadgen --proto redis|memcached|ldap|clamd|tarantool --host H --port P --conns N
//           [--ops-per-conn K] [--seconds S] --op OP [--value-bytes 64] [--keys 10000]
//           [--wait-replicas 2] [--set-ratio P] [--rate R [--max-outstanding 64]]
//           [--bind-dn cn=admin,dc=lockstep,dc=test] [--password secret] [--add-from 0]
//           [--infected-every 0] [--infected-string LOCKSTEP-TEST-SIGNATURE-7f3a9c]
//           [--space-docs 512] [--space-kv 513]
//
// Each of the N connections has its own thread and one request outstanding: it sends a
// request, waits for the whole reply, then sends the next (closed loop; --rate below makes
// it an open loop). A connection stops
// after K ops or S seconds, whichever comes first; a reply that has not come 5 s after the
// deadline counts as an error and ends that connection, so a run always ends.
//   set       redis `SET key:<n> <value>`, memcached `set key:<n> 0 0 <bytes>`
//   get       redis `GET key:<n>`, memcached `get key:<n>` (a miss is counted in "misses")
//   set-wait  redis only: `SET`, then `WAIT <wait-replicas> 0` once SET's reply is in; the
//             pair is one op and its latency covers both round trips
//   add       ldap: adds cn=k<conn>-<i>,ou=bench,dc=lockstep,dc=test, i the connection's op
//             number from --add-from on (objectClass person, cn, sn, and a description of
//             <value-bytes> bytes); entryAlreadyExists (68) is an error, so a second run needs
//             a fresh database or a --add-from past the first run's entries
//   modify    ldap: replaces the description of cn=key<n>,ou=bench,dc=lockstep,dc=test;
//             noSuchObject (32) is counted in "misses"
//   search    ldap: base-scope search of cn=key<n>,ou=bench,... for its description, done at
//             SearchResultDone (entries before it are skipped); 32 is counted in "misses"
//   prefill   ldap: the first connection adds dc=lockstep,dc=test and ou=bench before the
//             clock starts (68 is fine); then cn=key0 .. cn=key<keys-1>, as modify and search
//             expect them, are added once, split across the connections, which then stop; an
//             entry already there is counted in "misses"
//   scan      clamd: `zINSTREAM` of <value-bytes> bytes of fixed pseudo-random data in 8 KiB
//             chunks; the reply must be "stream: OK". With --infected-every K, every K-th op
//             of a connection has --infected-string in the middle of its data instead and
//             its reply must say FOUND (counted in "found"); ERROR, a clean stream FOUND or a
//             marked one OK is an error
// Tarantool (iproto; the spaces of apps/tarantool/init.lua, by id: --space-docs, memtx, index
// 0 on field 1 unsigned, index 1 on field 2 string; --space-kv, vinyl, index 0 on field 1
// string; a select that returns no tuple is counted in "misses"):
//   doc-replace   REPLACE into docs [n, "owner<n%16>", {"body": <value-bytes>, "n": n}]
//   doc-get       SELECT from docs index 0, key [n], limit 1
//   doc-by-owner  SELECT from docs index 1 (the owner), key ["owner<n%16>"], limit 10
//   kv-set        REPLACE into kv ["key:<n>", <value-bytes>]
//   kv-get        SELECT from kv index 0, key ["key:<n>"], limit 1
//   prefill       docs 0 .. <keys-1> and key:0 .. key:<keys-1>, as the others expect them,
//                 replaced once (each key's doc, then its kv pair: two ops), split across the
//                 connections, which then stop
// --op defaults to set (redis, memcached) and scan (clamd); ldap and tarantool need one. Before
// the clock starts, every ldap connection makes a simple bind as --bind-dn with --password,
// every clamd connection sends `zIDSESSION` (so one connection carries all its scans, each
// reply prefixed with the request's number) and checks it with `zPING`, and every tarantool
// connection reads the server's 128-byte greeting and selects with limit 0 from each space and
// index its op uses, with a key of the op's type (so a wrong or swapped --space-docs or
// --space-kv exits at once, with the server's message, instead of making every op an error);
// these are not ops, and a refusal exits 1.
// Keys are drawn uniformly from key:0 .. key:<keys-1> (ldap: cn=key<n>; tarantool docs: n).
// An error reply (redis -ERR, memcached ERROR, an LDAP resultCode not named above, a tarantool
// response code 0x8000 | errcode) is counted in "errors" and the connection goes on; a reply
// that cannot be parsed, an LDAP message id, a clamd request number or a tarantool
// IPROTO_SYNC that is not the request's ends the connection ("lost").
// --set-ratio P (redis, memcached, tarantool; 0 to 100, fractions allowed) mixes the workload:
// each op is a set (tarantool: kv-set) with probability P %, else a get (kv-get), in place of
// --op, which may then only be one of the two. The JSON line then also has "sets", the number
// of sets made.
//
// Open loop (--rate R; redis and memcached, ops set and get; tarantool, every op but prefill):
// the N connections together send R requests per second whether or not replies have come, so
// that a server that falls behind sees its queue grow as it would under many independent
// clients, instead of slowing the clients down with it (which a closed loop does, hiding the
// queueing). Each connection has R/N of the rate and sends on its own schedule of exponential
// inter-arrival times (Poisson arrivals: memoryless like independent clients, and N Poisson
// streams add up to one of rate R; a fixed interval would send the connections' requests in
// lockstep bursts or unrealistically evenly). A connection sends each request when its time
// comes and reads replies as they arrive (pipelining; redis and memcached reply in order,
// tarantool in the order its fibers finish, e.g. a memtx select before an earlier replace still
// waiting for the WAL, so each reply is matched to its request by IPROTO_SYNC), with at most
// --max-outstanding (default 64) requests unanswered: a request due while that many are
// unanswered goes out as soon as a reply frees a slot, and is counted in "late". Every op's
// latency runs from its scheduled send time, not from when it went out, so that waiting for a
// slot (or for a busy loadgen thread) counts as the queueing it is ("coordinated omission"
// would hide it). Requests due after --seconds are not sent; those due before it that were
// still waiting for a slot at that moment are counted in "unsent" and not sent. Then the
// connection waits for the replies still due, 5 s at most: one that has not come by then counts
// as an error and ends the connection ("lost"), so a run always ends by --seconds + 5 s.
// --ops-per-conn does not go with --rate.
// Every op's latency (CLOCK_MONOTONIC) goes into a log-linear histogram (1.6% resolution).
// Prints one JSON line on stdout:
//   {"ops", "seconds", "ops_per_s", "p50_us", "p99_us", "errors", "misses", "found"}
// with --set-ratio also "sets"; with --rate also "target_rate" (R), "achieved_rate" (ops
// completed per second, = ops_per_s: ops over the time from the start until the last
// connection was done), "late", "unsent" and "max_outstanding".
// Exit status: 0; 1 when a connection cannot be made, set up (bind, IDSESSION, greeting, the
// spaces) or is lost (the JSON is still printed for a lost connection); 2 for a bad command
// line.
//
// This file is the engine and the command line; each protocol's requests, replies and connection
// setup are in their own file, a `struct protocol` behind loadgen_proto.h, which the engine looks
// up by --proto name in `protocols` below: loadgen_resp.c (redis, memcached), loadgen_ldap.c,
// loadgen_clamd.c and loadgen_tarantool.c.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "loadgen_proto.h"

// Every protocol, in the order --proto's message names them.
static const struct protocol* const protocols[] = {
    &redis_protocol, &memcached_protocol, &ldap_protocol, &clamd_protocol, &tarantool_protocol};
#define NPROTOS (int)(sizeof protocols / sizeof protocols[0])

static const char* const op_names[NOPS] = {
    "set",  "get",         "set-wait", "add",          "modify", "search", "prefill",
    "scan", "doc-replace", "doc-get",  "doc-by-owner", "kv-set", "kv-get"};

#define GRACE_NS 5000000000LL  // how long an op may run past the deadline

static const struct protocol* proto = &redis_protocol;  // --proto

static struct config cfg = {
    .op = -1,  // the protocol's default
    .conns = 1,
    .value_bytes = 64,
    .keys = 10000,
    .wait_replicas = 2,
    .max_outstanding = 64,
    .seconds = 10.0,
    .set_ratio = -1,
    .host = "127.0.0.1",
    .bind_dn = "cn=admin,dc=lockstep,dc=test",
    .password = "secret",
    .infected_string = "LOCKSTEP-TEST-SIGNATURE-7f3a9c",
    .space_docs = 512,  // the first two spaces a user makes: init.lua makes docs, then kv
    .space_kv = 513};

static int64_t start_ns, deadline_ns;
static char* value;  // the --value-bytes bytes every request that writes a value carries

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Log-linear histogram: values below 64 ns exactly, above that 64 buckets per power of two.
static int bucket_of(uint64_t v) {
  if (v < (1u << SUB_BITS)) return (int)v;
  int e = 63 - __builtin_clzll(v);  // e >= SUB_BITS
  int sub = (int)((v >> (e - SUB_BITS)) & ((1u << SUB_BITS) - 1));
  return ((e - SUB_BITS + 1) << SUB_BITS) + sub;
}

// The middle of bucket b, in ns.
static double bucket_mid(int b) {
  if (b < (1 << SUB_BITS)) return b;
  int e = (b >> SUB_BITS) + SUB_BITS - 1;
  uint64_t sub = b & ((1u << SUB_BITS) - 1);
  double width = (double)(1ULL << (e - SUB_BITS));
  return ((1ULL << SUB_BITS) + sub) * width + width / 2;
}

static double percentile_us(const uint64_t* hist, long long total, double q) {
  if (total == 0) return 0;
  long long rank = (long long)(q * (double)total);
  if (rank >= total) rank = total - 1;
  long long seen = 0;
  for (int b = 0; b < NBUCKETS; b++) {
    seen += (long long)hist[b];
    if (seen > rank) return bucket_mid(b) / 1000.0;
  }
  return 0;
}

static double uniform01(uint64_t* s) {  // in (0, 1]: never 0, so that log() of it is finite
  return (double)((next_rand(s) >> 11) + 1) * 0x1p-53;
}

// The op of a connection's next request: --op; with --set-ratio a set or a get at random (the
// sets counted in c->sets).
static int next_op(struct conn* c) {
  if (cfg.set_ratio >= 0) {
    if (uniform01(&c->rng) * 100.0 > cfg.set_ratio) return proto->get_op;
    c->sets++;
    return proto->set_op;
  }
  return cfg.op;
}

static int send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

// Sends one request and reads its reply. Returns the reply kind, or -1 (reason in c->lost)
// when the connection broke, the reply was garbled, or no reply came by the deadline + grace.
static int round_trip(struct conn* c, const char* req, size_t n) {
  if (send_all(c->fd, req, n) < 0) {
    c->lost = strerror(errno);  // glibc: a static string for every errno value
    return -1;
  }
  c->len = 0;
  for (;;) {
    int kind;
    long used = proto->parse(c, &kind);
    if (used < 0) {
      if (!c->lost) c->lost = "garbled reply";
      return -1;
    }
    if (used > 0) return kind;
    if (c->len + 1 == c->cap) {  // one byte stays free for the terminating NUL
      c->cap *= 2;
      c->buf = realloc(c->buf, c->cap);
    }
    int64_t left_ms = (deadline_ns + GRACE_NS - now_ns()) / 1000000;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int r = poll(&p, 1, left_ms > 0 ? (int)left_ms : 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      c->lost = r == 0 ? "no reply within 5 s after the deadline" : strerror(errno);
      return -1;
    }
    ssize_t got = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      c->lost = got == 0 ? "closed by the server" : strerror(errno);
      return -1;
    }
    c->len += (size_t)got;
    c->buf[c->len] = '\0';  // so that atol, sscanf and strtoul stop inside the buffer
  }
}

static void* run_conn(void* arg) {
  struct conn* c = arg;
  char wait_req[64];
  size_t wait_len = 0;
  if (cfg.op == OP_SET_WAIT) wait_len = proto->format_wait(c, wait_req, sizeof wait_req);
  // prefill: this connection's share of the keys
  long first = (long)((long long)cfg.keys * c->id / cfg.conns);
  long end = (long)((long long)cfg.keys * (c->id + 1) / cfg.conns);
  while ((cfg.ops_per_conn == 0 || c->ops + c->errors < cfg.ops_per_conn) &&
         now_ns() < deadline_ns) {
    long k;
    if (cfg.op == OP_PREFILL) {  // tarantool: each key twice, its doc and its kv pair
      k = first + (long)(c->seq / proto->prefill_requests);
      if (k >= end) break;
    } else if (cfg.op == OP_ADD) {
      k = (long)(cfg.add_from + c->seq);
    } else {
      k = (long)(next_rand(&c->rng) % (uint64_t)cfg.keys);
    }
    int op = next_op(c);
    size_t n;
    const char* req = proto->format(c, op == OP_SET_WAIT ? OP_SET : op, k, &n);
    c->seq++;
    int64_t t0 = now_ns();
    int kind = round_trip(c, req, n);
    if (kind == REPLY_OK && cfg.op == OP_SET_WAIT) kind = round_trip(c, wait_req, wait_len);
    int64_t t1 = now_ns();
    if (kind < 0) {
      c->errors++;
      break;
    }
    if (kind == REPLY_ERROR) {
      c->errors++;
      continue;
    }
    if (kind == REPLY_MISS) c->misses++;
    if (kind == REPLY_FOUND) c->found++;
    c->ops++;
    c->hist[bucket_of((uint64_t)(t1 - t0))]++;
  }
  return NULL;
}

// The open loop of one connection (--rate; see the top comment). One thread, one
// non-blocking socket: it sleeps in ppoll until the next request is due or a reply comes,
// reads every reply there is, then sends every request that is due and has a slot.
static void* run_open(void* arg) {
  struct conn* c = arg;
  int max = cfg.max_outstanding;
  double mean_ns = 1e9 * cfg.conns / cfg.rate;  // this connection's mean inter-arrival time
  // The scheduled times of the unanswered requests, by slot. redis and memcached reply in
  // order: their slots are a ring, oldest (= next reply) first. Tarantool's replies name their
  // request by sync (replies_by_sync; see tnt_begin in loadgen_tarantool.c): its free slots are a
  // stack.
  int64_t* due = malloc(sizeof *due * (size_t)max);
  uint64_t* sync = calloc((size_t)max, sizeof *sync);  // tarantool: each slot's sync; 0: free
  int* spare = malloc(sizeof *spare * (size_t)max);    // tarantool: the free slots
  int head = 0, inflight = 0, blocked = 0, nspare = max;
  for (int i = 0; i < max; i++) spare[i] = max - 1 - i;
  int64_t late_before = INT64_MIN;  // requests due by then waited for a slot
  size_t out_cap = (size_t)max * ((size_t)cfg.value_bytes + 128), out_len = 0, out_off = 0;
  char* out = malloc(out_cap);  // bytes of the unanswered requests not yet sent
  int64_t next = start_ns + (int64_t)(-log(uniform01(&c->rng)) * mean_ns);
  int64_t end = deadline_ns + GRACE_NS;
  fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
  // Wake when a request is due, not up to 50 us later (the default timer slack), which would
  // be counted in every latency.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  c->len = 0;
  for (;;) {
    // Read what there is, in a few calls at most: a server that keeps sending cannot hold the
    // thread here past the end (what is left wakes ppoll at once).
    for (int reads = 0; reads < 8; reads++) {
      if (c->len + 1 == c->cap) {  // one byte stays free for the terminating NUL
        c->cap *= 2;
        c->buf = realloc(c->buf, c->cap);
      }
      ssize_t got = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
      if (got > 0) {
        c->len += (size_t)got;
        c->buf[c->len] = '\0';  // so that atol and sscanf stop inside the buffer
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c->lost = got == 0 ? "closed by the server" : strerror(errno);
      goto done;
    }
    int64_t now = now_ns();  // every reply just read arrived by now
    size_t off = 0;
    while (inflight > 0) {
      int kind, slot = head;
      uint64_t id = 0;  // tarantool: the reply's sync
      long used = proto->parse_next(c, off, &kind, &id);
      if (used < 0) {
        c->lost = "garbled reply";
        goto done;
      }
      if (used == 0) break;
      off += (size_t)used;
      if (proto->replies_by_sync) {
        slot = (int)(id & 0xffff);
        if (slot >= max || sync[slot] != id) {
          c->lost = "reply to no request";
          goto done;
        }
        sync[slot] = 0;
        spare[nspare++] = slot;
      } else {
        head = (head + 1) % max;
      }
      int64_t at = due[slot];
      inflight--;
      if (kind == REPLY_ERROR) {
        c->errors++;
        continue;
      }
      if (kind == REPLY_MISS) c->misses++;
      c->ops++;
      c->hist[bucket_of((uint64_t)(now - at))]++;
    }
    if (inflight == 0 && off < c->len) {
      c->lost = "reply to no request";
      goto done;
    }
    c->len -= off;
    memmove(c->buf, c->buf + off, c->len + 1);  // with the NUL
    if (out_off > 0) {  // keep the unsent bytes at the start, so that out_cap is enough
      memmove(out, out + out_off, out_len - out_off);
      out_len -= out_off;
      out_off = 0;
    }
    if (blocked) {  // every request due by now had to wait for a slot
      late_before = now;
      blocked = 0;
    }
    while (next <= now && next < deadline_ns && inflight < max) {
      int op = next_op(c);
      long k = (long)(next_rand(&c->rng) % (uint64_t)cfg.keys);
      int slot = proto->replies_by_sync ? spare[--nspare] : (head + inflight) % max;
      size_t n;
      c->slot = slot;
      const char* req = proto->format(c, op, k, &n);
      memcpy(out + out_len, req, n);
      out_len += n;
      due[slot] = next;
      sync[slot] = c->sync;
      inflight++;
      c->seq++;
      if (next <= late_before) c->late++;
      next += (int64_t)(-log(uniform01(&c->rng)) * mean_ns);
    }
    if (next <= now && next < deadline_ns) blocked = 1;  // due, but every slot is taken
    if (now >= deadline_ns || next >= deadline_ns) {     // the schedule is over
      while (next < deadline_ns) {  // due before the deadline, still without a slot: not sent
        c->unsent++;
        next += (int64_t)(-log(uniform01(&c->rng)) * mean_ns);
      }
      next = INT64_MAX;
    }
    while (out_off < out_len) {
      ssize_t w = send(c->fd, out + out_off, out_len - out_off, MSG_NOSIGNAL);
      if (w > 0) {
        out_off += (size_t)w;
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c->lost = strerror(errno);  // glibc: a static string for every errno value
      goto done;
    }
    if (next == INT64_MAX && inflight == 0) break;  // all sent and answered
    now = now_ns();
    if (now >= end) {
      c->errors += inflight;
      c->lost = "no reply within 5 s after the deadline";
      break;
    }
    // Wake for the next request if it has a slot (else only a reply can give it one), at
    // the deadline if requests are still due (to count what is unsent), or at the end of
    // the grace; a reply wakes it earlier.
    int64_t wake = end;
    if (next != INT64_MAX) wake = inflight < max ? next : deadline_ns;
    int64_t left = wake > now ? wake - now : 0;
    struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
    struct pollfd pf = {.fd = c->fd, .events = POLLIN | (out_off < out_len ? POLLOUT : 0)};
    if (ppoll(&pf, 1, &ts, NULL) < 0 && errno != EINTR) {
      c->lost = strerror(errno);
      break;
    }
  }
done:
  free(due);
  free(sync);
  free(spare);
  free(out);
  return NULL;
}

static int connect_to(const char* host, const char* port) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0) {
    fprintf(stderr, "loadgen: cannot resolve %s:%s: %s\n", host, port, gai_strerror(rc));
    return -1;
  }
  int fd = -1, err = 0;
  for (ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    fprintf(stderr, "loadgen: cannot connect to %s:%s: %s\n", host, port, strerror(err));
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// The start of what was read of c's last reply, escaped, for a message on stderr.
static void print_reply(const struct conn* c) {
  fprintf(stderr, "\"");
  for (size_t i = 0; i < c->len && i < 80; i++) {
    unsigned char ch = (unsigned char)c->buf[i];
    fprintf(stderr, ch >= 32 && ch < 127 && ch != '\\' ? "%c" : "\\x%02x", ch);
  }
  fprintf(stderr, "\"\n");
}

// What a connection does before the clock starts (not counted as ops). ldap: a simple bind,
// and for prefill on the first connection the two entries above the keys, which the other
// connections' adds need. clamd: IDSESSION, checked with PING (request number 1). tarantool:
// the greeting, and a select with limit 0 from every space and index the op uses. Exits 1
// when the connection breaks or the server says no.
static void setup_conn(struct conn* c) {
  deadline_ns = now_ns();  // so each reply may take GRACE_NS
  if (proto->setup) proto->setup(c);
}

// What every connection's protocol may use of the engine (value is set once it is made).
static struct engine engine = {
    .cfg = &cfg, .send_all = send_all, .round_trip = round_trip, .print_reply = print_reply};

static void usage(void) {
  fprintf(stderr,
          "usage: loadgen --proto redis|memcached|ldap|clamd|tarantool --port P\n"
          "               [--host 127.0.0.1] [--conns 1] [--ops-per-conn K] [--seconds 10]\n"
          "               [--op OP] [--value-bytes 64] [--keys 10000] [--wait-replicas 2]\n"
          "               [--set-ratio P] [--rate R [--max-outstanding 64]]\n"
          "               [--bind-dn cn=admin,dc=lockstep,dc=test] [--password secret]\n"
          "               [--add-from 0]\n"
          "               [--infected-every 0] [--infected-string S]\n"
          "               [--space-docs 512] [--space-kv 513]\n"
          "  OP: redis set|get|set-wait, memcached set|get, ldap add|modify|search|prefill,\n"
          "      clamd scan, tarantool doc-replace|doc-get|doc-by-owner|kv-set|kv-get|prefill\n"
          "  --set-ratio P: P %% sets, the rest gets (redis, memcached; tarantool kv-set, kv-get)\n"
          "  --rate R: open loop, R requests/s over all connections (redis, memcached,\n"
          "            tarantool)\n");
  exit(2);
}

static long num_arg(const char* name, const char* s, long lo, long hi) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < lo || v > hi) {
    fprintf(stderr, "loadgen: --%s expects a number in [%ld, %ld], got '%s'\n", name, lo, hi, s);
    exit(2);
  }
  return v;
}

// A number in [lo, hi] (lo_open: in (lo, hi]) for option `name`, else exit 2.
static double real_arg(const char* name, const char* s, double lo, double hi, int lo_open) {
  char* end;
  double v = strtod(s, &end);
  if (*end || end == s || !(lo_open ? v > lo : v >= lo) || !(v <= hi)) {
    fprintf(stderr, "loadgen: --%s expects a number in %c%g, %g], got '%s'\n", name,
            lo_open ? '(' : '[', lo, hi, s);
    exit(2);
  }
  return v;
}

// Prints on stderr the names of the protocols (open_loop: those with --set-ratio and --rate) as
// "a, b or c", and a newline.
static void print_protocols(int open_loop) {
  const char* names[NPROTOS];
  int n = 0;
  for (int i = 0; i < NPROTOS; i++)
    if (!open_loop || protocols[i]->set_op >= 0) names[n++] = protocols[i]->name;
  for (int i = 0; i < n; i++)
    fprintf(stderr, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", names[i]);
  fprintf(stderr, "\n");
}

static void parse_args(int argc, char** argv) {
  static const struct option opts[] = {{"proto", 1, 0, 'P'},
                                       {"host", 1, 0, 'h'},
                                       {"port", 1, 0, 'p'},
                                       {"conns", 1, 0, 'c'},
                                       {"ops-per-conn", 1, 0, 'k'},
                                       {"seconds", 1, 0, 's'},
                                       {"op", 1, 0, 'o'},
                                       {"value-bytes", 1, 0, 'v'},
                                       {"keys", 1, 0, 'n'},
                                       {"wait-replicas", 1, 0, 'w'},
                                       {"bind-dn", 1, 0, 'D'},
                                       {"password", 1, 0, 'W'},
                                       {"add-from", 1, 0, 'A'},
                                       {"infected-every", 1, 0, 'I'},
                                       {"infected-string", 1, 0, 'S'},
                                       {"set-ratio", 1, 0, 'r'},
                                       {"rate", 1, 0, 'R'},
                                       {"max-outstanding", 1, 0, 'm'},
                                       {"space-docs", 1, 0, 'd'},
                                       {"space-kv", 1, 0, 'K'},
                                       {"help", 0, 0, '?'},
                                       {0, 0, 0, 0}};
  int o, ldap_opts = 0, clamd_opts = 0, tnt_opts = 0, max_given = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
      case 'P': {
        int i = 0;
        while (i < NPROTOS && strcmp(optarg, protocols[i]->name) != 0) i++;
        if (i == NPROTOS) {
          fprintf(stderr, "loadgen: --proto must be ");
          print_protocols(0);
          exit(2);
        }
        proto = protocols[i];
        break;
      }
      case 'h': cfg.host = optarg; break;
      case 'p':
        num_arg("port", optarg, 1, 65535);  // checked, but kept as a string for getaddrinfo
        cfg.port = optarg;
        break;
      case 'c': cfg.conns = (int)num_arg("conns", optarg, 1, 4096); break;
      case 'k': cfg.ops_per_conn = num_arg("ops-per-conn", optarg, 1, 1L << 40); break;
      case 's': cfg.seconds = real_arg("seconds", optarg, 0, 86400, 1); break;
      case 'r': cfg.set_ratio = real_arg("set-ratio", optarg, 0, 100, 0); break;
      case 'R': cfg.rate = real_arg("rate", optarg, 0, 1e8, 1); break;
      case 'm':
        cfg.max_outstanding = (int)num_arg("max-outstanding", optarg, 1, 1 << 16);
        max_given = 1;
        break;
      case 'o':
        for (cfg.op = 0; cfg.op < NOPS; cfg.op++)
          if (strcmp(optarg, op_names[cfg.op]) == 0) break;
        if (cfg.op == NOPS) {
          fprintf(stderr,
                  "loadgen: --op must be set, get, set-wait, add, modify, search, prefill, scan, "
                  "doc-replace, doc-get, doc-by-owner, kv-set or kv-get\n");
          exit(2);
        }
        break;
      case 'v': cfg.value_bytes = (int)num_arg("value-bytes", optarg, 1, 1 << 26); break;
      case 'n': cfg.keys = (int)num_arg("keys", optarg, 1, 1 << 30); break;
      case 'w': cfg.wait_replicas = (int)num_arg("wait-replicas", optarg, 0, 1000); break;
      case 'D':
        cfg.bind_dn = optarg;
        ldap_opts = 1;
        break;
      case 'W':
        cfg.password = optarg;
        ldap_opts = 1;
        break;
      case 'A':
        cfg.add_from = num_arg("add-from", optarg, 0, 1L << 50);
        ldap_opts = 1;
        break;
      case 'I':
        cfg.infected_every = (int)num_arg("infected-every", optarg, 0, 1 << 30);
        clamd_opts = 1;
        break;
      case 'S':
        cfg.infected_string = optarg;
        clamd_opts = 1;
        break;
      case 'd':
        cfg.space_docs = (int)num_arg("space-docs", optarg, 0, INT_MAX);
        tnt_opts = 1;
        break;
      case 'K':
        cfg.space_kv = (int)num_arg("space-kv", optarg, 0, INT_MAX);
        tnt_opts = 1;
        break;
      default: usage();
    }
  }
  if (optind < argc || !cfg.port) usage();
  if (cfg.set_ratio >= 0 || cfg.rate > 0) {
    if (proto->set_op < 0) {
      fprintf(stderr, "loadgen: %s needs --proto ", cfg.rate > 0 ? "--rate" : "--set-ratio");
      print_protocols(1);
      exit(2);
    }
    // --set-ratio mixes the protocol's set and get. The open loop sends the protocol's
    // open_ops: ops that are one request (not set-wait) and have no end of their own (not
    // prefill); where those are only the set and the get, --rate alone limits --op to them.
    unsigned mix = 1u << proto->set_op | 1u << proto->get_op;
    int rate_limits = cfg.rate > 0 && proto->open_ops == mix;
    if (cfg.set_ratio < 0 && !rate_limits) {
      if (cfg.op >= 0 && !(proto->open_ops & 1u << cfg.op)) {
        fprintf(stderr, "loadgen: --rate does not go with --op %s\n", op_names[cfg.op]);
        exit(2);
      }
    } else if (cfg.op >= 0 && !(mix & 1u << cfg.op)) {
      fprintf(stderr, "loadgen: %s goes with --op %s or %s only\n",
              rate_limits ? "--rate" : "--set-ratio", op_names[proto->set_op],
              op_names[proto->get_op]);
      exit(2);
    }
  }
  if (cfg.rate > 0 && cfg.ops_per_conn) {
    fprintf(stderr, "loadgen: --ops-per-conn does not go with --rate\n");
    exit(2);
  }
  if (max_given && cfg.rate == 0) {
    fprintf(stderr, "loadgen: --max-outstanding needs --rate\n");
    exit(2);
  }
  if (cfg.op < 0) {  // the protocol's default; with --set-ratio, its set
    if (proto->default_op < 0 && cfg.set_ratio < 0) {
      fprintf(stderr, "loadgen: --proto %s needs --op %s\n", proto->name, proto->needs_op);
      exit(2);
    }
    cfg.op = proto->default_op >= 0 ? proto->default_op : proto->set_op;
  }
  if (!(proto->ops & 1u << cfg.op)) {
    fprintf(stderr, "loadgen: --op %s does not go with --proto %s (%s has:", op_names[cfg.op],
            proto->name, proto->name);
    for (int i = 0; i < NOPS; i++)
      if (proto->ops & 1u << i) fprintf(stderr, " %s", op_names[i]);
    fprintf(stderr, ")\n");
    exit(2);
  }
  if (ldap_opts && proto != &ldap_protocol) {
    fprintf(stderr, "loadgen: --bind-dn, --password and --add-from need --proto ldap\n");
    exit(2);
  }
  if (clamd_opts && proto != &clamd_protocol) {
    fprintf(stderr, "loadgen: --infected-every and --infected-string need --proto clamd\n");
    exit(2);
  }
  if (tnt_opts && proto != &tarantool_protocol) {
    fprintf(stderr, "loadgen: --space-docs and --space-kv need --proto tarantool\n");
    exit(2);
  }
  size_t sl = strlen(cfg.infected_string);
  if (proto == &clamd_protocol && (sl == 0 || sl > (size_t)cfg.value_bytes)) {
    fprintf(stderr, "loadgen: --infected-string must be 1 to --value-bytes (%d) bytes long\n",
            cfg.value_bytes);
    exit(2);
  }
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  size_t vb = (size_t)cfg.value_bytes;
  value = malloc(vb);
  if (proto->make_value) {
    proto->make_value(&cfg, value);
  } else {
    for (size_t i = 0; i < vb; i++) value[i] = (char)('a' + i % 26);
  }
  engine.value = value;

  struct conn* cs = calloc((size_t)cfg.conns, sizeof *cs);
  for (int i = 0; i < cfg.conns; i++) {  // every connection is up before the clock starts
    cs[i].fd = connect_to(cfg.host, cfg.port);
    if (cs[i].fd < 0) return 1;
    cs[i].engine = &engine;
    cs[i].id = i;
    cs[i].rng = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1) ^ (uint64_t)now_ns();
    cs[i].req = malloc(vb + 512 + strlen(cfg.bind_dn) + strlen(cfg.password));
    cs[i].cap = vb + 256;
    cs[i].buf = malloc(cs[i].cap);
    setup_conn(&cs[i]);
  }
  // The open loop's schedules start 20 ms from now, so that starting the threads is not
  // counted as the first requests' latency.
  start_ns = now_ns() + (cfg.rate > 0 ? 20000000 : 0);
  deadline_ns = start_ns + (int64_t)(cfg.seconds * 1e9);
  for (int i = 0; i < cfg.conns; i++) {
    if (pthread_create(&cs[i].thread, NULL, cfg.rate > 0 ? run_open : run_conn, &cs[i]) != 0) {
      fprintf(stderr, "loadgen: cannot start thread %d\n", i);
      return 1;
    }
  }

  static uint64_t hist[NBUCKETS];
  long long ops = 0, errors = 0, misses = 0, found = 0, sets = 0, late = 0, unsent = 0;
  int lost = 0;
  const char* why = NULL;
  const struct conn* example = NULL;
  for (int i = 0; i < cfg.conns; i++) {
    pthread_join(cs[i].thread, NULL);
    for (int b = 0; b < NBUCKETS; b++) hist[b] += cs[i].hist[b];
    ops += cs[i].ops;
    errors += cs[i].errors;
    misses += cs[i].misses;
    found += cs[i].found;
    sets += cs[i].sets;
    late += cs[i].late;
    unsent += cs[i].unsent;
    if (cs[i].lost) {
      lost++;
      why = cs[i].lost;
      example = &cs[i];
    }
    close(cs[i].fd);
  }
  double secs = (double)(now_ns() - start_ns) / 1e9;
  if (lost) {  // say why, with the start of what was read of the last reply
    fprintf(stderr,
            "loadgen: %d of %d connections to %s:%s lost, e.g. %s after %lld ops; read: ", lost,
            cfg.conns, cfg.host, cfg.port, why, example->ops);
    print_reply(example);
  }
  double per_s = secs > 0 ? (double)ops / secs : 0.0;
  printf(
      "{\"ops\": %lld, \"seconds\": %.3f, \"ops_per_s\": %.1f, \"p50_us\": %.1f, "
      "\"p99_us\": %.1f, \"errors\": %lld, \"misses\": %lld, \"found\": %lld",
      ops, secs, per_s, percentile_us(hist, ops, 0.50), percentile_us(hist, ops, 0.99), errors,
      misses, found);
  if (cfg.set_ratio >= 0) printf(", \"sets\": %lld", sets);
  if (cfg.rate > 0)
    printf(
        ", \"target_rate\": %.1f, \"achieved_rate\": %.1f, \"late\": %lld, \"unsent\": %lld, "
        "\"max_outstanding\": %d",
        cfg.rate, per_s, late, unsent, cfg.max_outstanding);
  printf("}\n");
  for (int i = 0; i < cfg.conns; i++) {  // freed for LeakSanitizer (scripts/sanitize)
    free(cs[i].req);
    free(cs[i].buf);
  }
  free(cs);
  free(value);
  return lost ? 1 : 0;
}
