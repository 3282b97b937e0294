// main.cc — the `lockstep` command: one binary, one subcommand per job.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "consensus/sim.h"
#include "guard/cli/args.h"
#include "guard/cli/bench.h"
#include "guard/cli/cluster.h"
#include "guard/common/config.h"
#include "guard/daemon/daemon.h"
#include "guard/daemon/failpoints.h"
#include "guard/net/client.h"
#include "guard/net/keys.h"
#include "guard/net/tls.h"
#include "guard/output/divergence_report.h"
#include "guard/output/divergence_view.h"
#include "guard/server/log_input.h"
#include "guard/server/server.h"

using namespace lockstep;

namespace {

int Fail(const std::string& msg) {
  fprintf(stderr, "lockstep: %s\n", msg.c_str());
  return 1;
}

const char* kUsage =
    "lockstep — replicate an unmodified server through Paxos\n"
    "\n"
    "usage: lockstep <command> [options]   (lockstep <command> --help for details)\n"
    "\n"
    "commands:\n"
    "  replica     run one replica daemon (one per host in a real cluster)\n"
    "  cluster     start, inspect and stop a cluster on this machine (up|status|down|restart),\n"
    "              with a replicated server: cluster up --app redis (or -- ANY COMMAND)\n"
    "  propose     agree values through the replicated log\n"
    "  log         print a replica's committed log\n"
    "  truncate    drop a replica's committed entries below an index (admin)\n"
    "  failpoint   inject faults into a running replica (cluster up --failpoints; admin)\n"
    "  checkpoint  take a checkpoint of a backup's server now, or list the checkpoints\n"
    "  divergence  list the divergence reports (replicas whose output differed), or show one\n"
    "  keys        make a cluster's CA and replica certificates (keys init)\n"
    "  sim         run the protocol core under the deterministic simulator\n"
    "  bench       measure: bench consensus | bench failover\n"
    "  demo        start a 3-replica cluster, commit, kill the leader, show nothing is lost\n";

bool WantsHelp(const Args& a) {
  return a.Has("help") || a.Has("h");
}

// ------------------------------------------------------------------ replica

int CmdReplica(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help", "verbose", "keep"});
  if (WantsHelp(a)) {
    printf(
        "usage: lockstep replica --config cluster.toml --id N [--verbose] [--keep]\n\n"
        "Runs replica N of the cluster described in cluster.toml (the same file on every host)\n"
        "in the foreground until SIGTERM. Its log lives in the replica's `dir`.\n\n"
        "  --keep   run it as a child, and start it again when it crashes (an abort, a bad\n"
        "           access; at most 3 times a minute), as `cluster up` does; its pid goes to\n"
        "           replica-N.pid beside cluster.toml\n");
    return 0;
  }
  if (!a.error.empty()) return Fail(a.error);
  if (!a.Has("config") || !a.Has("id")) return Fail("replica needs --config FILE and --id N");
  DaemonOptions o;
  std::string err;
  if (!LoadClusterConfig(a.Get("config"), &o.config, &err)) return Fail(err);
  long long id;
  if (!a.GetInt("id", 0, &id)) return Fail(a.error);
  o.id = static_cast<int>(id);
  o.verbose = a.Has("verbose");
  if (a.Has("keep")) KeepReplica(a.Get("config"), o.id);
  return RunReplica(o);
}

// ------------------------------------------------------------------ cluster

int CmdCluster(int argc, char** argv) {
  std::string sub = argc > 2 ? argv[2] : "";
  Args a = Parse(argc, argv, 3, {"help", "json", "quiet", "no-checkpoints", "failpoints", "wipe"});
  if (sub.empty() || sub == "--help" || WantsHelp(a)) {
    std::string apps;
    for (const auto& n : ListAppProfiles(AppsDir())) apps += (apps.empty() ? "" : "|") + n;
    printf(
        "usage:\n"
        "  lockstep cluster up [--replicas 3|5|7] [--transport shm|tcp|auto] [--durability "
        "disk|memory]\n"
        "                      [--dir DIR] [--base-port P] [--ring-bytes B] [--segment-bytes B]\n"
        "                      [--app %s | -- SERVER COMMAND...] [--ready-timeout-ms T]\n"
        "                      [--checkpoint-entries N] [--no-checkpoints] [--backup-grace-s S]\n"
        "                      [--election-timeout-ms MIN-MAX] [--hosts loopback|netns]\n"
        "                      [--failpoints] [--wipe]\n"
        "  lockstep cluster status [--dir DIR] [--json]\n"
        "  lockstep cluster restart --id N [--dir DIR]   start replica N again (after a crash)\n"
        "  lockstep cluster down [--dir DIR]   stop every replica; the data stays in DIR\n"
        "  lockstep cluster start [--dir DIR]  start a stopped cluster again, with its data\n\n"
        "DIR defaults to $LOCKSTEP_DIR or /tmp/lockstep-cluster. `up` writes DIR/cluster.toml\n"
        "(with a fresh secret), starts one daemon per replica and waits for a leader. `up`\n"
        "refuses a DIR that holds a stopped cluster's log or checkpoints, saying what they\n"
        "hold: `start` brings that cluster back (each replica from its own checkpoints and\n"
        "log: every acknowledged write, also after a power cut), `up --wipe` throws it away.\n"
        "durability memory keeps entries in RAM on a majority only: NOT durable, for "
        "comparison.\n\n"
        "A server to replicate: --app NAME uses the profile %s/NAME.toml (--app\n"
        "PATH/NAME.toml: a profile of your own, same fields, apps/README.md); or give any\n"
        "command after --, where {port} and {dir} become each replica's own server port\n"
        "(base+200+i) and data directory (DIR/replica-i/server), e.g.\n"
        "  lockstep cluster up -- redis-server --port {port} --dir {dir} --save ''\n"
        "(one quoted argument after -- is split like a shell would). Each daemon runs its\n"
        "copy of the server under the preload shim; clients connect to the leader's, which\n"
        "`up` prints and `status` shows (client_addr; server_addr per replica in --json).\n"
        "Backups checkpoint their server with CRIU every N applied entries (default 25000; see\n"
        "[checkpoint] in cluster.toml); --no-checkpoints turns that off. The leader keeps the\n"
        "log a backup lacks while it heard from it in the last S seconds (default 60); one\n"
        "gone longer comes back from a checkpoint, fetched from a peer if need be.\n"
        "A backup that hears nothing from the leader for a random time between MIN and MAX ms\n"
        "(default 50-100) stands for election; time it spent not running itself does not\n"
        "count.\n"
        "--hosts netns runs each replica (daemon and server) in a network namespace of its own\n"
        "with its own address, bridged to the others and to a client namespace (UCX over tcp);\n"
        "the lockstep commands enter the client namespace themselves, other clients run there\n"
        "(`ip netns exec NAME`, NAME: client_netns in cluster.toml). `down` removes them all.\n"
        "--failpoints lets an admin inject faults into the replicas (`lockstep failpoint`;\n"
        "failpoints = true in cluster.toml), for fault campaigns and tests.\n",
        apps.empty() ? "NAME" : apps.c_str(), AppsDir().c_str());
    return sub.empty() ? 2 : 0;
  }
  if (!a.error.empty()) return Fail(a.error);
  std::string dir = a.Get("dir", DefaultClusterDir());
  std::string err;
  if (sub == "up") {
    // The directory is written into cluster.toml and handed to the servers
    // ({dir}), which run elsewhere than here: a relative one is made
    // absolute (redis refused "--dir c/replica-0/server" from its own cwd).
    if (!dir.empty() && dir[0] != '/') {
      std::error_code ec;
      std::filesystem::path abs = std::filesystem::absolute(dir, ec);
      if (ec) return Fail("--dir " + dir + ": " + ec.message());
      dir = abs.lexically_normal().string();
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    }
    ClusterUpOptions o;
    long long n, port, ring, segment, ready, every, grace;
    if (!a.GetInt("replicas", 3, &n) || !a.GetInt("base-port", 7400, &port) ||
        !a.GetInt("ring-bytes", 1 << 20, &ring) || !a.GetInt("segment-bytes", 64 << 20, &segment) ||
        !a.GetInt("ready-timeout-ms", 0, &ready) || !a.GetInt("checkpoint-entries", 0, &every) ||
        !a.GetInt("backup-grace-s", 0, &grace))
      return Fail(a.error);
    if (grace < 0) return Fail("--backup-grace-s must be positive");
    o.lagging_backup_grace_s = static_cast<uint64_t>(grace);
    if (every < 0) return Fail("--checkpoint-entries must be positive");
    o.checkpoint_every_entries = static_cast<uint64_t>(every);
    o.checkpoints = !a.Has("no-checkpoints");
    o.failpoints = a.Has("failpoints");
    o.wipe = a.Has("wipe");
    if (ring < (1 << 16) || segment < (1 << 16))
      return Fail("--ring-bytes and --segment-bytes must be at least 65536");
    if (port < 1 || port > 65535) return Fail("--base-port must be in 1..65535");
    if (ready < 0 || (ready > 0 && ready < 100) || ready > 3600000)
      return Fail("--ready-timeout-ms must be in 100..3600000");
    if (a.positional.size() != a.rest.size())
      return Fail("unexpected argument '" + a.positional[0] +
                  "' (a server command goes after --, e.g. `cluster up -- redis-server --port "
                  "{port}`)");
    if (a.dashdash && a.rest.empty()) return Fail("no server command after --");
    if (a.Has("app") && a.Get("app").empty()) return Fail("--app needs a profile name or path");
    o.segment_bytes = static_cast<uint64_t>(segment);
    o.dir = dir;
    o.replicas = static_cast<int>(n);
    o.base_port = static_cast<int>(port);
    o.ring_bytes = static_cast<uint64_t>(ring);
    o.hosts = a.Get("hosts", "loopback");
    if (o.hosts != "loopback" && o.hosts != "netns")
      return Fail("--hosts must be loopback or netns (got '" + o.hosts + "')");
    // Namespaces share no shm doorbells nor peer-death detection: tcp between them.
    o.transport = a.Get("transport", o.hosts == "netns" ? "tcp" : "shm");
    if (o.hosts == "netns" && o.transport == "shm")
      return Fail("--hosts netns needs --transport tcp (or auto): shm does not cross namespaces");
    o.durability = a.Get("durability", "disk");
    o.app = a.Get("app");
    o.ready_timeout_ms = static_cast<uint64_t>(ready);
    if (a.Has("election-timeout-ms") &&
        !ParseElectionTimeout(a.Get("election-timeout-ms"), &o, &err))
      return Fail(err);
    // One argument with spaces is a whole command line; several are argv as the shell split it.
    if (a.rest.size() == 1 && a.rest[0].find_first_of(" \t") != std::string::npos) {
      o.command = a.rest[0];
    } else {
      o.command = JoinCommand(a.rest);
    }
    ClusterConfig c;
    if (!ClusterUp(o, &c, &err)) return Fail(err);
    ClusterStatus s = GetClusterStatus(dir, c);
    if (c.has_server() && s.leader < 0) {  // a leader was seen in ClusterUp: wait for it again
      for (int i = 0; i < 300 && s.leader < 0; i++) {
        usleep(50000);
        s = GetClusterStatus(dir, c);
      }
    }
    printf("cluster of %d replicas up in %s (transport %s, durability %s%s)\n", o.replicas,
           dir.c_str(), o.transport.c_str(), o.durability.c_str(),
           o.durability == "memory" ? ": NOT durable, RAM of a majority only" : "");
    printf("%s", FormatStatusTable(s, "lockstep cluster status --dir " + dir).c_str());
    return 0;
  }
  // down also removes what a crashed `up` left (its namespaces) without a cluster.toml.
  if (sub == "down") {
    if (!ClusterDown(dir, a.Has("quiet"), &err)) return Fail(err);
    if (!a.Has("quiet") && ReadClusterHoldings(dir).HoldsData())
      printf("the data stays in %s: `lockstep cluster start --dir %s` brings it back\n",
             dir.c_str(), dir.c_str());
    return 0;
  }
  if (sub == "start") {
    ClusterConfig c;
    if (!ClusterStart(dir, &c, &err)) return Fail(err);
    ClusterStatus s = GetClusterStatus(dir, c);
    printf("cluster of %zu replicas started again in %s\n", c.replicas.size(), dir.c_str());
    printf("%s", FormatStatusTable(s, "lockstep cluster status --dir " + dir).c_str());
    return 0;
  }
  ClusterConfig c;
  if (!LoadClusterDir(dir, &c, &err) || !EnterClientSide(c, &err)) return Fail(err);
  if (sub == "status") {
    ClusterStatus s = GetClusterStatus(dir, c);
    if (a.Has("json")) {
      printf("%s\n", ClusterStatusJson(s).c_str());
    } else {
      printf("%s", FormatStatusTable(s).c_str());
    }
    return 0;
  }
  if (sub == "restart") {
    long long id;
    if (!a.GetInt("id", -1, &id)) return Fail(a.error);
    if (id < 0 || id >= static_cast<long long>(c.replicas.size()))
      return Fail("restart needs --id N with N in 0.." + std::to_string(c.replicas.size() - 1));
    int pid = 0;
    if (!RestartReplica(dir, c, static_cast<int>(id), &pid, &err)) return Fail(err);
    printf("replica %lld running (pid %d)\n", id, pid);
    return 0;
  }
  return Fail("unknown cluster command '" + sub + "' (up, start, status, restart, down)");
}

// ------------------------------------------------------------------ propose / log

// Loads the cluster's configuration and, for a cluster of namespace hosts,
// moves this process to the clients' side of it.
bool LoadConfigFromArgs(const Args& a, ClusterConfig* c, std::string* err) {
  bool ok = a.Has("config") ? LoadClusterConfig(a.Get("config"), c, err)
                            : LoadClusterDir(a.Get("dir", DefaultClusterDir()), c, err);
  return ok && EnterClientSide(*c, err);
}

// ------------------------------------------------------------------- keys

int CmdKeys(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help"});
  if (WantsHelp(a) || a.positional.size() != 1 || a.positional[0] != "init") {
    printf(
        "usage: lockstep keys init [--dir DIR | --config FILE] [--replicas N]\n\n"
        "Makes the cluster's own certificate authority and a certificate for each replica, in\n"
        "the directory cluster.toml's `keys` names (by default `keys` beside it), every file\n"
        "0600. The daemons prove themselves to each other with these over TLS; `cluster up`\n"
        "makes them for the clusters it starts. Without a cluster.toml, --replicas N says how\n"
        "many (the keys go in DIR/keys). On a real cluster, give each host ca.crt and its own\n"
        "replica-N.crt and replica-N.key; clients need ca.crt only; keep ca.key elsewhere.\n");
    return WantsHelp(a) ? 0 : 2;
  }
  long long replicas;
  if (!a.GetInt("replicas", 0, &replicas)) return Fail(a.error);
  ClusterConfig c;
  std::string err;
  std::string dir = a.Get("dir", DefaultClusterDir());
  bool have_config = a.Has("config") ? LoadClusterConfig(a.Get("config"), &c, &err)
                                     : LoadClusterDir(dir, &c, &err);
  if (!have_config && (a.Has("config") || replicas <= 0))
    return Fail(err + (a.Has("config") ? "" : " (or give --replicas N)"));
  if (!have_config) c.path = dir + "/cluster.toml";
  if (have_config && replicas > 0 && replicas != static_cast<long long>(c.replicas.size()))
    return Fail("--replicas " + std::to_string(replicas) + " but " + c.path + " has " +
                std::to_string(c.replicas.size()));
  int n = have_config ? static_cast<int>(c.replicas.size()) : static_cast<int>(replicas);
  if (n > 64) return Fail("--replicas " + std::to_string(n) + ": at most 64");
  std::string keys = KeysDir(c);
  if (!MakeClusterKeys(keys, n, &err)) return Fail(err);
  printf("made the keys of a %d-replica cluster in %s:\n", n, keys.c_str());
  printf("  ca.crt               every host and every client\n");
  printf("  ca.key               nobody: keep it off the replicas (it makes certificates)\n");
  for (int i = 0; i < n; i++) printf("  replica-%d.crt, .key  replica %d's host only\n", i, i);
  return 0;
}

int CmdPropose(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help"});
  if (WantsHelp(a) || a.positional.empty()) {
    printf(
        "usage: lockstep propose [--dir DIR | --config FILE] [--replica N] VALUE...\n\n"
        "Agrees each VALUE through the replicated log (at the leader unless --replica is given)\n"
        "and prints its index once a majority holds it durably.\n");
    return a.positional.empty() && !WantsHelp(a) ? 2 : 0;
  }
  ClusterConfig c;
  std::string err;
  if (!LoadConfigFromArgs(a, &c, &err)) return Fail(err);
  long long target;
  if (!a.GetInt("replica", -1, &target)) return Fail(a.error);
  int r = target >= 0 ? static_cast<int>(target) : FindLeader(c, 5000);
  if (r < 0) return Fail("no leader found (is the cluster up? `lockstep cluster status`)");
  auto client = Client::Connect(c, r, 1000, &err);
  if (!client) return Fail(err);
  int failures = 0;
  for (const auto& v : a.positional) {
    ProposeReply rep;
    if (!client->Propose(EntryType::kInput, v, &rep, &err)) return Fail(err);
    if (!rep.ok) {
      fprintf(stderr, "lockstep: '%s' not committed: %s\n", v.c_str(), rep.error.c_str());
      failures++;
      continue;
    }
    printf("committed index %lu in %.1f us (durable write %.1f us, quorum wait %.1f us)\n",
           (unsigned long)rep.index, rep.commit_us, rep.durable_us, rep.quorum_us);
  }
  return failures ? 1 : 0;
}

int CmdLog(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help"});
  if (WantsHelp(a)) {
    printf(
        "usage: lockstep log [--dir DIR | --config FILE] [--replica N] [--from I] [--max K]\n\n"
        "Prints the committed entries of replica N (the leader by default): index, ballot,\n"
        "type and payload, one a line.\n");
    return 0;
  }
  ClusterConfig c;
  std::string err;
  if (!LoadConfigFromArgs(a, &c, &err)) return Fail(err);
  long long target, from, max;
  if (!a.GetInt("replica", -1, &target) || !a.GetInt("from", 1, &from) ||
      !a.GetInt("max", 1000000, &max))
    return Fail(a.error);
  int r = target >= 0 ? static_cast<int>(target) : FindLeader(c, 5000);
  if (r < 0) return Fail("no leader found");
  auto client = Client::Connect(c, r, 1000, &err);
  if (!client) return Fail(err);
  uint64_t next = static_cast<uint64_t>(from), commit = 0;
  long long printed = 0;
  for (;;) {
    std::vector<Entry> es;
    if (!client->Read(next, 4096, &commit, &es, &err)) return Fail(err);
    for (const auto& e : es) {
      // A server's input is shown decoded; anything else (lockstep propose) as it is.
      Input in;
      std::string shown = e.type == EntryType::kInput && DecodeInput(e.payload, &in)
                              ? DescribeInput(in)
                              : e.payload;
      printf("%lu\t%s\t%s\t%s\n", (unsigned long)e.index, BallotString(e.ballot).c_str(),
             EntryTypeName(e.type), shown.c_str());
      next = e.index + 1;
      if (++printed >= max) return 0;
    }
    if (es.empty() || next > commit) return 0;
  }
}

int CmdTruncate(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help"});
  if (WantsHelp(a) || !a.Has("below")) {
    printf(
        "usage: lockstep truncate --below I [--replica N] [--dir DIR | --config FILE]\n\n"
        "Drops the committed entries below index I from replica N's log (the leader's by\n"
        "default). Replicas do this themselves once a checkpoint covers the entries; this is\n"
        "for an operator, and needs the admin credential (admin_secret in cluster.toml).\n");
    return WantsHelp(a) ? 0 : 2;
  }
  if (!a.error.empty()) return Fail(a.error);
  ClusterConfig c;
  std::string err;
  if (!LoadConfigFromArgs(a, &c, &err)) return Fail(err);
  long long target, below;
  if (!a.GetInt("replica", -1, &target) || !a.GetInt("below", 0, &below)) return Fail(a.error);
  if (below < 1) return Fail("--below needs a log index of 1 or more");
  int r = target >= 0 ? static_cast<int>(target) : FindLeader(c, 5000);
  if (r < 0) return Fail("no leader found (is the cluster up? `lockstep cluster status`)");
  auto client = Client::Connect(c, r, 1000, &err, Principal::kAdmin);
  if (!client) return Fail(err);
  uint64_t first = 0;
  if (!client->Truncate(static_cast<uint64_t>(below), &first, &err))
    return Fail("replica " + std::to_string(r) + ": " + err);
  printf("replica %d keeps its log from index %lu\n", r, (unsigned long)first);
  return 0;
}

// ------------------------------------------------------------------ failpoint

int CmdFailpoint(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help"});
  std::string spec;
  for (const auto& p : a.positional) spec += (spec.empty() ? "" : " ") + p;
  if (WantsHelp(a) || spec.empty() || !a.Has("id")) {
    printf(
        "usage: lockstep failpoint --id N [--dir DIR | --config FILE] SPEC|off\n\n"
        "Injects faults into replica N while it runs, for fault campaigns and tests. Replicas\n"
        "accept this only with failpoints = true in cluster.toml (cluster up --failpoints) or\n"
        "LOCKSTEP_FAILPOINTS=1 in their environment, and only from an admin (admin_secret).\n"
        "SPEC replaces the one before; `off` clears it.\n"
        "SPEC is key=value pairs:\n"
        "  drop=P          each message to a peer is lost with probability P (0..1)\n"
        "  delay_ms=D      each message to a peer leaves D ms late, plus up to\n"
        "  jitter_ms=J     J ms more (the order to each peer is kept)\n"
        "  to=ID           only the messages to replica ID (default: every peer)\n"
        "  disk_delay_ms=D each durable write waits D ms first (a slow disk)\n"
        "  clock_jump_ms=D the replica's clock jumps D ms ahead, once\n"
        "  torn_write=1    the next log append stops before the sector holding its last\n"
        "                  record's canary, and the replica exits at once (status 86)\n"
        "  seed=S          seed of the random draws (default 1): a run replays from it\n"
        "Messages are elections and heartbeats; the log's one-sided puts are not touched.\n");
    return WantsHelp(a) ? 0 : 2;
  }
  if (!a.error.empty()) return Fail(a.error);
  ClusterConfig c;
  std::string err;
  if (!LoadConfigFromArgs(a, &c, &err)) return Fail(err);
  long long id;
  if (!a.GetInt("id", -1, &id)) return Fail(a.error);
  if (id < 0 || id >= static_cast<long long>(c.replicas.size()))
    return Fail("--id " + std::to_string(id) + ": the cluster has replicas 0.." +
                std::to_string(c.replicas.size() - 1));
  FailpointSpec parsed;  // refuse a bad spec here, before asking anyone
  if (!ParseFailpointSpec(spec, &parsed, &err)) return Fail(err);
  auto client = Client::Connect(c, static_cast<int>(id), 1000, &err, Principal::kAdmin);
  if (!client) return Fail(err);
  FailpointReply reply;
  if (!client->Failpoint(spec, &reply, &err))
    return Fail("replica " + std::to_string(id) + ": " + err);
  if (!reply.ok) return Fail("replica " + std::to_string(id) + ": " + reply.text);
  printf("replica %lld: %s\n", id, reply.text.c_str());
  return 0;
}

// ------------------------------------------------------------------ checkpoint

int CmdCheckpoint(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help", "json", "wait"});
  std::string sub = a.positional.empty() ? "" : a.positional[0];
  if (WantsHelp(a) || (sub != "now" && sub != "list")) {
    printf(
        "usage:\n"
        "  lockstep checkpoint now --id N [--wait] [--dir DIR | --config FILE]\n"
        "  lockstep checkpoint list [--json] [--dir DIR | --config FILE]\n\n"
        "`now` asks backup N to checkpoint its server (CRIU) as soon as the server has read every\n"
        "input it was given; with --wait, returns once the checkpoint is committed. The leader\n"
        "never pauses its server for one. `list` shows every replica's checkpoints: the log index\n"
        "each one holds, when it was taken, its size, how long the dump paused the server, and\n"
        "whether it reads back. Policy: [checkpoint] in cluster.toml.\n");
    return WantsHelp(a) ? 0 : 2;
  }
  if (!a.error.empty()) return Fail(a.error);
  ClusterConfig c;
  std::string err;
  if (!LoadConfigFromArgs(a, &c, &err)) return Fail(err);
  if (sub == "now") {
    long long id;
    if (!a.GetInt("id", -1, &id)) return Fail(a.error);
    if (id < 0 || id >= static_cast<long long>(c.replicas.size()))
      return Fail("checkpoint now needs --id N, a replica of 0.." +
                  std::to_string(c.replicas.size() - 1));
    auto client = Client::Connect(c, static_cast<int>(id), 1000, &err, Principal::kAdmin);
    if (!client) return Fail(err);
    std::string before_json;
    if (!client->Status(&before_json, &err)) return Fail(err);
    CheckpointReply reply;
    if (!client->Checkpoint(CheckpointOp::kNow, &reply, &err)) return Fail(err);
    if (!reply.ok) return Fail("replica " + std::to_string(id) + ": " + reply.text);
    if (!a.Has("wait")) {
      printf("replica %lld will checkpoint its server as soon as it is at rest\n", id);
      return 0;
    }
    auto field = [](const std::string& json, const std::string& key) {
      size_t at = json.find("\"checkpoint\":{");
      return at == std::string::npos ? std::string() : JsonField(json.substr(at), key);
    };
    std::string taken0 = field(before_json, "taken"), failed0 = field(before_json, "failed");
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(c.checkpoint.timeout_ms + 30000);
    while (std::chrono::steady_clock::now() < deadline) {
      std::string json;
      if (!client->Status(&json, &err)) return Fail(err);
      if (field(json, "taken") != taken0) {
        printf("replica %lld: checkpoint %s taken (dump %.0f ms)\n", id,
               field(json, "index").c_str(), std::stod(field(json, "last_dump_us")) / 1000);
        return 0;
      }
      if (field(json, "failed") != failed0)
        return Fail("replica " + std::to_string(id) + ": " + field(json, "error"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return Fail("replica " + std::to_string(id) + ": no checkpoint within the timeout");
  }
  // list
  std::string all = "[";
  struct Row {
    std::string replica, index, time, bytes, dump_us, ok, path, error;
  };
  std::vector<Row> rows;
  int answered = 0;
  for (size_t r = 0; r < c.replicas.size(); r++) {
    auto client = Client::Connect(c, static_cast<int>(r), 1000, &err);
    CheckpointReply reply;
    if (!client || !client->Checkpoint(CheckpointOp::kList, &reply, &err)) {
      fprintf(stderr, "lockstep: replica %zu did not answer: %s\n", r, err.c_str());
      continue;
    }
    answered++;
    std::string body = reply.text.substr(1, reply.text.size() - 2);
    if (!body.empty()) all += (all.size() > 1 ? "," : "") + body;
    // Each element is a flat object.
    for (size_t p = 0; (p = reply.text.find('{', p)) != std::string::npos;) {
      size_t e = reply.text.find('}', p);
      std::string o = reply.text.substr(p, e - p + 1);
      rows.push_back(Row{JsonField(o, "replica"), JsonField(o, "index"), JsonField(o, "time_unix"),
                         JsonField(o, "bytes"), JsonField(o, "dump_us"), JsonField(o, "ok"),
                         JsonField(o, "path"), JsonField(o, "error")});
      p = e;
    }
  }
  all += "]";
  if (a.Has("json")) {
    printf("%s\n", all.c_str());
  } else {
    printf("%-8s %-12s %-20s %-10s %-9s %s\n", "replica", "index", "time", "size", "dump", "state");
    for (const Row& row : rows) {
      time_t t = static_cast<time_t>(std::stoll(row.time));
      char when[32];
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
      char size[32], dump[32];
      snprintf(size, sizeof size, "%.1f MB", std::stod(row.bytes) / 1e6);
      snprintf(dump, sizeof dump, "%.0f ms", std::stod(row.dump_us) / 1000);
      printf("%-8s %-12s %-20s %-10s %-9s %s\n", row.replica.c_str(), row.index.c_str(), when, size,
             dump, row.ok == "true" ? "ok" : ("DAMAGED: " + row.error).c_str());
    }
    if (rows.empty()) printf("(no checkpoints yet)\n");
  }
  return answered == static_cast<int>(c.replicas.size()) ? 0 : 1;
}

// ------------------------------------------------------------------ divergence

int CmdDivergence(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help", "json"});
  std::string sub = a.positional.empty() ? "" : a.positional[0];
  if (WantsHelp(a) || (sub != "list" && sub != "show") ||
      (sub == "show" && a.positional.size() < 2)) {
    printf(
        "usage:\n"
        "  lockstep divergence list [--json] [--dir DIR | --config FILE]\n"
        "  lockstep divergence show ID [--json | --html FILE] [--dir DIR | --config FILE]\n\n"
        "The leader compares what every replica's server sent on each connection (hashes of\n"
        "the output streams). A replica whose output differs has diverged: the leader writes a\n"
        "report and repairs it (the replica rolls back to a checkpoint and replays the log, or\n"
        "takes a checkpoint of a replica that agrees). `list` shows every report, `show` one:\n"
        "the replicas, the connection, the log window, that connection's inputs there, each\n"
        "replica's output around the first difference, and what the repair did. --html FILE\n"
        "writes one report as a page of its own (the outputs side by side, the first\n"
        "different byte marked; FILE - for stdout).\n");
    return WantsHelp(a) ? 0 : 2;
  }
  if (!a.error.empty()) return Fail(a.error);
  ClusterConfig c;
  std::string err;
  if (!LoadConfigFromArgs(a, &c, &err)) return Fail(err);
  DivergenceRequest req;
  req.op = sub == "list" ? DivergenceOp::kList : DivergenceOp::kShow;
  if (sub == "show") req.id = a.positional[1];
  std::vector<std::string> reports;
  int answered = 0;
  for (size_t r = 0; r < c.replicas.size(); r++) {
    std::string json;
    auto client = Client::Connect(c, static_cast<int>(r), 1000, &err);
    if (!client || !client->Divergence(req, &json, &err)) {
      // A stopped cluster's reports are on disk, where people read them after
      // the fact: read them there when this host holds the replica's dir.
      std::string reports_dir = c.replicas[r].dir + "/divergences";
      std::error_code ec;
      if (!std::filesystem::is_directory(c.replicas[r].dir, ec)) {
        fprintf(stderr, "lockstep: replica %zu did not answer: %s\n", r, err.c_str());
        continue;
      }
      fprintf(stderr, "lockstep: replica %zu did not answer (%s): read its reports in %s\n", r,
              err.c_str(), reports_dir.c_str());
      json = DivergenceAnswer(reports_dir, req);
    }
    answered++;
    if (req.op == DivergenceOp::kShow) {
      if (!json.empty()) reports.push_back(json);
    } else {
      for (std::string& item : JsonItems(json, 0)) reports.push_back(std::move(item));
    }
  }
  if (req.op == DivergenceOp::kShow) {
    if (reports.empty())
      return Fail("no divergence report " + req.id +
                  (answered == static_cast<int>(c.replicas.size())
                       ? " (lockstep divergence list shows the reports there are)"
                       : " on the replicas that answered"));
    if (a.Has("json")) {
      printf("%s\n", reports[0].c_str());
    } else if (a.Has("html")) {
      std::string page = ReportHtml(reports[0]), path = a.Get("html");
      if (path.empty()) return Fail("--html needs a file name (- for stdout)");
      if (path == "-") {
        fwrite(page.data(), 1, page.size(), stdout);
      } else {
        FILE* out = fopen(path.c_str(), "w");
        if (!out) return Fail("cannot write " + path + ": " + strerror(errno));
        bool ok = fwrite(page.data(), 1, page.size(), out) == page.size();
        ok = fclose(out) == 0 && ok;
        if (!ok) return Fail("cannot write " + path + ": " + strerror(errno));
        fprintf(stderr, "wrote %s\n", path.c_str());
      }
    } else {
      PrintReport(reports[0]);
    }
    return 0;
  }
  std::sort(reports.begin(), reports.end(), [](const std::string& x, const std::string& y) {
    return std::make_pair(JsonU64(x, "time_unix"), JsonField(x, "id")) <
           std::make_pair(JsonU64(y, "time_unix"), JsonField(y, "id"));
  });
  if (a.Has("json")) {
    std::string all = "[";
    for (size_t i = 0; i < reports.size(); i++) all += (i ? "," : "") + reports[i];
    printf("%s]\n", all.c_str());
  } else {
    printf("%-8s %-20s %-8s %-7s %-12s %-10s %-10s %-12s %s\n", "id", "time", "replica", "kind",
           "connection", "offset", "how", "status", "took");
    for (const std::string& r : reports) {
      time_t t = static_cast<time_t>(JsonI64(r, "time_unix"));
      char when[32];
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
      std::string who = JsonField(r, "leader_diverged") == "true"
                            ? JsonField(r, "replica") + " (leader)"
                            : JsonField(r, "replica");
      std::string kind = JsonField(r, "kind");
      printf("%-8s %-20s %-8s %-7s %-12s %-10s %-10s %-12s %s ms\n", JsonField(r, "id").c_str(),
             when, who.c_str(), kind.empty() ? "output" : kind.c_str(),
             JsonField(r, "connection").c_str(), JsonField(r, "offset").c_str(),
             JsonField(r, "how").c_str(), JsonField(r, "status").c_str(),
             JsonField(r, "total_ms").c_str());
    }
    if (reports.empty()) printf("(no divergence found)\n");
  }
  return answered == static_cast<int>(c.replicas.size()) ? 0 : 1;
}

// ------------------------------------------------------------------ sim

int CmdSim(int argc, char** argv) {
  Args a = Parse(argc, argv, 2, {"help", "verbose", "digest"});
  if (WantsHelp(a)) {
    printf(
        "usage: lockstep sim [--seeds N] [--first-seed S] [--replicas 3|5|7] [--seed S "
        "--verbose] [--digest]\n\n"
        "Runs the protocol core under deterministic random schedules (message loss, delay and\n"
        "reordering, crashes that lose what was not durable, partitions, a deposed leader paused\n"
        "and resumed) and checks agreement, durability, one leader per ballot and progress after\n"
        "every step. --seed S replays one seed (with --verbose: its full trace). --digest\n"
        "prints every seed's summary and a digest of its final committed logs, to compare two\n"
        "builds' runs seed by seed.\n");
    return 0;
  }
  long long seeds, first, replicas, one, duration;
  if (!a.GetInt("seeds", 100, &seeds) || !a.GetInt("first-seed", 1, &first) ||
      !a.GetInt("replicas", 3, &replicas) || !a.GetInt("seed", -1, &one) ||
      !a.GetInt("duration-ms", 0, &duration))
    return Fail(a.error);
  if (replicas != 3 && replicas != 5 && replicas != 7) return Fail("--replicas must be 3, 5 or 7");
  if (one >= 0) {
    first = one;
    seeds = 1;
  }
  long long violations = 0;
  for (long long s = first; s < first + seeds; s++) {
    SimOptions o;
    o.replicas = static_cast<int>(replicas);
    o.seed = static_cast<uint64_t>(s);
    o.verbose = a.Has("verbose");
    if (duration > 0) o.duration_us = static_cast<uint64_t>(duration) * 1000;
    SimResult r = RunSimulation(o);
    if (!r.ok) {
      violations++;
      printf(
          "seed %lld: VIOLATION: %s\n  replay: lockstep sim --replicas %lld --seed %lld "
          "--verbose\n",
          s, r.violation.c_str(), replicas, s);
    }
    if (a.Has("digest")) {
      printf("%s, digest %08x\n", r.summary.c_str(), r.digest);
    } else if (r.ok && (seeds <= 10 || a.Has("verbose"))) {
      printf("seed %lld: ok (%s)\n", s, r.summary.c_str());
    }
    if (seeds > 10 && (s - first + 1) % 100 == 0)
      fprintf(stderr, "  %lld/%lld seeds, %lld violations\n", s - first + 1, seeds, violations);
  }
  printf("%lld seeds, %lld violations\n", seeds, violations);
  return violations ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a connection its peer closed is an error to handle, not a
  // reason to die (TLS writes through write(2), which has no MSG_NOSIGNAL).
  signal(SIGPIPE, SIG_IGN);
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "replica") return CmdReplica(argc, argv);
  if (cmd == "cluster") return CmdCluster(argc, argv);
  if (cmd == "propose") return CmdPropose(argc, argv);
  if (cmd == "log") return CmdLog(argc, argv);
  if (cmd == "truncate") return CmdTruncate(argc, argv);
  if (cmd == "failpoint") return CmdFailpoint(argc, argv);
  if (cmd == "checkpoint") return CmdCheckpoint(argc, argv);
  if (cmd == "divergence") return CmdDivergence(argc, argv);
  if (cmd == "keys") return CmdKeys(argc, argv);
  if (cmd == "sim") return CmdSim(argc, argv);
  if (cmd == "bench") return CmdBench(argc, argv);
  if (cmd == "demo") return CmdDemo(argc, argv);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    printf("%s", kUsage);
    return 0;
  }
  fprintf(stderr, "%s", kUsage);
  if (!cmd.empty()) fprintf(stderr, "\nlockstep: unknown command '%s'\n", cmd.c_str());
  return 2;
}
