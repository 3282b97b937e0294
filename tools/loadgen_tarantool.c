// loadgen_tarantool.c — loadgen's Tarantool codec: iproto with its own MessagePack instead of
// msgpuck; the REPLACE and SELECT requests of the doc-* and kv-* ops on the spaces of
// apps/tarantool/init.lua, the parsing of their responses (matched to requests by IPROTO_SYNC,
// since tarantool may answer pipelined requests out of order), and each connection's greeting
// and probes of the spaces before the clock starts.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen_proto.h"

enum { TNT_REPLY, TNT_GREETING };  // what a tarantool connection reads next
enum { IPROTO_SELECT = 1, IPROTO_REPLACE = 3 };

#define TNT_GREETING_SIZE 128       // two 64-byte lines: version and instance UUID, salt
#define TNT_MAX_PACKET 0x80000000u  // iproto's own limit (IPROTO_BODY_LEN_MAX): longer is garbled
#define TNT_OWNERS 16               // doc n belongs to owner<n % 16>

// MessagePack (github.com/msgpack/msgpack/blob/master/spec.md) for iproto: the few forms our
// requests need are written; every type is read, so that tuples of any shape (floats, nil,
// bin, ext, nested arrays and maps, put there by another client) parse.
static unsigned char* mp_uint(unsigned char* p, uint64_t v) {  // positive fixint or uint 8..64
  if (v < 0x80) {
    *p++ = (unsigned char)v;
    return p;
  }
  int k = v <= 0xff ? 0 : v <= 0xffff ? 1 : v <= 0xffffffff ? 2 : 3;
  *p++ = (unsigned char)(0xcc + k);
  return put_be(p, v, 1 << k);
}

static unsigned char* mp_str(unsigned char* p, const char* s, size_t n) {
  if (n < 32) {
    *p++ = (unsigned char)(0xa0 | n);
  } else {
    int k = n <= 0xff ? 0 : n <= 0xffff ? 1 : 2;  // str 8, 16, 32
    *p++ = (unsigned char)(0xd9 + k);
    p = put_be(p, n, 1 << k);
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
    *n = get_be(q, f[1]) + (uint64_t)f[2];
    q += f[1];
    type = f[0];
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
  put_be(r + 1, (uint64_t)(p - r - 5), 4);
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

// The request for a tarantool op with key k, at c->req; *n its length. Prefill makes each key's
// doc, then its kv pair (c->seq counts them; the engine gives both the same key).
static const char* format_tarantool(struct conn* c, int op, long k, size_t* n) {
  const struct config* cfg = c->engine->cfg;
  const char* value = c->engine->value;
  if (op == OP_PREFILL) op = c->seq % 2 ? OP_KV_SET : OP_DOC_REPLACE;
  char key[32], owner[32];
  int kl = snprintf(key, sizeof key, "key:%ld", k);
  int ol = snprintf(owner, sizeof owner, "owner%ld", k % TNT_OWNERS);
  size_t vb = (size_t)cfg->value_bytes;
  int replace = op == OP_DOC_REPLACE || op == OP_KV_SET;
  unsigned char* p = tnt_begin(c, replace ? IPROTO_REPLACE : IPROTO_SELECT);
  if (replace) {  // {SPACE_ID, TUPLE}
    p = mp_map(p, 2);
    *p++ = 0x10;
    p = mp_uint(p, (uint64_t)(op == OP_KV_SET ? cfg->space_kv : cfg->space_docs));
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
      p = tnt_select(p, cfg->space_docs, 0, 1, 1);
      p = mp_uint(p, (uint64_t)k);
      break;
    case OP_DOC_BY_OWNER:
      p = tnt_select(p, cfg->space_docs, 1, 10, 1);
      p = mp_str(p, owner, (size_t)ol);
      break;
    default:  // OP_KV_GET
      p = tnt_select(p, cfg->space_kv, 0, 1, 1);
      p = mp_str(p, key, (size_t)kl);
  }
  *n = tnt_end(c, p);
  return c->req;
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
static long parse_tarantool_at(struct conn* c, size_t off, int* kind, uint64_t* sync) {
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
  long m = parse_tarantool_at(c, 0, kind, &sync);
  if (m > 0 && sync != c->sync) {
    c->lost = "reply to another IPROTO_SYNC";
    return -1;
  }
  return m;
}

// Before the clock starts: the greeting, and a select with limit 0 from every space and index
// the op uses.
static void setup_tarantool(struct conn* c) {
  const struct engine* e = c->engine;
  const struct config* cfg = e->cfg;
  c->expect = TNT_GREETING;
  if (e->round_trip(c, "", 0) < 0) {  // nothing to send: the server speaks first
    fprintf(stderr, "loadgen: tarantool connection %d to %s:%s failed: %s; read: ", c->id + 1,
            cfg->host, cfg->port, c->lost);
    e->print_reply(c);
    exit(1);
  }
  int docs = cfg->op == OP_DOC_REPLACE || cfg->op == OP_DOC_GET || cfg->op == OP_PREFILL;
  int kv = cfg->op == OP_KV_SET || cfg->op == OP_KV_GET || cfg->op == OP_PREFILL;
  // Each with a key of the type of the op's keys, which the server checks against the index
  // even with limit 0: swapped space ids are refused too.
  const struct {
    int used, space, index;
    const char *key, *option;  // key NULL: the unsigned 0
  } probes[] = {{docs, cfg->space_docs, 0, NULL, "--space-docs"},
                {cfg->op == OP_DOC_BY_OWNER, cfg->space_docs, 1, "owner0", "--space-docs"},
                {kv, cfg->space_kv, 0, "key:0", "--space-kv"}};
  for (int i = 0; i < 3; i++) {
    if (!probes[i].used) continue;
    const char* key = probes[i].key;
    unsigned char* p =
        tnt_select(tnt_begin(c, IPROTO_SELECT), probes[i].space, probes[i].index, 0, 1);
    p = key ? mp_str(p, key, strlen(key)) : mp_uint(p, 0);
    int kind = e->round_trip(c, c->req, tnt_end(c, p));
    if (kind == REPLY_OK || kind == REPLY_MISS) continue;  // limit 0: always no tuple
    struct tnt_reply r = {.error = (const unsigned char*)""};
    if (kind > 0) tnt_message((const unsigned char*)c->buf, c->len, &r);
    fprintf(stderr, "loadgen: tarantool select from space %d index %d on %s:%s ", probes[i].space,
            probes[i].index, cfg->host, cfg->port);
    if (kind < 0) {
      fprintf(stderr, "failed: %s; read: ", c->lost);
      e->print_reply(c);
    } else {
      fprintf(stderr, "refused: error %llu: %.*s (%s?)\n", (unsigned long long)(r.code & 0x7fff),
              (int)r.error_len, (const char*)r.error, probes[i].option);
    }
    exit(1);
  }
}

const struct protocol tarantool_protocol = {
    .name = "tarantool",
    .ops = 1 << OP_PREFILL | 1 << OP_DOC_REPLACE | 1 << OP_DOC_GET | 1 << OP_DOC_BY_OWNER |
           1 << OP_KV_SET | 1 << OP_KV_GET,
    .default_op = -1,
    .needs_op = "doc-replace, doc-get, doc-by-owner, kv-set, kv-get or prefill",
    .set_op = OP_KV_SET,
    .get_op = OP_KV_GET,
    .open_ops = 1 << OP_DOC_REPLACE | 1 << OP_DOC_GET | 1 << OP_DOC_BY_OWNER | 1 << OP_KV_SET |
                1 << OP_KV_GET,
    .replies_by_sync = 1,
    .prefill_requests = 2,
    .setup = setup_tarantool,
    .format = format_tarantool,
    .parse = parse_tarantool,
    .parse_next = parse_tarantool_at,
};
