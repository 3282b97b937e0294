// loadgen — a closed-loop (and, for redis, memcached and tarantool, open-loop) load generator
// for redis (RESP), memcached (text protocol), LDAPv3 servers such as slapd (hand-written BER,
// no libldap), ClamAV's clamd (INSTREAM) and Tarantool (iproto, hand-written MessagePack, no
// msgpuck). The same program drives every mode of scripts/bench (unreplicated, lockstep,
// aof-always, redis-wait), so the numbers compare like with like.
//
//   loadgen --proto redis|memcached|ldap|clamd|tarantool --host H --port P --conns N
//           [--ops-per-conn K] [--seconds S] --op OP [--value-bytes 64] [--keys 10000]
//           [--wait-replicas 2] [--set-ratio P] [--rate R [--max-outstanding 64]]
//           [--bind-dn cn=admin,dc=lockstep,dc=test] [--password secret]
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
//             number (objectClass person, cn, sn, and a description of <value-bytes> bytes);
//             entryAlreadyExists (68) is an error, so a second run needs a fresh database
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
#define _GNU_SOURCE
#include <arpa/inet.h>
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

enum { PROTO_REDIS, PROTO_MEMCACHED, PROTO_LDAP, PROTO_CLAMD, PROTO_TARANTOOL, NPROTOS };
enum {
  OP_SET,
  OP_GET,
  OP_SET_WAIT,
  OP_ADD,
  OP_MODIFY,
  OP_SEARCH,
  OP_PREFILL,
  OP_SCAN,
  OP_DOC_REPLACE,
  OP_DOC_GET,
  OP_DOC_BY_OWNER,
  OP_KV_SET,
  OP_KV_GET,
  NOPS
};
enum { LDAP_BIND = NOPS, LDAP_SUFFIX, LDAP_OU };  // ldap requests made before the clock starts
enum { REPLY_OK, REPLY_MISS, REPLY_FOUND, REPLY_ERROR };
enum { CLAMD_PONG, CLAMD_OK, CLAMD_FOUND };  // what a clamd reply must say
enum { TNT_REPLY, TNT_GREETING };            // what a tarantool connection reads next
enum { IPROTO_SELECT = 1, IPROTO_REPLACE = 3 };

static const char* const proto_names[NPROTOS] = {"redis", "memcached", "ldap", "clamd",
                                                 "tarantool"};
static const struct {
  const char* name;
  int protos;  // bit mask of the protocols that have the op
} op_table[NOPS] = {
    {"set", 1 << PROTO_REDIS | 1 << PROTO_MEMCACHED},
    {"get", 1 << PROTO_REDIS | 1 << PROTO_MEMCACHED},
    {"set-wait", 1 << PROTO_REDIS},
    {"add", 1 << PROTO_LDAP},
    {"modify", 1 << PROTO_LDAP},
    {"search", 1 << PROTO_LDAP},
    {"prefill", 1 << PROTO_LDAP | 1 << PROTO_TARANTOOL},
    {"scan", 1 << PROTO_CLAMD},
    {"doc-replace", 1 << PROTO_TARANTOOL},
    {"doc-get", 1 << PROTO_TARANTOOL},
    {"doc-by-owner", 1 << PROTO_TARANTOOL},
    {"kv-set", 1 << PROTO_TARANTOOL},
    {"kv-get", 1 << PROTO_TARANTOOL},
};

#define SUB_BITS 6  // 64 sub-buckets per power of two
#define NBUCKETS ((64 - SUB_BITS + 1) << SUB_BITS)
#define GRACE_NS 5000000000LL  // how long an op may run past the deadline
#define BENCH_BASE "ou=bench,dc=lockstep,dc=test"
#define LDAP_MAX_MESSAGE (1 << 28)  // longer than any reply to our requests: garbled
#define CLAMD_CHUNK 8192            // clamdscan's INSTREAM chunk size
#define TNT_GREETING_SIZE 128       // two 64-byte lines: version and instance UUID, salt
#define TNT_MAX_PACKET 0x80000000u  // iproto's own limit (IPROTO_BODY_LEN_MAX): longer is garbled
#define TNT_OWNERS 16               // doc n belongs to owner<n % 16>

static struct {
  int proto, op, conns, value_bytes, keys, wait_replicas, infected_every;
  int max_outstanding;       // open loop: unanswered requests per connection
  int space_docs, space_kv;  // tarantool: the spaces' ids
  long long ops_per_conn;    // 0: no limit
  double seconds;
  double set_ratio;  // percent of ops that are sets; < 0: every op is --op
  double rate;       // open loop: requests per second over all connections; 0: closed loop
  const char* host;
  const char* port;
  const char* bind_dn;
  const char* password;
  const char* infected_string;
} cfg = {.proto = PROTO_REDIS,
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

struct conn {
  pthread_t thread;
  int fd, id;
  const char* lost;  // why the connection was given up (closed, timed out, garbled), or NULL
  uint64_t rng;
  long long seq;  // requests the op loop has made: add's entry number, scan's K-th
  int msgid;      // ldap: the request's message id; clamd: its IDSESSION request number
  int expect;     // ldap: the response's protocolOp tag; clamd: CLAMD_*; tarantool: TNT_*
  int slot;       // tarantool, open loop: the slot of the request being made (see run_open)
  uint64_t sync;  // tarantool: the IPROTO_SYNC of the last request made
  int result;     // ldap: the resultCode of the last response
  long long ops, errors, misses, found;
  long long sets, late, unsent;  // --set-ratio: sets made; open loop: see the top comment
  uint64_t hist[NBUCKETS];
  char* req;  // request buffer
  char* buf;  // reply buffer
  size_t cap, len;
};

static int64_t start_ns, deadline_ns;
static char* value;
static char *clamd_clean, *clamd_infected;  // whole INSTREAM requests, shared by all threads
static size_t clamd_clean_len, clamd_infected_len;

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

static uint64_t next_rand(uint64_t* s) {  // xorshift64
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static double uniform01(uint64_t* s) {  // in (0, 1]: never 0, so that log() of it is finite
  return (double)((next_rand(s) >> 11) + 1) * 0x1p-53;
}

// The op of a connection's next request: --op; with --set-ratio a set or a get at random (the
// sets counted in c->sets); tarantool's prefill alternates a doc and a kv pair.
static int next_op(struct conn* c) {
  int tnt = cfg.proto == PROTO_TARANTOOL;
  if (cfg.set_ratio >= 0) {
    if (uniform01(&c->rng) * 100.0 > cfg.set_ratio) return tnt ? OP_KV_GET : OP_GET;
    c->sets++;
    return tnt ? OP_KV_SET : OP_SET;
  }
  if (tnt && cfg.op == OP_PREFILL) return c->seq % 2 ? OP_KV_SET : OP_DOC_REPLACE;
  return cfg.op;
}

// Length of a complete reply at the head of buf, 0 if more bytes are needed, -1 if the
// reply cannot be parsed. *kind says whether it is OK, a miss or an error reply.
static long parse_redis(const char* buf, size_t len, int* kind) {
  const char* eol = memmem(buf, len, "\r\n", 2);
  if (!eol) return 0;
  long line = eol - buf + 2;
  *kind = REPLY_OK;
  switch (buf[0]) {
    case '+': return line;
    case '-': *kind = REPLY_ERROR; return line;
    case ':':
      if (cfg.op == OP_SET_WAIT && atol(buf + 1) < cfg.wait_replicas) *kind = REPLY_ERROR;
      return line;
    case '$': {
      long n = atol(buf + 1);
      if (n < 0) {
        *kind = REPLY_MISS;
        return line;
      }
      return (size_t)(line + n + 2) <= len ? line + n + 2 : 0;
    }
    default: return -1;  // no array replies for SET, GET, WAIT
  }
}

static long parse_memcached(const char* buf, size_t len, int* kind) {
  const char* eol = memmem(buf, len, "\r\n", 2);
  if (!eol) return 0;
  long line = eol - buf + 2;
  *kind = REPLY_OK;
  if (strncmp(buf, "VALUE ", 6) == 0) {  // VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n
    unsigned flags;
    long n;
    if (sscanf(buf + 6, "%*s %u %ld", &flags, &n) != 2 || n < 0) return -1;
    long need = line + n + 2 + 5;
    if ((size_t)need > len) return 0;
    return memcmp(buf + need - 5, "END\r\n", 5) == 0 ? need : -1;
  }
  if (strncmp(buf, "STORED\r\n", 8) == 0) return line;
  if (strncmp(buf, "END\r\n", 5) == 0) {
    *kind = REPLY_MISS;
    return line;
  }
  *kind = REPLY_ERROR;  // ERROR, CLIENT_ERROR ..., SERVER_ERROR ..., NOT_STORED
  return line;
}

// BER for LDAP (RFC 4511 5.1: one-byte tags, definite lengths). A request is encoded by
// running the same calls twice: the first run (p == NULL) only measures every constructed
// element, the second writes each header with its length in the shortest form, so the value
// is copied once and nothing has to be moved.
struct ber {
  unsigned char* p;  // NULL while measuring
  size_t n;
  int depth, next;  // elements open; constructed elements begun so far
  int idx[8];       // measuring: which element each open one is
  size_t start[8];  // measuring: n where each open element's contents begin
  size_t len[16];   // the contents' length of each constructed element, in order of beginning
};

static void ber_head(struct ber* b, unsigned char tag, size_t len) {
  int k = len < 0x80 ? 0 : len < 0x100 ? 1 : len < 0x10000 ? 2 : len < 0x1000000 ? 3 : 4;
  if (b->p) {
    b->p[b->n] = tag;
    b->p[b->n + 1] = (unsigned char)(k == 0 ? len : 0x80u | (unsigned)k);
    for (int i = 0; i < k; i++) b->p[b->n + 2 + i] = (unsigned char)(len >> (8 * (k - 1 - i)));
  }
  b->n += 2 + (size_t)k;
}

static void ber_put(struct ber* b, unsigned char tag, const void* v, size_t len) {
  ber_head(b, tag, len);
  if (b->p) memcpy(b->p + b->n, v, len);
  b->n += len;
}

static void ber_str(struct ber* b, unsigned char tag, const char* s) {
  ber_put(b, tag, s, strlen(s));
}

static void ber_int(struct ber* b, unsigned char tag, int v) {  // INTEGER or ENUMERATED, v >= 0
  unsigned char be[5] = {0, (unsigned char)(v >> 24), (unsigned char)(v >> 16),
                         (unsigned char)(v >> 8), (unsigned char)v};
  int i = 0;
  while (i < 4 && be[i] == 0 && !(be[i + 1] & 0x80)) i++;  // shortest two's complement
  ber_put(b, tag, be + i, (size_t)(5 - i));
}

static void ber_begin(struct ber* b, unsigned char tag) {
  int i = b->next++;
  if (b->p) {
    ber_head(b, tag, b->len[i]);
  } else {
    b->idx[b->depth] = i;
    b->start[b->depth] = b->n;
  }
  b->depth++;
}

static void ber_end(struct ber* b) {
  b->depth--;
  if (!b->p) {  // now the length is known, and with it the header's size
    size_t len = b->n - b->start[b->depth];
    b->len[b->idx[b->depth]] = len;
    ber_head(b, 0, len);
  }
}

// An Attribute (or a modification's PartialAttribute): SEQUENCE { type, SET OF value }.
static void attr_begin(struct ber* b, const char* type) {
  ber_begin(b, 0x30);
  ber_str(b, 0x04, type);
  ber_begin(b, 0x31);
}

static void attr_end(struct ber* b) {
  ber_end(b);
  ber_end(b);
}

static void ber_attr(struct ber* b, const char* type, const char* v) {
  attr_begin(b, type);
  ber_str(b, 0x04, v);
  attr_end(b);
}

static void ber_description(struct ber* b) {
  attr_begin(b, "description");
  ber_put(b, 0x04, value, (size_t)cfg.value_bytes);
  attr_end(b);
}

// The LDAPMessage for request req (an op or LDAP_*) with message id c->msgid; k is the key
// (add: the entry number). Sets c->expect to the response's protocolOp tag.
static void ldap_request(struct ber* b, struct conn* c, int req, long k) {
  char cn[48], dn[96];
  if (req == OP_ADD) {
    snprintf(cn, sizeof cn, "k%d-%ld", c->id, k);
  } else {
    snprintf(cn, sizeof cn, "key%ld", k);
  }
  snprintf(dn, sizeof dn, "cn=%s," BENCH_BASE, cn);
  ber_begin(b, 0x30);
  ber_int(b, 0x02, c->msgid);
  switch (req) {
    case LDAP_BIND:  // BindRequest: version 3, name, simple [0] password
      c->expect = 0x61;
      ber_begin(b, 0x60);
      ber_int(b, 0x02, 3);
      ber_str(b, 0x04, cfg.bind_dn);
      ber_str(b, 0x80, cfg.password);
      break;
    case LDAP_SUFFIX:  // AddRequest: entry, attributes
      c->expect = 0x69;
      ber_begin(b, 0x68);
      ber_str(b, 0x04, "dc=lockstep,dc=test");
      ber_begin(b, 0x30);
      attr_begin(b, "objectClass");
      ber_str(b, 0x04, "dcObject");
      ber_str(b, 0x04, "organization");
      attr_end(b);
      ber_attr(b, "dc", "lockstep");
      ber_attr(b, "o", "lockstep");
      ber_end(b);
      break;
    case LDAP_OU:
      c->expect = 0x69;
      ber_begin(b, 0x68);
      ber_str(b, 0x04, BENCH_BASE);
      ber_begin(b, 0x30);
      ber_attr(b, "objectClass", "organizationalUnit");
      ber_attr(b, "ou", "bench");
      ber_end(b);
      break;
    case OP_ADD:
    case OP_PREFILL:
      c->expect = 0x69;
      ber_begin(b, 0x68);
      ber_str(b, 0x04, dn);
      ber_begin(b, 0x30);
      ber_attr(b, "objectClass", "person");
      ber_attr(b, "cn", cn);
      ber_attr(b, "sn", "bench");
      ber_description(b);
      ber_end(b);
      break;
    case OP_MODIFY:  // ModifyRequest: object, changes: one replace (2) of the description
      c->expect = 0x67;
      ber_begin(b, 0x66);
      ber_str(b, 0x04, dn);
      ber_begin(b, 0x30);
      ber_begin(b, 0x30);
      ber_int(b, 0x0a, 2);
      ber_description(b);
      ber_end(b);
      ber_end(b);
      break;
    default:  // OP_SEARCH
      // SearchRequest: base, scope baseObject, neverDerefAliases, no size or time limit,
      // typesOnly FALSE, filter (objectClass=*), attributes
      c->expect = 0x65;
      ber_begin(b, 0x63);
      ber_str(b, 0x04, dn);
      ber_int(b, 0x0a, 0);
      ber_int(b, 0x0a, 0);
      ber_int(b, 0x02, 0);
      ber_int(b, 0x02, 0);
      ber_put(b, 0x01, "", 1);  // the BOOLEAN's one zero byte
      ber_str(b, 0x87, "objectClass");
      ber_begin(b, 0x30);
      ber_str(b, 0x04, "description");
      ber_end(b);
  }
  ber_end(b);  // the protocolOp
  ber_end(b);  // the LDAPMessage
}

static size_t format_ldap(struct conn* c, int req, long k) {
  c->msgid = c->msgid == INT_MAX ? 1 : c->msgid + 1;  // 0 is for unsolicited notifications
  struct ber b = {0};
  ldap_request(&b, c, req, k);
  b.p = (unsigned char*)c->req;  // b.len keeps the lengths just measured
  b.n = 0;
  b.next = 0;
  ldap_request(&b, c, req, k);
  return b.n;
}

// Reads the tag and length of the BER element at p (n bytes there). Returns the header's
// size, 0 if more bytes are needed, -1 if it is not BER as LDAP uses it (a multi-byte tag,
// an indefinite length) or longer than any reply to our requests.
static int ber_get_head(const unsigned char* p, size_t n, unsigned char* tag, size_t* len) {
  if (n < 2) return 0;
  if ((p[0] & 0x1f) == 0x1f) return -1;
  *tag = p[0];
  if (p[1] < 0x80) {
    *len = p[1];
    return 2;
  }
  size_t k = p[1] & 0x7fu;
  if (k == 0 || k > 4) return -1;
  if (n < 2 + k) return 0;
  size_t l = 0;
  for (size_t i = 0; i < k; i++) l = l << 8 | p[2 + i];
  if (l > LDAP_MAX_MESSAGE) return -1;
  *len = l;
  return 2 + (int)k;
}

// Reads the element with tag `tag` at *p, which must lie wholly before end; moves *p past it.
static int ber_get(const unsigned char** p, const unsigned char* end, unsigned char tag,
                   const unsigned char** v, size_t* len) {
  unsigned char t;
  int h = ber_get_head(*p, (size_t)(end - *p), &t, len);
  if (h <= 0 || t != tag || *len > (size_t)(end - *p) - (size_t)h) return -1;
  *v = *p + h;
  *p += (size_t)h + *len;
  return 0;
}

static int ber_get_int(const unsigned char** p, const unsigned char* end, unsigned char tag,
                       int* out) {
  const unsigned char* v;
  size_t len;
  if (ber_get(p, end, tag, &v, &len) < 0 || len == 0 || len > 4 || (v[0] & 0x80)) return -1;
  *out = 0;
  for (size_t i = 0; i < len; i++) *out = *out << 8 | v[i];
  return 0;
}

// Decodes the LDAPMessage at the head of buf: returns its size, 0 if it is not all there yet,
// -1 if it is malformed. *code is its LDAPResult's resultCode, *diag its diagnosticMessage;
// *code is -1 for a SearchResultEntry or SearchResultReference, which carry none.
static long ldap_message(const unsigned char* buf, size_t len, int* msgid, unsigned char* op,
                         int* code, const unsigned char** diag, size_t* diag_len) {
  unsigned char tag;
  size_t n, opn;
  int h = ber_get_head(buf, len, &tag, &n);
  if (h <= 0) return h;
  if (tag != 0x30) return -1;
  if (n > len - (size_t)h) return 0;
  const unsigned char *p = buf + h, *end = p + n, *dn;
  if (ber_get_int(&p, end, 0x02, msgid) < 0) return -1;
  int oh = ber_get_head(p, (size_t)(end - p), op, &opn);  // controls may follow: not read
  if (oh <= 0 || opn > (size_t)(end - p) - (size_t)oh || (*op & 0xe0) != 0x60) return -1;
  *code = -1;
  if (*op != 0x64 && *op != 0x73) {  // LDAPResult: resultCode, matchedDN, diagnosticMessage
    const unsigned char *q = p + oh, *qend = q + opn;
    size_t dnl;
    if (ber_get_int(&q, qend, 0x0a, code) < 0 || ber_get(&q, qend, 0x04, &dn, &dnl) < 0 ||
        ber_get(&q, qend, 0x04, diag, diag_len) < 0)
      return -1;
  }
  return h + (long)n;
}

// An LDAP reply: the response to c->msgid, after any SearchResultEntry for a search.
static long parse_ldap(struct conn* c, int* kind) {
  size_t off = 0;
  for (;;) {
    int id, code;
    unsigned char op;
    const unsigned char* diag;
    size_t diag_len;
    long m = ldap_message((const unsigned char*)c->buf + off, c->len - off, &id, &op, &code, &diag,
                          &diag_len);
    if (m <= 0) return m;
    off += (size_t)m;
    if (id != c->msgid) {
      c->lost = id == 0 ? "unsolicited notification (notice of disconnection?)"
                        : "reply to another message id";
      return -1;
    }
    if (code < 0 && c->expect == 0x65) continue;  // an entry or a referral: read and skipped
    if (op != c->expect) return -1;
    c->result = code;
    if (code == 0) {
      *kind = REPLY_OK;
    } else if ((code == 32 && (cfg.op == OP_MODIFY || cfg.op == OP_SEARCH)) ||
               (code == 68 && cfg.op == OP_PREFILL)) {
      *kind = REPLY_MISS;  // noSuchObject; entryAlreadyExists
    } else {
      *kind = REPLY_ERROR;
    }
    return (long)off;
  }
}

static const char* ldap_code_name(int code) {
  switch (code) {
    case 0: return "success";
    case 1: return "operationsError";
    case 2: return "protocolError";
    case 7: return "authMethodNotSupported";
    case 8: return "strongerAuthRequired";
    case 17: return "undefinedAttributeType";
    case 21: return "invalidAttributeSyntax";
    case 32: return "noSuchObject";
    case 34: return "invalidDNSyntax";
    case 48: return "inappropriateAuthentication";
    case 49: return "invalidCredentials";
    case 50: return "insufficientAccessRights";
    case 51: return "busy";
    case 52: return "unavailable";
    case 53: return "unwillingToPerform";
    case 64: return "namingViolation";
    case 65: return "objectClassViolation";
    case 68: return "entryAlreadyExists";
    case 80: return "other";
    default: return "see RFC 4511";
  }
}

// A clamd reply in an IDSESSION: "<request number>: <reply>\0".
static long parse_clamd(struct conn* c, int* kind) {
  const char* nul = memchr(c->buf, '\0', c->len);
  if (!nul) return c->len > 4096 ? -1 : 0;
  char* rest;
  unsigned long id = strtoul(c->buf, &rest, 10);
  if (c->buf[0] < '0' || c->buf[0] > '9' || id != (unsigned long)c->msgid ||
      strncmp(rest, ": ", 2) != 0) {
    c->lost = "reply without the request's IDSESSION number";
    return -1;
  }
  const char* r = rest + 2;  // "stream: OK", "stream: <name> FOUND", "... ERROR", "PONG"
  size_t rl = (size_t)(nul - r);
  int found = strncmp(r, "stream: ", 8) == 0 && rl > 14 && memcmp(nul - 6, " FOUND", 6) == 0;
  switch (c->expect) {
    case CLAMD_PONG: *kind = strcmp(r, "PONG") == 0 ? REPLY_OK : REPLY_ERROR; break;
    case CLAMD_OK: *kind = strcmp(r, "stream: OK") == 0 ? REPLY_OK : REPLY_ERROR; break;
    default: *kind = found ? REPLY_FOUND : REPLY_ERROR;
  }
  return nul - c->buf + 1;
}

// MessagePack (github.com/msgpack/msgpack/blob/master/spec.md) for iproto: the few forms our
// requests need are written; every type is read, so that tuples of any shape (floats, nil,
// bin, ext, nested arrays and maps, put there by another client) parse.
static unsigned char* mp_be(unsigned char* p, uint64_t v, int bytes) {  // big-endian
  for (int i = bytes - 1; i >= 0; i--) *p++ = (unsigned char)(v >> (8 * i));
  return p;
}

static unsigned char* mp_uint(unsigned char* p, uint64_t v) {  // positive fixint or uint 8..64
  if (v < 0x80) {
    *p++ = (unsigned char)v;
    return p;
  }
  int k = v <= 0xff ? 0 : v <= 0xffff ? 1 : v <= 0xffffffff ? 2 : 3;
  *p++ = (unsigned char)(0xcc + k);
  return mp_be(p, v, 1 << k);
}

static unsigned char* mp_str(unsigned char* p, const char* s, size_t n) {
  if (n < 32) {
    *p++ = (unsigned char)(0xa0 | n);
  } else {
    int k = n <= 0xff ? 0 : n <= 0xffff ? 1 : 2;  // str 8, 16, 32
    *p++ = (unsigned char)(0xd9 + k);
    p = mp_be(p, n, 1 << k);
  }
  memcpy(p, s, n);
  return p + n;
}

// Every array and map we write has fewer than 16 elements: their fix forms do.
static unsigned char* mp_array(unsigned char* p, int n) {
  *p = (unsigned char)(0x90 | n);
  return p + 1;
}

static unsigned char* mp_map(unsigned char* p, int n) {
  *p = (unsigned char)(0x80 | n);
  return p + 1;
}

enum { MP_UINT, MP_INT, MP_NIL, MP_BOOL, MP_FLOAT, MP_STR, MP_BIN, MP_EXT, MP_ARRAY, MP_MAP };

// Reads the header of the value at *p and moves *p past it. Returns the value's type, or -1 if
// the header runs past end or is 0xc1 (never used). *n is a uint's value, the number of an
// array's elements or a map's pairs, or for every other type the bytes that follow the header
// (an ext's with its type byte).
static int mp_read(const unsigned char** p, const unsigned char* end, uint64_t* n) {
  // 0xc0 .. 0xdf: type, bytes of the big-endian length (or value) field, bytes added to it
  static const signed char forms[32][3] = {
      {MP_NIL, 0, 0},   {-1, 0, 0},       {MP_BOOL, 0, 0}, {MP_BOOL, 0, 0},  // c0 .. c3
      {MP_BIN, 1, 0},   {MP_BIN, 2, 0},   {MP_BIN, 4, 0},                    // bin 8 .. 32
      {MP_EXT, 1, 1},   {MP_EXT, 2, 1},   {MP_EXT, 4, 1},                    // ext 8 .. 32
      {MP_FLOAT, 0, 4}, {MP_FLOAT, 0, 8},                                    // float 32, 64
      {MP_UINT, 1, 0},  {MP_UINT, 2, 0},  {MP_UINT, 4, 0}, {MP_UINT, 8, 0},  // uint 8 .. 64
      {MP_INT, 0, 1},   {MP_INT, 0, 2},   {MP_INT, 0, 4},  {MP_INT, 0, 8},   // int 8 .. 64
      {MP_EXT, 0, 2},   {MP_EXT, 0, 3},   {MP_EXT, 0, 5},  {MP_EXT, 0, 9},   // fixext 1 .. 8
      {MP_EXT, 0, 17},  {MP_STR, 1, 0},   {MP_STR, 2, 0},  {MP_STR, 4, 0},   // fixext 16, str
      {MP_ARRAY, 2, 0}, {MP_ARRAY, 4, 0}, {MP_MAP, 2, 0},  {MP_MAP, 4, 0}};  // 16, 32
  const unsigned char* q = *p;
  if (q >= end) return -1;
  unsigned b = *q++;
  int type;
  if (b <= 0x7f || b >= 0xe0) {  // positive and negative fixint
    type = b <= 0x7f ? MP_UINT : MP_INT;
    *n = b <= 0x7f ? b : 0;
  } else if (b <= 0xbf) {  // fixmap, fixarray, fixstr
    type = b <= 0x8f ? MP_MAP : b <= 0x9f ? MP_ARRAY : MP_STR;
    *n = b & (b <= 0x9f ? 0x0fu : 0x1fu);
  } else {
    const signed char* f = forms[b - 0xc0];
    if (f[0] < 0 || end - q < f[1]) return -1;
    uint64_t v = 0;
    for (int i = 0; i < f[1]; i++) v = v << 8 | *q++;
    type = f[0];
    *n = v + (uint64_t)f[2];
  }
  *p = q;
  return type;
}

// Moves *p past one value of any type, nested ones included (counting the values still to
// skip, not recursing: a reply cannot nest deep enough to overflow the stack). -1 if it is not
// MessagePack or not all before end.
static int mp_skip(const unsigned char** p, const unsigned char* end) {
  for (uint64_t left = 1; left > 0; left--) {
    uint64_t n;
    int type = mp_read(p, end, &n);
    if (type < 0) return -1;
    if (type == MP_ARRAY || type == MP_MAP) {
      left += type == MP_MAP ? 2 * n : n;
    } else if (type != MP_UINT) {
      if (n > (uint64_t)(end - *p)) return -1;
      *p += n;
    }
    if (left - 1 > (uint64_t)(end - *p)) return -1;  // each value takes a byte at least
  }
  return 0;
}

// An iproto request at c->req: <size: 0xce and 4 bytes> <header> <body>. Begins it with the
// header {REQUEST_TYPE: type, SYNC}, the size left for tnt_end. The sync counts requests in its
// high bits; its low 16 are c->slot, the open loop's slot for the request (0 otherwise), which
// the reply's sync names, in whatever order replies come.
static unsigned char* tnt_begin(struct conn* c, int type) {
  c->sync = ((c->sync >> 16) + 1) << 16 | (uint64_t)c->slot;
  unsigned char* p = mp_map((unsigned char*)c->req + 5, 2);
  *p++ = 0x00;
  p = mp_uint(p, (uint64_t)type);
  *p++ = 0x01;
  return mp_uint(p, c->sync);
}

static size_t tnt_end(struct conn* c, unsigned char* p) {  // returns the request's length
  unsigned char* r = (unsigned char*)c->req;
  r[0] = 0xce;
  mp_be(r + 1, (uint64_t)(p - r - 5), 4);
  return (size_t)(p - r);
}

// A SELECT's body, iterator EQ from offset 0, up to KEY's array header: its nkey parts follow.
static unsigned char* tnt_select(unsigned char* p, int space, int index, int limit, int nkey) {
  p = mp_map(p, 6);
  *p++ = 0x10;  // SPACE_ID
  p = mp_uint(p, (uint64_t)space);
  *p++ = 0x11;  // INDEX_ID
  p = mp_uint(p, (uint64_t)index);
  *p++ = 0x12;  // LIMIT
  p = mp_uint(p, (uint64_t)limit);
  *p++ = 0x13;  // OFFSET
  *p++ = 0;
  *p++ = 0x14;  // ITERATOR: EQ
  *p++ = 0;
  *p++ = 0x20;  // KEY
  return mp_array(p, nkey);
}

// The request for a tarantool op (not prefill: next_op resolves it) with key k; its length.
static size_t format_tarantool(struct conn* c, int op, long k) {
  char key[32], owner[32];
  int kl = snprintf(key, sizeof key, "key:%ld", k);
  int ol = snprintf(owner, sizeof owner, "owner%ld", k % TNT_OWNERS);
  size_t vb = (size_t)cfg.value_bytes;
  int replace = op == OP_DOC_REPLACE || op == OP_KV_SET;
  unsigned char* p = tnt_begin(c, replace ? IPROTO_REPLACE : IPROTO_SELECT);
  if (replace) {  // {SPACE_ID, TUPLE}
    p = mp_map(p, 2);
    *p++ = 0x10;
    p = mp_uint(p, (uint64_t)(op == OP_KV_SET ? cfg.space_kv : cfg.space_docs));
    *p++ = 0x21;
  }
  switch (op) {
    case OP_DOC_REPLACE:  // [n, "owner<n%16>", {"body": <value>, "n": n}]
      p = mp_array(p, 3);
      p = mp_uint(p, (uint64_t)k);
      p = mp_str(p, owner, (size_t)ol);
      p = mp_map(p, 2);
      p = mp_str(p, "body", 4);
      p = mp_str(p, value, vb);
      p = mp_str(p, "n", 1);
      p = mp_uint(p, (uint64_t)k);
      break;
    case OP_KV_SET:  // ["key:<n>", <value>]
      p = mp_array(p, 2);
      p = mp_str(p, key, (size_t)kl);
      p = mp_str(p, value, vb);
      break;
    case OP_DOC_GET:
      p = tnt_select(p, cfg.space_docs, 0, 1, 1);
      p = mp_uint(p, (uint64_t)k);
      break;
    case OP_DOC_BY_OWNER:
      p = tnt_select(p, cfg.space_docs, 1, 10, 1);
      p = mp_str(p, owner, (size_t)ol);
      break;
    default:  // OP_KV_GET
      p = tnt_select(p, cfg.space_kv, 0, 1, 1);
      p = mp_str(p, key, (size_t)kl);
  }
  return tnt_end(c, p);
}

struct tnt_reply {
  uint64_t code;  // IPROTO_REQUEST_TYPE: 0 (OK) or 0x8000 | errcode
  uint64_t sync;
  uint64_t tuples;             // in IPROTO_DATA
  const unsigned char* error;  // IPROTO_ERROR_24's message, or NULL
  size_t error_len;
};

// Decodes the iproto response at the head of buf: <size: uint> <header: map> [<body: map>].
// Returns its length, 0 if it is not all there yet, -1 if it is garbled (anything after the
// body within the size, too).
static long tnt_message(const unsigned char* buf, size_t len, struct tnt_reply* r) {
  if (len == 0) return 0;
  // The size is any uint (Tarantool sends 0xce and 4 bytes): as long as its first byte says.
  size_t h = buf[0] <= 0x7f                     ? 1
             : buf[0] >= 0xcc && buf[0] <= 0xcf ? 1 + (1u << (buf[0] - 0xcc))
                                                : 0;
  if (h == 0) return -1;
  if (len < h) return 0;
  const unsigned char* p = buf;
  uint64_t size, n, key, v;
  mp_read(&p, buf + h, &size);
  if (size > TNT_MAX_PACKET) return -1;
  if (size > len - h) return 0;
  const unsigned char* end = p + size;
  *r = (struct tnt_reply){0};
  int have = 0;  // bit 0: the code came, bit 1: the sync
  if (mp_read(&p, end, &n) != MP_MAP) return -1;
  for (; n > 0; n--) {  // the header: other keys (SCHEMA_VERSION) are skipped
    if (mp_read(&p, end, &key) != MP_UINT) return -1;
    if (key > 0x01) {
      if (mp_skip(&p, end) < 0) return -1;
      continue;
    }
    if (mp_read(&p, end, &v) != MP_UINT) return -1;
    *(key == 0x00 ? &r->code : &r->sync) = v;
    have |= 1 << key;
  }
  if (have != 3) return -1;
  if (p < end && mp_read(&p, end, &n) != MP_MAP) return -1;
  for (; n > 0; n--) {  // the body, if any (n is 0 here if not): other keys are skipped
    if (mp_read(&p, end, &key) != MP_UINT) return -1;
    if (key == 0x30) {  // IPROTO_DATA: an array of tuples
      if (mp_read(&p, end, &r->tuples) != MP_ARRAY) return -1;
      for (uint64_t i = 0; i < r->tuples; i++)
        if (mp_skip(&p, end) < 0) return -1;
    } else if (key == 0x31) {  // IPROTO_ERROR_24: the message
      if (mp_read(&p, end, &v) != MP_STR || v > (uint64_t)(end - p)) return -1;
      r->error = p;
      r->error_len = (size_t)v;
      p += v;
    } else if (mp_skip(&p, end) < 0) {
      return -1;
    }
  }
  return p == end ? (long)(h + size) : -1;
}

// What a response is: an error, a select that found nothing (a miss; a replace always returns
// its tuple) or OK; -1 for any other type, such as a non-final IPROTO_CHUNK (box.session.push,
// which none of our requests make).
static int tnt_kind(const struct tnt_reply* r) {
  if (r->code == 0) return r->tuples > 0 ? REPLY_OK : REPLY_MISS;
  return r->code >> 15 == 1 ? REPLY_ERROR : -1;
}

// A tarantool response at c->buf + off; *sync its IPROTO_SYNC.
static long parse_tnt_at(struct conn* c, size_t off, int* kind, uint64_t* sync) {
  struct tnt_reply r;
  long m = tnt_message((const unsigned char*)c->buf + off, c->len - off, &r);
  if (m <= 0) return m;
  *sync = r.sync;
  *kind = tnt_kind(&r);
  return *kind < 0 ? -1 : m;
}

// A tarantool reply: the greeting while it is due, else the response to the request c->sync.
static long parse_tarantool(struct conn* c, int* kind) {
  if (c->expect == TNT_GREETING) {
    if (c->len < TNT_GREETING_SIZE) return 0;
    if (memcmp(c->buf, "Tarantool ", 10) != 0 || c->buf[63] != '\n' || c->buf[127] != '\n') {
      c->lost = "no Tarantool greeting";
      return -1;
    }
    c->expect = TNT_REPLY;
    *kind = REPLY_OK;
    return TNT_GREETING_SIZE;
  }
  uint64_t sync;
  long m = parse_tnt_at(c, 0, kind, &sync);
  if (m > 0 && sync != c->sync) {
    c->lost = "reply to another IPROTO_SYNC";
    return -1;
  }
  return m;
}

static long parse_reply(struct conn* c, int* kind) {
  switch (cfg.proto) {
    case PROTO_REDIS: return parse_redis(c->buf, c->len, kind);
    case PROTO_MEMCACHED: return parse_memcached(c->buf, c->len, kind);
    case PROTO_LDAP: return parse_ldap(c, kind);
    case PROTO_TARANTOOL: return parse_tarantool(c, kind);
    default: return parse_clamd(c, kind);
  }
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
    long used = parse_reply(c, &kind);
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

// Returns the request for op with key k (add: the entry number), *n its length.
static const char* format_request(struct conn* c, int op, long k, size_t* n) {
  if (cfg.proto == PROTO_TARANTOOL) {
    *n = format_tarantool(c, op, k);
    return c->req;
  }
  if (cfg.proto == PROTO_LDAP) {
    *n = format_ldap(c, op, k);
    return c->req;
  }
  if (cfg.proto == PROTO_CLAMD) {
    int infected = cfg.infected_every && (c->seq + 1) % cfg.infected_every == 0;
    c->msgid++;
    c->expect = infected ? CLAMD_FOUND : CLAMD_OK;
    *n = infected ? clamd_infected_len : clamd_clean_len;
    return infected ? clamd_infected : clamd_clean;
  }
  char key[32];
  int kl = snprintf(key, sizeof key, "key:%ld", k);
  int vb = cfg.value_bytes, h;
  if (cfg.proto == PROTO_REDIS) {
    if (op == OP_GET) {
      *n = (size_t)sprintf(c->req, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", kl, key);
      return c->req;
    }
    h = sprintf(c->req, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", kl, key, vb);
  } else {
    if (op == OP_GET) {
      *n = (size_t)sprintf(c->req, "get %s\r\n", key);
      return c->req;
    }
    h = sprintf(c->req, "set %s 0 0 %d\r\n", key, vb);
  }
  memcpy(c->req + h, value, (size_t)vb);
  memcpy(c->req + h + vb, "\r\n", 2);
  *n = (size_t)(h + vb + 2);
  return c->req;
}

// `zINSTREAM` and data in chunks of <4-byte big-endian length><bytes>, ending with length 0.
static char* clamd_request(const char* data, size_t len, size_t* n) {
  char* r = malloc(len + 4 * (len / CLAMD_CHUNK + 2) + 16);
  memcpy(r, "zINSTREAM", 10);
  size_t o = 10;
  uint32_t part = 0;
  for (size_t at = 0;; at += part) {
    part = len - at < CLAMD_CHUNK ? (uint32_t)(len - at) : CLAMD_CHUNK;
    uint32_t be = htonl(part);
    memcpy(r + o, &be, 4);
    memcpy(r + o + 4, data + at, part);
    o += 4 + part;
    if (part == 0) break;
  }
  *n = o;
  return r;
}

static void* run_conn(void* arg) {
  struct conn* c = arg;
  char wait_req[64];
  size_t wait_len = 0;
  if (cfg.op == OP_SET_WAIT) {
    char num[16];
    int nl = snprintf(num, sizeof num, "%d", cfg.wait_replicas);
    wait_len = (size_t)snprintf(wait_req, sizeof wait_req,
                                "*3\r\n$4\r\nWAIT\r\n$%d\r\n%s\r\n$1\r\n0\r\n", nl, num);
  }
  // prefill: this connection's share of the keys
  long first = (long)((long long)cfg.keys * c->id / cfg.conns);
  long end = (long)((long long)cfg.keys * (c->id + 1) / cfg.conns);
  while ((cfg.ops_per_conn == 0 || c->ops + c->errors < cfg.ops_per_conn) &&
         now_ns() < deadline_ns) {
    long k;
    if (cfg.op == OP_PREFILL) {  // tarantool: each key twice, its doc and its kv pair
      k = first + (long)(cfg.proto == PROTO_TARANTOOL ? c->seq / 2 : c->seq);
      if (k >= end) break;
    } else if (cfg.op == OP_ADD) {
      k = (long)c->seq;
    } else {
      k = (long)(next_rand(&c->rng) % (uint64_t)cfg.keys);
    }
    int op = next_op(c);
    size_t n;
    const char* req = format_request(c, op == OP_SET_WAIT ? OP_SET : op, k, &n);
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
  // request by sync (see tnt_begin): its free slots are a stack.
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
      long used = cfg.proto == PROTO_REDIS ? parse_redis(c->buf + off, c->len - off, &kind)
                  : cfg.proto == PROTO_MEMCACHED
                      ? parse_memcached(c->buf + off, c->len - off, &kind)
                      : parse_tnt_at(c, off, &kind, &id);
      if (used < 0) {
        c->lost = "garbled reply";
        goto done;
      }
      if (used == 0) break;
      off += (size_t)used;
      if (cfg.proto == PROTO_TARANTOOL) {
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
      int slot = cfg.proto == PROTO_TARANTOOL ? spare[--nspare] : (head + inflight) % max;
      size_t n;
      c->slot = slot;
      const char* req = format_request(c, op, k, &n);
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
  if (cfg.proto == PROTO_TARANTOOL) {
    c->expect = TNT_GREETING;
    if (round_trip(c, "", 0) < 0) {  // nothing to send: the server speaks first
      fprintf(stderr, "loadgen: tarantool connection %d to %s:%s failed: %s; read: ", c->id + 1,
              cfg.host, cfg.port, c->lost);
      print_reply(c);
      exit(1);
    }
    int docs = cfg.op == OP_DOC_REPLACE || cfg.op == OP_DOC_GET || cfg.op == OP_PREFILL;
    int kv = cfg.op == OP_KV_SET || cfg.op == OP_KV_GET || cfg.op == OP_PREFILL;
    // Each with a key of the type of the op's keys, which the server checks against the index
    // even with limit 0: swapped space ids are refused too.
    const struct {
      int used, space, index;
      const char *key, *option;  // key NULL: the unsigned 0
    } probes[] = {{docs, cfg.space_docs, 0, NULL, "--space-docs"},
                  {cfg.op == OP_DOC_BY_OWNER, cfg.space_docs, 1, "owner0", "--space-docs"},
                  {kv, cfg.space_kv, 0, "key:0", "--space-kv"}};
    for (int i = 0; i < 3; i++) {
      if (!probes[i].used) continue;
      const char* key = probes[i].key;
      unsigned char* p =
          tnt_select(tnt_begin(c, IPROTO_SELECT), probes[i].space, probes[i].index, 0, 1);
      p = key ? mp_str(p, key, strlen(key)) : mp_uint(p, 0);
      int kind = round_trip(c, c->req, tnt_end(c, p));
      if (kind == REPLY_OK || kind == REPLY_MISS) continue;  // limit 0: always no tuple
      struct tnt_reply r = {.error = (const unsigned char*)""};
      if (kind > 0) tnt_message((const unsigned char*)c->buf, c->len, &r);
      fprintf(stderr, "loadgen: tarantool select from space %d index %d on %s:%s ", probes[i].space,
              probes[i].index, cfg.host, cfg.port);
      if (kind < 0) {
        fprintf(stderr, "failed: %s; read: ", c->lost);
        print_reply(c);
      } else {
        fprintf(stderr, "refused: error %llu: %.*s (%s?)\n", (unsigned long long)(r.code & 0x7fff),
                (int)r.error_len, (const char*)r.error, probes[i].option);
      }
      exit(1);
    }
    return;
  }
  if (cfg.proto == PROTO_CLAMD) {
    c->msgid = 1;
    c->expect = CLAMD_PONG;
    int kind = send_all(c->fd, "zIDSESSION", 11) < 0 ? -1 : round_trip(c, "zPING", 6);
    if (kind == REPLY_OK) return;
    const char* why = kind < 0 ? (c->lost ? c->lost : strerror(errno)) : "PING not answered PONG";
    fprintf(stderr, "loadgen: IDSESSION %d with %s:%s failed: %s%s; read: ", c->id + 1, cfg.host,
            cfg.port, why,
            c->id > 0 && strncmp(why, "no reply", 8) == 0
                ? " (clamd serves at most MaxQueue sessions at once, 100 by default)"
                : "");
    print_reply(c);
    exit(1);
  }
  if (cfg.proto != PROTO_LDAP) return;
  int reqs[3] = {LDAP_BIND, LDAP_SUFFIX, LDAP_OU};
  int nreqs = cfg.op == OP_PREFILL && c->id == 0 ? 3 : 1;
  for (int i = 0; i < nreqs; i++) {
    int kind = round_trip(c, c->req, format_ldap(c, reqs[i], 0));
    const char* what = reqs[i] == LDAP_BIND ? "bind as"
                       : reqs[i] == LDAP_OU ? "add of " BENCH_BASE " by"
                                            : "add of dc=lockstep,dc=test by";
    if (kind < 0) {
      fprintf(stderr, "loadgen: ldap %s %s on %s:%s failed: %s; read: ", what, cfg.bind_dn,
              cfg.host, cfg.port, c->lost);
      print_reply(c);
      exit(1);
    }
    if (c->result == 0 || (c->result == 68 && reqs[i] != LDAP_BIND)) continue;
    int id, code;
    unsigned char op;
    const unsigned char* diag = (const unsigned char*)"";
    size_t diag_len = 0;
    ldap_message((const unsigned char*)c->buf, c->len, &id, &op, &code, &diag, &diag_len);
    fprintf(stderr, "loadgen: ldap %s %s on %s:%s refused: resultCode %d (%s)%s%.*s\n", what,
            cfg.bind_dn, cfg.host, cfg.port, c->result, ldap_code_name(c->result),
            diag_len ? ": " : "", (int)diag_len, (const char*)diag);
    exit(1);
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: loadgen --proto redis|memcached|ldap|clamd|tarantool --port P\n"
          "               [--host 127.0.0.1] [--conns 1] [--ops-per-conn K] [--seconds 10]\n"
          "               [--op OP] [--value-bytes 64] [--keys 10000] [--wait-replicas 2]\n"
          "               [--set-ratio P] [--rate R [--max-outstanding 64]]\n"
          "               [--bind-dn cn=admin,dc=lockstep,dc=test] [--password secret]\n"
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
      case 'P':
        for (cfg.proto = 0; cfg.proto < NPROTOS; cfg.proto++)
          if (strcmp(optarg, proto_names[cfg.proto]) == 0) break;
        if (cfg.proto == NPROTOS) {
          fprintf(stderr, "loadgen: --proto must be redis, memcached, ldap, clamd or tarantool\n");
          exit(2);
        }
        break;
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
          if (strcmp(optarg, op_table[cfg.op].name) == 0) break;
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
  int tnt = cfg.proto == PROTO_TARANTOOL;
  if (cfg.set_ratio >= 0 || cfg.rate > 0) {
    const char* what = cfg.rate > 0 ? "--rate" : "--set-ratio";
    if (cfg.proto != PROTO_REDIS && cfg.proto != PROTO_MEMCACHED && !tnt) {
      fprintf(stderr, "loadgen: %s needs --proto redis, memcached or tarantool\n", what);
      exit(2);
    }
    // --set-ratio mixes the protocol's set and get. The open loop sends any op that is one
    // request (not set-wait) and has no end of its own (not prefill).
    int set = tnt ? OP_KV_SET : OP_SET, get = tnt ? OP_KV_GET : OP_GET;
    if (tnt && cfg.set_ratio < 0) {
      if (cfg.op == OP_PREFILL) {
        fprintf(stderr, "loadgen: --rate does not go with --op prefill\n");
        exit(2);
      }
    } else if (cfg.op >= 0 && cfg.op != set && cfg.op != get) {
      fprintf(stderr, "loadgen: %s goes with --op %s or %s only\n", tnt ? "--set-ratio" : what,
              op_table[set].name, op_table[get].name);
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
  if (cfg.op < 0) {
    if (cfg.proto == PROTO_LDAP) {
      fprintf(stderr, "loadgen: --proto ldap needs --op add, modify, search or prefill\n");
      exit(2);
    }
    if (tnt && cfg.set_ratio < 0) {
      fprintf(stderr,
              "loadgen: --proto tarantool needs --op doc-replace, doc-get, doc-by-owner, kv-set, "
              "kv-get or prefill\n");
      exit(2);
    }
    cfg.op = cfg.proto == PROTO_CLAMD ? OP_SCAN : tnt ? OP_KV_SET : OP_SET;  // tnt: --set-ratio
  }
  if (!(op_table[cfg.op].protos & 1 << cfg.proto)) {
    fprintf(stderr, "loadgen: --op %s does not go with --proto %s (%s has:", op_table[cfg.op].name,
            proto_names[cfg.proto], proto_names[cfg.proto]);
    for (int i = 0; i < NOPS; i++)
      if (op_table[i].protos & 1 << cfg.proto) fprintf(stderr, " %s", op_table[i].name);
    fprintf(stderr, ")\n");
    exit(2);
  }
  if (ldap_opts && cfg.proto != PROTO_LDAP) {
    fprintf(stderr, "loadgen: --bind-dn and --password need --proto ldap\n");
    exit(2);
  }
  if (clamd_opts && cfg.proto != PROTO_CLAMD) {
    fprintf(stderr, "loadgen: --infected-every and --infected-string need --proto clamd\n");
    exit(2);
  }
  if (tnt_opts && !tnt) {
    fprintf(stderr, "loadgen: --space-docs and --space-kv need --proto tarantool\n");
    exit(2);
  }
  size_t sl = strlen(cfg.infected_string);
  if (cfg.proto == PROTO_CLAMD && (sl == 0 || sl > (size_t)cfg.value_bytes)) {
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
  if (cfg.proto == PROTO_CLAMD) {
    // Random-looking bytes, typed as plain data by clamd (letters would be text, which it
    // scans differently); the same in every op and run, so clamd's cache of clean files hits.
    uint64_t s = 0x5DEECE66DULL;
    for (size_t i = 0; i < vb; i++) value[i] = (char)(next_rand(&s) >> 56);
    clamd_clean = clamd_request(value, vb, &clamd_clean_len);
    size_t sl = strlen(cfg.infected_string);  // value is not needed clean after this
    memcpy(value + (vb - sl) / 2, cfg.infected_string, sl);
    clamd_infected = clamd_request(value, vb, &clamd_infected_len);
  } else {
    for (size_t i = 0; i < vb; i++) value[i] = (char)('a' + i % 26);
  }

  struct conn* cs = calloc((size_t)cfg.conns, sizeof *cs);
  for (int i = 0; i < cfg.conns; i++) {  // every connection is up before the clock starts
    cs[i].fd = connect_to(cfg.host, cfg.port);
    if (cs[i].fd < 0) return 1;
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
  return lost ? 1 : 0;
}
