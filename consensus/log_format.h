// log_format.h — the byte layout of one log record, shared by the durable
// log on disk and by the log regions that leaders write into with one-sided
// puts.
//
// A record is: header (kHeaderSize bytes) | payload padded to 8 | canary (8).
// The checksum (CRC32C) covers the header (checksum field zeroed) and the
// payload. The canary is a non-zero value derived from ballot, index and
// position, written last in the record: a one-sided write becomes visible in
// no guaranteed order, so a reader accepts a record only when the header is
// sane, the canary matches and the checksum holds. A stale record left from
// an earlier lap of a ring, or an earlier segment of a file, carries another
// position and so fails the check.
//
// A record put into a log region is also sealed with the stream it belongs
// to (non-zero `stream`: the region's stream id, mixed into the canary and
// the checksum); records on disk use 0, which leaves their format as it
// was. A region's memory is reused for later streams and a leader's late
// put for an older stream still lands in it, with records at the very
// positions the new stream uses (same ballot, same sizes): without the seal
// the reader took them for its own, ran past what the leader had sent it and
// waited for good (core_test LateWritesIntoARecycledRegionDoNotStrandTheBackup).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep {

// A ballot is (round, leader id), totally ordered; packed so that integer
// order is ballot order. Ballot 0 means "none".
using Ballot = uint64_t;
inline constexpr int kMaxReplicas = 7;
inline constexpr Ballot MakeBallot(uint64_t round, int leader_id) {
  return (round << 8) | static_cast<uint64_t>(leader_id & 0xff);
}
inline constexpr uint64_t BallotRound(Ballot b) {
  return b >> 8;
}
inline constexpr int BallotLeader(Ballot b) {
  return static_cast<int>(b & 0xff);
}
std::string BallotString(Ballot b);  // "round.leader"

enum class EntryType : uint8_t {
  kInput = 1,        // an input for the replicated server
  kNoop = 2,         // fills a slot (leader change)
  kOutputCheck = 3,  // output digests compared across replicas
  kConfig = 4,       // membership (reserved)
  // Record types that never hold a log slot:
  kPromise = 16,  // disk only: the replica promised `ballot`
  kPad = 17,      // disk only: padding to a sector boundary
  kWrap = 18,     // region only: the stream continues at the ring's start
  kTruncate = 19  // disk only: slots below `index` were dropped
};
bool IsSlotType(EntryType t);
const char* EntryTypeName(EntryType t);

// One log slot as the protocol sees it.
struct Entry {
  uint64_t index = 0;
  Ballot ballot = 0;  // ballot under which this replica accepted the slot
  EntryType type = EntryType::kNoop;
  std::string payload;
  bool operator==(const Entry&) const = default;
};

inline constexpr uint32_t kRecordMagic = 0x4c4b5331;  // "LKS1"
inline constexpr size_t kHeaderSize = 48;
inline constexpr size_t kCanarySize = 8;
// Largest payload any record may carry; the region and disk limits are
// usually tighter and are checked where proposals enter.
inline constexpr uint32_t kMaxPayload = 1u << 30;

#pragma pack(push, 1)
struct RecordHeader {
  uint32_t magic;
  uint8_t type;
  uint8_t reserved[3];
  uint32_t payload_len;
  uint32_t checksum;
  uint64_t ballot;
  uint64_t index;
  uint64_t commit_index;  // writer's commit index when it wrote the record
  uint64_t position;      // byte position of the record in its stream/file
};
#pragma pack(pop)
static_assert(sizeof(RecordHeader) == kHeaderSize);

inline constexpr size_t Align8(size_t n) {
  return (n + 7) & ~size_t{7};
}
inline constexpr size_t RecordSize(size_t payload_len) {
  return kHeaderSize + Align8(payload_len) + kCanarySize;
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t len);
uint64_t CanaryFor(Ballot ballot, uint64_t index, uint64_t position, uint64_t stream = 0);

// Encodes a record into out (which must hold RecordSize(payload.size())),
// sealed with `stream` (0 on disk, the stream id in a log region).
void EncodeRecord(uint8_t* out, EntryType type, Ballot ballot, uint64_t index,
                  uint64_t commit_index, uint64_t position, std::string_view payload,
                  uint64_t stream = 0);

// What a reader found at a position.
enum class DecodeStatus {
  kOk,
  kIncomplete,  // not (yet) a valid record here: header, canary or checksum off
  kTooLarge,    // header claims more bytes than available: caller decides
};
struct DecodedRecord {
  RecordHeader header;
  std::string_view payload;  // points into the caller's buffer
  size_t size = 0;           // bytes the record occupies
};
// Checks the record at buf (avail bytes readable) claimed to sit at
// `position` and sealed with `stream`. Never reads past avail.
DecodeStatus DecodeRecord(const uint8_t* buf, size_t avail, uint64_t position, DecodedRecord* out,
                          uint64_t stream = 0);

}  // namespace lockstep
