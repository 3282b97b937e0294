// event_loop.cc — see event_loop.h.
//
// Polling is adaptive: the loop spins (yielding the CPU between passes) for
// spin_us after the last activity, then lets the body arm its wake-ups and
// sleeps in epoll until a doorbell, a socket, the disk or the next heartbeat
// wakes it.
#include "guard/common/event_loop.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdlib>

namespace lockstep {

namespace {

constexpr int kMaxEvents = 64;  // per epoll call; the rest wait for the next pass
// A pass that starts this much later than one heartbeat after the previous
// one ended means the scheduler left the daemon off the CPU.
constexpr uint64_t kNotScheduledSlackUs = 10000;
constexpr uint64_t kSlowLogIntervalUs = 1000000;  // slow-pass reports, at most
constexpr uint64_t kStatsIntervalUs = 1000000;    // --verbose loop statistics

sigset_t ShutdownSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  return mask;
}

// The daemon's threads run at a higher priority than the server and its
// clients (nice -10; the server, started before this, keeps nice 0, under
// SCHED_BATCH: guard/server/server.cc):
// on a machine where they share a few cores, a daemon left off the CPU for
// longer than the election timeout looks dead to its peers. The daemon
// sleeps whenever it has nothing to do, so it takes little from the others.
// Without the privilege to do so it runs at the default priority.
// (SCHED_FIFO was tried: no late wake-ups at all, but under a 16-connection
// disk load throughput fell from ~11K to ~6K inputs/s and p50 rose.)
void RaisePriority() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    int tid = atoi(e->d_name);
    if (tid > 0) setpriority(PRIO_PROCESS, static_cast<id_t>(tid), -10);
  }
  closedir(d);
}

}  // namespace

// SIGTERM and SIGINT arrive through a signalfd. They must be blocked before
// any thread starts: a process-directed signal goes to any thread that does
// not block it, and its default action would end the daemon without
// stopping its server.
void EventLoop::BlockShutdownSignals() {
  sigset_t shutdown = ShutdownSignals();
  sigprocmask(SIG_BLOCK, &shutdown, nullptr);
}

EventLoop::EventLoop(const Options& options, const ReplicaLog& log) : opt_(options), log_(log) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  sigset_t mask = ShutdownSignals();
  sigfd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  Watch(sigfd_, false);
}

EventLoop::~EventLoop() {
  for (int fd : {sigfd_, epfd_})
    if (fd >= 0) close(fd);
}

void EventLoop::Add(int fd, Handler handler) {
  handlers_[fd] = std::move(handler);
  Watch(fd, false);
}

void EventLoop::Watch(int fd, bool writable) {
  auto it = handlers_.find(fd);
  bool wake_only = it != handlers_.end() && !it->second;
  epoll_event ev{};
  ev.events = EPOLLIN | (writable ? static_cast<uint32_t>(EPOLLOUT) : 0u) |
              (wake_only ? static_cast<uint32_t>(EPOLLET) : 0u);
  ev.data.fd = fd;
  if (epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) < 0) epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
}

void EventLoop::Remove(int fd) {
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(fd);
}

void EventLoop::NoteInlineWrite(double us) {
  stats_.inline_write_us_sum += us;
  stats_.inline_writes++;
}

void EventLoop::Run(Body& body) {
  RaisePriority();
  uint64_t last_busy = NowUs();
  bool may_sleep = false;
  epoll_event evs[kMaxEvents];
  while (!stopping_) {
    // Sockets first, so that after any stall the messages that arrived
    // (heartbeats among them) are seen before the election timer is checked.
    int n;
    if (may_sleep) {
      timespec ts{0, static_cast<long>(opt_.heartbeat_us * 1000)};
      uint64_t t0 = NowUs();
      n = epoll_pwait2(epfd_, evs, kMaxEvents, &ts, nullptr);
      if (NowUs() - t0 > opt_.heartbeat_us + kSlowStepUs)  // overslept: the host stalled
        log_("slept %lu us (asked for %lu)", (unsigned long)(NowUs() - t0),
             (unsigned long)opt_.heartbeat_us);
      body.Awake();
    } else {
      n = epoll_wait(epfd_, evs, kMaxEvents, 0);
    }
    uint64_t woke = NowUs();
    if (prev_pass_start_us_ && woke - prev_pass_start_us_ > opt_.own_gap_us)
      body.OwnGap(woke, woke - prev_pass_start_us_);
    HandleEvents(evs, n, &last_busy);
    uint64_t now = NowUs();
    if (now - woke > kSlowStepUs && now >= next_slow_log_us_) {
      next_slow_log_us_ = now + kSlowLogIntervalUs;
      log_("slow pass: %lu us handling %d socket events", (unsigned long)(now - woke), n);
    }
    if (prev_pass_end_us_ && woke - prev_pass_end_us_ > kNotScheduledSlackUs + opt_.heartbeat_us) {
      log_("not scheduled for %lu us", (unsigned long)(woke - prev_pass_end_us_));
    }
    PassReport pass = body.Pass(now);
    prev_pass_start_us_ = woke;
    prev_pass_end_us_ = pass.t_applied;
    if (pass.t_applied - now > kSlowStepUs && pass.t_applied >= next_slow_log_us_) {
      next_slow_log_us_ = pass.t_applied + kSlowLogIntervalUs;
      log_("slow pass: %lu us (polls %lu, submissions %lu, drain %lu, apply %lu)",
           (unsigned long)(pass.t_applied - now), (unsigned long)(pass.t_polled - now),
           (unsigned long)(pass.t_submitted - pass.t_polled),
           (unsigned long)(pass.t_drained - pass.t_submitted),
           (unsigned long)(pass.t_applied - pass.t_drained));
    }
    bool busy = pass.busy();
    if (opt_.verbose) CountPass(now, pass, may_sleep);
    if (busy) last_busy = now;
    may_sleep = false;
    if (busy || now - last_busy <= opt_.spin_us) {
      if (!busy) sched_yield();  // spinning: let the other replicas run
      continue;
    }
    if (body.IdleWork(now)) continue;
    may_sleep = body.PrepareSleep();
  }
}

void EventLoop::HandleEvents(const epoll_event* evs, int n, uint64_t* last_busy) {
  for (int i = 0; i < n; i++) {
    int fd = evs[i].data.fd;
    if (fd == sigfd_) {
      signalfd_siginfo si;
      while (read(sigfd_, &si, sizeof si) == sizeof si) {
        log_("signal %u: shutting down", si.ssi_signo);
        stopping_ = true;
      }
      continue;
    }
    auto it = handlers_.find(fd);
    if (it == handlers_.end() || !it->second) continue;
    Handler handler = it->second;  // a copy: the handler may Remove() its own fd
    if (handler(evs[i].events)) *last_busy = NowUs();
  }
}

void EventLoop::CountPass(uint64_t now, const PassReport& pass, bool slept) {
  stats_.passes++;
  stats_.progress += pass.progressed;
  stats_.memory += pass.polled;
  stats_.disk += pass.disk;
  stats_.drain += pass.drained;
  stats_.sleeps += slept;
  if (now < next_stats_us_) return;
  log_(
      "loop: %lu passes, progress %lu, memory %lu, disk %lu, drain %lu, sleeps %lu; "
      "%lu inline writes, mean %.1f us",
      (unsigned long)stats_.passes, (unsigned long)stats_.progress, (unsigned long)stats_.memory,
      (unsigned long)stats_.disk, (unsigned long)stats_.drain, (unsigned long)stats_.sleeps,
      (unsigned long)stats_.inline_writes,
      stats_.inline_writes ? stats_.inline_write_us_sum / stats_.inline_writes : 0.0);
  stats_ = Stats{};
  next_stats_us_ = now + kStatsIntervalUs;
}

}  // namespace lockstep
