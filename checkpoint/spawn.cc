// spawn.cc — fork+exec of a helper program from a multithreaded daemon (see spawn.h).
#include "checkpoint/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

extern char** environ;

namespace lockstep {
namespace {

// The priority this process started with, read before main: the daemon's
// threads raise theirs (guard/common/event_loop.cc, nice -10) so that a busy
// host cannot starve their heartbeats, and a child inherits its spawning
// thread's. A helper (criu dumping 30 MB, a state probe, a server started
// afresh) at -10 took the CPU from the daemons it was meant to yield to: on
// CI a leader went unscheduled for 79 ms while two backups' criu dumps ran,
// and its backups elected another. So children run at this one.
const int start_nice = [] {
  errno = 0;
  int n = getpriority(PRIO_PROCESS, 0);
  return errno ? 0 : n;
}();

// What the child reports through the CLOEXEC pipe when it cannot exec.
struct ChildFailure {
  int stage;
  int err;
};

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

// Everything the child needs, prepared before fork: after fork it may only
// make async-signal-safe calls (the daemon has other threads), so no
// allocation from here on.
struct ChildPlan {
  const char* exe;
  char* const* argv;
  char* const* envp;
  char* pid_digits;  // inside envp's pid_env entry, room for 20 digits; or null
  const char* dir;   // or null
  int out_fd, null_fd, report_fd;
  int netns_fd;
  const int* keep;  // >= 3: clear FD_CLOEXEC, keep the number
  size_t n_keep;
  const int* skip;  // sorted, >= 3: keep plus report_fd, not to be closed
  size_t n_skip;
  pid_t parent;
  bool new_pid_namespace;  // the child is pid 1 of a new pid namespace
  bool own_process_group;
  bool die_with_parent;
  bool batch_scheduling;
};

[[noreturn]] void RunChild(const ChildPlan& p) {
  auto fail = [&](SpawnStage stage) {
    ChildFailure f{static_cast<int>(stage), errno};
    ssize_t ignored = write(p.report_fd, &f, sizeof f);
    (void)ignored;
    _exit(127);
  };
  // Lowering a priority needs no privilege; failing leaves the daemon's.
  if (getpriority(PRIO_PROCESS, 0) != start_nice) setpriority(PRIO_PROCESS, 0, start_nice);
  if (p.batch_scheduling) {
    struct sched_param none {};
    sched_setscheduler(0, SCHED_BATCH, &none);
  }
  // The program inherits neither the daemon's blocked signals nor its handlers.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  // A session leader (and so a group leader): CRIU dumps a pid namespace
  // only when its init leads its own session there.
  if (p.new_pid_namespace)
    setsid();
  else if (p.own_process_group)
    setpgid(0, 0);
  if (p.die_with_parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The parent died before prctl took effect. (In a new pid namespace the
    // parent is outside it and getppid() says 0: that race is not caught.)
    if (!p.new_pid_namespace && getppid() != p.parent) _exit(127);
  }
  if (p.netns_fd >= 0 && setns(p.netns_fd, CLONE_NEWNET) != 0) fail(SpawnStage::kNetns);
  if (p.dir && chdir(p.dir) != 0) fail(SpawnStage::kChdir);
  if (dup2(p.null_fd, 0) < 0 || dup2(p.out_fd, 1) < 0 || dup2(p.out_fd, 2) < 0)
    fail(SpawnStage::kStdio);
  for (size_t i = 0; i < p.n_keep; i++) {
    int flags = fcntl(p.keep[i], F_GETFD);
    if (flags < 0 || fcntl(p.keep[i], F_SETFD, flags & ~FD_CLOEXEC) < 0) fail(SpawnStage::kKeepFd);
  }
  // Close every fd >= 3 but the kept ones and the report pipe (CLOEXEC: exec closes it).
  int lo = 3;
  for (size_t i = 0; i < p.n_skip; i++) {
    CloseRange(lo, p.skip[i] - 1);
    lo = p.skip[i] + 1;
  }
  CloseRange(lo, ~0U);
  if (p.pid_digits) {  // <pid_env>=<our pid>
    char digits[24];
    int n = 0;
    for (unsigned long v = static_cast<unsigned long>(getpid()); n == 0 || v; v /= 10)
      digits[n++] = static_cast<char>('0' + v % 10);
    for (int i = 0; i < n; i++) p.pid_digits[i] = digits[n - 1 - i];
    p.pid_digits[n] = '\0';
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(p.exe, p.argv, p.envp);
  fail(SpawnStage::kExec);
  _exit(127);
}

}  // namespace

int MoveAboveStdio(int fd) {
  if (fd < 0 || fd >= 3) return fd;
  int h = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int saved = errno;
  close(fd);
  errno = saved;
  return h;
}

SpawnResult Spawn(const SpawnOptions& o) {
  SpawnResult result;
  result.new_pid_namespace = o.new_pid_namespace;  // until a clone says otherwise
  auto fail = [&](SpawnStage stage, int err) {
    result.pid = -1;
    result.failed = stage;
    result.err = err;
    errno = err;
    return result;
  };
  if (o.out_fd < 0) return fail(SpawnStage::kPrepare, EBADF);
  int out_fd = MoveAboveStdio(o.out_fd);
  if (out_fd < 0) return fail(SpawnStage::kPrepare, errno);

  std::vector<std::string> args = o.argv;
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);
  // The environment, with a slot for the pid the child writes in.
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  char* const* env = environ;
  char* pid_digits = nullptr;
  if (o.env || !o.pid_env.empty()) {
    if (o.env) {
      env_strings = *o.env;
    } else {
      for (char** e = environ; e && *e; e++) env_strings.push_back(*e);
    }
    if (!o.pid_env.empty()) env_strings.push_back(o.pid_env + "=" + std::string(24, '\0'));
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    env = envp.data();
    if (!o.pid_env.empty()) pid_digits = env_strings.back().data() + o.pid_env.size() + 1;
  }

  int null_fd = MoveAboveStdio(open("/dev/null", O_RDONLY | O_CLOEXEC));
  int pipe_fds[2] = {-1, -1};
  if (null_fd < 0 || pipe2(pipe_fds, O_CLOEXEC) != 0 ||
      (pipe_fds[0] = MoveAboveStdio(pipe_fds[0])) < 0 ||
      (pipe_fds[1] = MoveAboveStdio(pipe_fds[1])) < 0) {
    int saved = errno;
    for (int fd : {out_fd, null_fd, pipe_fds[0], pipe_fds[1]})
      if (fd >= 0) close(fd);
    return fail(SpawnStage::kPrepare, saved);
  }
  std::vector<int> keep = o.keep_fds;
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  std::vector<int> skip = keep;
  skip.push_back(pipe_fds[1]);
  std::sort(skip.begin(), skip.end());
  skip.erase(std::unique(skip.begin(), skip.end()), skip.end());
  ChildPlan plan{o.exe.c_str(),
                 argp.data(),
                 env,
                 pid_digits,
                 o.dir.empty() ? nullptr : o.dir.c_str(),
                 out_fd,
                 null_fd,
                 pipe_fds[1],
                 o.netns_fd,
                 keep.data(),
                 keep.size(),
                 skip.data(),
                 skip.size(),
                 getpid(),
                 o.new_pid_namespace,
                 o.own_process_group,
                 o.die_with_parent,
                 o.batch_scheduling};
  // clone() with CLONE_NEWPID and no new stack behaves as fork(); without
  // the privilege for it (not root) the child runs in our namespace.
  pid_t pid = -1;
  bool new_ns = o.new_pid_namespace;
  if (new_ns) {
    pid = static_cast<pid_t>(syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0));
    if (pid < 0 && (errno == EPERM || errno == EINVAL)) {
      new_ns = false;
      plan.new_pid_namespace = false;
    }
  }
  if (!new_ns) pid = fork();
  if (pid == 0) RunChild(plan);
  int fork_errno = errno;
  result.new_pid_namespace = new_ns;
  close(pipe_fds[1]);
  close(out_fd);
  close(null_fd);
  if (pid < 0) {
    close(pipe_fds[0]);
    return fail(SpawnStage::kFork, fork_errno);
  }
  // Also done by the child; whichever comes first (EACCES after exec: fine).
  // Not for a namespace init: it calls setsid(), which a group leader may not.
  if (!new_ns && o.own_process_group) setpgid(pid, pid);
  // EOF once exec succeeded (the pipe is CLOEXEC): a short wait, bounded by exec.
  ChildFailure f{};
  ssize_t n;
  do {
    n = read(pipe_fds[0], &f, sizeof f);
  } while (n < 0 && errno == EINTR);
  close(pipe_fds[0]);
  if (n == static_cast<ssize_t>(sizeof f)) {  // the child could not exec: nothing runs
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return fail(static_cast<SpawnStage>(f.stage), f.err);
  }
  result.pid = pid;
  return result;
}

char ProcessState(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = fopen(path, "re");
  if (!f) return 0;
  char buf[512];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  // "pid (comm) state ...": comm may hold spaces and parentheses.
  const char* close = strrchr(buf, ')');
  return close && close[1] == ' ' && close[2] ? close[2] : 0;
}

bool ProcessEnded(pid_t pid) {
  // Every thread exiting or a zombie. Killed threads that a tracer (criu)
  // has not reaped stay zombies one by one, and the last thread of a pid
  // namespace's init waits in its exit until they are reaped; a leader
  // thread that exited alone is a zombie while its process runs on.
  constexpr unsigned long kExiting = 0x4;  // PF_EXITING in /proc/PID/stat's flags
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", static_cast<int>(pid));
  DIR* tasks = opendir(path);
  if (!tasks) return errno == ENOENT || errno == ESRCH;
  bool ended = true;
  while (struct dirent* t = readdir(tasks)) {
    if (t->d_name[0] == '.') continue;
    char stat_path[96];
    snprintf(stat_path, sizeof stat_path, "/proc/%d/task/%s/stat", static_cast<int>(pid),
             t->d_name);
    FILE* f = fopen(stat_path, "re");
    if (!f) continue;  // that thread is gone
    char buf[512];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    // "tid (comm) state ppid pgrp session tty tpgid flags ...": comm may
    // hold spaces and parentheses.
    const char* close = strrchr(buf, ')');
    char state = '?';
    unsigned long flags = 0;
    if (!close || sscanf(close + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2 ||
        (state != 'Z' && state != 'X' && !(flags & kExiting))) {
      ended = false;
      break;
    }
  }
  closedir(tasks);
  return ended;
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

}  // namespace lockstep
