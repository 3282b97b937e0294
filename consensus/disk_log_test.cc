// disk_log_test.cc — the durable log on real files in a temp dir under /tmp,
// with real syncs: round trips, torn tails, damage, a full disk (a 1 MiB
// tmpfs), group commit, and the durable-write floor of this machine.
#include "consensus/disk_log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace lockstep {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/disk_log_test-XXXXXX";
    char* p = mkdtemp(tmpl);
    if (p) path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string Payload(uint64_t index, size_t len) {
  std::string s = "slot-" + std::to_string(index) + ":";
  while (s.size() < len) s += static_cast<char>('a' + (s.size() * 7 + index) % 26);
  s.resize(len);
  return s;
}

LogRecord Slot(uint64_t index, Ballot ballot, const std::string& payload, uint64_t commit = 0) {
  return LogRecord{EntryType::kInput, ballot, index, commit, payload};
}

LogRecord Promise(Ballot b) {
  return LogRecord{EntryType::kPromise, b, 0, 0, {}};
}

std::unique_ptr<DiskLog> MustOpen(const DiskLogOptions& o, RecoveredLog* r) {
  std::string err;
  auto log = DiskLog::Open(o, r, &err);
  EXPECT_TRUE(log) << err;
  return log;
}

// Appends one record per batch for slots [from, to] with payloads of `len`.
void AppendSlots(DiskLog* log, uint64_t from, uint64_t to, size_t len, Ballot b = MakeBallot(1, 0),
                 size_t per_batch = 1) {
  std::vector<std::string> payloads;
  std::vector<LogRecord> batch;
  for (uint64_t i = from; i <= to;) {
    payloads.clear();
    batch.clear();
    for (size_t k = 0; k < per_batch && i <= to; k++, i++) payloads.push_back(Payload(i, len));
    uint64_t first = i - payloads.size();
    for (size_t k = 0; k < payloads.size(); k++)
      batch.push_back(Slot(first + k, b, payloads[k], first + k - 1));
    std::string err;
    ASSERT_TRUE(log->Append(batch, &err)) << err;
  }
}

void ExpectSlots(const RecoveredLog& r, uint64_t from, uint64_t to, size_t len) {
  ASSERT_EQ(r.slots.size(), to >= from ? to - from + 1 : 0);
  for (uint64_t i = from; i <= to; i++) {
    const Entry& e = r.slots[i - from];
    ASSERT_EQ(e.index, i);
    ASSERT_EQ(e.payload, Payload(i, len)) << "slot " << i;
  }
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::vector<uint8_t> out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  uint8_t b[65536];
  size_t n;
  while ((n = std::fread(b, 1, sizeof b, f)) > 0) out.insert(out.end(), b, b + n);
  std::fclose(f);
  return out;
}

void WriteAt(const std::string& path, uint64_t off, const void* data, size_t len) {
  int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(pwrite(fd, data, len, static_cast<off_t>(off)), static_cast<ssize_t>(len));
  fsync(fd);
  close(fd);
}

std::vector<std::string> SegmentFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind("seg-", 0) == 0) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------------------

// Opens the log again and expects it clean (nothing torn or damaged) with
// slots from..to of `len` bytes (Payload).
void ExpectRecoversClean(const DiskLogOptions& o, uint64_t from, uint64_t to, size_t len) {
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
  ExpectSlots(r, from, to, len);
}

class DiskLogModes : public ::testing::TestWithParam<SyncMode> {};

TEST_P(DiskLogModes, RoundTripWithPromisesOverwritesAndTruncation) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.sub("log");
  o.segment_bytes = 64 << 10;
  o.mode = GetParam();
  const Ballot b1 = MakeBallot(1, 0), b2 = MakeBallot(2, 1);
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_EQ(r.slots.size(), 0u);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    std::string err;
    std::string p1 = Payload(1, 100), p2 = Payload(2, 100), p3 = Payload(3, 100);
    ASSERT_TRUE(log->Append(
        {Promise(b1), Slot(1, b1, p1, 0), Slot(2, b1, p2, 0), Slot(3, b1, p3, 1)}, &err))
        << err;
    // Index 2 again under a higher ballot: the later record wins.
    std::string p2b = "two, accepted again under ballot 2.1";
    ASSERT_TRUE(log->Append({Promise(b2), Slot(2, b2, p2b, 1)}, &err)) << err;
    // Enough 1 KiB slots for several 64 KiB segments.
    AppendSlots(log.get(), 4, 200, 1000, b2, 10);
    EXPECT_GE(log->SegmentPaths().size(), 3u);
    // The log stays contiguous: no gap, nothing below the first index.
    std::string p = "x";
    EXPECT_FALSE(log->Append({Slot(202, b2, p)}, &err));
    EXPECT_NE(err.find("out of range"), std::string::npos) << err;
    EXPECT_FALSE(log->Append({Slot(0, b2, p)}, &err));
    EXPECT_FALSE(log->Append({LogRecord{EntryType::kPad, 0, 0, 0, p}}, &err));
  }
  size_t segments_before;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    EXPECT_EQ(r.promised, b2);
    EXPECT_EQ(r.commit_index, 199u);
    EXPECT_EQ(r.truncated_below, 0u);
    ASSERT_EQ(r.slots.size(), 200u);
    EXPECT_EQ(r.slots[0].payload, Payload(1, 100));
    EXPECT_EQ(r.slots[0].ballot, b1);
    EXPECT_EQ(r.slots[1].payload, "two, accepted again under ballot 2.1");
    EXPECT_EQ(r.slots[1].ballot, b2);
    EXPECT_EQ(r.slots[2].payload, Payload(3, 100));
    for (uint64_t i = 4; i <= 200; i++) ASSERT_EQ(r.slots[i - 1].payload, Payload(i, 1000));
    EXPECT_GT(r.records, 200u);
    EXPECT_EQ(r.bytes % 8, 0u);

    segments_before = SegmentFiles(o.dir).size();
    std::string err;
    // The note (the daemon: the configuration the dropped slots made) rides
    // in the kTruncate record and comes back with the last one.
    ASSERT_TRUE(log->TruncateBelow(150, &err, "configuration at 149")) << err;
    // Whole segments holding only slots below 150 are gone, including the
    // one with the promise records: the truncate restated the promise.
    EXPECT_LT(SegmentFiles(o.dir).size(), segments_before);
    EXPECT_EQ(SegmentFiles(o.dir).size(), log->SegmentPaths().size());
    std::string p = "y";
    EXPECT_FALSE(log->Append({Slot(149, b2, p)}, &err));
    AppendSlots(log.get(), 201, 201, 1000, b2);
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    EXPECT_EQ(r.promised, b2);
    EXPECT_EQ(r.truncated_below, 150u);
    EXPECT_EQ(r.truncate_note, "configuration at 149");
    EXPECT_EQ(r.commit_index, 200u);
    ExpectSlots(r, 150, 201, 1000);
    // Truncating past the end: the next slot is the truncation point.
    std::string err;
    ASSERT_TRUE(log->TruncateBelow(300, &err)) << err;
    std::string p = "z";
    EXPECT_FALSE(log->Append({Slot(202, b2, p)}, &err));
    AppendSlots(log.get(), 300, 302, 1000, b2);
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    EXPECT_EQ(r.truncated_below, 300u);
    EXPECT_EQ(r.truncate_note, "");  // the last truncation had none
    EXPECT_EQ(r.promised, b2);
    ExpectSlots(r, 300, 302, 1000);
  }
}

INSTANTIATE_TEST_SUITE_P(BothModes, DiskLogModes,
                         ::testing::Values(SyncMode::kDirectDsync, SyncMode::kWriteFdatasync),
                         [](const ::testing::TestParamInfo<SyncMode>& i) {
                           return i.param == SyncMode::kDirectDsync ? "DirectDsync"
                                                                    : "WriteFdatasync";
                         });

TEST(DiskLog, BatchesEndOnSectorBoundariesAndNeverRewriteDurableBytes) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 1 << 20;
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  EXPECT_GE(log->sector_bytes(), 512u);
  std::vector<uint8_t> before;
  for (uint64_t i = 1; i <= 20; i++) {
    AppendSlots(log.get(), i, i, 10 + 300 * (i % 7));
    EXPECT_EQ(log->end_position() % log->sector_bytes(), 0u) << "after slot " << i;
    std::vector<uint8_t> now = ReadFile(log->SegmentPaths().back());
    ASSERT_GE(now.size(), before.size());
    EXPECT_TRUE(std::equal(before.begin(), before.end(), now.begin()))
        << "bytes of an earlier batch changed after appending slot " << i;
    now.resize(log->end_position());
    before = now;
  }
}

TEST(DiskLog, SecondOpenOfTheSameDirectoryIsRefused) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  std::string err;
  EXPECT_FALSE(DiskLog::Open(o, &r, &err));
  EXPECT_NE(err.find("in use"), std::string::npos) << err;
}

// Slots from..to must be present with the payload Payload(i, len_of(i)).
template <typename F>
void ExpectSlotsBy(const RecoveredLog& r, uint64_t from, uint64_t to, F len_of) {
  ASSERT_EQ(r.slots.size(), to - from + 1);
  for (uint64_t i = from; i <= to; i++) {
    ASSERT_EQ(r.slots[i - from].index, i);
    ASSERT_EQ(r.slots[i - from].payload, Payload(i, len_of(i))) << "slot " << i;
  }
}

// The last write was cut short: the file ends in the middle of a record.
TEST(DiskLog, TornTailFromTruncatedFileIsDroppedAndReported) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 1 << 20;
  std::string seg;
  uint64_t batch_start;
  auto len = [](uint64_t i) -> size_t { return i <= 3 ? 100 : 2000; };
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    AppendSlots(log.get(), 1, 3, 100);
    batch_start = log->end_position();
    AppendSlots(log.get(), 4, 6, 2000, MakeBallot(1, 0), 3);  // one write of ~6 KiB
    seg = log->SegmentPaths().back();
  }
  // Keep slot 4 whole and cut slot 5 in half.
  const uint64_t bad = batch_start + RecordSize(2000);
  ASSERT_EQ(truncate(seg.c_str(), static_cast<off_t>(bad + 1000)), 0);
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_TRUE(r.torn_tail);
    EXPECT_FALSE(r.damaged);
    EXPECT_NE(r.problem.find(seg), std::string::npos) << r.problem;
    EXPECT_NE(r.problem.find("offset " + std::to_string(bad)), std::string::npos) << r.problem;
    ExpectSlotsBy(r, 1, 4, len);
    // Appending goes on from slot 5.
    AppendSlots(log.get(), 5, 7, 2000);
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    ExpectSlotsBy(r, 1, 7, len);
  }
}

// The last record and the rest of its write hold garbage (the write never
// completed); the next batch is shorter than the torn one.
TEST(DiskLog, TornTailFromScribbledLastRecordIsDroppedAndNeverServed) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 1 << 20;
  std::string seg;
  uint64_t last_start, write_end;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    AppendSlots(log.get(), 1, 3, 100);
    last_start = log->end_position();
    AppendSlots(log.get(), 4, 4, 5000);
    write_end = log->end_position();
    seg = log->SegmentPaths().back();
  }
  std::mt19937_64 rng(7);
  std::vector<uint8_t> junk(write_end - last_start - 200);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  WriteAt(seg, last_start + 100, junk.data(), junk.size());
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_TRUE(r.torn_tail) << r.problem;
    EXPECT_FALSE(r.damaged) << r.problem;
    EXPECT_NE(r.problem.find(seg + " at offset " + std::to_string(last_start)), std::string::npos)
        << r.problem;
    ExpectSlots(r, 1, 3, 100);
    std::string err, p = "four, written again";
    ASSERT_TRUE(log->Append({Slot(4, MakeBallot(1, 0), p)}, &err)) << err;
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    ASSERT_EQ(r.slots.size(), 4u);
    EXPECT_EQ(r.slots[3].payload, "four, written again");
  }
}

// A flipped byte in an early record, valid records after it: damage. Once
// dropped, those later records must never come back, even when the next
// append is shorter than what was dropped.
TEST(DiskLog, CorruptionInTheMiddleIsReportedAsDamageWithFileAndOffset) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 1 << 20;
  std::string seg;
  uint64_t slot2_at;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    std::string err;
    ASSERT_TRUE(log->Append({Promise(MakeBallot(1, 0))}, &err)) << err;
    AppendSlots(log.get(), 1, 1, 300);
    slot2_at = log->end_position();
    AppendSlots(log.get(), 2, 40, 300, MakeBallot(1, 0), 3);
    seg = log->SegmentPaths().back();
  }
  uint8_t b = 0;
  {
    std::vector<uint8_t> all = ReadFile(seg);
    b = all[slot2_at + kHeaderSize + 17] ^ 0x20;
  }
  WriteAt(seg, slot2_at + kHeaderSize + 17, &b, 1);
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_TRUE(r.damaged);
    EXPECT_FALSE(r.torn_tail);
    EXPECT_NE(r.problem.find(seg + " at offset " + std::to_string(slot2_at)), std::string::npos)
        << r.problem;
    EXPECT_NE(r.problem.find("checksum"), std::string::npos) << r.problem;
    EXPECT_EQ(r.promised, MakeBallot(1, 0));
    ExpectSlots(r, 1, 1, 300);
    AppendSlots(log.get(), 2, 2, 300);
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    ExpectSlots(r, 1, 2, 300);
  }
}

// Slots 1..60 of 1500 bytes, two a batch, over segments of 32 KiB (at
// least 3); then a byte of slot 2's canary (the last record of the first
// segment's first batch) flipped. Returns the segment files, oldest first.
// holder_check runs while the writer still holds the log.
std::vector<std::string> ThreeSegmentsDamagedAtSlot2(
    const DiskLogOptions& o, const std::function<void()>& holder_check = [] {}) {
  std::vector<std::string> segs;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    EXPECT_TRUE(log);
    if (!log) return segs;
    AppendSlots(log.get(), 1, 60, 1500, MakeBallot(1, 0), 2);
    segs = log->SegmentPaths();
    holder_check();
  }
  EXPECT_GE(segs.size(), 3u);
  std::vector<uint8_t> first = ReadFile(segs[0]);
  uint64_t off = 72 + 2 * RecordSize(1500) - 3;  // header, slots 1 and 2
  uint8_t b = first[off] ^ 1;
  WriteAt(segs[0], off, &b, 1);
  return segs;
}

TEST(DiskLog, DamageInAnEarlySegmentSetsLaterSegmentsAside) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 32 << 10;
  std::vector<std::string> segs = ThreeSegmentsDamagedAtSlot2(o);
  ASSERT_GE(segs.size(), 3u);
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_TRUE(r.damaged);
    EXPECT_NE(r.problem.find(segs[0] + " at offset " + std::to_string(72 + RecordSize(1500))),
              std::string::npos)
        << r.problem;
    ExpectSlots(r, 1, 1, 1500);
    for (size_t i = 1; i < segs.size(); i++) {
      EXPECT_FALSE(fs::exists(segs[i])) << segs[i];
      EXPECT_TRUE(fs::exists(segs[i] + ".damaged")) << segs[i];
    }
    AppendSlots(log.get(), 2, 30, 1500);
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    ExpectSlots(r, 1, 30, 1500);
  }
}

// What `cluster up` does to tell a user what a directory holds: a damaged
// log read read-only is recovered as a replica would (same slots, same
// problem) and left exactly as it was; while a replica holds the log, the
// look is refused.
TEST(DiskLog, ReadOnlyOpenRecoversLikeAReplicaAndChangesNothing) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 32 << 10;
  DiskLogOptions ro = o;
  ro.read_only = true;
  std::vector<std::string> segs = ThreeSegmentsDamagedAtSlot2(o, [&] {
    std::string err;
    EXPECT_FALSE(DiskLog::Open(ro, nullptr, &err)) << "opened while a writer holds the log";
    EXPECT_NE(err.find("in use"), std::string::npos) << err;
  });
  ASSERT_GE(segs.size(), 3u);
  std::vector<std::pair<std::string, std::vector<uint8_t>>> before;
  for (const auto& e : fs::directory_iterator(dir.path()))
    before.emplace_back(e.path().string(), ReadFile(e.path().string()));
  std::sort(before.begin(), before.end());

  RecoveredLog r;
  auto log = MustOpen(ro, &r);
  ASSERT_TRUE(log);
  EXPECT_TRUE(r.damaged);
  ExpectSlots(r, 1, 1, 1500);
  std::string err;
  EXPECT_FALSE(log->Append({Slot(2, MakeBallot(1, 0), "x")}, &err));
  EXPECT_NE(err.find("read-only"), std::string::npos) << err;
  EXPECT_FALSE(log->TruncateBelow(2, &err));
  log.reset();

  std::vector<std::pair<std::string, std::vector<uint8_t>>> after;
  for (const auto& e : fs::directory_iterator(dir.path()))
    after.emplace_back(e.path().string(), ReadFile(e.path().string()));
  std::sort(after.begin(), after.end());
  EXPECT_TRUE(before == after) << "a read-only open changed the log's files";

  // A replica opening it afterwards sees the same damage (nothing was repaired).
  RecoveredLog again;
  auto writer = MustOpen(o, &again);
  ASSERT_TRUE(writer);
  EXPECT_TRUE(again.damaged);
  EXPECT_EQ(again.problem, r.problem);
}

TEST(DiskLog, DamagedSegmentHeaderIsReportedAtThatSegment) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 32 << 10;
  std::vector<std::string> segs;
  uint64_t in_first = 0;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    for (uint64_t i = 1; i <= 40; i++) {
      AppendSlots(log.get(), i, i, 1500);
      if (log->SegmentPaths().size() == 1) in_first = i;
    }
    segs = log->SegmentPaths();
  }
  ASSERT_GE(segs.size(), 3u);
  uint8_t b = 0xee;
  WriteAt(segs[1], 5, &b, 1);  // inside the magic of the second segment's header
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  EXPECT_TRUE(r.damaged);
  EXPECT_NE(r.problem.find(segs[1] + " at offset 0"), std::string::npos) << r.problem;
  ExpectSlots(r, 1, in_first, 1500);
  AppendSlots(log.get(), in_first + 1, in_first + 1, 1500);
}

// A segment's records past the point the next segment's header names are
// not part of the log (they come from a write that failed before a roll).
TEST(DiskLog, RecordsPastTheRollPointAreIgnored) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 20 << 10;
  o.sector_bytes = 4096;
  std::vector<std::string> segs;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    AppendSlots(log.get(), 1, 3, 5000);  // 8 KiB per batch: the third rolls
    segs = log->SegmentPaths();
  }
  ASSERT_EQ(segs.size(), 2u);
  std::vector<uint8_t> second = ReadFile(segs[1]);
  RecordHeader h;
  std::memcpy(&h, second.data(), sizeof h);
  uint64_t x = h.index;  // where the first segment ended
  ASSERT_EQ(x, 16384u);
  std::string ghost = "ghost";
  std::vector<uint8_t> rec(RecordSize(ghost.size()));
  EncodeRecord(rec.data(), EntryType::kInput, MakeBallot(9, 9), 1, 0, x, ghost);
  WriteAt(segs[0], x, rec.data(), rec.size());
  ExpectRecoversClean(o, 1, 3, 5000);
}

// A crash right after a new segment was named, before its first write: the
// empty segment is removed, a stale prepared file too, and the log goes on.
TEST(DiskLog, EmptyTrailingSegmentAndLeftoverPreparedFileAreCleanedUp) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 64 << 10;
  uint64_t next_base;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    AppendSlots(log.get(), 1, 5, 1000);
    next_base = 64 << 10;
  }
  char name[64];
  std::snprintf(name, sizeof name, "/seg-%016" PRIx64, next_base);
  std::string empty = dir.path() + name;
  std::string prep = dir.path() + "/prep-00000000000f0000";
  for (const std::string& p : {empty, prep}) {
    int fd = open(p.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 64 << 10), 0);
    close(fd);
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    ExpectSlots(r, 1, 5, 1000);
    EXPECT_FALSE(fs::exists(empty));
    EXPECT_FALSE(fs::exists(prep));
    AppendSlots(log.get(), 6, 200, 1000, MakeBallot(1, 0), 5);  // rolls over several segments
  }
  ExpectRecoversClean(o, 1, 200, 1000);
}

// A first segment that never got its first write (all zeros): an empty log.
TEST(DiskLog, AllZeroFirstSegmentIsAnEmptyLog) {
  TempDir dir;
  std::string seg = dir.path() + "/seg-0000000000000000";
  int fd = open(seg.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64 << 10), 0);
  close(fd);
  DiskLogOptions o;
  o.dir = dir.path();
  o.segment_bytes = 64 << 10;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    EXPECT_TRUE(r.slots.empty());
    AppendSlots(log.get(), 1, 3, 10);
  }
  ExpectRecoversClean(o, 1, 3, 10);
}

// ---------------------------------------------------------------------------
// A full disk: a 1 MiB tmpfs.

class TmpfsMount {
 public:
  explicit TmpfsMount(const std::string& options) {
    char tmpl[] = "/tmp/disk_log_full-XXXXXX";
    char* p = mkdtemp(tmpl);
    if (!p) return;
    path_ = p;
    if (mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~TmpfsMount() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
    if (!path_.empty()) rmdir(path_.c_str());
  }
  bool mounted() const { return mounted_; }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_, error_;
  bool mounted_ = false;
};

TEST(DiskLog, FullDiskFailsClearlyKeepsTheLogAndRetriesFromTheSamePoint) {
  TmpfsMount mnt("size=1m");
  if (!mnt.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << mnt.error();
  // Space held by something else, released later.
  const std::string filler = mnt.path() + "/filler";
  {
    std::vector<char> junk(192 << 10, 'f');
    FILE* f = std::fopen(filler.c_str(), "wb");
    ASSERT_TRUE(f);
    ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
    std::fclose(f);
  }
  DiskLogOptions o;
  o.dir = mnt.path() + "/log";
  o.segment_bytes = 128 << 10;
  uint64_t appended = 0;
  std::string err;
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    std::printf("tmpfs: mode %s, sector %zu\n", SyncModeName(log->mode()), log->sector_bytes());
    for (uint64_t i = 1; i <= 1000; i++) {
      std::string p = Payload(i, 4000);
      if (!log->Append({Slot(i, MakeBallot(1, 0), p)}, &err)) break;
      appended = i;
    }
    ASSERT_GT(appended, 10u);
    ASSERT_LT(appended, 1000u);
    std::printf("disk full after %" PRIu64 " appends: %s\n", appended, err.c_str());
    EXPECT_EQ(err.rfind("disk full: cannot append ", 0), 0u) << err;
    EXPECT_NE(err.find(o.dir + "/seg-"), std::string::npos) << err;
    EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
    // Still full: the same answer, nothing written.
    std::string again, p = Payload(appended + 1, 4000);
    EXPECT_FALSE(log->Append({Slot(appended + 1, MakeBallot(1, 0), p)}, &again));
    EXPECT_EQ(again.rfind("disk full", 0), 0u) << again;
  }
  {
    // Everything appended before the disk filled is there, nothing else.
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    ExpectSlots(r, 1, appended, 4000);
    std::string p = Payload(appended + 1, 4000);
    EXPECT_FALSE(log->Append({Slot(appended + 1, MakeBallot(1, 0), p)}, &err));
    // Space comes back: the same append now succeeds, right after the rest.
    ASSERT_EQ(unlink(filler.c_str()), 0);
    ASSERT_TRUE(log->Append({Slot(appended + 1, MakeBallot(1, 0), p)}, &err)) << err;
  }
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
    ExpectSlots(r, 1, appended + 1, 4000);
  }
}

// ---------------------------------------------------------------------------
// DiskWriter, both ways of writing: through io_uring from the polling
// thread (the default) and through the disk thread alone.

class DiskWriterPaths : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(RingAndThread, DiskWriterPaths, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Ring" : "Thread";
                         });

DiskWriter::Completion WaitFor(DiskWriter* w, uint64_t seq, std::vector<uint64_t>* seen,
                               bool until_error = false) {
  // The event fd is never drained (the daemon waits on it edge-triggered):
  // poll the state, up to 20 s.
  DiskWriter::Completion c;
  for (int waits = 0; waits < 20000; waits++) {
    if (waits) usleep(1000);
    c = w->Poll();
    if (seen) seen->push_back(c.durable_seq);
    if (c.durable_seq >= seq && !until_error) break;
    if (until_error && !c.error.empty()) break;
  }
  return c;
}

// Submits batches first..last, batch seq holding entry seq - 1 (64 bytes).
void SubmitEntries(DiskWriter* w, uint64_t first, uint64_t last) {
  for (uint64_t seq = first; seq <= last; seq++) {
    std::vector<OwnedRecord> batch;
    batch.push_back(
        OwnedRecord{EntryType::kInput, MakeBallot(1, 0), seq - 1, 0, Payload(seq - 1, 64)});
    w->Submit(seq, std::move(batch));
  }
}

TEST_P(DiskWriterPaths, MergesQueuedBatchesIntoFewWrites) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    DiskWriter w(log.get(), nullptr, GetParam());
    ASSERT_EQ(w.ring(), GetParam()) << w.ring_problem();
    // Warm up: the first write waits for the first segment to be prepared.
    {
      std::vector<OwnedRecord> batch;
      batch.push_back(OwnedRecord{EntryType::kPromise, MakeBallot(1, 0), 0, 0, {}});
      w.Submit(1, std::move(batch));
    }
    DiskWriter::Completion warm = WaitFor(&w, 1, nullptr);
    ASSERT_EQ(warm.durable_seq, 1u);
    // Each Append now takes 100 ms (the slow-disk failpoint): the batches
    // submitted below queue while the thread writes, whatever the scheduler
    // does with this thread meanwhile (a loop of 100 Submits would have to
    // stall for 100 ms nine times to spread over ten writes).
    log->SetAppendDelayUs(100000);
    SubmitEntries(&w, 2, 101);
    std::vector<uint64_t> seen;
    DiskWriter::Completion c = WaitFor(&w, 101, &seen);
    EXPECT_EQ(c.durable_seq, 101u);
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(c.records - warm.records, 100u);
    const uint64_t writes = c.writes - warm.writes;
    std::printf("100 submitted batches took %" PRIu64 " writes (last: %zu records, %.0f us)\n",
                writes, c.last_batch_records, c.last_write_us);
    EXPECT_GE(writes, 1u);
    EXPECT_LE(writes, 10u) << "queued batches were not merged into one write";
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  }
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  EXPECT_EQ(r.promised, MakeBallot(1, 0));
  ExpectSlots(r, 1, 100, 64);
}

TEST_P(DiskWriterPaths, PublishesErrorsAndNeverCompletesAFailedBatch) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  DiskWriter w(log.get(), nullptr, GetParam());
  ASSERT_EQ(w.ring(), GetParam()) << w.ring_problem();
  std::vector<OwnedRecord> ok, bad;
  ok.push_back(OwnedRecord{EntryType::kInput, 1, 1, 0, "one"});
  w.Submit(1, std::move(ok));
  WaitFor(&w, 1, nullptr);
  bad.push_back(OwnedRecord{EntryType::kInput, 1, 5, 0, "a gap"});
  w.Submit(2, std::move(bad));
  DiskWriter::Completion c = WaitFor(&w, 2, nullptr, true);
  EXPECT_EQ(c.durable_seq, 1u);
  EXPECT_NE(c.error.find("out of range"), std::string::npos) << c.error;
}

// The event fd counts the wake-ups the thread gave: a completion the loop
// said it does not want (a leader's own write that commits nothing alone)
// gives none, yet Poll sees it; one it wants, or an error, gives one.
uint64_t Wakeups(int efd) {
  uint64_t n = 0;
  return read(efd, &n, sizeof n) == sizeof n ? n : 0;  // the fd is non-blocking
}

// The wake-ups that arrive within 5 s. The disk thread publishes a
// completion before it writes the eventfd, so a caller that saw the
// completion may look before the wake-up is there.
uint64_t WakeupsWithin5s(int efd) {
  pollfd p{efd, POLLIN, 0};
  (void)poll(&p, 1, 5000);
  return Wakeups(efd);
}

TEST_P(DiskWriterPaths, WakesTheLoopOnlyForCompletionsItWants) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  DiskWriter w(log.get(), nullptr, GetParam());
  ASSERT_EQ(w.ring(), GetParam()) << w.ring_problem();
  auto submit = [&](uint64_t seq, uint64_t index) {
    std::vector<OwnedRecord> batch;
    batch.push_back(OwnedRecord{EntryType::kInput, 1, index, 0, Payload(index, 10)});
    w.Submit(seq, std::move(batch));
  };
  submit(1, 1);
  ASSERT_EQ(WaitFor(&w, 1, nullptr).durable_seq, 1u);
  EXPECT_EQ(WakeupsWithin5s(w.EventFd()), 1u);  // wanted by default
  EXPECT_FALSE(w.Published());

  w.SetWakeWanted(false);
  submit(2, 2);
  for (int waits = 0; waits < 20000 && !w.Published(); waits++) usleep(1000);
  ASSERT_TRUE(w.Published()) << "the completion was never published";
  EXPECT_EQ(w.Poll().durable_seq, 2u);
  EXPECT_FALSE(w.Published());
  EXPECT_EQ(Wakeups(w.EventFd()), 0u) << "woke the loop for a completion it did not want";

  // Errors always wake it: the loop must refuse proposals at once.
  std::vector<OwnedRecord> bad;
  bad.push_back(OwnedRecord{EntryType::kInput, 1, 9, 0, "a gap"});
  w.Submit(3, std::move(bad));
  EXPECT_FALSE(WaitFor(&w, 3, nullptr, true).error.empty());
  EXPECT_GE(WakeupsWithin5s(w.EventFd()), 1u);
}

// Writes entries 1..n (commit index `commit`) through a DiskWriter, one
// batch per entry; the batch with seq `truncate_seq` also truncates below
// `below` (a seq past n: a batch of its own with no records).
void WriteThenTruncate(const DiskLogOptions& o, uint64_t n, uint64_t commit, uint64_t truncate_seq,
                       uint64_t below, bool ring = true) {
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  DiskWriter w(log.get(), nullptr, ring);
  uint64_t last = std::max(n, truncate_seq);
  for (uint64_t seq = 1; seq <= last; seq++) {
    std::vector<OwnedRecord> batch;
    if (seq <= n) batch.push_back(OwnedRecord{EntryType::kInput, 1, seq, commit, Payload(seq, 10)});
    w.Submit(seq, std::move(batch), seq == truncate_seq ? below : 0);
  }
  EXPECT_EQ(WaitFor(&w, last, nullptr).durable_seq, last);
}

TEST_P(DiskWriterPaths, TruncatesAfterTheRecordsOfItsBatch) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  WriteThenTruncate(o, 10, 0, 6, 4, GetParam());
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  EXPECT_EQ(r.truncated_below, 4u);
  ExpectSlots(r, 4, 10, 10);
}

// Through the ring, a write goes out at once and everything submitted while
// it is out goes out as the next write, in either sync mode (the
// fdatasync one links a sync to the write).
TEST_P(DiskLogModes, RingWriteTakesWhatQueuedWhileTheLastWasOut) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  o.mode = GetParam();
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    DiskWriter w(log.get());
    ASSERT_TRUE(w.ring()) << w.ring_problem();
    // The first write makes the first segment: the thread's job.
    {
      std::vector<OwnedRecord> batch;
      batch.push_back(OwnedRecord{EntryType::kPromise, MakeBallot(1, 0), 0, 0, {}});
      w.Submit(1, std::move(batch));
    }
    DiskWriter::Completion warm = WaitFor(&w, 1, nullptr);
    ASSERT_EQ(warm.durable_seq, 1u);
    EXPECT_EQ(warm.ring_writes, 0u);
    // seq 2 goes out through the ring; nothing polls until 102 is queued,
    // so 3..102 wait for it and then go out together.
    SubmitEntries(&w, 2, 102);
    std::vector<uint64_t> seen;
    DiskWriter::Completion c = WaitFor(&w, 102, &seen);
    EXPECT_EQ(c.durable_seq, 102u);
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(c.writes - warm.writes, 2u);
    EXPECT_EQ(c.ring_writes, 2u);
    EXPECT_EQ(c.last_batch_records, 100u);
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  }
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  EXPECT_FALSE(r.torn_tail || r.damaged) << r.problem;
  EXPECT_EQ(r.promised, MakeBallot(1, 0));
  ExpectSlots(r, 1, 101, 64);
}

// Marks a file immutable (FS_IOC_SETFLAGS) while it lives: writes to it
// fail with EPERM even through descriptors opened before.
class ImmutableFile {
 public:
  explicit ImmutableFile(const std::string& path) : path_(path) { set_ = Flag(true); }
  ~ImmutableFile() {
    if (set_) Flag(false);
  }
  bool set() const { return set_; }
  const std::string& error() const { return error_; }

 private:
  bool Flag(bool on) {
    int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    int flags = 0;
    bool ok = fd >= 0 && ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
    if (ok) {
      flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
      ok = ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
    }
    if (!ok) error_ = "cannot change the flags of " + path_ + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return ok;
  }
  std::string path_, error_;
  bool set_ = false;
};

// A ring write that fails is never completed: the error is published, the
// segment abandoned, and the thread writes the batch again into a new one.
TEST(DiskWriter, AFailedRingWriteIsPublishedAndWrittenAgainInANewSegment) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  std::atomic<int> failed{0};
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    DiskWriter w(log.get(), [&](double, size_t, bool ok) { failed += ok ? 0 : 1; });
    ASSERT_TRUE(w.ring()) << w.ring_problem();
    auto submit = [&](uint64_t seq, uint64_t index) {
      std::vector<OwnedRecord> batch;
      batch.push_back(OwnedRecord{EntryType::kInput, 1, index, 0, Payload(index, 100)});
      w.Submit(seq, std::move(batch));
    };
    submit(1, 1);  // the thread's: it makes the first segment
    ASSERT_EQ(WaitFor(&w, 1, nullptr).durable_seq, 1u);
    submit(2, 2);
    DiskWriter::Completion c = WaitFor(&w, 2, nullptr);
    ASSERT_EQ(c.durable_seq, 2u);
    ASSERT_EQ(c.ring_writes, 1u);
    ASSERT_EQ(log->SegmentPaths().size(), 1u);
    const std::string seg = log->SegmentPaths().back();
    ImmutableFile immutable(seg);
    ASSERT_TRUE(immutable.set()) << immutable.error();

    submit(3, 3);
    // The thread's retry then waits 300 ms (the slow-disk failpoint), long
    // enough for the error to be seen before it clears.
    log->SetAppendDelayUs(300000);
    c = WaitFor(&w, 3, nullptr, true);
    EXPECT_EQ(c.durable_seq, 2u);
    // One record of 100 bytes: the write is one sector.
    const std::string what =
        "I/O error: cannot append " + std::to_string(log->sector_bytes()) + " bytes to " + seg;
    EXPECT_NE(c.error.find(what), std::string::npos) << c.error;
    EXPECT_NE(c.error.find("(write): Operation not permitted"), std::string::npos) << c.error;
    log->SetAppendDelayUs(0);
    c = WaitFor(&w, 3, nullptr);
    EXPECT_EQ(c.durable_seq, 3u);
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(failed.load(), 1);
    EXPECT_EQ(log->SegmentPaths().size(), 2u) << "the batch was not written to a new segment";
  }
  ExpectRecoversClean(o, 1, 3, 100);
}

// A submit the kernel refuses (here: the ring was set up by another thread,
// and a SINGLE_ISSUER ring takes submissions from that thread only) gives
// the ring up for good: that batch and every later one are written by the
// thread, and the completion says why.
TEST(DiskWriter, ARefusedSubmitGivesTheRingUpAndLosesNothing) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  {
    RecoveredLog r;
    auto log = MustOpen(o, &r);
    ASSERT_TRUE(log);
    std::unique_ptr<DiskWriter> w;
    std::thread([&] { w = std::make_unique<DiskWriter>(log.get()); }).join();
    ASSERT_TRUE(w->ring()) << w->ring_problem();
    SubmitEntries(w.get(), 2, 2);  // the thread's: it makes the first segment
    ASSERT_EQ(WaitFor(w.get(), 2, nullptr).durable_seq, 2u);
    SubmitEntries(w.get(), 3, 3);  // the ring's, refused
    DiskWriter::Completion c = WaitFor(w.get(), 3, nullptr);
    EXPECT_EQ(c.durable_seq, 3u);
    EXPECT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(c.ring_writes, 0u);
    EXPECT_NE(c.ring_problem.find("io_uring_submit failed: "), std::string::npos) << c.ring_problem;
    EXPECT_FALSE(w->ring());
    SubmitEntries(w.get(), 4, 6);
    c = WaitFor(w.get(), 6, nullptr);
    EXPECT_EQ(c.durable_seq, 6u);
    EXPECT_EQ(c.ring_writes, 0u);
  }
  ExpectRecoversClean(o, 1, 5, 64);
}

// A backup that installed a checkpoint truncates past its last slot: the
// log then recovers empty, starting after the checkpoint, with everything
// below it committed (never a first index past the commit index + 1).
TEST(DiskLog, TruncationPastTheLastSlotRecoversAsCommitted) {
  TempDir dir;
  DiskLogOptions o;
  o.dir = dir.path();
  WriteThenTruncate(o, 5, 2, 6, 101);  // a checkpoint at index 100
  RecoveredLog r;
  auto log = MustOpen(o, &r);
  ASSERT_TRUE(log);
  EXPECT_EQ(r.truncated_below, 101u);
  EXPECT_EQ(r.commit_index, 100u);
  EXPECT_TRUE(r.slots.empty());
}

// ---------------------------------------------------------------------------
// The durable-write floor here, both modes, as the log writes (each write
// rounded up to the sector size, into a zero-filled preallocated file).

TEST(DiskLog, MeasureDurableWriteFloor) {
  TempDir dir;
  int n = 300;
  if (const char* e = std::getenv("LOCKSTEP_DISK_MEASURE_N")) n = std::atoi(e);
  for (size_t bytes : {size_t{4096}, size_t{64}}) {
    for (SyncMode m : {SyncMode::kDirectDsync, SyncMode::kWriteFdatasync}) {
      std::string err;
      std::vector<double> v = MeasureDurableWrites(dir.path(), m, bytes, n, &err);
      ASSERT_EQ(v.size(), static_cast<size_t>(n)) << err;
      std::sort(v.begin(), v.end());
      std::printf("durable %5zu B writes, %-16s p50 %6.0f us  p90 %6.0f us  p99 %6.0f us\n", bytes,
                  SyncModeName(m), v[v.size() / 2], v[v.size() * 9 / 10], v[v.size() * 99 / 100]);
      EXPECT_GT(v.front(), 0.0);
    }
  }
}

}  // namespace
}  // namespace lockstep
