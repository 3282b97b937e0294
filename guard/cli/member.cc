// member.cc — `lockstep member list|add|remove` (member.h): the admin's side
// of a membership change. The rules of a change are the core's; this file
// asks the leader for one change at a time, keeps cluster.toml (the address
// book) in step, and starts or stops the replica on a local cluster.
#include "guard/cli/member.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "consensus/membership.h"
#include "guard/cli/cluster.h"
#include "guard/cli/leader_move.h"
#include "guard/common/replica_log.h"
#include "guard/net/client.h"
#include "guard/net/keys.h"
#include "guard/net/netns_hosts.h"
#include "guard/net/tls.h"

namespace lockstep {

namespace {

using Clock = std::chrono::steady_clock;

// cluster.toml rewritten whole, checked to read back, renamed into place.
bool WriteClusterToml(const ClusterConfig& c, std::string* error) {
  std::string text;
  return FormatCheckedClusterConfig(c, c.path, &text, error) &&
         WriteClusterConfigText(c.path, text, error);
}

// One change, proposed to the leader as an admin and waited for until
// committed. A refusal comes back as the core's reason.
bool ProposeChange(const ClusterConfig& config, MembershipChange change, uint64_t* index,
                   std::string* error) {
  int leader = FindLeader(config, 3000);
  if (leader < 0) {
    *error = "no leader found (is the cluster up? `lockstep cluster status`)";
    return false;
  }
  auto admin = Client::Connect(config, leader, 1000, error, Principal::kAdmin);
  if (!admin) return false;
  ProposeReply reply;
  if (!admin->Propose(EntryType::kConfig, EncodeMembershipRequest(change), &reply, error, 10000))
    return false;
  if (!reply.ok) {
    *error = "replica " + std::to_string(leader) + " (the leader): " + reply.error;
    return false;
  }
  *index = reply.index;
  return true;
}

// Retries a change the leader refuses for a passing reason (its own ballot
// not yet committed, the previous change not yet committed, a learner not
// yet caught up) until deadline; `progress` says what it waits for.
bool ProposeUntil(const ClusterConfig& config, MembershipChange change, Clock::time_point deadline,
                  bool quiet, uint64_t* index, std::string* error) {
  std::string last;
  for (;;) {
    if (ProposeChange(config, change, index, error)) return true;
    bool passing = error->find("retry") != std::string::npos ||
                   error->find("not committed yet") != std::string::npos ||
                   error->find("within") != std::string::npos ||
                   error->find("no leader") != std::string::npos ||
                   error->find("not the leader") != std::string::npos ||
                   error->find("leadership") != std::string::npos;
    if (!passing || Clock::now() >= deadline) return false;
    if (!quiet && *error != last) fprintf(stderr, "waiting: %s\n", error->c_str());
    last = *error;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

bool ListMembers(const ClusterConfig& config, MemberListing* out, std::string* error) {
  out->leader = FindLeader(config, 3000);
  if (out->leader < 0) {
    *error = "no leader found (is the cluster up? `lockstep cluster status`)";
    return false;
  }
  auto c = Client::Connect(config, out->leader, 1000, error);
  DaemonStatus st;
  if (!c || !c->Status(&st, error, 2000)) return false;
  if (st.membership.is_null()) {
    *error = "replica " + std::to_string(out->leader) +
             " does not report its configuration (an older daemon?)";
    return false;
  }
  out->membership = st.membership;
  out->peers = st.peers;
  out->last_index = st.last_index;
  return true;
}

std::string FormatMemberTable(const ClusterConfig& config, const MemberListing& l) {
  std::string out;
  char line[256];
  snprintf(line, sizeof line, "%-4s %-8s %-8s %-22s %s\n", "id", "member", "role", "address",
           "lag (entries)");
  out += line;
  auto row = [&](int id, const std::string& member, uint64_t lag, bool own) {
    std::string addr =
        id < static_cast<int>(config.replicas.size())
            ? config.replicas[id].host + ":" + std::to_string(config.replicas[id].peer_port)
            : "(not in cluster.toml)";
    snprintf(line, sizeof line, "%-4d %-8s %-8s %-22s %s\n", id, member.c_str(),
             own ? "leader" : "", addr.c_str(), own ? "-" : std::to_string(lag).c_str());
    out += line;
  };
  row(l.leader, JsonStr(l.membership, "this_replica"), 0, true);
  for (const Json& p : l.peers) {
    uint64_t match = JsonU64(p, "match");
    row(static_cast<int>(JsonU64(p, "id")), JsonStr(p, "member"),
        l.last_index > match ? l.last_index - match : 0, false);
  }
  snprintf(line, sizeof line, "configuration entry %lu (%s); the next replica added gets id %lu\n",
           (unsigned long)JsonU64(l.membership, "index"),
           JsonAt(l.membership, "committed").is_boolean() &&
                   JsonAt(l.membership, "committed").get<bool>()
               ? "committed"
               : "NOT yet committed",
           (unsigned long)JsonU64(l.membership, "next_id"));
  out += line;
  return out;
}

bool AddMember(ClusterConfig* config, const MemberAddOptions& o, MemberAddOutcome* out,
               std::string* error) {
  MemberListing before;
  if (!ListMembers(*config, &before, error)) return false;
  const int id = static_cast<int>(JsonU64(before.membership, "next_id"));
  if (id >= kMaxMemberIds) {
    *error = "every replica id (0.." + std::to_string(kMaxMemberIds - 1) +
             ") has been used: a cluster can add no more replicas";
    return false;
  }
  out->id = id;
  // Its address first: the daemons look it up when the log names it.
  if (id >= static_cast<int>(config->replicas.size())) {
    if (id > static_cast<int>(config->replicas.size())) {
      *error = "the configuration's next id is " + std::to_string(id) + " but " + config->path +
               " has only replicas 0.." + std::to_string(config->replicas.size() - 1);
      return false;
    }
    const ReplicaConfig& first = config->replicas[0];
    ReplicaConfig r = first;
    r.id = id;
    r.removed = false;
    if (!o.host.empty()) r.host = o.host;
    // cluster up's ports: each kind at its base plus the id.
    r.peer_port = first.peer_port + id;
    r.client_port = first.client_port + id;
    r.server_port = first.server_port ? first.server_port + id : 0;
    r.metrics_port = first.metrics_port ? first.metrics_port + id : 0;
    std::string parent = first.dir.substr(0, first.dir.find_last_of('/'));
    r.dir = parent + "/replica-" + std::to_string(id);
    NetnsHosts hosts;
    if (!first.netns.empty()) {
      // A host of its own, as cluster up --hosts netns made the others'.
      if (o.dir.empty()) {
        *error = "a cluster of network namespace hosts is local: name it with --dir";
        return false;
      }
      hosts = PlanNetnsHosts(o.dir, id + 1);
      if (hosts.replicas[0] != first.netns) {
        *error = "replica 0's namespace " + first.netns + " is not the one " + o.dir + " plans (" +
                 hosts.replicas[0] + "): was the cluster directory moved?";
        return false;
      }
      r.netns = hosts.replicas[id];
      r.host = hosts.ReplicaAddr(id);
    }
    config->replicas.push_back(r);
    if (!first.netns.empty()) {
      std::vector<int> open = {r.client_port}, reserved;
      if (r.server_port) open.push_back(r.server_port);
      if (r.metrics_port) open.push_back(r.metrics_port);
      for (const ReplicaConfig& each : config->replicas)
        for (int p : {each.peer_port, each.client_port, each.server_port, each.metrics_port})
          if (p) reserved.push_back(p);
      if (config->leader_port) reserved.push_back(config->leader_port);
      if (!AddNetnsReplicaHost(o.dir, hosts, id, open, reserved, error)) {
        config->replicas.pop_back();
        *error = "cannot make replica " + std::to_string(id) + "'s network namespace: " + *error;
        return false;
      }
    }
    if (!WriteClusterToml(*config, error)) {
      config->replicas.pop_back();
      return false;
    }
    if (!o.quiet)
      printf("replica %d: %s, peer port %d, client port %d, dir %s (written to %s)\n", id,
             r.host.c_str(), r.peer_port, r.client_port, r.dir.c_str(), config->path.c_str());
  }
  if (!MakeReplicaKey(KeysDir(*config), id, error)) return false;
  auto deadline = Clock::now() + std::chrono::milliseconds(o.wait_ms);
  if (!ProposeUntil(*config, {MembershipChangeKind::kAddLearner, id}, deadline, o.quiet,
                    &out->added_index, error))
    return false;
  if (!o.quiet)
    printf("replica %d added as a learner (configuration entry %lu committed)\n", id,
           (unsigned long)out->added_index);
  const uint64_t t0 = NowUs();
  if (!o.dir.empty()) {
    if (!StartReplica(o.dir, *config, id, error)) return false;
    if (!o.quiet)
      printf("replica %d started (log: %s/replica-%d.log); catching up\n", id, o.dir.c_str(), id);
  } else if (!o.quiet) {
    printf("start it on %s: lockstep replica --config cluster.toml --id %d (copy %s there)\n",
           config->replicas[id].host.c_str(), id, config->path.c_str());
  }
  if (!o.promote) return true;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (!PromoteMember(*config, id, static_cast<int>(std::max<int64_t>(left.count(), 0)), o.quiet,
                     &out->promoted_index, error))
    return false;
  out->catch_up_ms = (NowUs() - t0) / 1000.0;
  if (!o.quiet)
    printf("replica %d is a voter (configuration entry %lu committed), %.1f s after it started\n",
           id, (unsigned long)out->promoted_index, out->catch_up_ms / 1000);
  return true;
}

bool PromoteMember(const ClusterConfig& config, int id, int wait_ms, bool quiet, uint64_t* index,
                   std::string* error) {
  // The leader refuses the promotion until the learner's durable log is
  // within its window of the leader's last index: ProposeUntil retries.
  auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  if (!ProposeUntil(config, {MembershipChangeKind::kPromote, id}, deadline, quiet, index, error)) {
    *error = "replica " + std::to_string(id) + " stays a learner: " + *error;
    return false;
  }
  return true;
}

bool RemoveMember(ClusterConfig* config, const std::string& dir, int id, bool quiet,
                  uint64_t* removed_index, std::string* error) {
  if (id < 0 || id >= static_cast<int>(config->replicas.size())) {
    *error = "--id " + std::to_string(id) + ": no such replica in " + config->path;
    return false;
  }
  int leader = FindLeader(*config, 3000);
  if (leader == id) {
    // A leader could remove itself (it hands over once the removal commits),
    // but a planned move first keeps the gap to one hand-over.
    LeaderMoveOutcome moved;
    if (!MoveLeader(*config, -1, 5000, &moved, error)) {
      *error = "replica " + std::to_string(id) + " leads and could not hand over: " + *error;
      return false;
    }
    if (!quiet)
      printf("leadership moved from replica %d to replica %d first (%.1f ms)\n", id, moved.to,
             moved.serving_ms);
  }
  auto deadline = Clock::now() + std::chrono::seconds(30);
  if (!ProposeUntil(*config, {MembershipChangeKind::kRemove, id}, deadline, quiet, removed_index,
                    error))
    return false;
  if (!quiet)
    printf("replica %d removed (configuration entry %lu committed)\n", id,
           (unsigned long)*removed_index);
  config->replicas[id].removed = true;
  if (!WriteClusterToml(*config, error)) return false;
  if (!dir.empty()) {
    if (!StopReplica(dir, id, error)) return false;
    if (!quiet) printf("replica %d stopped; its id is never used again\n", id);
  }
  return true;
}

}  // namespace lockstep
