// fuzz_shim_ring.cc — libFuzzer target for what the daemon reads from the
// shim's shared memory (guard/server/shim_channel.h), which the server process may
// scribble on: ParseSubmission, the parser behind ShimChannel::Peek, walked
// over a submission ring of the fuzzer's bytes the way Peek and Pop walk it,
// and ShimChannel::DecodeOutputRecord on output ring records. Every record
// handed out must lie inside the ring and before the shim's head.
#include <vector>

#include "fuzz/fuzz_util.h"
#include "guard/server/shim_channel.h"

namespace lockstep {
namespace {

// Input: mode u8, tail u64, head u64 (or head - tail), then the ring's bytes.
void Submissions(fuzz::Cursor& c, uint8_t mode) {
  // The daemon's tail counts the bytes it consumed from 0: never within a
  // ring of 2^64, where tail + size would wrap (the head is the shim's: any).
  uint64_t tail = c.u64() & ((uint64_t{1} << 62) - 1);
  uint64_t head = c.u64();
  std::string_view bytes = c.rest();
  // The ring: the daemon's own geometry, 8-aligned and at least one record header.
  uint64_t ring_bytes = (bytes.size() + 7) & ~uint64_t{7};
  if (ring_bytes < sizeof(ls_sub_record)) ring_bytes = sizeof(ls_sub_record);
  std::vector<uint64_t> words(ring_bytes / 8);
  const char* ring = reinterpret_cast<const char*>(words.data());
  memcpy(words.data(), bytes.data(), bytes.size());
  if (!(mode & 2)) tail &= ~uint64_t{7};                     // the daemon's tail is always aligned
  if (mode & 4) head = tail + head % (2 * ring_bytes + 16);  // near the tail
  for (int i = 0; i < 1024; i++) {
    ShimChannel::Submission s{};
    uint64_t size = 0;
    std::string error;
    SubmissionAt at = ParseSubmission(ring, ring_bytes, tail, head, &s, &size, &error);
    if (at == SubmissionAt::kEmpty) {
      FUZZ_CHECK(head == tail);
      return;
    }
    if (at == SubmissionAt::kCorrupt) {
      FUZZ_CHECK(!error.empty());
      return;
    }
    FUZZ_CHECK(tail % 8 == 0 && head % 8 == 0);
    FUZZ_CHECK(size > 0 && size % 8 == 0 && size <= head - tail && size <= ring_bytes);
    if (at == SubmissionAt::kRecord) {
      FUZZ_CHECK(size >= sizeof(ls_sub_record) + s.bytes.size());
      FUZZ_CHECK(s.kind >= LS_SUB_ACCEPT && s.kind <= LS_SUB_TICK);  // checked, never handed on
      if (s.kind == LS_SUB_TICK)
        FUZZ_CHECK(s.bytes.size() == sizeof(ls_tick) && s.tick_waiter < ShimChannel::kMaxWaiter);
      const char* lo = ring + tail % ring_bytes + sizeof(ls_sub_record);
      FUZZ_CHECK(s.bytes.data() == lo && lo + s.bytes.size() <= ring + ring_bytes);
      uint64_t sum = 0;  // every byte handed out is readable (ASan)
      for (char ch : s.bytes) sum += static_cast<unsigned char>(ch);
      (void)sum;
    } else {
      FUZZ_CHECK((tail + size) % ring_bytes == 0);  // a wrap goes to the ring's start
    }
    tail += size;  // Pop, or the wrap's skip
  }
}

// Input: mode u8, then 32-byte output records.
void OutputRecords(fuzz::Cursor& c) {
  std::string_view bytes = c.rest();
  for (size_t off = 0; off + sizeof(ls_out_record) <= bytes.size(); off += sizeof(ls_out_record)) {
    ls_out_record r;
    memcpy(&r, bytes.data() + off, sizeof r);
    ShimChannel::OutputDigest d;
    if (!ShimChannel::DecodeOutputRecord(r, &d)) continue;
    FUZZ_CHECK(d.replay_slot >= -1 && d.replay_slot < static_cast<int>(LS_MAX_REPLAY));
    FUZZ_CHECK(d.out_slot >= -1 && d.out_slot < static_cast<int>(LS_OUT_SLOTS));
    FUZZ_CHECK((d.flags & ~ShimChannel::kOutputFlags) == 0);
    FUZZ_CHECK(d.conn == r.conn && d.offset == r.offset && d.digest == r.digest);
  }
}

}  // namespace
}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lockstep::fuzz::Cursor c(data, size);
  uint8_t mode = c.u8();
  if (mode & 1)
    lockstep::OutputRecords(c);
  else
    lockstep::Submissions(c, mode);
  return 0;
}
