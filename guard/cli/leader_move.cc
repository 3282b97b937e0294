// leader_move.cc — `lockstep leader move` and `lockstep cluster restart
// --rolling` (leader_move.h): the client side of a leader move, and the
// rolling restart built on it.
#include "guard/cli/leader_move.h"

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "guard/cli/cluster.h"
#include "guard/common/json.h"
#include "guard/net/client.h"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string Ms(double ms) {
  char b[32];
  snprintf(b, sizeof b, "%.1f", ms);
  return b;
}

// Every replica's status, over connections kept from one look to the next
// (a new TLS connection per look would cost more than the move).
class StatusWatch {
 public:
  explicit StatusWatch(const ClusterConfig& config)
      : config_(config), conns_(config.replicas.size()) {}
  // Replica r's status now; false when it does not answer.
  bool Look(int r, DaemonStatus* st) {
    std::string err;
    if (!conns_[r]) conns_[r] = Client::Connect(config_, r, 300, &err);
    if (conns_[r] && conns_[r]->Status(st, &err, 1000)) return true;
    conns_[r].reset();
    return false;
  }

 private:
  const ClusterConfig& config_;
  std::vector<std::unique_ptr<Client>> conns_;
};

}  // namespace

bool MoveLeader(const ClusterConfig& config, int target, int wait_ms, LeaderMoveOutcome* out,
                std::string* error) {
  const int n = static_cast<int>(config.replicas.size());
  if (target >= n) {
    *error =
        "--to " + std::to_string(target) + ": the cluster has replicas 0.." + std::to_string(n - 1);
    return false;
  }
  int leader = FindLeader(config, 3000);
  if (leader < 0) {
    *error = "no leader found (is the cluster up? `lockstep cluster status`)";
    return false;
  }
  out->from = leader;
  auto admin = Client::Connect(config, leader, 1000, error, Principal::kAdmin);
  if (!admin) return false;
  auto t0 = Clock::now();
  LeaderMoveReply reply;
  if (!admin->LeaderMove(target, &reply, error, 5000)) {
    *error = "replica " + std::to_string(leader) + ": " + *error;
    return false;
  }
  out->handover_ms = MsSince(t0);
  out->leader_said = reply.text;
  out->handed_to = reply.new_leader;
  if (!reply.ok) {
    *error = "replica " + std::to_string(leader) + " (the leader) did not move: " + reply.text;
    return false;
  }
  // The new leader runs phase 1, then catches its server up and closes the
  // old leader's connections: only then do its clients get answers.
  StatusWatch watch(config);
  auto deadline = t0 + std::chrono::milliseconds(wait_ms);
  int seen_leader = -1;
  while (Clock::now() < deadline) {
    for (int r = 0; r < n; r++) {
      // The target first, every round: it is the one expected.
      int look = r == 0 ? reply.new_leader : (r == reply.new_leader ? 0 : r);
      DaemonStatus st;
      if (!watch.Look(look, &st) || st.role != "leader") continue;
      seen_leader = look;
      if (!config.has_server() || st.serving) {
        out->to = look;
        out->serving_ms = MsSince(t0);
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *error = "replica " + std::to_string(leader) + " handed over to replica " +
           std::to_string(reply.new_leader) + ", but " +
           (seen_leader >= 0
                ? "replica " + std::to_string(seen_leader) + " leads and did not serve its clients"
                : std::string("no replica led")) +
           " within " + std::to_string(wait_ms) + " ms (`lockstep cluster status`)";
  return false;
}

bool StopReplica(const std::string& dir, int id, std::string* error) {
  int pid = ReplicaPid(dir, id);
  if (!pid) return true;
  // Ended from outside: its keeper (`replica --keep`) lets it stay down.
  if (kill(pid, SIGTERM) != 0) {
    *error = "replica " + std::to_string(id) + " (pid " + std::to_string(pid) +
             "): cannot signal it: " + strerror(errno);
    return false;
  }
  for (int i = 0; i < 2000 && ReplicaPid(dir, id); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!ReplicaPid(dir, id)) return true;
  kill(pid, SIGKILL);
  for (int i = 0; i < 400 && ReplicaPid(dir, id); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!ReplicaPid(dir, id)) return true;
  *error = "replica " + std::to_string(id) + " (pid " + std::to_string(pid) +
           ") did not stop, even after SIGKILL";
  return false;
}

namespace {

// Stops replica id, starts it again and waits until it has applied what
// the leader had committed once it answered, with its server running.
bool RestartOne(const std::string& dir, const ClusterConfig& config, int id, int catch_up_ms,
                const std::function<void(const std::string&)>& progress, std::string* error) {
  auto t0 = Clock::now();
  int old_pid = ReplicaPid(dir, id);
  if (!StopReplica(dir, id, error)) return false;
  progress("replica " + std::to_string(id) + ": stopped (pid " + std::to_string(old_pid) + ") in " +
           Ms(MsSince(t0)) + " ms");
  int pid = 0;
  if (!RestartReplica(dir, config, id, &pid, error)) return false;
  auto started = Clock::now();
  progress("replica " + std::to_string(id) + ": started again (pid " + std::to_string(pid) + ")");
  ClusterStatus s = GetClusterStatus(dir, config);
  if (s.leader < 0 || s.leader == id) {
    for (int i = 0; i < 100 && (s.leader < 0 || s.leader == id); i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      s = GetClusterStatus(dir, config);
    }
  }
  if (s.leader < 0) {
    *error = "no leader after replica " + std::to_string(id) + " came back (`cluster status`)";
    return false;
  }
  const uint64_t goal = s.replicas[s.leader].commit_index;
  StatusWatch watch(config);
  auto deadline = started + std::chrono::milliseconds(catch_up_ms);
  DaemonStatus st;
  bool answered = false;
  while (Clock::now() < deadline) {
    answered = watch.Look(id, &st);
    bool server_up = !config.has_server() || (st.server_pid > 0 && st.server_read_all &&
                                              JsonStr(st.checkpoint, "server_state") == "running");
    if (answered && st.commit_index >= goal && (!config.has_server() || st.applied_index >= goal) &&
        server_up) {
      progress("replica " + std::to_string(id) + ": caught up (applied index " +
               std::to_string(config.has_server() ? st.applied_index : st.commit_index) +
               ", leader's commit was " + std::to_string(goal) + ") " + Ms(MsSince(started)) +
               " ms after it started; " + Ms(MsSince(t0)) + " ms in all");
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *error =
      "replica " + std::to_string(id) + " did not catch up within " + std::to_string(catch_up_ms) +
      " ms: " +
      (answered ? "applied index " + std::to_string(st.applied_index) + ", commit index " +
                      std::to_string(st.commit_index) + " of the leader's " + std::to_string(goal) +
                      ", server " + JsonStr(st.checkpoint, "server_state")
                : std::string("it does not answer")) +
      " (see " + dir + "/replica-" + std::to_string(id) + ".log)";
  return false;
}

}  // namespace

bool RollingRestart(const std::string& dir, const ClusterConfig& config, int catch_up_ms,
                    const std::function<void(const std::string&)>& progress, std::string* error) {
  auto t0 = Clock::now();
  ClusterStatus s = GetClusterStatus(dir, config);
  if (s.leader < 0) {
    *error = "no leader: a rolling restart needs a serving cluster (`lockstep cluster status`)";
    return false;
  }
  for (const ReplicaStatus& r : s.replicas)
    if (r.role == "down") {
      *error = "replica " + std::to_string(r.id) +
               " is down: start it first (`lockstep cluster restart --id " + std::to_string(r.id) +
               "`); restarting another meanwhile would leave fewer than all but one up";
      return false;
    }
  const int leader = s.leader;
  for (const ReplicaStatus& r : s.replicas) {
    if (r.id == leader) continue;
    if (!RestartOne(dir, config, r.id, catch_up_ms, progress, error)) return false;
  }
  // The leader last: leadership moves away first, so its clients reconnect
  // once, to a caught-up replica, instead of waiting out an election.
  LeaderMoveOutcome moved;
  if (!MoveLeader(config, -1, 5000, &moved, error)) return false;
  progress("leadership moved from replica " + std::to_string(moved.from) + " to replica " +
           std::to_string(moved.to) + ": handed over after " + Ms(moved.handover_ms) +
           " ms, serving after " + Ms(moved.serving_ms) + " ms");
  if (!RestartOne(dir, config, leader, catch_up_ms, progress, error)) return false;
  progress("rolling restart of " + std::to_string(s.replicas.size()) + " replicas done in " +
           Ms(MsSince(t0) / 1000.0) + " s");
  return true;
}

}  // namespace lockstep
