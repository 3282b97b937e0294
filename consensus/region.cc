// region.cc — control/ack words and ring placement shared by the leader's
// writer (in the protocol core) and the backup's reader (in the daemon and
// the simulator).
#include "consensus/region.h"

#include <atomic>
#include <cstring>

namespace lockstep {

static uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

uint64_t ControlCheck(const ControlWord& w) {
  uint64_t h = 0xc0;
  for (uint64_t v : {w.ballot, w.stream_id, w.commit_index, w.heartbeat, w.sent_pos}) h = Mix(h, v);
  return h | 1;
}

uint64_t AckCheck(const AckWord& w) {
  uint64_t h = 0xac;
  for (uint64_t v : {w.ballot, w.stream_id, w.durable_index, w.consumed_pos, w.heartbeat_echo})
    h = Mix(h, v);
  return h | 1;
}

void SealControl(ControlWord* w) {
  w->check = ControlCheck(*w);
}
void SealAck(AckWord* w) {
  w->check = AckCheck(*w);
}

bool ReadControl(const volatile uint8_t* at, ControlWord* out) {
  std::atomic_thread_fence(std::memory_order_acquire);
  memcpy(out, const_cast<const uint8_t*>(at), sizeof *out);
  return out->check != 0 && out->check == ControlCheck(*out);
}

bool ReadAck(const volatile uint8_t* at, AckWord* out) {
  std::atomic_thread_fence(std::memory_order_acquire);
  memcpy(out, const_cast<const uint8_t*>(at), sizeof *out);
  return out->check != 0 && out->check == AckCheck(*out);
}

Placement PlaceRecord(uint64_t pos, size_t size, uint64_t ring_bytes) {
  Placement p{pos, pos + size, false, 0};
  uint64_t off = pos % ring_bytes;
  if (off + size <= ring_bytes) return p;
  uint64_t lap_end = pos + (ring_bytes - off);
  p.wrap_record = ring_bytes - off >= RecordSize(0);
  p.wrap_pos = pos;
  p.record_pos = lap_end;
  p.next_pos = lap_end + size;
  return p;
}

bool RingReader::Peek(DecodedRecord* rec) {
  std::atomic_thread_fence(std::memory_order_acquire);
  for (int hops = 0; hops < 2; hops++) {
    uint64_t off = pos_ % ring_bytes_;
    uint64_t left = ring_bytes_ - off;
    if (left < RecordSize(0)) {  // implicit wrap: nothing fits here
      pos_ += left;
      continue;
    }
    // Copy header, then the whole record, then check the copy.
    RecordHeader h;
    memcpy(&h, ring_ + off, sizeof h);
    if (h.magic != kRecordMagic || h.position != pos_ || h.payload_len > kMaxPayload) return false;
    size_t size = RecordSize(h.payload_len);
    if (size > left) return false;
    copy_.resize(size);
    memcpy(copy_.data(), ring_ + off, size);
    if (DecodeRecord(reinterpret_cast<const uint8_t*>(copy_.data()), size, pos_, rec, stream_) !=
        DecodeStatus::kOk)
      return false;
    if (static_cast<EntryType>(rec->header.type) == EntryType::kWrap) {
      pos_ += left;
      continue;
    }
    return true;
  }
  return false;
}

}  // namespace lockstep
