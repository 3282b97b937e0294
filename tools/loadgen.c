// loadgen — a closed-loop load generator for redis (RESP) and memcached (text protocol).
// The same program drives every mode of scripts/bench (unreplicated, lockstep, aof-always,
// redis-wait), so the numbers compare like with like.
//
//   loadgen --proto redis|memcached --host H --port P --conns N [--ops-per-conn K]
//           [--seconds S] --op set|get|set-wait [--value-bytes 64] [--keys 10000]
//           [--wait-replicas 2]
//
// Each of the N connections has its own thread and one request outstanding: it sends a
// request, waits for the whole reply, then sends the next (closed loop). A connection stops
// after K ops or S seconds, whichever comes first; a reply that has not come 5 s after the
// deadline counts as an error and ends that connection, so a run always ends.
//   set       redis `SET key:<n> <value>`, memcached `set key:<n> 0 0 <bytes>`
//   get       redis `GET key:<n>`, memcached `get key:<n>` (a miss is counted in "misses")
//   set-wait  redis only: `SET`, then `WAIT <wait-replicas> 0` once SET's reply is in; the
//             pair is one op and its latency covers both round trips
// Keys are drawn uniformly from key:0 .. key:<keys-1>. Every op's latency (CLOCK_MONOTONIC)
// goes into a log-linear histogram (1.6% resolution). Prints one JSON line on stdout:
//   {"ops", "seconds", "ops_per_s", "p50_us", "p99_us", "errors", "misses"}
// Exit status: 0; 1 when a connection cannot be made or is lost (the JSON is still printed
// for a lost connection); 2 for a bad command line.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
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
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { PROTO_REDIS, PROTO_MEMCACHED };
enum { OP_SET, OP_GET, OP_SET_WAIT };
enum { REPLY_OK, REPLY_MISS, REPLY_ERROR };

#define SUB_BITS 6  // 64 sub-buckets per power of two
#define NBUCKETS ((64 - SUB_BITS + 1) << SUB_BITS)
#define GRACE_NS 5000000000LL  // how long an op may run past the deadline

static struct {
  int proto, op, conns, value_bytes, keys, wait_replicas;
  long long ops_per_conn;  // 0: no limit
  double seconds;
  const char* host;
  const char* port;
} cfg = {PROTO_REDIS, OP_SET, 1, 64, 10000, 2, 0, 10.0, "127.0.0.1", NULL};

struct conn {
  pthread_t thread;
  int fd;
  const char* lost;  // why the connection was given up (closed, timed out, garbled), or NULL
  uint64_t rng;
  long long ops, errors, misses;
  uint64_t hist[NBUCKETS];
  char* req;  // request buffer
  char* buf;  // reply buffer
  size_t cap, len;
};

static int64_t start_ns, deadline_ns;
static char* value;

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
    long used = cfg.proto == PROTO_REDIS ? parse_redis(c->buf, c->len, &kind)
                                         : parse_memcached(c->buf, c->len, &kind);
    if (used < 0) {
      c->lost = "garbled reply";
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
    c->buf[c->len] = '\0';  // so that atol and sscanf stop inside the buffer
  }
}

// Writes the request for key k into c->req; returns its length.
static size_t format_request(struct conn* c, int op, long k) {
  char key[32];
  int kl = snprintf(key, sizeof key, "key:%ld", k);
  int vb = cfg.value_bytes, n;
  if (cfg.proto == PROTO_REDIS) {
    if (op == OP_GET) return (size_t)sprintf(c->req, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", kl, key);
    n = sprintf(c->req, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", kl, key, vb);
  } else {
    if (op == OP_GET) return (size_t)sprintf(c->req, "get %s\r\n", key);
    n = sprintf(c->req, "set %s 0 0 %d\r\n", key, vb);
  }
  memcpy(c->req + n, value, (size_t)vb);
  memcpy(c->req + n + vb, "\r\n", 2);
  return (size_t)(n + vb + 2);
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
  while ((cfg.ops_per_conn == 0 || c->ops + c->errors < cfg.ops_per_conn) &&
         now_ns() < deadline_ns) {
    long k = (long)(next_rand(&c->rng) % (uint64_t)cfg.keys);
    size_t n = format_request(c, cfg.op == OP_GET ? OP_GET : OP_SET, k);
    int64_t t0 = now_ns();
    int kind = round_trip(c, c->req, n);
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
    c->ops++;
    c->hist[bucket_of((uint64_t)(t1 - t0))]++;
  }
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

static void usage(void) {
  fprintf(stderr,
          "usage: loadgen --proto redis|memcached --port P [--host 127.0.0.1] [--conns 1]\n"
          "               [--ops-per-conn K] [--seconds 10] [--op set|get|set-wait]\n"
          "               [--value-bytes 64] [--keys 10000] [--wait-replicas 2]\n");
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

static void parse_args(int argc, char** argv) {
  static const struct option opts[] = {{"proto", 1, 0, 'P'},        {"host", 1, 0, 'h'},
                                       {"port", 1, 0, 'p'},         {"conns", 1, 0, 'c'},
                                       {"ops-per-conn", 1, 0, 'k'}, {"seconds", 1, 0, 's'},
                                       {"op", 1, 0, 'o'},           {"value-bytes", 1, 0, 'v'},
                                       {"keys", 1, 0, 'n'},         {"wait-replicas", 1, 0, 'w'},
                                       {"help", 0, 0, '?'},         {0, 0, 0, 0}};
  int o;
  char* end;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
      case 'P':
        if (strcmp(optarg, "redis") == 0) {
          cfg.proto = PROTO_REDIS;
        } else if (strcmp(optarg, "memcached") == 0) {
          cfg.proto = PROTO_MEMCACHED;
        } else {
          fprintf(stderr, "loadgen: --proto must be redis or memcached\n");
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
      case 's':
        cfg.seconds = strtod(optarg, &end);
        if (*end || end == optarg || !(cfg.seconds > 0 && cfg.seconds <= 86400)) {
          fprintf(stderr, "loadgen: --seconds expects a number in (0, 86400]\n");
          exit(2);
        }
        break;
      case 'o':
        if (strcmp(optarg, "set") == 0) {
          cfg.op = OP_SET;
        } else if (strcmp(optarg, "get") == 0) {
          cfg.op = OP_GET;
        } else if (strcmp(optarg, "set-wait") == 0) {
          cfg.op = OP_SET_WAIT;
        } else {
          fprintf(stderr, "loadgen: --op must be set, get or set-wait\n");
          exit(2);
        }
        break;
      case 'v': cfg.value_bytes = (int)num_arg("value-bytes", optarg, 1, 1 << 26); break;
      case 'n': cfg.keys = (int)num_arg("keys", optarg, 1, 1 << 30); break;
      case 'w': cfg.wait_replicas = (int)num_arg("wait-replicas", optarg, 0, 1000); break;
      default: usage();
    }
  }
  if (optind < argc || !cfg.port) usage();
  if (cfg.op == OP_SET_WAIT && cfg.proto != PROTO_REDIS) {
    fprintf(stderr, "loadgen: --op set-wait needs --proto redis\n");
    exit(2);
  }
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  value = malloc((size_t)cfg.value_bytes);
  for (int i = 0; i < cfg.value_bytes; i++) value[i] = (char)('a' + i % 26);

  struct conn* cs = calloc((size_t)cfg.conns, sizeof *cs);
  for (int i = 0; i < cfg.conns; i++) {  // every connection is up before the clock starts
    cs[i].fd = connect_to(cfg.host, cfg.port);
    if (cs[i].fd < 0) return 1;
    cs[i].rng = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1) ^ (uint64_t)now_ns();
    cs[i].req = malloc((size_t)cfg.value_bytes + 128);
    cs[i].cap = (size_t)cfg.value_bytes + 256;
    cs[i].buf = malloc(cs[i].cap);
  }
  start_ns = now_ns();
  deadline_ns = start_ns + (int64_t)(cfg.seconds * 1e9);
  for (int i = 0; i < cfg.conns; i++) {
    if (pthread_create(&cs[i].thread, NULL, run_conn, &cs[i]) != 0) {
      fprintf(stderr, "loadgen: cannot start thread %d\n", i);
      return 1;
    }
  }

  static uint64_t hist[NBUCKETS];
  long long ops = 0, errors = 0, misses = 0;
  int lost = 0;
  const char* why = NULL;
  const struct conn* example = NULL;
  for (int i = 0; i < cfg.conns; i++) {
    pthread_join(cs[i].thread, NULL);
    for (int b = 0; b < NBUCKETS; b++) hist[b] += cs[i].hist[b];
    ops += cs[i].ops;
    errors += cs[i].errors;
    misses += cs[i].misses;
    if (cs[i].lost) {
      lost++;
      why = cs[i].lost;
      example = &cs[i];
    }
    close(cs[i].fd);
  }
  double secs = (double)(now_ns() - start_ns) / 1e9;
  if (lost) {  // say why, with the start of what was read of the last reply
    fprintf(stderr, "loadgen: %d of %d connections to %s:%s lost, e.g. %s after %lld ops; read: \"",
            lost, cfg.conns, cfg.host, cfg.port, why, example->ops);
    for (size_t i = 0; i < example->len && i < 80; i++) {
      unsigned char ch = (unsigned char)example->buf[i];
      fprintf(stderr, ch >= 32 && ch < 127 && ch != '\\' ? "%c" : "\\x%02x", ch);
    }
    fprintf(stderr, "\"\n");
  }
  printf(
      "{\"ops\": %lld, \"seconds\": %.3f, \"ops_per_s\": %.1f, \"p50_us\": %.1f, "
      "\"p99_us\": %.1f, \"errors\": %lld, \"misses\": %lld}\n",
      ops, secs, secs > 0 ? (double)ops / secs : 0.0, percentile_us(hist, ops, 0.50),
      percentile_us(hist, ops, 0.99), errors, misses);
  return lost ? 1 : 0;
}
