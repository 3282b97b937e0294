// metrics_server.h — the daemon's Prometheus endpoint: `GET /metrics` on
// cluster.toml's metrics_port, answered on a thread of its own.
//
// Why not an HTTP library (cpp-httplib): a scrape endpoint needs a sliver
// of HTTP/1.x — read one request line, answer `GET /metrics` with 200 and
// the exposition, anything else with 404 (405 for another method, 400 for
// what is not a request), and close. That is ~150 lines here, with every
// bound stated, and no new package for scripts/setup or the build. What it
// does not do: keep-alive (Prometheus reconnects; one scrape every few
// seconds), chunked bodies, TLS.
//
// Bounds, so that a slow or malicious scraper costs only this thread:
//   - one connection at a time; the rest wait in the listen backlog (16);
//   - a request (line and headers) of at most kMaxRequestBytes: a longer
//     one is answered 431 and closed;
//   - kIoTimeoutMs for the whole request to arrive and again for the reply
//     to be written: a scraper that stalls is dropped;
//   - the consensus loop never waits on it: the body is rendered from the
//     registry's atomics (guard/common/metrics.h) on this thread.
// The listener binds the replica's own host address only. Unauthenticated:
// anyone who reaches that address and port reads the numbers (no secrets,
// keys, client data or addresses are in them).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace lockstep {

class MetricsServer {
 public:
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr int kIoTimeoutMs = 2000;

  using RenderFn = std::function<std::string()>;
  using LogFn = std::function<void(const std::string&)>;
  MetricsServer(RenderFn render, LogFn log) : render_(std::move(render)), log_(std::move(log)) {}
  ~MetricsServer() { Stop(); }
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds host:port (IPv4) and starts the thread; false with error naming
  // the address and why.
  bool Start(const std::string& host, int port, std::string* error);
  void Stop();

  uint64_t served() const { return served_.load(); }    // 200s
  uint64_t refused() const { return refused_.load(); }  // 4xx, timeouts, resets

 private:
  void Run();
  void Serve(int fd);

  RenderFn render_;
  LogFn log_;
  int listen_fd_ = -1;
  int stop_efd_ = -1;
  std::thread thread_;
  std::atomic<uint64_t> served_{0}, refused_{0};
};

}  // namespace lockstep
