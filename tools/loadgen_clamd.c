// loadgen_clamd.c — loadgen's clamd codec: the two INSTREAM scan requests every op sends (clean
// data, and the same with --infected-string in the middle), the parsing of clamd's replies in an
// IDSESSION, and each connection's IDSESSION and PING before the clock starts.
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen_proto.h"

enum { CLAMD_PONG, CLAMD_OK, CLAMD_FOUND };  // what a clamd reply must say

#define CLAMD_CHUNK 8192  // clamdscan's INSTREAM chunk size

static char *clamd_clean, *clamd_infected;  // whole INSTREAM requests, shared by all threads
static size_t clamd_clean_len, clamd_infected_len;

// `zINSTREAM` and data in chunks of <4-byte big-endian length><bytes>, ending with length 0.
static char* clamd_request(const char* data, size_t len, size_t* n) {
  char* r = malloc(len + 4 * (len / CLAMD_CHUNK + 2) + 16);
  memcpy(r, "zINSTREAM", 10);
  size_t o = 10;
  uint32_t part = 0;
  for (size_t at = 0;; at += part) {
    part = len - at < CLAMD_CHUNK ? (uint32_t)(len - at) : CLAMD_CHUNK;
    put_be((unsigned char*)r + o, part, 4);
    memcpy(r + o + 4, data + at, part);
    o += 4 + part;
    if (part == 0) break;
  }
  *n = o;
  return r;
}

// Fills value with random-looking bytes, typed as plain data by clamd (letters would be text,
// which it scans differently); the same in every op and run, so clamd's cache of clean files
// hits. Then makes the clean request of them and the infected one (value is left infected).
static void make_clamd_streams(const struct config* cfg, char* value) {
  size_t vb = (size_t)cfg->value_bytes;
  uint64_t s = 0x5DEECE66DULL;
  for (size_t i = 0; i < vb; i++) value[i] = (char)(next_rand(&s) >> 56);
  clamd_clean = clamd_request(value, vb, &clamd_clean_len);
  size_t sl = strlen(cfg->infected_string);  // value is not needed clean after this
  memcpy(value + (vb - sl) / 2, cfg->infected_string, sl);
  clamd_infected = clamd_request(value, vb, &clamd_infected_len);
}

// The next scan of c (every op is a scan, of no key): infected if it is the
// --infected-every-th; *n its length. Not at c->req: all connections share the two requests.
static const char* clamd_scan_request(struct conn* c, int op, long k, size_t* n) {
  (void)op;
  (void)k;
  int every = c->engine->cfg->infected_every;
  int infected = every && (c->seq + 1) % every == 0;
  c->msgid++;
  c->expect = infected ? CLAMD_FOUND : CLAMD_OK;
  *n = infected ? clamd_infected_len : clamd_clean_len;
  return infected ? clamd_infected : clamd_clean;
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

// Before the clock starts: IDSESSION, checked with PING (request number 1).
static void setup_clamd(struct conn* c) {
  const struct engine* e = c->engine;
  c->msgid = 1;
  c->expect = CLAMD_PONG;
  int kind = e->send_all(c->fd, "zIDSESSION", 11) < 0 ? -1 : e->round_trip(c, "zPING", 6);
  if (kind == REPLY_OK) return;
  const char* why = kind < 0 ? (c->lost ? c->lost : strerror(errno)) : "PING not answered PONG";
  fprintf(stderr, "loadgen: IDSESSION %d with %s:%s failed: %s%s; read: ", c->id + 1, e->cfg->host,
          e->cfg->port, why,
          c->id > 0 && strncmp(why, "no reply", 8) == 0
              ? " (clamd serves at most MaxQueue sessions at once, 100 by default)"
              : "");
  e->print_reply(c);
  exit(1);
}

const struct protocol clamd_protocol = {
    .name = "clamd",
    .ops = 1 << OP_SCAN,
    .default_op = OP_SCAN,
    .set_op = -1,
    .get_op = -1,
    .make_value = make_clamd_streams,
    .setup = setup_clamd,
    .format = clamd_scan_request,
    .parse = parse_clamd,
};
