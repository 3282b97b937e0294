// inspect.cc — `lockstep inspect` (inspect.h): opens an inspection per
// local connection (or one for stdin/stdout) and relays its bytes as
// kInspectData frames.
#include "guard/cli/inspect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "guard/net/client.h"
#include "guard/net/wire.h"

extern char** environ;

namespace lockstep {

namespace {

// Opens an inspection of replica o.id's server; null (said on stderr) when
// it cannot be had.
std::unique_ptr<Stream> Open(const ClusterConfig& c, const InspectOptions& o,
                             std::string* said = nullptr) {
  std::string err, program;
  for (const auto& a : o.program) program += (program.empty() ? "" : " ") + a;
  auto client = Client::Connect(c, o.id, 2000, &err, Principal::kAdmin);
  InspectReply reply;
  if (client && client->Inspect(program, &reply, &err) && !reply.ok)
    err = "replica " + std::to_string(o.id) + ": " + reply.text;
  if (!client || !reply.ok) {
    fprintf(stderr, "lockstep inspect: %s\n", err.c_str());
    return nullptr;
  }
  if (said) *said = reply.text;
  return client->TakeStream();
}

bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(n);
  }
  return true;
}

// Relays between the inspection and in_fd/out_fd (one socket, or stdin and
// stdout) until the server's side ends or either breaks. 0: the server's
// side ended; 1: broken (said on stderr).
int Relay(std::unique_ptr<Stream> stream, int in_fd, int out_fd) {
  int flags = fcntl(stream->fd(), F_GETFL);
  fcntl(stream->fd(), F_SETFL, flags | O_NONBLOCK);
  FrameConn conn(std::move(stream), ConnRole::kOutbound);
  conn.authenticated = true;
  bool in_eof = false, out_broken = false;
  std::string err;
  char buf[65536];
  for (;;) {
    pollfd p[2] = {{conn.fd(), POLLIN, 0}, {in_fd, 0, 0}};
    if (conn.WantsWrite()) p[0].events |= POLLOUT;
    if (!in_eof && conn.queued_bytes() < (4u << 20)) p[1].events = POLLIN;
    // TLS may hold bytes it took from the socket already (the server's
    // first data can come in the record of kInspectResult): no poll of the
    // socket would say so.
    bool buffered = conn.stream() && conn.stream()->has_buffered();
    if (poll(p, 2, buffered ? 0 : -1) < 0) {
      if (errno == EINTR) continue;
      err = std::string("poll: ") + strerror(errno);
      break;
    }
    // (poll says POLLHUP of a pipe at its end even when not asked.)
    if (!in_eof && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(in_fd, buf, sizeof buf);
      if (n > 0) {
        conn.Queue(FrameKind::kInspectData, std::string_view(buf, n));
      } else if (n == 0 || errno != EINTR) {
        in_eof = true;
        conn.Queue(FrameKind::kInspectData, "");  // the end of what we send
      }
    }
    bool ended = false;
    if (buffered || (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      bool read_ok = conn.ReadFrames(
          [&](FrameKind kind, std::string_view body) {
            if (kind != FrameKind::kInspectData || body.empty()) {
              ended = true;  // the server closed (or the daemon ended the relay)
              return;
            }
            if (!out_broken && !WriteAll(out_fd, body)) out_broken = true;
          },
          &err);
      if (ended) return 0;
      if (!read_ok) {
        err = "replica's daemon closed the inspection (" + err + ")";
        break;
      }
    }
    if (!conn.Flush(&err)) break;
    if (out_broken && in_eof) return 0;  // nobody reads nor writes any more
  }
  fprintf(stderr, "lockstep inspect: %s\n", err.c_str());
  return 1;
}

// The relays of local connections, each on a thread of its own. The
// command returns only once they have ended (or after a grace period): a
// relay still running would read the caller's config after it is gone, and
// its buffers would be left behind (LeakSanitizer counts them). Its thread
// is joined, not only waited for: OpenSSL frees a thread's error state
// when the thread exits, after the relay has said it ended (CI's sanitized
// run caught a command that returned in between).
struct Relays {
  std::mutex mu;
  std::condition_variable ended;
  int running = 0;
  std::vector<std::thread> threads;

  // One local connection: its own inspection, relayed until either side ends.
  void Start(const ClusterConfig& c, const InspectOptions& o, int fd) {
    std::lock_guard lock(mu);
    ++running;
    threads.emplace_back([this, &c, &o, fd] {
      if (auto s = Open(c, o)) Relay(std::move(s), fd, fd);
      close(fd);
      std::lock_guard lock(mu);
      --running;
      ended.notify_all();
    });
  }

  // After the program exited its sockets are closed, so each relay ends once
  // the daemon has said the server's side is done too: a short wait.
  void WaitAll() {
    std::unique_lock lock(mu);
    bool all = ended.wait_for(lock, std::chrono::seconds(5), [&] { return running == 0; });
    if (!all)
      fprintf(stderr, "lockstep inspect: %d relay(s) still open after 5 s; leaving them\n",
              running);
    std::vector<std::thread> done = std::move(threads);
    threads.clear();
    lock.unlock();
    for (std::thread& t : done) all ? t.join() : t.detach();
  }
};

std::string Substitute(std::string arg, const std::string& what, const std::string& with) {
  for (size_t at = arg.find(what); at != std::string::npos; at = arg.find(what, at + with.size()))
    arg.replace(at, what.size(), with);
  return arg;
}

}  // namespace

int RunInspect(const ClusterConfig& c, const InspectOptions& o) {
  if (o.id < 0 || o.id >= static_cast<int>(c.replicas.size())) {
    fprintf(stderr, "lockstep inspect: --id %d: the cluster has replicas 0..%zu\n", o.id,
            c.replicas.size() - 1);
    return 1;
  }
  if (o.listen_port < 0 && o.program.empty()) {
    std::string said;
    auto s = Open(c, o, &said);
    if (!s) return 1;
    // Said before any byte passes: a caller (eval/inspector.py) knows from
    // this line that the inspection is open.
    fprintf(stderr, "lockstep inspect: replica %d's server: %s\n", o.id, said.c_str());
    return Relay(std::move(s), STDIN_FILENO, STDOUT_FILENO);
  }
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(o.listen_port > 0 ? o.listen_port : 0));
  socklen_t len = sizeof a;
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(lfd, 64) != 0 || getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    fprintf(stderr, "lockstep inspect: cannot listen on 127.0.0.1: %s\n", strerror(errno));
    return 1;
  }
  std::string port = std::to_string(ntohs(a.sin_port));
  pid_t child = -1;
  int pidfd = -1;
  if (!o.program.empty()) {
    std::vector<std::string> args;
    for (const auto& arg : o.program)
      args.push_back(Substitute(Substitute(arg, "{port}", port), "{host}", "127.0.0.1"));
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    int rc = posix_spawnp(&child, argv[0], nullptr, nullptr, argv.data(), environ);
    if (rc != 0) {
      fprintf(stderr, "lockstep inspect: cannot run %s: %s\n", argv[0], strerror(rc));
      return 127;
    }
    pidfd = static_cast<int>(syscall(SYS_pidfd_open, child, 0));
  } else {
    printf("listening on 127.0.0.1:%s\n", port.c_str());
    fflush(stdout);
  }
  // Static: a relay left running past the grace period must not outlive it.
  static Relays relays;
  for (;;) {
    pollfd p[2] = {{lfd, POLLIN, 0}, {pidfd, POLLIN, 0}};
    // Without a pidfd (an old kernel) the child is looked at twice a second.
    int n = poll(p, pidfd >= 0 ? 2 : 1, child > 0 && pidfd < 0 ? 500 : -1);
    if (n < 0 && errno != EINTR) break;
    if (child > 0) {
      int status = 0;
      if (waitpid(child, &status, WNOHANG) == child) {
        relays.WaitAll();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    if (n > 0 && (p[0].revents & POLLIN)) {
      int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) relays.Start(c, o, fd);
    }
  }
  fprintf(stderr, "lockstep inspect: %s\n", strerror(errno));
  return 1;
}

}  // namespace lockstep
