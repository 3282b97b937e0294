// replay.cc — see replay.h.
#include "guard/server/replay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "consensus/assert.h"

namespace lockstep {

Replayer::Replayer(ShimChannel* shim, std::string host, int port, WatchFn watch, LogFn log)
    : shim_(shim), host_(std::move(host)), port_(port), watch_(watch), log_(log) {
  in_addr source{};
  inet_pton(AF_INET, host_.c_str(), &source);
  shim_->SetReplaySource(source.s_addr);
}

Replayer::~Replayer() {
  for (auto& [k, c] : conns_) {
    if (c.fd >= 0) close(c.fd);
    shim_->ReleaseReplaySlot(c.slot);
  }
}

void Replayer::Accept(ConnKey k) {
  queue_.push_back(Step{Kind::kAccept, k, {}});
}
void Replayer::Data(ConnKey k, std::string_view bytes, uint64_t index, uint64_t clock_ns,
                    uint64_t out_before) {
  queue_.push_back(Step{Kind::kData, k, std::string(bytes), index, clock_ns, out_before});
}
void Replayer::Close(ConnKey k, uint64_t out_before) {
  queue_.push_back(Step{Kind::kClose, k, {}, 0, 0, out_before});
}
void Replayer::Tick(uint32_t waiter, uint64_t index, uint64_t clock_ns) {
  queue_.push_back(Step{Kind::kTick, ConnKey{0, waiter}, {}, index, clock_ns, 0});
}

bool Replayer::Open(ConnKey k, Conn* c, int slot) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, host_.c_str(), &a.sin_addr);
  sockaddr_in local = a;
  local.sin_port = 0;
  socklen_t len = sizeof local;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    log_(std::string("replay: cannot open a connection to the server: ") + strerror(errno));
    if (fd >= 0) close(fd);
    return false;
  }
  // The shim must know this port is ours before the server accepts it.
  c->slot = slot < 0 ? shim_->ClaimReplaySlot(ntohs(local.sin_port))
                     : shim_->ReattachReplaySlot(slot, ntohs(local.sin_port));
  if (c->slot < 0) {
    log_("replay: more than 4096 replayed connections are open; this one is not replayed");
    close(fd);
    return false;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // The server's replies are read only to be discarded: let them gather in
  // the socket and wake this loop once per kReplyBatchBytes (the server
  // closing its end still wakes it at once), instead of once per reply.
  int lowat = kReplyBatchBytes;
  setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
  a.sin_port = htons(static_cast<uint16_t>(port_));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    log_(std::string("replay: connect to the server failed: ") + strerror(errno));
    shim_->ReleaseReplaySlot(c->slot);
    c->slot = -1;
    close(fd);
    return false;
  }
  c->fd = fd;
  by_fd_[fd] = k;
  watch_(fd, true, false);
  return true;
}

void Replayer::FlushOut(Conn* c) {
  while (!c->out.empty() && c->fd >= 0) {
    ssize_t n = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c->out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR || errno == ENOTCONN)) {
      if (!c->want_write) watch_(c->fd, false, true);
      c->want_write = true;
      return;
    }
    // The server closed the connection or reset it: nothing more reaches it.
    c->server_closed = true;
    c->out.clear();
  }
  if (c->fd >= 0 && c->want_write) watch_(c->fd, false, false);  // epoll_ctl only on change
  c->want_write = false;
  if (c->out.empty() && c->close_requested && !c->write_shut && c->fd >= 0) {
    shutdown(c->fd, SHUT_WR);
    c->write_shut = true;
  }
}

void Replayer::Finish(std::map<ConnKey, Conn>::iterator it) {
  Conn& c = it->second;
  if (c.fd >= 0) {
    by_fd_.erase(c.fd);
    close(c.fd);  // also leaves our epoll set
  }
  ForgetHanded(c.slot);
  NoteGone(it->first, c.slot);
  shim_->ReleaseReplaySlot(c.slot);
  conns_.erase(it);
}

void Replayer::NoteGone(const ConnKey& k, int slot) {
  if (slot < 0 || !shim_->ReplayAccepted(slot)) return;
  gone_[shim_->ReplayConn(slot)] = k;
  while (gone_.size() > kGoneKept) gone_.erase(gone_.begin());  // numbers grow: the oldest
}

bool Replayer::KeyOfOutput(int slot, uint32_t shim_conn, ConnKey* key) const {
  for (const auto& [k, c] : conns_) {
    if (c.slot != slot || !shim_->ReplayAccepted(slot) || shim_->ReplayConn(slot) != shim_conn)
      continue;
    *key = k;
    return true;
  }
  auto g = gone_.find(shim_conn);
  if (g == gone_.end()) return false;
  *key = g->second;
  return true;
}

void Replayer::ForgetHanded(int slot) {
  if (slot < 0) return;  // already forgotten when the server closed its end
  // The slot may be reused: keep what the server had read of it.
  uint64_t read = shim_->ReplayRead(slot);
  read_by_gone_ += read;
  for (Handed& h : handed_)
    if (h.slot == slot) {
      h.slot = -1;
      h.read_at_release = read;
    }
}

bool Replayer::Drained(const ConnKey& k) const {
  auto it = conns_.find(k);
  if (it == conns_.end()) return true;
  const Conn& c = it->second;
  if (c.server_closed || c.fd < 0 || c.slot < 0) return true;
  // Connected but not yet accepted: a checkpoint now would catch the
  // connection in the server's accept queue, where CRIU does not keep it.
  if (!shim_->ReplayAccepted(c.slot)) return false;
  if (!c.out.empty() || shim_->ReplayRead(c.slot) < c.appended) return false;
  return !c.close_requested || shim_->ReplayEof(c.slot);
}

Replayer::HandedMark Replayer::HandedSoFar() const {
  HandedMark mark;
  for (const auto& [k, c] : conns_)
    if (!c.server_closed && c.fd >= 0 && c.slot >= 0) mark[k] = c.appended;
  return mark;
}

bool Replayer::ReadPast(const HandedMark& mark) const {
  for (const auto& [k, bytes] : mark) {
    auto it = conns_.find(k);
    if (it == conns_.end()) continue;  // ended since: the server read it all
    const Conn& c = it->second;
    if (c.server_closed || c.slot < 0) continue;
    if (shim_->ReplayRead(c.slot) < bytes) return false;
  }
  return true;
}

bool Replayer::ServerTookAll(uint64_t* progress) const {
  bool all = true;
  uint64_t read = shim_->OrderTaken();
  for (const auto& [k, c] : conns_) {
    if (c.server_closed || c.fd < 0 || c.slot < 0) continue;
    uint64_t r = shim_->ReplayRead(c.slot);
    read += r;
    if (!shim_->ReplayAccepted(c.slot) || !c.out.empty() || r < c.appended) all = false;
  }
  *progress = read;
  return all;
}

bool Replayer::Idle() const {
  if (!queue_.empty() || shim_->OrderPending() > 0) return false;
  for (const auto& [k, c] : conns_)
    if (!Drained(k)) return false;
  return true;
}

std::string Replayer::Busy() const {
  if (!queue_.empty()) return std::to_string(queue_.size()) + " entries queued";
  for (const auto& [k, c] : conns_) {
    if (Drained(k)) continue;
    std::string what =
        "connection " + std::to_string(k.no) + " (slot " + std::to_string(c.slot) + ")";
    if (!shim_->ReplayAccepted(c.slot)) return what + " not yet accepted by the server";
    if (!c.out.empty())
      return what + ": " + std::to_string(c.out.size()) + " bytes not yet written";
    uint64_t read = shim_->ReplayRead(c.slot);
    if (read < c.appended)
      return what + ": the server read " + std::to_string(read) + " of " +
             std::to_string(c.appended) + " bytes";
    return what + ": closed, and the server has not seen the end";
  }
  if (uint64_t n = shim_->OrderPending())
    return std::to_string(n) + " order records (ticks) not yet taken by the server";
  return "";
}

uint64_t Replayer::EntryBeingRead(bool* all_read) const {
  auto read = [this](const Handed& h) {
    return h.slot >= 0 ? shim_->ReplayRead(h.slot) : h.read_at_release;
  };
  *all_read = handed_.empty() || read(handed_.back()) >= handed_.back().end;
  for (auto it = handed_.rbegin(); it != handed_.rend(); ++it)
    if (read(*it) > it->start) return it->index;
  return 0;
}

uint64_t Replayer::BytesRead() const {
  uint64_t n = read_by_gone_;
  for (const auto& [k, c] : conns_)
    if (c.slot >= 0) n += shim_->ReplayRead(c.slot);
  return n;
}

std::vector<Replayer::OpenConn> Replayer::OpenConns() const {
  std::vector<OpenConn> out;
  for (const auto& [k, c] : conns_)
    if (c.fd >= 0 && c.slot >= 0 && !c.server_closed)
      out.push_back(OpenConn{k, c.slot, c.appended});
  return out;
}

void Replayer::Reattach(const std::vector<OpenConn>& conns) {
  for (const OpenConn& o : conns) {
    Conn c;
    c.appended = o.bytes;  // the shim's stream offsets carry on from the checkpoint
    if (Open(o.key, &c, o.slot))
      conns_[o.key] = std::move(c);
    else
      log_("replay: connection " + std::to_string(o.key.no) + " of the checkpoint is lost");
  }
}

bool Replayer::Pump(uint64_t now_us) {
  bool did = false;
  gated_ = false;
  // A connection's inputs of this pass go in one send at the end (its order
  // records are in the ring before that, so the shim keeps them in place):
  // a committed batch costs a send per connection, not per input.
  std::vector<ConnKey> unsent;
  auto send_all = [&] {
    for (const ConnKey& k : unsent) {
      auto it = conns_.find(k);
      if (it != conns_.end()) FlushOut(&it->second);
    }
  };
  while (!queue_.empty()) {
    Step& s = queue_.front();
    if (s.kind == Kind::kTick) {  // no connection: only its place in the order
      if (!shim_->PushOrder(static_cast<int>(s.key.no), LS_ORDER_TICK, 0, s.clock_ns)) {
        gated_ = true;
        send_all();
        return did;
      }
      did = true;
      queue_.pop_front();
      continue;
    }
    auto it = conns_.find(s.key);
    bool live = it != conns_.end() && !it->second.server_closed && it->second.slot >= 0;
    // A connection opens once the server has read every input handed to it
    // before (or once it has read nothing for kAcceptAheadMaxUs, should it
    // wait for this connection before it reads those). Else a backup's
    // server, whose replayed inputs arrive as fast as the log, would accept
    // connections far ahead of executing them, where the leader's had no more
    // open than its clients: libupnp's pool then refused the surplus ("too
    // many jobs", 100) with replies the leader never sent, or closed them
    // unread. Not "the shim took their order records" (it takes them as soon
    // as their connection is accepted), and not a fixed 100 ms: under ab at 16
    // connections a busy backup's gerbera closed hundreds of connections
    // unread per 4000 requests that way.
    uint64_t progress = 0;
    if (s.kind == Kind::kAccept && it == conns_.end() && !ServerTookAll(&progress)) {
      if (!accept_waiting_since_us_ || progress != accept_waiting_progress_) {
        accept_waiting_since_us_ = now_us;
        accept_waiting_progress_ = progress;
      }
      if (now_us - accept_waiting_since_us_ < kAcceptAheadMaxUs) {
        gated_ = true;
        send_all();
        return did;
      }
    }
    if (s.kind == Kind::kAccept) accept_waiting_since_us_ = 0;
    // The order comes first: the shim lets the server read these bytes only
    // after everything ordered before them.
    if (s.kind != Kind::kAccept && live &&
        !shim_->PushOrder(it->second.slot, s.kind == Kind::kData ? LS_ORDER_DATA : LS_ORDER_EOF,
                          s.bytes.size(), s.clock_ns, s.out_before)) {
      gated_ = true;  // the order ring is full: wait for the server to read
      send_all();
      return did;
    }
    did = true;
    switch (s.kind) {
      case Kind::kAccept: {
        if (it != conns_.end()) break;  // already open (replayed twice)
        Conn c;
        if (Open(s.key, &c)) conns_[s.key] = std::move(c);
        break;
      }
      case Kind::kData:
        if (!live) break;
        if (s.index) {
          uint64_t start = it->second.appended;
          handed_.push_back(Handed{s.index, it->second.slot, start, start + s.bytes.size()});
          if (handed_.size() > kHandedKept) handed_.pop_front();
        }
        it->second.appended += s.bytes.size();
        if (it->second.out.empty()) unsent.push_back(s.key);
        it->second.out += s.bytes;
        break;
      case Kind::kClose:
        if (it == conns_.end()) break;
        if (it->second.server_closed) {
          Finish(it);
          break;
        }
        it->second.close_requested = true;
        FlushOut(&it->second);
        break;
      case Kind::kTick: LS_ASSERT(false, "a tick is ordered above"); break;
    }
    queue_.pop_front();
  }
  send_all();
  return did;
}

void Replayer::OnEvent(int fd, uint32_t events) {
  auto f = by_fd_.find(fd);
  if (f == by_fd_.end()) return;
  auto it = conns_.find(f->second);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (events & EPOLLOUT) FlushOut(&c);
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    char buf[65536];
    for (;;) {
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) continue;  // replies are discarded
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      // EOF or error: the server closed its end.
      c.server_closed = true;
      c.out.clear();
      if (c.close_requested) {
        Finish(it);
      } else {
        by_fd_.erase(fd);
        close(fd);
        c.fd = -1;
        ForgetHanded(c.slot);
        NoteGone(it->first, c.slot);
        shim_->ReleaseReplaySlot(c.slot);  // its port may now be reused by a real client
        c.slot = -1;
      }
      return;
    }
  }
}

}  // namespace lockstep
