// criu.h — runs one CRIU command (a dump of the server, or a restore of it)
// as a child process without blocking the caller, who watches fd() from its
// event loop and collects the outcome with Poll(), or blocks in Wait().
//
// The flags are the ones that work on this machine (DESIGN.md, "Measured
// here"): a dump freezes the server (pid 1 of its own pid namespace), writes
// its images and, with leave_running, lets it run on; a restore recreates it
// as a child of the calling process (--restore-sibling), stopped, so the
// caller decides when it runs (SIGCONT). criu's log goes to dump.log or
// restore.log in the images dir, its stdout and stderr to dump.out or
// restore.out there (one name per command: a restore from a committed
// checkpoint must not rewrite the files its dump left).
//
// Only criu's own pid is ever waited for: the caller is also the parent of
// the server (and of a restored server), which it reaps itself.
//
// A dump's criu dies with the thread that started it (PR_SET_PDEATHSIG): the
// daemon's server dies with the daemon anyway, and a criu whose target is
// killed while it waits for it to run injected code waits for ever (seen
// with criu 4.2.1: blocked in wait4 on the server's main thread, which
// itself waits in the pid namespace's teardown for threads only criu can
// reap). Start dumps from a thread that outlives them. A dump's criu also
// leads its own process group, so that when this job kills it (timeout,
// destructor: the daemon's shutdown) the helpers it forks and stops to
// probe the kernel die too. One killed by the daemon's death may still
// leave such a helper stopped: KillStrayCriu, when the replica starts
// again, ends it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

// /usr/local/sbin/criu (where scripts/setup installs it), unless $LOCKSTEP_CRIU names another.
std::string DefaultCriuPath();

struct CriuOptions {
  std::string criu_path;  // empty: DefaultCriuPath()
  // criu is sent SIGKILL once it has run this long; the result then says so.
  // 0: no limit. A dump killed midway may leave the frozen server broken (the
  // parasite is still in it), so a limit is a last resort, not a scheduler.
  int timeout_ms = 0;
  int log_level = 4;  // criu -v<N>
  // Dump only: keep the server running after the dump. Without it criu kills
  // the server once its images are written (what a migration wants: a TCP
  // connection survives only if the dumped process does not send FIN).
  bool leave_running = true;
  // Dump and restore: --file-locks, the process's file locks go into the
  // images and are taken again (without it criu refuses a process that
  // holds one).
  bool file_locks = false;
  // Dump only: lock the network (nftables) while the server's TCP
  // connections are dumped, so that no packet moves their state meanwhile.
  // It costs about 2 ms per connection here (two nft elements each: 64
  // connections took a 100K-key redis dump from ~115 to ~300 ms). The daemon
  // does without: it dumps a backup only when nothing is in flight on its
  // replay connections (the server frozen, the daemon not writing), and a
  // restore closes them anyway (--tcp-close).
  bool network_lock = true;
  // If >= 0, criu runs in this network namespace (setns before exec): it must
  // dump and restore sockets from inside the server's namespace.
  int netns_fd = -1;
  // Appended to criu's command line as is (e.g. "--inherit-fd", "fd[7]:pipe:[1234]").
  std::vector<std::string> extra_args;
};

struct CriuResult {
  bool ok = false;
  int exit_code = -1;   // criu's exit status, -1 if it did not exit normally
  int term_signal = 0;  // the signal that killed criu, 0 if none
  bool timed_out = false;
  int64_t duration_us = 0;  // from Start until Poll/Wait saw criu gone
  // One line: "criu dump failed: " + CriuErrorReason(its log) (or the last
  // line criu wrote to stderr), "criu was killed by signal N (...)", "criu
  // dump timed out after N ms (killed)", ... Empty when ok.
  std::string error;
  pid_t restored_pid = 0;  // restore only: the new pid of the server, as the caller sees it
  std::string log_path;    // criu's own log (dump.log / restore.log in the images dir)
};

class CriuJob {
 public:
  CriuJob() = default;
  CriuJob(const CriuJob&) = delete;
  CriuJob& operator=(const CriuJob&) = delete;
  // A criu still running is killed (SIGKILL) and reaped: blocks briefly.
  ~CriuJob();

  // `criu dump -t server_pid -D images_dir --leave-running --tcp-established
  // --network-lock nftables --skip-in-flight -o dump.log`. images_dir must
  // exist. false and *error (nothing runs) if criu is missing ("criu not
  // found: run scripts/setup"), server_pid does not exist, the dir cannot be
  // used, or criu cannot be started.
  bool StartDump(pid_t server_pid, const std::string& images_dir, const CriuOptions& options,
                 std::string* error);

  // `criu restore -D images_dir -d --restore-sibling --tcp-close
  // --leave-stopped --network-lock nftables --pidfile pid_file -o
  // restore.log`. pid_file is removed first (criu opens it with O_EXCL).
  // keep_fds stay open in criu under their own numbers (for --inherit-fd in
  // options.extra_args); every other fd >= 3 is closed in criu. The restored
  // server is the caller's child and is stopped: send it SIGCONT. (criu
  // queues its SIGSTOP and detaches, so /proc may show it running for a
  // moment after criu has exited, until the pending stop takes effect.)
  // false and *error (nothing runs) if images_dir holds no images or criu
  // is missing.
  bool StartRestore(const std::string& images_dir, const std::string& pid_file,
                    const std::vector<int>& keep_fds, const CriuOptions& options,
                    std::string* error);

  // A pidfd, readable once criu has exited (add it to epoll with EPOLLIN);
  // -1 when nothing runs. It stays valid until the result is collected.
  int fd() const { return pidfd_; }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // Milliseconds until the timeout fires (for an epoll timeout: call Poll
  // then), -1 without a timeout or when nothing runs.
  int MsUntilTimeout() const;

  // Non-blocking: true once criu is gone, with *result filled in (once; the
  // job is then idle and may start another command). Enforces the timeout.
  bool Poll(CriuResult* result);
  // Blocks up to wait_ms (-1: until criu is gone); true with *result once it
  // is gone, false if it still runs after wait_ms.
  bool Wait(CriuResult* result, int wait_ms = -1);

 private:
  enum class Kind { kDump, kRestore };
  bool Spawn(Kind kind, const std::vector<std::string>& args, const std::string& images_dir,
             const std::vector<int>& keep_fds, const CriuOptions& options, std::string* error);
  void Finish(int wait_status, CriuResult* result);
  void KillCriu();  // SIGKILL to criu (and, for a dump, to the helpers it forked)

  Kind kind_ = Kind::kDump;
  pid_t pid_ = 0;
  int pidfd_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point deadline_;  // start_ if no timeout
  int timeout_ms_ = 0;
  bool killed_for_timeout_ = false;
  std::string log_path_;
  std::string out_path_;
  std::string pid_file_;
};

// SIGKILLs every criu process (criu itself or a helper it forked) whose
// command line names a path under dir, e.g. a replica's checkpoint store:
// what a daemon that died mid-dump may have left. Returns their pids.
std::vector<pid_t> KillStrayCriu(const std::string& dir);

// The reason criu gives for a failure in its log, from its "Error (...)"
// lines without their time stamps and source locations. criu logs a cascade
// (the cause, then each caller giving up: "inet: Can't bind inet socket (id
// 11): Address already in use", then "Unable to open fd=3 id=0xb"), so the
// reason is the first line, followed by "(then: <the last line>)" when they
// differ. Summaries ("Dumping FAILED.") and a known harmless complaint
// (rlimit) are skipped; a summary is returned only if there is nothing
// else. Empty if there is no error line.
std::string CriuErrorReason(const std::string& log_text);

}  // namespace lockstep
