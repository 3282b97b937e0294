// cluster.cc — starting, inspecting and stopping a local cluster.
#include "guard/cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "guard/client.h"
#include "guard/wire.h"

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
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (char& c : cmd)
    if (c == 0) c = ' ';
  return cmd.find(" replica ") != std::string::npos && cmd.find(config_path) != std::string::npos;
}

}  // namespace

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

int ReplicaPid(const std::string& dir, int id) {
  std::ifstream f(PidPath(dir, id));
  int pid = 0;
  if (!(f >> pid) || pid <= 0) return 0;
  if (kill(pid, 0) != 0) return 0;
  // A zombie or a recycled pid is not our replica.
  if (!IsOurReplica(pid, dir + "/cluster.toml")) return 0;
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(st, s);
  size_t p = s.rfind(')');
  if (p != std::string::npos && p + 2 < s.size() && s[p + 2] == 'Z') return 0;
  return pid;
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
    std::ofstream(PidPath(dir, id)) << getpid() << "\n";
    std::string ids = std::to_string(id);
    execl(exe.c_str(), exe.c_str(), "replica", "--config", cfg.c_str(), "--id", ids.c_str(),
          static_cast<char*>(nullptr));
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

bool ClusterUp(const ClusterUpOptions& o, ClusterConfig* config, std::string* error) {
  if (o.replicas != 3 && o.replicas != 5 && o.replicas != 7 && o.replicas != 1) {
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
  ClusterConfig c;
  c.secret = Hex(RandomBytes(16));
  c.transport = o.transport;
  c.durability = o.durability;
  c.ring_bytes = o.ring_bytes;
  c.segment_bytes = o.segment_bytes;
  if (o.spin_us >= 0) c.spin_us = static_cast<uint64_t>(o.spin_us);
  for (int i = 0; i < o.replicas; i++) {
    ReplicaConfig r;
    r.id = i;
    r.host = "127.0.0.1";
    r.peer_port = o.base_port + i;
    r.client_port = o.base_port + 100 + i;
    r.dir = o.dir + "/replica-" + std::to_string(i);
    for (int port : {r.peer_port, r.client_port}) {
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
  // Fresh data: a new cluster starts with empty logs.
  for (int i = 0; i < o.replicas; i++) {
    std::string cmd =
        "rm -rf '" + c.replicas[i].dir + "' '" + o.dir + "/replica-" + std::to_string(i) + ".log'";
    if (system(cmd.c_str()) != 0) {
      *error = "cannot clear " + c.replicas[i].dir;
      return false;
    }
  }
  {
    std::ofstream f(o.dir + "/cluster.toml");
    f << FormatClusterConfig(c);
    if (!f) {
      *error = "cannot write " + o.dir + "/cluster.toml";
      return false;
    }
  }
  chmod((o.dir + "/cluster.toml").c_str(), 0600);
  c.path = o.dir + "/cluster.toml";
  for (int i = 0; i < o.replicas; i++)
    if (!StartReplica(o.dir, c, i, error)) return false;
  int leader = -1;
  if (!WaitForLeader(c, 15000, &leader)) {
    *error = "no leader was elected within 15 s; see the logs in " + o.dir;
    return false;
  }
  *config = c;
  return true;
}

bool WaitForLeader(const ClusterConfig& config, int timeout_ms, int* leader) {
  *leader = FindLeader(config, timeout_ms);
  return *leader >= 0;
}

ClusterStatus GetClusterStatus(const std::string& dir, const ClusterConfig& config) {
  ClusterStatus s;
  uint64_t leader_commit = 0;
  for (size_t i = 0; i < config.replicas.size(); i++) {
    ReplicaStatus r;
    r.id = static_cast<int>(i);
    r.pid = ReplicaPid(dir, r.id);
    std::string err, json;
    auto c = r.pid ? Client::Connect(config, r.id, 300, &err) : nullptr;
    if (c && c->Status(&json, &err, 1000)) {
      r.role = JsonField(json, "role");
      r.ballot = JsonField(json, "ballot");
      r.commit_index = std::stoull(JsonField(json, "commit_index"));
      r.last_index = std::stoull(JsonField(json, "last_index"));
      r.disk_error = JsonField(json, "disk_error");
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
  return s;
}

std::string ClusterStatusJson(const ClusterStatus& s) {
  std::ostringstream o;
  o << "{\"leader\": " << (s.leader >= 0 ? std::to_string(s.leader) : "null")
    << ", \"replicas\": [";
  for (size_t i = 0; i < s.replicas.size(); i++) {
    const auto& r = s.replicas[i];
    o << (i ? ", " : "") << "{\"id\": " << r.id << ", \"role\": \"" << r.role
      << "\", \"ballot\": \"" << r.ballot << "\", \"commit_index\": " << r.commit_index
      << ", \"last_index\": " << r.last_index
      << ", \"pid\": " << (r.pid ? std::to_string(r.pid) : "null") << ", \"lag\": " << r.lag
      << ", \"disk_error\": \"" << JsonEscape(r.disk_error) << "\"}";
  }
  o << "]}";
  return o.str();
}

std::string FormatStatusTable(const ClusterStatus& s) {
  std::string out;
  char line[512];
  snprintf(line, sizeof line, "%-4s %-10s %-8s %-8s %-12s %-10s %s\n", "id", "role", "pid",
           "ballot", "commit_index", "last_index", "lag");
  out += line;
  for (const auto& r : s.replicas) {
    snprintf(line, sizeof line, "%-4d %-10s %-8s %-8s %-12lu %-10lu %lu%s%s\n", r.id,
             r.role.c_str(), r.pid ? std::to_string(r.pid).c_str() : "-",
             r.ballot.empty() ? "-" : r.ballot.c_str(), (unsigned long)r.commit_index,
             (unsigned long)r.last_index, (unsigned long)r.lag,
             r.disk_error.empty() ? "" : "  DISK ERROR: ", r.disk_error.c_str());
    out += line;
  }
  if (s.leader < 0) out += "no leader at the moment\n";
  return out;
}

bool ClusterDown(const std::string& dir, bool quiet, std::string* error) {
  ClusterConfig c;
  if (!LoadClusterDir(dir, &c, error)) return false;
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
  return true;
}

}  // namespace lockstep
