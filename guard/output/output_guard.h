// output_guard.h — output checking, divergence reports and repair: the
// guard's second half, one per replica, run on the daemon's loop.
//
// Every pass it reads the digests of what its server sent (ServerPipeline::
// PollOutput). A backup reports them to the leader over its peer
// connection: the mark points (every 64 KiB of a stream), the ends of
// streams, and every kSampleUs the newest point of each connection that
// moved, so that a quiet connection is checked too. The leader judges them
// against its own (output_check.h), and for each divergent backup writes a
// report (divergence_report.h) and orders a repair: roll back to the
// backup's newest checkpoint at or before the last agreeing check and
// replay; if it then diverges again at the same place, fetch a checkpoint
// from a replica that agrees instead. The backup carries the order out,
// holds its digests back meanwhile, and answers with what it did and its
// own output at the place; the leader completes the report and checks the
// backup again. A leader outvoted by a majority of backups that agree with
// each other is the divergent one: it hands leadership over to one of them
// (Replica::HandOver), stands for no election until it is repaired, and as
// a backup repairs itself by taking a checkpoint from a replica that agreed
// and replaying the log; its report says when the new leader came and how
// long the repair took, and the new leader checks it from then on.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "consensus/core.h"
#include "guard/common/config.h"
#include "guard/common/json.h"
#include "guard/common/replica_log.h"
#include "guard/net/wire.h"
#include "guard/output/divergence_report.h"
#include "guard/output/output_check.h"
#include "guard/server/server_pipeline.h"

namespace lockstep {

class OutputGuard {
 public:
  // send: a frame to a peer over the peer connection (false: not connected).
  using SendFn = std::function<bool(int to, FrameKind kind, const std::string& body)>;
  OutputGuard(const ClusterConfig& config, int id, Replica& core, ServerPipeline& pipeline,
              const ReplicaLog& log, SendFn send);

  void Step(uint64_t now);
  void OnPeerFrame(int from, FrameKind kind, std::string_view body, uint64_t now);
  // The oldest log entry the leader's open questions and repairs may quote
  // in a report (the daemon truncates no further); 0: none.
  uint64_t LogNeededFrom() const;
  // Status JSON object: checks, divergences, repairs.
  Json StatusJson() const;
  // For the daemon's metrics: what this replica judged while it led, since
  // it started (divergences found, repairs done and failed, recurrences).
  struct Counts {
    uint64_t divergences = 0, repairs_ok = 0, repairs_failed = 0, recurrences = 0;
  };
  Counts counts() const { return {divergences_, repairs_ok_, repairs_failed_, recurrences_}; }
  // `lockstep divergence`: the list (a JSON array of the reports held here)
  // or one report ("" when not here).
  std::string Divergence(const DivergenceRequest& req) const;

  static constexpr uint64_t kSampleUs = LS_OUT_SAMPLE_US;  // a backup's periodic points
  static constexpr uint64_t kForgetClosedUs = 30000000;    // a closed connection's points
  static constexpr uint64_t kRepairTimeoutUs = 120000000;
  // A leader that handed over stands for no election until repaired, at
  // most this long (the others elect one of themselves meanwhile).
  static constexpr uint64_t kSelfRepairHoldUs = kRepairTimeoutUs + 10000000;
  // A divergence found within this long after its replica's repairs is
  // their not holding (OnDivergence: Recurs): the server's own
  // nondeterminism.
  static constexpr uint64_t kRecurWithinUs = 60000000;
  static constexpr size_t kRepairsBeforeRecurring = 3;  // ... or after a transfer, 1
  // A recurring replica's checks resume after this, doubled at each
  // recurrence up to the last: each recurrence is counted in its report.
  static constexpr uint64_t kRecurFirstPauseUs = 30000000;
  static constexpr uint64_t kRecurLongestPauseUs = 1800000000;
  // How long a repaired former leader waits for its server to send again
  // what it sent differently (for its report).
  static constexpr uint64_t kExcerptWaitUs = 5000000;
  static constexpr size_t kMaxPointsPerFrame = 4096;
  static constexpr size_t kMaxHeldPoints = 65536;  // a repairing backup's, until it answers

 private:
  // ---- backup side
  struct ConnOut {
    OutputPoint latest;
    ServerPipeline::OutputSource source;  // where the sample reads its newest output
    uint64_t sent_offset = 0;
    uint64_t sent_us = 0;  // when a point of it was last sent
  };
  struct Repair {  // an order being carried out
    RepairOrder order;
    int from = -1;
    uint64_t started_us = 0;
    uint64_t target = 0;  // in sync once applied reaches the commit index at the order
    // ... and the server has read what was handed to it then (its replay
    // executed, not only queued: total_us includes it).
    bool marked = false;
    Replayer::HandedMark handed;
    RepairResult result;
    bool transferring = false;
    bool self = false;  // this replica's own repair after it handed over (self_)
  };
  void BackupStep(uint64_t now);
  void OnRepairOrder(int from, const RepairOrder& order, uint64_t now);
  // Starts a repair of this replica's server (an order, or its own).
  void StartRepair(Repair rep, uint64_t now);
  void RepairStep(uint64_t now);
  void SendPoints(uint64_t now);

  // ---- leader side
  struct LeaderRepair {
    DivergenceReport report;
    RepairHow how;
    uint64_t ordered_us = 0;
    // What the leader did itself before the backup's part of the repair
    // (RepairFromLeader): the report's action says it first.
    std::string leader_action;
  };
  struct LastRepair {
    ConnKey key;
    uint64_t offset = 0;
    RepairHow how = RepairHow::kRollback;
  };
  struct RepairDone {  // a repair of a backup that ended well, for Recurs
    uint64_t done_us = 0;
    RepairHow how = RepairHow::kRollback;
    std::string id;
  };
  // A backup whose divergence recurs: one report, counted up; its checks
  // pause, no repair is ordered (until its daemon restarts or another
  // replica leads).
  struct Recurring {
    DivergenceReport report;
    uint64_t resume_us = 0;  // its checks resume then (UINT64_MAX: they run)
    uint64_t pause_us = 0;   // the last pause
  };
  struct ClosedConn {
    uint64_t when_us;
    ConnKey key;
    bool state_probe;  // a state check's (ServerPipeline::IsStateProbe when it closed)
  };
  void LeaderStep(uint64_t now);
  void OnDivergence(const lockstep::Divergence& d, uint64_t now);
  // An order for the report's place (agreeing and the index bounds are the caller's).
  RepairOrder OrderFor(const DivergenceReport& r, RepairHow how) const;
  void SendRepairOrder(DivergenceReport r, const RepairOrder& order, uint64_t now,
                       std::string leader_action = "");
  // No backup agrees with the leader where one diverged and a rollback
  // cannot mend it: it takes a checkpoint of the leader's own server.
  void RepairFromLeader(DivergenceReport r, const std::string& why, uint64_t now);
  // The divergence comes back where repairs do not hold (above): the repair
  // that did not hold, or nullptr.
  const RepairDone* Recurs(const lockstep::Divergence& d, const DivergenceReport& r, uint64_t now);
  void OnRecurrence(const lockstep::Divergence& d, DivergenceReport r, const RepairDone* last,
                    uint64_t now);

  // ---- this replica as the divergent leader: it hands over, then repairs
  // itself as a backup. Kept across the change of role.
  enum class SelfPhase : uint8_t { kHandingOver, kRepairing };
  struct SelfRepair {
    SelfPhase phase = SelfPhase::kHandingOver;
    DivergenceReport report;
    std::vector<int> agreeing;  // the backups that agreed with each other
    int successor = -1;
    Ballot ballot = 0;  // the ballot this replica led
    uint64_t found_us = 0;
    uint64_t repaired_us = 0;   // 0: not (yet) repaired
    bool excerpt_done = false;  // the repaired server's output is in the report, or given up
  };
  // The leader's verdict on itself: hand over and keep the report.
  void HandOverDivergent(const lockstep::Divergence& d, DivergenceReport r, uint64_t now);
  // Once a backup: starts the repair; notes the new leader in the report.
  void SelfRepairStep(uint64_t now);
  void FinishSelfRepair(const RepairResult& result, uint64_t now);
  void OnRepairResult(int from, const RepairResult& result, uint64_t now);
  // The replica's side of the place, from its answer, into the report.
  void AddExcerpt(DivergenceReport* r, int from, const RepairResult& result, const char* taken);
  void FillWindow(const ConnKey& key, RepairResult* result) const;
  void FillInputs(DivergenceReport* r) const;
  uint64_t StateAgreedIndex(int replica) const;
  OutputExcerpt OwnExcerpt(const ConnKey& key) const;
  void Save(DivergenceReport& r);  // stamps done_unix_ms once it is settled

  const ClusterConfig& cfg_;
  int id_, n_;                    // n_: one past the highest replica id seen in a configuration
  uint32_t checked_members_ = 0;  // what the checker was last told (SetMembers)
  int checked_voters_ = 0;
  Replica& core_;
  ServerPipeline& pipeline_;
  const ReplicaLog& log_;
  SendFn send_;
  std::string reports_dir_;

  Ballot ballot_ = 0;  // the ballot the state below belongs to
  bool leading_ = false;
  uint64_t server_id_ = 0;

  // backup
  std::map<ConnKey, ConnOut> conns_;
  std::vector<OutputPoint> outgoing_;
  uint64_t next_sample_us_ = 0;
  std::optional<Repair> repair_;
  bool repair_hold_ = false;  // candidacy held while a backup's repair runs (OnRepairOrder)
  uint64_t points_sent_ = 0;

  std::optional<SelfRepair> self_;

  // leader
  std::unique_ptr<OutputChecker> checker_;
  std::deque<ClosedConn> closed_;  // forgotten kForgetClosedUs later
  // By backup: the log index up to which its state last agreed with the
  // leader's (the newest state check whose probe it answered alike to the
  // end), from the probes forgotten so far; StateAgreedIndex adds those
  // still held.
  std::map<int, uint64_t> state_agreed_;
  std::map<std::string, LeaderRepair> repairs_;         // by report id, until answered
  std::map<int, LastRepair> last_repair_;               // by replica
  std::map<int, std::deque<RepairDone>> repairs_done_;  // by replica, the last kRecurWithinUs
  std::map<int, Recurring> recurring_;                  // by replica
  std::map<int, uint64_t> reporter_pid_;                // each backup's daemon, as it reports
  uint64_t next_report_ = 1;

  // counts since start
  uint64_t divergences_ = 0, repairs_ok_ = 0, repairs_failed_ = 0, recurrences_ = 0;
};

}  // namespace lockstep
