// bench.cc — benchmarks of the replicated log and the demo.
//
// Every figure is measured in the same run as its baseline: the durable-write
// floor is measured on the same file system with the same write size right
// before the cluster starts; ratios are printed next to the targets.
#include "guard/cli/bench.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "consensus/disk_log.h"
#include "guard/cli/cluster.h"
#include "guard/cli/options.h"
#include "guard/common/json.h"
#include "guard/net/client.h"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct RunResult {
  std::string transport, durability;
  int replicas = 3, clients = 1;
  size_t payload = 64;
  double floor_p50 = 0, floor_p99 = 0;
  double shared_floor_p50 = 0, shared_floor_p99 = 0;  // one writer per replica at once
  double commit_p50 = 0, commit_p99 = 0;
  double rtt_p50 = 0, rtt_p99 = 0;
  double durable_p50 = 0, quorum_p50 = 0;
  double throughput = 0;
  uint64_t ops = 0, errors = 0;
  std::string first_refusal;
};

// Runs `clients` closed-loop proposers against the leader for `seconds`.
bool RunLoad(const ClusterConfig& c, int leader, int clients, double seconds, size_t payload_size,
             RunResult* r, std::string* error) {
  std::mutex mu;
  std::vector<double> commit, rtt, durable, quorum;
  std::atomic<uint64_t> ops{0}, errors{0};
  std::atomic<bool> failed{false};
  std::string first_error, first_refusal;
  auto start = Clock::now();
  auto warm_end = start + std::chrono::milliseconds(300);
  auto end = warm_end + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; t++) {
    threads.emplace_back([&, t] {
      std::string err;
      auto cl = Client::Connect(c, leader, 2000, &err);
      if (!cl) {
        std::lock_guard<std::mutex> g(mu);
        first_error = err;
        failed = true;
        return;
      }
      std::string payload(payload_size, 'x');
      std::vector<double> my_commit, my_rtt, my_durable, my_quorum;
      uint64_t n = 0;
      for (;;) {
        auto t0 = Clock::now();
        if (t0 >= end || n >= 5000000) break;
        snprintf(payload.data(), payload.size(), "c%d-%lu", t, (unsigned long)n++);
        ProposeReply rep;
        if (!cl->Propose(EntryType::kInput, payload, &rep, &err, 5000)) {
          std::lock_guard<std::mutex> g(mu);
          first_error = err;
          failed = true;
          return;
        }
        auto t1 = Clock::now();
        if (!rep.ok) {
          if (errors++ == 0) {
            std::lock_guard<std::mutex> g(mu);
            first_refusal = rep.error;
          }
          // Leadership moved: follow it (the refusal is counted and shown).
          int leader_now = FindLeader(c, 2000);
          auto moved = leader_now >= 0 ? Client::Connect(c, leader_now, 2000, &err) : nullptr;
          if (moved) cl = std::move(moved);
          continue;
        }
        if (t0 < warm_end) continue;
        ops++;
        my_commit.push_back(rep.commit_us);
        my_durable.push_back(rep.durable_us);
        my_quorum.push_back(rep.quorum_us);
        my_rtt.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      std::lock_guard<std::mutex> g(mu);
      commit.insert(commit.end(), my_commit.begin(), my_commit.end());
      rtt.insert(rtt.end(), my_rtt.begin(), my_rtt.end());
      durable.insert(durable.end(), my_durable.begin(), my_durable.end());
      quorum.insert(quorum.end(), my_quorum.begin(), my_quorum.end());
    });
  }
  for (auto& th : threads) th.join();
  if (failed) {
    *error = "load failed: " + first_error;
    return false;
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - warm_end).count();
  r->ops = ops;
  r->errors = errors;
  r->first_refusal = first_refusal;
  r->throughput = ops / std::max(elapsed, 1e-9);
  r->commit_p50 = Pct(commit, 50);
  r->commit_p99 = Pct(commit, 99);
  r->rtt_p50 = Pct(rtt, 50);
  r->rtt_p99 = Pct(rtt, 99);
  r->durable_p50 = Pct(durable, 50);
  r->quorum_p50 = Pct(quorum, 50);
  return true;
}

// v to `places` decimals: the JSON holds what was measured, not float noise.
double Rounded(double v, int places) {
  double scale = std::pow(10.0, places);
  return std::round(v * scale) / scale;
}

Json RunJson(const RunResult& r) {
  return Json{{"transport", r.transport},
              {"durability", r.durability},
              {"replicas", r.replicas},
              {"clients", r.clients},
              {"payload_bytes", r.payload},
              {"floor_p50_us", Rounded(r.floor_p50, 2)},
              {"floor_p99_us", Rounded(r.floor_p99, 2)},
              {"shared_floor_p50_us", Rounded(r.shared_floor_p50, 2)},
              {"shared_floor_p99_us", Rounded(r.shared_floor_p99, 2)},
              {"commit_p50_us", Rounded(r.commit_p50, 2)},
              {"commit_p99_us", Rounded(r.commit_p99, 2)},
              {"client_rtt_p50_us", Rounded(r.rtt_p50, 2)},
              {"client_rtt_p99_us", Rounded(r.rtt_p99, 2)},
              {"durable_write_us", Rounded(r.durable_p50, 2)},
              {"quorum_wait_us", Rounded(r.quorum_p50, 2)},
              {"throughput_ops", Rounded(r.throughput, 1)},
              {"ops", r.ops},
              {"errors", r.errors}};
}

// The floor: durable writes of the size a single-entry batch makes (one
// record padded to a sector), on the same file system. `writers` threads
// write at once: on one host the replicas' logs share the disk, and a commit
// overlaps the leader's write with the backups' writes.
bool MeasureFloor(const std::string& dir, size_t payload, int writers, double* p50, double* p99,
                  std::string* error) {
  size_t bytes = RecordSize(payload);
  std::vector<std::vector<double>> lat(writers);
  std::vector<std::string> errs(writers);
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; w++)
    threads.emplace_back([&, w] {
      lat[w] = MeasureDurableWrites(dir + "/w" + std::to_string(w), DiskLogOptions{}.mode, bytes,
                                    400, &errs[w]);
    });
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (int w = 0; w < writers; w++) {
    if (lat[w].empty()) {
      *error = errs[w];
      return false;
    }
    all.insert(all.end(), lat[w].begin(), lat[w].end());
  }
  *p50 = Pct(all, 50);
  *p99 = Pct(all, 99);
  return true;
}

struct ConsensusArgs {
  std::string transport = "shm", durability = "disk", replicas = "3", clients = "1,16";
  double seconds = 3;
  long long payload = 64, base_port = 7600, spin_us = -1, segment_bytes = 64 << 20;
  std::string dir = "/tmp/lockstep-bench", json;
};

int BenchConsensus(const ConsensusArgs& o) {
  auto transports = SplitCommas(o.transport);
  auto durabilities = SplitCommas(o.durability);
  auto replica_list = SplitCommas(o.replicas);
  auto client_list = SplitCommas(o.clients);
  double seconds = o.seconds;
  size_t payload = static_cast<size_t>(o.payload);
  std::string dir = o.dir;
  std::string json_path = o.json;
  int base_port = static_cast<int>(o.base_port);
  long long spin_us = o.spin_us;
  long long segment_bytes = o.segment_bytes;
  if (seconds <= 0 || seconds > 600) {
    fprintf(stderr, "lockstep bench: --seconds must be in (0, 600]\n");
    return 2;
  }
  std::vector<RunResult> results;
  mkdir(dir.c_str(), 0755);
  for (const auto& tr : transports)
    for (const auto& du : durabilities)
      for (const auto& rs : replica_list)
        for (const auto& cs : client_list) {
          RunResult r;
          r.transport = tr;
          r.durability = du;
          r.replicas = atoi(rs.c_str());
          r.clients = atoi(cs.c_str());
          r.payload = payload;
          std::string err;
          if (r.clients < 1 || r.clients > 256) {
            fprintf(stderr, "lockstep bench: --clients values must be 1..256\n");
            return 2;
          }
          fprintf(stderr, "run: transport %s, durability %s, %d replicas, %d clients, %.1f s ...\n",
                  tr.c_str(), du.c_str(), r.replicas, r.clients, seconds);
          ClusterUpOptions up;
          up.dir = dir;
          up.wipe = true;  // a scratch directory of the bench's own
          up.replicas = r.replicas;
          up.transport = tr;
          up.durability = du;
          up.base_port = base_port;
          up.spin_us = spin_us;
          up.segment_bytes = static_cast<uint64_t>(segment_bytes);
          // The floor first, on the same file system, while nothing else writes.
          if (!MeasureFloor(dir + "/floor", payload, 1, &r.floor_p50, &r.floor_p99, &err) ||
              !MeasureFloor(dir + "/floor", payload, r.replicas, &r.shared_floor_p50,
                            &r.shared_floor_p99, &err)) {
            fprintf(stderr, "lockstep bench: floor: %s\n", err.c_str());
            return 1;
          }
          ClusterConfig c;
          if (!ClusterUp(up, &c, &err)) {
            fprintf(stderr, "lockstep bench: %s\n", err.c_str());
            ClusterDown(dir, true, &err);
            return 1;
          }
          int leader = FindLeader(c, 5000);
          bool ok = leader >= 0 && RunLoad(c, leader, r.clients, seconds, payload, &r, &err);
          std::string down_err;
          ClusterDown(dir, true, &down_err);
          if (!ok) {
            fprintf(stderr, "lockstep bench: %s\n", leader < 0 ? "no leader" : err.c_str());
            return 1;
          }
          fprintf(stderr,
                  "  floor p50 %.1f us | commit p50 %.1f us p99 %.1f us (durable %.1f + quorum "
                  "%.1f) | client rtt p50 %.1f us | %.0f ops/s | %lu refused\n",
                  r.floor_p50, r.commit_p50, r.commit_p99, r.durable_p50, r.quorum_p50, r.rtt_p50,
                  r.throughput, (unsigned long)r.errors);
          if (r.errors) fprintf(stderr, "  first refusal: %s\n", r.first_refusal.c_str());
          results.push_back(r);
        }

  // Table and targets.
  printf("\n%-9s %-10s %-4s %-7s %9s %10s %10s %10s %9s %9s %9s %10s\n", "transport", "durability",
         "reps", "clients", "floor", "floor(N)", "commit", "commit", "durable", "quorum", "rtt",
         "ops/s");
  printf("%-9s %-10s %-4s %-7s %9s %10s %10s %10s %9s %9s %9s %10s\n", "", "", "", "", "p50 us",
         "p50 us", "p50 us", "p99 us", "p50 us", "p50 us", "p50 us", "");
  for (const auto& r : results)
    printf("%-9s %-10s %-4d %-7d %9.1f %10.1f %10.1f %10.1f %9.1f %9.1f %9.1f %10.0f\n",
           r.transport.c_str(), (r.durability == "memory" ? "memory*" : r.durability.c_str()),
           r.replicas, r.clients, r.floor_p50, r.shared_floor_p50, r.commit_p50, r.commit_p99,
           r.durable_p50, r.quorum_p50, r.rtt_p50, r.throughput);
  printf(
      "floor: one durable write of a one-entry batch, alone; floor(N): the same with one writer\n"
      "per replica at once (on one host all replicas' logs share this disk); durable: the\n"
      "leader's own write; quorum: waiting for the majority after it; rtt: client round trip.\n");
  bool any_memory = false;
  for (const auto& r : results) any_memory |= r.durability == "memory";
  if (any_memory) printf("* memory: a majority holds each entry in RAM only (not durable)\n");
  printf("\ntargets (measured in this run):\n");
  auto find = [&](const std::string& t, const std::string& d, int reps,
                  int cl) -> const RunResult* {
    for (const auto& r : results)
      if (r.transport == t && r.durability == d && r.replicas == reps && r.clients == cl) return &r;
    return nullptr;
  };
  for (const auto& r : results) {
    if (r.clients == 1 && r.durability == "disk" && r.replicas == 3)
      printf(
          "  %s disk 1 client: commit p50 / floor p50 = %.2f (target <= 1.2) %s; "
          "/ floor(N) p50 = %.2f\n",
          r.transport.c_str(), r.commit_p50 / r.floor_p50,
          r.commit_p50 <= 1.2 * r.floor_p50 ? "MET" : "not met", r.commit_p50 / r.shared_floor_p50);
    if (r.clients == 1 && r.durability == "memory" && r.replicas == 3)
      printf("  %s memory 1 client: commit p50 = %.1f us (target <= 5 us) %s\n",
             r.transport.c_str(), r.commit_p50, r.commit_p50 <= 5 ? "MET" : "not met");
    if (r.clients > 1) {
      const RunResult* one = find(r.transport, r.durability, r.replicas, 1);
      if (one)
        printf("  %s %s %d replicas: %d clients / 1 client throughput = %.1fx (target >= 10x) %s\n",
               r.transport.c_str(), r.durability.c_str(), r.replicas, r.clients,
               r.throughput / one->throughput,
               r.throughput >= 10 * one->throughput ? "MET" : "not met");
    }
    if (r.replicas > 3) {
      const RunResult* three = find(r.transport, r.durability, 3, r.clients);
      if (three)
        printf(
            "  %s %s %d clients: %d replicas / 3 replicas commit p50 = %.2f (target <= 1.1) %s\n",
            r.transport.c_str(), r.durability.c_str(), r.clients, r.replicas,
            r.commit_p50 / three->commit_p50,
            r.commit_p50 <= 1.1 * three->commit_p50 ? "MET" : "not met");
    }
  }
  if (!json_path.empty()) {
    Json runs = Json::array();
    for (const RunResult& r : results) runs.push_back(RunJson(r));
    std::ofstream f(json_path);
    f << JsonText(Json{{"runs", std::move(runs)}}, 2) << "\n";
    if (!f) {
      fprintf(stderr, "lockstep bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
    printf("\nwrote %s\n", json_path.c_str());
  }
  return 0;
}

// ------------------------------------------------------------------ failover

struct Acked {
  uint64_t index;
  std::string payload;
};

// Closed-loop clients that follow the leader and remember what was acknowledged.
class FollowingLoad {
 public:
  FollowingLoad(const ClusterConfig& c, int clients) : c_(c) {
    for (int t = 0; t < clients; t++) threads_.emplace_back([this, t] { Loop(t); });
  }
  ~FollowingLoad() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& th : threads_)
      if (th.joinable()) th.join();
  }
  std::vector<Acked> acked() {
    std::lock_guard<std::mutex> g(mu_);
    return acked_;
  }
  uint64_t count() const { return count_; }

 private:
  void Loop(int t) {
    std::unique_ptr<Client> cl;
    std::string err;
    uint64_t n = 0;
    while (!stop_ && n < 10000000) {
      if (!cl) {
        int leader = FindLeader(c_, 200);
        if (leader < 0) continue;
        cl = Client::Connect(c_, leader, 200, &err);
        if (!cl) continue;
      }
      std::string payload = "f" + std::to_string(t) + "-" + std::to_string(n++);
      ProposeReply rep;
      if (!cl->Propose(EntryType::kInput, payload, &rep, &err, 2000)) {
        cl.reset();
        continue;
      }
      if (!rep.ok) {
        cl.reset();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::lock_guard<std::mutex> g(mu_);
      acked_.push_back(Acked{rep.index, payload});
      count_++;
    }
  }
  const ClusterConfig& c_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> count_{0};
  std::mutex mu_;
  std::vector<Acked> acked_;
  std::vector<std::thread> threads_;
};

// Reads every replica's committed log and counts acknowledged entries missing
// (or different) on any live replica; also checks the logs agree.
uint64_t CountLost(const ClusterConfig& c, const std::string& dir, const std::vector<Acked>& acked,
                   std::string* report) {
  // Each replica is read up to its own commit index, which reaches a backup
  // (a restarted one above all) a little after the leader's: wait until every
  // replica knows the newest acknowledged entry committed (or 10 s), so that
  // an entry counted lost is one a replica that knows it committed lacks.
  uint64_t newest = 0;
  for (const auto& a : acked) newest = std::max(newest, a.index);
  auto end = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    ClusterStatus s = GetClusterStatus(dir, c);
    bool all = s.replicas.size() == c.replicas.size();
    for (const auto& r : s.replicas) all = all && r.commit_index >= newest;
    if (all || Clock::now() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  uint64_t lost = 0;
  std::vector<uint64_t> lost_on(c.replicas.size(), 0);
  std::vector<size_t> read_ids;
  std::vector<std::map<uint64_t, std::string>> logs;
  std::string unread;
  for (size_t r = 0; r < c.replicas.size(); r++) {
    std::string err;
    auto cl = ReplicaPid(dir, static_cast<int>(r))
                  ? Client::Connect(c, static_cast<int>(r), 1000, &err)
                  : nullptr;
    if (!cl) {
      unread += " " + std::to_string(r);
      continue;
    }
    std::map<uint64_t, std::string> log;
    uint64_t next = 1, commit = 0;
    for (;;) {
      std::vector<Entry> es;
      if (!cl->Read(next, 65536, &commit, &es, &err) || es.empty()) break;
      for (auto& e : es) log[e.index] = e.payload;
      next = es.back().index + 1;
      if (next > commit) break;
    }
    logs.push_back(std::move(log));
    read_ids.push_back(r);
  }
  for (const auto& a : acked) {
    bool missing = false;
    for (size_t i = 0; i < logs.size(); i++) {
      auto it = logs[i].find(a.index);
      if (it == logs[i].end() || it->second != a.payload) {
        lost_on[read_ids[i]]++;
        missing = true;
      }
    }
    lost += missing;
  }
  uint64_t disagreements = 0;
  for (size_t i = 1; i < logs.size(); i++)
    for (const auto& [idx, p] : logs[i]) {
      auto it = logs[0].find(idx);
      if (it != logs[0].end() && it->second != p) disagreements++;
    }
  *report = std::to_string(logs.size()) + " replicas read, " + std::to_string(acked.size()) +
            " acknowledged entries checked, " + std::to_string(disagreements) +
            " disagreeing slots";
  for (size_t r = 0; r < lost_on.size(); r++)
    if (lost_on[r])
      *report += "; replica " + std::to_string(r) + " lacks " + std::to_string(lost_on[r]) +
                 " acknowledged entries up to index " + std::to_string(newest);
  // Every replica runs again by now: one that does not answer is not
  // evidence that nothing was lost, so it counts as everything lost.
  if (!unread.empty()) {
    *report += "; replicas not read:" + unread;
    return std::max<uint64_t>(acked.size(), 1) + disagreements;
  }
  return lost + disagreements;
}

enum class LeaderFault { kKill, kFreeze };

// What happened to the leader, for the report: "killed" or "frozen".
const char* FaultDone(LeaderFault f) {
  return f == LeaderFault::kKill ? "killed" : "frozen";
}

// SIGKILLs the leader (its sockets close: the backups notice at once) or
// SIGSTOPs it (nothing closes: only the election timeout notices); returns
// ms until a new leader commits.
double FailLeaderAndTime(const ClusterConfig& c, const std::string& dir, LeaderFault fault,
                         int* killed, std::string* error) {
  int leader = FindLeader(c, 5000);
  if (leader < 0) {
    *error = "no leader before the kill";
    return -1;
  }
  int pid = ReplicaPid(dir, leader);
  if (!pid) {
    *error = "leader has no pid";
    return -1;
  }
  *killed = leader;
  auto t0 = Clock::now();
  kill(pid, fault == LeaderFault::kKill ? SIGKILL : SIGSTOP);
  for (int attempt = 0; Clock::now() - t0 < std::chrono::seconds(10); attempt++) {
    for (size_t r = 0; r < c.replicas.size(); r++) {
      if (static_cast<int>(r) == leader) continue;
      std::string err;
      DaemonStatus st;
      auto cl = Client::Connect(c, static_cast<int>(r), 100, &err);
      if (!cl || !cl->Status(&st, &err, 200) || st.role != "leader") continue;
      ProposeReply rep;
      if (cl->Propose(EntryType::kInput, "failover-probe", &rep, &err, 2000) && rep.ok)
        return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  *error = "no new leader committed within 10 s";
  return -1;
}

bool WaitCaughtUp(const ClusterConfig& c, const std::string& dir, int id, int timeout_ms) {
  auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < end) {
    ClusterStatus s = GetClusterStatus(dir, c);
    // Following the current leader, not still the ballot it restarted with
    // (its role reads "backup" at once): killing the next leader before that
    // is two failures at once, and a restarted replica votes only once it
    // caught up.
    if (s.leader >= 0 && s.leader != id && s.replicas[id].role == "backup" &&
        s.replicas[id].ballot == s.replicas[s.leader].ballot && s.replicas[id].lag < 1000 &&
        s.replicas[id].commit_index + 1000 >= s.replicas[s.leader].commit_index)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct FailoverArgs {
  long long kills = 20, clients = 4, replicas = 3, base_port = 7700;
  std::string fault = "kill", dir = "/tmp/lockstep-failover", json, hosts = "loopback", transport,
              durability = "disk", election_timeout;
};

int BenchFailover(const FailoverArgs& o) {
  int kills = static_cast<int>(o.kills);
  int clients = static_cast<int>(o.clients);
  std::string fault_name = o.fault;
  LeaderFault fault = fault_name == "kill" ? LeaderFault::kKill : LeaderFault::kFreeze;
  std::string dir = o.dir;
  std::string json_path = o.json;
  ClusterUpOptions up;
  up.dir = dir;
  up.wipe = true;  // a scratch directory of the bench's own
  up.replicas = static_cast<int>(o.replicas);
  up.hosts = o.hosts;
  // Namespace hosts talk tcp (see cluster up --hosts); the bench's clients
  // run in the client namespace (ClusterUp moves this process there).
  up.transport = !o.transport.empty() ? o.transport : up.hosts == "netns" ? "tcp" : "shm";
  up.durability = o.durability;
  up.base_port = static_cast<int>(o.base_port);
  std::string err;
  if (!o.election_timeout.empty() && !ParseElectionTimeout(o.election_timeout, &up, &err)) {
    fprintf(stderr, "lockstep bench failover: %s\n", err.c_str());
    return 2;
  }
  ClusterConfig c;
  mkdir(dir.c_str(), 0755);
  if (!ClusterUp(up, &c, &err)) {
    fprintf(stderr, "lockstep bench failover: %s\n", err.c_str());
    ClusterDown(dir, true, &err);
    return 1;
  }
  std::vector<double> times;
  int failed = 0;
  {
    FollowingLoad load(c, clients);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int k = 0; k < kills; k++) {
      int killed = -1;
      double ms = FailLeaderAndTime(c, dir, fault, &killed, &err);
      if (ms < 0) {
        fprintf(stderr, "  %s %d: %s\n", fault_name.c_str(), k + 1, err.c_str());
        failed++;
      } else {
        times.push_back(ms);
        fprintf(stderr,
                "  %s %d/%d: leader %d %s, new leader committed after %.1f ms (%lu acked so "
                "far)\n",
                fault_name.c_str(), k + 1, kills, killed, FaultDone(fault), ms,
                (unsigned long)load.count());
      }
      if (killed >= 0 && fault == LeaderFault::kFreeze) {
        // It runs on where it stopped, finds a newer ballot and steps down.
        if (int pid = ReplicaPid(dir, killed)) kill(pid, SIGCONT);
      } else if (killed >= 0 && !StartReplica(dir, c, killed, &err)) {
        fprintf(stderr, "  restart: %s\n", err.c_str());
      }
      if (killed >= 0 && !WaitCaughtUp(c, dir, killed, 10000)) {
        fprintf(stderr, "  replica %d is not a caught-up backup within 10 s\n", killed);
        failed++;
      }
    }
    load.Stop();
    std::string report;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    uint64_t lost = CountLost(c, dir, load.acked(), &report);
    double p50 = Pct(times, 50), p99 = Pct(times, 99);
    // Issue 9's targets: a killed leader is noticed through its closed
    // sockets; a frozen one only when the election timeout runs out, whose
    // longest draw is the honest bound.
    double target_ms = fault == LeaderFault::kKill
                           ? 15.0
                           : static_cast<double>(c.election_timeout_max_us) / 1000.0 + 30.0;
    printf(
        "failover over %d leaders %s (election timeout %lu-%lu ms): p50 %.1f ms, p99 %.1f ms "
        "(target p50 <= %.0f ms: %s); %d failures without a new leader or a caught-up old one; "
        "lost acknowledged entries: %lu (%s)\n",
        kills, FaultDone(fault), (unsigned long)(c.election_timeout_min_us / 1000),
        (unsigned long)(c.election_timeout_max_us / 1000), p50, p99, target_ms,
        p50 <= target_ms ? "MET" : "not met", failed, (unsigned long)lost, report.c_str());
    if (!json_path.empty()) {
      Json failover_ms = Json::array();
      for (double t : times) failover_ms.push_back(Rounded(t, 3));
      std::ofstream f(json_path);
      f << JsonText(Json{{"kills", kills},
                         {"fault", fault_name},
                         {"election_timeout_ms",
                          {c.election_timeout_min_us / 1000, c.election_timeout_max_us / 1000}},
                         {"target_p50_ms", target_ms},
                         {"failover_p50_ms", Rounded(p50, 3)},
                         {"failover_p99_ms", Rounded(p99, 3)},
                         {"lost_acknowledged", lost},
                         {"failed_kills", failed},
                         {"acknowledged", load.acked().size()},
                         {"transport", up.transport},
                         {"durability", up.durability},
                         {"failover_ms", std::move(failover_ms)}},
                    2)
        << "\n";
    }
    ClusterDown(dir, true, &err);
    return lost == 0 && failed == 0 ? 0 : 1;
  }
}

int Demo(const std::string& dir, long long base_port) {
  ClusterUpOptions up;
  up.dir = dir;
  up.wipe = true;  // a scratch directory of the bench's own
  up.base_port = static_cast<int>(base_port);
  ClusterConfig c;
  std::string err;
  mkdir(dir.c_str(), 0755);
  printf("== starting 3 replicas in %s (transport shm, durability disk)\n", dir.c_str());
  if (!ClusterUp(up, &c, &err)) {
    fprintf(stderr, "lockstep demo: %s\n", err.c_str());
    ClusterDown(dir, true, &err);
    return 1;
  }
  ClusterStatus s = GetClusterStatus(dir, c);
  printf("%s", FormatStatusTable(s).c_str());

  printf("\n== durable-write floor of this disk, then 1 and 8 clients committing for 2 s each\n");
  RunResult one, eight;
  MeasureFloor(dir + "/floor", 64, 1, &one.floor_p50, &one.floor_p99, &err);
  int leader = FindLeader(c, 5000);
  if (!RunLoad(c, leader, 1, 2, 64, &one, &err) || !RunLoad(c, leader, 8, 2, 64, &eight, &err)) {
    fprintf(stderr, "lockstep demo: %s\n", err.c_str());
    ClusterDown(dir, true, &err);
    return 1;
  }
  printf("floor (one 4 KiB-class durable write): p50 %.1f us, p99 %.1f us\n", one.floor_p50,
         one.floor_p99);
  printf(
      "1 client : commit p50 %.1f us, p99 %.1f us (leader's durable write %.1f us + quorum wait "
      "%.1f us), client round trip p50 %.1f us, %.0f commits/s\n",
      one.commit_p50, one.commit_p99, one.durable_p50, one.quorum_p50, one.rtt_p50, one.throughput);
  printf(
      "8 clients: commit p50 %.1f us, p99 %.1f us, %.0f commits/s (%.1fx one client: group "
      "commit)\n",
      eight.commit_p50, eight.commit_p99, eight.throughput, eight.throughput / one.throughput);

  printf(
      "\n== SIGKILL the leader under load, 3 times; the killed replica restarts and catches up\n");
  int rc = 0;
  {
    FollowingLoad load(c, 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int k = 0; k < 3; k++) {
      int killed = -1;
      double ms = FailLeaderAndTime(c, dir, LeaderFault::kKill, &killed, &err);
      if (ms < 0) {
        printf("kill %d: %s\n", k + 1, err.c_str());
        rc = 1;
        break;
      }
      int nl = FindLeader(c, 2000);
      printf("killed leader %d: replica %d leads and committed after %.1f ms\n", killed, nl, ms);
      StartReplica(dir, c, killed, &err);
      WaitCaughtUp(c, dir, killed, 10000);
      printf("replica %d restarted and caught up\n", killed);
    }
    load.Stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::string report;
    auto acked = load.acked();
    uint64_t lost = CountLost(c, dir, acked, &report);
    printf(
        "\n== %lu entries were acknowledged to clients during the kills; lost or different on some "
        "replica: %lu (%s)\n",
        (unsigned long)acked.size(), (unsigned long)lost, report.c_str());
    if (lost) rc = 1;
  }
  s = GetClusterStatus(dir, c);
  printf("\n%s", FormatStatusTable(s).c_str());
  printf("\n== stopping the cluster\n");
  ClusterDown(dir, false, &err);
  printf(rc == 0 ? "demo: OK\n" : "demo: FAILED\n");
  return rc;
}

}  // namespace

void AddBench(CommandLine& cl) {
  CLI::App* family = cl.Add(&cl.root(), "bench", "measure: bench consensus | bench failover");
  family->require_subcommand(1);

  auto c = std::make_shared<ConsensusArgs>();
  CLI::App* consensus = cl.Add(
      family, "consensus", "commit latency and throughput of the replicated log",
      "For every combination of the lists, starts a fresh local cluster, measures the disk's own\n"
      "durable-write latency (the floor) in the same directory, then runs closed-loop clients\n"
      "against the leader and reports commit latency (split into the leader's durable write and\n"
      "the wait for the quorum), client round trip and throughput, with ratios to the targets.");
  consensus->add_option("--transport", c->transport, "transports to measure, comma-separated")
      ->type_name("shm,tcp,auto")
      ->check(ListOf({"shm", "tcp", "auto"}))
      ->capture_default_str();
  consensus->add_option("--durability", c->durability, "durabilities, comma-separated")
      ->type_name("disk,memory")
      ->check(ListOf({"disk", "memory"}))
      ->capture_default_str();
  consensus->add_option("--replicas", c->replicas, "cluster sizes, comma-separated")
      ->type_name("3,5,7")
      ->check(ListOf({"3", "5", "7"}))
      ->capture_default_str();
  consensus->add_option("--clients", c->clients, "closed-loop client counts, comma-separated")
      ->type_name("N,N")
      ->check(NumberList(1, 256))
      ->capture_default_str();
  consensus->add_option("--seconds", c->seconds, "how long each combination runs")
      ->type_name("S")
      ->capture_default_str();
  AddNumber(consensus, "--payload", &c->payload, "bytes per entry", 1, 1 << 20)->type_name("BYTES");
  consensus->add_option("--dir", c->dir, "the clusters' scratch directory")
      ->type_name("DIR")
      ->capture_default_str();
  consensus->add_option("--json", c->json, "also write the results as JSON")->type_name("FILE");
  AddNumber(consensus, "--base-port", &c->base_port, "the clusters' base port", 1, 65535);
  AddNumber(consensus, "--spin-us", &c->spin_us, "how long a waiting thread spins", -1, 1 << 30,
            "cluster.toml's");
  AddNumber(consensus, "--segment-bytes", &c->segment_bytes, "each log segment file", 1 << 16,
            kNoLimit);
  cl.OnRun(
      consensus, [c] { return BenchConsensus(*c); }, 2, 2);

  auto f = std::make_shared<FailoverArgs>();
  CLI::App* failover = cl.Add(
      family, "failover", "time to a new leader after the leader fails, under load",
      "SIGKILLs (--fault kill, the default) or SIGSTOPs (--fault freeze: no socket closes,\n"
      "only the election timeout notices) the leader N times under load, timing until a new\n"
      "leader commits; a killed leader is restarted, a frozen one continued (it must step\n"
      "down); then checks that every acknowledged entry is on every replica (one that does not\n"
      "answer counts as everything lost). --hosts netns: each replica in a network namespace\n"
      "of its own (cluster up --hosts netns), UCX over tcp.");
  AddNumber(failover, "--kills", &f->kills, "how many leaders to fail", 1, 1000);
  AddNumber(failover, "--clients", &f->clients, "clients committing meanwhile", 1, 256)
      ->type_name("C");
  failover->add_option("--fault", f->fault, "SIGKILL or SIGSTOP the leader")
      ->type_name("kill|freeze")
      ->check(OneOf({"kill", "freeze"}))
      ->capture_default_str();
  failover->add_option("--transport", f->transport, "how the replicas reach each other")
      ->type_name("shm|tcp|auto")
      ->check(OneOf({"shm", "tcp", "auto"}))
      ->default_str("shm; tcp with --hosts netns");
  failover->add_option("--durability", f->durability, "where an entry must be before it commits")
      ->type_name("disk|memory")
      ->check(OneOf({"disk", "memory"}))
      ->capture_default_str();
  failover->add_option("--replicas", f->replicas, "how many replicas")
      ->type_name("3|5|7")
      ->check(OneOf({"3", "5", "7"}))
      ->capture_default_str();
  failover->add_option("--hosts", f->hosts, "replicas on loopback, or each in a network namespace")
      ->type_name("loopback|netns")
      ->check(OneOf({"loopback", "netns"}))
      ->capture_default_str();
  failover
      ->add_option("--election-timeout-ms", f->election_timeout,
                   "a backup that hears no leader for a random time in MIN..MAX ms stands for "
                   "election")
      ->type_name("MIN-MAX")
      ->default_str("50-100");
  failover->add_option("--dir", f->dir, "the cluster's scratch directory")
      ->type_name("DIR")
      ->capture_default_str();
  failover->add_option("--json", f->json, "also write the results as JSON")->type_name("FILE");
  AddNumber(failover, "--base-port", &f->base_port, "the cluster's base port", 1, 65535);
  cl.OnRun(
      failover, [f] { return BenchFailover(*f); }, 2, 2);
}

void AddDemo(CommandLine& cl) {
  struct Options {
    std::string dir = "/tmp/lockstep-demo";
    long long base_port = 7800;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = cl.Add(
      &cl.root(), "demo",
      "start a 3-replica cluster, commit, kill the leader, show nothing is lost",
      "Starts 3 replicas here, commits entries, SIGKILLs the leader, shows the new leader and\n"
      "that nothing committed was lost, prints latency figures, and stops the cluster.");
  cmd->add_option("--dir", o->dir, "the cluster's scratch directory")
      ->type_name("DIR")
      ->capture_default_str();
  AddNumber(cmd, "--base-port", &o->base_port, "the cluster's base port", 1, 65535);
  cl.OnRun(
      cmd, [o] { return Demo(o->dir, o->base_port); }, 2, 2);
}

}  // namespace lockstep
