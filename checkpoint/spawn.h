// spawn.h — fork+exec of a helper program (the server, criu, nft) from the
// multithreaded daemon, shared by guard/server/server.cc and checkpoint/criu.cc.
//
// Everything the child needs is prepared before fork, and the child makes
// only async-signal-safe calls: it blocks every signal, puts every handler
// back to SIG_DFL, then (each only if asked) leads a new session or process
// group, arranges SIGKILL at its parent's death, enters a network
// namespace, changes directory, takes /dev/null as stdin and out_fd as
// stdout and stderr, keeps keep_fds under their own numbers (FD_CLOEXEC
// cleared), closes every other fd >= 3, writes its own pid into an
// environment variable, unblocks every signal and execs. A step that fails
// before exec comes back to the caller as (stage, errno) through a CLOEXEC
// pipe, and nothing runs then; Spawn returns once exec has succeeded.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace lockstep {

struct SpawnOptions {
  std::string exe;                // absolute path of the program
  std::vector<std::string> argv;  // argv[0] included
  // The environment, "NAME=value" each; nullopt: the caller's own (environ).
  std::optional<std::vector<std::string>> env;
  // If not empty, the variable of this name is set (appended) to the
  // child's own pid, as the child sees it (1 in a new pid namespace).
  std::string pid_env;
  std::string dir;  // the child's working directory; empty: the caller's
  // stdout and stderr of the child. Spawn takes it over and closes it, in
  // every case; -1 is an error (kPrepare, EBADF).
  int out_fd = -1;
  // Open fds >= 3 the child keeps under their own numbers (callers check
  // them: an fd that is not open fails in the child, kKeepFd).
  std::vector<int> keep_fds;
  int netns_fd = -1;  // if >= 0: setns(netns_fd, CLONE_NEWNET) in the child
  // The child is pid 1 of a new pid namespace and leads its own session
  // there (clone with CLONE_NEWPID). Without the privilege for it (EPERM,
  // EINVAL) the child is forked into our namespace instead, and
  // SpawnResult::new_pid_namespace says false.
  bool new_pid_namespace = false;
  // In our pid namespace: the child leads its own process group (set by
  // child and parent both, whichever runs first).
  bool own_process_group = false;
  // PR_SET_PDEATHSIG SIGKILL: the child dies when the *thread* that called
  // Spawn exits. Outside a new pid namespace, a child whose parent died
  // before the prctl took effect exits at once (status 127).
  bool die_with_parent = false;
  // SCHED_BATCH for the program and the threads it makes: a thread it wakes
  // does not preempt the one that woke it (ServerProcess::Start says why).
  // Refused, the program runs with the default policy.
  bool batch_scheduling = false;
};

// Where a spawn failed; the caller words the error for its program.
enum class SpawnStage {
  kNone = 0,
  kPrepare,  // opening /dev/null, the report pipe, moving fds above 2 (parent)
  kFork,     // fork or clone (parent)
  kNetns,    // setns (child)
  kChdir,    // chdir (child)
  kStdio,    // dup2 onto 0, 1, 2 (child)
  kKeepFd,   // clearing FD_CLOEXEC on a kept fd (child)
  kExec,     // execve (child)
};

struct SpawnResult {
  pid_t pid = -1;  // > 0: the child runs the program (exec succeeded)
  SpawnStage failed = SpawnStage::kNone;
  int err = 0;  // errno of the failed step
  // The child is (or, had it not failed, would have been) pid 1 of a new
  // pid namespace: false once a clone was refused for want of privilege.
  bool new_pid_namespace = false;
  bool ok() const { return pid > 0; }
};

// Runs the program; a child that failed before exec has been reaped.
SpawnResult Spawn(const SpawnOptions& options);

// fd moved to >= 3 with FD_CLOEXEC (fd itself closed), so that dup2 onto
// 0..2 in a child cannot clobber it; fd unchanged if already >= 3 or < 0.
// -1 with errno if the dup fails.
int MoveAboveStdio(int fd);

// True once process pid has ended: gone, or a zombie its parent (or a
// tracer) has not reaped yet. Reads /proc only: it never reaps, so it may
// ask about another's child or a traced process.
bool ProcessEnded(pid_t pid);
// The state letter of process pid in /proc/PID/stat ('R' running, 'S'
// sleeping, 'T' stopped, 't' held by a tracer, 'Z' zombie...), or 0 when
// it cannot be read (gone).
char ProcessState(pid_t pid);
// Reads a small file (a /proc entry) whole into *out, keeping its last cap
// bytes; false if it cannot be opened. A read error ends it early without
// failing: /proc/PID files of a process that exits meanwhile fail with
// ESRCH (where a std::ifstream throws from its underflow).
bool ReadSmallFile(const std::string& path, std::string* out, size_t cap);

}  // namespace lockstep
