// netns_hosts.cc — network namespaces as hosts (netns_hosts.h): made and
// removed with iproute2's `ip`, entered with setns(2).
#include "guard/net/netns_hosts.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace lockstep {

namespace {

std::string ListPath(const std::string& dir) {
  return dir + "/netns";
}

bool Exists(const std::string& ns) {
  struct stat st;
  return stat(("/run/netns/" + ns).c_str(), &st) == 0;
}

// `ip` from where Debian puts it, else from PATH.
// Where a system tool lives ("ip", "nft"): the sbin directories need not be
// on a daemon's PATH.
std::string ToolBinary(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"})
    if (access((dir + name).c_str(), X_OK) == 0) return dir + name;
  return name;
}

// Runs the tool with args; *out gets its stdout and stderr. Its exit
// status, or -1.
int Tool(const std::string& name, const std::vector<std::string>& args, std::string* out) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    *out = strerror(errno);
    return -1;
  }
  std::vector<char*> argv;
  const std::string exe = ToolBinary(name);
  const char* ip = exe.c_str();
  argv.push_back(const_cast<char*>(ip));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    execvp(ip, argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  out->clear();
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  if (pid < 0) {
    *out = std::string("fork: ") + strerror(errno);
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    *out = "cannot run " + name + (name == "ip" ? " (iproute2)" : "");
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int Ip(const std::vector<std::string>& args, std::string* out) {
  return Tool("ip", args, out);
}

// Kills (by pid) whatever still runs in ns, then deletes it.
bool DeleteNamespace(const std::string& ns, std::string* error) {
  std::string out;
  if (Ip({"netns", "pids", ns}, &out) == 0) {
    std::istringstream pids(out);
    std::vector<pid_t> killed;
    for (long pid; pids >> pid;)
      if (pid > 1 && pid != getpid() && kill(static_cast<pid_t>(pid), SIGKILL) == 0)
        killed.push_back(static_cast<pid_t>(pid));
    // A killed process leaves the namespace when it is gone; give them a moment.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (pid_t pid : killed)
      while (kill(pid, 0) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (Ip({"netns", "del", ns}, &out) != 0 && Exists(ns)) {
    *error = "ip netns del " + ns + ": " + out;
    return false;
  }
  return true;
}

}  // namespace

bool RunIp(const std::vector<std::string>& args, std::string* error) {
  return RunTool("ip", args, error);
}

bool RunTool(const std::string& name, const std::vector<std::string>& args, std::string* error) {
  std::string out;
  if (Tool(name, args, &out) == 0) return true;
  std::string cmd = name;
  for (const auto& a : args) cmd += " " + a;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  *error = cmd + ": " + (out.empty() ? "failed" : out);
  return false;
}

NetnsHosts PlanNetnsHosts(const std::string& dir, int replicas) {
  std::string abs = std::filesystem::absolute(dir).lexically_normal().string();
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char ch : abs) h = (h ^ ch) * 16777619u;
  char tag[16];
  snprintf(tag, sizeof tag, "ls%06x", h & 0xffffff);
  NetnsHosts n;
  n.hub = std::string(tag) + "-hub";
  n.client = std::string(tag) + "-cl";
  for (int i = 0; i < replicas; i++)
    n.replicas.push_back(std::string(tag) + "-r" + std::to_string(i));
  n.prefix = "10.201." + std::to_string(1 + (h >> 24) % 250) + ".";
  return n;
}

namespace {

// A namespace with lo up and IPv6 off.
bool MakeNamespace(const std::string& ns, std::string* error) {
  if (!RunIp({"netns", "add", ns}, error)) return false;
  if (!RunIp({"-n", ns, "link", "set", "lo", "up"}, error)) return false;
  // IPv6 off before the veths exist (`default` is what a new interface
  // gets): a server that binds every address of its interface (gerbera's
  // libupnp) would otherwise meet the link-local one still tentative, just
  // after the link came up, and fail ("Could not bind to socket", -203).
  return RunTool("ip",
                 {"netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                  "net.ipv6.conf.default.disable_ipv6=1"},
                 error);
}

// The host's eth0, its other end (hub_end: "r0".., "cl") in the hub on the bridge.
bool Attach(const NetnsHosts& hosts, const std::string& ns, const std::string& hub_end,
            const std::string& addr, std::string* error) {
  return RunIp({"-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", hub_end, "netns",
                hosts.hub},
               error) &&
         RunIp({"-n", hosts.hub, "link", "set", hub_end, "master", "br0"}, error) &&
         RunIp({"-n", hosts.hub, "link", "set", hub_end, "up"}, error) &&
         RunIp({"-n", ns, "addr", "add", addr + "/24", "dev", "eth0"}, error) &&
         RunIp({"-n", ns, "link", "set", "eth0", "up"}, error);
}

// Every replica's address, as an nftables set's elements ("a, b, c").
std::string ReplicaAddrList(const NetnsHosts& hosts) {
  std::string list;
  for (size_t i = 0; i < hosts.replicas.size(); i++)
    list += (i ? ", " : "") + hosts.ReplicaAddr(static_cast<int>(i));
  return list;
}

// Replica i's firewall: the replicas' addresses in `replicas` ("a, b, c")
// reach every port, others only open_ports.
bool FirewallOne(const NetnsHosts& hosts, size_t i, const std::string& replicas,
                 const std::vector<int>& open_ports, std::string* error) {
  std::string ports;
  for (int p : open_ports) ports += (ports.empty() ? "" : ", ") + std::to_string(p);
  auto nft = [&](const std::string& command) {
    return RunTool("ip", {"netns", "exec", hosts.replicas[i], "nft", command}, error);
  };
  const std::string rule = "add rule inet lockstep_host input ";
  return nft("add table inet lockstep_host") &&
         nft("add chain inet lockstep_host input { type filter hook input priority 0 ; "
             "policy accept ; }") &&
         nft(rule + "iif lo accept") && nft(rule + "ct state established,related accept") &&
         nft(rule + "ip saddr { " + replicas + " } accept") &&
         nft(rule + "meta l4proto icmp accept") &&
         (ports.empty() || nft(rule + "tcp dport { " + ports + " } accept")) &&
         nft(rule + "counter drop");
}

bool ReservePorts(const std::string& ns, const std::vector<int>& ports, std::string* error) {
  std::string list;
  for (int p : ports) list += (list.empty() ? "" : ",") + std::to_string(p);
  if (list.empty()) return true;
  return RunTool(
      "ip", {"netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_local_reserved_ports=" + list},
      error);
}

}  // namespace

bool CreateNetnsHosts(const std::string& dir, const NetnsHosts& hosts, std::string* error) {
  std::vector<std::string> all = hosts.replicas;
  all.push_back(hosts.client);
  all.push_back(hosts.hub);
  // Leftovers of an earlier run under the same names go first.
  for (const auto& ns : all)
    if (Exists(ns) && !DeleteNamespace(ns, error)) return false;
  {
    std::ofstream f(ListPath(dir));
    for (const auto& ns : all) f << ns << "\n";
    if (!f) {
      *error = "cannot write " + ListPath(dir);
      return false;
    }
  }
  for (const auto& ns : all)
    if (!MakeNamespace(ns, error)) return false;
  if (!RunIp({"-n", hosts.hub, "link", "add", "br0", "type", "bridge"}, error) ||
      !RunIp({"-n", hosts.hub, "link", "set", "br0", "up"}, error))
    return false;
  for (size_t i = 0; i < hosts.replicas.size(); i++)
    if (!Attach(hosts, hosts.replicas[i], "r" + std::to_string(i),
                hosts.ReplicaAddr(static_cast<int>(i)), error))
      return false;
  return Attach(hosts, hosts.client, "cl", hosts.ClientAddr(), error);
}

bool AddNetnsReplicaHost(const std::string& dir, const NetnsHosts& hosts, int id,
                         const std::vector<int>& open_ports, const std::vector<int>& reserved_ports,
                         std::string* error) {
  const std::string& ns = hosts.replicas[id];
  if (Exists(ns) && !DeleteNamespace(ns, error)) return false;
  {
    std::ofstream f(ListPath(dir), std::ios::app);  // listed before it exists (RemoveNetnsHosts)
    f << ns << "\n";
    if (!f) {
      *error = "cannot write " + ListPath(dir);
      return false;
    }
  }
  const std::string replicas = ReplicaAddrList(hosts);
  if (!MakeNamespace(ns, error) ||
      !Attach(hosts, ns, "r" + std::to_string(id), hosts.ReplicaAddr(id), error) ||
      !FirewallOne(hosts, static_cast<size_t>(id), replicas, open_ports, error) ||
      !ReservePorts(ns, reserved_ports, error))
    return false;
  // The others let it in: ahead of their drop rule.
  for (int i = 0; i < id; i++)
    if (Exists(hosts.replicas[i]) && !RunTool("ip",
                                              {"netns", "exec", hosts.replicas[i], "nft",
                                               "insert rule inet lockstep_host input ip saddr " +
                                                   hosts.ReplicaAddr(id) + " accept"},
                                              error))
      return false;
  return true;
}

bool FirewallReplicaHosts(const NetnsHosts& hosts, const std::vector<std::vector<int>>& open_ports,
                          std::string* error) {
  const std::string replicas = ReplicaAddrList(hosts);
  for (size_t i = 0; i < hosts.replicas.size(); i++)
    if (!FirewallOne(hosts, i, replicas, open_ports[i], error)) return false;
  return true;
}

bool ReserveReplicaPorts(const NetnsHosts& hosts, const std::vector<int>& ports,
                         std::string* error) {
  for (const auto& ns : hosts.replicas)
    if (!ReservePorts(ns, ports, error)) return false;
  return true;
}

bool RemoveNetnsHosts(const std::string& dir, bool quiet, std::string* error) {
  std::ifstream f(ListPath(dir));
  if (!f) return true;  // none made
  std::vector<std::string> names;
  for (std::string ns; std::getline(f, ns);)
    if (!ns.empty()) names.push_back(ns);
  bool ok = true;
  int removed = 0;
  for (const auto& ns : names) {
    if (!Exists(ns)) continue;
    std::string err;
    if (DeleteNamespace(ns, &err)) {
      removed++;
    } else {
      ok = false;
      *error += (error->empty() ? "" : "; ") + err;
    }
  }
  if (ok) unlink(ListPath(dir).c_str());
  if (!quiet && removed)
    printf("removed %d network namespaces (%s ...)\n", removed, names[0].c_str());
  return ok;
}

bool EnterNetns(const std::string& name, std::string* error) {
  std::string path = "/run/netns/" + name;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = "network namespace " + name + " does not exist (" + path + ": " + strerror(errno) +
             "): is the cluster up?";
    return false;
  }
  int rc = setns(fd, CLONE_NEWNET);
  int saved = errno;
  close(fd);
  if (rc != 0) {
    *error = "cannot enter network namespace " + name + ": " + strerror(saved);
    return false;
  }
  return true;
}

}  // namespace lockstep
