// criu.cc — one CRIU dump or restore as a watched child process (see criu.h).
#include "checkpoint/criu.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "checkpoint/spawn.h"

namespace lockstep {
namespace {

constexpr const char* kInstalledCriu = "/usr/local/sbin/criu";
constexpr size_t kMaxLogBytes = 64 << 20;  // a -v4 log of a big dump is a few MB

std::string LastNonEmptyLine(const std::string& text) {
  size_t end = text.size();
  while (end > 0) {
    while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == ' ')) end--;
    size_t begin = text.rfind('\n', end == 0 ? 0 : end - 1);
    begin = begin == std::string::npos ? 0 : begin + 1;
    if (end > begin) return text.substr(begin, end - begin);
    end = begin;
  }
  return "";
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string DefaultCriuPath() {
  const char* env = getenv("LOCKSTEP_CRIU");
  return env && *env ? env : kInstalledCriu;
}

std::string CriuErrorReason(const std::string& log_text) {
  std::string first, last, summary;
  std::istringstream in(log_text);
  std::string line;
  while (std::getline(in, line)) {
    size_t at = line.find("Error (");
    if (at == std::string::npos) continue;
    size_t colon = line.find("): ", at);
    if (colon == std::string::npos) continue;
    std::string msg = line.substr(colon + 3);
    while (!msg.empty() && (msg.back() == '\r' || msg.back() == ' ')) msg.pop_back();
    if (msg.empty()) continue;
    // criu cannot raise its own fd limit inside a container, says so as an
    // error on every run, and carries on.
    if (msg.rfind("rlimit: Can't setup RLIMIT_NOFILE", 0) == 0) continue;
    // "Dumping FAILED." / "Restoring FAILED.": only a summary of the real reason.
    if (msg.size() >= 7 && msg.compare(msg.size() - 7, 7, "FAILED.") == 0) {
      summary = msg;
      continue;
    }
    if (first.empty()) first = msg;
    last = msg;
  }
  if (first.empty()) return summary;
  return first == last ? first : first + " (then: " + last + ")";
}

CriuJob::~CriuJob() {
  if (pid_ > 0) {
    KillCriu();
    int st;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd_ >= 0) close(pidfd_);
}

bool CriuJob::StartDump(pid_t server_pid, const std::string& images_dir, const CriuOptions& options,
                        std::string* error) {
  if (server_pid <= 0 || (kill(server_pid, 0) != 0 && errno == ESRCH)) {
    *error = "cannot dump pid " + std::to_string(server_pid) + ": no such process";
    return false;
  }
  std::vector<std::string> args = {"dump",
                                   "-t",
                                   std::to_string(server_pid),
                                   "-D",
                                   images_dir,
                                   "--tcp-established",
                                   "--network-lock",
                                   options.network_lock ? "nftables" : "skip",
                                   "--skip-in-flight",
                                   "-o",
                                   "dump.log",
                                   "-v" + std::to_string(options.log_level)};
  if (options.leave_running) args.push_back("--leave-running");
  if (options.file_locks) args.push_back("--file-locks");
  pid_file_.clear();
  return Spawn(Kind::kDump, args, images_dir, {}, options, error);
}

bool CriuJob::StartRestore(const std::string& images_dir, const std::string& pid_file,
                           const std::vector<int>& keep_fds, const CriuOptions& options,
                           std::string* error) {
  // Checked here because criu's own complaint about an empty dir is
  // "Unexpected EOF on (empty-image)".
  if (IsDir(images_dir) && access((images_dir + "/inventory.img").c_str(), F_OK) != 0) {
    *error = "no criu images in " + images_dir + " (inventory.img is missing)";
    return false;
  }
  if (pid_file.empty()) {
    *error = "criu restore needs a pid file path";
    return false;
  }
  // criu resolves a relative pid file against the images dir, we against our cwd.
  std::string pid_path = pid_file;
  if (pid_path[0] != '/') {
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) {
      *error = std::string("cannot resolve the pid file path: ") + strerror(errno);
      return false;
    }
    pid_path = std::string(cwd) + "/" + pid_path;
  }
  // criu opens it with O_EXCL, and a stale one must not pass for the new pid.
  if (unlink(pid_path.c_str()) != 0 && errno != ENOENT) {
    *error = "cannot remove the old pid file " + pid_path + ": " + strerror(errno);
    return false;
  }
  std::vector<std::string> args = {"restore", "-D", images_dir, "-d", "--restore-sibling",
                                   "--tcp-close", "--leave-stopped",
                                   // No lock: the restored connections are
                                   // closed (--tcp-close) and never send. A
                                   // nftables lock here outlived the restore
                                   // (a CRIU-* table per restore, dropping
                                   // the dumped 4-tuples): a later connection
                                   // that reused such a port never connected,
                                   // and the replay stalled behind it.
                                   "--network-lock", "skip", "--pidfile", pid_path, "-o",
                                   "restore.log", "-v" + std::to_string(options.log_level)};
  if (options.file_locks) args.push_back("--file-locks");
  pid_file_ = pid_path;
  return Spawn(Kind::kRestore, args, images_dir, keep_fds, options, error);
}

bool CriuJob::Spawn(Kind kind, const std::vector<std::string>& args, const std::string& images_dir,
                    const std::vector<int>& keep_fds, const CriuOptions& options,
                    std::string* error) {
  if (pid_ > 0) {
    *error = "a criu command is already running (pid " + std::to_string(pid_) + ")";
    return false;
  }
  std::string exe = options.criu_path.empty() ? DefaultCriuPath() : options.criu_path;
  if (access(exe.c_str(), X_OK) != 0) {
    *error = "criu not found (" + exe + "): run scripts/setup";
    return false;
  }
  if (!IsDir(images_dir)) {
    *error = "the images dir " + images_dir + " is not a directory";
    return false;
  }
  for (int fd : keep_fds) {
    if (fd < 3 || fcntl(fd, F_GETFD) < 0) {
      *error = "cannot pass fd " + std::to_string(fd) + " to criu: not an open fd >= 3";
      return false;
    }
  }
  // Named per command: restoring from a committed checkpoint must not
  // rewrite what its dump left (the store checksums those files).
  const char* name = kind == Kind::kDump ? "/dump" : "/restore";
  std::string log_path = images_dir + name + ".log";
  std::string out_path = images_dir + name + ".out";
  unlink(log_path.c_str());  // a log left by an earlier run must not explain this one

  std::vector<std::string> argv_strings = {exe};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  argv_strings.insert(argv_strings.end(), options.extra_args.begin(), options.extra_args.end());

  int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) {
    *error = "cannot create " + out_path + ": " + strerror(errno);
    return false;
  }
  SpawnOptions so;
  so.exe = exe;
  so.argv = std::move(argv_strings);
  so.out_fd = out_fd;  // Spawn closes it
  so.keep_fds = keep_fds;
  so.netns_fd = options.netns_fd;
  // A dump's criu dies with the daemon (criu.h says why) and leads its own
  // process group (its helpers are killed with it). A restore's is left to
  // finish, as before: killed midway, criu could not take down the
  // half-restored tasks it had made (not tested either way).
  so.die_with_parent = kind == Kind::kDump;
  so.own_process_group = kind == Kind::kDump;
  auto start = std::chrono::steady_clock::now();
  SpawnResult sr = lockstep::Spawn(so);  // the free function, not this member
  if (!sr.ok()) {
    const char* why = strerror(sr.err);
    switch (sr.failed) {
      case SpawnStage::kPrepare: *error = std::string("cannot prepare to run criu: ") + why; break;
      case SpawnStage::kFork: *error = std::string("cannot fork criu: ") + why; break;
      case SpawnStage::kNetns:
        *error = std::string("cannot enter the server's network namespace: ") + why;
        break;
      case SpawnStage::kStdio: *error = std::string("cannot set up criu's stdio: ") + why; break;
      case SpawnStage::kKeepFd: *error = std::string("cannot pass an fd to criu: ") + why; break;
      default: *error = "cannot run criu (" + exe + "): " + why; break;
    }
    return false;
  }
  pid_t pid = sr.pid;
  auto reap = [&] {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  };
  // pidfd_open on our own unreaped child cannot name another process: only
  // this job ever waits for this pid.
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    int saved = errno;
    kill(pid, SIGKILL);
    reap();
    *error = std::string("pidfd_open for criu failed: ") + strerror(saved);
    return false;
  }
  fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  kind_ = kind;
  pid_ = pid;
  pidfd_ = pidfd;
  start_ = start;
  timeout_ms_ = options.timeout_ms;
  deadline_ = start + std::chrono::milliseconds(options.timeout_ms > 0 ? options.timeout_ms : 0);
  killed_for_timeout_ = false;
  log_path_ = log_path;
  out_path_ = out_path;
  return true;
}

void CriuJob::KillCriu() {
  // A dump's criu leads its own group (its helpers are in it); criu is not
  // reaped yet, so the group id cannot have been reused.
  if (kind_ == Kind::kDump) kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
}

std::vector<pid_t> KillStrayCriu(const std::string& dir) {
  std::vector<pid_t> killed;
  std::string prefix = dir;
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  prefix += '/';
  DIR* proc = opendir("/proc");
  if (!proc) return killed;
  while (struct dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end || pid == getpid()) continue;
    std::string cmdline;
    if (!ReadSmallFile("/proc/" + std::string(e->d_name) + "/cmdline", &cmdline, 1 << 16) ||
        cmdline.empty())
      continue;
    std::vector<std::string> args;
    for (size_t at = 0; at < cmdline.size();) {
      size_t nul = cmdline.find('\0', at);
      if (nul == std::string::npos) nul = cmdline.size();
      args.push_back(cmdline.substr(at, nul - at));
      at = nul + 1;
    }
    const std::string& exe = args[0];
    size_t slash = exe.rfind('/');
    if ((slash == std::string::npos ? exe : exe.substr(slash + 1)) != "criu") continue;
    bool ours = false;
    for (size_t i = 1; i < args.size() && !ours; i++) ours = args[i].rfind(prefix, 0) == 0;
    if (ours && kill(static_cast<pid_t>(pid), SIGKILL) == 0)
      killed.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return killed;
}

int CriuJob::MsUntilTimeout() const {
  if (pid_ <= 0 || timeout_ms_ <= 0) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline_ - std::chrono::steady_clock::now())
                  .count();
  // Rounded up so that an epoll wait of this long ends after the deadline.
  return left < 0 ? 0 : static_cast<int>(left) + 1;
}

bool CriuJob::Poll(CriuResult* result) {
  if (pid_ <= 0) return false;
  int st = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &st, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0 && timeout_ms_ > 0 && std::chrono::steady_clock::now() >= deadline_) {
    KillCriu();
    killed_for_timeout_ = true;
    do {
      r = waitpid(pid_, &st, 0);
    } while (r < 0 && errno == EINTR);
  }
  if (r == 0) return false;
  if (r < 0) st = -1;  // ECHILD: someone reaped criu (SIGCHLD ignored?); its status is lost
  Finish(st, result);
  return true;
}

bool CriuJob::Wait(CriuResult* result, int wait_ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  for (;;) {
    if (pid_ <= 0) return false;
    if (Poll(result)) return true;
    int wait = -1;
    if (wait_ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      until - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return false;
      wait = static_cast<int>(left);
    }
    int to_timeout = MsUntilTimeout();
    if (to_timeout >= 0 && (wait < 0 || to_timeout < wait)) wait = to_timeout;
    struct pollfd pfd = {pidfd_, POLLIN, 0};
    if (poll(&pfd, 1, wait) < 0 && errno != EINTR) return Poll(result);
  }
}

void CriuJob::Finish(int st, CriuResult* result) {
  *result = CriuResult{};
  result->duration_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - start_)
                            .count();
  result->log_path = log_path_;
  result->timed_out = killed_for_timeout_;
  close(pidfd_);
  pidfd_ = -1;
  pid_ = 0;
  const char* what = kind_ == Kind::kDump ? "criu dump" : "criu restore";
  if (st == -1) {
    result->error = std::string(what) + ": its exit status was lost (is SIGCHLD ignored?)";
  } else if (WIFEXITED(st)) {
    result->exit_code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    result->term_signal = WTERMSIG(st);
  }
  if (killed_for_timeout_) {
    result->error = std::string(what) + " timed out after " + std::to_string(timeout_ms_) +
                    " ms (killed); log: " + log_path_;
    return;
  }
  if (result->term_signal) {
    result->error = "criu was killed by signal " + std::to_string(result->term_signal) + " (" +
                    strsignal(result->term_signal) + "); log: " + log_path_;
    return;
  }
  if (result->exit_code > 0) {
    std::string text, reason;
    if (ReadSmallFile(log_path_, &text, kMaxLogBytes)) reason = CriuErrorReason(text);
    if (reason.empty() && ReadSmallFile(out_path_, &text, 1 << 16)) reason = LastNonEmptyLine(text);
    if (reason.empty()) reason = "exit status " + std::to_string(result->exit_code);
    result->error = std::string(what) + " failed: " + reason;
    return;
  }
  if (result->exit_code != 0) return;  // error already set (status lost)
  if (kind_ == Kind::kRestore) {
    std::string text;
    long pid = 0;
    if (ReadSmallFile(pid_file_, &text, 64)) pid = strtol(text.c_str(), nullptr, 10);
    if (pid <= 0) {
      result->error = "criu restore succeeded but left no pid in " + pid_file_;
      return;
    }
    result->restored_pid = static_cast<pid_t>(pid);
  }
  result->ok = true;
}

}  // namespace lockstep
