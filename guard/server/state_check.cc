// state_check.cc — see state_check.h.
#include "guard/server/state_check.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>

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
    // The probe's own request was committed before it was answered: only
    // clients' inputs after it make the next check due.
    inputs_at_last_ = client_inputs;
    checks_++;
    last_ms_ = result_us_ / 1000;
    if (result_ok_) {
      digest_ = result_output_;
      error_.clear();
    } else {
      failed_++;
      if (result_error_ != error_)  // said once, not at every interval
        log_("STATE CHECK FAILED: the state probe (" + cfg_.server.state_probe +
             ") against this leader's server: " + result_error_);
      error_ = result_error_;
    }
  }
  if (!serving) return;
  if (started_once_ && now_us - last_start_us_ < every_us_) return;
  if (client_inputs == inputs_at_last_) return;  // nothing new to check
  std::vector<std::string> argv;
  std::string err;
  if (!SplitCommand(cfg_.server.state_probe, &argv, &err) || argv.empty()) {
    error_ = "state_probe: " + (argv.empty() && err.empty() ? std::string("is empty") : err);
    return;
  }
  for (auto& a : argv) a = SubstituteCommand(a, me_.server_port, me_.dir + "/server", me_.host);
  started_once_ = true;
  last_start_us_ = now_us;
  done_ = false;
  thread_ = std::thread([this, argv = std::move(argv)]() mutable { Run(std::move(argv)); });
}

void StateChecker::Run(std::vector<std::string> argv) {
  uint64_t t0 = SteadyUs();
  result_ok_ = false;
  result_output_.clear();
  result_error_.clear();
  auto finish = [&](bool ok, const std::string& error) {
    result_ok_ = ok;
    result_error_ = error;
    result_us_ = SteadyUs() - t0;
    done_ = true;
  };
  SpawnOptions o;
  std::string err;
  if (!ResolveExecutable(argv[0], &o.exe, &err)) return finish(false, err);
  o.argv = argv;
  o.own_process_group = true;
  o.die_with_parent = true;
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return finish(false, "cannot make a pipe for its output");
  o.out_fd = out[1];  // Spawn closes it
  SpawnResult r = Spawn(o);
  if (!r.ok()) {
    close(out[0]);
    return finish(false, "cannot run " + o.exe + " (errno " + std::to_string(r.err) + ")");
  }
  probe_pid_ = r.pid;
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
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return finish(false, (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                            : std::string("killed by a signal")) +
                             (output.empty() ? "" : ": " + output));
  result_output_ = output;
  finish(true, "");
}

std::string StateChecker::StatusJson() const {
  std::ostringstream o;
  o << "{\"every_s\":" << cfg_.server.state_check_every_s << ",\"checks\":" << checks_
    << ",\"failed\":" << failed_ << ",\"digest\":\"" << JsonEscape(digest_)
    << "\",\"ms\":" << last_ms_ << ",\"error\":\"" << JsonEscape(error_) << "\"}";
  return o.str();
}

}  // namespace lockstep
