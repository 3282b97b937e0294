// log_format.cc — record encoding, checking, CRC32C and canaries.
#include "consensus/log_format.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace lockstep {

std::string BallotString(Ballot b) {
  return std::to_string(BallotRound(b)) + "." + std::to_string(BallotLeader(b));
}

bool IsSlotType(EntryType t) {
  return t == EntryType::kInput || t == EntryType::kNoop || t == EntryType::kOutputCheck ||
         t == EntryType::kConfig;
}

const char* EntryTypeName(EntryType t) {
  switch (t) {
    case EntryType::kInput: return "input";
    case EntryType::kNoop: return "noop";
    case EntryType::kOutputCheck: return "output-check";
    case EntryType::kConfig: return "config";
    case EntryType::kPromise: return "promise";
    case EntryType::kPad: return "pad";
    case EntryType::kWrap: return "wrap";
    case EntryType::kTruncate: return "truncate";
  }
  return "unknown";
}

namespace {

// Table for the software path (Castagnoli polynomial, reflected).
struct Crc32cTable {
  uint32_t t[8][256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
      for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

uint32_t Crc32cSoftware(uint32_t crc, const uint8_t* p, size_t len) {
  static const Crc32cTable table;
  crc = ~crc;
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    v ^= crc;
    crc = table.t[7][v & 0xff] ^ table.t[6][(v >> 8) & 0xff] ^ table.t[5][(v >> 16) & 0xff] ^
          table.t[4][(v >> 24) & 0xff] ^ table.t[3][(v >> 32) & 0xff] ^
          table.t[2][(v >> 40) & 0xff] ^ table.t[1][(v >> 48) & 0xff] ^ table.t[0][v >> 56];
    p += 8;
    len -= 8;
  }
  while (len--) crc = (crc >> 8) ^ table.t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const uint8_t* p,
                                                          size_t len) {
  uint64_t c = ~crc & 0xffffffffu;
  while (len >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    len -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (len--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

bool HaveSse42() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_SSE4_2) != 0;
}
#endif

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool hw = HaveSse42();
  if (hw) return Crc32cHardware(crc, p, len);
#endif
  return Crc32cSoftware(crc, p, len);
}

uint64_t CanaryFor(Ballot ballot, uint64_t index, uint64_t position, uint64_t stream) {
  // splitmix64 over the four fields; forced non-zero so zeroed memory never
  // matches. Stream 0 (disk) adds nothing: the disk's canaries stay as they were.
  uint64_t z = ballot * 0x9e3779b97f4a7c15ull ^ index * 0xbf58476d1ce4e5b9ull ^
               (position + 0x94d049bb133111ebull) ^ stream * 0xd6e8feb86659fd93ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z | 1;
}

// The stream, when there is one, is checksummed after the payload (it is
// not stored: the reader knows which stream it reads).
static uint32_t RecordChecksum(const RecordHeader& h, const void* payload, uint64_t stream) {
  RecordHeader copy = h;
  copy.checksum = 0;
  uint32_t crc = Crc32c(0, &copy, sizeof copy);
  crc = Crc32c(crc, payload, h.payload_len);
  return stream == 0 ? crc : Crc32c(crc, &stream, sizeof stream);
}

void EncodeRecord(uint8_t* out, EntryType type, Ballot ballot, uint64_t index,
                  uint64_t commit_index, uint64_t position, std::string_view payload,
                  uint64_t stream) {
  RecordHeader h{};
  h.magic = kRecordMagic;
  h.type = static_cast<uint8_t>(type);
  h.payload_len = static_cast<uint32_t>(payload.size());
  h.ballot = ballot;
  h.index = index;
  h.commit_index = commit_index;
  h.position = position;
  h.checksum = RecordChecksum(h, payload.data(), stream);
  memcpy(out, &h, sizeof h);
  if (!payload.empty()) memcpy(out + kHeaderSize, payload.data(), payload.size());
  size_t padded = Align8(payload.size());
  if (padded > payload.size())
    memset(out + kHeaderSize + payload.size(), 0, padded - payload.size());
  uint64_t canary = CanaryFor(ballot, index, position, stream);
  memcpy(out + kHeaderSize + padded, &canary, sizeof canary);
}

DecodeStatus DecodeRecord(const uint8_t* buf, size_t avail, uint64_t position, DecodedRecord* out,
                          uint64_t stream) {
  if (avail < kHeaderSize + kCanarySize) return DecodeStatus::kIncomplete;
  RecordHeader h;
  memcpy(&h, buf, sizeof h);
  if (h.magic != kRecordMagic || h.position != position) return DecodeStatus::kIncomplete;
  if (h.payload_len > kMaxPayload) return DecodeStatus::kIncomplete;
  size_t size = RecordSize(h.payload_len);
  if (size > avail) return DecodeStatus::kTooLarge;
  uint64_t canary;
  memcpy(&canary, buf + size - kCanarySize, sizeof canary);
  if (canary != CanaryFor(h.ballot, h.index, h.position, stream)) return DecodeStatus::kIncomplete;
  if (RecordChecksum(h, buf + kHeaderSize, stream) != h.checksum) return DecodeStatus::kIncomplete;
  out->header = h;
  out->payload = std::string_view(reinterpret_cast<const char*>(buf + kHeaderSize), h.payload_len);
  out->size = size;
  return DecodeStatus::kOk;
}

}  // namespace lockstep

// ---------------------------------------------------------------- invariants
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "consensus/assert.h"

namespace lockstep {
static AssertHandler g_assert_handler = nullptr;
void SetAssertHandler(AssertHandler handler) {
  g_assert_handler = handler;
}

void AssertFailed(const char* file, int line, const char* cond, const char* fmt, ...) {
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  std::string message = std::string("invariant violated at ") + file + ":" + std::to_string(line) +
                        ": " + cond + ": " + detail;
  if (g_assert_handler) g_assert_handler(message);
  fprintf(stderr, "lockstep: %s\n", message.c_str());
  abort();
}
}  // namespace lockstep
