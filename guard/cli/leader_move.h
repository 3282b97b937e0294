// leader_move.h — moving leadership on purpose, for maintenance: `lockstep
// leader move` asks the leader (an admin's request, wire.h kLeaderMove) to
// hand over to a replica that holds the whole log, then waits until that
// replica serves; `lockstep cluster restart --rolling` restarts every
// replica of a local cluster in turn with it, the leader last, moved away
// first, so that clients see one reconnect and no election timeout.
#pragma once

#include <functional>
#include <string>

#include "guard/common/config.h"

namespace lockstep {

struct LeaderMoveOutcome {
  int from = -1;            // the leader asked
  int to = -1;              // the leader after the move
  int handed_to = -1;       // the replica the old leader handed over to
  double handover_ms = 0;   // from the request until the old leader handed over
  double serving_ms = 0;    // from the request until the new leader served clients
  std::string leader_said;  // the old leader's reply text
};

// Moves leadership away from the current leader, to `target` (-1: the
// leader picks the backup furthest along), and waits up to wait_ms until
// the new leader serves its clients (with a server: caught up; without:
// leads). False with *error saying why: no leader, the request refused (not
// the admin's credential, target not ready, not a replica, the leader
// itself, no quorum), the target did not catch up in time, or no new
// leader served in time.
bool MoveLeader(const ClusterConfig& config, int target, int wait_ms, LeaderMoveOutcome* out,
                std::string* error);

// Stops replica `id` of the local cluster in dir (SIGTERM; its keeper lets
// it stay down), waiting up to 10 s, then SIGKILL. True once it is gone.
bool StopReplica(const std::string& dir, int id, std::string* error);

// `cluster restart --rolling`: every replica in turn, backups first (by
// id), then the leader after its leadership moved away: stopped, started
// again, and awaited until it has applied what the leader had committed
// when it came back and its server runs (up to catch_up_ms each). Every
// replica must be up when it starts. progress: one line per step.
bool RollingRestart(const std::string& dir, const ClusterConfig& config, int catch_up_ms,
                    const std::function<void(const std::string&)>& progress, std::string* error);

}  // namespace lockstep
