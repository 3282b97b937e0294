// region.h — layout of a log region, the memory a backup opens for one
// leader's stream and the leader fills with one-sided puts.
//
//   [0, kControlBytes)            control word: ballot, stream, commit, heartbeat
//   [kControlBytes, + ring_bytes) ring of records (log_format.h), stream
//                                 positions grow forever; offset = pos % ring
//
// A record never straddles the ring's end: the writer puts a kWrap record
// (or, when even that does not fit, nothing) and continues at the next lap.
// The writer never overwrites bytes the reader has not consumed: it knows
// the reader's position from the backup's ack word.
//
// The leader's ack array is a separate region: one AckWord slot per replica.
// Control and ack words are small structs with a check field, so a torn read
// is detected and simply retried.
#pragma once

#include <cstdint>
#include <string>

#include "consensus/log_format.h"

namespace lockstep {

inline constexpr size_t kControlBytes = 64;
inline constexpr size_t kAckSlotBytes = 64;

struct ControlWord {
  Ballot ballot = 0;
  uint64_t stream_id = 0;
  uint64_t commit_index = 0;
  uint64_t heartbeat = 0;  // bumped by the leader every heartbeat period
  uint64_t sent_pos = 0;   // stream position the leader has written up to
  uint64_t check = 0;
};
static_assert(sizeof(ControlWord) <= kControlBytes);

struct AckWord {
  Ballot ballot = 0;
  uint64_t stream_id = 0;
  uint64_t durable_index = 0;   // all slots up to here are durable and from this stream
  uint64_t consumed_pos = 0;    // reader position in the stream: ring space below is free
  uint64_t heartbeat_echo = 0;  // last control heartbeat seen: the leader's liveness check
  uint64_t check = 0;
};
static_assert(sizeof(AckWord) <= kAckSlotBytes);

uint64_t ControlCheck(const ControlWord& w);
uint64_t AckCheck(const AckWord& w);
// Reads a word from memory another process may be writing; false if torn or empty.
bool ReadControl(const volatile uint8_t* at, ControlWord* out);
bool ReadAck(const volatile uint8_t* at, AckWord* out);
void SealControl(ControlWord* w);
void SealAck(AckWord* w);

// Where the writer puts a record of `size` bytes when its stream is at pos.
struct Placement {
  uint64_t record_pos;  // stream position of the record itself
  uint64_t next_pos;    // stream position after it
  bool wrap_record;     // a kWrap record goes at the old pos first
  uint64_t wrap_pos;
};
Placement PlaceRecord(uint64_t pos, size_t size, uint64_t ring_bytes);
// Bytes of the ring the writer may still fill, given the reader's position.
inline uint64_t RingFree(uint64_t sent_pos, uint64_t consumed_pos, uint64_t ring_bytes) {
  return ring_bytes - (sent_pos - consumed_pos);
}
// Largest payload a region of this ring size accepts (a record must fit in
// half the ring so a wrap never deadlocks the stream).
inline uint64_t MaxRegionPayload(uint64_t ring_bytes) {
  return ring_bytes / 2 - kHeaderSize - kCanarySize - 8;
}

// Backup side: walks the ring, returning each complete record in order.
// Records are copied out of the ring before they are checked: a writer we no
// longer listen to (a deposed leader; over UCX's tcp transport puts are not
// checked against any key at the target) may scribble on the ring at any
// time, and what was checked must be what is used. Only records sealed with
// the reader's stream count (log_format.h): the memory is reused, and a
// late put for the stream that had it before may land in it at any time.
class RingReader {
 public:
  RingReader(const uint8_t* ring, uint64_t ring_bytes, uint64_t stream)
      : ring_(ring), ring_bytes_(ring_bytes), stream_(stream) {}
  // True if a valid slot record is at the current position; fills rec (its
  // payload points into the reader's private copy, valid until the next Peek).
  bool Peek(DecodedRecord* rec);
  void Consume(const DecodedRecord& rec) { pos_ += rec.size; }
  uint64_t pos() const { return pos_; }

 private:
  const uint8_t* ring_;
  uint64_t ring_bytes_;
  uint64_t stream_;
  uint64_t pos_ = 0;
  std::string copy_;
};

}  // namespace lockstep
