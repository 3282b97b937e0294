// cluster.cc — starting, inspecting and stopping a local cluster.
#include "guard/cli/cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "checkpoint/spawn.h"
#include "checkpoint/store.h"
#include "consensus/core.h"
#include "consensus/disk_log.h"
#include "guard/net/client.h"
#include "guard/net/keys.h"
#include "guard/net/netns_hosts.h"
#include "guard/net/tls.h"
#include "guard/net/wire.h"
#include "guard/server/server.h"

namespace lockstep {

namespace {

std::string PidPath(const std::string& dir, int id) {
  return dir + "/replica-" + std::to_string(id) + ".pid";
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "lockstep";
  buf[n] = 0;
  return buf;
}

bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

std::string Hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

bool IsOurReplica(int pid, const std::string& config_path) {
  std::string cmd;  // (not std::ifstream: it throws on the ESRCH of a process exiting)
  if (!ReadSmallFile("/proc/" + std::to_string(pid) + "/cmdline", &cmd, 1 << 16)) return false;
  for (char& c : cmd)
    if (c == 0) c = ' ';
  return cmd.find(" replica ") != std::string::npos && cmd.find(config_path) != std::string::npos;
}

// The server part of a new cluster's config from --app or a command; checks
// that its executable exists, so that a bad command fails before anything starts.
bool ResolveServer(const ClusterUpOptions& o, ClusterConfig::ServerConfig* server,
                   std::string* error) {
  *server = {};
  if (!o.app.empty() && !o.command.empty()) {
    *error = "--app and a server command after -- exclude each other: give one";
    return false;
  }
  if (!o.app.empty()) {
    AppProfile p;
    if (!LoadAppProfile(AppsDir(), o.app, &p, error)) return false;
    server->command = p.command;
    server->app = p.name;
    server->ready_timeout_ms = p.ready_timeout_ms;
    server->ready_log = p.ready_log;
    server->same_random = p.same_random;
    server->same_clock = p.same_clock;
    server->timers_in_log = p.timers_in_log;
    server->cloned_start = p.cloned_start;
    server->state_probe = p.state_probe;
    server->state_check_every_s = p.state_check_every_s;
    server->serial_inputs = p.serial_inputs;
    server->serial_until_reply = p.serial_until_reply;
    server->serial_sleep_keeps_turn = p.serial_sleep_keeps_turn;
    server->unchecked_greeting = p.unchecked_greeting;
    server->prepare = p.prepare;
    server->criu_file_locks = p.criu_file_locks;
    for (const std::string& f : p.files)
      server->profile_files.push_back(std::filesystem::path(p.path).parent_path() / f);
    server->unchecked_replies = p.unchecked_replies;
    server->inspect_commands = p.inspect_commands;
    server->lease_reads = p.lease_reads;
    server->lease_protocol = p.lease_protocol;
  } else if (!o.command.empty()) {
    server->command = o.command;
  } else {
    return true;  // no server: the replicated log alone
  }
  if (o.ready_timeout_ms) server->ready_timeout_ms = o.ready_timeout_ms;
  std::vector<std::string> argv;
  if (!SplitCommand(server->command, &argv, error)) return false;
  if (argv.empty()) {
    *error = "the server command is empty";
    return false;
  }
  // The port may be named in a configuration file of the profile's instead.
  bool names_port = server->command.find("{port}") != std::string::npos;
  for (const std::string& f : server->profile_files) {
    std::string text, ignored;
    if (ReadTextFile(f, &text, &ignored) && text.find("{port}") != std::string::npos)
      names_port = true;
  }
  if (!names_port) {
    *error = "the server command has no {port}: each replica's server needs its own port (" +
             server->command + ")";
    return false;
  }
  std::string exe;
  return ResolveExecutable(
      SubstituteCommand(argv[0], o.base_port + 200, o.dir + "/replica-0/server"), &exe, error);
}

}  // namespace

std::vector<std::string> ListAppProfiles(const std::string& apps_dir) {
  std::vector<std::string> names;
  DIR* d = opendir(apps_dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".toml") == 0 && n[0] != '.')
      names.push_back(n.substr(0, n.size() - 5));
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool LoadAppProfile(const std::string& apps_dir, const std::string& name, AppProfile* out,
                    std::string* error) {
  AppProfile p;
  // A profile of one's own, anywhere (a path: it has a '/' or ends in
  // .toml), for a server that apps/ does not know; its `files` are beside it.
  bool is_path = name.find('/') != std::string::npos ||
                 (name.size() > 5 && name.compare(name.size() - 5, 5, ".toml") == 0);
  if (is_path) {
    std::error_code ec;
    std::filesystem::path file = std::filesystem::absolute(name, ec);
    if (ec || !std::filesystem::is_regular_file(file, ec)) {
      *error = "no app profile " + name + " (not a file; --app takes a profile's name in " +
               apps_dir + " or the path of a NAME.toml)";
      return false;
    }
    p.name = file.stem().string();
    p.path = file.string();
  } else {
    std::vector<std::string> known = ListAppProfiles(apps_dir);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      *error = "unknown app '" + name + "': no profile " + apps_dir + "/" + name +
               ".toml; available: " + (list.empty() ? "none" : list) +
               " (or the path of a profile of your own, or any server command after --)";
      return false;
    }
    p.name = name;
    p.path = apps_dir + "/" + name + ".toml";
  }
  std::string text;
  if (!ReadTextFile(p.path, &text, error)) return false;
  std::vector<TomlTable> tables;
  if (!ParseToml(text, p.path, {}, true, &tables, error)) return false;
  if (tables.empty()) {
    *error = TomlWhere(p.path, {}) + "field 'command' missing in the top level (add command = ...)";
    return false;
  }
  TomlTable& t = tables[0];
  int64_t timeout = 0, every = 0;
  if (!t.TakeString("command", &p.command, true, error) ||
      !t.TakeString("description", &p.description, false, error) ||
      !t.TakeString("bench", &p.bench, false, error) ||
      !t.TakeInt("ready_timeout_ms", &timeout, false, 100, 3600000, error) ||
      !t.TakeString("ready_log", &p.ready_log, false, error) ||
      !t.TakeBool("same_random", &p.same_random, error) ||
      !t.TakeBool("same_clock", &p.same_clock, error) ||
      !t.TakeBool("timers_in_log", &p.timers_in_log, error) ||
      !t.TakeBool("cloned_start", &p.cloned_start, error) ||
      !t.TakeString("state_probe", &p.state_probe, false, error) ||
      !t.TakeInt("state_check_every_s", &every, false, 1, 86400, error) ||
      !t.TakeBool("serial_inputs", &p.serial_inputs, error) ||
      !t.TakeBool("serial_until_reply", &p.serial_until_reply, error) ||
      !t.TakeBool("serial_sleep_keeps_turn", &p.serial_sleep_keeps_turn, error) ||
      !t.TakeBool("criu_file_locks", &p.criu_file_locks, error) ||
      !t.TakeBool("unchecked_greeting", &p.unchecked_greeting, error) ||
      !t.TakeString("prepare", &p.prepare, false, error) ||
      !t.TakeFileList("files", &p.files, error) ||
      !t.TakeUncheckedReplies(&p.unchecked_replies, error) ||
      !t.TakeCommandList("inspect_commands", false, &p.inspect_commands, error) ||
      !t.TakeLeaseReads(&p.lease_protocol, &p.lease_reads, error) || !t.NoLeftovers(error))
    return false;
  if (timeout) p.ready_timeout_ms = static_cast<uint64_t>(timeout);
  if (every) p.state_check_every_s = static_cast<uint64_t>(every);
  if (every && p.state_probe.empty())
    return t.Fail(t.At("state_check_every_s"),
                  "field 'state_check_every_s' needs a state_probe (the command it runs)", error);
  if (p.timers_in_log && !p.same_clock)
    return t.Fail(t.At("timers_in_log"),
                  "field 'timers_in_log' needs same_clock = true (a tick moves the clock)", error);
  for (const char* f : {"serial_until_reply", "serial_sleep_keeps_turn"})
    if (t.fields.count(f) && !p.serial_inputs)
      return t.Fail(t.At(f), std::string("field '") + f + "' needs serial_inputs = true", error);
  std::vector<std::string> argv;
  std::string why;
  if (!SplitCommand(p.command, &argv, &why)) return t.Fail(t.At("command"), why, error);
  if (argv.empty()) return t.Fail(t.At("command"), "field 'command' is empty", error);
  *out = p;
  return true;
}

std::string DefaultClusterDir() {
  const char* env = getenv("LOCKSTEP_DIR");
  return env && *env ? env : "/tmp/lockstep-cluster";
}

bool LoadClusterDir(const std::string& dir, ClusterConfig* config, std::string* error) {
  std::string path = dir + "/cluster.toml";
  if (access(path.c_str(), F_OK) != 0) {
    *error = "no cluster in " + dir + " (no cluster.toml; start one with `lockstep cluster up`)";
    return false;
  }
  return LoadClusterConfig(path, config, error);
}

namespace {
// SIGKILLed and still exiting (unmapping a big log region can take a
// while): gone for every purpose but its pid. A new replica may start; it
// waits for the old one's log LOCK.
bool Dying(int pid) {
  std::string status;
  if (!ReadSmallFile("/proc/" + std::to_string(pid) + "/status", &status, 1 << 16)) return false;
  std::istringstream f(status);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("ShdPnd:", 0) != 0 && line.rfind("SigPnd:", 0) != 0) continue;
    unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    if (mask & (1ULL << (SIGKILL - 1))) return true;
  }
  return false;
}
}  // namespace

int ReplicaPid(const std::string& dir, int id) {
  std::ifstream f(PidPath(dir, id));
  int pid = 0;
  if (!(f >> pid) || pid <= 0) return 0;
  if (kill(pid, 0) != 0) return 0;
  // A zombie or a recycled pid is not our replica.
  if (!IsOurReplica(pid, dir + "/cluster.toml")) return 0;
  if (ProcessState(pid) == 'Z') return 0;
  if (Dying(pid)) return 0;
  return pid;
}

namespace {
// Signals a process raises on itself when it crashes (an abort, a bad
// access), as opposed to those others send to end it (SIGKILL, SIGTERM).
bool IsCrashSignal(int sig) {
  return sig == SIGABRT || sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE ||
         sig == SIGTRAP;
}
}  // namespace

// The replica's keeper: runs `lockstep replica` as its child and starts it
// again when it crashed (at most kMaxCrashes times a minute). A replica that
// crashed is one fault, and the cluster tolerates it; one that stays down
// turns the next fault into a lost majority. Crashes are not hypothetical:
// UCX 1.13 aborts a process that received a software put (over tcp) on an
// endpoint that had just failed (ucp_put_handler's completion, "unexpected
// error: Endpoint timeout"), which a leader's death can cause on a backup.
// A replica ended from outside (SIGKILL, SIGTERM by `cluster down`) or that
// exited by itself (a bad config, a corrupt log) stays down, and so does one
// someone else started again meanwhile (its pid file names another process).
// The child's pid is the replica's pid: the pid file and `cluster status`
// name it, so signals sent to a replica reach the daemon itself.
void KeepReplica(const std::string& cfg, int id) {
  constexpr size_t kMaxCrashes = 3;
  std::string exe = SelfExe();
  std::string dir = std::filesystem::path(cfg).parent_path().string();
  std::string pid_path = PidPath(dir.empty() ? "." : dir, id);
  std::string ids = std::to_string(id);
  std::vector<std::chrono::steady_clock::time_point> crashes;
  for (;;) {
    pid_t child = fork();
    if (child < 0) _exit(1);
    if (child == 0) {
      execl(exe.c_str(), exe.c_str(), "replica", "--config", cfg.c_str(), "--id", ids.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    {  // whole or not at all: a reader must never see it half written
      std::string tmp = pid_path + ".tmp";
      std::ofstream(tmp) << child << "\n";
      rename(tmp.c_str(), pid_path.c_str());
    }
    int st = 0;
    while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFSIGNALED(st) || !IsCrashSignal(WTERMSIG(st))) _exit(0);
    int named = 0;
    std::ifstream(pid_path) >> named;
    auto now = std::chrono::steady_clock::now();
    std::erase_if(crashes, [&](auto t) { return now - t > std::chrono::minutes(1); });
    if (named != child) _exit(0);
    if (crashes.size() >= kMaxCrashes) {
      fprintf(stderr,
              "lockstep: replica %d (pid %d) crashed with %s, %zu times within a minute: "
              "not starting it again (`lockstep cluster restart --id %d` does)\n",
              id, child, strsignal(WTERMSIG(st)), crashes.size() + 1, id);
      _exit(0);
    }
    crashes.push_back(now);
    fprintf(stderr,
            "lockstep: replica %d (pid %d) crashed with %s (its output above says where); "
            "starting it again (%zu of at most %zu a minute)\n",
            id, child, strsignal(WTERMSIG(st)), crashes.size(), kMaxCrashes);
    fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

bool StartReplica(const std::string& dir, const ClusterConfig& config, int id, std::string* error) {
  if (ReplicaPid(dir, id)) return true;
  std::string log = dir + "/replica-" + std::to_string(id) + ".log";
  std::string cfg = dir + "/cluster.toml";
  std::string exe = SelfExe();
  pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork: ") + strerror(errno);
    return false;
  }
  if (pid == 0) {
    // Detach twice so the replica is nobody's child here and never a zombie of ours.
    setsid();
    if (fork() != 0) _exit(0);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int nul = open("/dev/null", O_RDONLY);
    dup2(nul, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    for (int i = 3; i < 1024; i++) close(i);
    std::string ids = std::to_string(id);
    execl(exe.c_str(), exe.c_str(), "replica", "--config", cfg.c_str(), "--id", ids.c_str(),
          "--keep", static_cast<char*>(nullptr));
    _exit(127);
  }
  int st;
  waitpid(pid, &st, 0);
  for (int i = 0; i < 200; i++) {  // the pid file appears right after the second fork
    if (ReplicaPid(dir, id)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  *error = "replica " + std::to_string(id) + " did not start; see " + log;
  return false;
}

bool RestartReplica(const std::string& dir, const ClusterConfig& config, int id, int* pid,
                    std::string* error) {
  std::string log = dir + "/replica-" + std::to_string(id) + ".log";
  std::error_code ec;
  uint64_t log_size_before = std::filesystem::file_size(log, ec);
  if (ec) log_size_before = 0;
  if (!StartReplica(dir, config, id, error)) return false;
  *pid = ReplicaPid(dir, id);
  // It may still fail early (a log it cannot open, a port taken): wait until
  // it answers, or until it is gone and its log says why. Gone is judged by
  // the pid its keeper wrote, three looks in a row: ReplicaPid's look at the
  // command line can miss a process in the middle of its exec.
  int gone_looks = 0;
  for (int i = 0; i < 100; i++) {
    std::string err;
    DaemonStatus st;
    auto c = Client::Connect(config, id, 300, &err);
    if (c && c->Status(&st, &err, 1000)) {
      if (int p = ReplicaPid(dir, id)) *pid = p;
      return true;
    }
    int named = 0;
    std::ifstream(PidPath(dir, id)) >> named;
    gone_looks = named <= 0 || kill(named, 0) != 0 ? gone_looks + 1 : 0;
    if (named > 0 && gone_looks == 0) *pid = named;
    if (gone_looks >= 3) {
      std::ifstream f(log);
      f.seekg(static_cast<std::streamoff>(log_size_before));
      std::string line, tail;
      while (std::getline(f, line)) tail += "\n  " + line;
      if (tail.size() > 2000) tail = "..." + tail.substr(tail.size() - 2000);
      *error = "replica " + std::to_string(id) + " exited right after it started; its log:" + tail;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;  // running, still starting up (a long restore)
}

// Runs the profile's `prepare` command once, with {dir} = the data template
// DIR/server-template, its output in DIR/server-template.log.
static bool RunPrepare(const std::string& prepare, const std::string& dir, std::string* error) {
  std::string log = dir + ".log";
  std::vector<std::string> argv;
  if (!SplitCommand(prepare, &argv, error) || argv.empty()) {
    *error = "the profile's prepare command: " + (argv.empty() ? "is empty" : *error);
    return false;
  }
  for (auto& a : argv) a = SubstituteCommand(a, 0, dir);
  SpawnOptions so;
  if (!ResolveExecutable(argv[0], &so.exe, error)) {
    *error = "the profile's prepare command: " + *error;
    return false;
  }
  so.argv = argv;
  so.out_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  fprintf(stderr, "preparing the servers' data template: %s (output in %s)\n",
          JoinCommand(argv).c_str(), log.c_str());
  SpawnResult r = Spawn(so);
  if (!r.ok()) {
    *error = "cannot run the profile's prepare command " + so.exe + ": " + strerror(r.err);
    return false;
  }
  int status = 0;
  while (waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *error = "the profile's prepare command failed (" +
             (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                : "killed by signal " + std::to_string(WTERMSIG(status))) +
             "); its output is in " + log;
    return false;
  }
  return true;
}

// Makes the directory every replica's server starts from when the profile
// asks for one: DIR/server-template (made fresh), filled by its `prepare`
// command, then given its `files` (whose {port} and {dir} each replica's
// daemon fills in: rendered_files).
static bool MakeDataTemplate(ClusterConfig::ServerConfig* server, const std::string& cluster_dir,
                             std::string* error) {
  if (server->prepare.empty() && server->profile_files.empty()) return true;
  std::string dir = std::filesystem::absolute(cluster_dir + "/server-template").string();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    *error = "cannot make " + dir + ": " + ec.message();
    return false;
  }
  if (!server->prepare.empty() && !RunPrepare(server->prepare, dir, error)) return false;
  server->rendered_files.clear();
  for (const std::string& from : server->profile_files) {
    std::string name = std::filesystem::path(from).filename().string();
    if (std::find(server->rendered_files.begin(), server->rendered_files.end(), name) !=
        server->rendered_files.end()) {
      *error = "the profile's files name two files called " + name;
      return false;
    }
    if (!std::filesystem::is_regular_file(from, ec)) {
      *error = "the profile's file " + from + " does not exist (or is not a file)";
      return false;
    }
    std::filesystem::copy_file(from, dir + "/" + name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) {
      *error = "cannot copy the profile's file " + from + " to " + dir + ": " + ec.message();
      return false;
    }
    server->rendered_files.push_back(name);
  }
  server->data_template = dir;
  return true;
}

// Makes the namespaces of a --hosts netns cluster; on failure removes what was made.
static bool MakeNetnsHosts(const std::string& dir, const NetnsHosts& hosts, std::string* error) {
  if (CreateNetnsHosts(dir, hosts, error)) return true;
  *error = "cannot make the network namespaces: " + *error;
  std::string ignored;
  RemoveNetnsHosts(dir, true, &ignored);
  return false;
}

// Each replica's namespace answers strangers on its client and server ports only ...
static bool FirewallReplicas(const NetnsHosts& hosts, const ClusterConfig& c, std::string* error) {
  std::vector<std::vector<int>> open_ports;
  for (const auto& r : c.replicas) {
    open_ports.push_back(r.server_port ? std::vector<int>{r.client_port, r.server_port}
                                       : std::vector<int>{r.client_port});
    if (r.metrics_port) open_ports.back().push_back(r.metrics_port);  // scraped from outside
  }
  if (!FirewallReplicaHosts(hosts, open_ports, error)) {
    *error = "cannot set the replicas' firewall: " + *error;
    return false;
  }
  // ... and never hands one of the cluster's ports to an outgoing connection.
  std::vector<int> ports;
  for (const auto& r : c.replicas)
    for (int p : {r.peer_port, r.client_port, r.server_port, r.metrics_port})
      if (p) ports.push_back(p);
  size_t colon = c.leader_address.rfind(':');
  if (colon != std::string::npos) ports.push_back(std::atoi(c.leader_address.c_str() + colon + 1));
  if (ReserveReplicaPorts(hosts, ports, error)) return true;
  *error = "cannot reserve the cluster's ports: " + *error;
  return false;
}

// Waits up to timeout_ms for a leader among replicas just started; gives up
// early once a majority of them has stopped (a server refused, a port
// taken), saying why from their logs.
static bool WaitForFirstLeader(const std::string& dir, const ClusterConfig& c, int timeout_ms,
                               std::string* error) {
  const int n = static_cast<int>(c.replicas.size());
  int leader = -1;
  auto stopped = [&] {
    std::vector<int> gone;
    for (int i = 0; i < n; i++)
      if (!ReplicaPid(dir, i)) gone.push_back(i);
    return gone;
  };
  for (int waited = 0; waited < timeout_ms && !WaitForLeader(c, 500, &leader); waited += 500)
    if (static_cast<int>(stopped().size()) > n / 2) break;
  if (leader >= 0) return true;
  std::vector<int> gone = stopped();
  *error = gone.empty() ? "no leader was elected within " + std::to_string(timeout_ms / 1000) +
                              " s; see the logs in " + dir
                        : "no leader: replicas stopped (" + std::to_string(gone.size()) + " of " +
                              std::to_string(n) + "); see the logs in " + dir;
  for (int i : gone) {
    std::ifstream f(dir + "/replica-" + std::to_string(i) + ".log");
    std::string line, last, refused;  // its refusal if it said one, else its last line
    while (std::getline(f, line)) {
      if (line.find("REFUSED") != std::string::npos && refused.empty()) refused = line;
      if (!line.empty()) last = line;
    }
    if (!refused.empty()) last = refused;
    if (!last.empty()) *error += "\n  replica " + std::to_string(i) + ": " + last;
  }
  return false;
}

ClusterHoldings ReadClusterHoldings(const std::string& dir) {
  ClusterHoldings held;
  std::vector<int> ids;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string digits = name.rfind("replica-", 0) == 0 ? name.substr(8) : "";
    if (!digits.empty() && digits.size() < 4 &&
        digits.find_first_not_of("0123456789") == std::string::npos && e.is_directory(ec))
      ids.push_back(std::stoi(digits));
  }
  std::sort(ids.begin(), ids.end());
  for (int id : ids) {
    ReplicaHolding r;
    r.id = id;
    const std::string replica_dir = dir + "/replica-" + std::to_string(id);
    if (std::filesystem::exists(replica_dir + "/log/LOCK", ec)) {
      DiskLogOptions o;
      o.dir = replica_dir + "/log";
      o.read_only = true;
      RecoveredLog log;
      std::string err;
      if (DiskLog::Open(o, &log, &err)) {
        r.has_log = true;
        r.first_index = std::max<uint64_t>(log.truncated_below, 1);
        r.last_index = log.slots.empty() ? r.first_index - 1 : log.slots.back().index;
        r.commit_index = log.commit_index;
        r.problem = log.problem;
      } else {
        r.read_error = err;
      }
    }
    CheckpointStore store;
    std::string err;
    if (store.OpenToRead(replica_dir, &err)) {
      for (const CheckpointInfo& c : store.List())
        if (c.ok) {
          r.newest_checkpoint = c.index;
          break;
        }
    }
    held.replicas.push_back(r);
  }
  return held;
}

bool ClusterHoldings::HoldsData() const {
  for (const ReplicaHolding& r : replicas)
    if (r.last_index > 0 || r.newest_checkpoint > 0 || !r.read_error.empty()) return true;
  return false;
}

std::string DescribeHoldings(const ClusterHoldings& held) {
  std::string out;
  for (const ReplicaHolding& r : held.replicas) {
    out += (out.empty() ? "" : "\n") + std::string("  replica ") + std::to_string(r.id) + ": ";
    if (!r.read_error.empty()) {
      out += "its log cannot be read (" + r.read_error + ")";
      continue;
    }
    if (!r.has_log) {
      out += "no log";
    } else if (r.last_index < r.first_index) {
      out += "an empty log";
    } else {
      out += "log entries " + std::to_string(r.first_index) + ".." + std::to_string(r.last_index) +
             " (committed up to at least " +
             std::to_string(std::min(r.commit_index, r.last_index)) + ")";
    }
    out += r.newest_checkpoint
               ? ", newest checkpoint at index " + std::to_string(r.newest_checkpoint)
               : ", no checkpoint";
    if (!r.problem.empty()) out += "; " + r.problem;
  }
  return out.empty() ? "  no replica directories" : out;
}

bool ClusterUp(const ClusterUpOptions& o, ClusterConfig* config, std::string* error) {
  if (o.replicas != 3 && o.replicas != 5 && o.replicas != 7) {
    *error = "--replicas must be 3, 5 or 7 (got " + std::to_string(o.replicas) + ")";
    return false;
  }
  if (o.transport != "shm" && o.transport != "tcp" && o.transport != "auto") {
    *error = "--transport must be shm, tcp or auto (got '" + o.transport + "')";
    return false;
  }
  if (o.durability != "disk" && o.durability != "memory") {
    *error = "--durability must be disk or memory (got '" + o.durability + "')";
    return false;
  }
  ClusterConfig::ServerConfig server;
  if (!ResolveServer(o, &server, error)) return false;
  if (server.command.size() && o.base_port + 200 + o.replicas > 65536) {
    *error = "--base-port " + std::to_string(o.base_port) + " is too high: server ports are " +
             "base+200..";
    return false;
  }
  if (o.base_port + 250 + o.replicas > 65536) {
    *error = "--base-port " + std::to_string(o.base_port) +
             " is too high: metrics ports are base+250..base+" + std::to_string(249 + o.replicas);
    return false;
  }
  mkdir(o.dir.c_str(), 0755);
  ClusterConfig existing;
  std::string ignored;
  if (LoadClusterDir(o.dir, &existing, &ignored)) {
    for (size_t i = 0; i < existing.replicas.size(); i++)
      if (ReplicaPid(o.dir, static_cast<int>(i))) {
        *error = "a cluster is already running in " + o.dir +
                 " (run `lockstep cluster down --dir " + o.dir + "` first)";
        return false;
      }
  }
  // A stopped cluster's log and checkpoints are its clients' data: a new
  // cluster here would remove them, so only on request (--wipe).
  if (!o.wipe) {
    ClusterHoldings held = ReadClusterHoldings(o.dir);
    if (held.HoldsData()) {
      *error = o.dir + " holds the data of a stopped cluster:\n" + DescribeHoldings(held) +
               "\nTo bring that cluster back with its data: lockstep cluster start --dir " + o.dir +
               "\nTo throw its data away and start a new cluster here: lockstep cluster up "
               "--wipe --dir " +
               o.dir + " ...";
      return false;
    }
  }
  ClusterConfig c;
  c.secret = Hex(RandomBytes(16));
  c.client_secret = Hex(RandomBytes(16));
  c.admin_secret = Hex(RandomBytes(16));
  c.transport = o.transport;
  c.durability = o.durability;
  c.ring_bytes = o.ring_bytes;
  c.segment_bytes = o.segment_bytes;
  c.checkpoint.enabled = o.checkpoints;
  c.failpoints = o.failpoints;
  if (o.checkpoint_every_entries) c.checkpoint.every_entries = o.checkpoint_every_entries;
  if (o.lagging_backup_grace_s) c.checkpoint.lagging_backup_grace_s = o.lagging_backup_grace_s;
  if (o.spin_us >= 0) c.spin_us = static_cast<uint64_t>(o.spin_us);
  if (o.election_timeout_min_us) {
    c.election_timeout_min_us = o.election_timeout_min_us;
    c.election_timeout_max_us = o.election_timeout_max_us;
  }
  c.lease_us = o.lease_us;
  if (c.lease_us) {
    CoreConfig core;
    core.lease_us = c.lease_us;
    if (core.LeaseGuardUs() > c.election_timeout_min_us) {
      *error = "--lease-us " + std::to_string(c.lease_us) + ": the backups' guard of it (" +
               std::to_string(core.LeaseGuardUs()) +
               " us: the lease, 1/16 of it and 500 us) must fit in the election timeout's "
               "minimum (" +
               std::to_string(c.election_timeout_min_us / 1000) + " ms): use at most " +
               std::to_string((c.election_timeout_min_us - 500) * 16 / 17) +
               " us, or a longer --election-timeout-ms";
      return false;
    }
  }
  c.server = server;
  c.checkpoint.file_locks = server.criu_file_locks;
  if (server.cloned_start && !c.checkpoint.enabled) {
    *error = "the profile '" + server.app +
             "' has cloned_start (every replica's server starts from a checkpoint of replica "
             "0's), which needs checkpoints: drop --no-checkpoints";
    return false;
  }
  if (!MakeDataTemplate(&c.server, o.dir, error)) return false;
  const bool netns = o.hosts == "netns";
  NetnsHosts hosts = PlanNetnsHosts(o.dir, o.replicas);
  if (netns) {
    if (!MakeNetnsHosts(o.dir, hosts, error)) return false;
    c.client_netns = hosts.client;
    // Clients reach whoever serves them here (guard/daemon/leader_address.h).
    if (c.has_server())
      c.leader_address = hosts.LeaderAddr() + ":" + std::to_string(o.base_port + 199);
  }
  for (int i = 0; i < o.replicas; i++) {
    ReplicaConfig r;
    r.id = i;
    r.host = netns ? hosts.ReplicaAddr(i) : "127.0.0.1";
    if (netns) r.netns = hosts.replicas[i];
    r.peer_port = o.base_port + i;
    r.client_port = o.base_port + 100 + i;
    // GET /metrics (guard/net/metrics_server.h). base+250: inside the 300
    // ports a cluster spans (peer +0, client +100, leader address +199,
    // server +200), which is how far apart tests and people put clusters.
    r.metrics_port = o.base_port + 250 + i;
    r.dir = o.dir + "/replica-" + std::to_string(i);
    std::vector<int> ports = {r.peer_port, r.client_port, r.metrics_port};
    if (c.has_server()) {
      r.server_port = o.base_port + 200 + i;
      ports.push_back(r.server_port);
    }
    for (int port : netns ? std::vector<int>{} : ports) {  // fresh namespaces: all ports free
      // A cluster stopped a moment ago may still be closing its sockets.
      for (int wait = 0; wait < 40 && !PortFree(port); wait++)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!PortFree(port)) {
        *error =
            "port " + std::to_string(port) + " on 127.0.0.1 is taken; choose another --base-port";
        return false;
      }
    }
    c.replicas.push_back(r);
  }
  // What the replicas will read must read back (checked before anything
  // changes): TOML strings are UTF-8, and a command given after -- need not be.
  std::string config_text;
  if (!FormatCheckedClusterConfig(c, o.dir + "/cluster.toml", &config_text, error)) return false;
  if (netns && !FirewallReplicas(hosts, c, error)) return false;
  // Fresh data: a new cluster starts with empty logs (what was here holds
  // nothing, or --wipe said to throw it away), an earlier cluster's extra
  // replicas' directories included.
  std::vector<int> clear;
  for (int i = 0; i < o.replicas; i++) clear.push_back(i);
  for (const ReplicaHolding& r : ReadClusterHoldings(o.dir).replicas)
    if (r.id >= o.replicas) clear.push_back(r.id);
  for (int i : clear) {
    const std::string replica_dir = o.dir + "/replica-" + std::to_string(i);
    std::error_code ec;
    std::filesystem::remove_all(replica_dir, ec);
    if (!ec) std::filesystem::remove(replica_dir + ".log", ec);
    if (ec) {
      *error = "cannot clear " + replica_dir + ": " + ec.message();
      return false;
    }
  }
  if (!WriteClusterConfigText(o.dir + "/cluster.toml", config_text, error)) return false;
  c.path = o.dir + "/cluster.toml";
  // A new cluster, new keys: its own CA, so that no daemon of an earlier
  // cluster in this directory (or of another) passes for one of this one.
  {
    std::error_code ec;
    std::filesystem::remove_all(KeysDir(c), ec);
    if (!MakeClusterKeys(KeysDir(c), o.replicas, error)) {
      *error = "cannot make the cluster's keys: " + *error;
      return false;
    }
  }
  // From here on this process is a client (FindLeader); each daemon moves to its own namespace.
  if (!EnterClientSide(c, error)) return false;
  for (int i = 0; i < o.replicas; i++)
    if (!StartReplica(o.dir, c, i, error)) return false;
  if (!WaitForFirstLeader(o.dir, c, 15000, error)) return false;
  *config = c;
  return true;
}

bool ClusterStart(const std::string& dir, ClusterConfig* config, std::string* error) {
  ClusterConfig c;
  if (!LoadClusterDir(dir, &c, error)) return false;
  const int n = static_cast<int>(c.replicas.size());
  for (int i = 0; i < n; i++)
    if (ReplicaPid(dir, i)) {
      *error = "replica " + std::to_string(i) + " of the cluster in " + dir +
               " is running; `lockstep cluster status --dir " + dir +
               "` shows the others (`cluster restart --id N` starts one that is down)";
      return false;
    }
  ClusterHoldings held = ReadClusterHoldings(dir);
  for (const ReplicaHolding& r : held.replicas)
    if (!r.read_error.empty()) {
      *error = "cannot read what replica " + std::to_string(r.id) + " holds: " + r.read_error;
      return false;
    }
  if (!c.client_netns.empty()) {
    // `cluster down` removed the namespaces; they are made again, with the
    // names and addresses cluster.toml has (both follow from the directory).
    NetnsHosts hosts = PlanNetnsHosts(dir, n);
    bool same = hosts.client == c.client_netns;
    for (int i = 0; i < n && same; i++) same = hosts.replicas[i] == c.replicas[i].netns;
    if (!same) {
      *error = "the network namespaces in " + dir +
               "/cluster.toml are not the ones this directory's path gives (was the directory "
               "moved?); bring the cluster back where it was made";
      return false;
    }
    if (!MakeNetnsHosts(dir, hosts, error) || !FirewallReplicas(hosts, c, error)) return false;
  }
  if (!EnterClientSide(c, error)) return false;
  fprintf(stderr, "starting the cluster in %s:\n%s\n", dir.c_str(), DescribeHoldings(held).c_str());
  for (int i = 0; i < n; i++)
    if (!c.replicas[i].removed && !StartReplica(dir, c, i, error)) return false;
  // Each replica first restores its newest checkpoint and replays its log
  // into its server: a big one takes a while.
  if (!WaitForFirstLeader(dir, c, 120000, error)) return false;
  *config = c;
  return true;
}

bool FormatCheckedClusterConfig(const ClusterConfig& c, const std::string& path, std::string* text,
                                std::string* error) {
  *text = FormatClusterConfig(c);
  ClusterConfig back;
  std::string why;
  if (ParseClusterConfig(*text, path, &back, &why)) return true;
  *error = "cannot write a cluster.toml that reads back: " + why;
  if (why.find("utf-8") != std::string::npos)
    *error += " (the server command and the paths must be UTF-8)";
  return false;
}

bool WriteClusterConfigText(const std::string& path, const std::string& text, std::string* error) {
  const std::string tmp = path + ".writing";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      *error = "cannot write " + tmp;
      return false;
    }
  }
  chmod(tmp.c_str(), 0600);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + tmp + " to " + path + ": " + strerror(errno);
    return false;
  }
  return true;
}

bool WaitForLeader(const ClusterConfig& config, int timeout_ms, int* leader) {
  *leader = FindLeader(config, timeout_ms);
  return *leader >= 0;
}

ClusterStatus GetClusterStatus(const std::string& dir, const ClusterConfig& config) {
  ClusterStatus s;
  s.has_server = config.has_server();
  if (s.has_server) {
    s.server_name = config.server.app;
    std::vector<std::string> argv;
    std::string ignored;
    if (s.server_name.empty() && SplitCommand(config.server.command, &argv, &ignored) &&
        !argv.empty())
      s.server_name = argv[0].substr(argv[0].rfind('/') + 1);
  }
  uint64_t leader_commit = 0;
  for (size_t i = 0; i < config.replicas.size(); i++) {
    ReplicaStatus r;
    r.id = static_cast<int>(i);
    if (s.has_server)
      r.server_addr =
          config.replicas[i].host + ":" + std::to_string(config.replicas[i].server_port);
    if (config.replicas[i].metrics_port)
      r.metrics_addr =
          config.replicas[i].host + ":" + std::to_string(config.replicas[i].metrics_port);
    r.pid = ReplicaPid(dir, r.id);
    if (config.replicas[i].removed && !r.pid) {
      r.role = "removed";  // taken out through the log (lockstep member remove)
      s.replicas.push_back(r);
      continue;
    }
    std::string err;
    DaemonStatus st;
    // A replica this directory started has a pid file here, and one whose
    // process is gone is down without asking. One that runs on another host
    // (a real cluster: this is a client's or an admin's copy) has none: ask.
    bool started_here = access(PidPath(dir, r.id).c_str(), F_OK) == 0;
    auto c = r.pid || !started_here ? Client::Connect(config, r.id, 300, &err) : nullptr;
    if (c && c->Status(&st, &err, 1000)) {
      r.role = st.role;
      r.ballot = st.ballot;
      r.commit_index = st.commit_index;
      r.last_index = st.last_index;
      r.disk_error = st.disk_error;
      r.applied_index = st.applied_index;
      r.server_read_all = st.server_read_all;
      r.serving = st.serving;
      r.first_index = st.first_index;
      r.lease_left_us = st.lease_left_us;
      r.lease_guard_left_us = st.lease_guard_left_us;
      r.lease_reads = st.lease_reads;
      r.lease_misses = st.lease_misses;
      r.server_pid = st.server_pid;
      r.checkpoint_json = st.checkpoint;
      r.output_json = st.output;
      r.state_json = st.state_checks;
      r.checkpoint_index = JsonU64(st.checkpoint, "index");
      r.checkpoint_age_s = JsonI64(st.checkpoint, "age_s", -1);
      r.server_state = JsonStr(st.checkpoint, "server_state");
      r.divergence_reports = JsonU64(st.output, "reports");
      if (r.role == "leader") {
        s.leader = r.id;
        leader_commit = r.commit_index;
      }
    }
    s.replicas.push_back(r);
  }
  for (auto& r : s.replicas)
    if (r.role != "down")
      r.lag = leader_commit > r.commit_index ? leader_commit - r.commit_index : 0;
  if (s.leader >= 0) s.client_addr = s.replicas[s.leader].server_addr;
  s.leader_address = config.leader_address;
  s.client_netns = config.client_netns;
  return s;
}

std::string ClusterStatusJson(const ClusterStatus& s) {
  auto str_or_null = [](const std::string& v) { return v.empty() ? Json() : Json(v); };
  Json replicas = Json::array();
  for (const ReplicaStatus& r : s.replicas)
    replicas.push_back({{"id", r.id},
                        {"role", r.role},
                        {"ballot", r.ballot},
                        {"commit_index", r.commit_index},
                        {"last_index", r.last_index},
                        {"applied_index", r.applied_index},
                        {"server_read_all", r.server_read_all},
                        {"serving", r.serving},
                        {"pid", r.pid ? Json(r.pid) : Json()},
                        {"lag", r.lag},
                        {"disk_error", r.disk_error},
                        {"server_addr", str_or_null(r.server_addr)},
                        {"metrics_addr", str_or_null(r.metrics_addr)},
                        {"first_index", r.first_index},
                        {"lease_left_us", r.lease_left_us},
                        {"lease_guard_left_us", r.lease_guard_left_us},
                        {"lease_reads", r.lease_reads},
                        {"lease_misses", r.lease_misses},
                        {"server_pid", r.server_pid},
                        {"checkpoint", r.checkpoint_json},
                        {"output", r.output_json},
                        {"state_checks", r.state_json}});
  return JsonText(Json{{"leader", s.leader >= 0 ? Json(s.leader) : Json()},
                       {"client_addr", str_or_null(s.client_addr)},
                       {"leader_address", str_or_null(s.leader_address)},
                       {"client_netns", str_or_null(s.client_netns)},
                       {"replicas", std::move(replicas)}});
}

std::string FormatStatusTable(const ClusterStatus& s, const std::string& status_hint) {
  std::string out;
  char line[768];
  // The server column only when there is a server.
  auto server_col = [&](const std::string& v) {
    if (!s.has_server) return std::string();
    char col[64];
    snprintf(col, sizeof col, "%-22s ", v.c_str());
    return std::string(col);
  };
  // And the checkpoint column: the newest one's index and age.
  auto checkpoint_col = [&](const ReplicaStatus* r) {
    if (!s.has_server) return std::string();
    std::string v = "checkpoint";
    if (r) {
      v = r->checkpoint_index ? std::to_string(r->checkpoint_index) + " (" +
                                    std::to_string(r->checkpoint_age_s) + " s ago)"
                              : "-";
    }
    char col[64];
    snprintf(col, sizeof col, "%-20s ", v.c_str());
    return std::string(col);
  };
  snprintf(line, sizeof line, "%-4s %-10s %-8s %s%-8s %-12s %-10s %s%s\n", "id", "role", "pid",
           server_col("server").c_str(), "ballot", "commit_index", "last_index",
           checkpoint_col(nullptr).c_str(), "lag");
  out += line;
  for (const auto& r : s.replicas) {
    std::string notes;
    if (!r.disk_error.empty()) notes += "  DISK ERROR: " + r.disk_error;
    if (!r.server_state.empty() && r.server_state != "running")
      notes += "  SERVER: " + r.server_state;
    snprintf(line, sizeof line, "%-4d %-10s %-8s %s%-8s %-12lu %-10lu %s%lu%s\n", r.id,
             r.role.c_str(), r.pid ? std::to_string(r.pid).c_str() : "-",
             server_col(r.server_addr).c_str(), r.ballot.empty() ? "-" : r.ballot.c_str(),
             (unsigned long)r.commit_index, (unsigned long)r.last_index, checkpoint_col(&r).c_str(),
             (unsigned long)r.lag, notes.c_str());
    out += line;
  }
  uint64_t reports = 0;
  for (const auto& r : s.replicas) reports += r.divergence_reports;
  if (reports)
    out += std::to_string(reports) + " divergence report" + (reports == 1 ? "" : "s") +
           ": lockstep divergence list\n";
  // Where each replica's Prometheus metrics are (cluster.toml metrics_port).
  std::string metrics;
  for (const auto& r : s.replicas)
    metrics +=
        " " + std::to_string(r.id) + "=" + (r.metrics_addr.empty() ? "none" : r.metrics_addr);
  out += "metrics (GET http://ADDR/metrics):" + metrics +
         (metrics.find("=none") != std::string::npos
              ? "  (none: no metrics_port in that replica's cluster.toml entry)"
              : "") +
         "\n";
  if (s.leader < 0) {
    out += "no leader at the moment\n";
  } else if (s.has_server) {
    out += "clients connect to " + s.client_addr + " (the leader's " + s.server_name +
           ", replica " + std::to_string(s.leader) + ")" +
           (status_hint.empty() ? "" : "; status: " + status_hint) + "\n";
  }
  if (!s.leader_address.empty())
    out += "or to " + s.leader_address + ", which follows the leader\n";
  // Those addresses are inside the cluster's network namespaces: a client
  // reaches them from the client namespace only.
  if (!s.client_netns.empty())
    out += "these addresses are reached from the client namespace: ip netns exec " +
           s.client_netns + " CLIENT ARGS (the lockstep commands enter it themselves)\n";
  return out;
}

bool EnterClientSide(const ClusterConfig& config, std::string* error) {
  return config.client_netns.empty() || EnterNetns(config.client_netns, error);
}

bool ClusterDown(const std::string& dir, bool quiet, std::string* error) {
  ClusterConfig c;
  if (!LoadClusterDir(dir, &c, error)) {
    // No configuration (an `up` that crashed before writing it): its namespaces, if any.
    std::string load_error = *error;
    bool had_netns = access((dir + "/netns").c_str(), F_OK) == 0;
    error->clear();
    if (!RemoveNetnsHosts(dir, quiet, error)) return false;
    *error = load_error;
    return had_netns;
  }
  std::vector<int> pids;
  for (size_t i = 0; i < c.replicas.size(); i++) {
    int pid = ReplicaPid(dir, static_cast<int>(i));
    pids.push_back(pid);
    if (pid) kill(pid, SIGTERM);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (size_t i = 0; i < pids.size(); i++) {
    while (pids[i] && ReplicaPid(dir, static_cast<int>(i)) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (pids[i] && ReplicaPid(dir, static_cast<int>(i))) {
      kill(pids[i], SIGKILL);
      if (!quiet) fprintf(stderr, "replica %zu (pid %d) did not stop in 5 s: killed\n", i, pids[i]);
      for (int k = 0; k < 200 && ReplicaPid(dir, static_cast<int>(i)); k++)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    unlink(PidPath(dir, static_cast<int>(i)).c_str());
    if (!quiet && pids[i]) printf("replica %zu (pid %d) stopped\n", i, pids[i]);
  }
  return RemoveNetnsHosts(dir, quiet, error);
}

bool ParseElectionTimeout(const std::string& text, ClusterUpOptions* o, std::string* error) {
  size_t dash = text.find('-');
  std::string lo = text.substr(0, dash),
              hi = dash == std::string::npos ? lo : text.substr(dash + 1);
  auto number = [](const std::string& t, uint64_t* v) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string::npos)
      return false;
    *v = std::stoull(t);
    return true;
  };
  uint64_t min_ms = 0, max_ms = 0;
  if (!number(lo, &min_ms) || !number(hi, &max_ms)) {
    *error = "--election-timeout-ms takes MIN-MAX or MS in milliseconds (e.g. 100-200), not '" +
             text + "'";
    return false;
  }
  if (min_ms < 5 || max_ms > 60000 || min_ms > max_ms) {
    *error = "--election-timeout-ms " + text +
             ": needs 5 <= MIN <= MAX <= 60000 (heartbeats go every millisecond)";
    return false;
  }
  o->election_timeout_min_us = min_ms * 1000;
  o->election_timeout_max_us = max_ms * 1000;
  return true;
}

}  // namespace lockstep
