// loadgen_resp.c — loadgen's redis (RESP) and memcached (text protocol) codec: the SET, GET and
// WAIT requests and the parsing of their replies. Both protocols reply in order, so the open loop
// pipelines them without naming requests.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"

// Length of a complete reply at the head of buf, 0 if more bytes are needed, -1 if the
// reply cannot be parsed. *kind says whether it is OK, a miss or an error reply.
long parse_redis(const char* buf, size_t len, int* kind) {
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

long parse_memcached(const char* buf, size_t len, int* kind) {
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

// A set (redis SET, memcached set with <value-bytes> of value) or a get of key:<k>.
size_t format_redis_memcached(struct conn* c, int op, long k) {
  char key[32];
  int kl = snprintf(key, sizeof key, "key:%ld", k);
  int vb = cfg.value_bytes, h;
  if (cfg.proto == PROTO_REDIS) {
    if (op == OP_GET) return (size_t)sprintf(c->req, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", kl, key);
    h = sprintf(c->req, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", kl, key, vb);
  } else {
    if (op == OP_GET) return (size_t)sprintf(c->req, "get %s\r\n", key);
    h = sprintf(c->req, "set %s 0 0 %d\r\n", key, vb);
  }
  memcpy(c->req + h, value, (size_t)vb);
  memcpy(c->req + h + vb, "\r\n", 2);
  return (size_t)(h + vb + 2);
}

// set-wait's second request, at out (size bytes, 64 are enough); its length.
size_t format_redis_wait(char* out, size_t size) {
  char num[16];
  int nl = snprintf(num, sizeof num, "%d", cfg.wait_replicas);
  return (size_t)snprintf(out, size, "*3\r\n$4\r\nWAIT\r\n$%d\r\n%s\r\n$1\r\n0\r\n", nl, num);
}
