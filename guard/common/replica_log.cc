// replica_log.cc — see replica_log.h.
#include "guard/common/replica_log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace lockstep {

namespace {
std::atomic<uint64_t> dropped_lines{0};  // lines stderr could not take (ReplicaLog)
}  // namespace

void ReplicaLog::operator()(const char* fmt, ...) const {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  localtime_r(&ts.tv_sec, &tm);
  char prefix[48];
  snprintf(prefix, sizeof prefix, "%02d:%02d:%02d.%06ld replica %d: ", tm.tm_hour, tm.tm_min,
           tm.tm_sec, ts.tv_nsec / 1000, id_);
  char line[1400];
  int n = 0;
  if (uint64_t lost = dropped_lines.exchange(0))
    n = snprintf(line, sizeof line,
                 "%s%lu log lines lost (the log's disk was too slow to take them)\n", prefix,
                 (unsigned long)lost);
  n += snprintf(line + n, sizeof line - n, "%s%s\n", prefix, msg);
  size_t len = static_cast<size_t>(n) < sizeof line ? static_cast<size_t>(n) : sizeof line - 1;
  // One write: whole or not at all into a pipe (len < PIPE_BUF).
  ssize_t w;
  do {
    w = write(2, line, len);
  } while (w < 0 && errno == EINTR);
  if (w < 0 && errno == EAGAIN) dropped_lines++;
}

pid_t StartLogCopier() {
  struct stat err_st, out_st;
  if (fstat(2, &err_st) != 0 || !S_ISREG(err_st.st_mode)) return 0;
  bool out_too =
      fstat(1, &out_st) == 0 && out_st.st_dev == err_st.st_dev && out_st.st_ino == err_st.st_ino;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return 0;
  fcntl(p[1], F_SETPIPE_SZ, 1 << 20);  // room for a long stall's lines (best effort)
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return 0;
  }
  if (pid == 0) {
    // The copier: the pipe in, the log file out.
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    dup2(p[0], 0);
    dup2(2, 1);
    syscall(SYS_close_range, 3U, ~0U, 0U);
    execl("/bin/cat", "cat", static_cast<char*>(nullptr));
    execlp("cat", "cat", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(p[0]);
  dup2(p[1], 2);
  if (out_too) dup2(p[1], 1);
  close(p[1]);
  // A full pipe (the copier stuck on a stalled disk) drops a line rather
  // than stopping the caller (the flag is the pipe's: stdout shares it).
  fcntl(2, F_SETFL, fcntl(2, F_GETFL) | O_NONBLOCK);
  return pid;
}

void StopLogCopier(pid_t copier) {
  if (copier <= 0) return;
  int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (nul >= 0) {
    dup2(nul, 1);
    dup2(nul, 2);
    close(nul);
  }
  for (int i = 0; i < 200; i++) {
    int st;
    if (waitpid(copier, &st, WNOHANG) != 0) return;
    usleep(10000);
  }
}

}  // namespace lockstep
