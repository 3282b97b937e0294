// server_pipeline.h — the replicated server's side of the daemon. It starts
// the server with the preload shim and owns the shared-memory channel to
// it; on the leader it proposes the inputs the shim submits (as kInput log
// entries naming the connection by the ballot that accepted it), and on
// every replica it hands committed entries to the server in log order: the
// leader's own inputs are released to its shim, everyone else's are replayed
// over local TCP. A new leader first catches its server up and closes the
// connections earlier leaders accepted.
//
// It is also the server's guard (server_guard.cc): a backup checkpoints its
// server now and then (guard/server/checkpointer.h) at a moment when the server
// has executed exactly the log up to an index; a restarted replica, and one
// whose server died, restores the newest good checkpoint and replays the
// log from there. A server that dies twice on the same entry is not
// restored again: the replica keeps its log and says which entry.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "consensus/core.h"
#include "guard/common/config.h"
#include "guard/common/event_loop.h"
#include "guard/common/json.h"
#include "guard/common/output_point.h"  // OutputPoint, SendStack
#include "guard/common/replica_log.h"
#include "guard/server/checkpoint_transfer.h"
#include "guard/server/checkpointer.h"
#include "guard/server/inspection.h"
#include "guard/server/replay.h"
#include "guard/server/server.h"
#include "guard/server/shim_channel.h"

namespace lockstep {

class ServerPipeline {
 public:
  // disk_error: non-empty while this replica cannot write its log (then a
  // leader refuses the shim's inputs); owned by the caller.
  ServerPipeline(const ClusterConfig& config, int id, EventLoop& loop, Replica& core,
                 const std::string& disk_error, const ReplicaLog& log);
  ServerPipeline(const ServerPipeline&) = delete;
  ServerPipeline& operator=(const ServerPipeline&) = delete;

  // Starts the server (the cluster has a [server]) and waits until it is
  // ready; false, logged, when it cannot. Without it the rest does nothing.
  bool Start();
  void StopServer();

  // Leader: hands the shim's inputs to the log; otherwise refuses them.
  bool ProcessSubmissions(uint64_t now);
  // Hands newly committed entries to the server, in log order.
  bool ApplyCommitted(uint64_t now);
  // The core's role or ballot changed.
  void OnRoleChange();
  // Tells the shim until when (the core's clock, NowUs) it may serve reads
  // without the log (0: not): only while this replica leads and serves,
  // with its server at work (not resting for a leader checkpoint). Called
  // after every step of the core, before anything it produced is sent: a
  // hand-over's kTakeOver leaves only once the shim has stopped.
  void PublishLease(uint64_t lease_until_us);
  // Reads the shim served under the lease, and read-only requests it sent
  // through the log for want of one.
  uint64_t lease_reads() const { return shim_ ? shim_->lease_reads() : 0; }
  uint64_t lease_misses() const { return shim_ ? shim_->lease_misses() : 0; }
  // Checked now and then: false when the replica must stop (the server
  // exited, or its shim broke the channel), said in the log.
  bool Healthy(uint64_t now);

  // Sleep handshake with the shim: false when work arrived meanwhile.
  bool PrepareSleep();
  void Awake();

  uint64_t applied() const { return applied_; }
  // Its server has read every input handed to it (applied() counts handed).
  bool server_read_all() const;
  // This replica leads and its server serves clients under that ballot.
  bool serving() const {
    return shim_ && core_.role() == Role::kLeader && serving_ballot_ == core_.promised();
  }
  // What the replayer handed the server so far, and whether the server has
  // read it since (Replayer::HandedSoFar, ReadPast). Empty / true without one.
  Replayer::HandedMark ReplayHanded() const {
    return replayer_ ? replayer_->HandedSoFar() : Replayer::HandedMark{};
  }
  bool ReplayReadPast(const Replayer::HandedMark& mark) const {
    return !replayer_ || replayer_->ReadPast(mark);
  }
  int server_pid() const;
  size_t replay_connections() const;
  // The local port the state checker's probe connects from (state_check.h):
  // an ACCEPT from it is named a probe's connection.
  void set_probe_port(std::function<uint16_t()> port) { probe_port_ = std::move(port); }
  // Connection `key` was a state check's probe (one of the last few).
  bool IsStateProbe(const ConnKey& key) const {
    return std::find(probe_conns_.begin(), probe_conns_.end(), key) != probe_conns_.end();
  }
  // Clients' requests (DATA inputs) this replica committed as leader, ever;
  // a state check's probe's are not counted.
  uint64_t client_data_committed() const { return client_data_committed_; }

  // Checkpoints (server_guard.cc). The log below this index is no longer
  // needed by this replica's server (0: all of it is).
  uint64_t log_needed_from() const;
  // `lockstep checkpoint now`: "" when one will be taken, else why not.
  std::string RequestCheckpoint();
  // Status: {"index":..,"age_s":..,...} of Checkpointer::StatusJson, plus
  // the server's state.
  Json CheckpointStatusJson(uint64_t now) const;
  // Checkpointer::counts() (all zero without checkpoints).
  Checkpointer::Counts CheckpointCounts() const;
  // This replica's checkpoints as JSON array text (lockstep checkpoint list).
  std::string CheckpointListJson() const;
  // "running", or why the server is not run any more.
  std::string server_state() const;
  // A peer asks for a checkpoint (state transfer) on `to`, the connection
  // its request came on; sent by a thread, then closed.
  void ServeCheckpoint(std::unique_ptr<Stream> to, uint64_t min_index);
  // An admin's `lockstep inspect` on `to` (inspection.h): relayed to the
  // server by a thread, which logs who and what.
  void ServeInspection(std::unique_ptr<Stream> to, const std::string& who, const std::string& peer,
                       const std::string& program);

  // ---- What the server sent (server_output.cc; output_guard.h judges it).
  // The next digest of the server's output, its connection named as the
  // log names it (applied: entries handed to the server so far); false when
  // there is none. Records the pipeline cannot name, and those of streams
  // the shim lost track of, are skipped (counted in unnamed_outputs()).
  // src, if given: where LatestOutput samples the connection later.
  struct OutputSource {
    uint32_t conn = 0;  // the shim's number of the connection
    int out_slot = -1;  // its output window; -1: none
  };
  bool PollOutput(OutputPoint* p, uint32_t* flags, OutputSource* src = nullptr);
  // The connection's newest output as its window has it now (offset,
  // digest; applied: entries handed to the server so far), for a backup's
  // periodic sample; false if the window no longer holds it.
  bool LatestOutput(const OutputSource& src, OutputPoint* p) const;
  // The server's latest output on connection `key`; false: not kept.
  bool RecentOutput(const ConnKey& key, ShimChannel::OutputWindow* w) const;
  // The stacks of w's sends, named from the running server's files
  // (guard/server/symbolize.h). Slow (reads ELF files): for a divergence only.
  std::vector<SendStack> DescribeSends(const ShimChannel::OutputWindow& w) const;
  uint64_t unnamed_outputs() const { return unnamed_outputs_; }
  // Counts the servers this replica ran (launched or restored): a restored
  // server sends again what its checkpoint had not yet sent.
  uint64_t server_id() const { return server_id_; }
  // Repair of a divergent server: back to the newest good checkpoint at or
  // below max_index, and the log replays the rest. False (error) if there
  // is none the log can bring forward, or it does not restore.
  // *restored: the checkpoint's index; *afresh: none was restored, the
  // server was started afresh (the whole log replays; never under a
  // cloned start, whose image is the oldest state there is).
  bool RollBack(uint64_t max_index, uint64_t* restored, bool* afresh, std::string* error);
  // Repair by state transfer: fetches a checkpoint the log can bring
  // forward from one of the peers in `agreeing` (whose servers agree with
  // the leader's; nobody else is asked), restores it and replays.
  // Asynchronous: repair_transfer() says where it is.
  void StartRepairTransfer(const std::vector<int>& agreeing, uint64_t min_index);
  // A leader whose server is stopped hands leadership over (server_guard.cc).
  void HandOverIfStopped(uint64_t now);
  enum class RepairTransfer : uint8_t { kNone, kRunning, kDone, kFailed };
  RepairTransfer repair_transfer() const { return repair_transfer_; }
  // kDone: the checkpoint restored; kFailed: why.
  uint64_t repair_transfer_index() const { return repair_transfer_index_; }
  const std::string& repair_transfer_error() const { return repair_transfer_error_; }
  void ClearRepairTransfer() { repair_transfer_ = RepairTransfer::kNone; }
  // Repair's last resort (output_guard.h): no backup's server agrees with
  // the leader's, so no backup has a checkpoint to give; the backups take
  // one of the leader's own server instead. The leader closes every client
  // connection through the log (as a new leader does: a TCP connection
  // cannot move to another host), refuses new inputs until its server has
  // finished with them and rests at an index, dumps it there as a backup
  // dumps its own, and serves again while the images are committed. Its
  // clients reconnect, as after a change of leader. Asynchronous
  // (server_guard.cc, LeaderCheckpointStep): a backup that asks for it
  // meanwhile is answered once it is committed (CheckpointSenders::Serve's
  // `coming`), or told there is none if it failed. Asked for while one is
  // being dumped, another follows it: the one in flight may be older than
  // what the asker needs.
  // False (why) when this replica cannot: not the leader, no server, or
  // checkpoints off.
  bool StartLeaderCheckpoint(uint64_t now, std::string* why_not);

 private:
  bool HoldReplay(uint64_t now, uint64_t commit);
  static constexpr uint64_t kHealthCheckUs = 100000;  // how often the server's exit is checked
  // A server that dies this soon after reading an input is taken to die of it.
  static constexpr uint64_t kCrashAttributionUs = 2000000;
  static constexpr int kMaxDeathsWithoutProgress = 3;
  // A leader whose server has been stopped this long hands leadership over
  // (HandOverIfStopped), and then stands for no election for kStoppedHoldUs.
  static constexpr uint64_t kStoppedHandOverUs = 200000;
  static constexpr uint64_t kStoppedHoldUs = 1000000;
  // One of our shim's inputs proposed to the log.
  struct OwnPending {
    uint64_t seq;
    uint32_t conn;  // TICK: the epoll set
    uint8_t kind;
    uint64_t proposed_us;
    uint64_t ballot = 0;  // TICK: the ballot it was proposed under (its key's)
  };
  bool ReadyToServe();
  bool BatchBehindRound(uint64_t now) const;
  bool OwnConn(const ConnKey& k) const;
  void ReportInputs(uint64_t now);
  // Starts a fresh, empty server (the whole log is replayed into it).
  bool LaunchServer(std::string* error);
  void MaybeFlipInput(std::string* bytes, uint64_t index);  // a test failpoint
  // Wall-clock stamps of proposed inputs (log_input.h): never below one
  // already in the log, nor below at_least (a tick's least stamp, within
  // kTickAheadMaxNs of the clock).
  uint64_t Stamp(uint64_t at_least = 0);
  static constexpr uint64_t kTickAheadMaxNs = 60'000'000'000ull;
  void NoteLogClock();
  // A test failpoint of a leader (server_output.cc): true when `flipped`
  // holds the client's bytes with one changed, to be proposed instead.
  bool MaybeFlipProposal(std::string_view bytes, std::string* flipped);
  // Makes the replayer for the current channel and watches the shim's wake fd.
  void ConnectServer();
  // Stops the server and forgets its channel and replay connections.
  void DropServer();

  // server_guard.cc
  void OpenCheckpoints();
  // Restores checkpoint `cp` in place of the current server (if any): the
  // server, its channel and its replay connections, applied_ = cp.index.
  bool RestoreServer(const CheckpointInfo& cp, std::string* error);
  void InstallRestored(uint64_t now, uint64_t index);
  // The configuration the last restored checkpoint recorded (none: older).
  std::optional<Membership> restored_membership_;
  // Restores the newest good checkpoint with index <= max_index that the log
  // can bring forward; false when there is none (or none restores).
  bool RestoreNewest(uint64_t max_index, const char* why);
  // The server died: restore it (or start it afresh) and replay; false
  // when it cannot be brought back (server_failed_ says why).
  bool Recover(const std::string& how, uint64_t now);
  // Replaces the server (dead or alive) with a fresh one that replays the
  // whole log, which must start at entry 1; false (*error) when it does not
  // start, and then there is no server.
  bool StartAfresh(const char* why, std::string* error);
  // After a new server (restored or fresh) took over: its shim's mode, and
  // on a leader the catch-up before it serves again.
  void ResumeRole();
  // Backups: checkpoint when due, once the server has read all it was given.
  // True while applying must wait (a checkpoint is being prepared or dumped).
  bool CheckpointStep(uint64_t now);
  // The leader's own checkpoint, where it stands (kNone: none under way).
  enum class LeaderCheckpoint : uint8_t { kNone, kPreparing, kDumping, kCommitting };
  bool LeaderCheckpointStep(uint64_t now);
  std::string RestBusy() const;
  void FailLeaderCheckpoint(const std::string& why);
  bool TakeCheckpoint(uint64_t now, bool may_break = true);
  // State transfer: fetches a peer's checkpoint when the leader says this
  // backup lacks truncated entries (or a dead server has nothing else to
  // come back from), restores it, and moves the log past it.
  void TransferStep(uint64_t now);
  // The server is down and no local checkpoint rebuilds it (the log starts
  // at first_index > 1): fetch a peer's checkpoint at first_index - 1 or
  // later. Without checkpoints the server stays down, said in the status;
  // it never runs on a partial log.
  void RebuildFromPeer(const std::string& why);
  // cloned_start (config.h): whether this replica starts the cluster's
  // first server (replica 0, nothing in its log or store, and no peer that
  // answers has anything either); why not otherwise.
  bool IsCloneOrigin(std::string* why_not);
  // Replica 0 of a new cluster: starts the server and dumps it at index 0
  // before its first input; false (logged) when either fails.
  bool StartCloneOrigin();
  // Every other server of a cloned_start cluster: fetched from a peer's
  // checkpoints (replica 0's image at first); no election is stood for
  // until it runs.
  void CloneFromPeer(const std::string& why);
  // Restores checkpoint `index` of the store (just fetched or our own).
  bool RestoreIndex(uint64_t index, std::string* error);

  const ClusterConfig& cfg_;
  const ReplicaConfig& me_;
  EventLoop& loop_;
  Replica& core_;
  const std::string& disk_error_;
  const ReplicaLog& log_;

  // Absent when the cluster has no [server]. The replayer, which uses the
  // channel, is destroyed first.
  std::unique_ptr<ShimChannel> shim_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Replayer> replayer_;
  std::vector<int> server_fds_;  // the channel's fd numbers inside the server

  std::unique_ptr<Checkpointer> checkpointer_;  // absent when disabled or unusable
  uint64_t hold_since_us_ = 0;      // HoldReplay: when the oldest unapplied entry was first held
  uint64_t log_bytes_applied_ = 0;  // payload bytes applied (the byte rule)
  uint64_t ticks_applied_ = 0;      // TICK entries among those applied (not in the entry rule)
  bool checkpoint_wanted_ = false;  // due: applying waits until the server is at rest
  uint64_t rest_wait_since_us_ = 0;
  int dump_watch_fd_ = -1;         // criu's pidfd, watched by the loop while it dumps
  uint64_t restored_index_ = 0;    // the checkpoint the server was last restored from
  uint64_t last_crash_entry_ = 0;  // the entry the server last died on (0: none)
  uint64_t crashes_ = 0;
  uint64_t last_death_applied_ = 0;  // applied_ when the server last died
  int deaths_without_progress_ = 0;
  uint64_t bytes_read_seen_ = 0;      // Replayer::BytesRead at the last health check
  uint64_t last_read_change_us_ = 0;  // when it last grew
  std::string server_failed_;         // non-empty: the server is not run any more, and why
  uint64_t stopped_since_us_ = 0;     // when the server was first seen stopped (0: running)
  bool close_all_open_ = false;       // a restored leader closes every connection, its own too

  std::unique_ptr<CheckpointSenders> senders_;
  std::unique_ptr<Inspections> inspections_;  // made at the first inspection
  std::unique_ptr<CheckpointFetcher> fetcher_;
  // kNoServer: the server is down (it died, or the replica restarted) and
  // nothing here rebuilds it: the log starts past every local checkpoint.
  // kRepair: the server runs but diverged (StartRepairTransfer).
  // kClone: cloned_start, and no checkpoint here to start the server from:
  // any peer's will do (every one descends from replica 0's image).
  enum class FetchFor : uint8_t { kNone, kLagging, kNoServer, kRepair, kClone };
  FetchFor fetch_for_ = FetchFor::kNone;
  uint64_t fetch_min_ = 0;
  uint64_t next_fetch_us_ = 0;
  bool transfer_off_warned_ = false;
  bool clone_hold_ = false;      // candidacy held until a cloned server runs here
  uint64_t clone_since_us_ = 0;  // when the wait for a peer's image began
  uint64_t clone_said_us_ = 0;   // when the wait was last said in the log

  // Output (server_output.cc): the shim's connection numbers named as the
  // log names them, with their output windows. Numbers restart with each
  // server, so this does too.
  struct OutputName {
    ConnKey key;
    int out_slot = -1;
  };
  std::map<uint32_t, OutputName> output_names_;
  uint64_t unnamed_outputs_ = 0;
  uint64_t server_id_ = 0;
  RepairTransfer repair_transfer_ = RepairTransfer::kNone;
  uint64_t repair_transfer_index_ = 0;
  std::string repair_transfer_error_;
  int repair_fetch_failures_ = 0;
  std::vector<int> repair_sources_;  // the peers a repair's transfer may ask, and only they
  LeaderCheckpoint leader_cp_ = LeaderCheckpoint::kNone;
  uint64_t leader_cp_since_us_ = 0;  // when it was asked for (kPreparing's deadline)
  uint64_t leader_cp_index_ = 0;     // the index it is taken at
  bool leader_cp_again_ = false;     // asked for again while one was dumped or committed
  // Read by checkpoint senders' threads: a leader checkpoint is on its way,
  // or why the last one asked for never came.
  struct LeaderCheckpointNews {
    std::mutex mu;
    bool coming = false;
    std::string failed;
    void Set(bool now_coming, std::string why = {}) {
      std::lock_guard<std::mutex> g(mu);
      coming = now_coming;
      failed = std::move(why);
    }
    bool Coming(std::string* why_none) {
      std::lock_guard<std::mutex> g(mu);
      if (!coming && why_none) *why_none = failed;
      return coming;
    }
  };
  std::shared_ptr<LeaderCheckpointNews> leader_cp_news_ = std::make_shared<LeaderCheckpointNews>();
  static constexpr int kRepairFetchTries = 4;  // a peer asked takes a checkpoint for the next

  uint64_t applied_ = 0;      // log entries handed to the server (or replayer)
  uint64_t clock_stamp_ = 0;  // the newest wall-clock stamp proposed or applied (Stamp)
  std::map<uint64_t, OwnPending> own_pending_;  // our shim's proposals, by log index
  std::map<uint32_t, ConnKey> own_conns_;       // our shim's connections
  std::set<uint32_t> broken_own_;               // an input was dropped: refuse the rest
  std::set<ConnKey> open_conns_;                // open according to the applied log
  std::set<ConnKey> closing_;                   // CLOSE proposed by us as a new leader
  bool close_old_pending_ = false;
  uint64_t close_old_after_ = 0;
  Ballot serving_ballot_ = 0;         // the ballot under which our server serves clients
  bool holding_submissions_ = false;  // too many inputs in flight: wait for commits
  uint64_t held_at_commit_ = 0;       // the commit index they were held at
  uint64_t next_health_check_us_ = 0;
  uint64_t inputs_committed_ = 0;       // since the last report
  uint64_t client_data_committed_ = 0;  // clients' DATA inputs committed here, ever (no probe's)
  std::function<uint16_t()> probe_port_;
  std::deque<ConnKey> probe_conns_;  // the last state probes' connections (IsStateProbe)
  double input_commit_us_sum_ = 0;
  uint64_t next_input_report_us_ = 0;
};

}  // namespace lockstep
