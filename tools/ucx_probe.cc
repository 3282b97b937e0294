// ucx_probe — measures lockstep::UcxTransport between two processes (fork).
//
//   ucx_probe [shm|tcp|auto] [--iters N] [--target spin|sleep] [--child-ns net|ipc|pid|none]
//             [--sizes 64,4096] [--demo-unchecked-address] [--kill-after]
//   env: PROBE_FLUSH_SPIN_US, PROBE_DOORBELL_SPIN=1 (target polls during the doorbell
//        phase), PROBE_RING_LOOP=1, PROBE_COLD=1 (extra micro-measurements)
//
// Reports Put+Flush round latency (64 B and 4 KiB), Put alone, and the
// doorbell wake-up latency (target asleep in epoll on EventFd, source Rings,
// time until the target's handler runs; both sides read CLOCK_MONOTONIC).
//
// Build: g++ -std=c++20 -O2 -I. tools/ucx_probe.cc consensus/transport_ucx.cc
//          -o /tmp/ucx_probe -lucp -lucs -pthread
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "consensus/transport_ucx.h"

using lockstep::UcxTransport;

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

bool WriteAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= size_t(w);
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}
bool SendStr(int fd, const std::string& s) {
  uint64_t n = s.size();
  return WriteAll(fd, &n, 8) && WriteAll(fd, s.data(), s.size());
}
bool RecvStr(int fd, std::string* s) {
  uint64_t n;
  if (!ReadAll(fd, &n, 8) || n > (1u << 20)) return false;
  s->resize(n);
  return ReadAll(fd, s->data(), n);
}

// Shared between parent and child (MAP_SHARED, created before fork).
struct Shared {
  std::atomic<int> phase;         // 0 setup, 1 puts, 2 doorbells, 4 pipe baseline, 3 exit
  std::atomic<int> sleeping;      // target is (about to be) in epoll_wait
  std::atomic<uint64_t> handled;  // doorbells handled
  std::atomic<uint64_t> handler_ns;
  std::atomic<int> inner_pid;  // --child-ns pid: the target's pid as seen from here
};

constexpr size_t kRegion = 1 << 20;

// Memory of the target that was never given to UCX (for --demo-unchecked-address).
char g_unregistered[4096];

int Child(UcxTransport::Kind kind, int sock, Shared* sh, bool target_sleeps, const char* ns,
          int pipe_rd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // PROBE_DOORBELL_SPIN=1: the target polls (Progress in a loop) during the
  // doorbell phase instead of sleeping, to tell delivery from wake-up problems.
  const bool doorbell_spin = getenv("PROBE_DOORBELL_SPIN") != nullptr;
  if (std::strcmp(ns, "net") == 0 && unshare(CLONE_NEWNET) != 0) perror("unshare net");
  if (std::strcmp(ns, "ipc") == 0 && unshare(CLONE_NEWIPC) != 0) perror("unshare ipc");
  if (std::strcmp(ns, "pid") == 0) {
    if (unshare(CLONE_NEWPID) != 0) {
      perror("unshare pid");
    } else {
      pid_t inner = fork();  // becomes pid 1 of the new namespace
      if (inner > 0) {
        sh->inner_pid.store(inner);
        int st = 0;
        waitpid(inner, &st, 0);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
      }
      prctl(PR_SET_PDEATHSIG, SIGKILL);
    }
  }
  std::string err;
  auto t = UcxTransport::Create(kind, &err);
  if (!t) {
    fprintf(stderr, "child: %s\n", err.c_str());
    return 1;
  }
  auto* region = t->MapRegion(kRegion, &err);
  if (!region) {
    fprintf(stderr, "child: %s\n", err.c_str());
    return 1;
  }
  SendStr(sock, t->WorkerAddress());
  SendStr(sock, std::string(reinterpret_cast<char*>(&region->remote_addr), 8));
  SendStr(sock, region->packed_rkey);
  uint64_t unreg = reinterpret_cast<uint64_t>(g_unregistered);
  SendStr(sock, std::string(reinterpret_cast<char*>(&unreg), 8));
  t->SetDoorbellHandler([&](uint64_t) {
    sh->handler_ns.store(NowNs());
    sh->handled.fetch_add(1);
  });
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  epoll_ctl(ep, EPOLL_CTL_ADD, t->EventFd(), &ev);
  epoll_event pev{};
  pev.events = EPOLLIN;
  pev.data.u64 = 1;
  epoll_ctl(ep, EPOLL_CTL_ADD, pipe_rd, &pev);
  while (sh->phase.load() != 3) {
    if (sh->phase.load() == 5) {  // report whether the unregistered buffer was written
      t->Progress();
      if (std::memcmp(g_unregistered, "written-without-key", 19) == 0) sh->handled.store(1);
      continue;
    }
    if (sh->phase.load() == 4) {  // baseline: plain pipe wake-up, no UCX involved
      sh->sleeping.store(1);
      epoll_event out;
      int n = epoll_wait(ep, &out, 1, 100);
      sh->sleeping.store(0);
      char c;
      if (n == 1 && out.data.u64 == 1 && read(pipe_rd, &c, 1) == 1) {
        sh->handler_ns.store(NowNs());
        sh->handled.fetch_add(1);
      }
      continue;
    }
    bool sleep_now =
        (sh->phase.load() == 2 && !doorbell_spin) || (target_sleeps && sh->phase.load() == 1);
    if (t->Progress()) continue;
    if (sleep_now && t->Arm()) {
      sh->sleeping.store(1);
      epoll_event out;
      epoll_wait(ep, &out, 1, 100);
      sh->sleeping.store(0);
    }
  }
  close(ep);
  return 0;
}

void Report(const char* what, std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[std::min(v.size() - 1, size_t(p * v.size()))]; };
  double sum = 0;
  for (double x : v) sum += x;
  printf("  %-34s n=%-6zu p50 %8.2f us  p90 %8.2f  p99 %8.2f  p99.9 %8.2f  mean %8.2f\n", what,
         v.size(), pct(0.5), pct(0.9), pct(0.99), pct(0.999), sum / v.size());
}

}  // namespace

int main(int argc, char** argv) {
  UcxTransport::Kind kind = UcxTransport::Kind::kShm;
  const char* kind_name = "shm";
  int iters = 20000;
  bool target_sleeps = false;
  const char* ns = "none";
  bool demo_unchecked = false;
  bool kill_after = false;
  std::vector<size_t> sizes = {64, 4096};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "shm")
      kind = UcxTransport::Kind::kShm, kind_name = "shm";
    else if (a == "tcp")
      kind = UcxTransport::Kind::kTcp, kind_name = "tcp";
    else if (a == "auto")
      kind = UcxTransport::Kind::kAuto, kind_name = "auto";
    else if (a == "--iters" && i + 1 < argc)
      iters = atoi(argv[++i]);
    else if (a == "--target" && i + 1 < argc)
      target_sleeps = std::string(argv[++i]) == "sleep";
    else if (a == "--child-ns" && i + 1 < argc)
      ns = argv[++i];
    else if (a == "--demo-unchecked-address")
      demo_unchecked = true;
    else if (a == "--kill-after")
      kill_after = true;
    else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      for (char* tok = strtok(argv[++i], ","); tok; tok = strtok(nullptr, ","))
        sizes.push_back(strtoul(tok, nullptr, 0));
    } else {
      fprintf(stderr,
              "usage: %s [shm|tcp|auto] [--iters N] [--target spin|sleep] [--child-ns "
              "net|ipc|pid|none] [--sizes 64,4096] [--demo-unchecked-address] [--kill-after]\n",
              argv[0]);
      return 2;
    }
  }
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (sh) Shared{};
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    _exit(Child(kind, sv[1], sh, target_sleeps, ns, pp[0]));
  }
  close(sv[1]);
  int rc = 1;
  {
    std::string err, addr, raddr, rkey;
    UcxTransport::Options options;
    options.kind = kind;
    if (const char* spin = getenv("PROBE_FLUSH_SPIN_US")) options.flush_spin_us = atoi(spin);
    auto t = UcxTransport::Create(options, &err);
    if (!t) {
      fprintf(stderr, "parent: %s\n", err.c_str());
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return 1;
    }
    std::string unreg;
    if (!RecvStr(sv[0], &addr) || !RecvStr(sv[0], &raddr) || !RecvStr(sv[0], &rkey) ||
        !RecvStr(sv[0], &unreg)) {
      fprintf(stderr, "parent: child setup failed\n");
      waitpid(pid, nullptr, 0);
      return 1;
    }
    uint64_t remote_addr;
    std::memcpy(&remote_addr, raddr.data(), 8);
    t->SetPeerErrorHandler(
        [](int id, std::string m) { fprintf(stderr, "peer %d error: %s\n", id, m.c_str()); });
    int peer = t->Connect(addr, &err);
    int rid = peer < 0 ? -1 : t->AttachRemote(peer, remote_addr, rkey, kRegion, &err);
    if (rid >= 0 && demo_unchecked) {
      // Use region's rkey with an address outside the region (a buffer the
      // target never registered): does the target's UCX check it?
      uint64_t unreg_addr;
      std::memcpy(&unreg_addr, unreg.data(), 8);
      int bad = t->AttachRemote(peer, unreg_addr, rkey, 4096, &err);
      const char msg[] = "written-without-key";
      bool put_ok = bad >= 0 && t->Put(bad, 0, msg, sizeof msg, &err);
      bool flush_ok = put_ok && t->Flush(peer, 2000, &err);
      sh->phase.store(5);
      uint64_t start = NowNs();
      while (sh->handled.load() == 0 && NowNs() - start < 1000000000ull) t->Progress();
      printf("demo-unchecked-address kind=%s: put %s, flush %s, target buffer %s%s%s\n", kind_name,
             put_ok ? "ok" : "failed", flush_ok ? "ok" : "failed",
             sh->handled.load() == 1 ? "WRITTEN (no key check at the target)" : "untouched",
             err.empty() ? "" : "; error: ", err.c_str());
      sh->phase.store(3);
      t->Disconnect(peer);
      rc = 0;
    } else if (rid < 0) {
      fprintf(stderr, "parent: %s\n", err.c_str());
    } else {
      sh->phase.store(1);
      printf("ucx_probe kind=%s target=%s child-ns=%s iters=%d flush_spin_us=%d\n", kind_name,
             target_sleeps ? "sleeps-in-epoll" : "spins-in-Progress", ns, iters,
             options.flush_spin_us);
      std::vector<uint8_t> buf(*std::max_element(sizes.begin(), sizes.end()), 0xab);
      bool ok = true;
      for (size_t len : sizes) {
        auto before = t->stats();
        std::vector<double> round, put_only;
        round.reserve(iters);
        put_only.reserve(iters);
        for (int i = -1000; i < iters && ok; ++i) {  // first 1000: warm-up
          size_t off = (size_t(i + 1000) * len) % (kRegion - len);
          buf[0] = uint8_t(i);
          uint64_t t0 = NowNs();
          ok = t->Put(rid, off, buf.data(), len, &err);
          uint64_t t1 = NowNs();
          ok = ok && t->Flush(peer, 1000, &err);
          uint64_t t2 = NowNs();
          if (i >= 0) {
            put_only.push_back((t1 - t0) / 1000.0);
            round.push_back((t2 - t0) / 1000.0);
          }
        }
        if (!ok) {
          fprintf(stderr, "put/flush failed: %s\n", err.c_str());
          break;
        }
        char name[64];
        snprintf(name, sizeof name, "Put+Flush %zu B", len);
        Report(name, round);
        snprintf(name, sizeof name, "Put alone %zu B", len);
        Report(name, put_only);
        auto after = t->stats();
        printf("  %zu B puts: immediate %llu, copied %llu\n", len,
               (unsigned long long)(after.puts_immediate - before.puts_immediate),
               (unsigned long long)(after.puts_copied - before.puts_copied));
      }

      // Doorbell wake-up latency.
      sh->phase.store(2);
      std::vector<double> wake, ring_call;
      int n = std::min(iters / 10, 2000);
      for (int i = 0; i < n + 50 && ok; ++i) {
        // Wait until the target sleeps, then give it time to be really inside epoll_wait.
        uint64_t wait_start = NowNs();
        while (getenv("PROBE_DOORBELL_SPIN") == nullptr && sh->sleeping.load() == 0) {
          t->Progress();
          if (NowNs() - wait_start > 2000000000ull) {
            fprintf(stderr, "target never slept\n");
            ok = false;
            break;
          }
        }
        if (!ok) break;
        usleep(300);
        uint64_t before = sh->handled.load();
        uint64_t t0 = NowNs();
        ok = t->Ring(peer, uint64_t(i), &err);
        uint64_t t_ring = NowNs();
        while (ok && sh->handled.load() == before) {
          t->Progress();
          if (NowNs() - t0 > 2000000000ull) {
            err = "doorbell not handled within 2 s";
            ok = false;
          }
        }
        if (!ok) {
          fprintf(stderr, "doorbell: %s\n", err.c_str());
          break;
        }
        if (i >= 50) {
          wake.push_back((sh->handler_ns.load() - t0) / 1000.0);
          ring_call.push_back((t_ring - t0) / 1000.0);
        }
      }
      if (ok) Report("doorbell wake-up (target in epoll)", wake);
      if (ok) Report("  of which Ring() call", ring_call);
      if (ok && getenv("PROBE_COLD")) {
        std::vector<double> cold_put, cold_now;
        uint8_t b[64] = {1};
        for (int i = 0; i < 500 && ok; ++i) {
          usleep(300);
          uint64_t a = NowNs();
          uint64_t a2 = NowNs();
          ok = t->Put(rid, 0, b, 64, &err);
          uint64_t c = NowNs();
          cold_put.push_back((c - a2) / 1000.0);
          cold_now.push_back((a2 - a) / 1000.0);
        }
        Report("Put 64 B after 300 us idle", cold_put);
        Report("clock_gettime after 300 us idle", cold_now);
      }
      if (ok && getenv("PROBE_RING_LOOP")) {
        std::vector<double> loop;
        for (int i = 0; i < 2000 && ok; ++i) {
          uint64_t a = NowNs();
          ok = t->Ring(peer, 1, &err);
          uint64_t b = NowNs();
          t->Progress();
          loop.push_back((b - a) / 1000.0);
        }
        Report("Ring() back-to-back", loop);
      }
      // Baseline: the same wake-up through a pipe, without UCX.
      if (ok) {
        sh->phase.store(4);
        std::vector<double> base;
        for (int i = 0; i < n + 50; ++i) {
          while (sh->sleeping.load() == 0) {
          }
          usleep(300);
          uint64_t before = sh->handled.load();
          uint64_t t0 = NowNs();
          if (write(pp[1], "x", 1) != 1) break;
          while (sh->handled.load() == before) {
          }
          if (i >= 50) base.push_back((sh->handler_ns.load() - t0) / 1000.0);
        }
        Report("baseline pipe wake-up (no UCX)", base);
      }
      if (ok) printf("  endpoint:\n%s", t->DescribePeer(peer).c_str());
      rc = ok ? 0 : 1;
      if (ok && kill_after) {
        // SIGKILL the target, reap it, and time how long until the transport
        // reports the peer dead while we keep putting and progressing.
        pid_t victim = sh->inner_pid.load() > 0 ? sh->inner_pid.load() : pid;
        kill(victim, SIGKILL);
        if (victim == pid) waitpid(pid, nullptr, 0);
        uint64_t t0 = NowNs();
        uint8_t b[64] = {0};
        std::string perr;
        while (t->PeerAlive(peer) && NowNs() - t0 < 5000000000ull) {
          t->Put(rid, 0, b, sizeof b, &perr);
          t->Progress();
          usleep(100);
        }
        if (t->PeerAlive(peer)) {
          printf("  peer death NOT detected within 5 s\n");
        } else {
          printf("  peer death detected after %.1f ms: %s\n", (NowNs() - t0) / 1e6, perr.c_str());
        }
      }
      t->Disconnect(peer);
    }
    sh->phase.store(3);
  }
  int status = 0;
  if (kill_after) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return rc;
  }
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "child exit status %d\n", status);
    rc = 1;
  }
  return rc;
}
