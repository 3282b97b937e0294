// server.cc — the server process a replica runs: command templates, PATH
// lookup, fork+exec under the preload shim, readiness, stop.
#include "guard/server/server.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "checkpoint/spawn.h"

extern char** environ;

#ifndef LOCKSTEP_PRELOAD_PATH
#define LOCKSTEP_PRELOAD_PATH "liblockstep_preload.so"
#endif
#ifndef LOCKSTEP_APPS_DIR
#define LOCKSTEP_APPS_DIR "apps"
#endif
// The installed layout (`cmake --install`): the shim and the profiles relative
// to the directory of the running executable (from GNUInstallDirs: by default
// ../lib/lockstep/liblockstep_preload.so and ../share/lockstep/apps). "": none.
#ifndef LOCKSTEP_INSTALLED_PRELOAD
#define LOCKSTEP_INSTALLED_PRELOAD ""
#endif
#ifndef LOCKSTEP_INSTALLED_APPS
#define LOCKSTEP_INSTALLED_APPS ""
#endif

namespace lockstep {

namespace {

std::string CurrentDir() {
  char buf[4096];
  return getcwd(buf, sizeof buf) ? buf : ".";
}

// mkdir -p, mode 0755; errno is preserved on failure.
bool MakeDirs(const std::string& path) {
  if (path.empty()) return true;
  std::string p;
  size_t i = 0;
  while (i != std::string::npos) {
    i = path.find('/', i + 1);
    p = path.substr(0, i);
    if (p.empty() || p == "/") continue;
    if (mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    return false;
  }
  return true;
}

std::string Describe(int status) {
  if (status < 0) return "exited (status unknown: reaped elsewhere)";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped (status " + std::to_string(status) + ")";
}

// The file holds `text` (read whole: a server's log at start-up is small).
bool LogHas(const std::string& path, const std::string& text) {
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return all.find(text) != std::string::npos;
}

// The last `lines` non-empty lines of a file, each indented; "" if none.
std::string Tail(const std::string& path, int lines) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  std::streamoff size = f.tellg();
  std::streamoff from = std::max<std::streamoff>(0, size - 8192);
  f.seekg(from);
  std::string text(static_cast<size_t>(size - from), '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<std::string> out;
  size_t end = text.size();
  while (end > 0 && static_cast<int>(out.size()) < lines) {
    size_t start = text.rfind('\n', end - 1);
    size_t b = start == std::string::npos ? 0 : start + 1;
    std::string l = text.substr(b, end - b);
    while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.pop_back();
    if (!l.empty()) out.push_back(l);
    if (start == std::string::npos) break;
    end = start;
  }
  std::string s;
  for (auto it = out.rbegin(); it != out.rend(); ++it) s += "\n  " + *it;
  return s;
}

}  // namespace

std::string SubstituteCommand(const std::string& tmpl, int port, const std::string& dir,
                              const std::string& host) {
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl.compare(i, 6, "{port}") == 0) {
      out += std::to_string(port);
      i += 6;
    } else if (tmpl.compare(i, 6, "{host}") == 0) {
      out += host;
      i += 6;
    } else if (tmpl.compare(i, 5, "{dir}") == 0) {
      out += dir;
      i += 5;
    } else {
      out += tmpl[i++];
    }
  }
  return out;
}

bool RenderFile(const std::string& path, int port, const std::string& dir, const std::string& host,
                std::string* error) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    *error = "cannot read " + path + " (a file of the data template, rendered_files)";
    return false;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << SubstituteCommand(text.str(), port, dir, host);
  out.close();
  if (!out) {
    *error = "cannot write " + path + ": " + strerror(errno);
    return false;
  }
  return true;
}

bool ResolveExecutable(const std::string& name, std::string* path, std::string* error) {
  if (name.empty()) {
    *error = "the server command is empty";
    return false;
  }
  auto usable = [](const std::string& p, std::string* why) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0) {
      *why = errno == ENOENT ? "does not exist" : std::string("cannot be read: ") + strerror(errno);
      return false;
    }
    if (S_ISDIR(st.st_mode)) {
      *why = "is a directory";
      return false;
    }
    if (access(p.c_str(), X_OK) != 0) {
      *why = "is not executable";
      return false;
    }
    return true;
  };
  std::string why;
  if (name.find('/') != std::string::npos) {
    std::string p = name[0] == '/' ? name : CurrentDir() + "/" + name;
    if (!usable(p, &why)) {
      *error = "server command '" + name + "' " + why;
      return false;
    }
    *path = p;
    return true;
  }
  const char* env = getenv("PATH");
  std::string dirs = env && *env ? env : "/usr/local/bin:/usr/bin:/bin";
  std::string not_executable;
  size_t b = 0;
  for (;;) {
    size_t e = dirs.find(':', b);
    std::string d = dirs.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (d.empty()) d = ".";
    if (d[0] != '/') d = CurrentDir() + "/" + d;
    std::string p = d + "/" + name;
    if (usable(p, &why)) {
      *path = p;
      return true;
    }
    if (why == "is not executable" && not_executable.empty()) not_executable = p;
    if (e == std::string::npos) break;
    b = e + 1;
  }
  *error = "server command '" + name + "' not found in PATH";
  if (!not_executable.empty()) *error += " (" + not_executable + " is not executable)";
  return false;
}

// relative, beside the running executable's directory, when it exists there;
// "" otherwise (a build tree's binary: its build/bin has no ../lib/lockstep).
static std::string BesideExecutable(const std::string& relative) {
  if (relative.empty()) return "";
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  std::filesystem::path p = std::filesystem::path(buf).parent_path() / relative;
  if (access(p.c_str(), F_OK) != 0) return "";
  return p.lexically_normal().string();
}

std::string PreloadLibraryPath() {
  std::string installed = BesideExecutable(LOCKSTEP_INSTALLED_PRELOAD);
  return installed.empty() ? LOCKSTEP_PRELOAD_PATH : installed;
}

std::string AppsDir() {
  std::string installed = BesideExecutable(LOCKSTEP_INSTALLED_APPS);
  return installed.empty() ? LOCKSTEP_APPS_DIR : installed;
}

#ifdef __SANITIZE_ADDRESS__
// An AddressSanitizer build (cmake -DLOCKSTEP_SANITIZE=ON, scripts/sanitize):
// the shim is instrumented too, and an uninstrumented server can load it only
// with the ASan runtime first in its initial library list. So the runtime
// this daemon runs with goes first in LD_PRELOAD, and the server runs with the
// daemon's ASAN_OPTIONS (log_path, halt_on_error) but without leak checking:
// the server's own leaks are not ours.
static void AddAsanRuntime(std::vector<std::pair<std::string, std::string>>* vars) {
  Dl_info info{};
  void* init = dlsym(RTLD_DEFAULT, "__asan_init");
  if (!init || !dladdr(init, &info) || !info.dli_fname) return;
  for (auto& kv : *vars) {
    if (kv.first == "LD_PRELOAD" && kv.second.rfind(info.dli_fname, 0) != 0)
      kv.second = std::string(info.dli_fname) + ":" + kv.second;
  }
  std::string options = "detect_leaks=0";
  for (auto& kv : *vars)
    if (kv.first == "ASAN_OPTIONS") {
      kv.second += ":" + options;
      return;
    }
  vars->push_back({"ASAN_OPTIONS", options});
}
#endif

// ------------------------------------------------------------ ServerProcess

bool ServerProcess::Start(const std::vector<std::string>& argv, const std::string& dir,
                          const std::string& log_path,
                          const std::vector<std::pair<std::string, std::string>>& env,
                          const std::vector<int>& keep_fds, std::string* error) {
  if (pid_ && !reaped_) {
    *error = "a server is already running (pid " + std::to_string(pid_) + ")";
    return false;
  }
  pid_ = 0;
  reaped_ = false;
  status_ = 0;
  if (argv.empty()) {
    *error = "the server command is empty";
    return false;
  }
  std::string exe;
  if (!ResolveExecutable(argv[0], &exe, error)) return false;
  std::string preload = PreloadLibraryPath();
  if (access(preload.c_str(), R_OK) != 0) {
    *error = "the preload shim " + preload + " is missing (" + strerror(errno) +
             "): build it with `cmake --build build`, or for an installed lockstep install "
             "it beside the binary with `cmake --install build` (PREFIX/lib/lockstep)";
    return false;
  }
  std::vector<int> keep;
  for (int fd : keep_fds) {
    if (fd < 3) continue;
    if (fcntl(fd, F_GETFD) < 0) {
      *error = "fd " + std::to_string(fd) + " to pass to the server is not open";
      return false;
    }
    keep.push_back(fd);
  }
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  if (!MakeDirs(dir)) {
    *error = "cannot create the server's directory " + dir + ": " + strerror(errno);
    return false;
  }

  // The environment: ours, LD_PRELOAD with the shim appended, `env`, and
  // (Spawn appends it) LOCKSTEP_SHIM_PID = the server's own pid.
  std::vector<std::pair<std::string, std::string>> vars;
  auto set = [&vars](const std::string& k, const std::string& v) {
    for (auto& kv : vars)
      if (kv.first == k) {
        kv.second = v;
        return;
      }
    vars.push_back({k, v});
  };
  for (char** e = environ; e && *e; e++) {
    const char* eq = strchr(*e, '=');
    if (eq) set(std::string(*e, eq - *e), eq + 1);
  }
  std::string ld_preload;
  for (const auto& kv : vars)
    if (kv.first == "LD_PRELOAD") ld_preload = kv.second;
  set("LD_PRELOAD", ld_preload.empty() ? preload : ld_preload + ":" + preload);
#ifdef __SANITIZE_ADDRESS__
  AddAsanRuntime(&vars);
#endif
  for (const auto& kv : env) set(kv.first, kv.second);
  const std::string kPidVar = "LOCKSTEP_SHIM_PID";
  std::vector<std::string> env_strings;
  for (const auto& kv : vars)
    if (kv.first != kPidVar) env_strings.push_back(kv.first + "=" + kv.second);

  int log_fd =
      MoveAboveStdio(open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (log_fd < 0) {
    *error = "cannot open the server's log " + log_path + ": " + strerror(errno);
    return false;
  }
  SpawnOptions so;
  so.exe = exe;
  so.argv = argv;
  so.env = std::move(env_strings);
  so.pid_env = kPidVar;
  so.dir = dir;
  so.out_fd = log_fd;  // Spawn closes it
  so.keep_fds = keep;
  so.new_pid_namespace = own_pid_namespace_;
  so.own_process_group = true;
  so.die_with_parent = true;
  // SCHED_BATCH: a server thread the daemon (or another server thread) wakes
  // does not preempt its waker, which is about to sleep anyway; it runs on
  // the other core if one is idle, else once the waker sleeps or its slice
  // ends. Preempted, the waker was switched out and back in for nothing:
  // each agreed input (the daemon's eventfd write), each serial_inputs
  // hand-over and each contended shim lock cost two more context switches.
  // Same CPU share; CRIU restores the policy with each thread. Measured
  // (perf stat -p over 4 s of SETs, two runs each, redis under lockstep on
  // disk): 1 connection, servers 52.8/48.4 -> 35.1/34.6 us CPU per SET,
  // daemons 156.6/150.0 -> 134.3/130.6, SETs/s 2908/3063 -> 3395/3495; 16
  // connections (chrt -b on running servers), servers 23.5/23.2 ->
  // 22.5/21.9, daemons 34.8/37.1 -> 33.6/33.5. MariaDB oltp_write_only at 16
  // threads (scripts/bench mariadb): the three servers' switches per
  // transaction 114 -> 93, their CPU 2780 -> 2596 us.
  so.batch_scheduling = true;
  SpawnResult r = Spawn(so);
  // Without the privilege for a pid namespace (not root) the server runs in ours.
  own_pid_namespace_ = r.new_pid_namespace;
  if (!r.ok()) {
    const char* why = strerror(r.err);
    switch (r.failed) {
      case SpawnStage::kPrepare:
        *error = std::string("cannot prepare to start the server: ") + why;
        break;
      case SpawnStage::kFork: *error = std::string("cannot fork the server: ") + why; break;
      case SpawnStage::kChdir:
        *error = "cannot enter the server's directory " + dir + ": " + why;
        break;
      case SpawnStage::kStdio:
        *error = "cannot set up the server's stdin/stdout/stderr: " + std::string(why);
        break;
      case SpawnStage::kKeepFd:
        *error = "cannot pass an fd to the server: " + std::string(why);
        break;
      default: *error = "cannot run " + exe + ": " + why; break;
    }
    errno = r.err;
    return false;
  }
  pid_t pid = r.pid;
  pid_ = pid;
  name_ = argv[0];
  log_path_ = log_path;
  return true;
}

void ServerProcess::Adopt(pid_t pid, const std::string& name, const std::string& log_path) {
  pid_ = pid;
  reaped_ = false;
  status_ = 0;
  name_ = name;
  log_path_ = log_path;
}

bool ServerProcess::Reap(bool block) {
  if (!pid_ || reaped_) return reaped_;
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int r;
  do {
    r = waitid(P_PID, static_cast<id_t>(pid_), &si, WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
  } while (r < 0 && errno == EINTR);
  if (r < 0) {  // ECHILD: reaped by someone else (SIGCHLD ignored?)
    reaped_ = true;
    status_ = -1;
    return true;
  }
  if (si.si_pid == 0) return false;  // still running
  // While the exited server is a zombie its group id cannot be reused: take
  // down whatever it left behind in its group (a forked child), then reap it.
  kill(-pid_, SIGKILL);
  while (waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return true;
}

bool ServerProcess::Exited(std::string* how) {
  int saved = errno;
  bool done = Reap(false);
  errno = saved;
  if (done && how) *how = Describe(status_);
  return done;
}

bool ServerProcess::Crashed() const {
  if (!reaped_ || !WIFSIGNALED(status_)) return false;
  int sig = WTERMSIG(status_);
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT ||
         sig == SIGTRAP || sig == SIGSYS;
}

void ServerProcess::Stop() {
  int saved = errno;
  if (pid_ && !reaped_) {
    if (kill(-pid_, SIGTERM) != 0) kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!Reap(false) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!reaped_) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      Reap(true);
    }
  }
  errno = saved;
}

std::string ServerProcess::LogTail(int lines) const {
  return log_path_.empty() ? "" : Tail(log_path_, lines);
}

void ServerProcess::Kill() {
  int saved = errno;
  if (pid_ && !reaped_) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    Reap(true);
  }
  errno = saved;
}

bool ServerProcess::WaitReady(const std::string& host, int port, uint64_t timeout_ms,
                              std::string* error, const std::string& ready_log) {
  std::string where = host + ":" + std::to_string(port);
  if (!pid_) {
    *error = "no server was started";
    return false;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* ai = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &ai);
  if (rc != 0) {
    *error = "cannot resolve " + host + ": " + gai_strerror(rc);
    return false;
  }
  auto log_tail = [&] {
    std::string t = Tail(log_path_, 5);
    return t.empty() ? "; its log " + log_path_ + " is empty"
                     : "; last lines of " + log_path_ + ":" + t;
  };
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::milliseconds(timeout_ms);
  bool ready = false, listening = false;
  for (;;) {
    std::string how;
    if (Exited(&how)) {
      *error = "server " + name_ + " " + how + " before " +
               (listening ? "its log said \"" + ready_log + "\"" : "listening on " + where);
      if (how == "exited with status 0") *error += " (it must stay in the foreground)";
      *error += log_tail();
      break;
    }
    // One connection that succeeds is enough: each is one more the server
    // sees (and one more in its backlog while it does not accept yet).
    int fd = listening ? -1 : socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    // (A backup's shim closes it at once, unread, and logs it as a client
    // connection it refused: the look only needs the connect to succeed.)
    if (fd >= 0) {
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        listening = true;
      } else if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int err = 0;
        socklen_t len = sizeof err;
        listening = poll(&p, 1, 100) == 1 &&
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
      }
      close(fd);
    }
    // Some servers listen before they serve (gerbera answers 500 until it
    // has registered its web handlers): their log says when.
    ready = listening && (ready_log.empty() || LogHas(log_path_, ready_log));
    if (ready) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      *error = "server " + name_ + " (pid " + std::to_string(pid_) + ") " +
               (listening ? "listens on " + where + " but its log has not said \"" + ready_log +
                                "\" (the profile's ready_log)"
                          : "is not listening on " + where) +
               " after " + std::to_string(timeout_ms) + " ms" + log_tail();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  freeaddrinfo(ai);
  return ready;
}

}  // namespace lockstep
