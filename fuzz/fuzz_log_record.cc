// fuzz_log_record.cc — libFuzzer target for consensus/log_format.h and
// consensus/region.h: DecodeRecord on bytes read back from a disk log
// segment, a walk over a segment's records as recovery does it, and the
// backup's RingReader over a log region a (deposed) leader may scribble on,
// with the control and ack words, a kConfig entry's payload
// (consensus/membership.h DecodeConfigEntry) and a configuration on its own
// (DecodeMembership: a truncation's note, a restore point's). In the "sealed" modes the target
// writes a right magic, position, canary and checksum into the fuzzer's bytes first, so that the
// fuzzer explores what lies past them; such a record must decode.
#include <cstring>
#include <vector>

#include "consensus/log_format.h"
#include "consensus/membership.h"
#include "consensus/region.h"
#include "fuzz/fuzz_util.h"

namespace lockstep {
namespace {

// Makes buf a record that checks out at `position` and, in a log region, for
// `stream` (what the writer does: log_format.h), keeping the fuzzer's type,
// length, ballot, index and payload; 0 when the record it names does not
// fit in avail.
size_t Seal(uint8_t* buf, size_t avail, uint64_t position, uint64_t stream = 0) {
  if (avail < RecordSize(0)) return 0;
  RecordHeader h;
  memcpy(&h, buf, sizeof h);
  h.magic = kRecordMagic;
  h.position = position;
  h.payload_len %= 1u << 16;  // what the fuzzer can fill
  size_t size = RecordSize(h.payload_len);
  if (size > avail) return 0;
  h.checksum = 0;
  uint32_t crc = Crc32c(0, &h, sizeof h);
  crc = Crc32c(crc, buf + kHeaderSize, h.payload_len);
  h.checksum = stream == 0 ? crc : Crc32c(crc, &stream, sizeof stream);
  memcpy(buf, &h, sizeof h);
  uint64_t canary = CanaryFor(h.ballot, h.index, h.position, stream);
  memcpy(buf + size - kCanarySize, &canary, sizeof canary);
  return size;
}

// What DecodeRecord promises about a record it accepted, and that the
// writer's encoding of the same fields reads back the same.
void CheckDecoded(const uint8_t* buf, size_t avail, uint64_t position, const DecodedRecord& r) {
  FUZZ_CHECK(r.size == RecordSize(r.header.payload_len) && r.size <= avail);
  FUZZ_CHECK(r.header.magic == kRecordMagic && r.header.position == position);
  FUZZ_CHECK(reinterpret_cast<const uint8_t*>(r.payload.data()) == buf + kHeaderSize);
  FUZZ_CHECK(r.payload.size() == r.header.payload_len);
  std::vector<uint8_t> again(r.size);
  EncodeRecord(again.data(), static_cast<EntryType>(r.header.type), r.header.ballot, r.header.index,
               r.header.commit_index, position, r.payload);
  DecodedRecord r2;
  FUZZ_CHECK(DecodeRecord(again.data(), again.size(), position, &r2) == DecodeStatus::kOk);
  FUZZ_CHECK(r2.size == r.size && r2.payload == r.payload && r2.header.type == r.header.type &&
             r2.header.ballot == r.header.ballot && r2.header.index == r.header.index &&
             r2.header.commit_index == r.header.commit_index);
}

// A segment's records from `base` on, one after another, as far as they check out.
void Walk(uint8_t* buf, size_t size, uint64_t base, bool seal) {
  size_t off = 0;
  while (off < size) {
    if (seal && Seal(buf + off, size - off, base + off) == 0) break;
    DecodedRecord r;
    DecodeStatus st = DecodeRecord(buf + off, size - off, base + off, &r);
    FUZZ_CHECK(!seal || st == DecodeStatus::kOk);
    if (st != DecodeStatus::kOk) break;
    CheckDecoded(buf + off, size - off, base + off, r);
    FUZZ_CHECK(r.size >= RecordSize(0) && r.size % 8 == 0);
    off += r.size;
  }
}

// The backup's reader of `stream` over a ring of these bytes: it must never
// hand out a record that does not check out for its stream, nor read
// outside the ring. Sealed for another stream, not one record is read.
void Ring(uint8_t* ring, size_t ring_bytes, bool seal, uint64_t stream, bool other_stream) {
  if (ring_bytes < 8) return;
  ring_bytes &= ~size_t{7};
  size_t sealed = 0;
  if (seal) {  // a writer's laps: records placed as PlaceRecord says, from position 0
    while (sealed < ring_bytes) {
      size_t n =
          Seal(ring + sealed, ring_bytes - sealed, sealed, other_stream ? stream + 1 : stream);
      if (n == 0) break;
      sealed += n;
    }
  }
  RingReader reader(ring, ring_bytes, stream);
  for (int i = 0; i < 256; i++) {
    DecodedRecord r;
    uint64_t before = reader.pos();
    if (!reader.Peek(&r)) break;
    FUZZ_CHECK(!(other_stream && before < sealed));
    FUZZ_CHECK(r.size <= ring_bytes && r.header.position >= before);
    FUZZ_CHECK(static_cast<EntryType>(r.header.type) != EntryType::kWrap);
    reader.Consume(r);
  }
}

// A kConfig payload: one the decoder accepts is a single valid change and
// encodes back to the same bytes. Sealed, the magic, version and checksum
// are put right first, so the fuzzer explores the two configurations.
void ConfigPayload(uint8_t* buf, size_t n, bool seal) {
  if (seal && n >= kConfigPayloadSize) {
    memcpy(buf, "LKM1", 4);
    buf[4] = 1;
    uint32_t crc = Crc32c(0, buf, 15);
    for (int i = 0; i < 4; i++) buf[15 + i] = static_cast<uint8_t>(crc >> (8 * i));
  }
  ConfigEntry e;
  std::string why = DecodeConfigEntry({reinterpret_cast<const char*>(buf), n}, &e);
  if (!why.empty()) return;
  FUZZ_CHECK(n == kConfigPayloadSize);
  FUZZ_CHECK(IsOneChange(e.from, e.to) && MajoritiesIntersect(e.from, e.to));
  FUZZ_CHECK(e.from.VoterCount() >= 1 && e.to.VoterCount() >= 1);
  FUZZ_CHECK(EncodeConfigEntry(e) == std::string(reinterpret_cast<const char*>(buf), n));
}

// A configuration on its own (a truncation's note, a checkpoint's restore
// point: membership.h DecodeMembership): one it accepts is valid and encodes
// back to the same bytes.
void MembershipRecord(uint8_t* buf, size_t n, bool seal) {
  if (seal && n >= kMembershipPayloadSize) {
    memcpy(buf, "LKC1", 4);
    buf[4] = 1;
    uint32_t crc = Crc32c(0, buf, 10);
    for (int i = 0; i < 4; i++) buf[10 + i] = static_cast<uint8_t>(crc >> (8 * i));
  }
  Membership m;
  std::string why = DecodeMembership({reinterpret_cast<const char*>(buf), n}, &m);
  if (!why.empty()) return;
  FUZZ_CHECK(n == kMembershipPayloadSize);
  FUZZ_CHECK(m.VoterCount() >= 1 && m.VoterCount() <= kMaxVoters && !(m.voters & m.learners));
  FUZZ_CHECK(EncodeMembership(m) == std::string(reinterpret_cast<const char*>(buf), n));
}

}  // namespace
}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  fuzz::Cursor c(data, size);
  uint8_t mode = c.u8();
  uint64_t position = c.u64();
  std::string_view rest = c.rest();
  // A copy, 8-aligned (a disk read lands in an aligned buffer), that Seal may write.
  std::vector<uint64_t> words((rest.size() + 7) / 8 + 1);
  auto* buf = reinterpret_cast<uint8_t*>(words.data());
  memcpy(buf, rest.data(), rest.size());
  size_t n = rest.size();
  switch (mode % 10) {
    case 0: {  // one record, as found
      DecodedRecord r;
      if (DecodeRecord(buf, n, position, &r) == DecodeStatus::kOk)
        CheckDecoded(buf, n, position, r);
      break;
    }
    case 1: {  // one record, sealed: it must decode
      size_t sz = Seal(buf, n, position);
      DecodedRecord r;
      DecodeStatus st = DecodeRecord(buf, n, position, &r);
      if (sz) {
        FUZZ_CHECK(st == DecodeStatus::kOk);
        CheckDecoded(buf, n, position, r);
      }
      break;
    }
    case 2: Walk(buf, n, position & ~uint64_t{7}, false); break;
    case 3: Walk(buf, n, position & ~uint64_t{7}, true); break;
    case 4: Ring(buf, n, (position & 1) != 0, position >> 2, (position & 2) != 0); break;
    case 5: {  // the control and ack words: a torn or forged one is refused
      uint8_t word[kControlBytes] = {};
      memcpy(word, buf, n < sizeof word ? n : sizeof word);
      ControlWord cw;
      if (ReadControl(word, &cw)) FUZZ_CHECK(cw.check != 0 && cw.check == ControlCheck(cw));
      AckWord aw;
      if (ReadAck(word, &aw)) FUZZ_CHECK(aw.check != 0 && aw.check == AckCheck(aw));
      break;
    }
    case 6: ConfigPayload(buf, n, false); break;
    case 7: ConfigPayload(buf, n, true); break;
    case 8: MembershipRecord(buf, n, false); break;
    case 9: MembershipRecord(buf, n, true); break;
  }
  return 0;
}
