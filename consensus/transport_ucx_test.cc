// Tests for UcxTransport. Each test forks a child that plays the peer; the two
// exchange worker addresses and rkeys over a socketpair. The gtest process
// creates its own transport only after fork (UCX state is not fork-safe).
#include "consensus/transport_ucx.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace lockstep {
namespace {

using Kind = UcxTransport::Kind;
using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// The process (its main thread) sleeps in epoll_wait or epoll_pwait with no
// timeout: /proc/PID/syscall names the call it is blocked in and its
// arguments ("running" while it runs).
bool SleepsInEpollWait(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/syscall");
  long nr = -1;
  std::string epfd, events, maxevents, timeout;
  if (!(f >> nr >> epfd >> events >> maxevents >> timeout)) return false;
  if (nr != SYS_epoll_wait && nr != SYS_epoll_pwait) return false;
  return static_cast<int32_t>(std::stoull(timeout, nullptr, 16)) == -1;
}

// ---------------------------------------------------------------- framing

bool WriteAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes or fails after timeout_ms (never hangs on a dead child).
bool ReadAll(int fd, void* p, size_t n, int timeout_ms) {
  auto* c = static_cast<char*>(p);
  auto start = Clock::now();
  while (n > 0) {
    int left = timeout_ms - static_cast<int>(MsSince(start));
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, left) <= 0) continue;
    ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool Send(int fd, const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return WriteAll(fd, &n, sizeof n) && WriteAll(fd, s.data(), s.size());
}

bool Recv(int fd, std::string* s, int timeout_ms = 10000) {
  uint32_t n = 0;
  if (!ReadAll(fd, &n, sizeof n, timeout_ms) || n > (1u << 20)) return false;
  s->resize(n);
  return ReadAll(fd, s->data(), n, timeout_ms);
}

std::string U64(uint64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}
uint64_t FromU64(const std::string& s) {
  uint64_t v = 0;
  std::memcpy(&v, s.data(), std::min<size_t>(8, s.size()));
  return v;
}

// ---------------------------------------------------------------- child process

// A forked peer. The child runs fn(fd) and exits with its return value; it
// dies with the parent (PDEATHSIG) and after 60 s at most (alarm). The
// destructor kills and reaps it if it is still there.
class Child {
 public:
  explicit Child(const std::function<int(int fd)>& fn) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(sv[0]);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      alarm(60);
      int rc = fn(sv[1]);
      _exit(rc);
    }
    close(sv[1]);
    fd_ = sv[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }
  pid_t pid() const { return pid_; }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);  // reap: a zombie still "exists" for a pid check
      pid_ = -1;
    }
  }
  // Waits for a normal exit; returns the exit code or -1.
  int Wait(int timeout_ms = 10000) {
    auto start = Clock::now();
    while (pid_ > 0 && MsSince(start) < timeout_ms) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      usleep(1000);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

// Child side: creates a transport and a region, sends (worker address,
// remote addr, rkey, region size) to the parent.
struct Target {
  std::unique_ptr<UcxTransport> t;
  UcxTransport::LocalRegion* region = nullptr;
  int epfd = -1;

  bool Start(Kind kind, size_t size, int fd) {
    std::string err;
    t = UcxTransport::Create(kind, &err);
    if (!t) {
      Send(fd, "ERR " + err);
      return false;
    }
    region = t->MapRegion(size, &err);
    if (region == nullptr) {
      Send(fd, "ERR " + err);
      return false;
    }
    epfd = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    epoll_ctl(epfd, EPOLL_CTL_ADD, t->EventFd(), &ev);
    return Send(fd, t->WorkerAddress()) && Send(fd, U64(region->remote_addr)) &&
           Send(fd, region->packed_rkey) && Send(fd, U64(region->size));
  }
  // Progress, then sleep on the event fd for at most timeout_ms when idle.
  void Step(int timeout_ms) {
    if (t->Progress()) return;
    if (t->Arm()) {
      epoll_event out;
      epoll_wait(epfd, &out, 1, timeout_ms);
    }
  }
  ~Target() {
    if (epfd >= 0) close(epfd);
  }
};

// Parent side: the connection to a Target.
struct Source {
  std::unique_ptr<UcxTransport> t;
  UcxTransport::PeerId peer = -1;
  UcxTransport::RemoteId remote = -1;
  size_t size = 0;

  // Returns "" on success, else an error.
  std::string Start(Kind kind, int fd) {
    std::string err, addr, raddr, rkey, rsize;
    t = UcxTransport::Create(kind, &err);
    if (!t) return "Create: " + err;
    if (!Recv(fd, &addr)) return "no address from child";
    if (addr.rfind("ERR ", 0) == 0) return "child: " + addr;
    if (!Recv(fd, &raddr) || !Recv(fd, &rkey) || !Recv(fd, &rsize)) return "child setup failed";
    size = FromU64(rsize);
    peer = t->Connect(addr, &err);
    if (peer < 0) return "Connect: " + err;
    remote = t->AttachRemote(peer, FromU64(raddr), rkey, size, &err);
    if (remote < 0) return "AttachRemote: " + err;
    return "";
  }
};

std::vector<uint8_t> Pattern(size_t len, uint8_t seed) {
  std::vector<uint8_t> v(len);
  for (size_t i = 0; i < len; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

class UcxTransportTest : public ::testing::TestWithParam<Kind> {};

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kShm: return "Shm";
    case Kind::kTcp: return "Tcp";
    case Kind::kAuto: return "Auto";
  }
  return "Unknown";
}

// ---------------------------------------------------------------- tests

// A put becomes visible in the target's memory. Over shm the target never
// calls Progress (it only polls memory); over tcp it sleeps on its event fd
// and progresses when woken.
TEST_P(UcxTransportTest, PutVisibleInTargetMemory) {
  const Kind kind = GetParam();
  constexpr size_t kOffset = 4096 + 7;
  constexpr size_t kLen = 3000;  // > 127 bytes: exercises the copy path too
  const auto small = Pattern(64, 11);
  const auto big = Pattern(kLen, 42);

  Child child([&](int fd) {
    Target target;
    if (!target.Start(kind, 64 * 1024, fd)) return 1;
    auto seen = [&] {
      return std::memcmp(target.region->base + kOffset, big.data(), kLen) == 0 &&
             std::memcmp(target.region->base, small.data(), small.size()) == 0;
    };
    auto start = Clock::now();
    while (!seen()) {
      if (MsSince(start) > 20000) {
        Send(fd, "timeout");
        return 2;
      }
      if (kind == Kind::kShm) {
        // No UCX call at all: the put must land by itself.
        usleep(100);
      } else {
        target.Step(100);
      }
    }
    Send(fd, "seen");
    std::string bye;
    // Keep the worker alive (and progressing, for tcp) until the parent is done.
    while (true) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 0) > 0) break;
      if (kind == Kind::kShm)
        usleep(1000);
      else
        target.Step(10);
    }
    return 0;
  });
  ASSERT_GT(child.pid(), 0);

  Source src;
  std::string setup = src.Start(kind, child.fd());
  ASSERT_EQ(setup, "");
  std::string err;
  ASSERT_TRUE(src.t->Put(src.remote, kOffset, big.data(), kLen, &err)) << err;
  ASSERT_TRUE(src.t->Put(src.remote, 0, small.data(), small.size(), &err)) << err;
  ASSERT_TRUE(src.t->Flush(src.peer, 10000, &err)) << err;

  // Wait for the child's verdict while progressing our side.
  std::string verdict;
  auto start = Clock::now();
  while (MsSince(start) < 25000) {
    src.t->Progress();
    pollfd pfd{child.fd(), POLLIN, 0};
    if (poll(&pfd, 1, 1) > 0) {
      ASSERT_TRUE(Recv(child.fd(), &verdict));
      break;
    }
  }
  EXPECT_EQ(verdict, "seen");
  auto stats = src.t->stats();
  EXPECT_EQ(stats.puts_immediate + stats.puts_copied, 2u);
  src.t->Disconnect(src.peer);
  Send(child.fd(), "bye");
  EXPECT_EQ(child.Wait(), 0);
}

// The target sleeps in epoll_wait(EventFd(), infinite); a Ring must wake it
// and deliver the tag to the doorbell handler.
TEST_P(UcxTransportTest, DoorbellWakesSleepingPeer) {
  const Kind kind = GetParam();
  Child child([&](int fd) {
    Target target;
    if (!target.Start(kind, 4096, fd)) return 1;
    uint64_t got = 0;
    target.t->SetDoorbellHandler([&](uint64_t tag) { got = tag; });
    Send(fd, "ready");
    int sleeps = 0;
    while (got == 0) {
      if (target.t->Progress()) continue;
      if (target.t->Arm()) {
        ++sleeps;
        epoll_event out;
        epoll_wait(target.epfd, &out, 1, -1);  // only the event fd can wake us
      }
    }
    Send(fd, "tag " + std::to_string(got) + " sleeps " + std::to_string(sleeps));
    std::string bye;
    while (!Recv(fd, &bye, 100)) target.t->Progress();
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  Source src;
  ASSERT_EQ(src.Start(kind, child.fd()), "");
  std::string ready;
  ASSERT_TRUE(Recv(child.fd(), &ready));
  ASSERT_EQ(ready, "ready");
  // Until the child sleeps (its loop arms the worker, then waits for ever).
  for (auto asleep = Clock::now(); !SleepsInEpollWait(child.pid()); usleep(1000))
    ASSERT_LT(MsSince(asleep), 30000) << "the child never fell asleep in epoll_wait";

  std::string err;
  ASSERT_TRUE(src.t->Ring(src.peer, 0xfeedbeef12345ull, &err)) << err;
  std::string reply;
  auto start = Clock::now();
  while (MsSince(start) < 10000) {
    src.t->Progress();
    pollfd pfd{child.fd(), POLLIN, 0};
    if (poll(&pfd, 1, 0) > 0) {
      ASSERT_TRUE(Recv(child.fd(), &reply));
      break;
    }
  }
  EXPECT_EQ(reply.substr(0, reply.find(" sleeps")), "tag " + std::to_string(0xfeedbeef12345ull));
  EXPECT_NE(reply.find(" sleeps "), std::string::npos);
  EXPECT_NE(reply, reply.substr(0, reply.find(" sleeps ")) + " sleeps 0") << "child never slept";
  src.t->Disconnect(src.peer);
  Send(child.fd(), "bye");
  EXPECT_EQ(child.Wait(), 0);
}

// Doorbell ping-pong where each side rings back from inside its doorbell
// handler (and the child even calls Progress there): handlers may re-enter
// the transport.
TEST_P(UcxTransportTest, DoorbellPingPongFromHandlers) {
  const Kind kind = GetParam();
  constexpr uint64_t kLast = 200;
  Child child([&](int fd) {
    Target target;
    if (!target.Start(kind, 4096, fd)) return 1;
    std::string parent_addr, err;
    if (!Recv(fd, &parent_addr)) return 2;
    auto peer = target.t->Connect(parent_addr, &err);
    if (peer < 0) return 3;
    uint64_t last = 0;
    bool ring_failed = false;
    target.t->SetDoorbellHandler([&](uint64_t tag) {
      last = tag;
      std::string e;
      if (!target.t->Ring(peer, tag + 1, &e)) ring_failed = true;
      target.t->Progress();  // nested: must not deliver recursively
    });
    auto start = Clock::now();
    while (last + 1 < kLast && !ring_failed && MsSince(start) < 20000) target.Step(10);
    std::string bye;
    while (!Recv(fd, &bye, 10)) target.t->Progress();
    target.t->Disconnect(peer);
    return (last + 1 >= kLast && !ring_failed) ? 0 : 4;
  });
  ASSERT_GT(child.pid(), 0);
  Source src;
  ASSERT_EQ(src.Start(kind, child.fd()), "");
  ASSERT_TRUE(Send(child.fd(), src.t->WorkerAddress()));
  uint64_t last = 0;
  int calls = 0;
  src.t->SetDoorbellHandler([&](uint64_t tag) {
    ++calls;
    last = tag;
    std::string e;
    if (tag < kLast) {
      EXPECT_TRUE(src.t->Ring(src.peer, tag + 1, &e)) << e;
    }
  });
  std::string err;
  ASSERT_TRUE(src.t->Ring(src.peer, 1, &err)) << err;
  auto start = Clock::now();
  while (last < kLast && MsSince(start) < 20000) src.t->Progress();
  int64_t ms = MsSince(start);
  EXPECT_EQ(last, kLast);
  EXPECT_EQ(calls, static_cast<int>(kLast / 2));
  std::printf("[          ] %s: %llu doorbell round trips in %lld ms\n",
              kind == Kind::kShm ? "shm" : "tcp", static_cast<unsigned long long>(kLast / 2),
              static_cast<long long>(ms));
  src.t->Disconnect(src.peer);  // before the child exits: no reconnect attempts to a gone peer
  Send(child.fd(), "bye");
  int rc = -1;
  auto wait_start = Clock::now();
  while (child.pid() > 0 && MsSince(wait_start) < 10000) {
    rc = child.Wait(1);
    src.t->Progress();  // the child's own Disconnect flushes towards us
  }
  EXPECT_EQ(rc, 0);
}

// SIGKILL the target. Puts must start failing or the error handler must fire
// within a bounded time, and nothing (Put, Flush, Ring, Disconnect,
// destruction) may hang.
TEST_P(UcxTransportTest, KilledPeerReportsErrorWithoutHanging) {
  const Kind kind = GetParam();
  Child child([&](int fd) {
    Target target;
    if (!target.Start(kind, 64 * 1024, fd)) return 1;
    while (true) target.Step(10);  // until killed
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  Source src;
  ASSERT_EQ(src.Start(kind, child.fd()), "");

  int errors = 0;
  std::string error_message;
  src.t->SetPeerErrorHandler([&](UcxTransport::PeerId id, std::string message) {
    EXPECT_EQ(id, src.peer);
    ++errors;
    error_message = std::move(message);
  });

  std::string err;
  auto data = Pattern(256, 3);
  ASSERT_TRUE(src.t->Put(src.remote, 0, data.data(), data.size(), &err)) << err;
  ASSERT_TRUE(src.t->Flush(src.peer, 10000, &err)) << err;
  EXPECT_TRUE(src.t->PeerAlive(src.peer));

  child.Kill();
  auto killed = Clock::now();
  bool put_failed = false;
  std::string put_error;
  size_t i = 0;
  // Keep writing (as a leader would) and progressing until the death is seen.
  while (MsSince(killed) < 30000 && !(put_failed && errors > 0)) {
    if (!put_failed) {
      size_t len = (i % 2) ? 64 : 4096;
      if (!src.t->Put(src.remote, (i * 64) % (src.size - 4096), data.data(),
                      std::min(len, data.size()), &put_error)) {
        put_failed = true;
      }
      ++i;
    }
    src.t->Progress();
    usleep(200);
  }
  int64_t detect_ms = MsSince(killed);
  EXPECT_TRUE(put_failed) << "puts kept succeeding for " << detect_ms << " ms";
  EXPECT_EQ(errors, 1) << "error handler calls";
  // Found by our keepalive (every 100 ms), not UCX's default one (20 s).
  EXPECT_LT(detect_ms, 10000) << "not by the transport's own keepalive";
  EXPECT_FALSE(src.t->PeerAlive(src.peer));
  std::printf("[          ] %s: peer death seen after %lld ms (%zu puts); error: %s; put: %s\n",
              kind == Kind::kShm ? "shm" : "tcp", static_cast<long long>(detect_ms), i,
              error_message.c_str(), put_error.c_str());

  // None of these waits on the dead peer: the Flush does not wait out its
  // 20 s timeout (Disconnect's own close waits at most 1 s).
  auto t0 = Clock::now();
  EXPECT_FALSE(src.t->Flush(src.peer, 20000, &err));
  EXPECT_FALSE(src.t->Ring(src.peer, 1, &err));
  EXPECT_FALSE(src.t->Put(src.remote, 0, data.data(), 8, &err));
  src.t->Disconnect(src.peer);
  src.t.reset();
  EXPECT_LT(MsSince(t0), 10000) << "Flush/Ring/Put/Disconnect/destroy after peer death";
}

// A peer that is alive but not running (SIGSTOP: a descheduled or paused
// backup) must not be declared dead by keepalive; a Flush that cannot finish
// times out without breaking the endpoint; after SIGCONT everything lands.
TEST_P(UcxTransportTest, StoppedPeerIsNotDeclaredDead) {
  const Kind kind = GetParam();
  constexpr size_t kLen = 4096;
  constexpr int kPuts = 64;
  const auto data = Pattern(kLen * kPuts, 5);
  Child child([&](int fd) {
    Target target;
    if (!target.Start(kind, kLen * kPuts, fd)) return 1;
    std::string go;
    while (!Recv(fd, &go, 1)) target.Step(1);  // "check"
    bool ok = std::memcmp(target.region->base, data.data(), data.size()) == 0;
    Send(fd, ok ? "match" : "mismatch");
    std::string bye;
    while (!Recv(fd, &bye, 10)) target.t->Progress();
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  Source src;
  ASSERT_EQ(src.Start(kind, child.fd()), "");
  int errors = 0;
  src.t->SetPeerErrorHandler([&](UcxTransport::PeerId, std::string) { ++errors; });
  std::string err;
  ASSERT_TRUE(src.t->Flush(src.peer, 10000, &err)) << err;  // wire up while it runs

  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  auto stopped = Clock::now();
  for (int i = 0; i < kPuts; ++i) {
    ASSERT_TRUE(
        src.t->Put(src.remote, size_t(i) * kLen, data.data() + size_t(i) * kLen, kLen, &err))
        << err;
  }
  bool flushed_while_stopped = src.t->Flush(src.peer, 300, &err);
  if (kind == Kind::kTcp) {
    EXPECT_FALSE(flushed_while_stopped) << "tcp puts cannot complete while the target is stopped";
  }
  while (MsSince(stopped) < 1500) {  // 15 keepalive intervals
    src.t->Progress();
    usleep(1000);
  }
  EXPECT_EQ(errors, 0);
  EXPECT_TRUE(src.t->PeerAlive(src.peer));
  ASSERT_EQ(kill(child.pid(), SIGCONT), 0);
  ASSERT_TRUE(src.t->Flush(src.peer, 10000, &err)) << err;
  EXPECT_EQ(src.t->stats().puts_pending, 0u);
  ASSERT_TRUE(Send(child.fd(), "check"));
  std::string verdict;
  auto start = Clock::now();
  while (MsSince(start) < 10000) {
    src.t->Progress();
    pollfd pfd{child.fd(), POLLIN, 0};
    if (poll(&pfd, 1, 1) > 0) {
      ASSERT_TRUE(Recv(child.fd(), &verdict));
      break;
    }
  }
  EXPECT_EQ(verdict, "match");
  src.t->Disconnect(src.peer);
  Send(child.fd(), "bye");
  EXPECT_EQ(child.Wait(), 0);
}

// A peer killed while we never call Flush: the put path alone (plus
// Progress) must surface the failure, and Disconnect must not block even
// with copied puts still queued.
TEST_P(UcxTransportTest, DisconnectDeadPeerWithPendingPutsIsBounded) {
  const Kind kind = GetParam();
  Child child([&](int fd) {
    Target target;
    if (!target.Start(kind, 8 << 20, fd)) return 1;
    while (true) target.Step(10);
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  Source src;
  ASSERT_EQ(src.Start(kind, child.fd()), "");
  std::string err;
  ASSERT_TRUE(src.t->Flush(src.peer, 10000, &err)) << err;  // wire up first
  child.Kill();
  auto data = Pattern(64 * 1024, 9);
  auto t0 = Clock::now();
  for (size_t off = 0; off + data.size() <= src.size; off += data.size()) {
    if (!src.t->Put(src.remote, off, data.data(), data.size(), &err)) break;
  }
  src.t->Disconnect(src.peer, /*flush_timeout_ms=*/500);
  src.t.reset();
  // Bounded by the flush's 500 ms and the close's 1 s, not by a wait for UCX
  // to notice the death (its default keepalive is 20 s).
  EXPECT_LT(MsSince(t0), 15000);
}

// Many puts of mixed sizes without flushing in between, then one flush: the
// target sees every byte. Exercises copied puts that stay in flight over tcp.
TEST_P(UcxTransportTest, BurstOfPutsAllLand) {
  const Kind kind = GetParam();
  constexpr size_t kRegion = 4 << 20;
  const size_t sizes[] = {8, 64, 127, 128, 1000, 4096, 65536};
  // Layout: sequential, each put at the next offset.
  std::vector<std::pair<size_t, size_t>> puts;  // offset, len
  size_t off = 0;
  for (int round = 0; off < kRegion; ++round) {
    size_t len = sizes[round % 7];
    if (off + len > kRegion) break;
    puts.emplace_back(off, len);
    off += len;
  }
  const auto expect = Pattern(off, 77);

  Child child([&](int fd) {
    Target target;
    if (!target.Start(kind, kRegion, fd)) return 1;
    std::string go;
    while (!Recv(fd, &go, 1)) target.Step(1);  // "flushed"
    bool ok = std::memcmp(target.region->base, expect.data(), expect.size()) == 0;
    Send(fd, ok ? "match" : "mismatch");
    std::string bye;
    while (!Recv(fd, &bye, 10)) target.t->Progress();
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  Source src;
  ASSERT_EQ(src.Start(kind, child.fd()), "");
  std::string err;
  for (auto [o, l] : puts) {
    ASSERT_TRUE(src.t->Put(src.remote, o, expect.data() + o, l, &err)) << err;
  }
  ASSERT_TRUE(src.t->Flush(src.peer, 20000, &err)) << err;
  EXPECT_EQ(src.t->stats().puts_pending, 0u);
  ASSERT_TRUE(Send(child.fd(), "flushed"));
  std::string verdict;
  auto start = Clock::now();
  while (MsSince(start) < 10000) {
    src.t->Progress();
    pollfd pfd{child.fd(), POLLIN, 0};
    if (poll(&pfd, 1, 1) > 0) {
      ASSERT_TRUE(Recv(child.fd(), &verdict));
      break;
    }
  }
  EXPECT_EQ(verdict, "match");
  src.t->Disconnect(src.peer);
  Send(child.fd(), "bye");
  EXPECT_EQ(child.Wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, UcxTransportTest, ::testing::Values(Kind::kShm, Kind::kTcp),
                         KindName);

// Over tcp a stalled target makes copied puts pile up in the transport; they
// are bounded by max_pending_bytes_per_peer, after which Put refuses.
TEST(UcxTransportTcpTest, BackpressureWhenPeerStalls) {
  constexpr size_t kRegion = 64 << 20;
  constexpr size_t kLen = 64 << 10;
  Child child([&](int fd) {
    Target target;
    if (!target.Start(Kind::kTcp, kRegion, fd)) return 1;
    while (true) target.Step(10);
    return 0;
  });
  ASSERT_GT(child.pid(), 0);
  Source src;
  UcxTransport::Options options;
  options.kind = Kind::kTcp;
  options.max_pending_bytes_per_peer = 1 << 20;
  std::string err;
  // Source::Start creates a default transport; build this one by hand.
  src.t = UcxTransport::Create(options, &err);
  ASSERT_TRUE(src.t) << err;
  std::string addr, raddr, rkey, rsize;
  ASSERT_TRUE(Recv(child.fd(), &addr) && Recv(child.fd(), &raddr) && Recv(child.fd(), &rkey) &&
              Recv(child.fd(), &rsize));
  src.peer = src.t->Connect(addr, &err);
  ASSERT_GE(src.peer, 0) << err;
  src.remote = src.t->AttachRemote(src.peer, FromU64(raddr), rkey, FromU64(rsize), &err);
  ASSERT_GE(src.remote, 0) << err;
  ASSERT_TRUE(src.t->Flush(src.peer, 10000, &err)) << err;

  ASSERT_EQ(kill(child.pid(), SIGSTOP), 0);
  auto data = Pattern(kLen, 1);
  size_t accepted = 0;
  bool refused = false;
  for (size_t off = 0; off + kLen <= kRegion; off += kLen) {
    if (!src.t->Put(src.remote, off, data.data(), kLen, &err)) {
      refused = true;
      break;
    }
    accepted += kLen;
  }
  EXPECT_TRUE(refused) << "accepted " << accepted << " bytes into a stopped peer";
  EXPECT_NE(err.find("in flight"), std::string::npos) << err;
  EXPECT_TRUE(src.t->PeerAlive(src.peer));
  std::printf("[          ] stopped tcp peer: %zu KiB accepted before backpressure\n",
              accepted >> 10);
  kill(child.pid(), SIGCONT);
  EXPECT_TRUE(src.t->Flush(src.peer, 10000, &err)) << err;
  EXPECT_EQ(src.t->stats().puts_pending, 0u);
  EXPECT_TRUE(src.t->Put(src.remote, 0, data.data(), kLen, &err)) << err;
  src.t->Disconnect(src.peer);
}

// Range checks need no second process: connect the transport to itself.
TEST(UcxTransportLocalTest, OutOfRangeRejected) {
  std::string err;
  auto t = UcxTransport::Create(Kind::kShm, &err);
  ASSERT_TRUE(t) << err;
  auto* region = t->MapRegion(5000, &err);
  ASSERT_NE(region, nullptr) << err;
  EXPECT_EQ(region->size, 8192u);  // rounded up to pages
  EXPECT_EQ(reinterpret_cast<uintptr_t>(region->base) % 4096, 0u);
  for (size_t i = 0; i < region->size; ++i) ASSERT_EQ(region->base[i], 0) << i;

  auto peer = t->Connect(t->WorkerAddress(), &err);
  ASSERT_GE(peer, 0) << err;
  auto rid = t->AttachRemote(peer, region->remote_addr, region->packed_rkey, region->size, &err);
  ASSERT_GE(rid, 0) << err;

  std::vector<uint8_t> buf(region->size + 16, 0x5a);
  err.clear();
  EXPECT_FALSE(t->Put(rid, region->size - 8, buf.data(), 16, &err));
  EXPECT_NE(err.find("outside"), std::string::npos) << err;
  EXPECT_FALSE(t->Put(rid, region->size, buf.data(), 1, &err));
  EXPECT_FALSE(t->Put(rid, region->size + 1, buf.data(), 0, &err));
  EXPECT_FALSE(t->Put(rid, SIZE_MAX, buf.data(), 2, &err));  // offset + len overflows
  EXPECT_FALSE(t->Put(rid, 8, buf.data(), SIZE_MAX - 4, &err));
  EXPECT_FALSE(t->Put(rid, 0, buf.data(), region->size + 1, &err));
  EXPECT_FALSE(t->Put(rid + 100, 0, buf.data(), 1, &err));
  EXPECT_FALSE(t->Put(-1, 0, buf.data(), 1, &err));
  // Nothing was written by the rejected puts.
  for (size_t i = 0; i < region->size; ++i) ASSERT_EQ(region->base[i], 0) << i;

  // In-range edges work (loopback through UCX).
  EXPECT_TRUE(t->Put(rid, region->size - 16, buf.data(), 16, &err)) << err;
  EXPECT_TRUE(t->Put(rid, 0, buf.data(), 1, &err)) << err;
  EXPECT_TRUE(t->Put(rid, 100, buf.data(), 0, &err)) << err;
  ASSERT_TRUE(t->Flush(peer, 5000, &err)) << err;
  EXPECT_EQ(region->base[0], 0x5a);
  EXPECT_EQ(region->base[1], 0);
  EXPECT_EQ(region->base[region->size - 1], 0x5a);
  EXPECT_EQ(region->base[region->size - 17], 0);

  // A detached remote is rejected.
  t->DetachRemote(rid);
  EXPECT_FALSE(t->Put(rid, 0, buf.data(), 1, &err));
  t->Disconnect(peer);
  EXPECT_FALSE(t->Ring(peer, 1, &err));
  t->UnmapRegion(region);
}

TEST(UcxTransportLocalTest, BadInputsFailCleanly) {
  std::string err;
  auto t = UcxTransport::Create(Kind::kTcp, &err);
  ASSERT_TRUE(t) << err;
  EXPECT_EQ(t->Connect("", &err), -1);
  EXPECT_EQ(t->MapRegion(0, &err), nullptr);
  EXPECT_EQ(t->AttachRemote(7, 0, "x", 1, &err), -1);
  EXPECT_FALSE(t->Flush(3, 10, &err));
  EXPECT_GE(t->EventFd(), 0);
  EXPECT_FALSE(t->WorkerAddress().empty());
}

}  // namespace
}  // namespace lockstep
