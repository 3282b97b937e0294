// replica_log.h — what every room of the replica daemon shares: its log line
// ("HH:MM:SS.micros replica N: ...", which tests and eval/ scripts read), the
// monotonic clock its timers use (which a failpoint can jump ahead), and the threshold above which
// a step of the loop is reported as slow.
#pragma once

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
// replica's id. Safe from any thread (one fprintf per line).
class ReplicaLog {
 public:
  explicit ReplicaLog(int id) : id_(id) {}
  void operator()(const char* fmt, ...) const __attribute__((format(printf, 2, 3)));

 private:
  int id_;
};

}  // namespace lockstep
