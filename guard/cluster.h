// cluster.h — a cluster of replica daemons on this machine: `lockstep
// cluster up/status/down/restart`. Each replica runs as its own process
// (`lockstep replica`), detached, logging to DIR/replica-N.log, its pid in
// DIR/replica-N.pid; DIR/cluster.toml is the configuration they share.
#pragma once

#include <string>
#include <vector>

#include "guard/config.h"

namespace lockstep {

struct ClusterUpOptions {
  std::string dir;
  int replicas = 3;
  std::string transport = "shm";
  std::string durability = "disk";
  int base_port = 7400;  // peer ports base.., client ports base+100..
  uint64_t ring_bytes = 1 << 20;
  uint64_t segment_bytes = 64 << 20;
  int64_t spin_us = -1;  // -1: the default of cluster.toml
  bool quiet = false;
};

struct ReplicaStatus {
  int id = 0;
  std::string role = "down";  // leader | backup | candidate | down
  std::string ballot;
  uint64_t commit_index = 0;
  uint64_t last_index = 0;
  int pid = 0;  // 0 when not running
  uint64_t lag = 0;
  std::string disk_error;
};

struct ClusterStatus {
  int leader = -1;
  std::vector<ReplicaStatus> replicas;
};

std::string DefaultClusterDir();
bool ClusterUp(const ClusterUpOptions& o, ClusterConfig* config, std::string* error);
bool ClusterDown(const std::string& dir, bool quiet, std::string* error);
bool LoadClusterDir(const std::string& dir, ClusterConfig* config, std::string* error);
ClusterStatus GetClusterStatus(const std::string& dir, const ClusterConfig& config);
std::string ClusterStatusJson(const ClusterStatus& s);
std::string FormatStatusTable(const ClusterStatus& s);  // for people
// Starts replica `id` of the cluster in dir if it is not running.
bool StartReplica(const std::string& dir, const ClusterConfig& config, int id, std::string* error);
int ReplicaPid(const std::string& dir, int id);  // 0 if not running
// Waits until some replica leads and every running replica has caught up.
bool WaitForLeader(const ClusterConfig& config, int timeout_ms, int* leader);

}  // namespace lockstep
