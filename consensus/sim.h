// sim.h — deterministic simulator for the protocol core (core.h).
//
// N Replicas run under a simulated clock and one seeded PRNG. The simulator
// plays every adapter the daemon plays in production, and plays it badly on
// purpose:
//  - messages arrive after a random delay, or never, or twice, in any order;
//  - one-sided puts land in the target's log region for (ballot, stream) after
//    a random delay, sometimes torn in two parts that land at different times
//    (in either order); control and ack words are words in memory: the last
//    write to land wins, whichever was issued last;
//  - durable writes complete in FIFO order after a random delay, and only a
//    completed write reaches the replica's durable state;
//  - replicas crash (losing everything not yet durable) and restart from their
//    durable state with a new incarnation; partitions come and heal; a leader
//    pauses and resumes after someone else was elected.
// After every event it checks agreement, durability of acknowledged
// proposals and one leader per ballot; at the end, with every fault healed,
// it requires progress. Same options, same result, bit for bit: decisions
// come only from the seeded PRNG and containers are iterated in order.
//
// SimCluster is the driver; RunSimulation adds random faults and client load
// on top of it. Unit tests drive SimCluster directly for hand-made scenarios.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "consensus/core.h"

namespace lockstep {

struct SimOptions {
  int replicas = 3;
  uint64_t seed = 1;
  uint64_t duration_us = 2'000'000;  // simulated time under faults
  bool verbose = false;              // print every event and action to stderr

  // Core configuration (small ring: wrap-around and ring-full happen often).
  uint64_t ring_bytes = 64 << 10;
  uint64_t max_put_bytes = 16 << 10;
  uint64_t heartbeat_us = 1000;
  uint64_t message_heartbeat_us = 10000;
  uint64_t election_timeout_min_us = 10000;
  uint64_t election_timeout_max_us = 20000;
  uint64_t tick_us = 250;  // how often each replica is ticked and polls memory

  // Network: messages, puts, control and ack words.
  uint64_t delay_min_us = 5;
  uint64_t delay_max_us = 200;
  double slow_rate = 0.02;             // fraction delayed up to slow_max_us
  uint64_t slow_max_us = 20000;
  double drop_rate = 0.02;             // messages, control and ack words
  double dup_rate = 0.02;              // messages only (one-sided writes never duplicate)
  double put_drop_rate = 0.002;        // a lost put: the reader stalls and rejoins
  double torn_put_rate = 0.1;          // a put lands in two parts, in either order
  double unreachable_notice_rate = 0.5;  // peers told (OnPeerUnreachable) of a crash

  // Disk.
  uint64_t disk_min_us = 30;
  uint64_t disk_max_us = 400;
  double slow_disk_rate = 0.02;        // a write that takes up to slow_disk_max_us
  uint64_t slow_disk_max_us = 5000;

  // Faults (RunSimulation only). Mean intervals between starts; 0 disables.
  bool faults = true;
  uint64_t crash_every_us = 120'000;
  uint64_t restart_min_us = 2'000;
  uint64_t restart_max_us = 80'000;
  double crash_leader_bias = 0.5;      // share of crashes aimed at the leader
  uint64_t partition_every_us = 150'000;
  uint64_t partition_min_us = 5'000;
  uint64_t partition_max_us = 120'000;
  uint64_t pause_every_us = 200'000;
  uint64_t pause_max_us = 300'000;     // a paused leader resumes at the latest after this
  uint64_t truncate_every_us = 100'000;
  // Crashes aimed at the windows that matter: right after a replica issued the
  // durable write of a promise, or a leader the write of a new entry (before
  // either completes, so it may or may not survive).
  double crash_on_promise_rate = 0.05;
  double crash_on_append_rate = 0.001;

  // Client load (RunSimulation only).
  uint64_t propose_every_us = 400;     // mean interval between proposals
  double large_payload_rate = 0.03;    // payloads of a few KiB
  double huge_payload_rate = 0.003;    // payloads near the region's limit

  // End of the run: heal everything, wait quiet_us, then a new proposal must
  // commit on every replica within progress_timeout_us.
  uint64_t quiet_us = 200'000;
  uint64_t progress_timeout_us = 1'000'000;

  size_t trace_lines = 30;  // trace lines kept for a violation report
};

struct SimResult {
  bool ok = true;
  std::string violation;  // empty if ok; else the invariant, the time, the seed and a trace tail
  uint64_t committed = 0;  // highest index committed anywhere
  uint64_t acknowledged = 0;  // client proposals acknowledged as committed
  uint64_t elections = 0;     // ballots that got a leader
  uint64_t crashes = 0;
  uint64_t steps = 0;         // events processed
  std::string summary;
};

// Runs one randomized simulation. Deterministic: same options, same result.
SimResult RunSimulation(const SimOptions& options);

// ---------------------------------------------------------------- the driver

class SimCluster {
 public:
  explicit SimCluster(const SimOptions& options);
  ~SimCluster();
  SimCluster(const SimCluster&) = delete;
  SimCluster& operator=(const SimCluster&) = delete;

  const SimOptions& options() const { return opt_; }
  uint64_t now() const { return now_; }
  int size() const { return n_; }
  std::mt19937_64& rng() { return rng_; }

  // Processes events up to simulated time t (or until a violation); now() = t after.
  void RunUntilTime(uint64_t t);
  void RunFor(uint64_t us) { RunUntilTime(now_ + us); }
  // Runs until pred() holds (checked after every event) or max_us pass. True if it held.
  bool RunUntil(const std::function<bool()>& pred, uint64_t max_us);

  // Faults.
  void Crash(int r);
  void Restart(int r);
  bool up(int r) const { return nodes_[r].rep != nullptr; }
  void Pause(int r);
  void Resume(int r);
  bool paused(int r) const { return nodes_[r].paused; }
  // Cuts (or restores) everything from `from` to `to`: messages, puts, words.
  void SetLink(int from, int to, bool connected);
  bool link(int from, int to) const { return links_[from][to]; }
  void Partition(const std::set<int>& side);  // cut side from the rest, both ways
  void Heal();                                // restores every link
  // While held, r's durable writes do not complete (they are lost on a crash).
  void HoldDisk(int r, bool hold);
  // Whether the random drop/dup/torn/slow rates apply (off: reliable, fast).
  void SetLossy(bool lossy) { lossy_ = lossy; }

  // Client side.
  ProposeResult Propose(int r, EntryType type, std::string payload);
  // Records a client proposal made at r (index) so that it is acknowledged
  // once r reports it committed, and checked forever after.
  void Track(int r, uint64_t index, EntryType type, const std::string& payload);
  // Truncates r's log below `index` (as the daemon does after a checkpoint).
  bool TruncateBelow(int r, uint64_t index);

  // Queries.
  Replica* replica(int r) { return nodes_[r].rep.get(); }
  const Replica* replica(int r) const { return nodes_[r].rep.get(); }
  const DurableState& durable(int r) const { return nodes_[r].durable; }
  uint64_t incarnation(int r) const { return nodes_[r].incarnation; }
  // The live, unpaused replica that leads the highest ballot, or -1.
  int Leader() const;
  // Every replica up, and each has committed at least `index`.
  bool AllCommitted(uint64_t index) const;
  uint64_t MaxCommitted() const { return committed_.empty() ? 0 : committed_.rbegin()->first; }
  const std::map<uint64_t, Entry>& committed() const { return committed_; }
  size_t acknowledged() const { return acked_.size(); }
  uint64_t elections() const { return leaders_.size(); }
  uint64_t crashes() const { return crashes_; }
  uint64_t steps() const { return steps_; }

  // First invariant violation ("" if none). Once set, events stop.
  const std::string& violation() const { return violation_; }
  bool failed() const { return !violation_.empty(); }
  void Fail(const std::string& what);  // records a violation (first one wins)
  // Final checks: every acknowledged proposal is held by every live replica
  // that committed its index.
  void CheckAcknowledged();
  std::string TraceTail() const;
  void Trace(const std::string& line);
  bool tracing() const { return opt_.verbose || trace_keep_; }
  void KeepTrace(bool keep) { trace_keep_ = keep; }

 private:
  using RegionKey = std::pair<Ballot, uint64_t>;
  struct Node {
    std::unique_ptr<Replica> rep;
    bool paused = false;
    uint64_t incarnation = 0;
    DurableState durable;
    // Disk: issued writes in FIFO order, with their completion times.
    std::deque<PersistOp> disk;
    size_t disk_scheduled = 0;  // leading ops of `disk` whose completion is scheduled
    uint64_t disk_free_at = 0;
    bool disk_held = false;
    std::vector<uint64_t> persisted_while_paused;
    // Memory the replica owns: log regions (recent streams) and its ack array.
    std::map<RegionKey, std::vector<uint8_t>> regions;
    std::deque<RegionKey> region_order;
    RegionKey reading{0, 0};
    bool has_reader = false;
    std::unique_ptr<RingReader> reader;
    ControlWord last_control{};
    std::vector<uint8_t> acks;  // replicas * kAckSlotBytes
    std::vector<AckWord> last_acks;
    std::vector<Message> deferred;  // messages that arrived while paused
    uint64_t checked_upto = 0;       // agreement checked up to this commit index
  };
  enum class Ev : uint8_t { kTick, kMessage, kPut, kControl, kAck, kDisk, kUnreachable, kCrash, kRestart };
  struct Event {
    Ev kind;
    int to = -1;
    int from = -1;
    uint64_t incarnation = 0;  // of `to`, for ticks and disk completions
    Message msg;
    Ballot ballot = 0;
    uint64_t stream = 0;
    uint64_t offset = 0;
    std::string bytes;
    ControlWord control{};
    AckWord ack{};
    uint64_t seq = 0;
  };
  struct Tracked {
    int replica;
    uint64_t incarnation;
    uint64_t index;
    Entry entry;  // type + payload
    bool acked = false;
  };

  void Schedule(uint64_t at, Event ev);
  uint64_t Delay();
  bool Chance(double p);
  void Process(Event& ev);
  void Poll(int r);
  void Drain(int r);
  void SyncRegion(int r);
  void StartReplica(int r);
  void ApplyDurable(int r, const PersistOp& op);
  void ScheduleDisk(int r);
  int Down() const;  // replicas crashed or paused
  void CheckInvariants();
  std::string Describe(int r) const;

  SimOptions opt_;
  int n_;
  std::mt19937_64 rng_;
  uint64_t now_ = 0;
  uint64_t next_event_seq_ = 0;
  std::map<std::pair<uint64_t, uint64_t>, Event> events_;  // (time, seq) -> event
  std::vector<Node> nodes_;
  std::vector<std::vector<bool>> links_;
  bool lossy_ = true;
  uint64_t next_incarnation_ = 1;

  // Invariant state.
  std::map<uint64_t, Entry> committed_;               // index -> committed (type, payload)
  std::map<Ballot, std::pair<int, uint64_t>> leaders_;  // ballot -> (replica, incarnation)
  // Client proposals not yet known committed, per replica: index -> proposal.
  std::vector<std::map<uint64_t, Tracked>> pending_;
  std::vector<Tracked> acked_;
  uint64_t crashes_ = 0;
  uint64_t steps_ = 0;
  std::string violation_;

  bool trace_keep_ = true;
  std::deque<std::string> trace_;
};

}  // namespace lockstep
