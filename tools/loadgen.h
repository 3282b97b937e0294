// loadgen.h — what the load generator's engine (loadgen.c: connections, threads, the closed and
// open loops, the histogram, the JSON line, the command line) and its protocol codecs share:
// the options, a connection's state, the engine's calls a codec makes to set a connection up,
// each codec's calls the engine makes, and the few byte and number helpers more than one file
// uses. loadgen.c's top comment documents the program.
#ifndef LOCKSTEP_TOOLS_LOADGEN_H
#define LOCKSTEP_TOOLS_LOADGEN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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
enum { REPLY_OK, REPLY_MISS, REPLY_FOUND, REPLY_ERROR };  // what a parsed reply was

#define SUB_BITS 6  // 64 sub-buckets per power of two
#define NBUCKETS ((64 - SUB_BITS + 1) << SUB_BITS)

// The command line's options (loadgen.c's top comment).
struct config {
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
};
extern struct config cfg;

// The --value-bytes bytes every request that writes a value carries (clamd: the scanned data).
extern char* value;

struct conn {
  pthread_t thread;
  int fd, id;
  const char* lost;  // why the connection was given up (closed, timed out, garbled), or NULL
  uint64_t rng;
  long long seq;  // requests the op loop has made: add's entry number, scan's K-th
  int msgid;      // ldap: the request's message id; clamd: its IDSESSION request number
  int expect;     // ldap: the response's protocolOp tag; clamd: CLAMD_*; tarantool: TNT_*
  int slot;       // tarantool, open loop: the slot of the request being made (run_open)
  uint64_t sync;  // tarantool: the IPROTO_SYNC of the last request made
  int result;     // ldap: the resultCode of the last response
  long long ops, errors, misses, found;
  long long sets, late, unsent;  // --set-ratio: sets made; open loop: see loadgen.c
  uint64_t hist[NBUCKETS];
  char* req;  // request buffer
  char* buf;  // reply buffer, NUL-terminated after what was read
  size_t cap, len;
};

// The engine (loadgen.c), for the codecs' connection setup.
int send_all(int fd, const char* p, size_t n);
// Sends one request and reads its reply. Returns the reply kind, or -1 (reason in c->lost)
// when the connection broke, the reply was garbled, or no reply came by the deadline + grace.
int round_trip(struct conn* c, const char* req, size_t n);
// The start of what was read of c's last reply, escaped, for a message on stderr.
void print_reply(const struct conn* c);

// The codecs. A parse_* function reads the reply at the head of the connection's buffer (or
// of buf): returns its length, 0 if more bytes are needed, -1 if it cannot be parsed (reason
// in c->lost, if it has one); *kind is REPLY_*. A format_* function writes the request for op
// with key k (ldap add: the entry number) to c->req and returns its length. A setup_* function
// makes the connection's requests before the clock starts, and exits 1 when one fails.

// loadgen_resp.c: redis (RESP) and memcached (text protocol).
long parse_redis(const char* buf, size_t len, int* kind);
long parse_memcached(const char* buf, size_t len, int* kind);
size_t format_redis_memcached(struct conn* c, int op, long k);
size_t format_redis_wait(char* out, size_t size);  // `WAIT <wait-replicas> 0`

// loadgen_ldap.c: LDAPv3 (BER).
long parse_ldap(struct conn* c, int* kind);
size_t format_ldap(struct conn* c, int op, long k);
void setup_ldap(struct conn* c);

// loadgen_clamd.c: clamd's INSTREAM in an IDSESSION.
void make_clamd_streams(void);  // fills value; before the first clamd_scan_request
const char* clamd_scan_request(struct conn* c, size_t* n);  // shared by all, not at c->req
long parse_clamd(struct conn* c, int* kind);
void setup_clamd(struct conn* c);

// loadgen_tarantool.c: iproto (MessagePack).
long parse_tarantool(struct conn* c, int* kind);
// The response at c->buf + off, as parse_* (a request's sync not checked); *sync its sync.
long parse_tarantool_at(struct conn* c, size_t off, int* kind, uint64_t* sync);
size_t format_tarantool(struct conn* c, int op, long k);
void setup_tarantool(struct conn* c);

// Writes v's low `bytes` bytes big-endian at p; returns p + bytes.
static inline unsigned char* put_be(unsigned char* p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--) *p++ = (unsigned char)(v >> (8 * i));
  return p;
}

// The big-endian number in the `bytes` bytes at p.
static inline uint64_t get_be(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v = v << 8 | p[i];
  return v;
}

static inline uint64_t next_rand(uint64_t* s) {  // xorshift64
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

#endif
