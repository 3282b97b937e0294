// tls_acceptor.h — accepting connections on a daemon's listening sockets and
// carrying each through its TLS handshake on a thread of its own, so that
// the consensus loop only ever sees streams whose TLS is up.
//
// The listener's side of a TLS 1.3 handshake signs (its certificate's key)
// and derives a shared secret, and a peer's certificate is checked against
// the CA: hundreds of microseconds of CPU before anything is known about the
// other end. On the loop, a flood of connections to the client port (no
// credential needed to make the daemon do that work) stretched its passes,
// and with them heartbeats and acks. Here the flood costs this thread's time
// instead, and is bounded as on the loop: at most max_pending connections
// of one listener in their handshake at once (the oldest goes), each for at
// most timeout_us.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "guard/net/tls.h"

namespace lockstep {

// The IPv4 address at the other end of a connected socket, for logs ("?" if none).
std::string PeerHost(int fd);

class TlsAcceptor {
 public:
  using LogFn = std::function<void(const std::string&)>;
  struct Accepted {
    std::unique_ptr<Stream> stream;  // TLS established, nothing read past it
    int listener = -1;               // the index of its listening socket, as given
    uint64_t accepted_us = 0;        // when accept() took it (NowUs)
  };

  // listen_fds: non-blocking listening sockets, still owned by the caller
  // and open until Stop() returned; names: what their connections are, for
  // the log ("client": "closed an unauthenticated client connection ...").
  TlsAcceptor(std::shared_ptr<TlsContext> tls, std::vector<int> listen_fds,
              std::vector<std::string> names, size_t max_pending, uint64_t timeout_us, LogFn log);
  ~TlsAcceptor();
  TlsAcceptor(const TlsAcceptor&) = delete;
  TlsAcceptor& operator=(const TlsAcceptor&) = delete;

  bool Start(std::string* error);
  void Stop();
  // Readable (an eventfd) when Take() has streams for the caller's loop.
  int ready_fd() const { return ready_efd_; }
  std::vector<Accepted> Take();
  uint64_t dropped() const { return dropped_.load(); }  // closed before their TLS was up

 private:
  struct Pending {
    std::unique_ptr<Stream> stream;
    int listener;
    uint64_t accepted_us;
    uint32_t events;  // what epoll waits for (EPOLLIN or EPOLLOUT)
  };
  void Run();
  void AcceptFrom(int listener);
  void Step(int fd);  // the handshake of pending_[fd] goes on
  void Drop(int fd, const std::string& why);
  void Watch(Pending& p, bool add);

  std::shared_ptr<TlsContext> tls_;
  std::vector<int> listen_fds_;
  std::vector<std::string> names_;
  size_t max_pending_;
  uint64_t timeout_us_;
  LogFn log_;
  int epfd_ = -1, stop_efd_ = -1, ready_efd_ = -1;
  std::thread thread_;
  // The thread's own.
  std::vector<std::pair<int, Pending>> pending_;  // by fd, in accept order
  std::atomic<uint64_t> dropped_{0};
  // Shared with the caller.
  std::mutex ready_mu_;
  std::vector<Accepted> ready_;
};

}  // namespace lockstep
