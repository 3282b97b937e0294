// sim.h — deterministic simulator for the protocol core (core.h).
//
// N Replicas run under a simulated clock and one seeded PRNG. The simulator
// plays every adapter the daemon plays in production, and plays it badly on
// purpose:
//  - messages arrive after a random delay, or never, or twice, in any order;
//  - one-sided puts land in the target's log region for (ballot, stream) after
//    a random delay, sometimes torn in two parts that land at different times
//    (in either order), sometimes not at all. A put for a region its owner no
//    longer reads lands there anyway, and the owner reuses the memory as the
//    daemon does (guard/daemon/peer_link.cc: the three newest regions are kept,
//    older ones zeroed and given to later streams), so a late put for an old
//    stream can land in the stream read now. Control and ack words are
//    words in memory: the last write to land wins, whichever was issued last;
//  - the one-sided writes of one link can be held back and then land one
//    after another, in order, while messages still flow (TCP retransmitting
//    the transport's connection after a partition healed: HoldOneSided);
//  - durable writes complete in FIFO order after a random delay, group-
//    committed like the daemon's disk writer, and only a completed write
//    reaches the replica's durable state;
//  - replicas crash (losing what is not durable, though a crash may let some
//    in-flight writes, or a prefix of one, reach the disk: a torn tail) and
//    restart from their durable state with a new incarnation; crashes are
//    also aimed at the windows right after a promise or a new entry was
//    issued; partitions (whole or one direction of one link) come and heal; a
//    leader pauses and resumes after someone else was elected; a leader
//    hands over to another replica (Replica::HandOver), live or not, or
//    moves leadership to one (Replica::TransferLeadership: proposals stop,
//    the target catches up, then the hand-over), which may time out.
// After every event it checks: agreement (a committed slot never changes
// value, on any replica), durability (an acknowledged proposal stays
// committed at its index; a replica's durable index, which it acks and counts
// towards commits, only covers slots its disk holds with exactly the values
// it has; the commit index in a durable write never covers a slot the same
// write changes, so a torn write cannot leave a stale slot under it), Paxos'
// invariant on durable acceptances (once a majority accepted a value at a
// slot under a ballot, every higher ballot there carries the same value,
// whether or not anyone learned it was chosen), one leader per ballot (and
// it is the ballot's replica), and Paxos' acceptor rule where it becomes
// visible (a replica promises, joins, acks new entries or leads only under a
// ballot its disk holds as promised). LS_ASSERT failures inside the core are
// caught and reported the same way. At the end, with every fault healed, it requires
// progress: a new proposal commits on every replica within a bounded time.
//
// With SimOptions::membership the run also changes the configuration under
// all of the above (Replica::ProposeMembershipChange): it adds a learner (a
// new replica with a fresh id, starting empty; a leader that truncated what
// it lacks makes it install a checkpoint, which the simulator plays from
// the committed record), promotes it once it caught up, removes a voter
// (the leader too), and so on, between 3 (or `replicas`) and one more
// voter. Ids run up to kMaxMemberIds - 1: the cluster then has that many
// node slots, most of them absent (never started, or retired once the
// change removing them committed). Its checks take the configurations into
// account: Paxos' chosen-value invariant counts a value chosen when its
// acceptors hold a majority of every configuration seen so far; and two
// leaders must never both be able to commit: whenever a replica leads a
// ballot while another leads a higher one, the voters of the lower one's
// configuration must not include a majority whose durable promises are
// all at or below its ballot ("membership: two majorities").
// SimOptions::membership_bug plants a known bug (PlantedBug) to show that
// this check finds it.
//
// Same options, same result, bit for bit: decisions come only from the seeded
// PRNG (with our own draws, not <random>'s library-specific distributions),
// and containers are iterated in order. A violation is reported with the
// invariant, the simulated time, the seed and the last trace lines (the run is
// replayed with tracing on to get them; verbose prints the full trace).
//
// SimCluster is the driver; RunSimulation adds random faults and client load
// on top of it. Unit tests drive SimCluster directly for hand-made scenarios.
// A SimCluster installs a throwing LS_ASSERT handler for its lifetime (the
// handler is process-wide): run one simulation at a time in a process.
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
  uint64_t step_down_min_us = 0;  // Config::step_down_min_us (the daemon: 2 s)
  // CoreConfig::lease_us: every step checks that no replica leads a higher
  // ballot, nor has a slot committed past its commit index, while one holds
  // a lease (the lease reads' safety). lease_check_overrun_us stretches
  // each lease by that much in the check only: a test that the check
  // catches a lease outliving its guard (a slow leader clock, an off-by-one).
  uint64_t lease_us = 7'500;
  uint64_t lease_check_overrun_us = 0;
  uint64_t tick_us = 250;  // how often each replica is ticked and polls memory

  // Network: messages, puts, control and ack words.
  uint64_t delay_min_us = 5;
  uint64_t delay_max_us = 200;
  double slow_rate = 0.02;  // fraction delayed up to slow_max_us
  uint64_t slow_max_us = 20000;
  double drop_rate = 0.02;               // messages, control and ack words
  double dup_rate = 0.02;                // messages only (one-sided writes never duplicate)
  double put_drop_rate = 0.002;          // a lost put: the reader stalls and rejoins
  double torn_put_rate = 0.1;            // a put lands in two parts, in either order
  double unreachable_notice_rate = 0.5;  // peers told (OnPeerUnreachable) of a crash

  // Disk.
  uint64_t disk_min_us = 30;
  uint64_t disk_max_us = 400;
  double slow_disk_rate = 0.02;  // a write that takes up to slow_disk_max_us
  uint64_t slow_disk_max_us = 5000;
  // At a crash, the writes not yet reported complete may have reached the
  // disk anyway, all of them or a prefix of their records (a torn tail that
  // still checks out record by record).
  double torn_tail_rate = 0.3;

  // Faults (RunSimulation only). Mean intervals between starts; 0 disables.
  bool faults = true;
  uint64_t crash_every_us = 120'000;
  uint64_t restart_min_us = 2'000;
  uint64_t restart_max_us = 80'000;
  double crash_leader_bias = 0.5;  // share of crashes aimed at the leader
  uint64_t partition_every_us = 150'000;
  uint64_t partition_min_us = 5'000;
  uint64_t partition_max_us = 120'000;
  uint64_t pause_every_us = 200'000;
  uint64_t pause_max_us = 300'000;  // a paused leader resumes at the latest after this
  double pause_anyone_rate = 0.3;   // share of pauses aimed at any replica, not the leader
  uint64_t spurious_unreachable_every_us = 100'000;  // transport wrongly reports a live peer lost
  // The one-sided writes of one direction of one link are held back for up
  // to hold_one_sided_max_us and then land together (HoldOneSided).
  uint64_t hold_one_sided_every_us = 150'000;
  uint64_t hold_one_sided_max_us = 150'000;
  uint64_t hold_drain_us = 20;  // then one held write lands every this many us
  uint64_t truncate_every_us = 100'000;
  // A leader hands over (Replica::HandOver) to a random other replica, which
  // may be down, partitioned or paused, and holds back its own candidacy
  // for up to handover_hold_max_us.
  uint64_t handover_every_us = 150'000;
  uint64_t handover_hold_max_us = 100'000;
  // A leader moves leadership (Replica::TransferLeadership, `lockstep leader
  // move`) to a random other replica, giving up after up to
  // transfer_timeout_max_us; its hold after the hand-over is drawn as above.
  uint64_t transfer_every_us = 150'000;
  uint64_t transfer_timeout_max_us = 60'000;
  // Truncate below what a majority (not every replica) holds: lagging
  // replicas then need a snapshot and progress is required of a majority.
  bool truncate_lagging = false;
  // Crashes aimed at the windows that matter: right after a replica issued the
  // durable write of a promise, or a leader the write of a new entry (before
  // either completes, so it may or may not survive), or a leader learned of a
  // commit (before any backup did).
  double crash_on_promise_rate = 0.05;
  double crash_on_append_rate = 0.001;
  double crash_on_commit_rate = 0.002;  // a leader right after it learned of a commit

  // Client load (RunSimulation only).
  uint64_t propose_every_us = 400;   // mean interval between proposals
  double large_payload_rate = 0.03;  // payloads of a few KiB
  double huge_payload_rate = 0.003;  // payloads near the region's limit

  // End of the run: heal everything, wait quiet_us, then a new proposal must
  // commit on every replica within progress_timeout_us.
  uint64_t quiet_us = 200'000;
  uint64_t progress_timeout_us = 1'000'000;

  size_t trace_lines = 30;  // trace lines kept for a violation report

  // Membership changes (RunSimulation only): one attempted every
  // membership_every_us on average (add a learner, promote it, remove a
  // voter); a learner is promoted within promote_within_entries.
  bool membership = false;
  uint64_t membership_every_us = 60'000;
  uint64_t promote_within_entries = 200;
  // Plants PlantedBug::kMembershipWithoutRules in every replica, and the
  // run then proposes two changes at once (a test of the checks).
  bool membership_bug = false;
};

struct SimResult {
  bool ok = true;
  std::string violation;   // empty if ok; else the invariant, the time, the seed and a trace tail
  uint64_t committed = 0;  // highest index committed anywhere
  uint64_t acknowledged = 0;  // client proposals acknowledged as committed
  uint64_t elections = 0;     // ballots that got a leader
  uint64_t lease_checks = 0;  // steps at which a replica held a lease
  uint64_t crashes = 0;
  uint64_t steps = 0;  // events processed
  // Leader moves (TransferLeadership) started, and how they ended.
  uint64_t transfers = 0, transfers_handed_over = 0, transfers_timed_out = 0;
  // Membership changes proposed and committed, learners that installed a
  // checkpoint, and the voters at the end.
  uint64_t membership_changes = 0, membership_committed = 0, checkpoints_installed = 0;
  int final_voters = 0;
  // CRC32C of what the run ended with: the simulated time, the step count and
  // every replica's committed entries (index, ballot, type, payload). Two runs
  // with the same digest made the same decisions (`lockstep sim --digest`).
  uint32_t digest = 0;
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

  // Faults. A crash loses the durable writes not yet complete, except that,
  // at random (torn_tail_rate), some reached the disk anyway.
  void Crash(int r);
  // A crash after which exactly the first `whole` pending writes and the
  // first `records` slot records of the next one reached the disk.
  void CrashTorn(int r, size_t whole, size_t records);
  void Restart(int r);
  bool up(int r) const { return nodes_[r].rep != nullptr; }
  // Whether node r takes part in the cluster: started once and not retired.
  // Without membership changes every node does.
  bool present(int r) const { return nodes_[r].present; }
  // Membership: starts node r (a fresh id) empty, as a replica the
  // configuration does not hold yet; retires node r for good (its process
  // stops and never comes back; its id is never reused).
  void AddNode(int r);
  void RetireNode(int r);
  // Leader r proposes a membership change (Replica::ProposeMembershipChange).
  ProposeResult ProposeMembershipChange(int r, const MembershipChange& change);
  // The configuration of the highest committed kConfig entry (else the
  // initial one), and every configuration any replica wrote to its disk.
  const Membership& committed_membership() const { return committed_membership_; }
  uint32_t ever_committed_members() const { return ever_committed_members_; }
  // Replicas that may be down at once and leave a majority of every
  // configuration in play: the committed one and each live leader's.
  int Tolerate() const;
  uint64_t checkpoints_installed() const { return checkpoints_installed_; }
  // A paused replica is not ticked and handles nothing; puts and words still
  // land in its memory, messages queue up. On Resume it ticks once, sees its
  // completed durable writes, and gets the queued messages shortly after.
  void Pause(int r);
  void Resume(int r);
  bool paused(int r) const { return nodes_[r].paused; }
  // Tells `at` (OnPeerUnreachable), shortly, that `peer` is unreachable.
  void NotifyUnreachable(int at, int peer);
  // Cuts (or restores) everything from `from` to `to`: messages, puts, words.
  void SetLink(int from, int to, bool connected);
  bool link(int from, int to) const { return links_[from][to]; }
  void Partition(const std::set<int>& side);  // cut side from the rest, both ways
  void Heal();                                // restores every link
  // Puts, control words and acks from `from` to `to` issued before until_us
  // land from until_us on, in the order issued, one every hold_drain_us
  // (and later ones queue behind them); messages are not held. What the UCX
  // connection does while TCP retransmits after a partition healed.
  void HoldOneSided(int from, int to, uint64_t until_us);
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
  // Leader r hands leadership over to `successor` (Replica::HandOver).
  bool HandOver(int r, int successor, uint64_t hold_us);
  // Leader r moves leadership to `target` (Replica::TransferLeadership):
  // "" when it started, else the core's reason.
  std::string TransferLeadership(int r, int target, uint64_t timeout_us, uint64_t hold_us);

  // Queries.
  Replica* replica(int r) { return nodes_[r].rep.get(); }
  // The last ack word leader r read from peer p's slot (zero if none).
  AckWord LastAck(int r, int p) const { return nodes_[r].last_acks[p]; }
  const Replica* replica(int r) const { return nodes_[r].rep.get(); }
  const DurableState& durable(int r) const { return nodes_[r].durable; }
  // Fault injection for tests of the checker itself: a disk that lies, or
  // that writes what nobody asked it to (applied as a completed write).
  DurableState& mutable_durable(int r) { return nodes_[r].durable; }
  void InjectDurableWrite(int r, const PersistOp& op) { ApplyDurable(r, op); }
  uint64_t incarnation(int r) const { return nodes_[r].incarnation; }
  // The live, unpaused replica that leads the highest ballot, or -1.
  int Leader() const;
  // Every replica up, and each has committed at least `index` (with
  // membership changes: every member of the committed configuration).
  bool AllCommitted(uint64_t index) const;
  // A majority of replicas up and committed at least `index` (with
  // membership changes: of the committed configuration's voters).
  bool MajorityCommitted(uint64_t index) const;
  uint64_t MaxCommitted() const { return committed_.empty() ? 0 : committed_.rbegin()->first; }
  const std::map<uint64_t, Entry>& committed() const { return committed_; }
  size_t acknowledged() const { return acked_.size(); }
  uint64_t elections() const { return leaders_.size(); }
  uint64_t lease_checks() const { return lease_checks_; }
  uint64_t crashes() const { return crashes_; }
  // Leader moves started, and those that ended handed over or timed out.
  uint64_t transfers() const { return transfers_; }
  uint64_t transfers_handed_over() const { return transfers_handed_over_; }
  uint64_t transfers_timed_out() const { return transfers_timed_out_; }
  uint64_t steps() const { return steps_; }
  // Messages of this type sent so far (by any replica).
  uint64_t sent(Message::Type t) const { return sent_[static_cast<int>(t)]; }
  // Puts that landed in a region its owner no longer reads (a stale stream).
  uint64_t stale_region_puts() const { return stale_region_puts_; }
  // Bytes of records put into regions (wrap-around happens every ring_bytes).
  uint64_t put_bytes() const { return put_bytes_; }

  // First invariant violation ("" if none). Once set, events stop.
  const std::string& violation() const { return violation_; }
  bool failed() const { return !violation_.empty(); }
  void Fail(const std::string& what);  // records a violation (first one wins)
  // Final checks: every acknowledged proposal is held by every live replica
  // that committed its index.
  void CheckAcknowledged();
  void CheckLease(int r);
  std::string TraceTail() const;
  void Trace(const std::string& line);
  bool tracing() const { return opt_.verbose || trace_keep_; }
  void KeepTrace(bool keep) { trace_keep_ = keep; }

 private:
  using RegionKey = std::pair<Ballot, uint64_t>;
  struct Node {
    std::unique_ptr<Replica> rep;
    bool present = false;  // started once and not retired
    bool paused = false;
    uint64_t paused_at_us = 0;
    bool transfer_waiting = false;  // its leader move was in kWaiting at the last Drain
    uint64_t incarnation = 0;
    DurableState durable;
    // Disk: issued writes in FIFO order, with their completion times.
    std::deque<PersistOp> disk;
    size_t disk_scheduled = 0;  // leading ops of `disk` whose completion is scheduled
    uint64_t disk_free_at = 0;  // end of the last batch of writes
    uint64_t batch_start = 0;   // start of the last batch
    bool disk_held = false;
    std::vector<uint64_t> persisted_while_paused;
    // Memory the replica owns: log region buffers and its ack array. Every
    // region this incarnation opened keeps its buffer's address (a leader
    // may still put there), though only the three newest keep the buffer
    // itself: older ones go back to free_buffers, zeroed when reused.
    std::vector<std::vector<uint8_t>> buffers;
    std::map<RegionKey, size_t> region_buffer;  // (ballot, stream) -> buffer
    std::deque<RegionKey> region_order;         // regions that keep their buffer, newest last
    std::deque<size_t> free_buffers;
    RegionKey reading{0, 0};
    bool has_reader = false;
    std::unique_ptr<RingReader> reader;
    ControlWord last_control{};
    std::vector<uint8_t> acks;  // replicas * kAckSlotBytes
    std::vector<AckWord> last_acks;
    std::vector<Message> deferred;  // messages that arrived while paused
    uint64_t checked_upto = 0;      // agreement checked up to this commit index
    uint64_t last_commit = 0;       // commit index in its last Ready
    uint64_t durable_checked = 0;   // durable index verified against the disk up to here
  };
  enum class Ev : uint8_t {
    kTick,
    kMessage,
    kPut,
    kControl,
    kAck,
    kDisk,
    kUnreachable,
    kCrash,
    kRestart
  };
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
  uint64_t OneSidedAt(int from, int to);  // when a put, control or ack word issued now lands
  void ResetMemory(Node& nd);
  bool Chance(double p);
  void Process(Event& ev);
  void Poll(int r);
  void Drain(int r);
  // Calls op on replica r's core if r runs (not crashed, not paused), then
  // drains what the core made and checks the invariants; a core assertion
  // fails the run. False when r is down or paused (op not called). The
  // controls that act on one replica's core go through it (Propose,
  // ProposeMembershipChange, HandOver, TransferLeadership, TruncateBelow).
  bool Operate(int r, const std::function<void(Replica&)>& op);
  void SyncRegion(int r);
  void StartReplica(int r);
  void ApplyDurable(int r, const PersistOp& op);
  void ScheduleDisk(int r);
  void CrashImpl(int r, bool tear, size_t whole, size_t records);
  int Down() const;                                     // replicas crashed or paused
  const Entry* DurableAt(int r, uint64_t index) const;  // slot on r's disk, or null
  void RecordAcceptance(int r, const Entry& e);
  void CheckInvariants();
  // Membership checks: two leaders that could both commit (sim.h).
  void CheckTwoMajorities();
  // A backup the leader told to bring a checkpoint installs one from the
  // committed record (with the configuration at its index).
  void MaybeInstallCheckpoint(int r);
  void NoteMembership(const Membership& m);  // a configuration written somewhere
  std::string Describe(int r) const;

  SimOptions opt_;
  int n_;
  std::mt19937_64 rng_;
  uint64_t now_ = 0;
  uint64_t next_event_seq_ = 0;
  std::map<std::pair<uint64_t, uint64_t>, Event> events_;  // (time, seq) -> event
  std::vector<Node> nodes_;
  std::vector<std::vector<bool>> links_;
  std::vector<std::vector<uint64_t>> hold_one_sided_until_;  // [from][to]
  std::vector<std::vector<uint64_t>> one_sided_tail_;        // [from][to]: last held write lands
  bool lossy_ = true;
  uint64_t next_incarnation_ = 1;

  // Invariant state.
  struct Acceptance {
    EntryType type = EntryType::kNoop;
    std::string payload;
    uint32_t acceptors = 0;  // replicas whose disk held this (ballot, value) at the slot
  };
  struct SlotHistory {
    std::map<Ballot, Acceptance> by_ballot;
    bool chosen = false;
    Ballot chosen_ballot = 0;  // lowest ballot at which a majority accepted
  };
  std::map<uint64_t, SlotHistory> accepted_;  // slot -> every durable acceptance
  // Every configuration seen on a disk (the initial one first): a value is
  // taken for chosen once its acceptors hold a majority of each.
  std::vector<Membership> memberships_seen_;
  Membership committed_membership_;
  uint64_t committed_membership_index_ = 0;
  std::map<uint64_t, Membership> committed_configs_;  // index -> what the entry there made
  uint32_t ever_committed_members_ = 0;
  uint64_t checkpoints_installed_ = 0;
  std::map<uint64_t, Entry> committed_;                 // index -> committed (type, payload)
  std::map<Ballot, std::pair<int, uint64_t>> leaders_;  // ballot -> (replica, incarnation)
  // Client proposals not yet known committed, per replica: index -> proposal.
  std::vector<std::map<uint64_t, Tracked>> pending_;
  std::vector<Tracked> acked_;
  uint64_t crashes_ = 0;
  uint64_t transfers_ = 0, transfers_handed_over_ = 0, transfers_timed_out_ = 0;
  uint64_t steps_ = 0;
  uint64_t sent_[Message::kTypes] = {};
  uint64_t stale_region_puts_ = 0;
  uint64_t put_bytes_ = 0;
  std::string violation_;
  uint64_t lease_checks_ = 0;

  bool trace_keep_ = true;
  std::deque<std::string> trace_;
};

}  // namespace lockstep
