// loadgen_resp.c — loadgen's redis (RESP) and memcached (text protocol) codec: the SET, GET and
// WAIT requests and the parsing of their replies. Both protocols reply in order, so the open loop
// pipelines them without naming requests.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen_proto.h"

// The reply at c->buf + off. A RESP reply to SET, GET or WAIT: a line, or a bulk string.
static long parse_redis_at(struct conn* c, size_t off, int* kind, uint64_t* sync) {
  (void)sync;  // replies come in order
  const char* buf = c->buf + off;
  size_t len = c->len - off;
  const struct config* cfg = c->engine->cfg;
  const char* eol = memmem(buf, len, "\r\n", 2);
  if (!eol) return 0;
  long line = eol - buf + 2;
  *kind = REPLY_OK;
  switch (buf[0]) {
    case '+': return line;
    case '-': *kind = REPLY_ERROR; return line;
    case ':':
      if (cfg->op == OP_SET_WAIT && atol(buf + 1) < cfg->wait_replicas) *kind = REPLY_ERROR;
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

// A memcached reply to set or get: STORED, END (a miss), VALUE ... END, or an error line.
static long parse_memcached_at(struct conn* c, size_t off, int* kind, uint64_t* sync) {
  (void)sync;  // replies come in order
  const char* buf = c->buf + off;
  size_t len = c->len - off;
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

static long parse_redis(struct conn* c, int* kind) {
  return parse_redis_at(c, 0, kind, NULL);
}

static long parse_memcached(struct conn* c, int* kind) {
  return parse_memcached_at(c, 0, kind, NULL);
}

// Appends --value-bytes of value and CRLF to the request header of h bytes at c->req; returns
// the request's length.
static size_t append_value(struct conn* c, int h) {
  int vb = c->engine->cfg->value_bytes;
  memcpy(c->req + h, c->engine->value, (size_t)vb);
  memcpy(c->req + h + vb, "\r\n", 2);
  return (size_t)(h + vb + 2);
}

// `SET key:<k> <value>` or `GET key:<k>` (set-wait's SET too).
static const char* format_redis(struct conn* c, int op, long k, size_t* n) {
  char key[32];
  int kl = snprintf(key, sizeof key, "key:%ld", k);
  if (op == OP_GET) {
    *n = (size_t)sprintf(c->req, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", kl, key);
  } else {
    int vb = c->engine->cfg->value_bytes;
    *n = append_value(c, sprintf(c->req, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", kl, key, vb));
  }
  return c->req;
}

// `set key:<k> 0 0 <bytes>` and the value, or `get key:<k>`.
static const char* format_memcached(struct conn* c, int op, long k, size_t* n) {
  if (op == OP_GET) {
    *n = (size_t)sprintf(c->req, "get key:%ld\r\n", k);
  } else {
    *n = append_value(c, sprintf(c->req, "set key:%ld 0 0 %d\r\n", k, c->engine->cfg->value_bytes));
  }
  return c->req;
}

// set-wait's second request: `WAIT <wait-replicas> 0`.
static size_t format_redis_wait(const struct conn* c, char* out, size_t size) {
  char num[16];
  int nl = snprintf(num, sizeof num, "%d", c->engine->cfg->wait_replicas);
  return (size_t)snprintf(out, size, "*3\r\n$4\r\nWAIT\r\n$%d\r\n%s\r\n$1\r\n0\r\n", nl, num);
}

const struct protocol redis_protocol = {
    .name = "redis",
    .ops = 1 << OP_SET | 1 << OP_GET | 1 << OP_SET_WAIT,
    .default_op = OP_SET,
    .set_op = OP_SET,
    .get_op = OP_GET,
    .open_ops = 1 << OP_SET | 1 << OP_GET,
    .format = format_redis,
    .format_wait = format_redis_wait,
    .parse = parse_redis,
    .parse_next = parse_redis_at,
};

const struct protocol memcached_protocol = {
    .name = "memcached",
    .ops = 1 << OP_SET | 1 << OP_GET,
    .default_op = OP_SET,
    .set_op = OP_SET,
    .get_op = OP_GET,
    .open_ops = 1 << OP_SET | 1 << OP_GET,
    .format = format_memcached,
    .parse = parse_memcached,
    .parse_next = parse_memcached_at,
};
