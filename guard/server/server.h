// server.h — starting and stopping the unmodified server a replica runs: its
// command line (a template with {port} and {dir}), the preload shim put into
// it, readiness (it accepts TCP connections) and a clean stop of its whole
// process group. The daemon owns one ServerProcess; `cluster up` uses the
// command helpers to refuse a bad command before anything starts.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "guard/common/command_line.h"  // SplitCommand, JoinCommand

namespace lockstep {

// Replaces every {port} and {dir} in a command template. Apply it to each
// argument after SplitCommand, so that a dir with spaces stays one argument.
std::string SubstituteCommand(const std::string& tmpl, int port, const std::string& dir,
                              const std::string& host = "127.0.0.1");

// The same for a file, in place: a configuration file that names the
// server's port or directory (a profile's `files`). false and *error when it
// cannot be read or written.
bool RenderFile(const std::string& path, int port, const std::string& dir, const std::string& host,
                std::string* error);

// Resolves argv[0] against PATH (a name with a '/' is taken as a path,
// relative ones against the current directory) to an absolute path of an
// executable file; false and e.g. "server command 'foo' not found in PATH".
bool ResolveExecutable(const std::string& name, std::string* path, std::string* error);

// Where the daemon finds the shim and `cluster up --app` the profiles: an
// installed binary (cmake --install) finds them beside it, in the prefix's
// lib/lockstep/ and share/lockstep/apps/; a build tree's binary in build/lib
// and the source tree's apps/ (both fixed at build time).
std::string PreloadLibraryPath();
std::string AppsDir();

class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Stop(); }

  // Runs argv (argv[0] resolved against PATH; no shell) in a child with:
  //   LD_PRELOAD = PreloadLibraryPath() (after an existing LD_PRELOAD), then
  //   each of `env` (replacing a variable of that name), and
  //   LOCKSTEP_SHIM_PID = the child's own pid;
  //   cwd `dir` (created 0755 if missing), its own process group, SIGKILL when
  //   the thread that called Start dies (PR_SET_PDEATHSIG), stdin /dev/null,
  //   stdout and stderr appended to log_path, default signal dispositions and
  //   an empty signal mask, and every fd >= 3 closed except keep_fds (which
  //   lose FD_CLOEXEC and keep their numbers).
  // false with a clear *error if the executable, the shim, the dir or the log
  // are missing, or exec fails ("cannot run X: <strerror>"). Call it from a
  // thread that lives as long as the server: PDEATHSIG fires when that
  // thread, not the process, exits. Safe in a multithreaded process: the
  // child only makes async-signal-safe calls before exec.
  bool Start(const std::vector<std::string>& argv, const std::string& dir,
             const std::string& log_path,
             const std::vector<std::pair<std::string, std::string>>& env,
             const std::vector<int>& keep_fds, std::string* error);

  // Before Start: run the server as pid 1 of a new pid namespace, leading
  // its own session there, which is what CRIU needs to checkpoint it and to
  // restore it later under the same pid. Needs CAP_SYS_ADMIN; without it
  // Start falls back to our namespace and own_pid_namespace() says false.
  // As a namespace's init, the server ignores signals it has no handler
  // for (Stop escalates to SIGKILL), and its death kills every process it
  // left in the namespace.
  void set_own_pid_namespace(bool on) { own_pid_namespace_ = on; }
  bool own_pid_namespace() const { return own_pid_namespace_; }

  // Takes over a server restored from a checkpoint (our child, through
  // criu's --restore-sibling), as if Start had started it.
  void Adopt(pid_t pid, const std::string& name, const std::string& log_path);

  // Polls every 5 ms until a TCP connection to host:port succeeds (it is
  // closed at once) and, if ready_log is not empty, the server's log holds
  // that text; or the server exits, or timeout_ms passes: the error then
  // says which and quotes the last lines of the log.
  bool WaitReady(const std::string& host, int port, uint64_t timeout_ms, std::string* error,
                 const std::string& ready_log = "");

  // Non-blocking: true once the server has exited, with how = "exited with
  // status 1" or "killed by signal 9" (reaped; what is left of its process
  // group is killed). False while it runs or before Start.
  bool Exited(std::string* how);
  // Once Exited: it died of a signal of its own making (SIGSEGV, SIGBUS,
  // SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS: a crash, which an input may
  // cause on every replica alike), not one sent from outside or an exit.
  bool Crashed() const;

  // SIGTERM to the process group, up to 3 s for the server to exit, then
  // SIGKILL to the group; reaps it. Does nothing when nothing runs.
  void Stop();
  // SIGKILL to the group at once, and reaps it: for a server whose state is
  // thrown away (replaced from a checkpoint), where a graceful stop only
  // waits (redis acts on SIGTERM at its next cron tick, up to 100 ms).
  void Kill();

  pid_t pid() const { return pid_; }  // 0 before Start; stays set after exit
  // The last `lines` non-empty lines of the server's log, each on its own
  // indented line; "" when it is empty or there is none.
  std::string LogTail(int lines) const;

 private:
  bool Reap(bool block);  // true if the server has exited (and is reaped now)

  pid_t pid_ = 0;
  bool own_pid_namespace_ = false;
  bool reaped_ = false;
  int status_ = 0;
  std::string name_;  // argv[0], for messages
  std::string log_path_;
};

}  // namespace lockstep
