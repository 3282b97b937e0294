// cluster.h — a cluster of replica daemons on this machine: `lockstep
// cluster up/status/down/restart`. Each replica runs as its own process
// (`lockstep replica`), detached, logging to DIR/replica-N.log, its pid in
// DIR/replica-N.pid; DIR/cluster.toml is the configuration they share.
// With a server (`--app NAME` from apps/NAME.toml, or any command after `--`),
// cluster.toml gets a [server] section and each daemon runs its own copy of
// the server on port base+200+i in DIR/replica-i/server.
#pragma once

#include <string>
#include <vector>

#include "guard/common/config.h"
#include "guard/common/json.h"

namespace lockstep {

struct ClusterUpOptions {
  std::string dir;
  int replicas = 3;
  std::string transport = "shm";
  std::string durability = "disk";
  int base_port = 7400;  // peer ports base.., client ports base+100.., server ports base+200..
  uint64_t ring_bytes = 1 << 20;
  uint64_t segment_bytes = 64 << 20;
  int64_t spin_us = -1;  // -1: the default of cluster.toml
  // 0: the defaults of cluster.toml; else both set (ParseElectionTimeout).
  uint64_t election_timeout_min_us = 0, election_timeout_max_us = 0;
  uint64_t lease_us = 0;  // cluster.toml's lease_us (0: no leases)
  bool quiet = false;
  std::string app;      // a profile in apps/ (apps/APP.toml), or
  std::string command;  // a server command template with {port} and {dir}; neither: no server
  uint64_t ready_timeout_ms = 0;  // 0: the profile's, else 10000
  bool checkpoints = true;
  bool failpoints = false;         // cluster.toml's failpoints (guard/daemon/failpoints.h)
  std::string hosts = "loopback";  // or "netns": a network namespace per replica (netns_hosts.h)
  uint64_t checkpoint_every_entries = 0;  // 0: the default policy's
  uint64_t lagging_backup_grace_s = 0;    // 0: the default policy's
  // Remove what a stopped cluster in dir left (its log and checkpoints);
  // without it ClusterUp refuses such a directory (ReadClusterHoldings).
  bool wipe = false;
};

// For a cluster of namespace hosts (client_netns in its config): moves the
// calling thread to the clients' namespace, from where every replica is
// reachable. Nothing to do (true) for any other cluster.
bool EnterClientSide(const ClusterConfig& config, std::string* error);

// "MIN-MAX" or "MS" (both ends the same), in milliseconds, as `cluster up
// --election-timeout-ms` and `bench failover` take it; false with *error
// saying why (not a number, MIN above MAX, outside 5..60000).
bool ParseElectionTimeout(const std::string& text, ClusterUpOptions* o, std::string* error);

// A server profile, apps/NAME.toml (see apps/README.md).
struct AppProfile {
  std::string name;     // NAME
  std::string command;  // template: {port} and {dir} are replaced per replica
  uint64_t ready_timeout_ms = 10000;
  std::string ready_log;       // ServerConfig::ready_log (config.h)
  bool same_random = false;    // the server's randomness is the same on every replica
  bool same_clock = false;     // its wall clock too: the leader's time of each input
  bool timers_in_log = false;  // its timeouts are ticks in the log (config.h)
  bool cloned_start = false;   // every replica's server from one image (config.h)
  std::string state_probe;     // its state's digest, for state checks (config.h)
  uint64_t state_check_every_s = 10;
  bool serial_inputs = false;            // one input executes at a time (config.h)
  bool serial_until_reply = false;       // ... until its reply (config.h)
  bool serial_sleep_keeps_turn = false;  // ... also while asleep (config.h)
  bool unchecked_greeting = false;       // output before a connection's first input: not compared
  bool criu_file_locks = false;          // CheckpointPolicy::file_locks (config.h)
  // Run once by `cluster up` with {dir} = the cluster's data template; each
  // replica's server then starts from a copy of it (config.h, data_template).
  std::string prepare;
  // Files beside the profile ("clamd/clamd.conf, clamd/lockstep.ndb"), put into
  // the data template; {port} and {dir} in them become each replica's.
  std::vector<std::string> files;
  std::string unchecked_replies;  // commands whose replies are not compared (config.h)
  std::string inspect_commands;   // what `lockstep inspect` lets through (config.h)
  std::string lease_reads;        // read-only commands served under the lease (config.h)
  std::string lease_protocol;     // their protocol: "resp", "memcached" (config.h)
  std::string description;        // one line for people
  std::string bench;              // how to benchmark it (free text)
  std::string path;
};
std::vector<std::string> ListAppProfiles(const std::string& apps_dir);  // sorted names
bool LoadAppProfile(const std::string& apps_dir, const std::string& name, AppProfile* out,
                    std::string* error);

struct ReplicaStatus {
  int id = 0;
  std::string role = "down";  // leader | backup | candidate | down
  std::string ballot;
  uint64_t commit_index = 0;
  uint64_t last_index = 0;
  uint64_t applied_index = 0;   // entries its server has been handed (backups replay behind commit)
  bool server_read_all = true;  // ... and read: its server is not behind applied_index
  bool serving = false;         // leads and its server serves clients (caught up)
  int pid = 0;                  // 0 when not running
  uint64_t lag = 0;
  std::string disk_error;
  std::string server_addr;   // host:server_port, "" without a server
  std::string metrics_addr;  // host:metrics_port (GET /metrics), "" without a metrics_port
  uint64_t first_index = 0;  // the log's first entry (entries below were truncated)
  uint64_t lease_left_us = 0, lease_guard_left_us = 0;  // DaemonStatus's
  uint64_t lease_reads = 0, lease_misses = 0;           // DaemonStatus's
  int server_pid = 0;
  // The daemon's "checkpoint" status object as is (null: none or down),
  // and from it: the newest checkpoint's index and age (-1: none) and the
  // server's state ("running", or why it is not run).
  Json checkpoint_json;
  uint64_t checkpoint_index = 0;
  int64_t checkpoint_age_s = -1;
  std::string server_state;
  // The daemon's "output" status object (output checking) as is (null:
  // none), and from it the divergence reports this replica holds.
  Json output_json;
  uint64_t divergence_reports = 0;
  // The daemon's "state_checks" object (guard/server/state_check.h), as is.
  Json state_json;
};

struct ClusterStatus {
  int leader = -1;
  bool has_server = false;
  std::string client_addr;     // the leader's server_addr: where clients connect; "" if none
  std::string leader_address;  // config's leader_address: follows the leader; "" if none
  std::string server_name;     // "redis" (the app) or the command's program name
  std::string client_netns;    // the namespace clients connect from (--hosts netns); "" if none
  std::vector<ReplicaStatus> replicas;
};

// Runs `lockstep replica --config cfg --id id` as a child and starts it again
// when it crashes (SIGABRT, SIGSEGV, ...; at most 3 times a minute), writing
// each child's pid to the replica's pid file beside cfg. Returns never: it
// exits when the replica ended any other way. What `replica --keep` runs.
[[noreturn]] void KeepReplica(const std::string& cfg, int id);

std::string DefaultClusterDir();
bool ClusterUp(const ClusterUpOptions& o, ClusterConfig* config, std::string* error);
// `cluster start`: every replica of the stopped cluster in dir started again
// (each recovers from its own log and checkpoints), then a leader awaited.
// Refuses when any of them runs.
bool ClusterStart(const std::string& dir, ClusterConfig* config, std::string* error);

// What the replica directories of a cluster directory hold on disk, read
// without changing anything (DiskLogOptions::read_only).
struct ReplicaHolding {
  int id = 0;
  bool has_log = false;
  uint64_t first_index = 1, last_index = 0, commit_index = 0;
  uint64_t newest_checkpoint = 0;  // 0: none that reads back
  std::string problem;             // a torn tail or damage recovery would drop
  std::string read_error;          // the log could not be read (in use, unreadable)
};
struct ClusterHoldings {
  std::vector<ReplicaHolding> replicas;  // one per DIR/replica-N directory, by id
  bool HoldsData() const;  // any entry, any checkpoint, or a log that could not be read
};
ClusterHoldings ReadClusterHoldings(const std::string& dir);
std::string DescribeHoldings(const ClusterHoldings& held);  // a line per replica
bool ClusterDown(const std::string& dir, bool quiet, std::string* error);
bool LoadClusterDir(const std::string& dir, ClusterConfig* config, std::string* error);
ClusterStatus GetClusterStatus(const std::string& dir, const ClusterConfig& config);
std::string ClusterStatusJson(const ClusterStatus& s);
// For people: a line per replica, then where clients connect (with
// "; status: HINT" when status_hint is given) or that there is no leader.
std::string FormatStatusTable(const ClusterStatus& s, const std::string& status_hint = "");
// Starts replica `id` of the cluster in dir if it is not running.
bool StartReplica(const std::string& dir, const ClusterConfig& config, int id, std::string* error);
int ReplicaPid(const std::string& dir, int id);  // 0 if not running
// `cluster restart`: starts replica id unless it runs, then waits until it
// answers (true) or exits (false, with the end of its log in *error).
bool RestartReplica(const std::string& dir, const ClusterConfig& config, int id, int* pid,
                    std::string* error);
// cluster.toml's text for c, refused (*error says why) unless it reads back
// (path: what its errors name).
bool FormatCheckedClusterConfig(const ClusterConfig& c, const std::string& path, std::string* text,
                                std::string* error);
// Writes text to path, 0600, under a temporary name first: a daemon that
// reads it meanwhile (a member added: Daemon::LearnAddresses) sees the old
// file or the new one.
bool WriteClusterConfigText(const std::string& path, const std::string& text, std::string* error);
// Waits until some replica leads and every running replica has caught up.
bool WaitForLeader(const ClusterConfig& config, int timeout_ms, int* leader);

}  // namespace lockstep
