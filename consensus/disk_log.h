// disk_log.h — the replica's durable log: preallocated segment files,
// append-only, group commit.
//
// On disk: a directory of segment files `seg-<base, 16 hex digits>`, each
// preallocated to segment_bytes (fallocate, then filled with zeros so that
// later writes land in already-written extents and a durable write needs no
// metadata commit). A record's `position` is its global byte position:
// segment base + offset in the file, so bytes left from another file or
// another offset never validate.
//
// Every segment starts with a header record (kPad, payload
// "lockstep-segment", `index` = the global position where the valid log
// ended in the previous segment). Each Append is one write that starts on a
// sector boundary and ends with a kPad record reaching the next boundary,
// so no sector holding acknowledged bytes is ever written again.
//
// Recovery follows the chain: the records of a segment, up to the position
// the next segment's header names; it ends at the first position where no
// valid record decodes. What lies after that end is
//  - clean: only zeros, on a sector boundary: the next Append continues there;
//  - a torn tail: bytes but no valid record after the first bad one;
//  - damage: a valid record somewhere after the first bad one.
// Torn or damaged, everything from the first bad record on is dropped and
// reported, later segment files are removed (torn) or renamed to
// `*.damaged` (damage, kept for inspection), and the next Append starts a
// fresh segment whose base lies beyond every byte ever written: the dropped
// bytes are never overwritten in place and can never be read as valid later.
// The same happens after a failed write or sync: the segment is abandoned
// and the batch is written again at the start of a new segment.
//
// Slot records must keep the log contiguous: a slot's index is at least the
// first index (max(truncated_below, 1)) and at most one past the highest
// slot index so far (an earlier index overwrites that slot: the later record
// wins). Append rejects anything else without writing.
//
// Not thread-safe: one thread uses a DiskLog at a time (while a DiskWriter
// runs, only through it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "consensus/log_format.h"

namespace lockstep {

struct LogRecord {
  EntryType type = EntryType::kInput;
  Ballot ballot = 0;
  uint64_t index = 0;
  uint64_t commit_index = 0;
  std::string_view payload;
};

// Like LogRecord but owns its payload (what DiskWriter queues).
struct OwnedRecord {
  EntryType type = EntryType::kInput;
  Ballot ballot = 0;
  uint64_t index = 0;
  uint64_t commit_index = 0;
  std::string payload;
  LogRecord view() const { return LogRecord{type, ballot, index, commit_index, payload}; }
};

enum class SyncMode {
  kDirectDsync,     // O_DIRECT|O_DSYNC: each pwrite returns once durable
  kWriteFdatasync,  // pwrite into the page cache, then fdatasync
};
const char* SyncModeName(SyncMode m);

struct DiskLogOptions {
  std::string dir;
  uint64_t segment_bytes = 64 << 20;
  // Measured on this machine (ext4 on virtio, into zero-filled segments,
  // 6 x 300 writes per case, SCHED_FIFO to keep other tenants' CPU load out):
  // O_DIRECT|O_DSYNC p50 89-123 us, write+fdatasync p50 93-133 us; the
  // direct mode was ahead by 4-11 us at p50 in every run, p99 about equal
  // (175-370 us). When the file system refuses O_DIRECT the log falls back
  // to kWriteFdatasync; mode() tells which is in force.
  SyncMode mode = SyncMode::kDirectDsync;
  // Batches end on a multiple of this. 0: the device's physical block size
  // (at least the logical one and the O_DIRECT offset alignment; 4096 when
  // unknown). A smaller sector than the physical one makes the drive
  // read-modify-write a physical sector that holds acknowledged bytes.
  size_t sector_bytes = 0;
  bool zero_fill = true;      // fill new segments with zeros (written extents)
  bool prepare_ahead = true;  // prepare the next segment in a background thread
  // How long Open waits for another holder of the log's LOCK to let go
  // (a replica restarted while its SIGKILLed predecessor is still exiting).
  int lock_wait_ms = 0;
  // Only to look at a log nobody runs (`lockstep cluster up` telling what a
  // directory holds): takes a shared lock (fails while a replica holds the
  // log), recovers into RecoveredLog exactly as a replica would, but writes,
  // removes and renames nothing; Append and TruncateBelow then refuse.
  bool read_only = false;
};

struct RecoveredLog {
  Ballot promised = 0;           // last kPromise record
  uint64_t commit_index = 0;     // max commit_index over valid slot and kTruncate records
  uint64_t truncated_below = 0;  // last kTruncate
  std::string truncate_note;     // ... and its payload (TruncateBelow's base_note)
  // index -> latest record for that index, sorted, contiguous from
  // max(truncated_below, 1).
  std::vector<Entry> slots;
  uint64_t records = 0, bytes = 0;  // valid records (all types) and their bytes
  bool torn_tail = false;           // the last write was incomplete: dropped, never served
  bool damaged = false;  // a bad record followed by valid ones: dropped from the bad one on
  std::string problem;   // file, offset and what was wrong, when torn_tail or damaged
};

// One append whose write the caller makes (DiskWriter, through io_uring):
// DiskLog::BeginAppend lays the batch out and says where it goes; the
// caller writes `len` bytes of `data` to `fd` at `offset`, makes them
// durable (fdatasync when `needs_datasync`), and calls EndAppend.
struct AppendWrite {
  int fd = -1;
  const uint8_t* data = nullptr;  // the log's write buffer: valid until EndAppend
  size_t len = 0;
  uint64_t offset = 0;
  bool needs_datasync = false;  // SyncMode::kWriteFdatasync
  size_t records = 0;
  size_t last_canary = 0;  // in data: where the last record's canary starts
};

class DiskLog {
 public:
  // Creates dir (and parents); takes an exclusive lock on dir/LOCK; recovers.
  static std::unique_ptr<DiskLog> Open(const DiskLogOptions& options, RecoveredLog* recovered,
                                       std::string* error);
  ~DiskLog();
  DiskLog(const DiskLog&) = delete;
  DiskLog& operator=(const DiskLog&) = delete;

  // Appends the records in order (slot types and kPromise) as one write,
  // durable before it returns. On any error returns false with a message
  // ("disk full: cannot append 4096 bytes to /dir/seg-...: No space left on
  // device"); the durable log is then as before, and a later Append writes
  // the batch again (into a new segment).
  bool Append(const std::vector<LogRecord>& batch, std::string* error);

  // Append in two halves, for a caller that writes without blocking:
  // BeginAppend encodes the batch into the log's buffer and fills *w, or
  // returns false having changed nothing when the batch must go through
  // Append instead (it needs a new segment, whose file operations may
  // block; a slow-disk or torn-write failpoint is armed; it is invalid, so
  // that Append gives the error). Between the two calls nothing else may
  // use the log. EndAppend takes the same batch and the outcome: err 0,
  // durable (the log moves on past it); otherwise `step` ("write",
  // "sync") failed with errno err: *error says so, and the segment is
  // abandoned exactly as after a failed Append, which writes the batch
  // again into a new segment.
  bool BeginAppend(const std::vector<LogRecord>& batch, AppendWrite* w);
  bool EndAppend(const std::vector<LogRecord>& batch, const AppendWrite& w, int err,
                 const char* step, std::string* error);

  // Appends a kTruncate record (and restates the promised ballot) durably,
  // then deletes the oldest segment files that hold only slots below index.
  // No-op when index <= truncated_below(). `base_note`, the record's
  // payload, is what the caller must know of the state the dropped slots
  // made (the daemon: the configuration at index - 1, membership.h
  // EncodeMembership); recovery returns the last one (RecoveredLog).
  bool TruncateBelow(uint64_t index, std::string* error, std::string_view base_note = {});

  // Failpoints (guard/daemon/failpoints.h), safe from any thread. Each Append
  // first waits this long (a slow disk; 0: none).
  void SetAppendDelayUs(uint32_t us) { append_delay_us_.store(us); }
  // The next Append writes only the sectors before the one holding its last
  // record's canary, syncs, and ends the process at once with status
  // kTornWriteExit: a crash between a header and its canary (when the last
  // record spans sectors). Recovery must drop what follows as a torn tail.
  void TearNextAppend(bool tear) { tear_next_append_.store(tear); }
  static constexpr int kTornWriteExit = 86;

  SyncMode mode() const { return mode_; }
  size_t sector_bytes() const { return align_; }
  const std::string& dir() const { return dir_; }
  // Global position right after the last valid record (where the next batch
  // goes unless it starts a new segment).
  uint64_t end_position() const { return chain_end_; }
  uint64_t truncated_below() const { return truncated_below_; }
  uint64_t last_index() const { return last_index_; }
  Ballot promised() const { return promised_; }
  std::vector<std::string> SegmentPaths() const;  // oldest first

 private:
  struct Segment {
    uint64_t base = 0;
    uint64_t size = 0;
    std::string path;
    uint64_t max_slot = 0;  // highest slot index recorded in it (0: none)
  };
  class Preparer;

  DiskLog() = default;
  bool Recover(RecoveredLog* out, std::string* error);
  bool AppendRecords(const std::vector<LogRecord>& batch, bool internal, std::string* error);
  bool CheckBatch(const std::vector<LogRecord>& batch, bool internal, uint64_t* total,
                  std::string* error) const;
  bool FitsActiveSegment(uint64_t total) const;
  bool EncodeBatch(const std::vector<LogRecord>& batch, uint64_t total, AppendWrite* w,
                   std::string* error);
  bool WriteFailed(const AppendWrite& w, int err, const char* step, bool first_attempt,
                   std::string* error);
  void NoteDurable(const std::vector<LogRecord>& batch, const AppendWrite& w);
  bool Roll(size_t write_bytes, std::string* error);
  bool OpenForWrite(const std::string& path, int* fd, std::string* error);
  bool SyncDir(std::string* error);
  uint64_t FirstIndex() const { return truncated_below_ > 1 ? truncated_below_ : 1; }

  std::atomic<uint32_t> append_delay_us_{0};
  std::atomic<bool> tear_next_append_{false};
  DiskLogOptions options_;
  std::string dir_;
  SyncMode mode_ = SyncMode::kDirectDsync;
  size_t align_ = 4096;
  uint64_t segment_bytes_ = 0;
  int dir_fd_ = -1;
  int lock_fd_ = -1;

  std::deque<Segment> segments_;  // oldest first; the active one (if any) is last
  int active_fd_ = -1;            // -1: the next Append starts a new segment
  uint64_t write_off_ = 0;        // next write offset in the active segment
  bool newest_empty_ = false;     // the newest segment was made by Roll and never written
  uint64_t chain_end_ = 0;        // global position after the last valid record
  uint64_t next_base_ = 0;        // base of the next new segment

  Ballot promised_ = 0;
  uint64_t truncated_below_ = 0;
  uint64_t last_index_ = 0;  // highest slot index present (0: none)
  uint64_t max_commit_ = 0;

  uint8_t* buf_ = nullptr;  // 4096-aligned write buffer
  size_t buf_cap_ = 0;
  std::string zeros_;  // pad payloads
  std::unique_ptr<Preparer> preparer_;
};

// Measures the durable-write floor in `dir`: n appends of `bytes` each
// (rounded up to the sector size the log would use) at consecutive offsets
// of a file prepared like a segment, with the given mode. Returns per-write
// latencies in microseconds (empty with *error set on failure).
std::vector<double> MeasureDurableWrites(const std::string& dir, SyncMode mode, size_t bytes, int n,
                                         std::string* error);

// The durable writes of one replica: group commit. Submit() queues a batch
// and returns at once. A batch that finds the log idle is written through
// io_uring from the caller's own thread: no hand-off to another thread, and
// the caller sleeps in its event loop, not in the write (one wake-up per
// write where a blocking O_DIRECT|O_DSYNC write slept twice here: once for
// the data, once for the cache flush). Batches submitted meanwhile queue
// and go out as one write when it completes (batches grow with the queue;
// no timer). What the ring cannot take goes to the disk thread, which
// writes synchronously: a batch with a truncation, one that needs a new
// segment, one under a failpoint, and every retry after an error (with a
// growing back-off, 1 ms .. 1 s; the error clears once a write succeeds).
// Without io_uring (refused by the kernel, or use_ring false) every batch
// goes to the thread. Each completion is published for Poll and signalled
// through an eventfd; durable_seq never covers a batch that is not durable.
//
// Submit, WriteNow, Poll, SetWakeWanted, Published and the destructor are
// called by one thread (the daemon's loop): ring completions are reaped in
// Poll, so a caller that submits must keep polling.
class DiskWriter {
 public:
  // Told of every Append, on the thread that made it (this one's, or the
  // caller's in WriteNow and for ring writes): its duration, its records
  // and whether it worked (the daemon's metrics: guard/daemon/daemon_metrics.h).
  // Must not block.
  using WriteObserver = std::function<void(double micros, size_t records, bool ok)>;
  // Starts the thread; sets up the ring (when use_ring) in the calling
  // thread, which must be the one that submits.
  explicit DiskWriter(DiskLog* log, WriteObserver observe = nullptr, bool use_ring = true);
  ~DiskWriter();  // waits for a ring write, drains (one last try on error) and joins
  DiskWriter(const DiskWriter&) = delete;
  DiskWriter& operator=(const DiskWriter&) = delete;

  // seq must increase from call to call. truncate_below != 0: after the
  // batch's records are durable, TruncateBelow(truncate_below); the seq
  // completes once both are done. (To truncate before writing slots that
  // start above the log's end, submit the truncate alone first.)
  void Submit(uint64_t seq, std::vector<OwnedRecord> batch, uint64_t truncate_below = 0,
              std::string truncate_note = {});
  // For a caller without the ring (ring() false): like Submit, but when the
  // thread is idle the Append happens right here in the caller's thread: no
  // hand-off between threads on the path of a commit (two wake-ups cost
  // more than the write on a busy 2-core host). Returns true when the batch
  // is durable on return; otherwise it was queued (busy, or the write
  // failed and will be retried).
  bool WriteNow(uint64_t seq, std::vector<OwnedRecord> batch);
  // Written (by the thread, or by the kernel for a ring write) when a
  // completion the loop wants is published (see SetWakeWanted) or a thread
  // write failed; never drained (so watch it edge-triggered: each write
  // wakes a sleeper once).
  int EventFd() const { return event_fd_; }
  // Whether writes go through io_uring, and if not, why not (set up
  // refused, or a submit failed: then the ring is given up for good and
  // Completion::ring_problem says why).
  bool ring() const;
  const std::string& ring_problem() const { return ring_problem_; }

  struct Completion {
    uint64_t durable_seq = 0;  // every seq <= this is durable
    std::string error;         // non-empty: the last attempt failed with this
    double last_write_us = 0;  // duration of the last Append
    size_t last_batch_records = 0;
    uint64_t writes = 0;       // Appends done so far
    uint64_t records = 0;      // records written so far
    uint64_t ring_writes = 0;  // ... of them through io_uring
    std::string ring_problem;  // non-empty: the ring was given up, and why
  };
  // Reaps a finished ring write (and starts the next from the queue), then
  // returns the latest state. Takes the lock only when something was
  // published since the last call (every pass of the loop polls).
  Completion Poll();
  // Whether the loop wants the event fd written for a completion (true at
  // first). A completion nobody waits for (a leader's own write that commits
  // nothing by itself) need not wake it: the next pass reads it. Errors of
  // the thread are always signalled; a failed ring write only when wanted
  // (the loop then sees it on its next pass, at most a heartbeat later, and
  // the thread retries it). After setting it false, call Published() once
  // more before sleeping: a completion published in between may have seen
  // the old value.
  void SetWakeWanted(bool wanted);
  // Whether Poll() would find something new.
  bool Published() const;
  // Whether a ring write is out (its completion signals the event fd
  // when wanted).
  bool RingWriteOut() const;

 private:
  struct Item {
    uint64_t seq;
    std::vector<OwnedRecord> records;
    uint64_t truncate_below;
    std::string truncate_note;
    bool records_done = false;
  };
  struct Ring;  // io_uring state (disk_writer.cc), touched by the submitting thread only
  void Run();
  bool StartRingWrite(std::unique_lock<std::mutex>& l);
  void FinishRingWrite();
  void NoteAppended(uint64_t seq, size_t records, double us);
  void Requeue(std::vector<Item>* items);

  DiskLog* log_;
  WriteObserver observe_;
  int event_fd_ = -1;
  std::unique_ptr<Ring> ring_;
  std::string ring_problem_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Item> queue_;
  bool stop_ = false;
  // The submitting thread owns the log: WriteNow appending in it, or a ring
  // write in flight. The thread leaves the queue alone meanwhile.
  bool inline_writing_ = false;
  bool thread_busy_ = false;  // the thread holds work (writing, or retrying after an error)
  Completion state_;
  std::atomic<uint64_t> published_{0};  // bumped under mu_ whenever state_ changes
  std::atomic<bool> wake_wanted_{true};
  uint64_t polled_version_ = 0;  // the polling thread's: published_ at its last Poll
  Completion polled_;            // ... and what it returned
  std::thread thread_;
};

}  // namespace lockstep
