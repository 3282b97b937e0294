// server_pipeline.h — the replicated server's side of the daemon. It starts
// the server with the preload shim and owns the shared-memory channel to
// it; on the leader it proposes the inputs the shim submits (as kInput log
// entries naming the connection by the ballot that accepted it), and on
// every replica it hands committed entries to the server in log order: the
// leader's own inputs are released to its shim, everyone else's are replayed
// over local TCP. A new leader first catches its server up and closes the
// connections earlier leaders accepted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "consensus/core.h"
#include "guard/config.h"
#include "guard/event_loop.h"
#include "guard/replay.h"
#include "guard/replica_log.h"
#include "guard/server.h"
#include "guard/shim_channel.h"

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
  // Checked now and then: false when the replica must stop (the server
  // exited, or its shim broke the channel), said in the log.
  bool Healthy(uint64_t now);

  // Sleep handshake with the shim: false when work arrived meanwhile.
  bool PrepareSleep();
  void Awake();

  uint64_t applied() const { return applied_; }
  int server_pid() const;
  size_t replay_connections() const;

 private:
  // One of our shim's inputs proposed to the log.
  struct OwnPending {
    uint64_t seq;
    uint32_t conn;
    uint8_t kind;
    uint64_t proposed_us;
  };
  bool ReadyToServe();
  bool OwnConn(const ConnKey& k) const;
  void ReportInputs(uint64_t now);

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

  uint64_t applied_ = 0;                        // log entries handed to the server (or replayer)
  std::map<uint64_t, OwnPending> own_pending_;  // our shim's proposals, by log index
  std::map<uint32_t, ConnKey> own_conns_;       // our shim's connections
  std::set<uint32_t> broken_own_;               // an input was dropped: refuse the rest
  std::set<ConnKey> open_conns_;                // open according to the applied log
  std::set<ConnKey> closing_;                   // CLOSE proposed by us as a new leader
  bool close_old_pending_ = false;
  uint64_t close_old_after_ = 0;
  Ballot serving_ballot_ = 0;         // the ballot under which our server serves clients
  bool holding_submissions_ = false;  // a new leader's server is still catching up
  bool truncated_warned_ = false;
  uint64_t next_health_check_us_ = 0;
  uint64_t inputs_committed_ = 0;  // since the last report
  double input_commit_us_sum_ = 0;
  uint64_t next_input_report_us_ = 0;
};

}  // namespace lockstep
