// config.h — cluster.toml: the one file every replica of a cluster shares.
//
//   [cluster]
//   secret = "..."          # authenticates daemons to each other (required)
//   transport = "shm"       # shm | tcp | auto (auto: UCX picks, RDMA where present)
//   durability = "disk"     # disk | memory (memory: a majority holds entries in RAM only)
//   ring_bytes = 1048576    # log region ring per backup and ballot (max proposal: about half)
//   segment_bytes = 67108864  # durable log: preallocated segment file size
//   heartbeat_us = 1000
//   spin_us = 50            # busy-poll this long after activity, then sleep
//   election_timeout_min_us = 10000
//   election_timeout_max_us = 20000
//
//   [[replica]]             # one per replica, ids 0..N-1 in order
//   id = 0
//   host = "127.0.0.1"      # address of the daemon's peer and client ports
//   peer_port = 7400        # daemon-to-daemon message channel
//   client_port = 7500      # proposals, status (lockstep propose / status)
//   dir = "/var/lib/lockstep/0"
//   netns = ""              # optional: network namespace the replica runs in
//
// Parsing is strict: an unknown field, a wrong type or a missing field is an
// error that names the field and the line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

struct ReplicaConfig {
  int id = -1;
  std::string host;
  int peer_port = 0;
  int client_port = 0;
  std::string dir;
  std::string netns;
};

struct ClusterConfig {
  std::string secret;
  std::string transport = "shm";
  std::string durability = "disk";
  uint64_t ring_bytes = 1 << 20;
  uint64_t segment_bytes = 64 << 20;  // durable log segment file size
  uint64_t heartbeat_us = 1000;
  uint64_t spin_us = 50;  // a daemon busy-polls this long after its last activity, then sleeps
  uint64_t election_timeout_min_us = 10000;
  uint64_t election_timeout_max_us = 20000;
  std::vector<ReplicaConfig> replicas;
  std::string path;  // where it was read from
};

bool ParseClusterConfig(const std::string& text, const std::string& path, ClusterConfig* out,
                        std::string* error);
bool LoadClusterConfig(const std::string& path, ClusterConfig* out, std::string* error);
std::string FormatClusterConfig(const ClusterConfig& c);

}  // namespace lockstep
