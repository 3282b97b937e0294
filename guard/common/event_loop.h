// event_loop.h — the replica daemon's one thread of control: an epoll set
// whose fds each have a handler, SIGTERM/SIGINT through a signalfd, and the
// loop that runs the daemon's passes, spinning while there is work and
// sleeping in epoll when there is none. It also watches itself: slow passes,
// oversleeping and passes the scheduler delayed are logged, and with
// --verbose it counts what each pass did.
//
// It knows nothing of consensus, UCX or the server: what a pass does, what
// is done when idle, and how to get ready for sleep come from a Body.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <map>

#include "guard/common/replica_log.h"

namespace lockstep {

// What one pass found and did, for the loop's decisions and telemetry.
struct PassReport {
  bool progressed = false;  // the UCX worker had events
  bool polled = false;      // memory: acks, the control word, ring records
  bool disk = false;        // durable-write completions
  bool submitted = false;   // inputs from the server's shim
  bool drained = false;     // the core's work carried out
  bool applied = false;     // committed entries handed to the server
  // When each phase ended (NowUs()), for the slow-pass report.
  uint64_t t_polled = 0, t_submitted = 0, t_drained = 0, t_applied = 0;
  bool busy() const { return progressed || polled || disk || drained || submitted || applied; }
};

class EventLoop {
 public:
  class Body {
   public:
    virtual ~Body() = default;
    // The loop went gap_us without looking at what its peers sent: from the
    // start of the previous pass to now, so the previous pass's own work (a
    // long durable write) counts, as does a sleep that overslept. Called
    // before the socket events that waited meanwhile are handled.
    virtual void OwnGap(uint64_t now, uint64_t gap_us) = 0;
    // One pass at `now` (socket events already handled).
    virtual PassReport Pass(uint64_t now) = 0;
    // The loop is idle: background work. True if it did some (the loop
    // goes round again instead of sleeping).
    virtual bool IdleWork(uint64_t now) = 0;
    // About to sleep: announce it to whoever would wake us. False: work
    // arrived meanwhile, go round again.
    virtual bool PrepareSleep() = 0;
    // Woke from a sleep.
    virtual void Awake() = 0;
  };

  struct Options {
    uint64_t heartbeat_us = 5000;  // the longest sleep: a heartbeat may be due then
    uint64_t spin_us = 0;          // keep polling this long after the last activity
    bool verbose = false;          // log loop statistics every second
    // Gaps longer than this are reported to Body::OwnGap; shorter ones are
    // noise beside an election timeout.
    uint64_t own_gap_us = 10000;
  };

  // Handles an fd's events; true if that counts as activity (the loop then
  // spins on for spin_us rather than sleeping at once).
  using Handler = std::function<bool(uint32_t events)>;

  // SIGTERM and SIGINT must be blocked before any thread starts (the disk
  // writer, UCX's): call this first.
  static void BlockShutdownSignals();

  EventLoop(const Options& options, const ReplicaLog& log);
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Watches fd for input; handler runs on its events. Replaces an earlier
  // handler of the same fd number. An empty handler: the fd only wakes the
  // loop, and the pass itself consumes what made it readable (the UCX
  // worker's fd, the disk writer's completions). Such an fd is watched
  // edge-triggered: it wakes the loop when something new arrives, and one
  // that stays readable without news (UCX that cannot arm its fd) does not
  // keep the loop from sleeping until the next heartbeat.
  void Add(int fd, Handler handler);
  // Watches fd for input, and for output too when writable.
  void Watch(int fd, bool writable);
  void Remove(int fd);

  // Runs passes until Stop() or a shutdown signal.
  void Run(Body& body);
  void Stop() { stopping_ = true; }
  bool stopping() const { return stopping_; }

  // A durable write the loop's thread did itself (verbose statistics).
  void NoteInlineWrite(double us);
  uint64_t own_gap_us() const { return opt_.own_gap_us; }

 private:
  // What --verbose reports once a second.
  struct Stats {
    uint64_t passes = 0;
    uint64_t progress = 0;  // passes in which the UCX worker had events
    uint64_t memory = 0;    // ... polling memory found something
    uint64_t disk = 0;      // ... durable writes completed
    uint64_t drain = 0;     // ... the core had work to carry out
    uint64_t sleeps = 0;    // ... that began with a sleep
    uint64_t inline_writes = 0;
    double inline_write_us_sum = 0;
  };
  void HandleEvents(const epoll_event* evs, int n, uint64_t* last_busy);
  void CountPass(uint64_t now, const PassReport& pass, bool slept);

  Options opt_;
  const ReplicaLog& log_;
  int epfd_ = -1;
  int sigfd_ = -1;
  std::map<int, Handler> handlers_;  // by fd
  bool stopping_ = false;
  uint64_t prev_pass_start_us_ = 0;
  uint64_t prev_pass_end_us_ = 0;
  uint64_t next_slow_log_us_ = 0;
  Stats stats_;
  uint64_t next_stats_us_ = 0;
};

}  // namespace lockstep
