// tls_acceptor.cc — see tls_acceptor.h.
#include "guard/net/tls_acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "consensus/assert.h"
#include "guard/common/replica_log.h"  // NowUs

namespace lockstep {

namespace {
constexpr int kMaxEvents = 64;
constexpr int kSweepMs = 100;  // how often handshakes past their time are looked for
// epoll data: a pending connection's fd, or one of these (never an fd).
constexpr uint64_t kStopTag = 1ull << 40;
constexpr uint64_t kListenerTag = 1ull << 41;  // | the listener's index
}  // namespace

std::string PeerHost(int fd) {
  sockaddr_storage a;
  socklen_t len = sizeof a;
  char host[64] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && a.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, host, sizeof host);
  return host;
}

TlsAcceptor::TlsAcceptor(std::shared_ptr<TlsContext> tls, std::vector<int> listen_fds,
                         std::vector<std::string> names, size_t max_pending, uint64_t timeout_us,
                         LogFn log)
    : tls_(std::move(tls)),
      listen_fds_(std::move(listen_fds)),
      names_(std::move(names)),
      max_pending_(max_pending),
      timeout_us_(timeout_us),
      log_(std::move(log)) {}

TlsAcceptor::~TlsAcceptor() {
  Stop();
  for (int fd : {epfd_, stop_efd_, ready_efd_})
    if (fd >= 0) close(fd);
}

bool TlsAcceptor::Start(std::string* error) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  stop_efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ready_efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || stop_efd_ < 0 || ready_efd_ < 0) {
    *error = std::string("TLS acceptor: ") + strerror(errno);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kStopTag;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, stop_efd_, &ev);
  for (size_t i = 0; i < listen_fds_.size(); i++) {
    ev.data.u64 = kListenerTag | i;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fds_[i], &ev) != 0) {
      *error = std::string("TLS acceptor: watching a listening socket: ") + strerror(errno);
      return false;
    }
  }
  thread_ = std::thread([this] { Run(); });
  return true;
}

void TlsAcceptor::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!write(stop_efd_, &one, 8);
  thread_.join();
  pending_.clear();  // their streams close their sockets
}

std::vector<TlsAcceptor::Accepted> TlsAcceptor::Take() {
  uint64_t v;
  (void)!read(ready_efd_, &v, 8);
  std::vector<Accepted> out;
  std::lock_guard<std::mutex> g(ready_mu_);
  out.swap(ready_);
  return out;
}

void TlsAcceptor::Run() {
  pthread_setname_np(pthread_self(), "ls-tls-accept");
  epoll_event evs[kMaxEvents];
  uint64_t next_sweep_us = NowUs() + kSweepMs * 1000;
  for (;;) {
    int n = epoll_wait(epfd_, evs, kMaxEvents, kSweepMs);
    for (int i = 0; i < n; i++) {
      uint64_t tag = evs[i].data.u64;
      if (tag == kStopTag) return;
      if (tag & kListenerTag) {
        AcceptFrom(static_cast<int>(tag & ~kListenerTag));
      } else {
        Step(static_cast<int>(tag));
      }
    }
    uint64_t now = NowUs();
    if (now < next_sweep_us) continue;
    next_sweep_us = now + kSweepMs * 1000;
    std::vector<int> late;
    for (const auto& [fd, p] : pending_)
      if (now - p.accepted_us > timeout_us_) late.push_back(fd);
    for (int fd : late)
      Drop(fd,
           "its TLS handshake did not end within " + std::to_string(timeout_us_ / 1000000) + " s");
  }
}

void TlsAcceptor::AcceptFrom(int listener) {
  for (;;) {
    int fd = accept4(listen_fds_[listener], nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or the listener's trouble: it says again when it can
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // At the limit of this listener's connections in their handshake, its
    // oldest goes: each listener has a pool of its own (a flood of client
    // connections must not evict a peer reconnecting on the peer port).
    size_t mine = 0;
    int oldest = -1;
    for (const auto& [f, p] : pending_) {
      if (p.listener != listener) continue;
      if (oldest < 0) oldest = f;
      mine++;
    }
    if (mine >= max_pending_ && oldest >= 0)
      Drop(oldest, "more than " + std::to_string(max_pending_) +
                       " connections in their TLS handshake at once; the oldest is dropped");
    pending_.push_back({fd, Pending{std::make_unique<Stream>(fd, tls_, /*accepting=*/true),
                                    listener, NowUs(), EPOLLIN}});
    Watch(pending_.back().second, /*add=*/true);
    Step(fd);  // the ClientHello may be there already
  }
}

void TlsAcceptor::Watch(Pending& p, bool add) {
  epoll_event ev{};
  ev.events = p.events;
  ev.data.u64 = static_cast<uint64_t>(p.stream->fd());
  epoll_ctl(epfd_, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, p.stream->fd(), &ev);
}

void TlsAcceptor::Step(int fd) {
  auto it =
      std::find_if(pending_.begin(), pending_.end(), [fd](const auto& e) { return e.first == fd; });
  if (it == pending_.end()) return;  // dropped earlier in this pass
  Pending& p = it->second;
  int step = p.stream->HandshakeStep();
  if (step < 0) {
    Drop(fd, p.stream->error().empty() ? "its TLS handshake failed" : p.stream->error());
    return;
  }
  if (step == 0) {
    uint32_t want = p.stream->wants_write() ? EPOLLOUT : EPOLLIN;
    if (want != p.events) {
      p.events = want;
      Watch(p, /*add=*/false);
    }
    return;
  }
  // TLS is up: the loop takes it from here (its HELLO, its frames).
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  Accepted a{std::move(p.stream), p.listener, p.accepted_us};
  pending_.erase(it);
  {
    std::lock_guard<std::mutex> g(ready_mu_);
    ready_.push_back(std::move(a));
  }
  uint64_t one = 1;
  (void)!write(ready_efd_, &one, 8);
}

void TlsAcceptor::Drop(int fd, const std::string& why) {
  auto it =
      std::find_if(pending_.begin(), pending_.end(), [fd](const auto& e) { return e.first == fd; });
  LS_ASSERT(it != pending_.end(), "dropping fd %d, which is not in a TLS handshake here", fd);
  uint64_t dropped = ++dropped_;
  if (dropped <= 10 || dropped % 1000 == 0)
    log_("closed an unauthenticated " + names_.at(it->second.listener) + " connection from " +
         PeerHost(fd) + " before its TLS was up: " + why + " (" + std::to_string(dropped) +
         " such so far)");
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  pending_.erase(it);  // the stream closes the socket
}

}  // namespace lockstep
