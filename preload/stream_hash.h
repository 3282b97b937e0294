/* stream_hash.h — the digest of a connection's output stream, computed by
 * the shim as the server sends (preload/shim_abi.h, "Output").
 *
 * The digest at stream offset o is XXH64 with seed 0 of the stream's bytes
 * [0, o) (Yann Collet's algorithm, implemented here from its specification:
 * the shim may call nothing but libc, and the server may link its own
 * hashing library). The state carries a partial 32-byte stripe across
 * calls, so the digest depends on the bytes only, never on how they were
 * chunked; ls_stream_hash_digest() reads the state without changing it, so
 * a digest can be taken at any offset and the stream goes on.
 *
 * Plain C11, header-only (static inline), no allocation, no locks: the
 * caller owns the state. Included by the shim and by its tests. */
#ifndef LOCKSTEP_STREAM_HASH_H
#define LOCKSTEP_STREAM_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LS_XXH_P1 0x9E3779B185EBCA87ull
#define LS_XXH_P2 0xC2B2AE3D27D4EB4Full
#define LS_XXH_P3 0x165667B19E3779F9ull
#define LS_XXH_P4 0x85EBCA77C2B2AE63ull
#define LS_XXH_P5 0x27D4EB2F165667C5ull

struct ls_stream_hash {
  uint64_t acc[4];    /* the four lanes, over whole 32-byte stripes */
  uint64_t total;     /* bytes fed so far: the stream offset */
  uint8_t stripe[32]; /* the stripe begun, not yet complete */
  uint32_t buffered;  /* bytes in `stripe` */
};

static inline uint64_t ls_xxh_rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

static inline uint64_t ls_xxh_le64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static inline uint32_t ls_xxh_le32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

static inline uint64_t ls_xxh_round(uint64_t acc, uint64_t input) {
  acc += input * LS_XXH_P2;
  acc = ls_xxh_rotl(acc, 31);
  return acc * LS_XXH_P1;
}

static inline uint64_t ls_xxh_merge(uint64_t h, uint64_t acc) {
  h ^= ls_xxh_round(0, acc);
  return h * LS_XXH_P1 + LS_XXH_P4;
}

static inline void ls_xxh_stripe(uint64_t acc[4], const uint8_t* p) {
  acc[0] = ls_xxh_round(acc[0], ls_xxh_le64(p));
  acc[1] = ls_xxh_round(acc[1], ls_xxh_le64(p + 8));
  acc[2] = ls_xxh_round(acc[2], ls_xxh_le64(p + 16));
  acc[3] = ls_xxh_round(acc[3], ls_xxh_le64(p + 24));
}

static inline void ls_stream_hash_init(struct ls_stream_hash* s) {
  s->acc[0] = LS_XXH_P1 + LS_XXH_P2; /* seed 0 */
  s->acc[1] = LS_XXH_P2;
  s->acc[2] = 0;
  s->acc[3] = 0 - LS_XXH_P1;
  s->total = 0;
  s->buffered = 0;
}

static inline void ls_stream_hash_update(struct ls_stream_hash* s, const void* data, size_t n) {
  const uint8_t* p = (const uint8_t*)data;
  s->total += n;
  if (s->buffered + n < 32) {
    if (n) memcpy(s->stripe + s->buffered, p, n);
    s->buffered += (uint32_t)n;
    return;
  }
  if (s->buffered) { /* complete the stripe begun by earlier calls */
    size_t fill = 32 - s->buffered;
    memcpy(s->stripe + s->buffered, p, fill);
    ls_xxh_stripe(s->acc, s->stripe);
    p += fill;
    n -= fill;
    s->buffered = 0;
  }
  uint64_t acc[4] = {s->acc[0], s->acc[1], s->acc[2], s->acc[3]};
  for (; n >= 32; p += 32, n -= 32) ls_xxh_stripe(acc, p);
  memcpy(s->acc, acc, sizeof acc);
  if (n) memcpy(s->stripe, p, n);
  s->buffered = (uint32_t)n;
}

/* The digest of the bytes fed so far; the state is left as it was. */
static inline uint64_t ls_stream_hash_digest(const struct ls_stream_hash* s) {
  uint64_t h;
  if (s->total >= 32) {
    h = ls_xxh_rotl(s->acc[0], 1) + ls_xxh_rotl(s->acc[1], 7) + ls_xxh_rotl(s->acc[2], 12) +
        ls_xxh_rotl(s->acc[3], 18);
    for (int i = 0; i < 4; i++) h = ls_xxh_merge(h, s->acc[i]);
  } else {
    h = s->acc[2] + LS_XXH_P5; /* the seed */
  }
  h += s->total;
  const uint8_t* p = s->stripe;
  size_t n = s->buffered;
  for (; n >= 8; p += 8, n -= 8) {
    h ^= ls_xxh_round(0, ls_xxh_le64(p));
    h = ls_xxh_rotl(h, 27) * LS_XXH_P1 + LS_XXH_P4;
  }
  if (n >= 4) {
    h ^= (uint64_t)ls_xxh_le32(p) * LS_XXH_P1;
    h = ls_xxh_rotl(h, 23) * LS_XXH_P2 + LS_XXH_P3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; p++, n--) {
    h ^= (uint64_t)*p * LS_XXH_P5;
    h = ls_xxh_rotl(h, 11) * LS_XXH_P1;
  }
  h ^= h >> 33;
  h *= LS_XXH_P2;
  h ^= h >> 29;
  h *= LS_XXH_P3;
  h ^= h >> 32;
  return h;
}

#endif
