// disk_writer.cc — the group-commit disk thread (DiskWriter, declared in
// disk_log.h): batches submitted while it writes are merged into its next
// Append; each completion is published for Poll, and signalled through an
// eventfd when the loop wants it (SetWakeWanted) or a write failed.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "consensus/disk_log.h"

namespace lockstep {

DiskWriter::DiskWriter(DiskLog* log, WriteObserver observe)
    : log_(log), observe_(std::move(observe)) {
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread([this] { Run(); });
}

DiskWriter::~DiskWriter() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (event_fd_ >= 0) close(event_fd_);
}

void DiskWriter::Submit(uint64_t seq, std::vector<OwnedRecord> batch, uint64_t truncate_below,
                        std::string truncate_note) {
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(Item{seq, std::move(batch), truncate_below, std::move(truncate_note)});
  }
  cv_.notify_one();
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
  auto t1 = std::chrono::steady_clock::now();
  if (observe_)
    observe_(std::chrono::duration<double, std::micro>(t1 - t0).count(), recs.size(), ok);
  l.lock();
  inline_writing_ = false;
  if (ok) {
    state_.durable_seq = seq;
    state_.writes++;
    state_.records += recs.size();
    state_.last_write_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    state_.last_batch_records = recs.size();
    state_.error.clear();
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

// The event fd is only ever waited on edge-triggered (each write wakes a
// sleeping loop once), so it is never drained: that read was a syscall on
// every pass of the loop.
DiskWriter::Completion DiskWriter::Poll() {
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
