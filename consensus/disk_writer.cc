// disk_writer.cc — group commit (DiskWriter, declared in disk_log.h): a
// batch that finds the log idle is written through io_uring from the
// submitting thread and reaped by its Poll; batches submitted while a write
// is out merge into the next one; what the ring cannot take goes to the
// disk thread, which writes synchronously and retries after errors. Each
// completion is published for Poll, and signalled through an eventfd when
// the loop wants it (SetWakeWanted) or a thread write failed.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "consensus/assert.h"
#include "consensus/disk_log.h"

namespace lockstep {

namespace {
constexpr uint64_t kWriteTag = 1, kSyncTag = 2;  // user_data of a ring write's entries
double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// The ring and the one write it may have out. DEFER_TASKRUN: a completion
// is posted only when the submitting thread asks (Poll), so the kernel never
// interrupts that thread's sleep for a completion it did not want; it
// signals the registered eventfd when the completion arrives, unless the
// loop turned that off (IORING_CQ_EVENTFD_DISABLED, SetWakeWanted).
struct DiskWriter::Ring {
  io_uring ring{};
  bool busy = false;               // a write is out
  std::vector<Item> items;         // ... the batches it carries
  std::vector<LogRecord> records;  // ... their records (views into items)
  AppendWrite write;
  int cqes_left = 0;
  int err = 0;  // first failure among its completions
  const char* step = "write";
  std::chrono::steady_clock::time_point started;
  bool set_up = false;    // io_uring_queue_init succeeded
  bool given_up = false;  // a submit failed: every later write goes to the thread
  ~Ring() {
    if (set_up) io_uring_queue_exit(&ring);
  }
  // Whether the kernel holds a completion not yet reaped.
  bool HasCompletion() const {
    return io_uring_cq_ready(&ring) > 0 ||
           (IO_URING_READ_ONCE(*ring.sq.kflags) & IORING_SQ_TASKRUN);
  }
};

DiskWriter::DiskWriter(DiskLog* log, WriteObserver observe, bool use_ring)
    : log_(log), observe_(std::move(observe)) {
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (!use_ring) {
    ring_problem_ = "io_uring not asked for";
  } else {
    auto r = std::make_unique<Ring>();
    int rc = io_uring_queue_init(
        8, &r->ring,
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG);
    r->set_up = rc == 0;
    if (rc < 0) {
      ring_problem_ = std::string("io_uring_setup refused: ") + std::strerror(-rc);
    } else if ((rc = io_uring_register_eventfd(&r->ring, event_fd_)) < 0) {
      ring_problem_ = std::string("io_uring_register_eventfd refused: ") + std::strerror(-rc);
    } else {
      ring_ = std::move(r);
    }
  }
  thread_ = std::thread([this] { Run(); });
}

DiskWriter::~DiskWriter() {
  // A ring write's buffer is the log's: wait for it before anything else.
  while (ring_ && ring_->busy) {
    io_uring_cqe* c = nullptr;
    if (io_uring_wait_cqe(&ring_->ring, &c) < 0) break;
    Poll();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  ring_.reset();
  if (event_fd_ >= 0) close(event_fd_);
}

void DiskWriter::Submit(uint64_t seq, std::vector<OwnedRecord> batch, uint64_t truncate_below,
                        std::string truncate_note) {
  std::unique_lock<std::mutex> l(mu_);
  queue_.push_back(Item{seq, std::move(batch), truncate_below, std::move(truncate_note)});
  if (ring() && !inline_writing_ && !thread_busy_ && !stop_ && StartRingWrite(l)) return;
  l.unlock();
  cv_.notify_one();  // the thread's (or, with a ring write out, left for it to take)
}

// Takes everything queued into one ring write. Called with mu_ held and the
// log idle (no ring write out, the thread holding nothing); returns false,
// the queue as before, when the ring cannot take it (a truncation, a new
// segment, a failpoint, an invalid batch: the thread's, to be notified).
bool DiskWriter::StartRingWrite(std::unique_lock<std::mutex>& l) {
  Ring& r = *ring_;
  LS_ASSERT(!r.busy && !inline_writing_ && !thread_busy_, "ring write started on a busy log");
  for (const Item& it : queue_)
    if (it.truncate_below != 0) return false;
  r.items = std::move(queue_);
  queue_.clear();
  inline_writing_ = true;  // the thread leaves the queue and the log alone meanwhile
  l.unlock();
  r.records.clear();
  for (const Item& it : r.items)
    for (const OwnedRecord& rec : it.records) r.records.push_back(rec.view());
  bool started = false;
  if (r.records.empty()) {
    started = true;  // nothing to write: complete at once
  } else if (log_->BeginAppend(r.records, &r.write)) {
    io_uring_sqe* w = io_uring_get_sqe(&r.ring);
    io_uring_sqe* f = r.write.needs_datasync ? io_uring_get_sqe(&r.ring) : nullptr;
    LS_ASSERT(w && (f || !r.write.needs_datasync), "ring full with no write out");
    io_uring_prep_write(w, r.write.fd, r.write.data, static_cast<unsigned>(r.write.len),
                        r.write.offset);
    io_uring_sqe_set_data64(w, kWriteTag);
    if (f) {
      w->flags |= IOSQE_IO_LINK;  // the sync only once the write succeeded
      io_uring_prep_fsync(f, r.write.fd, IORING_FSYNC_DATASYNC);
      io_uring_sqe_set_data64(f, kSyncTag);
    }
    int want = f ? 2 : 1;
    int rc = io_uring_submit(&r.ring);
    started = rc == want;
    if (!started) {
      // Refused by the kernel: nothing was written and the log moved on by
      // nothing (EndAppend not called); the thread writes the batch. The
      // entries refused may still sit in the submission queue, where a later
      // submit would send them with whatever the buffer then holds: the ring
      // is never used again.
      r.given_up = true;
      ring_problem_ = std::string("io_uring_submit failed: ") +
                      (rc < 0 ? std::strerror(-rc) : std::to_string(rc) + " entries taken");
    }
    r.cqes_left = started ? want : 0;
    r.err = 0;
    r.step = "write";
    r.started = std::chrono::steady_clock::now();
  }
  l.lock();
  if (r.given_up) state_.ring_problem = ring_problem_;
  if (!started) {
    Requeue(&r.items);
    inline_writing_ = false;
    return false;
  }
  if (r.records.empty()) {
    inline_writing_ = false;
    state_.durable_seq = r.items.back().seq;
    published_++;
    r.items.clear();
    return true;
  }
  r.busy = true;
  return true;
}

// The ring write's completions are all in: the log learns the outcome, the
// state is published, and what queued meanwhile goes out as the next write.
void DiskWriter::FinishRingWrite() {
  Ring& r = *ring_;
  double us = MicrosSince(r.started);
  std::string err;
  bool ok = log_->EndAppend(r.records, r.write, r.err, r.step, &err);
  if (observe_) observe_(us, r.records.size(), ok);
  std::unique_lock<std::mutex> l(mu_);
  r.busy = false;
  inline_writing_ = false;
  if (ok) {
    NoteAppended(r.items.back().seq, r.records.size(), us);
    state_.ring_writes++;
    r.items.clear();
  } else {
    state_.error = err;  // the thread retries it with back-off, ahead of anything later
    Requeue(&r.items);
  }
  published_++;
  if (queue_.empty() || (ok && !stop_ && ring() && StartRingWrite(l))) return;
  l.unlock();
  cv_.notify_one();
}

bool DiskWriter::ring() const {
  return ring_ && !ring_->given_up;
}

// Under mu_: an append that covers seq, of `records` records, took `us`.
void DiskWriter::NoteAppended(uint64_t seq, size_t records, double us) {
  state_.durable_seq = seq;
  state_.writes++;
  state_.records += records;
  state_.last_write_us = us;
  state_.last_batch_records = records;
  state_.error.clear();
}

// Under mu_: items that were taken and not written go back to the queue's
// front, ahead of anything submitted since.
void DiskWriter::Requeue(std::vector<Item>* items) {
  queue_.insert(queue_.begin(), std::make_move_iterator(items->begin()),
                std::make_move_iterator(items->end()));
  items->clear();
}

bool DiskWriter::WriteNow(uint64_t seq, std::vector<OwnedRecord> batch) {
  std::unique_lock<std::mutex> l(mu_);
  if (thread_busy_ || inline_writing_ || !queue_.empty() || stop_) {
    queue_.push_back(Item{seq, std::move(batch), 0, {}});
    l.unlock();
    cv_.notify_one();
    return false;
  }
  inline_writing_ = true;  // the thread leaves the queue alone meanwhile
  l.unlock();
  std::vector<LogRecord> recs;
  recs.reserve(batch.size());
  for (const OwnedRecord& r : batch) recs.push_back(r.view());
  std::string err;
  auto t0 = std::chrono::steady_clock::now();
  bool ok = log_->Append(recs, &err);
  double us = MicrosSince(t0);
  if (observe_) observe_(us, recs.size(), ok);
  l.lock();
  inline_writing_ = false;
  if (ok) {
    NoteAppended(seq, recs.size(), us);
  } else {
    state_.error = err;  // the thread retries it with back-off, ahead of anything later
    queue_.insert(queue_.begin(), Item{seq, std::move(batch), 0, {}});
  }
  published_++;
  // The thread has work only if something queued meanwhile (or this write
  // failed). The caller needs no wake-up: it is awake and Polls next. (Both
  // were done on every inline write: two syscalls and a wake-up per commit.)
  bool thread_has_work = !queue_.empty();
  l.unlock();
  if (thread_has_work) cv_.notify_one();
  return ok;
}

void DiskWriter::SetWakeWanted(bool wanted) {
  wake_wanted_.store(wanted);
  if (ring_) {
    io_uring_cq_eventfd_toggle(&ring_->ring, wanted);
    // The kernel sets IORING_SQ_TASKRUN with a full barrier before it reads
    // the eventfd flag; this one orders our flag store before Published()
    // reads its: one of the two sees the other, so no wanted wake-up is lost.
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

bool DiskWriter::RingWriteOut() const {
  return ring_ && ring_->busy;
}

bool DiskWriter::Published() const {
  return published_.load() != polled_version_ || (ring_ && ring_->busy && ring_->HasCompletion());
}

// The event fd is only ever waited on edge-triggered (each write wakes a
// sleeping loop once), so it is never drained: that read was a syscall on
// every pass of the loop.
DiskWriter::Completion DiskWriter::Poll() {
  if (ring_ && ring_->busy && ring_->HasCompletion()) {
    Ring& r = *ring_;
    if (IO_URING_READ_ONCE(*r.ring.sq.kflags) & IORING_SQ_TASKRUN) io_uring_get_events(&r.ring);
    io_uring_cqe* c = nullptr;
    while (r.cqes_left > 0 && io_uring_peek_cqe(&r.ring, &c) == 0) {
      int res = c->res;
      uint64_t tag = io_uring_cqe_get_data64(c);
      io_uring_cqe_seen(&r.ring, c);
      r.cqes_left--;
      if (r.err != 0) continue;  // the first failure is the one to tell (then -ECANCELED)
      if (res < 0) {
        r.err = -res;
        r.step = tag == kSyncTag ? "sync" : "write";
      } else if (tag == kWriteTag && static_cast<size_t>(res) != r.write.len) {
        r.err = EIO;  // a short write: the rest never reached the disk
        r.step = "write (short)";
      }
    }
    if (r.cqes_left == 0) FinishRingWrite();
  }
  if (published_.load() == polled_version_) return polled_;
  std::lock_guard<std::mutex> l(mu_);
  polled_ = state_;
  polled_version_ = published_.load();
  return polled_;
}

void DiskWriter::Run() {
  std::vector<Item> work;  // taken from the queue, not yet complete (kept across failures)
  auto backoff = std::chrono::milliseconds(0);
  bool last_try = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      if (backoff.count() > 0) {
        cv_.wait_for(l, backoff, [&] { return stop_; });
      } else {
        cv_.wait(l, [&] { return stop_ || (!queue_.empty() && !inline_writing_); });
      }
      if (stop_) {
        if (queue_.empty() && work.empty()) return;
        if (backoff.count() > 0) {
          if (last_try) return;  // draining, and the disk still fails: give up
          last_try = true;
        }
      }
      for (Item& it : queue_) work.push_back(std::move(it));
      queue_.clear();
      thread_busy_ = true;
    }

    // Everything taken goes out as one Append, split only where a truncate
    // must follow the records before it.
    size_t completed = 0;
    uint64_t appends = 0, nrecords = 0;
    double last_us = 0;
    size_t last_records = 0;
    std::string err;
    std::vector<LogRecord> recs;
    size_t i = 0;
    while (i < work.size() && err.empty()) {
      size_t j = i;
      recs.clear();
      for (;; j++) {
        if (!work[j].records_done)
          for (const OwnedRecord& r : work[j].records) recs.push_back(r.view());
        if (work[j].truncate_below != 0 || j + 1 == work.size()) break;
      }
      if (!recs.empty()) {
        auto t0 = std::chrono::steady_clock::now();
        bool ok = log_->Append(recs, &err);
        auto t1 = std::chrono::steady_clock::now();
        if (observe_)
          observe_(std::chrono::duration<double, std::micro>(t1 - t0).count(), recs.size(), ok);
        if (!ok) break;
        appends++;
        nrecords += recs.size();
        last_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
        last_records = recs.size();
        for (size_t k = i; k <= j; k++) work[k].records_done = true;
      }
      completed = j;  // items before j are complete
      if (work[j].truncate_below != 0 &&
          !log_->TruncateBelow(work[j].truncate_below, &err, work[j].truncate_note))
        break;
      completed = j + 1;
      i = j + 1;
    }

    {
      std::lock_guard<std::mutex> l(mu_);
      thread_busy_ = completed < work.size();  // failed work stays ours to retry
      if (completed > 0) state_.durable_seq = work[completed - 1].seq;
      state_.writes += appends;
      state_.records += nrecords;
      if (appends > 0) {
        state_.last_write_us = last_us;
        state_.last_batch_records = last_records;
      }
      state_.error = err;
      published_++;
    }
    work.erase(work.begin(), work.begin() + static_cast<std::ptrdiff_t>(completed));
    // (published_ is stored before wake_wanted_ is loaded, and the loop
    // stores wake_wanted_ before it loads published_: one of the two sees
    // the other, so a loop that wants the wake-up and sleeps gets it.)
    if (wake_wanted_.load() || !err.empty()) {
      uint64_t one = 1;
      ssize_t n = write(event_fd_, &one, sizeof one);
      (void)n;
    }
    if (err.empty()) {
      backoff = std::chrono::milliseconds(0);
      last_try = false;
    } else {
      backoff = std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(1000),
          backoff.count() == 0 ? std::chrono::milliseconds(1) : backoff * 2);
    }
  }
}

}  // namespace lockstep
