// member.h — `lockstep member list|add|remove`: the cluster's membership
// changed through the log (consensus/membership.h, core.h "Membership
// change"), one single-server change at a time, each an admin's kConfig
// proposal to the leader (wire.h EncodeMembershipRequest).
//
// A replica is added as a learner under the lowest id never used (the
// configuration's next_id): its [[replica]] section goes into cluster.toml
// first (the daemons read its address from there when the log names it),
// its certificate is signed with the cluster CA, the add is committed, and
// on a local cluster the replica is started here. It catches up by state
// transfer and the log, and is promoted to voter once its durable log is
// within the leader's promotion window (CoreConfig::promote_within_entries).
// Removing the leader moves leadership away
// first; a removed replica is stopped and marked `removed` in cluster.toml.
#pragma once

#include <string>

#include "guard/common/config.h"
#include "guard/common/json.h"

namespace lockstep {

struct MemberListing {
  int leader = -1;
  Json membership;  // the leader's status "membership" object
  Json peers;       // ... and its "peers" (lag = the leader's last index - match)
  uint64_t last_index = 0;
};
// The leader's view of the configuration. False (*error) without a leader.
bool ListMembers(const ClusterConfig& config, MemberListing* out, std::string* error);
// A table for people: a line per member (role, voter or learner, lag).
std::string FormatMemberTable(const ClusterConfig& config, const MemberListing& listing);

struct MemberAddOptions {
  std::string dir;       // the cluster directory of a local cluster ("" : real hosts)
  std::string host;      // "" : replica 0's host (a local cluster)
  int wait_ms = 120000;  // for the new replica to catch up and be promoted
  bool promote = true;   // false: leave it a learner
  bool quiet = false;
};
struct MemberAddOutcome {
  int id = -1;
  uint64_t added_index = 0, promoted_index = 0;
  double catch_up_ms = 0;  // from its start until promoted
};
bool AddMember(ClusterConfig* config, const MemberAddOptions& o, MemberAddOutcome* out,
               std::string* error);

// Promotes learner id to voter, retrying while the leader says it has not
// caught up, for up to wait_ms.
bool PromoteMember(const ClusterConfig& config, int id, int wait_ms, bool quiet, uint64_t* index,
                   std::string* error);

// Takes replica id out through the log (the leader hands over first when it
// is the one), then, on a local cluster (dir), stops it; cluster.toml marks it
// removed either way.
bool RemoveMember(ClusterConfig* config, const std::string& dir, int id, bool quiet,
                  uint64_t* removed_index, std::string* error);

}  // namespace lockstep
