// front_door.cc — see front_door.h.
#include "guard/daemon/front_door.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "consensus/assert.h"
#include "consensus/region.h"  // MaxRegionPayload
#include "guard/net/client.h"

namespace lockstep {

namespace {

constexpr int kListenBacklog = 128;
constexpr size_t kNonceBytes = 32;  // the handshake's challenge
constexpr int kPeerConnectTimeoutMs = 300;
constexpr uint64_t kPeerRetryUs = 50000;          // after a failed connection to a peer
constexpr useconds_t kConnectorPeriodUs = 10000;  // how often the connector looks

int ListenTcp(const std::string& host, int port, std::string* error) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    *error = "host '" + host + "' is not an IPv4 address";
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    *error = "cannot listen on " + host + ":" + std::to_string(port) + ": " + strerror(errno);
    close(fd);
    return -1;
  }
  listen(fd, kListenBacklog);
  return fd;
}

}  // namespace

FrontDoor::FrontDoor(const ClusterConfig& config, int id, bool verbose, EventLoop& loop,
                     Replica& core, const std::string& disk_error, Hooks hooks,
                     const ReplicaLog& log)
    : cfg_(config),
      me_(config.replicas[id]),
      n_(static_cast<int>(config.replicas.size())),
      verbose_(verbose),
      loop_(loop),
      core_(core),
      disk_error_(disk_error),
      hooks_(std::move(hooks)),
      log_(log) {
  outbound_.assign(kMaxMemberIds, nullptr);
  outbound_connected_.reset(new std::atomic<bool>[kMaxMemberIds]);
  for (int r = 0; r < kMaxMemberIds; r++) outbound_connected_[r] = false;
}

FrontDoor::~FrontDoor() {
  StopConnector();
  acceptor_.reset();  // its thread stops before the listening sockets close
  for (int fd : {peer_listen_, client_listen_, connected_efd_})
    if (fd >= 0) close(fd);
}

bool FrontDoor::Listen() {
  std::string err;
  tls_ = TlsContext::ForCluster(cfg_, me_.id, &err);
  if (!tls_) {
    log_("cannot start without this replica's TLS keys: %s", err.c_str());
    return false;
  }
  peer_listen_ = ListenTcp(me_.host, me_.peer_port, &err);
  if (peer_listen_ < 0) {
    log_("%s (peer_port of replica %d)", err.c_str(), me_.id);
    return false;
  }
  client_listen_ = ListenTcp(me_.host, me_.client_port, &err);
  if (client_listen_ < 0) {
    log_("%s (client_port of replica %d)", err.c_str(), me_.id);
    return false;
  }
  connected_efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  // The TLS handshakes run on a thread of their own (tls_acceptor.h): the
  // peer port is its listener 0, the client port 1 (OnAccepted).
  acceptor_ = std::make_unique<TlsAcceptor>(
      tls_, std::vector<int>{peer_listen_, client_listen_},
      std::vector<std::string>{ConnRoleName(ConnRole::kPeer), ConnRoleName(ConnRole::kClient)},
      kMaxHandshaking, kHandshakeUs, [this](const std::string& m) { log_("%s", m.c_str()); });
  if (!acceptor_->Start(&err)) {
    log_("%s", err.c_str());
    return false;
  }
  loop_.Add(acceptor_->ready_fd(), [this](uint32_t) { return OnAccepted(); });
  loop_.Add(connected_efd_, [this](uint32_t) { return OnOutboundConnected(); });
  return true;
}

void FrontDoor::StartConnector() {
  connector_ = std::thread([this] { ConnectorThread(); });
}

void FrontDoor::StopConnector() {
  stopping_ = true;
  if (connector_.joinable()) connector_.join();
}

// Opens (and re-opens) the outbound, send-only connection to every peer.
void FrontDoor::ConnectorThread() {
  std::vector<uint64_t> next_try(kMaxMemberIds, 0);
  std::vector<std::string> last_error(kMaxMemberIds);
  while (!stopping_) {
    for (int r = 0; r < n_.load() && !stopping_; r++) {
      if (r == me_.id) continue;
      if (outbound_connected_[r].load() || NowUs() < next_try[r]) continue;
      std::string err;
      const auto& p = cfg_.replicas[r];  // below n_: written before n_ was raised
      if (p.removed) continue;
      std::unique_ptr<Stream> s =
          ConnectAuthenticated(p.host, p.peer_port, tls_, r, cfg_.secret, Principal::kPeer, me_.id,
                               kPeerConnectTimeoutMs, &err);
      if (!s) {
        next_try[r] = NowUs() + kPeerRetryUs;
        // A peer that refuses us, or whose certificate is wrong, is said
        // once per reason; one that is down or unreachable is not news.
        bool news = err.find("refused by") != std::string::npos ||
                    err.find("TLS with") != std::string::npos ||
                    err.find("certificate") != std::string::npos;
        if (news && err != last_error[r]) log_("peer %d: %s", r, err.c_str());
        if (news) last_error[r] = err;
        continue;
      }
      last_error[r].clear();
      outbound_connected_[r] = true;
      std::lock_guard<std::mutex> g(connected_mu_);
      connected_.push_back({r, std::move(s)});
      uint64_t one = 1;
      (void)!write(connected_efd_, &one, 8);
    }
    usleep(kConnectorPeriodUs);
  }
}

// ---------------------------------------------------------------- connections

bool FrontDoor::OnOutboundConnected() {
  uint64_t v;
  (void)!read(connected_efd_, &v, 8);
  std::vector<std::pair<int, std::unique_ptr<Stream>>> got;
  {
    std::lock_guard<std::mutex> g(connected_mu_);
    got.swap(connected_);
  }
  for (auto& [r, stream] : got) {
    auto c = std::make_unique<FrameConn>(std::move(stream), ConnRole::kOutbound);
    c->authenticated = true;  // the connector did the handshake
    c->peer_id = r;
    outbound_[r] = c.get();
    AddConn(std::move(c));
  }
  return false;
}

// Connections whose TLS the acceptor's thread brought up: their HELLO is
// read here. The pool of each port counts again while they authenticate.
bool FrontDoor::OnAccepted() {
  for (TlsAcceptor::Accepted& a : acceptor_->Take()) {
    ConnRole role = a.listener == 0 ? ConnRole::kPeer : ConnRole::kClient;
    FrameConn* oldest = nullptr;
    size_t authenticating = 0;
    for (auto& [f, c] : conns_) {
      if (c->authenticated || c->role != role) continue;
      authenticating++;
      if (!oldest || c->opened_us < oldest->opened_us) oldest = c.get();
    }
    if (authenticating >= kMaxHandshaking && oldest)
      DropHandshake(oldest, "more than " + std::to_string(kMaxHandshaking) +
                                " connections authenticating at once; the oldest is dropped");
    int fd = a.stream->fd();
    AddConn(std::make_unique<FrameConn>(std::move(a.stream), role));
    // TLS may hold the HELLO already (read ahead in the handshake), and the
    // socket then says nothing more.
    OnConnEvent(fd, EPOLLIN);
  }
  return false;
}

void FrontDoor::DropHandshake(FrameConn* c, const std::string& why) {
  handshakes_dropped_++;
  if (handshakes_dropped_ <= 10 || handshakes_dropped_ % 1000 == 0)
    log_("closed an unauthenticated %s connection from %s: %s (%lu such so far)",
         ConnRoleName(c->role), PeerHost(c->fd()).c_str(), why.c_str(),
         (unsigned long)handshakes_dropped_);
  CloseConn(c, why);
}

size_t FrontDoor::client_connections() const {
  size_t n = 0;
  for (const auto& [fd, c] : conns_) n += c->role == ConnRole::kClient && c->authenticated;
  return n;
}

uint64_t FrontDoor::tls_handshakes_failed() const {
  return acceptor_ ? acceptor_->dropped() : 0;
}

void FrontDoor::ExpireHandshakes(uint64_t now) {
  if (now < next_handshake_sweep_us_) return;
  next_handshake_sweep_us_ = now + 100000;
  std::vector<FrameConn*> late;
  for (auto& [f, c] : conns_)
    if (!c->authenticated && c->role != ConnRole::kOutbound && now - c->opened_us > kHandshakeUs)
      late.push_back(c.get());
  for (FrameConn* c : late)
    DropHandshake(
        c, "it did not authenticate within " + std::to_string(kHandshakeUs / 1000000) + " s");
}

void FrontDoor::AddConn(std::unique_ptr<FrameConn> c) {
  int fd = c->fd();
  c->opened_us = NowUs();
  bool client = c->role == ConnRole::kClient;
  c->bytes_in = client ? byte_counters_.client_in : byte_counters_.peer_in;
  c->bytes_out = client ? byte_counters_.client_out : byte_counters_.peer_out;
  loop_.Add(fd, [this, fd](uint32_t events) { return OnConnEvent(fd, events); });
  conns_[fd] = std::move(c);
}

bool FrontDoor::OnConnEvent(int fd, uint32_t events) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return false;
  FrameConn* c = it->second.get();
  // TLS that had to write before it could read on reads on once it could.
  bool read_waits_write = c->stream() && c->stream()->wants_write();
  if (events & EPOLLOUT) {
    std::string err;
    if (!c->Flush(&err)) {
      CloseConn(c, err);
      return false;
    }
    if (!c->WantsWrite()) loop_.Watch(fd, false);
  }
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) || (read_waits_write && (events & EPOLLOUT))) {
    if (c->role == ConnRole::kOutbound) {
      // Send-only: the peer writes nothing, so input means it closed.
      char buf[256];
      ssize_t r = c->stream()->Read(buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EAGAIN)) CloseConn(c, "peer closed");
    } else {
      OnConnReadable(c);
    }
  }
  return true;
}

void FrontDoor::CloseConn(FrameConn* c, const std::string& why) {
  int fd = c->fd();
  if (verbose_) log_("closing %s connection (fd %d): %s", ConnRoleName(c->role), fd, why.c_str());
  // The leader's end of a connection closed: its process most likely died
  // (the kernel closes a killed process's sockets at once). Elect now rather
  // than after the election timeout, which is long here (see config.h); the
  // pre-vote still needs a majority that lost the leader too.
  if ((c->role == ConnRole::kPeer || c->role == ConnRole::kOutbound) && c->authenticated &&
      c->peer_id >= 0 && core_.role() == Role::kBackup && c->peer_id == core_.leader() &&
      core_.last_leader_contact_us() != 0) {
    log_("connection to leader %d closed (%s): electing without waiting for the timeout",
         c->peer_id, why.c_str());
    core_.OnLeaderGone(NowUs());
  }
  for (int r = 0; r < n_.load(); r++)
    if (outbound_[r] == c) {
      outbound_[r] = nullptr;
      outbound_connected_[r] = false;
    }
  for (auto& w : waiters_)
    if (w.conn == c) w.conn = nullptr;
  if (move_.conn == c) move_.conn = nullptr;
  loop_.Remove(fd);
  // A checkpoint fetch leaves the loop here, its TLS session with it.
  std::unique_ptr<Stream> handed;
  int64_t from = c->checkpoint_from;
  bool inspect = c->inspect && hooks_.serve_inspection;
  std::string who = PrincipalName(c->principal), peer = inspect ? PeerHost(fd) : "";
  std::string program = c->inspect_program;
  if (from >= 0 || inspect) handed = c->ReleaseStream();
  conns_.erase(fd);
  if (handed && inspect)
    hooks_.serve_inspection(std::move(handed), who, peer, program);
  else if (handed)
    hooks_.serve_checkpoint(std::move(handed), static_cast<uint64_t>(from));
}

void FrontDoor::OnConnReadable(FrameConn* c) {
  std::string err;
  bool ok = c->ReadFrames([&](FrameKind k, std::string_view body) { OnFrame(c, k, body); }, &err);
  if (!ok) {
    if (!c->authenticated && c->role != ConnRole::kOutbound) {
      DropHandshake(c, err);
      return;
    }
    if (err.rfind("frame of ", 0) == 0)  // said whatever the verbosity: a client to fix
      log_("closed a %s connection from %s: %s", PrincipalName(c->principal),
           PeerHost(c->fd()).c_str(), err.c_str());
    CloseConn(c, err);
    return;
  }
  // Closed here, not inside ReadFrames: the callback must not free the
  // connection it is reading from.
  if (!c->close_after_read.empty()) {
    CloseConn(c, c->close_after_read);
    return;
  }
  if (!c->Flush(&err)) {
    CloseConn(c, err);
  } else if (c->role == ConnRole::kClient && c->queued_bytes() > kMaxQueuedReplyBytes) {
    log_("closed a client connection that does not read its replies (%zu bytes queued)",
         c->queued_bytes());
    CloseConn(c, "it does not read its replies");
  } else if (c->WantsWrite()) {
    loop_.Watch(c->fd(), true);
  }
}

void FrontDoor::OnFrame(FrameConn* c, FrameKind kind, std::string_view body) {
  if (!c->close_after_read.empty()) return;  // closing: what else it sent is not looked at
  if (!c->authenticated) {
    OnHandshake(c, kind, body);
    return;
  }
  if (c->role == ConnRole::kPeer) {
    if (kind == FrameKind::kOutputReport || kind == FrameKind::kRepairOrder ||
        kind == FrameKind::kRepairResult) {
      if (hooks_.on_peer_frame) hooks_.on_peer_frame(c->peer_id, kind, body);
      return;
    }
    if (kind != FrameKind::kPeerMessage) return;
    Message m;
    if (!DecodeMessage(body, &m) || m.from != c->peer_id || m.to != me_.id) {
      log_("malformed message from replica %d ignored", c->peer_id);
      return;
    }
    if (verbose_)
      log_("<- %s from %d ballot %s stream %lu commit %lu entries %zu", MessageTypeName(m.type),
           m.from, BallotString(m.ballot).c_str(), (unsigned long)m.stream_id,
           (unsigned long)m.commit_index, m.entries.size());
    hooks_.on_peer_message(std::move(m));
    return;
  }
  OnClientFrame(c, kind, body);
}

// HELLO -> CHALLENGE, AUTH -> WELCOME or REFUSED.
void FrontDoor::OnHandshake(FrameConn* c, FrameKind kind, std::string_view body) {
  if (kind == FrameKind::kHello && c->nonce.empty()) {
    Hello hello;
    if (!DecodeHello(body, &hello) || hello.magic != kWireMagic) {
      Refuse(c, "not a lockstep handshake");
      return;
    }
    if (hello.version != kWireVersion) {
      Refuse(c, "wire version " + std::to_string(hello.version) + " not supported");
      return;
    }
    // A peer on the client port (or the reverse) is refused: the role is
    // part of what the proof covers.
    Principal who = Principal::kClient;
    bool ok = ParsePrincipal(hello.role, &who) && PortOf(who) == c->role;
    if (ok && (who == Principal::kPeer || who == Principal::kReplica))
      ok = hello.from < static_cast<uint32_t>(n_.load()) &&
           !(who == Principal::kPeer && static_cast<int>(hello.from) == me_.id);
    if (!ok) {
      Refuse(c, "wrong port for role '" + hello.role + "' or bad replica id");
      return;
    }
    // A daemon proves which replica it is with that replica's certificate
    // (the CA checked it in the TLS handshake); the secret alone is not enough.
    int certified = c->stream() ? c->stream()->peer_replica() : -1;
    if ((who == Principal::kPeer || who == Principal::kReplica) &&
        certified != static_cast<int>(hello.from)) {
      std::string has = certified < 0 ? std::string("no replica certificate")
                                      : "the certificate of replica " + std::to_string(certified);
      log_("refused a %s connection from %s that says it is replica %u: it presented %s",
           PrincipalName(who), PeerHost(c->fd()).c_str(), hello.from, has.c_str());
      Refuse(c, "replica " + std::to_string(hello.from) + " must present its certificate (" + has +
                    " was presented)");
      return;
    }
    c->principal = who;
    c->peer_id = static_cast<int>(hello.from);  // an id only for peers and replicas
    c->nonce = RandomBytes(kNonceBytes);
    c->Queue(FrameKind::kChallenge, c->nonce);
    return;
  }
  if (kind == FrameKind::kAuth && !c->nonce.empty()) {
    std::string secret, missing;
    // A replica's config has all three; an empty one would accept an HMAC
    // under the empty key, so none is no way in.
    if (!SecretFor(cfg_, c->principal, &secret, &missing)) {
      Refuse(c,
             std::string("this replica takes no ") + PrincipalName(c->principal) + " credential");
      return;
    }
    std::string expect = AuthProof(secret, c->nonce, c->principal, c->peer_id);
    if (body.size() == expect.size() &&
        CRYPTO_memcmp(body.data(), expect.data(), expect.size()) == 0) {
      if (c->role == ConnRole::kClient) {
        size_t open = 0;
        for (auto& [f, other] : conns_) open += other->authenticated && other->role == c->role;
        if (open >= kMaxClientConns) {
          log_(
              "refused a %s connection from %s: %zu authenticated connections are open (the "
              "limit)",
              PrincipalName(c->principal), PeerHost(c->fd()).c_str(), open);
          Refuse(c, std::to_string(open) +
                        " connections to this replica's client port are open (the limit): close "
                        "one and try again");
          return;
        }
      }
      c->authenticated = true;
      // A client's or an admin's largest request is a proposal (its type and
      // length, then the payload): a frame far bigger is refused before it is
      // buffered, not after 1 GiB (kMaxFrame, for replicas' catch-up). Twice
      // the largest proposal, 4 MiB at least: one a little too big still gets
      // the core's clear answer.
      if (c->principal == Principal::kClient || c->principal == Principal::kAdmin)
        c->frame_limit = static_cast<uint32_t>(std::min<uint64_t>(
            kMaxFrame, std::max<uint64_t>(4 << 20, 2 * MaxRegionPayload(cfg_.ring_bytes) + 5)));
      c->Queue(FrameKind::kWelcome, "");
      return;
    }
    const char* which = c->principal == Principal::kClient  ? "client"
                        : c->principal == Principal::kAdmin ? "admin"
                                                            : "cluster";
    log_("refused an unauthenticated %s connection from %s: it does not know the %s secret",
         PrincipalName(c->principal), PeerHost(c->fd()).c_str(), which);
    Refuse(c, std::string("authentication failed: wrong ") + which + " secret");
    return;
  }
  Refuse(c, "handshake out of order");
}

// The client port's rights: a request that `c`'s principal may not make is
// refused (kRefused, saying which credential it needs) and logged; the
// connection stays, and nothing else changes.
bool FrontDoor::Permit(FrameConn* c, std::initializer_list<Principal> allowed, const char* what) {
  for (Principal p : allowed)
    if (c->principal == p) return true;
  std::string needs;
  for (Principal p : allowed) needs += std::string(needs.empty() ? "" : " or ") + PrincipalName(p);
  std::string why = std::string(what) + " is not for a " + PrincipalName(c->principal) +
                    (needs.empty() ? ": nobody may, through the client port"
                                   : ": it needs the " + needs + " credential");
  log_("refused a request of a %s from %s: %s", PrincipalName(c->principal),
       PeerHost(c->fd()).c_str(), why.c_str());
  c->Queue(FrameKind::kRefused, why);
  return false;
}

// One refusal per connection: it is written and the connection closed, so
// that nobody tries one secret after another on it.
void FrontDoor::Refuse(FrameConn* c, const std::string& why) {
  c->Queue(FrameKind::kRefused, why);
  std::string err;
  c->Flush(&err);
  c->close_after_read = "refused: " + why;
}

void FrontDoor::SendToPeer(Message* m) {
  if (m->to < 0 || m->to >= n_ || m->to == me_.id) return;
  FrameConn* c = outbound_[m->to];
  if (verbose_)
    log_("-> %s to %d ballot %s stream %lu%s", MessageTypeName(m->type), m->to,
         BallotString(m->ballot).c_str(), (unsigned long)m->stream_id,
         c ? "" : " (not connected: dropped)");
  if (!c) return;  // not connected: the protocol tolerates a lost message
  if (!hooks_.fill_transport(m)) return;
  c->Queue(FrameKind::kPeerMessage, EncodeMessage(*m));
  std::string err;
  if (!c->Flush(&err)) {
    CloseConn(c, err);
  } else if (c->WantsWrite()) {
    loop_.Watch(c->fd(), true);
  }
}

bool FrontDoor::SendFrameToPeer(int to, FrameKind kind, std::string_view body) {
  if (to < 0 || to >= n_ || to == me_.id || !outbound_[to]) return false;
  FrameConn* c = outbound_[to];
  c->Queue(kind, body);
  std::string err;
  if (!c->Flush(&err)) {
    CloseConn(c, err);
    return false;
  }
  if (c->WantsWrite()) loop_.Watch(c->fd(), true);
  return true;
}

// ---------------------------------------------------------------- clients

void FrontDoor::OnClientFrame(FrameConn* c, FrameKind kind, std::string_view body) {
  // Replies piling up unread: nothing more is answered, and it goes.
  if (c->queued_bytes() > kMaxQueuedReplyBytes) {
    if (c->close_after_read.empty())
      log_("closed a client connection that does not read its replies (%zu bytes queued)",
           c->queued_bytes());
    c->close_after_read = "it does not read its replies";
    return;
  }
  uint64_t now = NowUs();
  switch (kind) {
    case FrameKind::kPropose: OnPropose(c, body, now); return;
    case FrameKind::kStatus: c->Queue(FrameKind::kStatusResult, StatusJson()); return;
    case FrameKind::kRead: {
      ReadRequest req;
      if (!DecodeReadRequest(body, &req)) return;
      uint64_t first = std::max(req.from, core_.first_index());
      uint64_t last = std::min(core_.commit_index(), first + req.max - 1);
      std::vector<const Entry*> entries;
      uint64_t bytes = 0;
      for (uint64_t i = first; last >= first && i <= last && bytes < kMaxReadReplyBytes; i++) {
        const Entry* e = core_.At(i);
        LS_ASSERT(e != nullptr, "committed slot %lu missing (log %lu..%lu)", (unsigned long)i,
                  (unsigned long)core_.first_index(), (unsigned long)core_.last_index());
        entries.push_back(e);
        bytes += e->payload.size();
      }
      c->Queue(FrameKind::kReadResult, EncodeReadReply(core_.commit_index(), entries));
      return;
    }
    case FrameKind::kTruncate: {
      if (!Permit(c, {Principal::kAdmin}, "truncating the log")) return;
      TruncateRequest req;
      bool ok = DecodeTruncateRequest(body, &req) && core_.TruncateBelow(req.below);
      c->Queue(FrameKind::kTruncateResult, EncodeTruncateReply({ok, core_.first_index()}));
      return;
    }
    case FrameKind::kCheckpoint: {
      CheckpointRequest req;
      CheckpointReply reply{false, "malformed checkpoint request"};
      if (!DecodeCheckpointRequest(body, &req)) {
      } else if (req.op == CheckpointOp::kNow &&
                 !Permit(c, {Principal::kAdmin}, "taking a checkpoint")) {
        return;
      } else {
        reply = hooks_.checkpoint(req.op);
      }
      c->Queue(FrameKind::kCheckpointResult, EncodeCheckpointReply(reply));
      return;
    }
    case FrameKind::kFetchCheckpoint: {
      // A checkpoint is the server's whole memory: no client's to read.
      if (!Permit(c, {Principal::kAdmin, Principal::kReplica}, "fetching a checkpoint")) return;
      FetchCheckpointRequest req;
      if (!DecodeFetchCheckpointRequest(body, &req)) {
        c->close_after_read = "malformed checkpoint fetch";
        return;
      }
      // A transfer of hundreds of MB is blocking file and socket I/O: the
      // connection goes to a sender thread, and leaves this loop (CloseConn).
      c->checkpoint_from = static_cast<int64_t>(req.min_index);
      c->close_after_read = "handed to the checkpoint sender";
      return;
    }
    case FrameKind::kInspect: {
      // Outside the log on a backup: the admin's alone (inspection.h).
      if (!Permit(c, {Principal::kAdmin}, "inspecting the server")) return;
      InspectRequest req;
      if (!DecodeInspectRequest(body, &req)) {
        c->close_after_read = "malformed inspect request";
        return;
      }
      // An inspection lasts as long as the inspector likes and carries any
      // amount of bytes: the connection goes to a relay thread of its own,
      // and leaves this loop (CloseConn).
      c->inspect = true;
      c->inspect_program = req.program.substr(0, 200);
      c->close_after_read = "handed to an inspection relay";
      return;
    }
    case FrameKind::kDivergence: {
      DivergenceRequest req;
      if (!DecodeDivergenceRequest(body, &req) || !hooks_.divergence) {
        c->close_after_read = "malformed divergence request";
        return;
      }
      c->Queue(FrameKind::kDivergenceResult, hooks_.divergence(req));
      return;
    }
    case FrameKind::kLeaderMove: {
      if (!Permit(c, {Principal::kAdmin}, "moving the leader")) return;
      OnLeaderMove(c, body, now);
      return;
    }
    case FrameKind::kFailpoint: {
      if (!Permit(c, {Principal::kAdmin}, "setting a failpoint")) return;
      FailpointRequest req;
      if (!DecodeFailpointRequest(body, &req) || !hooks_.failpoint) {
        c->close_after_read = "malformed failpoint request";
        return;
      }
      c->Queue(FrameKind::kFailpointResult, EncodeFailpointReply(hooks_.failpoint(req.spec)));
      return;
    }
    default: c->close_after_read = "unknown request";
  }
}

void FrontDoor::OnPropose(FrameConn* c, std::string_view body, uint64_t now) {
  ProposeRequest req;
  if (!DecodeProposeRequest(body, &req) || !IsSlotType(req.type)) {
    c->Queue(FrameKind::kProposeResult, EncodeProposeReply({false, 0, "malformed proposal"}));
    return;
  }
  // Output checks are the leader's own entries (a forged one could start
  // repairs). A membership change is an admin's (`lockstep member`), and
  // its payload is the change asked for: the leader makes the entry.
  if (req.type == EntryType::kOutputCheck && !Permit(c, {}, "proposing an output check")) return;
  if (req.type == EntryType::kConfig &&
      !Permit(c, {Principal::kAdmin}, "changing the cluster's membership"))
    return;
  // A cluster that runs a server takes its inputs from the leader's server
  // alone: a raw input proposed here would be replayed into every backup's
  // server under a connection of the leader's that the leader's server never
  // saw (replicas diverge), and forged ACCEPTs would use up replay slots.
  if (req.type == EntryType::kInput && cfg_.has_server() &&
      !Permit(c, {},
              "proposing a raw input to a cluster that runs a server (clients write through "
              "the server's own address, client_addr in cluster status)"))
    return;
  std::string error;
  ProposeResult pr;
  uint64_t uncommitted = core_.last_index() - std::min(core_.last_index(), core_.commit_index());
  if (!disk_error_.empty()) {
    error = "this replica cannot write its log: " + disk_error_ + "; proposals are refused";
  } else if (c->proposals_waiting >= kMaxProposalsWaiting) {
    error = std::to_string(c->proposals_waiting) +
            " proposals of this connection are waiting for their commit (the limit): wait for "
            "their replies before sending more; this one is not in the log";
  } else if (core_.role() == Role::kLeader && uncommitted >= kMaxUncommitted) {
    error = "the log holds " + std::to_string(uncommitted) +
            " entries not yet committed (no majority keeps up): try again later; this one is "
            "not in the log";
  } else if (req.type == EntryType::kConfig) {
    MembershipChange change;
    error = DecodeMembershipRequest(req.payload, &change);
    if (error.empty()) pr = core_.ProposeMembershipChange(now, change);
    if (error.empty() && !pr.ok) error = pr.error;
    if (error.empty())
      log_("membership change proposed by an admin from %s: %s replica %d (entry %lu: %s)",
           PeerHost(c->fd()).c_str(), MembershipChangeKindName(change.kind), change.id,
           (unsigned long)pr.index, core_.membership().ToString().c_str());
    else
      log_("membership change refused: %s", error.c_str());
  } else {
    pr = core_.Propose(now, req.type, std::move(req.payload));
    if (!pr.ok) error = pr.error;
  }
  if (!error.empty()) {
    c->Queue(FrameKind::kProposeResult, EncodeProposeReply({false, 0, error}));
    return;
  }
  waiters_.push_back(Waiter{pr.index, core_.promised(), now, 0, c});
  c->proposals_waiting++;
}

std::string FrontDoor::StatusJson() {
  ServerStatus server = hooks_.server_status();
  uint64_t now = NowUs(), lease_until = core_.LeaseUntil(),
           guard_until = core_.lease_guard_until_us();
  // The members of the configuration this replica holds (consensus/membership.h).
  const Membership& ms = core_.membership();
  Json peers = Json::array(), voters = Json::array(), learners = Json::array();
  ForEachId(ms.voters, [&](int r) { voters.push_back(r); });
  ForEachId(ms.learners, [&](int r) { learners.push_back(r); });
  ForEachId(ms.voters | ms.learners, [&](int r) {
    if (r == me_.id) return;
    peers.push_back({{"id", r},
                     {"member", MemberStateName(ms.StateOf(r))},
                     {"match", core_.PeerMatch(r)},
                     {"stream", core_.PeerReady(r)}});
  });
  Json membership = {{"voters", std::move(voters)},
                     {"learners", std::move(learners)},
                     {"next_id", ms.next_id},
                     {"index", core_.membership_index()},
                     {"committed", core_.membership_index() <= core_.commit_index()},
                     {"this_replica", MemberStateName(core_.member_state())}};
  Json transfer = {{"state", TransferStateName(core_.transfer().state)},
                   {"target", core_.transfer().target}};
  return JsonText(Json{{"id", me_.id},
                       {"pid", getpid()},
                       {"role", RoleName(core_.role())},
                       {"ballot", BallotString(core_.promised())},
                       {"leader", core_.leader()},
                       {"commit_index", core_.commit_index()},
                       {"durable_index", core_.durable_index()},
                       {"last_index", core_.last_index()},
                       {"first_index", core_.first_index()},
                       {"lease_left_us", lease_until > now ? lease_until - now : 0},
                       {"lease_guard_left_us", guard_until > now ? guard_until - now : 0},
                       {"lease_reads", server.lease_reads},
                       {"lease_misses", server.lease_misses},
                       {"transport", cfg_.transport},
                       {"durability", cfg_.durability},
                       {"may_vote", core_.may_vote()},
                       {"disk_error", disk_error_},
                       {"applied_index", server.applied_index},
                       {"server_read_all", server.server_read_all},
                       {"serving", server.serving},
                       {"transfer", std::move(transfer)},
                       {"server_pid", server.server_pid},
                       {"server_port", me_.server_port},
                       {"replay_connections", server.replay_connections},
                       {"checkpoint", server.checkpoint_json},
                       {"output", server.output_json},
                       {"state_checks", server.state_json},
                       {"membership", std::move(membership)},
                       {"peers", std::move(peers)}});
}

// An admin's `lockstep leader move`: the core stops taking proposals (the
// server pipeline holds its shim's inputs meanwhile: they go to the new
// leader's server once their clients reconnect), waits for the target to
// hold the whole log and hands over to it; ReplyLeaderMove answers then.
// Refusals are answered at once.
void FrontDoor::OnLeaderMove(FrameConn* c, std::string_view body, uint64_t now) {
  LeaderMoveRequest req;
  if (!DecodeLeaderMoveRequest(body, &req)) {
    c->close_after_read = "malformed leader move request";
    return;
  }
  auto refuse = [&](const std::string& why) {
    c->Queue(FrameKind::kLeaderMoveResult, EncodeLeaderMoveReply({false, -1, 0, why}));
  };
  if (move_.active) {
    refuse("a move to replica " + std::to_string(move_.target) + " is already under way");
    return;
  }
  int target = req.target;
  if (target < 0) {
    if (core_.role() == Role::kLeader) {
      target = core_.FurthestReadyPeer();
      if (target < 0) {
        refuse("no backup is ready to lead: none has a live stream from this leader");
        return;
      }
    }
  }
  std::string why = core_.TransferLeadership(now, target, kLeaderMoveTimeoutUs, kLeaderMoveHoldUs);
  if (!why.empty()) {
    log_("leader move to replica %d refused: %s", target, why.c_str());
    refuse(why);
    return;
  }
  log_(
      "moving leadership to replica %d (asked by an admin from %s): proposals held until it "
      "holds the log up to index %lu",
      target, PeerHost(c->fd()).c_str(), (unsigned long)core_.last_index());
  move_ = MoveWaiter{true, c, target, now};
  ReplyLeaderMove(now);
}

void FrontDoor::ReplyLeaderMove(uint64_t now) {
  if (!move_.active) return;
  const TransferStatus& t = core_.transfer();
  if (t.state == TransferState::kWaiting) return;
  LeaderMoveReply reply;
  reply.waited_us = now - move_.asked_us;
  std::string target = "replica " + std::to_string(move_.target);
  switch (t.state) {
    case TransferState::kHandedOver:
      reply.ok = true;
      reply.new_leader = move_.target;
      reply.text = "handed leadership over to " + target + " after " +
                   std::to_string((t.ended_us - t.started_us) / 1000) + " ms";
      break;
    case TransferState::kTimedOut:
      reply.text = target + " did not catch up within " +
                   std::to_string(kLeaderMoveTimeoutUs / 1000) + " ms (it holds the log to index " +
                   std::to_string(core_.PeerMatch(move_.target)) + " of " +
                   std::to_string(core_.last_index()) +
                   "); this replica leads and serves again. Check that replica's health "
                   "(lockstep cluster status) and retry";
      break;
    case TransferState::kLostLeadership:
      reply.text =
          "this replica stopped leading during the move (another replica was elected); "
          "see lockstep cluster status";
      break;
    default: reply.text = std::string("leader move ended as ") + TransferStateName(t.state);
  }
  log_("leader move to %s: %s", target.c_str(), reply.text.c_str());
  if (move_.conn) move_.conn->Queue(FrameKind::kLeaderMoveResult, EncodeLeaderMoveReply(reply));
  move_ = MoveWaiter{};
}

// Proposals in flight get an answer now: their outcome is unknown (they may
// still commit later), which is what the client is told.
void FrontDoor::FailWaiters(const std::string& why) {
  for (auto& w : waiters_) {
    if (!w.conn) continue;
    w.conn->proposals_waiting--;
    w.conn->Queue(FrameKind::kProposeResult, EncodeProposeReply({false, w.index, why}));
  }
  waiters_.clear();
}

void FrontDoor::ReplyWaiters(uint64_t now) {
  uint64_t durable = core_.durable_index();
  for (auto& w : waiters_)
    if (!w.durable_us && w.index <= durable) w.durable_us = now;
  uint64_t commit = core_.commit_index();
  while (!waiters_.empty() && waiters_.front().index <= commit) {
    Waiter w = waiters_.front();
    waiters_.pop_front();
    if (!w.conn) continue;
    w.conn->proposals_waiting--;
    const Entry* e = core_.At(w.index);
    if (!e || e->ballot != w.ballot) {  // the slot was decided under another ballot
      w.conn->Queue(FrameKind::kProposeResult,
                    EncodeProposeReply(
                        {false, w.index, "leadership changed before commit; outcome unknown"}));
      continue;
    }
    uint64_t durable_at = w.durable_us ? w.durable_us : now;
    ProposeReply reply{true, w.index, ""};
    reply.commit_us = static_cast<double>(now - w.proposed_us);
    reply.durable_us = static_cast<double>(durable_at - w.proposed_us);  // own durable write
    reply.quorum_us = static_cast<double>(now - durable_at);             // waiting for the quorum
    w.conn->Queue(FrameKind::kProposeResult, EncodeProposeReply(reply));
  }
}

void FrontDoor::FlushClients() {
  std::string err;
  for (auto it = conns_.begin(); it != conns_.end();) {
    FrameConn* c = it->second.get();
    ++it;
    if (c->role == ConnRole::kClient && c->WantsWrite()) {
      if (!c->Flush(&err)) {
        CloseConn(c, err);
      } else if (c->queued_bytes() > kMaxQueuedReplyBytes) {
        log_("closed a client connection that does not read its replies (%zu bytes queued)",
             c->queued_bytes());
        CloseConn(c, "it does not read its replies");
      } else if (c->WantsWrite()) {
        loop_.Watch(c->fd(), true);
      }
    }
  }
}

}  // namespace lockstep
