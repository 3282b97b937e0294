// state_check.cc — see state_check.h.
#include "guard/server/state_check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "checkpoint/spawn.h"
#include "guard/common/command_line.h"
#include "guard/common/json.h"
#include "guard/server/server.h"

namespace lockstep {

namespace {
// A probe that has not answered by then is killed and counted as failed
// (a server busy with a long command answers it late on every replica
// alike: nothing is lost by giving up on the leader's copy).
constexpr int kProbeTimeoutMs = 20000;
constexpr size_t kMaxOutput = 4096;  // what is kept of its output

uint64_t SteadyUs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// A TCP socket bound to host:0 (-1 on failure); *port: the port it got.
int BoundSocket(const std::string& host, uint16_t* port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// Carries bytes both ways between the probe (`probe`) and the server
// (`server`) until both have closed, or the deadline; half-closes follow.
void Relay(int probe, int server, uint64_t deadline_us) {
  bool open[2] = {true, true};  // probe -> server, server -> probe
  int from[2] = {probe, server}, to[2] = {server, probe};
  char buf[16384];
  while ((open[0] || open[1]) && SteadyUs() < deadline_us) {
    pollfd p[2] = {{probe, static_cast<short>(open[0] ? POLLIN : 0), 0},
                   {server, static_cast<short>(open[1] ? POLLIN : 0), 0}};
    if (poll(p, 2, 100) <= 0) continue;
    for (int d = 0; d < 2; d++) {
      if (!open[d] || !(p[d].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(from[d], buf, sizeof buf);
      if (n <= 0) {
        open[d] = false;
        shutdown(to[d], SHUT_WR);
        continue;
      }
      for (ssize_t off = 0; off < n;) {
        ssize_t w = write(to[d], buf + off, static_cast<size_t>(n - off));
        if (w <= 0) {
          open[0] = open[1] = false;
          break;
        }
        off += w;
      }
    }
  }
}
}  // namespace

StateChecker::StateChecker(const ClusterConfig& config, const ReplicaConfig& me, LogFn log)
    : cfg_(config),
      me_(me),
      log_(std::move(log)),
      every_us_(config.server.state_check_every_s * 1000000) {}

StateChecker::~StateChecker() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void StateChecker::Step(uint64_t now_us, bool serving, uint64_t client_inputs) {
  if (thread_.joinable()) {
    if (!done_.load()) return;
    thread_.join();
    checks_++;
    last_ms_ = result_us_ / 1000;
    if (result_ok_) {
      digest_ = result_output_;
      error_.clear();
      mid_pass_ = result_slice_;
      if (!mid_pass_) passes_++;
      retry_ = false;
    } else {
      // It checked nothing: due again at the next interval, the pass where
      // it was (redis's cursor moves only after a slice was digested).
      retry_ = true;
      failed_++;
      if (result_error_ != error_)  // said once, not at every interval
        log_("STATE CHECK FAILED: the state probe (" + cfg_.server.state_probe +
             ") against this leader's server: " + result_error_);
      error_ = result_error_;
      last_failure_ = result_error_;
    }
  }
  if (!serving) return;
  if (started_once_ && now_us - last_start_us_ < every_us_) return;
  // Nothing new to check: the last pass finished and began after every
  // client's input so far.
  if (started_once_ && !mid_pass_ && !retry_ && client_inputs == inputs_at_pass_start_) return;
  std::vector<std::string> argv;
  std::string err;
  if (!SplitCommand(cfg_.server.state_probe, &argv, &err) || argv.empty()) {
    error_ = "state_probe: " + (argv.empty() && err.empty() ? std::string("is empty") : err);
    return;
  }
  started_once_ = true;
  last_start_us_ = now_us;
  // A pass begins: what clients sent from here on makes the next pass due,
  // also what they send while this one runs (client_inputs counts no
  // probe's).
  if (!mid_pass_) inputs_at_pass_start_ = client_inputs;
  done_ = false;
  probe_port_ = 0;
  thread_ = std::thread([this, argv = std::move(argv)]() mutable { Run(std::move(argv)); });
}

void StateChecker::Run(std::vector<std::string> argv) {
  uint64_t t0 = SteadyUs();
  result_ok_ = false;
  result_slice_ = false;
  result_output_.clear();
  result_error_.clear();
  auto finish = [&](bool ok, const std::string& error) {
    result_ok_ = ok;
    result_error_ = error;
    result_us_ = SteadyUs() - t0;
    done_ = true;
  };
  // The probe talks to a relay of ours, which connects to the server from a
  // port we know: the leader's pipeline tells the probe's connection from
  // the clients' by it (probe_port), and a divergence found on it is a
  // state divergence.
  uint16_t relay_port = 0;
  int listener = BoundSocket(me_.host, &relay_port);
  if (listener < 0 || listen(listener, 4) != 0) {
    if (listener >= 0) close(listener);
    return finish(false, "cannot listen on " + me_.host + " for the probe's connection");
  }
  for (auto& a : argv) a = SubstituteCommand(a, relay_port, me_.dir + "/server", me_.host);
  SpawnOptions o;
  std::string err;
  if (!ResolveExecutable(argv[0], &o.exe, &err)) {
    close(listener);
    return finish(false, err);
  }
  o.argv = argv;
  o.own_process_group = true;
  o.die_with_parent = true;
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(listener);
    return finish(false, "cannot make a pipe for its output");
  }
  o.out_fd = out[1];  // Spawn closes it
  SpawnResult r = Spawn(o);
  if (!r.ok()) {
    close(out[0]);
    close(listener);
    return finish(false, "cannot run " + o.exe + " (errno " + std::to_string(r.err) + ")");
  }
  probe_pid_ = r.pid;
  uint64_t deadline_us = t0 + uint64_t{kProbeTimeoutMs} * 1000;
  // Its connection, relayed to the server. A probe that exits without
  // connecting (its output's end) is waited for below.
  std::string relay_error;
  for (;;) {
    pollfd p[2] = {{listener, POLLIN, 0}, {out[0], POLLIN, 0}};
    if (SteadyUs() >= deadline_us || stop_.load()) break;
    if (poll(p, 2, 100) <= 0) continue;
    if (p[1].revents && !p[0].revents) break;  // it said something or exited first
    if (!p[0].revents) continue;
    int probe = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (probe < 0) continue;
    uint16_t port = 0;
    int server = BoundSocket(me_.host, &port);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(me_.server_port));
    inet_pton(AF_INET, me_.host.c_str(), &a.sin_addr);
    probe_port_ = port;  // before connect: the server's accept comes after
    if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      relay_error = "cannot connect to the server at " + me_.host + ":" +
                    std::to_string(me_.server_port) + " (" + strerror(errno) + ")";
    } else {
      Relay(probe, server, deadline_us);
    }
    if (server >= 0) close(server);
    close(probe);
    break;
  }
  close(listener);
  std::string output;
  bool timed_out = false;
  for (;;) {
    int left = kProbeTimeoutMs - static_cast<int>((SteadyUs() - t0) / 1000);
    if (left <= 0 || stop_.load()) {
      timed_out = left <= 0;
      kill(r.pid, SIGKILL);
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, std::min(left, 100)) <= 0) continue;
    char buf[1024];
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;  // the probe closed its output: it is done
    if (output.size() < kMaxOutput) output.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
  }
  probe_pid_ = 0;
  output = Trimmed(output.substr(0, kMaxOutput));
  if (timed_out)
    return finish(false, "no answer within " + std::to_string(kProbeTimeoutMs / 1000) + " s");
  if (!relay_error.empty()) return finish(false, relay_error);
  bool slice = WIFEXITED(status) && WEXITSTATUS(status) == kProbeSliceExit;
  if (!slice && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
    return finish(false, (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                            : std::string("killed by a signal")) +
                             (output.empty() ? "" : ": " + output));
  result_output_ = output;
  result_slice_ = slice;
  finish(true, "");
}

Json StateChecker::StatusJson() const {
  return Json{{"every_s", cfg_.server.state_check_every_s},
              {"checks", checks_},
              {"passes", passes_},
              {"failed", failed_},
              {"digest", digest_},
              {"ms", last_ms_},
              {"error", error_},
              {"last_failure", last_failure_}};
}

}  // namespace lockstep
