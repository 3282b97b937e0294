// replica_log.h — what every room of the replica daemon shares: its log line
// ("HH:MM:SS.micros replica N: ...", which tests and eval/ scripts read), the
// monotonic clock its timers use (which a failpoint can jump ahead), and the threshold above which
// a step of the loop is reported as slow.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>

namespace lockstep {

// Added to every reading: the failpoint clock_jump_ms (guard/daemon/failpoints.h)
// moves this replica's clock ahead, as if it alone had been paused.
inline std::atomic<uint64_t> clock_jump_us{0};

inline uint64_t NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000 +
         clock_jump_us.load(std::memory_order_relaxed);
}

// A pass of the loop normally takes microseconds; a step that takes longer
// than this (a sleep that overslept, a slow apply, mapping a region) is
// logged, since a few of them in a row look like a dead leader to the peers.
inline constexpr uint64_t kSlowStepUs = 5000;

// Writes one line to stderr, prefixed with the wall-clock time and the
// replica's id. Safe from any thread (one write per line). A line that finds
// stderr unable to take it at once (the log copier's pipe full, below) is
// dropped and counted, and the next line that gets through says how many.
class ReplicaLog {
 public:
  explicit ReplicaLog(int id) : id_(id) {}
  void operator()(const char* fmt, ...) const __attribute__((format(printf, 2, 3)));

 private:
  int id_;
};

// The loop must never wait for the disk: a log line written straight into a
// file on a disk that stalls (a frozen file system, a slow cache flush)
// stopped a leader's loop for as long, and its backups, no longer blocked
// in their own writes (io_uring), elected another (test_stalls). When
// stderr is a regular file, StartLogCopier puts a pipe in front of it
// (stdout too when it is the same file), read by a `cat` child that does
// the blocking writes; this process's end does not block. The copier
// ignores SIGINT and SIGTERM and ends at end of file, so it outlives a crash
// of this process and writes every line it was given. Call it before any
// thread starts. Returns the copier's pid, or 0 when stderr is left as it
// is (a terminal, a pipe, the journal; or no pipe could be made).
pid_t StartLogCopier();
// At exit: gives this process's ends of the pipe up and waits (up to 2 s)
// for the copier to write what is left, so that the log is complete once
// this process is gone.
void StopLogCopier(pid_t copier);

}  // namespace lockstep
