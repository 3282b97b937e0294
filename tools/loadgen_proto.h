// loadgen_proto.h — the one interface between the load generator's engine (loadgen.c:
// connections, threads, the closed and open loops, the histogram, the JSON line, the command
// line) and its protocols (loadgen_resp.c, loadgen_ldap.c, loadgen_clamd.c,
// loadgen_tarantool.c). Each protocol is a `struct protocol` of data and parse/format/setup
// functions, declared at the end; the engine looks them up by --proto name. A protocol calls
// the engine only through the `struct engine` its connections point to, so nothing here
// includes or calls in a circle: loadgen.c and every protocol file include this header alone.
// loadgen.c's top comment documents the program.
#ifndef LOCKSTEP_TOOLS_LOADGEN_PROTO_H
#define LOCKSTEP_TOOLS_LOADGEN_PROTO_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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
  int op, conns, value_bytes, keys, wait_replicas, infected_every;
  int max_outstanding;       // open loop: unanswered requests per connection
  int space_docs, space_kv;  // tarantool: the spaces' ids
  long long ops_per_conn;    // 0: no limit
  long long add_from;        // ldap add: each connection's first entry number
  double seconds;
  double set_ratio;  // percent of ops that are sets; < 0: every op is --op
  double rate;       // open loop: requests per second over all connections; 0: closed loop
  const char* host;
  const char* port;
  const char* bind_dn;
  const char* password;
  const char* infected_string;
};

struct conn;

// What the engine lends every protocol: the options, the payload, and the calls a connection's
// setup makes before the clock starts.
struct engine {
  const struct config* cfg;
  const char* value;  // the --value-bytes bytes every request that writes a value carries
  int (*send_all)(int fd, const char* p, size_t n);
  // Sends one request and reads its reply. Returns the reply kind, or -1 (reason in c->lost)
  // when the connection broke, the reply was garbled, or no reply came by the deadline + grace.
  int (*round_trip)(struct conn* c, const char* req, size_t n);
  // The start of what was read of c's last reply, escaped, for a message on stderr.
  void (*print_reply)(const struct conn* c);
};

struct conn {
  const struct engine* engine;  // the same for every connection
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

// One protocol: what the engine's command line checks, and the functions that make its requests
// and read its replies. A function may be NULL where its comment says so.
struct protocol {
  const char* name;      // --proto's value
  unsigned ops;          // the ops it has: a bit (1 << OP_*) each
  int default_op;        // --op's default; -1: it needs --op (but see set_op)
  const char* needs_op;  // default_op -1: the ops to name when --op is missing
  // --set-ratio mixes these two ops, and --op may then be left out (it is set_op); -1: the
  // protocol has neither --set-ratio nor the open loop (--rate).
  int set_op, get_op;
  unsigned open_ops;     // the ops the open loop may send with --rate alone: a bit each
  int replies_by_sync;   // open loop: replies come in any order and name their request's sync
  int prefill_requests;  // prefill: requests made for each key
  // Fills value (--value-bytes bytes) before any connection is made. NULL: the engine fills it
  // with the letters a to z.
  void (*make_value)(const struct config* cfg, char* value);
  // Makes the connection's requests before the clock starts; exits 1 when one fails. NULL: none.
  void (*setup)(struct conn* c);
  // The request for op with key k (add: the entry number); *n its length. Usually at c->req.
  const char* (*format)(struct conn* c, int op, long k, size_t* n);
  // set-wait's second request, written to out (size bytes, 64 are enough); its length. NULL:
  // no set-wait.
  size_t (*format_wait)(const struct conn* c, char* out, size_t size);
  // The reply to the request just made, at the head of c->buf: returns its length, 0 if more
  // bytes are needed, -1 if it cannot be parsed (reason in c->lost, if it has one); *kind is
  // REPLY_*.
  long (*parse)(struct conn* c, int* kind);
  // The open loop's: the next reply at c->buf + off, as parse; with replies_by_sync, *sync is
  // the sync it names (its request's c->sync). NULL: no open loop.
  long (*parse_next)(struct conn* c, size_t off, int* kind, uint64_t* sync);
};

extern const struct protocol redis_protocol, memcached_protocol;  // loadgen_resp.c
extern const struct protocol ldap_protocol;                       // loadgen_ldap.c
extern const struct protocol clamd_protocol;                      // loadgen_clamd.c
extern const struct protocol tarantool_protocol;                  // loadgen_tarantool.c

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
