// main.cc — the `lockstep` command: one binary, one subcommand per job. Each AddX
// defines a command line (CLI11, options.h) and what it runs once parsed.
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
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "consensus/sim.h"
#include "guard/cli/bench.h"
#include "guard/cli/cluster.h"
#include "guard/cli/inspect.h"
#include "guard/cli/leader_move.h"
#include "guard/cli/member.h"
#include "guard/cli/options.h"
#include "guard/common/config.h"
#include "guard/common/json.h"
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

// ------------------------------------------------------------------ replica

void AddReplica(CommandLine& cl) {
  struct Options {
    std::string config;
    long long id = 0;
    bool verbose = false, keep = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = cl.Add(
      &cl.root(), "replica", "run one replica daemon (one per host in a real cluster)",
      "Runs replica N of the cluster described in cluster.toml (the same file on every host)\n"
      "in the foreground until SIGTERM. Its log lives in the replica's `dir`.");
  cmd->add_option("--config", o->config, "the cluster's cluster.toml")
      ->type_name("FILE")
      ->required();
  AddNumber(cmd, "--id", &o->id, "which replica of it this is", 0, 1 << 20)->required();
  cmd->add_flag("--verbose", o->verbose, "log in more detail, for debugging");
  cmd->add_flag("--keep", o->keep,
                "run it as a child, and start it again when it crashes (an abort, a bad\n"
                "access; at most 3 times a minute), as `cluster up` does; its pid goes to\n"
                "replica-N.pid beside cluster.toml");
  // A missing --config or --id was exit code 1, as a bad one is.
  cl.OnRun(
      cmd,
      [o] {
        DaemonOptions d;
        std::string err;
        if (!LoadClusterConfig(o->config, &d.config, &err)) return Fail(err);
        d.id = static_cast<int>(o->id);
        d.verbose = o->verbose;
        if (o->keep) KeepReplica(o->config, d.id);
        return RunReplica(d);
      },
      1, 1);
}

// ------------------------------------------------------------------ cluster

// The cluster's directory: --dir, else $LOCKSTEP_DIR or /tmp/lockstep-cluster.
std::string ClusterDir(const std::string& dir) {
  return dir.empty() ? DefaultClusterDir() : dir;
}

int ClusterUpCommand(ClusterUpOptions o, const std::string& election_timeout,
                     const std::vector<std::string>& stray, const AfterDashDash& server) {
  std::string err;
  // The directory is written into cluster.toml and handed to the servers
  // ({dir}), which run elsewhere than here: a relative one is made
  // absolute (redis refused "--dir c/replica-0/server" from its own cwd).
  std::string dir = ClusterDir(o.dir);
  if (!dir.empty() && dir[0] != '/') {
    std::error_code ec;
    std::filesystem::path abs = std::filesystem::absolute(dir, ec);
    if (ec) return Fail("--dir " + dir + ": " + ec.message());
    dir = abs.lexically_normal().string();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  }
  o.dir = dir;
  if (!stray.empty())
    return Fail("unexpected argument '" + stray[0] +
                "' (a server command goes after --, e.g. `cluster up -- redis-server --port "
                "{port}`)");
  if (server.given && server.args.empty()) return Fail("no server command after --");
  // Namespaces share no shm doorbells nor peer-death detection: tcp between them.
  if (o.transport.empty()) o.transport = o.hosts == "netns" ? "tcp" : "shm";
  if (o.hosts == "netns" && o.transport == "shm")
    return Fail("--hosts netns needs --transport tcp (or auto): shm does not cross namespaces");
  if (!election_timeout.empty() && !ParseElectionTimeout(election_timeout, &o, &err))
    return Fail(err);
  // One argument with spaces is a whole command line; several are argv as the shell split it.
  const std::vector<std::string>& rest = server.args;
  if (rest.size() == 1 && rest[0].find_first_of(" \t") != std::string::npos) {
    o.command = rest[0];
  } else {
    o.command = JoinCommand(rest);
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

void AddClusterDir(CLI::App* cmd, std::string* dir) {
  cmd->add_option("--dir", *dir, "the cluster's directory")
      ->type_name("DIR")
      ->default_str(DefaultDirShown());
}

void AddCluster(CommandLine& cl) {
  CLI::App* family =
      cl.Add(&cl.root(), "cluster",
             "start, inspect and stop a cluster on this machine (up|start|status|restart|down),\n"
             "with a replicated server: cluster up --app redis (or -- ANY COMMAND)",
             "DIR defaults to $LOCKSTEP_DIR or /tmp/lockstep-cluster.");
  family->require_subcommand(1);

  // ---- up
  struct UpArgs {
    ClusterUpOptions o;
    long long replicas = 3, base_port = 7400, ring_bytes = 1 << 20, segment_bytes = 64 << 20,
              ready_timeout_ms = 0, checkpoint_entries = 0, backup_grace_s = 0;
    bool no_checkpoints = false;
    std::string election_timeout;
    std::vector<std::string> stray;  // arguments before any --: a mistake
  };
  auto u = std::make_shared<UpArgs>();
  std::string apps;
  for (const auto& n : ListAppProfiles(AppsDir())) apps += (apps.empty() ? "" : "|") + n;
  CLI::App* up = cl.Add(
      family, "up", "start a new cluster and wait for a leader",
      "`up` writes DIR/cluster.toml (with a fresh secret and keys), starts one daemon per\n"
      "replica and waits for a leader. `up` refuses a DIR that holds a stopped cluster's log\n"
      "or checkpoints, saying what they hold: `start` brings that cluster back (each replica\n"
      "from its own checkpoints and log: every acknowledged write, also after a power cut),\n"
      "`up --wipe` throws it away. --durability memory keeps entries in RAM on a majority\n"
      "only: NOT durable, for comparison.\n\n"
      "A server to replicate: --app NAME uses the profile " +
          AppsDir() +
          "/NAME.toml (--app\n"
          "PATH/NAME.toml: a profile of your own, same fields, apps/README.md); or give any\n"
          "command after --, where {port} and {dir} become each replica's own server port\n"
          "(base+200+i) and data directory (DIR/replica-i/server), e.g.\n"
          "  lockstep cluster up -- redis-server --port {port} --dir {dir} --save ''\n"
          "(everything after -- is the server's command line, untouched; one quoted argument\n"
          "after -- is split like a shell would). Each daemon runs its copy of the server under\n"
          "the preload shim; clients connect to the leader's, which `up` prints and `status`\n"
          "shows (client_addr; server_addr per replica in --json). Each daemon serves Prometheus\n"
          "metrics at GET /metrics on its metrics_port (base+250+i; metrics_addr in --json).\n"
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
          "failpoints = true in cluster.toml), for fault campaigns and tests.",
      "[-- SERVER COMMAND...]");
  up->add_option("--replicas", u->replicas, "how many replicas")
      ->type_name("3|5|7")
      ->check(OneOf({"3", "5", "7"}))
      ->capture_default_str();
  up->add_option("--transport", u->o.transport, "how the replicas reach each other (UCX)")
      ->type_name("shm|tcp|auto")
      ->check(OneOf({"shm", "tcp", "auto"}))
      ->default_str("shm; tcp with --hosts netns");
  u->o.transport.clear();  // empty: the default above, which depends on --hosts
  up->add_option("--durability", u->o.durability,
                 "where an entry must be before it commits: on disk, or in RAM (NOT durable)")
      ->type_name("disk|memory")
      ->check(OneOf({"disk", "memory"}))
      ->capture_default_str();
  AddClusterDir(up, &u->o.dir);
  AddNumber(up, "--base-port", &u->base_port,
            "peer ports P.., client ports P+100.., server ports P+200.., metrics ports P+250..", 1,
            65535);
  AddNumber(up, "--ring-bytes", &u->ring_bytes, "each replica's log region", 1 << 16, kNoLimit);
  AddNumber(up, "--segment-bytes", &u->segment_bytes, "each log segment file on disk", 1 << 16,
            kNoLimit);
  CLI::Option* app = up->add_option("--app", u->o.app,
                                    "the server to replicate: a profile in apps/, or the path "
                                    "of one of your own")
                         ->type_name((apps.empty() ? "NAME" : apps) + "|PATH")
                         ->default_str("none: the command after --, if any");
  up->add_option("--ready-timeout-ms", u->ready_timeout_ms,
                 "how long a replica's server may take to start listening")
      ->type_name("T")
      ->check(WholeNumberOr(0, 100, 3600000))
      ->default_str("the profile's, else 10000");
  AddNumber(up, "--checkpoint-entries", &u->checkpoint_entries,
            "a backup checkpoints its server every N applied entries", 0, kNoLimit,
            "25000, or [checkpoint] in cluster.toml");
  up->add_flag("--no-checkpoints", u->no_checkpoints, "backups never checkpoint their server");
  AddNumber(up, "--backup-grace-s", &u->backup_grace_s,
            "the leader keeps the log a backup lacks while it heard from it in the last S seconds",
            0, kNoLimit, "60, or [checkpoint] in cluster.toml")
      ->type_name("S");
  up->add_option("--election-timeout-ms", u->election_timeout,
                 "a backup that hears no leader for a random time in MIN..MAX ms stands for "
                 "election")
      ->type_name("MIN-MAX")
      ->default_str("50-100");
  up->add_option("--lease-us", u->o.lease_us,
                 "the leader's lease: no other replica leads while a majority echoes its "
                 "heartbeats (cluster.toml lease_us; its guard must fit in the election timeout)")
      ->type_name("US")
      ->check(CLI::Range(uint64_t{0}, uint64_t{60000000}))
      ->default_str("0: none");
  up->add_option("--hosts", u->o.hosts, "all replicas on loopback, or each in a network namespace")
      ->type_name("loopback|netns")
      ->check(OneOf({"loopback", "netns"}))
      ->capture_default_str();
  up->add_flag("--failpoints", u->o.failpoints,
               "let an admin inject faults into the replicas (lockstep failpoint)");
  up->add_flag("--wipe", u->o.wipe, "throw away what a stopped cluster left in DIR");
  up->add_option("stray", u->stray)->group("");  // refused: a server command goes after --
  const AfterDashDash* rest = &cl.rest();
  cl.TakesRest(up);
  cl.OnRun(up, [u, app, rest] {
    if (app->count() > 0 && u->o.app.empty()) return Fail("--app needs a profile name or path");
    u->o.replicas = static_cast<int>(u->replicas);
    u->o.base_port = static_cast<int>(u->base_port);
    u->o.ring_bytes = static_cast<uint64_t>(u->ring_bytes);
    u->o.segment_bytes = static_cast<uint64_t>(u->segment_bytes);
    u->o.ready_timeout_ms = static_cast<uint64_t>(u->ready_timeout_ms);
    u->o.checkpoint_every_entries = static_cast<uint64_t>(u->checkpoint_entries);
    u->o.lagging_backup_grace_s = static_cast<uint64_t>(u->backup_grace_s);
    u->o.checkpoints = !u->no_checkpoints;
    return ClusterUpCommand(u->o, u->election_timeout, u->stray, *rest);
  });

  // ---- start
  auto start_dir = std::make_shared<std::string>();
  CLI::App* start = cl.Add(family, "start", "start a stopped cluster again, with its data");
  AddClusterDir(start, start_dir.get());
  cl.OnRun(start, [start_dir] {
    std::string dir = ClusterDir(*start_dir), err;
    ClusterConfig c;
    if (!ClusterStart(dir, &c, &err)) return Fail(err);
    ClusterStatus s = GetClusterStatus(dir, c);
    printf("cluster of %zu replicas started again in %s\n", c.replicas.size(), dir.c_str());
    printf("%s", FormatStatusTable(s, "lockstep cluster status --dir " + dir).c_str());
    return 0;
  });

  // ---- status
  struct StatusArgs {
    std::string dir;
    bool json = false;
  };
  auto st = std::make_shared<StatusArgs>();
  CLI::App* status = cl.Add(family, "status", "every replica's role, ballot, log and server");
  AddClusterDir(status, &st->dir);
  status->add_flag("--json", st->json,
                   "as JSON (server_addr and metrics_addr per replica, client_addr)");
  cl.OnRun(status, [st] {
    std::string dir = ClusterDir(st->dir), err;
    ClusterConfig c;
    if (!LoadClusterDir(dir, &c, &err) || !EnterClientSide(c, &err)) return Fail(err);
    ClusterStatus s = GetClusterStatus(dir, c);
    if (st->json) {
      printf("%s\n", ClusterStatusJson(s).c_str());
    } else {
      printf("%s", FormatStatusTable(s).c_str());
    }
    return 0;
  });

  // ---- restart
  struct RestartArgs {
    std::string dir;
    long long id = -1;
    bool rolling = false;
    long long catch_up_ms = 60000;
  };
  auto rs = std::make_shared<RestartArgs>();
  CLI::App* restart = cl.Add(
      family, "restart", "start replica N again (after a crash), or restart every replica",
      "--id N starts replica N again if it is not running (after a crash, or a stop).\n"
      "--rolling restarts every replica in turn, for maintenance (a new lockstep binary, a\n"
      "changed server profile): each backup is stopped, started again and awaited until it\n"
      "has applied what the leader had committed and its server runs; then leadership moves\n"
      "away from the leader (`lockstep leader move`) and the old leader is restarted the\n"
      "same way. Clients of the leader reconnect once; every replica must be up to begin.");
  AddNumber(restart, "--id", &rs->id, "the replica", 0, 1 << 20, "none");
  restart->add_flag("--rolling", rs->rolling, "restart every replica in turn, the leader last");
  AddNumber(restart, "--catch-up-ms", &rs->catch_up_ms,
            "--rolling: how long a restarted replica may take to catch up", 100, 3600000);
  AddClusterDir(restart, &rs->dir);
  cl.OnRun(
      restart,
      [rs] {
        if (rs->rolling && rs->id >= 0)
          return Fail(
              "--id and --rolling exclude each other: --id N starts one replica again, "
              "--rolling restarts every replica in turn");
        if (!rs->rolling && rs->id < 0)
          return Fail(
              "--id is required (the replica to start again), or --rolling (restart "
              "every replica in turn)");
        std::string dir = ClusterDir(rs->dir), err;
        ClusterConfig c;
        if (!LoadClusterDir(dir, &c, &err) || !EnterClientSide(c, &err)) return Fail(err);
        if (rs->rolling) {
          auto say = [](const std::string& line) {
            printf("%s\n", line.c_str());
            fflush(stdout);
          };
          if (!RollingRestart(dir, c, static_cast<int>(rs->catch_up_ms), say, &err))
            return Fail("rolling restart stopped: " + err);
          printf("%s", FormatStatusTable(GetClusterStatus(dir, c)).c_str());
          return 0;
        }
        if (rs->id >= static_cast<long long>(c.replicas.size()))
          return Fail("restart needs --id N with N in 0.." + std::to_string(c.replicas.size() - 1));
        int pid = 0;
        if (!RestartReplica(dir, c, static_cast<int>(rs->id), &pid, &err)) return Fail(err);
        printf("replica %lld running (pid %d)\n", rs->id, pid);
        return 0;
      },
      1, 1);

  // ---- down: also removes what a crashed `up` left (its namespaces) without a cluster.toml.
  struct DownArgs {
    std::string dir;
    bool quiet = false;
  };
  auto dn = std::make_shared<DownArgs>();
  CLI::App* down = cl.Add(family, "down", "stop every replica; the data stays in DIR");
  AddClusterDir(down, &dn->dir);
  down->add_flag("--quiet", dn->quiet, "say nothing unless something fails");
  cl.OnRun(down, [dn] {
    std::string dir = ClusterDir(dn->dir), err;
    if (!ClusterDown(dir, dn->quiet, &err)) return Fail(err);
    if (!dn->quiet && ReadClusterHoldings(dir).HoldsData())
      printf("the data stays in %s: `lockstep cluster start --dir %s` brings it back\n",
             dir.c_str(), dir.c_str());
    return 0;
  });
}

// ------------------------------------------------------------------ propose / log

// Loads the cluster's configuration and, for a cluster of namespace hosts,
// moves this process to the clients' side of it.
bool LoadConfig(const ClusterRef& ref, ClusterConfig* c, std::string* err) {
  bool ok = !ref.config.empty() ? LoadClusterConfig(ref.config, c, err)
                                : LoadClusterDir(ClusterDir(ref.dir), c, err);
  return ok && EnterClientSide(*c, err);
}

// ------------------------------------------------------------------- keys

void AddKeys(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long replicas = 0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* family = cl.Add(&cl.root(), "keys", "make a cluster's CA and replica certificates");
  family->require_subcommand(1);
  CLI::App* init = cl.Add(
      family, "init", "make the keys",
      "Makes the cluster's own certificate authority and a certificate for each replica, in\n"
      "the directory cluster.toml's `keys` names (by default `keys` beside it), every file\n"
      "0600. The daemons prove themselves to each other with these over TLS; `cluster up`\n"
      "makes them for the clusters it starts. Without a cluster.toml, --replicas N says how\n"
      "many (the keys go in DIR/keys). On a real cluster, give each host ca.crt and its own\n"
      "replica-N.crt and replica-N.key; clients need ca.crt only; keep ca.key elsewhere.");
  AddClusterRef(init, &o->ref);
  AddNumber(init, "--replicas", &o->replicas, "how many replicas, without a cluster.toml", 1, 64,
            "cluster.toml's");
  cl.OnRun(init, [o] {
    ClusterConfig c;
    std::string err;
    std::string dir = ClusterDir(o->ref.dir);
    bool given_config = !o->ref.config.empty();
    long long replicas = o->replicas;
    bool have_config =
        given_config ? LoadClusterConfig(o->ref.config, &c, &err) : LoadClusterDir(dir, &c, &err);
    if (!have_config && (given_config || replicas <= 0))
      return Fail(err + (given_config ? "" : " (or give --replicas N)"));
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
  });
}

// ------------------------------------------------------------------ propose / log

void AddPropose(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long replica = -1;
    std::vector<std::string> values;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = cl.Add(
      &cl.root(), "propose", "agree values through the replicated log",
      "Agrees each VALUE through the replicated log (at the leader unless --replica is given)\n"
      "and prints its index once a majority holds it durably. A VALUE that starts with '-'\n"
      "goes after --.");
  AddClusterRef(cmd, &o->ref);
  AddNumber(cmd, "--replica", &o->replica, "propose at this replica", 0, 1 << 20, "the leader");
  cmd->add_option("VALUE", o->values, "the values, one entry each");
  const AfterDashDash* rest = &cl.rest();
  cl.TakesRest(cmd);
  cl.OnRun(cmd, [o, rest] {
    std::vector<std::string> values = o->values;
    values.insert(values.end(), rest->args.begin(), rest->args.end());
    if (values.empty()) {
      fprintf(stderr, "lockstep propose: no VALUE to propose (`lockstep propose --help`)\n");
      return 2;
    }
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    int r = o->replica >= 0 ? static_cast<int>(o->replica) : FindLeader(c, 5000);
    if (r < 0) return Fail("no leader found (is the cluster up? `lockstep cluster status`)");
    auto client = Client::Connect(c, r, 1000, &err);
    if (!client) return Fail(err);
    int failures = 0;
    for (const auto& v : values) {
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
  });
}

void AddLog(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long replica = -1, from = 1, max = 1000000;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = cl.Add(&cl.root(), "log", "print a replica's committed log",
                         "Prints the committed entries of replica N (the leader by default): "
                         "index, ballot,\ntype and payload, one a line.");
  AddClusterRef(cmd, &o->ref);
  AddNumber(cmd, "--replica", &o->replica, "whose log", 0, 1 << 20, "the leader");
  AddNumber(cmd, "--from", &o->from, "the first index", 0, kNoLimit);
  AddNumber(cmd, "--max", &o->max, "at most this many entries", 0, kNoLimit);
  cl.OnRun(cmd, [o] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    int r = o->replica >= 0 ? static_cast<int>(o->replica) : FindLeader(c, 5000);
    if (r < 0) return Fail("no leader found");
    auto client = Client::Connect(c, r, 1000, &err);
    if (!client) return Fail(err);
    uint64_t next = static_cast<uint64_t>(o->from), commit = 0;
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
        if (++printed >= o->max) return 0;
      }
      if (es.empty() || next > commit) return 0;
    }
  });
}

void AddTruncate(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long replica = -1, below = 0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd =
      cl.Add(&cl.root(), "truncate", "drop a replica's committed entries below an index (admin)",
             "Drops the committed entries below index I from replica N's log (the leader's by\n"
             "default). Replicas do this themselves once a checkpoint covers the entries; this is\n"
             "for an operator, and needs the admin credential (admin_secret in cluster.toml).");
  AddNumber(cmd, "--below", &o->below, "keep the log from this index on", 1, kNoLimit)
      ->type_name("I")
      ->required();
  AddNumber(cmd, "--replica", &o->replica, "whose log", 0, 1 << 20, "the leader");
  AddClusterRef(cmd, &o->ref);
  cl.OnRun(cmd, [o] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    int r = o->replica >= 0 ? static_cast<int>(o->replica) : FindLeader(c, 5000);
    if (r < 0) return Fail("no leader found (is the cluster up? `lockstep cluster status`)");
    auto client = Client::Connect(c, r, 1000, &err, Principal::kAdmin);
    if (!client) return Fail(err);
    uint64_t first = 0;
    if (!client->Truncate(static_cast<uint64_t>(o->below), &first, &err))
      return Fail("replica " + std::to_string(r) + ": " + err);
    printf("replica %d keeps its log from index %lu\n", r, (unsigned long)first);
    return 0;
  });
}

// ------------------------------------------------------------------ leader

void AddLeader(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long to = -1;
    long long wait_ms = 5000;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* family = cl.Add(&cl.root(), "leader", "move leadership on purpose (admin)");
  family->require_subcommand(1);
  CLI::App* cmd = cl.Add(
      family, "move", "hand leadership to another replica, for maintenance (admin)",
      "Asks the leader to hand leadership over: it stops proposing new inputs (they wait),\n"
      "waits until the target holds the whole log (up to 1 s; else it serves again and says\n"
      "so), then steps down and tells the target to take over at once. The target is --to N,\n"
      "else the backup furthest along. Waits until the new leader serves its clients, and\n"
      "prints how long that took. The old leader's clients reconnect once, to the new one.\n"
      "Needs the admin credential (admin_secret in cluster.toml).");
  AddNumber(cmd, "--to", &o->to, "the replica to lead", 0, 1 << 20, "the backup furthest along");
  AddNumber(cmd, "--wait-ms", &o->wait_ms, "how long to wait for the new leader to serve", 100,
            600000);
  cmd->add_flag("--json", o->json, "print the outcome as JSON (from, to, handover_ms, serving_ms)");
  AddClusterRef(cmd, &o->ref);
  cl.OnRun(cmd, [o] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    LeaderMoveOutcome out;
    if (!MoveLeader(c, static_cast<int>(o->to), static_cast<int>(o->wait_ms), &out, &err))
      return Fail("leader move: " + err);
    if (o->json) {
      printf("%s\n", JsonText(Json{{"from", out.from},
                                   {"to", out.to},
                                   {"handed_to", out.handed_to},
                                   {"handover_ms", out.handover_ms},
                                   {"serving_ms", out.serving_ms}})
                         .c_str());
    } else {
      printf(
          "leadership moved from replica %d to replica %d in %.1f ms (handed over after %.1f "
          "ms; replica %d serving after %.1f ms)\n",
          out.from, out.to, out.serving_ms, out.handover_ms, out.to, out.serving_ms);
    }
    return 0;
  });
}

// ------------------------------------------------------------------ member

void AddMemberCommands(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long id = -1;
    long long wait_ms = 120000;
    std::string host;
    bool learner = false;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* family =
      cl.Add(&cl.root(), "member", "change who is in the cluster, through the log (admin)");
  family->require_subcommand(1);
  // The local cluster's directory, or "" when --config names a file (real hosts).
  auto local_dir = [](const ClusterRef& ref) {
    return ref.config.empty() ? ClusterDir(ref.dir) : std::string();
  };

  CLI::App* list = cl.Add(family, "list", "the configuration: voters and learners, with lag",
                          "Asks the leader which replicas vote and which learn (receive the log "
                          "but are not\ncounted), and how many entries each is behind.");
  list->add_flag("--json", o->json, "print the leader's configuration and peers as JSON");
  AddClusterRef(list, &o->ref);
  cl.OnRun(list, [o] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    MemberListing l;
    if (!ListMembers(c, &l, &err)) return Fail("member list: " + err);
    if (o->json)
      printf("%s\n", JsonText(Json{{"leader", l.leader},
                                   {"last_index", l.last_index},
                                   {"membership", l.membership},
                                   {"peers", l.peers}})
                         .c_str());
    else
      printf("%s", FormatMemberTable(c, l).c_str());
    return 0;
  });

  CLI::App* add = cl.Add(
      family, "add", "add a replica: a learner that catches up, then a voter (admin)",
      "Adds a replica under the lowest id never used: writes its [[replica]] section into\n"
      "cluster.toml (on a local cluster: replica 0's host, cluster up's ports plus the id),\n"
      "signs its certificate with the cluster CA (keys/ca.key), commits its addition as a\n"
      "learner, and on a local cluster starts it. It catches up by state transfer and the\n"
      "log; once its durable log is within the leader's promotion window it is promoted to\n"
      "voter through the log. On real hosts (--config), copy cluster.toml and the new\n"
      "replica's keys to its host and start `lockstep replica` there while this waits.");
  AddClusterRef(add, &o->ref);
  add->add_option("--host", o->host, "the new replica's address (default: replica 0's)");
  add->add_flag("--learner", o->learner, "leave it a learner (no promotion)");
  AddNumber(add, "--wait-ms", &o->wait_ms, "how long to wait for it to catch up", 1000, 3600000);
  add->add_flag("--json", o->json, "print the outcome as JSON");
  cl.OnRun(add, [o, local_dir] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    MemberAddOptions mo;
    mo.dir = local_dir(o->ref);
    mo.host = o->host;
    mo.wait_ms = static_cast<int>(o->wait_ms);
    mo.promote = !o->learner;
    mo.quiet = o->json;
    MemberAddOutcome out;
    if (!AddMember(&c, mo, &out, &err)) return Fail("member add: " + err);
    if (o->json)
      printf("%s\n", JsonText(Json{{"id", out.id},
                                   {"added_index", out.added_index},
                                   {"promoted_index", out.promoted_index},
                                   {"catch_up_ms", out.catch_up_ms}})
                         .c_str());
    return 0;
  });

  CLI::App* promote =
      cl.Add(family, "promote", "make a learner a voter once it has caught up (admin)",
             "Promotes a learner (one added with member add --learner) to voter through the log,\n"
             "waiting while the leader says it has not caught up (its durable log within the\n"
             "leader's promotion window).");
  AddNumber(promote, "--id", &o->id, "the learner", 0, kMaxMemberIds - 1)->required();
  AddNumber(promote, "--wait-ms", &o->wait_ms, "how long to wait for it to catch up", 1000,
            3600000);
  AddClusterRef(promote, &o->ref);
  cl.OnRun(promote, [o] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    uint64_t index = 0;
    if (!PromoteMember(c, static_cast<int>(o->id), static_cast<int>(o->wait_ms), false, &index,
                       &err))
      return Fail("member promote: " + err);
    printf("replica %lld is a voter (configuration entry %lu committed)\n", o->id,
           (unsigned long)index);
    return 0;
  });

  CLI::App* remove =
      cl.Add(family, "remove", "take a replica out through the log, then stop it (admin)",
             "Commits the replica's removal (a leader hands leadership over first), marks it\n"
             "removed in cluster.toml and, on a local cluster, stops it. Its id is never used\n"
             "again. The cluster keeps at least one voter, and at most one change is under way.");
  AddNumber(remove, "--id", &o->id, "the replica to remove", 0, kMaxMemberIds - 1)->required();
  AddClusterRef(remove, &o->ref);
  cl.OnRun(remove, [o, local_dir] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    uint64_t index = 0;
    if (!RemoveMember(&c, local_dir(o->ref), static_cast<int>(o->id), false, &index, &err))
      return Fail("member remove: " + err);
    return 0;
  });
}

// ------------------------------------------------------------------ failpoint

void AddFailpoint(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long id = 0;
    std::vector<std::string> spec;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = cl.Add(
      &cl.root(), "failpoint",
      "inject faults into a running replica (cluster up --failpoints; admin)",
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
      "Messages are elections and heartbeats; the log's one-sided puts are not touched.");
  AddNumber(cmd, "--id", &o->id, "the replica", 0, 1 << 20)->required();
  AddClusterRef(cmd, &o->ref);
  cmd->add_option("SPEC", o->spec, "key=value pairs, or off")->type_name("SPEC|off");
  const AfterDashDash* rest = &cl.rest();
  cl.TakesRest(cmd);
  cl.OnRun(cmd, [o, rest] {
    std::string spec;
    for (const auto& p : o->spec) spec += (spec.empty() ? "" : " ") + p;
    for (const auto& p : rest->args) spec += (spec.empty() ? "" : " ") + p;
    if (spec.empty()) {
      fprintf(stderr, "lockstep failpoint: no SPEC (or off) given (`lockstep failpoint --help`)\n");
      return 2;
    }
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    long long id = o->id;
    if (id >= static_cast<long long>(c.replicas.size()))
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
  });
}

// ------------------------------------------------------------------ inspect

void AddInspect(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long id = 0;
    long long listen = -1;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = cl.Add(
      &cl.root(), "inspect", "read a replica's own server, through its daemon (admin)",
      "Connects to replica N's own server through N's daemon (TLS, admin_secret): the\n"
      "only connection a replica's server serves outside the log. On a backup it is not\n"
      "replicated and ends once that replica leads; on the leader it is a client like any\n"
      "other, through the log. A profile with inspect_commands (redis's) makes it read-only:\n"
      "other commands are answered with an error. The replica logs every inspection.\n"
      "  lockstep inspect --id 1                     stdin/stdout to the server (as nc)\n"
      "  lockstep inspect --id 1 -- redis-cli -p {port} DBSIZE\n"
      "                                              PROGRAM connects to 127.0.0.1:{port};\n"
      "                                              exits with PROGRAM's status\n"
      "  lockstep inspect --id 1 --listen 0          relays every connection to a local port\n"
      "                                              (printed) until killed");
  AddNumber(cmd, "--id", &o->id, "the replica", 0, 1 << 20)->required();
  AddClusterRef(cmd, &o->ref);
  AddNumber(cmd, "--listen", &o->listen, "serve this local port (0: any) until killed", 0, 65535,
            "none");
  const AfterDashDash* rest = &cl.rest();
  cl.TakesRest(cmd);
  cl.OnRun(cmd, [o, rest] {
    ClusterConfig c;
    std::string err;
    if (!LoadConfig(o->ref, &c, &err)) return Fail(err);
    InspectOptions io;
    io.id = static_cast<int>(o->id);
    io.listen_port = static_cast<int>(o->listen);
    io.program = rest->args;
    return RunInspect(c, io);
  });
}

// ------------------------------------------------------------------ checkpoint

int CheckpointNow(const ClusterRef& ref, long long id, bool wait) {
  ClusterConfig c;
  std::string err;
  if (!LoadConfig(ref, &c, &err)) return Fail(err);
  if (id >= static_cast<long long>(c.replicas.size()))
    return Fail("checkpoint now needs --id N, a replica of 0.." +
                std::to_string(c.replicas.size() - 1));
  auto client = Client::Connect(c, static_cast<int>(id), 1000, &err, Principal::kAdmin);
  if (!client) return Fail(err);
  DaemonStatus before;
  if (!client->Status(&before, &err)) return Fail(err);
  CheckpointReply reply;
  if (!client->Checkpoint(CheckpointOp::kNow, &reply, &err)) return Fail(err);
  if (!reply.ok) return Fail("replica " + std::to_string(id) + ": " + reply.text);
  if (!wait) {
    printf("replica %lld will checkpoint its server as soon as it is at rest\n", id);
    return 0;
  }
  uint64_t taken0 = JsonU64(before.checkpoint, "taken"),
           failed0 = JsonU64(before.checkpoint, "failed");
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(c.checkpoint.timeout_ms + 30000);
  while (std::chrono::steady_clock::now() < deadline) {
    DaemonStatus now;
    if (!client->Status(&now, &err)) return Fail(err);
    if (JsonU64(now.checkpoint, "taken") != taken0) {
      printf("replica %lld: checkpoint %llu taken (dump %.0f ms)\n", id,
             static_cast<unsigned long long>(JsonU64(now.checkpoint, "index")),
             static_cast<double>(JsonI64(now.checkpoint, "last_dump_us")) / 1000);
      return 0;
    }
    if (JsonU64(now.checkpoint, "failed") != failed0)
      return Fail("replica " + std::to_string(id) + ": " + JsonStr(now.checkpoint, "error"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Fail("replica " + std::to_string(id) + ": no checkpoint within the timeout");
}

int CheckpointList(const ClusterRef& ref, bool json) {
  ClusterConfig c;
  std::string err;
  if (!LoadConfig(ref, &c, &err)) return Fail(err);
  std::vector<CheckpointListItem> rows;
  int answered = 0;
  for (size_t r = 0; r < c.replicas.size(); r++) {
    auto client = Client::Connect(c, static_cast<int>(r), 1000, &err);
    CheckpointReply reply;
    if (!client || !client->Checkpoint(CheckpointOp::kList, &reply, &err)) {
      fprintf(stderr, "lockstep: replica %zu did not answer: %s\n", r, err.c_str());
      continue;
    }
    if (!ParseCheckpointList(reply.text, &rows, &err)) {
      fprintf(stderr, "lockstep: replica %zu answered a list that is not readable: %s\n", r,
              err.c_str());
      continue;
    }
    answered++;
  }
  if (json) {
    Json all = Json::array();
    for (const CheckpointListItem& row : rows) all.push_back(row.json);
    printf("%s\n", JsonText(all).c_str());
  } else {
    printf("%-8s %-12s %-20s %-10s %-9s %s\n", "replica", "index", "time", "size", "dump", "state");
    for (const CheckpointListItem& row : rows) {
      time_t t = static_cast<time_t>(row.time_unix);
      char when[32];
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
      char size[32], dump[32];
      snprintf(size, sizeof size, "%.1f MB", static_cast<double>(row.bytes) / 1e6);
      snprintf(dump, sizeof dump, "%.0f ms", static_cast<double>(row.dump_us) / 1000);
      printf("%-8d %-12llu %-20s %-10s %-9s %s\n", row.replica,
             static_cast<unsigned long long>(row.index), when, size, dump,
             row.ok ? "ok" : ("DAMAGED: " + row.error).c_str());
    }
    if (rows.empty()) printf("(no checkpoints yet)\n");
  }
  return answered == static_cast<int>(c.replicas.size()) ? 0 : 1;
}

void AddCheckpoint(CommandLine& cl) {
  struct Options {
    ClusterRef ref;
    long long id = 0;
    bool wait = false, json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* family = cl.Add(&cl.root(), "checkpoint",
                            "take a checkpoint of a backup's server now, or list the checkpoints",
                            "Policy: [checkpoint] in cluster.toml.");
  family->require_subcommand(1);
  CLI::App* now = cl.Add(
      family, "now", "checkpoint backup N's server",
      "`now` asks backup N to checkpoint its server (CRIU) as soon as the server has read every\n"
      "input it was given; with --wait, returns once the checkpoint is committed. The leader\n"
      "never pauses its server for one.");
  AddNumber(now, "--id", &o->id, "the backup", 0, 1 << 20)->required();
  now->add_flag("--wait", o->wait, "return once the checkpoint is committed");
  AddClusterRef(now, &o->ref);
  // A missing --id was exit code 1, as a bad one is.
  cl.OnRun(
      now, [o] { return CheckpointNow(o->ref, o->id, o->wait); }, 1, 1);
  CLI::App* list =
      cl.Add(family, "list", "every replica's checkpoints",
             "`list` shows every replica's checkpoints: the log index each one holds, when it was\n"
             "taken, its size, how long the dump paused the server, and whether it reads back.");
  list->add_flag("--json", o->json, "as JSON");
  AddClusterRef(list, &o->ref);
  cl.OnRun(list, [o] { return CheckpointList(o->ref, o->json); });
}

// ------------------------------------------------------------------ divergence

struct DivergenceArgs {
  ClusterRef ref;
  std::string id;  // show's; empty: list
  bool json = false;
  std::string html;
  bool html_given = false;
};

int Divergence(const DivergenceArgs& a, bool show) {
  ClusterConfig c;
  std::string err;
  if (!LoadConfig(a.ref, &c, &err)) return Fail(err);
  DivergenceRequest req;
  req.op = show ? DivergenceOp::kShow : DivergenceOp::kList;
  if (show) req.id = a.id;
  std::vector<Json> reports;
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
    if (req.op == DivergenceOp::kShow && json.empty()) {  // it has no such report
      answered++;
      continue;
    }
    // A report is an object; a list, an array of them.
    bool show = req.op == DivergenceOp::kShow;
    Json answer;
    std::string why = "not a JSON " + std::string(show ? "object" : "array");
    if (!ParseJson(json, &answer, &why) || (show ? !answer.is_object() : !answer.is_array())) {
      fprintf(stderr, "lockstep: replica %zu answered what is not a readable %s: %s\n", r,
              show ? "report" : "list of reports", why.c_str());
      continue;
    }
    answered++;
    if (answer.is_object()) {
      reports.push_back(std::move(answer));
    } else {
      for (Json& item : answer)
        if (item.is_object()) reports.push_back(std::move(item));
    }
  }
  if (req.op == DivergenceOp::kShow) {
    if (reports.empty())
      return Fail("no divergence report " + req.id +
                  (answered == static_cast<int>(c.replicas.size())
                       ? " (lockstep divergence list shows the reports there are)"
                       : " on the replicas that answered"));
    if (a.json) {
      printf("%s\n", JsonText(reports[0]).c_str());
    } else if (a.html_given) {
      std::string page = ReportHtml(reports[0]), path = a.html;
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
      fputs(ReportText(reports[0]).c_str(), stdout);
    }
    return 0;
  }
  std::sort(reports.begin(), reports.end(), [](const Json& x, const Json& y) {
    return std::make_pair(JsonU64(x, "time_unix"), JsonStr(x, "id")) <
           std::make_pair(JsonU64(y, "time_unix"), JsonStr(y, "id"));
  });
  if (a.json) {
    printf("%s\n", JsonText(Json(reports)).c_str());
  } else {
    printf("%-8s %-20s %-8s %-7s %-12s %-10s %-10s %-12s %s\n", "id", "time", "replica", "kind",
           "connection", "offset", "how", "status", "took");
    for (const Json& r : reports) {
      time_t t = static_cast<time_t>(JsonI64(r, "time_unix"));
      char when[32];
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
      std::string replica = std::to_string(JsonI64(r, "replica", -1));
      std::string who = JsonBool(r, "leader_diverged") ? replica + " (leader)" : replica;
      std::string kind = JsonStr(r, "kind", "output");
      printf("%-8s %-20s %-8s %-7s %-12s %-10llu %-10s %-12s %.1f ms\n", JsonStr(r, "id").c_str(),
             when, who.c_str(), kind.c_str(), JsonStr(r, "connection").c_str(),
             static_cast<unsigned long long>(JsonU64(r, "offset")), JsonStr(r, "how").c_str(),
             JsonStr(r, "status").c_str(), JsonDouble(r, "total_ms"));
    }
    if (reports.empty()) printf("(no divergence found)\n");
  }
  return answered == static_cast<int>(c.replicas.size()) ? 0 : 1;
}

void AddDivergence(CommandLine& cl) {
  auto o = std::make_shared<DivergenceArgs>();
  CLI::App* family = cl.Add(
      &cl.root(), "divergence",
      "list the divergence reports (replicas whose output differed), or show one",
      "The leader compares what every replica's server sent on each connection (hashes of\n"
      "the output streams). A replica whose output differs has diverged: the leader writes a\n"
      "report and repairs it (the replica rolls back to a checkpoint and replays the log, or\n"
      "takes a checkpoint of a replica that agrees).");
  family->require_subcommand(1);
  CLI::App* list = cl.Add(family, "list", "every report: when, which replica, how repaired");
  list->add_flag("--json", o->json, "as JSON");
  AddClusterRef(list, &o->ref);
  cl.OnRun(list, [o] { return Divergence(*o, false); });
  CLI::App* show = cl.Add(
      family, "show", "one report",
      "`show` prints one report: the replicas, the connection, the log window, that\n"
      "connection's inputs there, each replica's output around the first difference, and\n"
      "what the repair did. --html FILE writes it as a page of its own (the outputs side by\n"
      "side, the first different byte marked; FILE - for stdout).");
  show->add_option("ID", o->id, "the report's id (divergence list shows them)")->required();
  show->add_flag("--json", o->json, "as JSON");
  CLI::Option* html =
      show->add_option("--html", o->html, "write it as an HTML page to FILE (- for stdout)")
          ->type_name("FILE");
  AddClusterRef(show, &o->ref);
  cl.OnRun(show, [o, html] {
    o->html_given = html->count() > 0;
    return Divergence(*o, true);
  });
}

// ------------------------------------------------------------------ sim

int Sim(long long seeds, long long first, long long replicas, long long one, long long duration,
        long long lease_us, long long lease_overrun_us, bool verbose, bool digest, bool membership,
        bool membership_bug) {
  if (one >= 0) {
    first = one;
    seeds = 1;
  }
  long long violations = 0;
  for (long long s = first; s < first + seeds; s++) {
    SimOptions o;
    o.replicas = static_cast<int>(replicas);
    o.seed = static_cast<uint64_t>(s);
    o.verbose = verbose;
    if (duration > 0) o.duration_us = static_cast<uint64_t>(duration) * 1000;
    if (lease_us >= 0) o.lease_us = static_cast<uint64_t>(lease_us);
    o.lease_check_overrun_us = static_cast<uint64_t>(lease_overrun_us);
    o.membership = membership || membership_bug;
    o.membership_bug = membership_bug;
    SimResult r = RunSimulation(o);
    if (!r.ok) {
      violations++;
      printf(
          "seed %lld: VIOLATION: %s\n  replay: lockstep sim --replicas %lld --seed %lld%s "
          "--verbose\n",
          s, r.violation.c_str(), replicas, s,
          membership_bug ? " --membership-bug"
          : membership   ? " --membership"
                         : "");
    }
    if (digest) {
      printf("%s, digest %08x\n", r.summary.c_str(), r.digest);
    } else if (r.ok && (seeds <= 10 || verbose)) {
      printf("seed %lld: ok (%s)\n", s, r.summary.c_str());
    }
    if (seeds > 10 && (s - first + 1) % 100 == 0)
      fprintf(stderr, "  %lld/%lld seeds, %lld violations\n", s - first + 1, seeds, violations);
  }
  printf("%lld seeds, %lld violations\n", seeds, violations);
  return violations ? 1 : 0;
}

void AddSim(CommandLine& cl) {
  struct Options {
    long long seeds = 100, first = 1, replicas = 3, seed = -1, duration_ms = 0, lease_us = -1,
              lease_overrun_us = 0;
    bool verbose = false, digest = false, membership = false, membership_bug = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = cl.Add(
      &cl.root(), "sim", "run the protocol core under the deterministic simulator",
      "Runs the protocol core under deterministic random schedules (message loss, delay and\n"
      "reordering, crashes that lose what was not durable, partitions, a deposed leader paused\n"
      "and resumed) and checks agreement, durability, one leader per ballot, that no other\n"
      "replica leads while one holds a lease, and progress after every step. --seed S replays one "
      "seed (with --verbose: its full trace). --digest\n"
      "prints every seed's summary and a digest of its final committed logs, to compare two\n"
      "builds' runs seed by seed.");
  AddNumber(cmd, "--seeds", &o->seeds, "how many seeds to run", 0, kNoLimit);
  AddNumber(cmd, "--first-seed", &o->first, "the first of them", 0, kNoLimit)->type_name("S");
  cmd->add_option("--replicas", o->replicas, "how many replicas")
      ->type_name("3|5|7")
      ->check(OneOf({"3", "5", "7"}))
      ->capture_default_str();
  AddNumber(cmd, "--seed", &o->seed, "replay this one seed alone", 0, kNoLimit,
            "none: --seeds from --first-seed")
      ->type_name("S");
  AddNumber(cmd, "--duration-ms", &o->duration_ms, "simulated time per seed, in ms", 0, kNoLimit,
            "2000, the simulator's own");
  AddNumber(cmd, "--lease-us", &o->lease_us, "the leader lease (0: none)", 0, kNoLimit,
            "7500, the simulator's own");
  AddNumber(cmd, "--lease-overrun-us", &o->lease_overrun_us,
            "the check stretches each lease by this much (a test of the check: past the "
            "guard's margin it must find violations)",
            0, kNoLimit);
  cmd->add_flag("--verbose", o->verbose, "print every seed's result (with --seed: its full trace)");
  cmd->add_flag("--digest", o->digest, "print every seed's summary and a digest of its logs");
  cmd->add_flag("--membership", o->membership,
                "also change the membership under the faults: add a learner, promote it, remove "
                "a voter (the leader too)");
  cmd->add_flag("--membership-bug", o->membership_bug,
                "--membership with the single-server rules off and two changes at once (a test "
                "of the checks: they must find violations)");
  cl.OnRun(cmd, [o] {
    return Sim(o->seeds, o->first, o->replicas, o->seed, o->duration_ms, o->lease_us,
               o->lease_overrun_us, o->verbose, o->digest, o->membership, o->membership_bug);
  });
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a connection its peer closed is an error to handle, not a
  // reason to die (TLS writes through write(2), which has no MSG_NOSIGNAL).
  signal(SIGPIPE, SIG_IGN);
  CommandLine cl;
  AddReplica(cl);
  AddCluster(cl);
  AddPropose(cl);
  AddLog(cl);
  AddTruncate(cl);
  AddFailpoint(cl);
  AddLeader(cl);
  AddMemberCommands(cl);
  AddInspect(cl);
  AddCheckpoint(cl);
  AddDivergence(cl);
  AddKeys(cl);
  AddSim(cl);
  AddBench(cl);
  AddDemo(cl);
  return cl.Run(argc, argv);
}
