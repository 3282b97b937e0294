// config.h — cluster.toml: the one file every replica of a cluster shares,
// and the TOML reading (toml++ underneath) it shares with the server profiles in apps/.
//
//   [cluster]
//   secret = "..."          # the replicas' own: authenticates daemons to each other
//                           # (required to run a replica; a client's copy leaves it out)
//   client_secret = "..."   # clients: propose, read, status, divergence reports
//   admin_secret = "..."    # admins: also truncate, take and fetch checkpoints
//                           # (each at least 16 characters; one left out is derived from
//                           # `secret`, and a copy without `secret` must name it)
//   keys = "keys"           # optional ("keys"): the directory of the cluster's CA and
//                           # replica certificates (lockstep keys init; guard/net/tls.h),
//                           # relative to this file's; a client needs only its ca.crt
//   transport = "shm"       # shm | tcp | auto (auto: UCX picks, RDMA where present)
//   durability = "disk"     # disk | memory (memory: a majority holds entries in RAM only)
//   ring_bytes = 1048576    # log region ring per backup and ballot (max proposal: about half)
//   segment_bytes = 67108864  # durable log: preallocated segment file size
//   heartbeat_us = 5000     # the leader's control-word heartbeat (see below)
//   spin_us = 0             # busy-poll this long after activity, then sleep (see below)
//   election_timeout_min_us = 50000  # see ClusterConfig
//   election_timeout_max_us = 100000
//   lease_us = 0            # optional: the leader's lease (see ClusterConfig)
//   client_netns = ""       # optional: the network namespace clients (and the lockstep
//                           # CLI, which enters it) reach the replicas from (cluster up
//                           # --hosts netns: guard/net/netns_hosts.h)
//   leader_address = ""     # optional "IPV4:PORT" that follows the leader: the replica
//                           # serving clients holds it on leader_interface and forwards
//                           # it to its server (guard/daemon/leader_address.h; root, nftables)
//   leader_interface = "eth0"
//   failpoints = false      # true: an admin may inject faults (lockstep failpoint; for
//                           # fault campaigns and tests; also LOCKSTEP_FAILPOINTS=1)
//   voters = 3              # optional (every replica listed): the log's first
//                           # configuration votes with replicas 0..voters-1; the others
//                           # are addresses for replicas `lockstep member add` adds
//
//   [server]                # optional: the server each replica's daemon runs under the shim
//   command = "redis-server --port {port} --bind {host} --dir {dir}"   # required in [server];
//                           # {port} is the replica's server_port, {dir} its dir + "/server",
//                           # {host} its host (where the server must listen); split like a
//                           # shell would ('...', "...", backslash), run without a shell
//   app = "redis"           # optional: the apps/ profile it came from (informational)
//   ready_timeout_ms = 10000  # optional: how long the server may take to listen
//   ready_log = "text"      # optional: the server is ready once it listens and its log
//                           # (stdout and stderr) holds this text
//   unchecked_replies = "INFO, CLIENT LIST"  # optional: redis-protocol commands whose
//                           # replies are not compared between replicas (shim_unchecked.c)
//   lease_reads = "GET, MGET"  # optional: read-only redis-protocol commands the leader
//                           # answers without the log while it holds its lease (lease_us)
//   lease_protocol = "memcached"  # optional: the protocol lease_reads names commands of,
//                           # "resp" (the default) or "memcached" (then: get, gets, mg)
//   inspect_commands = "GET, DBSIZE, DEBUG DIGEST"  # optional: `lockstep inspect` is
//                           # read-only, redis's protocol: other requests are refused
//                           # (guard/server/inspection.h); unset: every byte passes
//   same_random = true      # optional (false): the server's randomness is the same on every
//                           # replica (preload/shim_random.c), seeded from the secret
//   same_clock = true       # optional (false): the server's wall clock reads, on every
//                           # replica, the leader's time of the input it processes
//                           # (preload/shim_clock.c)
//   timers_in_log = true    # optional (false), needs same_clock: the server's epoll
//                           # timeouts are agreed in the log as ticks, so its timers fire
//                           # at the same input on every replica (preload/shim_abi.h)
//   cloned_start = true     # optional (false), needs [checkpoint] enabled: every replica's
//                           # server starts from one CRIU image of replica 0's, taken once
//                           # it is ready and before its first input
//   state_probe = "redis-cli -h {host} -p {port} DEBUG DIGEST"  # optional: a command
//                           # whose output digests the server's state; the leader runs it
//                           # against its own server, through the log (state_check.h)
//   state_check_every_s = 10  # optional (10), with state_probe: how often, while clients'
//                           # inputs are committed
//   serial_inputs = true    # optional (false): a multi-threaded server executes one input
//                           # at a time, in the log's order (preload/shim_serial.c)
//   data_template = "DIR/server-template"  # optional: every server starts from a copy
//   unchecked_greeting = true  # optional (false): output before a connection's first
//                           # input is not compared (preload/shim_output.c)
//
//   [checkpoint]            # optional, with [server]: CRIU checkpoints of backups' servers
//   enabled = true
//   every_entries = 25000   # after this many applied entries since the last one,
//   every_log_bytes = 67108864  # or this many bytes of log,
//   every_seconds = 600     # or this long (if anything was applied), whichever first
//   keep = 2                # good checkpoints kept per replica
//   lagging_backup_grace_seconds = 60  # a backup silent longer no longer holds the leader's log
//   timeout_ms = 60000      # a dump or restore taking longer is killed and reported
//
//   [[replica]]             # one per replica, ids 0..N-1 in order (N <= 16)
//   id = 0
//   host = "127.0.0.1"      # address of the daemon's peer and client ports
//   peer_port = 7400        # daemon-to-daemon message channel
//   client_port = 7500      # proposals, status (lockstep propose / status)
//   server_port = 7600      # where this replica's server listens: required when there is a
//                           # [server] section, an error without one
//   dir = "/var/lib/lockstep/0"
//   netns = ""              # optional: network namespace the replica runs in
//   metrics_port = 7800     # optional (0: none): the daemon serves Prometheus metrics at
//                           # http://host:metrics_port/metrics (guard/net/metrics_server.h)
//   removed = true          # optional: taken out through the log (lockstep member
//                           # remove); its id is never reused, cluster up skips it
//
// Parsing is strict: an unknown field, a wrong type or a missing field is an
// error that names the field and the line. Strings are "basic" (with the
// escapes \" \\ \n \t) or 'literal' (no escapes).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace lockstep {

struct ReplicaConfig {
  int id = -1;
  std::string host;
  int peer_port = 0;
  int client_port = 0;
  int server_port = 0;   // 0: no [server] section
  int metrics_port = 0;  // 0: no metrics listener
  std::string dir;
  std::string netns;
  // Taken out of the cluster through the log (`lockstep member remove`): its
  // id is never used again, and `cluster up` no longer starts it.
  bool removed = false;
};

// When a backup checkpoints its server (checkpoint/README.md). A checkpoint
// costs a full dump (no soft-dirty tracking on this kernel: ~200 ms and
// ~190 MB for redis with 1M keys) and bounds both the log a replica keeps
// and how much it replays after a restart; 25000 entries replay in about
// 2 s on these machines.
struct CheckpointPolicy {
  bool enabled = true;
  uint64_t every_entries = 25000;
  uint64_t every_log_bytes = 64ull << 20;
  uint64_t every_seconds = 600;
  uint64_t keep = 2;
  uint64_t timeout_ms = 60000;
  // The leader keeps the log a backup still lacks while it has heard from
  // it within this long; a backup gone longer comes back from a checkpoint
  // (its own, or a peer's by state transfer) instead of holding the log.
  uint64_t lagging_backup_grace_s = 60;
  // criu --file-locks: the server's locks on its own files go into the
  // images (InnoDB's; without it criu refuses to dump mariadbd). From the
  // app profile's `criu_file_locks`. Off by default: criu then refuses a
  // server that holds a lock, and that replica runs without checkpoints.
  bool file_locks = false;
};

struct ClusterConfig {
  std::string secret;          // "" in a client's copy (cluster.toml without it)
  std::string client_secret;   // given, or derived from secret (DerivedSecret)
  std::string admin_secret;    // the same
  std::string keys;            // "" : "keys" beside cluster.toml (guard/net/tls.h KeysDir)
  std::string client_netns;    // "" : clients reach the replicas from anywhere
  std::string leader_address;  // "IPV4:PORT" that follows the leader; "" : none
  std::string leader_host;     // leader_address's two halves (the parser's)
  int leader_port = 0;
  std::string leader_interface = "eth0";
  bool failpoints = false;  // an admin may inject faults (guard/daemon/failpoints.h)
  std::string transport = "shm";
  std::string durability = "disk";
  uint64_t ring_bytes = 1 << 20;
  uint64_t segment_bytes = 64 << 20;  // durable log segment file size
  // The leader puts a fresh heartbeat into every backup's control word this
  // often, and no daemon's loop sleeps longer. 5 ms: a tenth of the shortest
  // election timeout, so a backup still hears ten before it stands. It was
  // 1 ms: every daemon woke 1000 times a second with nothing to do (an idle
  // cluster's daemons took ~12% of a core here; half the wake-ups went).
  uint64_t heartbeat_us = 5000;
  // A daemon busy-polls (with sched_yield) this long after its last
  // activity, then sleeps. 0 by default: on this kernel (EEVDF scheduler),
  // three daemons spinning with sched_yield kept other processes off the CPU
  // for up to half a second under load (a 1 ms sleeper overslept by 546 ms;
  // 45 ms without the spinning), which deposed healthy leaders. Spinning
  // buys latency (memory-durability commits of a few µs) on idle or
  // dedicated machines: set it there.
  uint64_t spin_us = 0;
  // A backup that hears nothing from the leader for a random time in
  // [min, max] starts an election; time its own loop did not run (the VM
  // stopped, a durable write every replica waited on, the scheduler) does not
  // count (Replica::OnLocalStall). Before that credit, 100-200 ms was needed
  // here and still deposed leaders: on the 2-vCPU virtual machines here
  // processes are at times not run for 40-220 ms when the machine is busy,
  // mostly all replicas together. With it, `scripts/bench stalls` saw no
  // leader change with CPU hogs beside a 16-connection load at 50-100 ms or
  // at 30-60 ms; 50-100 keeps a margin for a leader that alone is not run.
  // On dedicated hardware 10-20 ms is safe and makes failover that much
  // faster.
  uint64_t election_timeout_min_us = 50000;
  uint64_t election_timeout_max_us = 100000;
  // The leader's lease (0: none): while a majority echoes its heartbeats it
  // knows no other replica can lead for this long after it sent the echoed
  // one (consensus/core.h CoreConfig::lease_us), so reads of its own state
  // are current. Backups then promise no other candidate until their guard
  // (lease + 1/16 + 0.5 ms) after the last heartbeat ends, which must fit in
  // election_timeout_min_us; it lengthens only the fast failover after the
  // leader's connection closed.
  uint64_t lease_us = 0;
  struct ServerConfig {
    std::string command;  // template: {port} and {dir} are replaced per replica
    std::string app;      // the apps/ profile it came from, if any
    uint64_t ready_timeout_ms = 10000;
    // Not ready until its log holds this text (empty: once it listens).
    std::string ready_log;
    // Every replica's server draws the same random numbers (getrandom,
    // /dev/urandom, the libc generators' seeds: preload/shim_random.c), so
    // that commands picking at random (redis SPOP, SRANDMEMBER, RANDOMKEY)
    // pick the same on every replica. From the app profile's `same_random`.
    bool same_random = false;
    // Every replica's server reads the same wall clock (CLOCK_REALTIME,
    // gettimeofday, time) while it processes a given input: the leader's
    // time when it proposed it, carried in the log entry (guard/server/log_input.h),
    // and between inputs the last one's; CLOCK_MONOTONIC stays real
    // (preload/shim_clock.c). So redis's TIME and the expiry of keys set
    // with PX/EX come out the same on every replica, a lagging one too.
    // From the app profile's `same_clock`.
    bool same_clock = false;
    // With same_clock: the timeouts of the server's epoll waits are log
    // entries (ticks, preload/shim_abi.h "Ticks"): a wait times out at the
    // same point of the log on every replica, and the tick moves the clock,
    // so a quiet server's timers fire (redis's key expiry, BLPOP timeouts).
    // From the app profile's `timers_in_log`.
    bool timers_in_log = false;
    // Every replica's server starts from one CRIU image (checkpoint index 0)
    // of replica 0's server, taken once it is ready and before its first
    // input, instead of each replica starting its own: what a server draws
    // at its start where no libc call of the shim's reaches (MariaDB's
    // my_rnd seeds, start times, hash seeds, its memory layout) is then the
    // same everywhere. Needs checkpoints. From the profile's `cloned_start`
    // (server_guard.cc "cloned start").
    bool cloned_start = false;
    // A command ({host}, {port}, {dir} as in `command`) whose output digests
    // the server's state (redis: DEBUG DIGEST); empty: no state checks. The
    // leader runs it every state_check_every_s seconds in which clients'
    // inputs were committed (guard/server/state_check.h). From the profile.
    std::string state_probe;
    uint64_t state_check_every_s = 10;
    // A server that runs connections on several threads executes one input
    // at a time, in the log's order: the next connection's input becomes
    // readable only once the thread that read the previous one waits again
    // (preload/shim_serial.c). From the profile's `serial_inputs`.
    bool serial_inputs = false;
    // With serial_inputs: an input executes until the server has sent output
    // on its connection (its reply), not merely until the thread that read
    // it waits again: for a server whose listener reads each request and
    // hands it to a pool thread (slapd), whose listener waits again at once.
    // From the profile's `serial_until_reply`.
    bool serial_until_reply = false;
    // With serial_inputs: a thread holding the turn that sleeps in the kernel
    // keeps it (by default the next input goes in after two looks 1 ms apart
    // find it asleep, for MariaDB's row-lock waits that only a later input
    // ends). For a server whose requests never wait for another request, only
    // for its own mutexes (memcached). From the profile's `serial_sleep_keeps_turn`.
    bool serial_sleep_keeps_turn = false;
    // What a server sends on a connection before it reads anything from it
    // (a handshake with a random challenge, a banner naming the host) is left
    // out of the output comparison (preload/shim_output.c). From the
    // profile's `unchecked_greeting`.
    bool unchecked_greeting = false;
    // A directory every replica's server starts from, copied into its data
    // directory whenever it starts afresh (not from a checkpoint): made once
    // by `cluster up` running the profile's `prepare` command (MariaDB's
    // mariadb-install-db), so that every replica starts from the same bytes.
    // Empty: the server starts from an empty directory.
    std::string data_template;
    // Files of the data template in which {port} and {dir} are replaced by
    // the replica's server port and data directory each time it starts
    // afresh ("clamd.conf, slapd.conf"): configuration files that name them.
    // From the profile's `files`, which `cluster up` copies into the template.
    std::vector<std::string> rendered_files;
    // The profile's `prepare` command and `criu_file_locks` (not in this
    // section of cluster.toml: `up` uses the first, and writes the second
    // as [checkpoint] file_locks).
    std::string prepare;
    bool criu_file_locks = false;
    std::vector<std::string> profile_files;  // the profile's `files`, absolute paths
    // Commands whose replies are left out of the output comparison, for
    // a server speaking redis's protocol: "INFO, CLIENT LIST" (one or two
    // words each; one word matches every subcommand). Their replies differ
    // between replicas by nature (pids, ports, uptimes, memory figures):
    // preload/shim_unchecked.c. From the app profile's `unchecked_replies`.
    std::string unchecked_replies;
    // What `lockstep inspect` lets through to the server, for a server
    // speaking redis's protocol ("GET, DBSIZE, DEBUG DIGEST": one word allows
    // every subcommand); any other request is refused. Empty: every byte
    // passes. From the app profile's `inspect_commands`.
    std::string inspect_commands;
    // Redis-protocol commands that only read: with the cluster's lease_us,
    // the leader's shim answers a client's request made of these alone
    // from its own server, without the log, while it holds the lease
    // (preload/shim_lease.c). From the app profile's `lease_reads`.
    std::string lease_reads;
    // The protocol of lease_reads' names: "resp" or "memcached"
    // (preload/mc_scan.h); "" when there are none. From `lease_protocol`.
    std::string lease_protocol;
  } server;
  bool has_server() const { return !server.command.empty(); }
  CheckpointPolicy checkpoint;
  // Every replica the cluster ever had, by id (0..15): the address book. The
  // first `voters` are the configuration the log starts from; who votes and
  // who learns later is the log's (consensus/membership.h, `lockstep member`).
  std::vector<ReplicaConfig> replicas;
  int voters = 0;    // [cluster] voters; default: every replica listed (at most 7)
  std::string path;  // where it was read from
};

bool ParseClusterConfig(const std::string& text, const std::string& path, ClusterConfig* out,
                        std::string* error);
bool LoadClusterConfig(const std::string& path, ClusterConfig* out, std::string* error);
std::string FormatClusterConfig(const ClusterConfig& c);
// A secret derived from the replicas' one under a label ("client",
// "admin"): 64 hex digits of SHA-256, so a cluster.toml that names only
// `secret` (older ones, hand-written ones) still has the other two, and
// neither gives the replicas' secret away.
std::string DerivedSecret(const std::string& secret, const std::string& label);
// The seed of the server's randomness (LOCKSTEP_SHIM_RANDOM_SEED, 64 hex
// digits) when c.server.same_random, else "": SHA-256 of the cluster's
// secret under a label, so the same on every replica and in every run of
// the cluster, and the secret cannot be read back from the server's
// environment.
std::string ServerRandomSeed(const ClusterConfig& c);

// ------------------------------------------------------------ TOML files
// cluster.toml and the profiles in apps/ are TOML (https://toml.io/en/v1.0.0),
// read by toml++ (config.cc). lockstep takes strings (basic, literal,
// multi-line), integers (any TOML form, 20_000) and booleans; a field that
// takes a list also takes an array of strings. Anything else a field holds
// (a float, a date, an inline or nested table) is refused by the getters,
// as is a field nobody asked for, so a typo never passes unnoticed.

// Where something is in the file: 1-based line and column.
struct TomlPos {
  int line = 1;
  int column = 1;
};

struct TomlValue {
  enum Kind { kString, kInt, kBool, kStringList, kOther } kind = kString;
  std::string str;                // kString
  int64_t num = 0;                // kInt; kBool: 0 or 1
  std::vector<std::string> list;  // kStringList
  std::vector<TomlPos> list_pos;  // where each of list's strings is
  std::string what;               // what it holds, for errors: "a float (1.5)"
  TomlPos key;                    // where the field's name is
  TomlPos pos;                    // where its value begins
};

// One section: its fields, taken out one by one with typed getters whose
// errors read "PATH:LINE:COLUMN: field 'x': ...".
class TomlTable {
 public:
  std::string path;    // the file, for errors
  std::string header;  // "[cluster]", "[[replica]]", or "" for fields before any header
  TomlPos pos;         // the header's; 1:1 for the top level
  std::map<std::string, TomlValue> fields;

  // A missing optional field leaves *dst alone and returns true.
  bool TakeString(const std::string& key, std::string* dst, bool required, std::string* error);
  bool TakeInt(const std::string& key, int64_t* dst, bool required, int64_t lo, int64_t hi,
               std::string* error);
  bool TakeBool(const std::string& key, bool* dst, std::string* error);  // optional
  // Optional `unchecked_replies`: a list of commands preload/resp_scan.h
  // accepts, as one string ("INFO, CLIENT LIST") or an array of strings
  // (["INFO", "CLIENT LIST"]); *dst gets the string form, which the shim reads.
  bool TakeUncheckedReplies(std::string* dst, std::string* error);
  // The same for any such list (inspect_commands); bounded: at most
  // RESP_LIST commands, as the shim's resp_list holds.
  bool TakeCommandList(const std::string& key, bool bounded, std::string* dst, std::string* error);
  // Optional `lease_protocol` ("resp", the default, or "memcached": the wire
  // protocol of the names in `lease_reads`) and `lease_reads`: for RESP a list
  // as TakeCommandList takes; for memcached's text protocol some of get, gets,
  // mg (preload/mc_scan.h, the commands whose replies its scanner knows).
  // *protocol gets "resp" or "memcached" when there is a list, else "".
  bool TakeLeaseReads(std::string* protocol, std::string* list, std::string* error);
  // Relative file paths, as an array of strings (["a.conf", "sub/b.ndb"]) or
  // one string separated by commas ("a.conf, sub/b.ndb"): none empty,
  // absolute or climbing out with "..". Missing: an empty list.
  bool TakeFileList(const std::string& key, std::vector<std::string>* dst, std::string* error);
  bool Has(const std::string& key) const { return fields.count(key) > 0; }
  TomlPos At(const std::string& key) const;  // the field's value, else the header
  // An error for the first field (in file order) nobody took, naming the
  // closest field the getters asked for.
  bool NoLeftovers(std::string* error) const;
  // "PATH:LINE:COLUMN: msg" in *error; returns false.
  bool Fail(TomlPos at, const std::string& msg, std::string* error) const;
  std::string Name() const { return header.empty() ? "the top level" : header; }

 private:
  // The field, or nullptr; remembers that the caller knows the key (for NoLeftovers).
  const TomlValue* Find(const std::string& key);
  bool Missing(const std::string& key, bool required, std::string* error) const;
  bool WrongType(const std::string& key, const TomlValue& v, const std::string& expected,
                 std::string* error) const;
  std::set<std::string> taken_;
  std::set<std::string> asked_;
};

// "PATH:LINE:COLUMN: " — how every error about a TOML file begins.
std::string TomlWhere(const std::string& path, TomlPos at);

// Parses text into its sections in file order. `headers` lists the allowed
// section headers ("[cluster]", "[[replica]]"); a [table] may appear once, an
// [[array]] any number of times. Fields before the first header form a table
// with header "" (none if there are none) when top_level is true and are an
// error otherwise. A syntax error names its line and column.
bool ParseToml(const std::string& text, const std::string& path,
               const std::vector<std::string>& headers, bool top_level,
               std::vector<TomlTable>* tables, std::string* error);
// Reads a whole file; false with "PATH: cannot open: ..." in *error.
bool ReadTextFile(const std::string& path, std::string* text, std::string* error);
// s as a TOML basic string, quotes included (control characters escaped;
// s must be UTF-8, as everything toml++ reads is).
std::string TomlQuote(const std::string& s);

}  // namespace lockstep
