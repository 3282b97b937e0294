// metrics_server.cc — the GET-only HTTP/1.x listener of metrics_server.h.
#include "guard/net/metrics_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace lockstep {

namespace {

constexpr int kListenBacklog = 16;

int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Reply(const char* status, const std::string& content_type, const std::string& body) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
         body;
}

// Writes all of data before deadline_ms (MonoMs); false when the scraper
// stalls or goes.
bool WriteAll(int fd, const std::string& data, int64_t deadline_ms) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    int64_t left = deadline_ms - MonoMs();
    if (left <= 0) return false;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) return false;
  }
  return true;
}

}  // namespace

bool MetricsServer::Start(const std::string& host, int port, std::string* error) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    *error = "metrics: host '" + host + "' is not an IPv4 address";
    return false;
  }
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 ||
      listen(listen_fd_, kListenBacklog) < 0) {
    *error = "cannot listen for metrics on " + host + ":" + std::to_string(port) + ": " +
             strerror(errno) + " (choose another metrics_port in cluster.toml, or 0 for none)";
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    return false;
  }
  stop_efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  thread_ = std::thread([this] { Run(); });
  return true;
}

void MetricsServer::Stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t n = write(stop_efd_, &one, sizeof one);
    (void)n;
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_efd_ >= 0) close(stop_efd_);
  listen_fd_ = stop_efd_ = -1;
}

void MetricsServer::Run() {
  pthread_setname_np(pthread_self(), "ls-metrics");
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_efd_, POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) {
      log_(std::string("metrics listener stopped: poll: ") + strerror(errno));
      return;
    }
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) usleep(100000);  // the loop needs fds more
      continue;
    }
    Serve(fd);
    close(fd);
  }
}

// One request: the request line and headers (up to the blank line), within
// kMaxRequestBytes and kIoTimeoutMs; then one reply, and close.
void MetricsServer::Serve(int fd) {
  std::string req;
  char buf[2048];
  int64_t deadline = MonoMs() + kIoTimeoutMs;
  const char* refusal = nullptr;
  for (;;) {
    if (req.find("\r\n\r\n") != std::string::npos || req.find("\n\n") != std::string::npos) break;
    if (req.size() > kMaxRequestBytes) {
      refusal = "431 Request Header Fields Too Large";
      break;
    }
    int64_t left = deadline - MonoMs();
    if (left <= 0) {
      refused_++;  // too slow: dropped without a word
      return;
    }
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_efd_, POLLIN, 0}};
    if (poll(p, 2, static_cast<int>(left)) < 0 && errno != EINTR) return;
    if (p[1].revents) return;
    if (!p[0].revents) continue;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      refused_++;
      return;
    }
    if (n > 0) req.append(buf, static_cast<size_t>(n));
  }
  std::string reply;
  if (refusal) {
    reply = Reply(refusal, "text/plain", "request too large\n");
  } else {
    // METHOD SP TARGET SP HTTP/x.y
    std::string line = req.substr(0, req.find('\n'));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t sp1 = line.find(' '), sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
    std::string method = line.substr(0, sp1);
    std::string target = sp2 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string version = sp2 == std::string::npos ? "" : line.substr(sp2 + 1);
    // A query (?name[]=...) is ignored: every metric is always sent.
    std::string path = target.substr(0, target.find('?'));
    if (version.rfind("HTTP/1.", 0) != 0) {
      reply = Reply("400 Bad Request", "text/plain", "not an HTTP/1.x request\n");
    } else if (method != "GET" && method != "HEAD") {
      reply = Reply("405 Method Not Allowed", "text/plain", "only GET /metrics is served\n");
    } else if (path != "/metrics") {
      reply = Reply("404 Not Found", "text/plain", "only GET /metrics is served\n");
    } else {
      reply = Reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
      if (method == "HEAD") reply.resize(reply.find("\r\n\r\n") + 4);
      refusal = nullptr;
    }
    if (reply.compare(9, 3, "200") != 0) refusal = "refused";
  }
  bool sent = WriteAll(fd, reply, MonoMs() + kIoTimeoutMs);
  if (refusal || !sent)
    refused_++;
  else
    served_++;
  // Closing with unread request bytes would reset the connection and may
  // throw the reply away before the client read it: say we are done first.
  shutdown(fd, SHUT_WR);
}

}  // namespace lockstep
