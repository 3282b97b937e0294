// criu.cc — one CRIU dump or restore as a watched child process (see criu.h).
#include "checkpoint/criu.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
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

extern char** environ;

namespace lockstep {
namespace {

constexpr const char* kInstalledCriu = "/usr/local/sbin/criu";
constexpr size_t kMaxLogBytes = 64 << 20;  // a -v4 log of a big dump is a few MB

// What the child reports through the CLOEXEC pipe when it cannot exec.
struct ChildFailure {
  int stage;
  int err;
};
enum Stage { kNetns = 1, kStdio, kKeepFd, kExec };

// Closes every fd in [lo, hi]; async-signal-safe.
void CloseRange(int lo, long hi) {
  if (lo > hi) return;
  unsigned int top = hi >= static_cast<long>(~0U) ? ~0U : static_cast<unsigned int>(hi);
#ifdef SYS_close_range
  if (syscall(SYS_close_range, static_cast<unsigned int>(lo), top, 0) == 0) return;
#endif
  long max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > (1 << 20)) max = 1 << 20;
  for (long fd = lo; fd <= std::min<long>(top, max); fd++) close(static_cast<int>(fd));
}

// Everything the child needs, prepared before fork: the daemon has other
// threads, so after fork the child may only make async-signal-safe calls.
struct ChildPlan {
  const char* exe;
  char* const* argv;
  char* const* envp;
  int netns_fd;
  int null_fd, out_fd, report_fd;
  const int* keep;  // >= 3: clear FD_CLOEXEC, keep the number
  size_t n_keep;
  const int* skip;  // sorted: keep plus report_fd, not to be closed
  size_t n_skip;
};

[[noreturn]] void RunChild(const ChildPlan& p) {
  auto fail = [&](int stage) {
    ChildFailure f{stage, errno};
    ssize_t ignored = write(p.report_fd, &f, sizeof f);
    (void)ignored;
    _exit(127);
  };
  // criu inherits neither the daemon's blocked signals nor its handlers.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  // No PR_SET_PDEATHSIG on purpose: if the daemon dies mid-dump, criu should
  // finish and let the server go, rather than die with its parasite inside it.
  if (p.netns_fd >= 0 && setns(p.netns_fd, CLONE_NEWNET) != 0) fail(kNetns);
  if (dup2(p.null_fd, 0) < 0 || dup2(p.out_fd, 1) < 0 || dup2(p.out_fd, 2) < 0) fail(kStdio);
  for (size_t i = 0; i < p.n_keep; i++) {
    int flags = fcntl(p.keep[i], F_GETFD);
    if (flags < 0 || fcntl(p.keep[i], F_SETFD, flags & ~FD_CLOEXEC) < 0) fail(kKeepFd);
  }
  int lo = 3;
  for (size_t i = 0; i < p.n_skip; i++) {
    CloseRange(lo, p.skip[i] - 1);
    lo = p.skip[i] + 1;
  }
  CloseRange(lo, ~0U);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(p.exe, p.argv, p.envp);
  fail(kExec);
  _exit(127);
}

// fd moved to >= 3 with CLOEXEC, so that dup2 onto 0..2 in the child cannot clobber it.
int High(int fd) {
  if (fd < 0 || fd >= 3) return fd;
  int h = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int saved = errno;
  close(fd);
  errno = saved;
  return h;
}

bool ReadSmallFile(const std::string& path, std::string* out, size_t cap) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->clear();
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > cap) out->erase(0, out->size() - cap);  // the end is what matters
  }
  close(fd);
  return true;
}

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
    kill(pid_, SIGKILL);
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
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int out_fd = High(open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (out_fd < 0) {
    *error = "cannot create " + out_path + ": " + strerror(errno);
    return false;
  }
  int null_fd = High(open("/dev/null", O_RDONLY | O_CLOEXEC));
  int pipe_fds[2] = {-1, -1};
  if (null_fd < 0 || pipe2(pipe_fds, O_CLOEXEC) != 0 || (pipe_fds[0] = High(pipe_fds[0])) < 0 ||
      (pipe_fds[1] = High(pipe_fds[1])) < 0) {
    int saved = errno;
    for (int fd : {out_fd, null_fd, pipe_fds[0], pipe_fds[1]})
      if (fd >= 0) close(fd);
    *error = std::string("cannot prepare to run criu: ") + strerror(saved);
    return false;
  }
  std::vector<int> skip = keep_fds;
  skip.push_back(pipe_fds[1]);
  std::sort(skip.begin(), skip.end());
  skip.erase(std::unique(skip.begin(), skip.end()), skip.end());
  ChildPlan plan{exe.c_str(),     argv.data(), environ,     options.netns_fd,
                 null_fd,         out_fd,      pipe_fds[1], keep_fds.data(),
                 keep_fds.size(), skip.data(), skip.size()};
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) RunChild(plan);
  int fork_errno = errno;
  close(pipe_fds[1]);
  close(out_fd);
  close(null_fd);
  if (pid < 0) {
    close(pipe_fds[0]);
    *error = std::string("cannot fork criu: ") + strerror(fork_errno);
    return false;
  }
  // EOF once exec succeeded (the pipe is CLOEXEC): a short wait, bounded by exec.
  ChildFailure f{};
  ssize_t n;
  do {
    n = read(pipe_fds[0], &f, sizeof f);
  } while (n < 0 && errno == EINTR);
  close(pipe_fds[0]);
  auto reap = [&] {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  };
  if (n == static_cast<ssize_t>(sizeof f)) {
    reap();
    const char* why = strerror(f.err);
    switch (f.stage) {
      case kNetns:
        *error = std::string("cannot enter the server's network namespace: ") + why;
        break;
      case kStdio: *error = std::string("cannot set up criu's stdio: ") + why; break;
      case kKeepFd: *error = std::string("cannot pass an fd to criu: ") + why; break;
      default: *error = "cannot run criu (" + exe + "): " + why; break;
    }
    return false;
  }
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
    kill(pid_, SIGKILL);
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
