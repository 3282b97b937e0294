// daemon.cc — the replica daemon's event loop.
//
// One thread runs the loop: it polls memory (ack slots as leader; the control
// word and ring of the current region as backup), the UCX worker, the disk
// writer's completions and the sockets, feeds what it finds to the core, and
// carries out what the core asks (TakeReady). A second thread (DiskWriter)
// does the durable writes, a third opens outbound connections to peers.
//
// Polling is adaptive: the loop spins (yielding the CPU between passes) for
// spin_us after the last activity, then arms the UCX worker and sleeps in
// epoll until a doorbell, a socket, the disk or the next heartbeat wakes it.
// Every put is followed by a doorbell to its target; UCX delivers it cheaply
// when the target is awake and signals its event fd only when it sleeps.
#include "guard/daemon.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "consensus/core.h"
#include "consensus/disk_log.h"
#include "consensus/transport_ucx.h"
#include "guard/client.h"
#include "guard/replay.h"
#include "guard/server.h"
#include "guard/shim_channel.h"
#include "guard/wire.h"

namespace lockstep {

namespace {

uint64_t NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

int Listen(const std::string& host, int port, std::string* error) {
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
  listen(fd, 128);
  return fd;
}

// What a message carries for the transport: the sender's UCX worker address
// and, from a backup, the region it opened for (ballot, stream); from a
// leader, its ack array.
struct TransportBlob {
  std::string worker_address;
  uint64_t region_addr = 0;
  std::string region_rkey;
  uint64_t region_size = 0;
};

std::string EncodeBlob(const TransportBlob& b) {
  ByteWriter w;
  w.bytes(b.worker_address);
  w.u64(b.region_addr);
  w.bytes(b.region_rkey);
  w.u64(b.region_size);
  return std::move(w.str());
}

bool DecodeBlob(std::string_view in, TransportBlob* b) {
  ByteReader r(in);
  return r.bytes(&b->worker_address) && r.u64(&b->region_addr) && r.bytes(&b->region_rkey) &&
         r.u64(&b->region_size) && r.done();
}

constexpr size_t kSpareRegions = 2;
constexpr uint64_t kMaxInputsInFlight = 256;  // proposed, not yet committed

struct Waiter {
  uint64_t index;
  Ballot ballot;
  uint64_t proposed_us;
  uint64_t durable_us = 0;
  FrameConn* conn;
};

// The payload of a kInput log entry: what the leader's shim saw, naming the
// connection by the ballot that accepted it. seq is the shim's submission
// number (0: a CLOSE the daemon itself proposed).
struct Input {
  uint8_t kind = 0;  // LS_SUB_ACCEPT / DATA / CLOSE
  ConnKey key;
  uint64_t seq = 0;
  std::string bytes;
};
constexpr size_t kInputHeader = 1 + 8 + 4 + 8 + 4;

std::string EncodeInput(uint8_t kind, ConnKey key, uint64_t seq, std::string_view bytes) {
  ByteWriter w;
  w.u8(kind);
  w.u64(key.ballot);
  w.u32(key.no);
  w.u64(seq);
  w.bytes(bytes);
  return std::move(w.str());
}

bool DecodeInput(std::string_view payload, Input* in) {
  ByteReader r(payload);
  return r.u8(&in->kind) && r.u64(&in->key.ballot) && r.u32(&in->key.no) && r.u64(&in->seq) &&
         r.bytes(&in->bytes) && r.done() && in->kind >= LS_SUB_ACCEPT && in->kind <= LS_SUB_CLOSE;
}

class Daemon {
 public:
  explicit Daemon(const DaemonOptions& o) : opt_(o), cfg_(o.config), me_(cfg_.replicas[o.id]) {}
  int Run();

 private:
  void Log(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  bool Init();
  bool RecoverLog(DurableState* state);
  void ConnectorThread();
  void AcceptOn(int listen_fd, const char* role);
  void OnConnReadable(FrameConn* c);
  void OnFrame(FrameConn* c, FrameKind kind, std::string_view body);
  void OnClientFrame(FrameConn* c, FrameKind kind, std::string_view body);
  void OnPeerMessage(Message m);
  void CloseConn(FrameConn* c, const std::string& why);
  bool PollMemory(uint64_t now);
  bool PollDisk(uint64_t now);
  bool Drain(uint64_t now);
  bool DrainOnce(uint64_t now);
  void SendToPeer(Message& m);
  void EnsureRegion();
  UcxTransport::LocalRegion* TakeSpareRegion();
  bool MapSpareRegion();
  int UcxPeer(int replica, const std::string& worker_address);
  void ReplyWaiters(uint64_t now);
  void FailWaiters(const std::string& why);
  std::string StatusJson();
  void Watch(int fd, bool writable);
  void HandleEvents(epoll_event* evs, int n, uint64_t* last_busy);
  bool StartServer();
  bool ProcessSubmissions(uint64_t now);
  bool ApplyCommitted(uint64_t now);
  bool OwnConn(const ConnKey& k) const;
  bool ReadyToServe();

  DaemonOptions opt_;
  ClusterConfig cfg_;
  ReplicaConfig me_;
  int n_ = 0;
  bool memory_mode_ = false;
  std::unique_ptr<Replica> core_;
  std::unique_ptr<UcxTransport> ucx_;
  std::unique_ptr<DiskLog> disk_;
  std::unique_ptr<DiskWriter> writer_;
  std::string disk_error_;
  uint64_t durable_seq_seen_ = 0;  // the disk writer's completions already given to the core
  std::vector<uint64_t> memory_completions_;

  int epfd_ = -1, sigfd_ = -1, peer_listen_ = -1, client_listen_ = -1;
  std::map<int, std::unique_ptr<FrameConn>> conns_;  // by fd
  std::vector<FrameConn*> outbound_;                 // by replica id
  std::mutex connected_mu_;
  std::vector<std::pair<int, int>> connected_;  // (replica, fd) from the connector thread
  int connected_efd_ = -1;
  std::unique_ptr<std::atomic<bool>[]> outbound_connected_;
  std::atomic<bool> stopping_{false};
  std::thread connector_;

  // UCX state.
  UcxTransport::LocalRegion* ack_region_ = nullptr;
  std::vector<AckWord> last_ack_;
  std::vector<int> ucx_peer_;               // by replica: PeerId or -1
  std::vector<std::string> ucx_peer_addr_;  // worker address it was made for
  struct RemoteRegion {
    Ballot ballot = 0;
    uint64_t stream_id = 0;
    int remote = -1;
  };
  std::vector<RemoteRegion> remote_region_;  // leader: each backup's region for our stream
  std::vector<int> remote_ack_;              // backup: each leader's ack array
  struct OwnRegion {
    Ballot ballot;
    uint64_t stream_id;
    UcxTransport::LocalRegion* region;
  };
  std::deque<OwnRegion> own_regions_;  // newest last; a couple kept for deferred messages
  std::deque<UcxTransport::LocalRegion*> spare_regions_;
  std::deque<UcxTransport::LocalRegion*> recycled_regions_;
  uint64_t next_spare_try_us_ = 0;
  uint64_t stats_[6] = {};
  double write_us_sum_ = 0;
  uint64_t write_count_ = 0;
  uint64_t next_stats_us_ = 0;
  std::unique_ptr<RingReader> reader_;
  ControlWord last_control_{};

  std::deque<Waiter> waiters_;
  Role last_role_ = Role::kBackup;
  Ballot last_ballot_ = 0;
  std::vector<bool> ring_peer_;

  // The replicated server (absent when the cluster has no [server]).
  std::unique_ptr<ShimChannel> shim_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Replayer> replayer_;
  uint64_t applied_ = 0;  // log entries handed to the server (or its replayer)
  struct OwnPending {
    uint64_t seq;
    uint32_t conn;
    uint8_t kind;
    uint64_t proposed_us;
  };
  uint64_t inputs_committed_ = 0;  // since the last report
  double input_commit_us_sum_ = 0;
  uint64_t next_input_report_us_ = 0;
  std::map<uint64_t, OwnPending> own_pending_;  // our shim's proposals, by log index
  std::map<uint32_t, ConnKey> own_conns_;       // our shim's connections
  std::set<uint32_t> broken_own_;               // an input was dropped: refuse the rest
  std::set<ConnKey> open_conns_;                // open according to the applied log
  std::set<ConnKey> closing_;                   // CLOSE proposed by us as a new leader
  bool close_old_pending_ = false;
  uint64_t close_old_after_ = 0;
  uint64_t next_server_check_us_ = 0;
  bool truncated_warned_ = false;
  int exit_code_ = 0;
  uint64_t prev_pass_us_ = 0;
  uint64_t last_stream_ = 0;
  Ballot serving_ballot_ = 0;         // the ballot under which our server serves clients
  bool holding_submissions_ = false;  // a new leader's server is still catching up
  uint64_t next_slow_log_us_ = 0;
};

void Daemon::Log(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  localtime_r(&ts.tv_sec, &tm);
  fprintf(stderr, "%02d:%02d:%02d.%06ld replica %d: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
          ts.tv_nsec / 1000, me_.id, buf);
}

bool Daemon::RecoverLog(DurableState* state) {
  if (memory_mode_) return true;
  DiskLogOptions dopt;
  dopt.dir = me_.dir + "/log";
  dopt.segment_bytes = cfg_.segment_bytes;
  RecoveredLog rec;
  std::string err;
  disk_ = DiskLog::Open(dopt, &rec, &err);
  if (!disk_) {
    Log("cannot open the log in %s: %s", dopt.dir.c_str(), err.c_str());
    return false;
  }
  if (rec.torn_tail)
    Log("log tail was torn by an interrupted write (%s): dropped, never served; the rest comes "
        "from peers",
        rec.problem.c_str());
  if (rec.damaged)
    Log("LOG DAMAGED: %s. The damaged part is refused; this replica recovers it from its peers "
        "and does not vote until it has caught up",
        rec.problem.c_str());
  state->promised = rec.promised;
  state->commit_index = rec.commit_index;
  state->first_index = rec.truncated_below ? rec.truncated_below : 1;
  state->slots = std::move(rec.slots);
  state->damaged = rec.damaged;
  if (!state->slots.empty()) state->first_index = state->slots.front().index;
  Log("recovered log: %zu slots from %lu, promised ballot %s, commit index %lu",
      state->slots.size(), (unsigned long)state->first_index, BallotString(rec.promised).c_str(),
      (unsigned long)rec.commit_index);
  writer_ = std::make_unique<DiskWriter>(disk_.get());
  return true;
}

// SIGTERM and SIGINT arrive through a signalfd. They must be blocked before
// any thread starts (the disk writer, UCX's): a process-directed signal goes
// to any thread that does not block it, and its default action would end the
// daemon without stopping its server.
sigset_t ShutdownSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  return mask;
}

bool Daemon::Init() {
  sigset_t shutdown = ShutdownSignals();
  sigprocmask(SIG_BLOCK, &shutdown, nullptr);
  n_ = static_cast<int>(cfg_.replicas.size());
  memory_mode_ = cfg_.durability == "memory";
  if (mkdir(me_.dir.c_str(), 0755) < 0 && errno != EEXIST) {
    Log("cannot create %s: %s", me_.dir.c_str(), strerror(errno));
    return false;
  }
  DurableState state;
  if (!RecoverLog(&state)) return false;

  std::string err;
  UcxTransport::Options uopt;
  uopt.kind = cfg_.transport == "shm"   ? UcxTransport::Kind::kShm
              : cfg_.transport == "tcp" ? UcxTransport::Kind::kTcp
                                        : UcxTransport::Kind::kAuto;
  uopt.name = "lockstep-" + std::to_string(me_.id);
  ucx_ = UcxTransport::Create(uopt, &err);
  if (!ucx_) {
    Log("UCX transport (%s) failed: %s", cfg_.transport.c_str(), err.c_str());
    return false;
  }
  ack_region_ = ucx_->MapRegion(kAckSlotBytes * kMaxReplicas, &err);
  if (!ack_region_) {
    Log("cannot map the ack array: %s", err.c_str());
    return false;
  }
  last_ack_.assign(n_, AckWord{});
  ucx_peer_.assign(n_, -1);
  ucx_peer_addr_.assign(n_, "");
  remote_region_.assign(n_, RemoteRegion{});
  remote_ack_.assign(n_, -1);
  ring_peer_.assign(n_, false);
  ucx_->SetPeerErrorHandler([this](UcxTransport::PeerId pid, std::string why) {
    for (int r = 0; r < n_; r++) {
      if (ucx_peer_[r] != pid) continue;
      Log("transport to replica %d failed: %s", r, why.c_str());
      ucx_peer_[r] = -1;
      ucx_peer_addr_[r].clear();
      remote_region_[r] = RemoteRegion{};
      remote_ack_[r] = -1;
      core_->OnPeerUnreachable(NowUs(), r);
    }
  });
  ucx_->SetDoorbellHandler([](uint64_t) {});

  CoreConfig cc;
  cc.id = me_.id;
  cc.replicas = n_;
  cc.ring_bytes = cfg_.ring_bytes;
  cc.heartbeat_us = cfg_.heartbeat_us;
  cc.election_timeout_min_us = cfg_.election_timeout_min_us;
  cc.election_timeout_max_us = cfg_.election_timeout_max_us;
  cc.seed = static_cast<uint64_t>(getpid()) ^ NowUs();
  cc.incarnation = (static_cast<uint64_t>(time(nullptr)) << 8 | (NowUs() & 0xff)) & 0xffffffffull;
  core_ = std::make_unique<Replica>(cc, std::move(state), NowUs());

  peer_listen_ = Listen(me_.host, me_.peer_port, &err);
  if (peer_listen_ < 0) {
    Log("%s (peer_port of replica %d)", err.c_str(), me_.id);
    return false;
  }
  client_listen_ = Listen(me_.host, me_.client_port, &err);
  if (client_listen_ < 0) {
    Log("%s (client_port of replica %d)", err.c_str(), me_.id);
    return false;
  }
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  sigset_t mask = ShutdownSignals();
  sigfd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  connected_efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  for (int fd : {peer_listen_, client_listen_, sigfd_, ucx_->EventFd(), connected_efd_})
    Watch(fd, false);
  if (writer_) Watch(writer_->EventFd(), false);
  outbound_.assign(n_, nullptr);
  outbound_connected_.reset(new std::atomic<bool>[n_]);
  for (int r = 0; r < n_; r++) outbound_connected_[r] = false;
  if (cfg_.has_server() && !StartServer()) return false;
  connector_ = std::thread([this] { ConnectorThread(); });
  Log("up: %d replicas, transport %s, durability %s%s, peers on %s:%d, clients on %s:%d", n_,
      cfg_.transport.c_str(), cfg_.durability.c_str(),
      memory_mode_ ? " (NOT durable: a majority holds entries in RAM only)" : "", me_.host.c_str(),
      me_.peer_port, me_.host.c_str(), me_.client_port);
  return true;
}

void Daemon::Watch(int fd, bool writable) {
  epoll_event ev{};
  ev.events = EPOLLIN | (writable ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.fd = fd;
  if (epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) < 0) epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
}

// Opens (and re-opens) the outbound, send-only connection to every peer.
void Daemon::ConnectorThread() {
  std::vector<uint64_t> next_try(n_, 0);
  while (!stopping_) {
    for (int r = 0; r < n_ && !stopping_; r++) {
      if (r == me_.id) continue;
      if (outbound_connected_[r].load() || NowUs() < next_try[r]) continue;
      std::string err;
      const auto& p = cfg_.replicas[r];
      int fd = ConnectAuthenticated(p.host, p.peer_port, cfg_.secret, "peer", me_.id, 300, &err);
      if (fd < 0) {
        next_try[r] = NowUs() + 50000;
        if (err.find("refused by") != std::string::npos) Log("peer %d: %s", r, err.c_str());
        continue;
      }
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      outbound_connected_[r] = true;
      std::lock_guard<std::mutex> g(connected_mu_);
      connected_.push_back({r, fd});
      uint64_t one = 1;
      (void)!write(connected_efd_, &one, 8);
    }
    usleep(10000);
  }
}

// ---------------------------------------------------------------- sockets

void Daemon::AcceptOn(int listen_fd, const char* role) {
  for (;;) {
    sockaddr_storage a;
    socklen_t len = sizeof a;
    int fd =
        accept4(listen_fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<FrameConn>(fd);
    c->role = role;
    Watch(fd, false);
    conns_[fd] = std::move(c);
  }
}

void Daemon::CloseConn(FrameConn* c, const std::string& why) {
  int fd = c->fd();
  if (opt_.verbose) Log("closing %s connection (fd %d): %s", c->role.c_str(), fd, why.c_str());
  // The leader's end of a connection closed: its process most likely died
  // (the kernel closes a killed process's sockets at once). Elect now rather
  // than after the election timeout, which is long here (see config.h); the
  // pre-vote still needs a majority that lost the leader too.
  if ((c->role == "peer" || c->role == "outbound") && c->authenticated && c->peer_id >= 0 &&
      core_->role() == Role::kBackup && c->peer_id == core_->leader() &&
      core_->last_leader_contact_us() != 0) {
    Log("connection to leader %d closed (%s): electing without waiting for the timeout", c->peer_id,
        why.c_str());
    core_->OnLeaderGone(NowUs());
  }
  for (int r = 0; r < n_; r++)
    if (outbound_[r] == c) {
      outbound_[r] = nullptr;
      outbound_connected_[r] = false;
    }
  for (auto& w : waiters_)
    if (w.conn == c) w.conn = nullptr;
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  conns_.erase(fd);
}

void Daemon::OnConnReadable(FrameConn* c) {
  std::string err;
  bool ok = c->ReadFrames([&](FrameKind k, std::string_view body) { OnFrame(c, k, body); }, &err);
  if (!ok) {
    CloseConn(c, err);
    return;
  }
  if (!c->Flush(&err)) CloseConn(c, err);
}

void Daemon::OnFrame(FrameConn* c, FrameKind kind, std::string_view body) {
  if (!c->authenticated) {
    // Handshake: HELLO -> CHALLENGE, AUTH -> WELCOME or REFUSED.
    if (kind == FrameKind::kHello && c->nonce.empty()) {
      ByteReader r(body);
      uint32_t magic = 0, version = 0, from = 0;
      std::string role;
      if (!r.u32(&magic) || magic != kWireMagic || !r.u32(&version) || !r.bytes(&role) ||
          !r.u32(&from)) {
        c->Queue(FrameKind::kRefused, "not a lockstep handshake");
        return;
      }
      if (version != kWireVersion) {
        c->Queue(FrameKind::kRefused, "wire version " + std::to_string(version) + " not supported");
        return;
      }
      if (role != c->role || (role == "peer" && (from >= static_cast<uint32_t>(n_) ||
                                                 static_cast<int>(from) == me_.id))) {
        c->Queue(FrameKind::kRefused, "wrong port for role '" + role + "' or bad replica id");
        return;
      }
      c->peer_id = static_cast<int>(from);
      c->nonce = RandomBytes(32);
      c->Queue(FrameKind::kChallenge, c->nonce);
      return;
    }
    if (kind == FrameKind::kAuth && !c->nonce.empty()) {
      std::string expect = AuthProof(cfg_.secret, c->nonce, c->role, c->peer_id);
      if (body.size() == expect.size() &&
          CRYPTO_memcmp(body.data(), expect.data(), expect.size()) == 0) {
        c->authenticated = true;
        c->Queue(FrameKind::kWelcome, "");
        return;
      }
      sockaddr_storage a;
      socklen_t len = sizeof a;
      char host[64] = "?";
      if (getpeername(c->fd(), reinterpret_cast<sockaddr*>(&a), &len) == 0 &&
          a.ss_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, host, sizeof host);
      Log("refused an unauthenticated %s connection from %s: it does not know the cluster secret",
          c->role.c_str(), host);
      c->Queue(FrameKind::kRefused, "authentication failed: wrong cluster secret");
      return;
    }
    c->Queue(FrameKind::kRefused, "handshake out of order");
    return;
  }
  if (c->role == "peer") {
    if (kind != FrameKind::kPeerMessage) return;
    Message m;
    if (!DecodeMessage(body, &m) || m.from != c->peer_id || m.to != me_.id) {
      Log("malformed message from replica %d ignored", c->peer_id);
      return;
    }
    OnPeerMessage(std::move(m));
    return;
  }
  OnClientFrame(c, kind, body);
}

int Daemon::UcxPeer(int replica, const std::string& worker_address) {
  if (ucx_peer_[replica] >= 0 && ucx_peer_addr_[replica] == worker_address)
    return ucx_peer_[replica];
  if (ucx_peer_[replica] >= 0) {  // the peer restarted: a new worker
    ucx_->Disconnect(ucx_peer_[replica], 0);
    remote_region_[replica] = RemoteRegion{};
    remote_ack_[replica] = -1;
  }
  std::string err;
  uint64_t t0 = NowUs();
  int pid = ucx_->Connect(worker_address, &err);
  if (opt_.verbose) Log("connected UCX to %d in %lu us", replica, (unsigned long)(NowUs() - t0));
  if (pid < 0) {
    Log("cannot reach replica %d through UCX: %s", replica, err.c_str());
    ucx_peer_[replica] = -1;
    return -1;
  }
  ucx_peer_[replica] = pid;
  ucx_peer_addr_[replica] = worker_address;
  if (opt_.verbose) Log("UCX endpoint to replica %d: %s", replica, ucx_->DescribePeer(pid).c_str());
  return pid;
}

void Daemon::OnPeerMessage(Message m) {
  if (opt_.verbose)
    Log("<- %s from %d ballot %s stream %lu commit %lu entries %zu", MessageTypeName(m.type),
        m.from, BallotString(m.ballot).c_str(), (unsigned long)m.stream_id,
        (unsigned long)m.commit_index, m.entries.size());
  TransportBlob blob;
  if (!m.transport.empty() && DecodeBlob(m.transport, &blob) && !blob.worker_address.empty()) {
    int pid = UcxPeer(m.from, blob.worker_address);
    std::string err;
    if (pid >= 0 && (m.type == Message::Type::kPrepare || m.type == Message::Type::kHeartbeat)) {
      // From a leader (or candidate): its ack array.
      if (remote_ack_[m.from] < 0) {
        remote_ack_[m.from] =
            ucx_->AttachRemote(pid, blob.region_addr, blob.region_rkey, blob.region_size, &err);
        if (remote_ack_[m.from] < 0) Log("attach ack array of %d: %s", m.from, err.c_str());
      }
    } else if (pid >= 0 && (m.type == Message::Type::kPromise || m.type == Message::Type::kJoin)) {
      // From a backup: the region it opened for (ballot, stream).
      RemoteRegion& rr = remote_region_[m.from];
      if (rr.ballot != m.ballot || rr.stream_id != m.stream_id) {
        if (rr.remote >= 0) ucx_->DetachRemote(rr.remote);
        rr = RemoteRegion{
            m.ballot, m.stream_id,
            ucx_->AttachRemote(pid, blob.region_addr, blob.region_rkey, blob.region_size, &err)};
        if (rr.remote < 0) Log("attach region of %d: %s", m.from, err.c_str());
      }
    }
  }
  core_->OnMessage(NowUs(), m);
}

// ---------------------------------------------------------------- clients

void Daemon::OnClientFrame(FrameConn* c, FrameKind kind, std::string_view body) {
  uint64_t now = NowUs();
  switch (kind) {
    case FrameKind::kPropose: {
      ByteReader r(body);
      uint8_t type = 0;
      std::string payload;
      ByteWriter w;
      if (!r.u8(&type) || !r.bytes(&payload) || !IsSlotType(static_cast<EntryType>(type))) {
        w.u8(0);
        w.u64(0);
        w.bytes("malformed proposal");
        c->Queue(FrameKind::kProposeResult, w.str());
        return;
      }
      std::string error;
      ProposeResult pr;
      if (!disk_error_.empty()) {
        error = "this replica cannot write its log: " + disk_error_ + "; proposals are refused";
      } else {
        pr = core_->Propose(now, static_cast<EntryType>(type), std::move(payload));
        if (!pr.ok) error = pr.error;
      }
      if (!error.empty()) {
        w.u8(0);
        w.u64(0);
        w.bytes(error);
        c->Queue(FrameKind::kProposeResult, w.str());
        return;
      }
      waiters_.push_back(Waiter{pr.index, core_->promised(), now, 0, c});
      return;
    }
    case FrameKind::kStatus: c->Queue(FrameKind::kStatusResult, StatusJson()); return;
    case FrameKind::kRead: {
      ByteReader r(body);
      uint64_t from = 0;
      uint32_t max = 0;
      ByteWriter w;
      if (!r.u64(&from) || !r.u32(&max)) return;
      uint64_t first = std::max(from, core_->first_index());
      uint64_t last = std::min(core_->commit_index(), first + max - 1);
      uint32_t count = last >= first ? static_cast<uint32_t>(last - first + 1) : 0;
      w.u64(core_->commit_index());
      w.u32(count);
      for (uint64_t i = first; count && i <= last; i++) {
        const Entry* e = core_->At(i);
        w.u64(e->index);
        w.u64(e->ballot);
        w.u8(static_cast<uint8_t>(e->type));
        w.bytes(e->payload);
      }
      c->Queue(FrameKind::kReadResult, w.str());
      return;
    }
    case FrameKind::kTruncate: {
      ByteReader r(body);
      uint64_t below = 0;
      ByteWriter w;
      bool ok = r.u64(&below) && core_->TruncateBelow(below);
      w.u8(ok ? 1 : 0);
      w.u64(core_->first_index());
      c->Queue(FrameKind::kTruncateResult, w.str());
      return;
    }
    default: CloseConn(c, "unknown request");
  }
}

std::string Daemon::StatusJson() {
  std::ostringstream o;
  o << "{\"id\":" << me_.id << ",\"pid\":" << getpid() << ",\"role\":\"" << RoleName(core_->role())
    << "\",\"ballot\":\"" << BallotString(core_->promised()) << "\",\"leader\":" << core_->leader()
    << ",\"commit_index\":" << core_->commit_index()
    << ",\"durable_index\":" << core_->durable_index() << ",\"last_index\":" << core_->last_index()
    << ",\"first_index\":" << core_->first_index() << ",\"transport\":\"" << cfg_.transport
    << "\",\"durability\":\"" << cfg_.durability
    << "\",\"may_vote\":" << (core_->may_vote() ? "true" : "false") << ",\"disk_error\":\""
    << JsonEscape(disk_error_) << "\",\"applied_index\":" << applied_
    << ",\"server_pid\":" << (server_ ? server_->pid() : 0)
    << ",\"server_port\":" << me_.server_port
    << ",\"replay_connections\":" << (replayer_ ? replayer_->open_connections() : 0)
    << ",\"peers\":[";
  for (int r = 0; r < n_; r++) {
    if (r) o << ",";
    o << "{\"id\":" << r << ",\"match\":" << core_->PeerMatch(r)
      << ",\"stream\":" << (core_->PeerReady(r) ? "true" : "false") << "}";
  }
  o << "]}";
  return o.str();
}

// Proposals in flight get an answer now: their outcome is unknown (they may
// still commit later), which is what the client is told.
void Daemon::FailWaiters(const std::string& why) {
  for (auto& w : waiters_) {
    if (!w.conn) continue;
    ByteWriter out;
    out.u8(0);
    out.u64(w.index);
    out.bytes(why);
    w.conn->Queue(FrameKind::kProposeResult, out.str());
  }
  waiters_.clear();
}

void Daemon::ReplyWaiters(uint64_t now) {
  uint64_t durable = core_->durable_index();
  for (auto& w : waiters_)
    if (!w.durable_us && w.index <= durable) w.durable_us = now;
  uint64_t commit = core_->commit_index();
  while (!waiters_.empty() && waiters_.front().index <= commit) {
    Waiter w = waiters_.front();
    waiters_.pop_front();
    if (!w.conn) continue;
    const Entry* e = core_->At(w.index);
    ByteWriter out;
    if (!e || e->ballot != w.ballot) {  // the slot was decided under another ballot
      out.u8(0);
      out.u64(w.index);
      out.bytes("leadership changed before commit; outcome unknown");
      w.conn->Queue(FrameKind::kProposeResult, out.str());
      continue;
    }
    uint64_t durable_at = w.durable_us ? w.durable_us : now;
    out.u8(1);
    out.u64(w.index);
    out.bytes("");
    out.f64(static_cast<double>(now - w.proposed_us));         // commit latency
    out.f64(static_cast<double>(durable_at - w.proposed_us));  // own durable write
    out.f64(static_cast<double>(now - durable_at));            // waiting for the quorum
    w.conn->Queue(FrameKind::kProposeResult, out.str());
  }
}

// ---------------------------------------------------------------- memory, disk

void Daemon::EnsureRegion() {
  // The backup reads only the region of the (ballot, stream) it promised.
  Ballot b = core_->promised();
  uint64_t s = core_->stream_id();
  if (!own_regions_.empty() && own_regions_.back().ballot == b &&
      own_regions_.back().stream_id == s)
    return;
  if (core_->role() != Role::kBackup || BallotLeader(b) == me_.id || b == 0) {
    reader_.reset();
    return;
  }
  UcxTransport::LocalRegion* region = TakeSpareRegion();
  if (!region) return;
  own_regions_.push_back(OwnRegion{b, s, region});
  while (own_regions_.size() > 3) {  // older streams are never read again
    // Never unmapped: over UCX's tcp transport puts are not checked against
    // any key at the target, so a deposed leader could still write to these
    // addresses. They are zeroed and reused; the reader's ballot, position
    // and checksum checks keep any late write out of the log.
    recycled_regions_.push_back(own_regions_.front().region);
    own_regions_.pop_front();
  }
  reader_ = std::make_unique<RingReader>(region->base + kControlBytes, cfg_.ring_bytes);
  last_control_ = ControlWord{};
}

// Mapping a region costs milliseconds (allocation, zeroing, registration):
// too slow for the path of an election. Fresh, never-shared regions are
// prepared while the loop is idle and taken from here.
UcxTransport::LocalRegion* Daemon::TakeSpareRegion() {
  if (spare_regions_.empty()) MapSpareRegion();
  if (spare_regions_.empty()) return nullptr;
  auto* r = spare_regions_.front();
  spare_regions_.pop_front();
  return r;
}

bool Daemon::MapSpareRegion() {
  if (!recycled_regions_.empty()) {
    auto* r = recycled_regions_.front();
    recycled_regions_.pop_front();
    memset(r->base, 0, r->size);
    spare_regions_.push_back(r);
    return true;
  }
  std::string err;
  uint64_t t0 = NowUs();
  auto* region = ucx_->MapRegion(kControlBytes + cfg_.ring_bytes, &err);
  if (!region) {
    Log("cannot map a log region of %lu bytes: %s",
        (unsigned long)(kControlBytes + cfg_.ring_bytes), err.c_str());
    return false;
  }
  if (opt_.verbose) Log("mapped a spare log region in %lu us", (unsigned long)(NowUs() - t0));
  spare_regions_.push_back(region);
  return true;
}

bool Daemon::PollMemory(uint64_t now) {
  bool busy = false;
  if (core_->role() == Role::kLeader) {
    for (int r = 0; r < n_; r++) {
      if (r == me_.id) continue;
      AckWord w;
      if (!ReadAck(ack_region_->base + r * kAckSlotBytes, &w)) continue;
      if (memcmp(&w, &last_ack_[r], sizeof w) == 0) continue;
      last_ack_[r] = w;
      core_->OnAck(now, r, w);
      busy = true;
    }
    return busy;
  }
  if (!reader_ || own_regions_.empty()) return false;
  const OwnRegion& cur = own_regions_.back();
  if (cur.ballot != core_->promised() || cur.stream_id != core_->stream_id()) return false;
  ControlWord cw;
  if (ReadControl(cur.region->base, &cw) && memcmp(&cw, &last_control_, sizeof cw) != 0) {
    last_control_ = cw;
    core_->OnControl(now, cw);
    busy = true;
  }
  DecodedRecord rec;
  for (int i = 0; i < 1024 && reader_ && reader_->Peek(&rec); i++) {
    Entry e;
    e.index = rec.header.index;
    e.ballot = rec.header.ballot;
    e.type = static_cast<EntryType>(rec.header.type);
    e.payload.assign(rec.payload.data(), rec.payload.size());
    reader_->Consume(rec);
    core_->OnRecord(now, cur.ballot, cur.stream_id, e, rec.header.commit_index, reader_->pos());
    busy = true;
    if (core_->stream_id() != cur.stream_id) break;  // the core asked for a fresh stream
  }
  return busy;
}

bool Daemon::PollDisk(uint64_t now) {
  bool busy = false;
  if (!memory_completions_.empty()) {
    for (uint64_t seq : memory_completions_) core_->OnPersisted(now, seq);
    memory_completions_.clear();
    busy = true;
  }
  if (!writer_) return busy;
  DiskWriter::Completion c = writer_->Poll();
  if (!c.error.empty() && c.error != disk_error_) {
    disk_error_ = c.error;
    Log("DURABLE WRITE FAILED: %s. New proposals are refused; nothing acknowledged is lost.",
        c.error.c_str());
    FailWaiters("not committed: this replica cannot write its log (" + c.error +
                "); outcome unknown");
  }
  if (c.error.empty() && !disk_error_.empty()) {
    Log("durable writes work again");
    disk_error_.clear();
  }
  if (c.durable_seq > durable_seq_seen_) {
    durable_seq_seen_ = c.durable_seq;
    core_->OnPersisted(now, c.durable_seq);
    busy = true;
  }
  return busy;
}

// ---------------------------------------------------------------- carrying out

void Daemon::SendToPeer(Message& m) {
  if (m.to < 0 || m.to >= n_ || m.to == me_.id) return;
  FrameConn* c = outbound_[m.to];
  if (opt_.verbose)
    Log("-> %s to %d ballot %s stream %lu%s", MessageTypeName(m.type), m.to,
        BallotString(m.ballot).c_str(), (unsigned long)m.stream_id,
        c ? "" : " (not connected: dropped)");
  if (!c) return;  // not connected: the protocol tolerates a lost message
  TransportBlob blob;
  blob.worker_address = ucx_->WorkerAddress();
  if (m.type == Message::Type::kPrepare || m.type == Message::Type::kHeartbeat) {
    blob.region_addr = ack_region_->remote_addr;
    blob.region_rkey = ack_region_->packed_rkey;
    blob.region_size = ack_region_->size;
  } else if (m.type == Message::Type::kPromise || m.type == Message::Type::kJoin) {
    const OwnRegion* found = nullptr;
    for (const auto& r : own_regions_)
      if (r.ballot == m.ballot && r.stream_id == m.stream_id) found = &r;
    if (!found) return;  // superseded by a newer stream
    blob.region_addr = found->region->remote_addr;
    blob.region_rkey = found->region->packed_rkey;
    blob.region_size = found->region->size;
  }
  m.transport = EncodeBlob(blob);
  c->Queue(FrameKind::kPeerMessage, EncodeMessage(m));
  std::string err;
  if (!c->Flush(&err)) {
    CloseConn(c, err);
  } else if (c->WantsWrite()) {
    Watch(c->fd(), true);
  }
}

bool Daemon::Drain(uint64_t now) {
  bool busy = DrainOnce(now);
  // Memory durability: "written" at once, so acks and commits go out in the
  // same pass instead of the next.
  for (int pass = 0; pass < 2 && !memory_completions_.empty(); pass++) {
    for (uint64_t seq : memory_completions_) core_->OnPersisted(now, seq);
    memory_completions_.clear();
    busy |= DrainOnce(now);
  }
  return busy;
}

bool Daemon::DrainOnce(uint64_t now) {
  Ready rd = core_->TakeReady();
  EnsureRegion();
  bool busy = !rd.empty();
  std::string err;
  for (auto& put : rd.puts) {
    RemoteRegion& rr = remote_region_[put.to];
    if (rr.remote < 0 || rr.ballot != put.ballot || rr.stream_id != put.stream_id) continue;
    if (!ucx_->Put(rr.remote, put.offset, put.bytes.data(), put.bytes.size(), &err)) {
      Log("put to replica %d failed: %s", put.to, err.c_str());
      continue;
    }
    ring_peer_[put.to] = true;
  }
  for (auto& cop : rd.controls) {
    RemoteRegion& rr = remote_region_[cop.to];
    if (rr.remote < 0 || rr.ballot != cop.word.ballot || rr.stream_id != cop.word.stream_id)
      continue;
    if (ucx_->Put(rr.remote, 0, &cop.word, sizeof cop.word, &err)) ring_peer_[cop.to] = true;
  }
  for (auto& a : rd.acks) {
    int remote = remote_ack_[a.to];
    if (remote < 0) continue;
    if (ucx_->Put(remote, static_cast<size_t>(me_.id) * kAckSlotBytes, &a.word, sizeof a.word,
                  &err))
      ring_peer_[a.to] = true;
  }
  for (int r = 0; r < n_; r++) {
    if (!ring_peer_[r]) continue;
    ring_peer_[r] = false;
    if (ucx_peer_[r] >= 0) ucx_->Ring(ucx_peer_[r], 0, &err);
  }
  // Durable writes last: the puts above are already on their way to the
  // backups, whose writes overlap ours. Everything the core produced since
  // the last write forms one batch, and the disk thread merges whatever
  // queued while it wrote (group commit without a timer).
  for (auto& p : rd.persists) {
    if (memory_mode_) {
      memory_completions_.push_back(p.seq);
      continue;
    }
    std::vector<OwnedRecord> batch;
    if (p.promise)
      batch.push_back(OwnedRecord{EntryType::kPromise, p.promise, 0, p.commit_index, ""});
    for (auto& e : p.entries)
      batch.push_back(OwnedRecord{e.type, e.ballot, e.index, p.commit_index, std::move(e.payload)});
    // The leader hands its writes to the disk thread, so its loop keeps
    // putting heartbeats, acks and proposals while the disk works (16
    // clients: ~20-30% more commits per second), except a lone proposal with
    // nothing else in flight, which it writes here and saves the hand-off.
    // A backup writes here whenever the disk thread is idle: its ack waits
    // on this write anyway. A write here that takes long (tens of ms on a
    // busy disk) only restarts this replica's election timer (OnLocalStall);
    // the election timeout (30-60 ms by default) covers the leader's.
    bool leader_async =
        core_->role() == Role::kCandidate ||
        (core_->role() == Role::kLeader &&
         !(p.entries.size() == 1 && core_->commit_index() + 1 == p.entries[0].index));
    if (p.truncate_below || !disk_error_.empty() || leader_async)
      writer_->Submit(p.seq, std::move(batch), p.truncate_below);
    else if (writer_->WriteNow(p.seq, std::move(batch)) && opt_.verbose) {
      write_us_sum_ += writer_->Poll().last_write_us;
      write_count_++;
    }
  }
  for (auto& m : rd.messages) SendToPeer(m);
  if (rd.lost_leadership)
    FailWaiters("leadership lost before commit; outcome unknown (retry at the new leader)");
  if (core_->role() == Role::kBackup && core_->stream_id() != last_stream_) {
    if (last_stream_ && core_->promised() == last_ballot_)
      Log("stream of ballot %s broke; asked the leader for a fresh one",
          BallotString(core_->promised()).c_str());
    last_stream_ = core_->stream_id();
  }
  if (core_->role() != last_role_ || core_->promised() != last_ballot_) {
    if (shim_) {
      bool leading = core_->role() == Role::kLeader;
      shim_->SetLeader(leading);
      // A new leader closes the connections it did not accept: their clients
      // talked to another replica's server. It does so once everything that
      // may still commit from before its election is applied.
      close_old_pending_ = leading;
      close_old_after_ = core_->last_index();
    }
    if (core_->role() == Role::kLeader)
      Log("leader of ballot %s (commit index %lu, log end %lu)",
          BallotString(core_->promised()).c_str(), (unsigned long)core_->commit_index(),
          (unsigned long)core_->last_index());
    else if (core_->role() == Role::kCandidate)
      Log("candidate for ballot %s (%s)", BallotString(core_->promised()).c_str(),
          core_->last_leader_contact_us()
              ? ("leader last heard " +
                 std::to_string((NowUs() - core_->last_leader_contact_us()) / 1000) + " ms ago")
                    .c_str()
              : "no live leader known");
    else
      Log("backup, promised ballot %s", BallotString(core_->promised()).c_str());
    last_role_ = core_->role();
    last_ballot_ = core_->promised();
  }
  ReplyWaiters(now);
  // Flush client replies.
  for (auto it = conns_.begin(); it != conns_.end();) {
    FrameConn* c = it->second.get();
    ++it;
    if (c->role == "client" && c->WantsWrite()) {
      if (!c->Flush(&err)) {
        CloseConn(c, err);
      } else if (c->WantsWrite()) {
        Watch(c->fd(), true);
      }
    }
  }
  return busy;
}

// ---------------------------------------------------------------- the server

bool Daemon::StartServer() {
  std::string err;
  uint64_t max_chunk = std::min<uint64_t>(256 << 10, core_->max_payload() - kInputHeader - 64);
  shim_ = std::make_unique<ShimChannel>();
  if (!shim_->Create(static_cast<uint32_t>(max_chunk), &err)) {
    Log("cannot set up the channel to the server's shim: %s", err.c_str());
    return false;
  }
  // The server starts empty and is refilled from the log, so nothing from a
  // previous run may survive in its data directory.
  std::string dir = me_.dir + "/server";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  // Split first, then substitute: a data directory with spaces stays one argument.
  std::vector<std::string> argv;
  if (!SplitCommand(cfg_.server.command, &argv, &err)) {
    Log("server command: %s", err.c_str());
    return false;
  }
  for (auto& a : argv) a = SubstituteCommand(a, me_.server_port, dir);
  std::string cmd = JoinCommand(argv);
  server_ = std::make_unique<ServerProcess>();
  if (!server_->Start(argv, dir, me_.dir + "/server.log", shim_->ServerEnv(me_.server_port),
                      shim_->ServerFds(), &err)) {
    Log("cannot start the server: %s", err.c_str());
    return false;
  }
  if (!server_->WaitReady(me_.host, me_.server_port, cfg_.server.ready_timeout_ms, &err)) {
    Log("%s", err.c_str());
    return false;
  }
  if (!shim_->shim_attached()) {
    Log("the preload shim did not attach to the server (a static binary, or LD_PRELOAD "
        "removed?): its inputs would not be agreed, so this replica stops");
    return false;
  }
  replayer_ = std::make_unique<Replayer>(
      shim_.get(), me_.host, me_.server_port,
      [this](int fd, bool, bool writable) { Watch(fd, writable); },
      [this](const std::string& m) { Log("%s", m.c_str()); });
  Watch(shim_->wake_daemon_fd(), false);
  Log("server up (pid %d) on %s:%d: %s", server_->pid(), me_.host.c_str(), me_.server_port,
      cmd.c_str());
  return true;
}

// A new leader's server must first execute everything committed before its
// election, in order, or a client would read stale data (or INCR a stale
// counter): until then the shim's inputs wait in the ring (its accept waits
// for the outcome). The connections of earlier leaders are closed first.
bool Daemon::ReadyToServe() {
  if (serving_ballot_ == core_->promised()) return true;
  if (close_old_pending_ || applied_ < close_old_after_ || !replayer_->Idle()) return false;
  serving_ballot_ = core_->promised();
  Log("serving clients: the server has executed the log up to index %lu", (unsigned long)applied_);
  return true;
}

// Hands the shim's inputs to the log (leader), or refuses them.
bool Daemon::ProcessSubmissions(uint64_t now) {
  if (!shim_) return false;
  holding_submissions_ = core_->role() == Role::kLeader && !ReadyToServe();
  if (holding_submissions_) return false;
  bool did = false;
  bool leading = core_->role() == Role::kLeader && disk_error_.empty();
  // Bounded per pass (heartbeats go out between passes) and in flight (a
  // client streaming megabytes must not queue the whole stream in memory).
  uint64_t budget_bytes = 1 << 20;
  ShimChannel::Submission s;
  while (budget_bytes > 0 && shim_->Peek(&s)) {
    if (leading && core_->last_index() - core_->commit_index() >= kMaxInputsInFlight) {
      holding_submissions_ = true;  // sleep until commits make room, do not spin on them
      break;
    }
    budget_bytes -= std::min<uint64_t>(budget_bytes, s.bytes.size() + 64);
    did = true;
    bool ok = false;
    if (leading) {
      ConnKey key{core_->promised(), s.conn};
      if (s.kind == LS_SUB_ACCEPT) {
        own_conns_[s.conn] = key;
        ok = true;
      } else {
        auto it = own_conns_.find(s.conn);
        ok = it != own_conns_.end() && !broken_own_.count(s.conn);
        if (ok) key = it->second;
      }
      if (ok) {
        ProposeResult r =
            core_->Propose(now, EntryType::kInput, EncodeInput(s.kind, key, s.seq, s.bytes));
        ok = r.ok;
        if (ok) own_pending_[r.index] = OwnPending{s.seq, s.conn, s.kind, now};
      }
    }
    if (!ok) {
      shim_->Complete(LS_DONE_DROPPED, s.seq, s.conn);
      if (s.kind != LS_SUB_ACCEPT) broken_own_.insert(s.conn);
      if (s.kind == LS_SUB_ACCEPT) own_conns_.erase(s.conn);
    }
    shim_->Pop();
  }
  return did;
}

bool Daemon::OwnConn(const ConnKey& k) const {
  auto it = own_conns_.find(k.no);
  return it != own_conns_.end() && it->second == k;
}

// Hands committed entries, in log order, to the server: our own shim's
// inputs are released to it, everyone else's are replayed over TCP.
bool Daemon::ApplyCommitted(uint64_t now) {
  if (!shim_) return false;
  bool did = false;
  uint64_t commit = core_->commit_index();
  // Bounded per pass, so that a replica replaying a long log (after a
  // restart) still answers heartbeats in between.
  uint64_t budget_bytes = 4 << 20;
  for (int n = 0; applied_ < commit && n < 1024 && budget_bytes > 0; n++) {
    uint64_t i = applied_ + 1;
    const Entry* e = core_->At(i);
    if (!e) {
      if (i < core_->first_index()) {
        if (!truncated_warned_)
          Log("cannot replay entries %lu..%lu: the log was truncated; this replica's server "
              "misses them",
              (unsigned long)i, (unsigned long)core_->first_index() - 1);
        truncated_warned_ = true;
        applied_ = core_->first_index() - 1;
        continue;
      }
      break;
    }
    budget_bytes -= std::min<uint64_t>(budget_bytes, e->payload.size());
    Input in;
    bool is_input = e->type == EntryType::kInput && DecodeInput(e->payload, &in);
    auto pend = own_pending_.find(i);
    if (pend != own_pending_.end()) {
      const OwnPending& p = pend->second;
      bool ours = is_input && in.seq == p.seq && in.key.no == p.conn && OwnConn(in.key);
      shim_->Complete(ours ? LS_DONE_COMMITTED : LS_DONE_DROPPED, p.seq, p.conn);
      if (ours) {
        inputs_committed_++;
        input_commit_us_sum_ += static_cast<double>(now - p.proposed_us);
      }
      if (!ours && p.kind != LS_SUB_ACCEPT) broken_own_.insert(p.conn);
      own_pending_.erase(pend);
    }
    if (is_input) {
      bool own = OwnConn(in.key);
      switch (in.kind) {
        case LS_SUB_ACCEPT:
          open_conns_.insert(in.key);
          if (!own) replayer_->Accept(in.key);
          break;
        case LS_SUB_DATA:
          if (!own) replayer_->Data(in.key, in.bytes);
          break;
        case LS_SUB_CLOSE:
          open_conns_.erase(in.key);
          closing_.erase(in.key);
          if (own) {
            if (in.seq == 0) shim_->Complete(LS_DONE_CLOSE, 0, in.key.no);
            own_conns_.erase(in.key.no);
            broken_own_.erase(in.key.no);
          } else {
            replayer_->Close(in.key);
          }
          break;
      }
    }
    applied_ = i;
    did = true;
  }
  if (close_old_pending_ && core_->role() == Role::kLeader && applied_ >= close_old_after_) {
    close_old_pending_ = false;
    for (const ConnKey& k : open_conns_) {
      if (k.ballot == core_->promised() || closing_.count(k)) continue;
      if (core_->Propose(now, EntryType::kInput, EncodeInput(LS_SUB_CLOSE, k, 0, "")).ok)
        closing_.insert(k);
    }
    did = true;
  }
  uint64_t t_entries = NowUs();
  did |= replayer_->Pump(now);
  uint64_t t_pumped = NowUs();
  did |= shim_->Flush();
  uint64_t t_flushed = NowUs();
  if (t_flushed - now > 5000)
    Log("slow apply: entries %lu us, replay %lu us, outcomes %lu us (applied %lu, queued %lu)",
        (unsigned long)(t_entries - now), (unsigned long)(t_pumped - t_entries),
        (unsigned long)(t_flushed - t_pumped), (unsigned long)applied_,
        (unsigned long)replayer_->queued());
  if (now >= next_input_report_us_) {
    if (inputs_committed_)
      Log("%lu client inputs committed in the last 10 s, mean %.0f us from proposal to commit",
          (unsigned long)inputs_committed_, input_commit_us_sum_ / inputs_committed_);
    inputs_committed_ = 0;
    input_commit_us_sum_ = 0;
    next_input_report_us_ = now + 10000000;
  }
  return did;
}

// ---------------------------------------------------------------- the loop

// The daemon's threads run at a higher priority than the server and its
// clients (nice -10; the server, started before this, keeps the default):
// on a machine where they share a few cores, a daemon left off the CPU for
// longer than the election timeout looks dead to its peers. The daemon
// sleeps whenever it has nothing to do, so it takes little from the others.
// Without the privilege to do so it runs at the default priority.
// (SCHED_FIFO was tried: no late wake-ups at all, but under a 16-connection
// disk load throughput fell from ~11K to ~6K inputs/s and p50 rose.)
void RaisePriority() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    int tid = atoi(e->d_name);
    if (tid > 0) setpriority(PRIO_PROCESS, static_cast<id_t>(tid), -10);
  }
  closedir(d);
}

int Daemon::Run() {
  if (!Init()) {
    stopping_ = true;
    if (connector_.joinable()) connector_.join();
    return 1;
  }
  RaisePriority();
  uint64_t last_busy = NowUs();
  bool may_sleep = false;
  epoll_event evs[64];
  while (!stopping_) {
    // Sockets first, so that after any stall the messages that arrived
    // (heartbeats among them) are seen before the election timer is checked.
    int n;
    if (may_sleep) {
      timespec ts{0, static_cast<long>(cfg_.heartbeat_us * 1000)};
      uint64_t t0 = NowUs();
      n = epoll_pwait2(epfd_, evs, 64, &ts, nullptr);
      if (NowUs() - t0 > 5000)
        Log("slept %lu us (asked for %lu)", (unsigned long)(NowUs() - t0),
            (unsigned long)cfg_.heartbeat_us);
      if (shim_) shim_->Awake();
    } else {
      n = epoll_wait(epfd_, evs, 64, 0);
    }
    uint64_t woke = NowUs();
    HandleEvents(evs, n, &last_busy);
    uint64_t now = NowUs();
    if (now - woke > 5000 && now >= next_slow_log_us_) {
      next_slow_log_us_ = now + 1000000;
      Log("slow pass: %lu us handling %d socket events", (unsigned long)(now - woke), n);
    }
    if (prev_pass_us_ && woke - prev_pass_us_ > 10000 + cfg_.heartbeat_us) {
      Log("not scheduled for %lu us", (unsigned long)(woke - prev_pass_us_));
    }
    bool progressed = ucx_->Progress();
    bool polled = PollMemory(now);
    bool disk = PollDisk(now);
    uint64_t t_polled = NowUs();
    // This loop itself did not run for a while (a long write, the
    // scheduler): the silence it saw meanwhile is its own, not the leader's.
    if (prev_pass_us_ && now - prev_pass_us_ > cfg_.election_timeout_min_us / 2)
      core_->OnLocalStall(now);
    core_->Tick(now);
    bool submitted = ProcessSubmissions(now);
    uint64_t t_submitted = NowUs();
    bool drained = Drain(now);
    uint64_t t_drained = NowUs();
    bool applied = ApplyCommitted(now);
    uint64_t t_applied = NowUs();
    prev_pass_us_ = t_applied;
    if (t_applied - now > 5000 && t_applied >= next_slow_log_us_) {
      next_slow_log_us_ = t_applied + 1000000;
      Log("slow pass: %lu us (polls %lu, submissions %lu, drain %lu, apply %lu)",
          (unsigned long)(t_applied - now), (unsigned long)(t_polled - now),
          (unsigned long)(t_submitted - t_polled), (unsigned long)(t_drained - t_submitted),
          (unsigned long)(t_applied - t_drained));
    }
    bool busy = progressed || polled || disk || drained || submitted || applied;
    if (server_ && now >= next_server_check_us_) {
      next_server_check_us_ = now + 100000;
      std::string how;
      if (server_->Exited(&how)) {
        Log("the server %s; this replica stops (lockstep cluster restart --id %d starts it again)",
            how.c_str(), me_.id);
        exit_code_ = 1;
        stopping_ = true;
      }
    }
    if (opt_.verbose) {
      stats_[0]++;
      stats_[1] += progressed;
      stats_[2] += polled;
      stats_[3] += disk;
      stats_[4] += drained;
      stats_[5] += may_sleep;
      if (now >= next_stats_us_) {
        Log("loop: %lu passes, progress %lu, memory %lu, disk %lu, drain %lu, sleeps %lu; "
            "%lu inline writes, mean %.1f us",
            (unsigned long)stats_[0], (unsigned long)stats_[1], (unsigned long)stats_[2],
            (unsigned long)stats_[3], (unsigned long)stats_[4], (unsigned long)stats_[5],
            (unsigned long)write_count_, write_count_ ? write_us_sum_ / write_count_ : 0.0);
        write_us_sum_ = 0;
        write_count_ = 0;
        for (auto& v : stats_) v = 0;
        next_stats_us_ = now + 1000000;
      }
    }
    if (busy) last_busy = now;
    may_sleep = false;
    if (busy || now - last_busy <= cfg_.spin_us) {
      if (!busy) sched_yield();  // spinning: let the other replicas run
      continue;
    }
    if (spare_regions_.size() < kSpareRegions && now >= next_spare_try_us_) {
      // Idle: prepare for the next promise (after a failure, retry later).
      if (!MapSpareRegion()) next_spare_try_us_ = now + 1000000;
      if (NowUs() - now > 5000)
        Log("mapping a spare region took %lu us", (unsigned long)(NowUs() - now));
      continue;
    }
    if (shim_ && !shim_->PrepareSleep(holding_submissions_, replayer_ && replayer_->Gated()))
      continue;               // work arrived meanwhile
    may_sleep = ucx_->Arm();  // false: UCX has events pending, go round again
    if (!may_sleep && shim_) shim_->Awake();
  }
  connector_.join();
  server_.reset();  // stops the server
  writer_.reset();  // drains pending durable writes
  Log("stopped (commit index %lu)", (unsigned long)core_->commit_index());
  return exit_code_;
}

void Daemon::HandleEvents(epoll_event* evs, int n, uint64_t* last_busy) {
  for (int i = 0; i < n; i++) {
    int fd = evs[i].data.fd;
    if (fd == sigfd_) {
      signalfd_siginfo si;
      while (read(sigfd_, &si, sizeof si) == sizeof si) {
        Log("signal %u: shutting down", si.ssi_signo);
        stopping_ = true;
      }
    } else if (fd == peer_listen_) {
      AcceptOn(fd, "peer");
    } else if (fd == client_listen_) {
      AcceptOn(fd, "client");
    } else if (fd == connected_efd_) {
      uint64_t v;
      (void)!read(connected_efd_, &v, 8);
      std::vector<std::pair<int, int>> got;
      {
        std::lock_guard<std::mutex> g(connected_mu_);
        got.swap(connected_);
      }
      for (auto [r, cfd] : got) {
        auto c = std::make_unique<FrameConn>(cfd);
        c->role = "outbound";
        c->authenticated = true;
        c->peer_id = r;
        outbound_[r] = c.get();
        Watch(cfd, false);
        conns_[cfd] = std::move(c);
      }
    } else if (shim_ && fd == shim_->wake_daemon_fd()) {
      shim_->Awake();
    } else if (replayer_ && replayer_->Owns(fd)) {
      replayer_->OnEvent(fd, evs[i].events);
      *last_busy = NowUs();
    } else if (fd == ucx_->EventFd() || (writer_ && fd == writer_->EventFd())) {
      // Handled by the polls at the top of the loop.
    } else {
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      FrameConn* c = it->second.get();
      if (evs[i].events & EPOLLOUT) {
        std::string err;
        if (!c->Flush(&err)) {
          CloseConn(c, err);
          continue;
        }
        if (!c->WantsWrite()) Watch(fd, false);
      }
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (c->role == "outbound") {
          char buf[256];
          ssize_t r = read(fd, buf, sizeof buf);
          if (r == 0 || (r < 0 && errno != EAGAIN)) CloseConn(c, "peer closed");
        } else {
          OnConnReadable(c);
        }
      }
      *last_busy = NowUs();
    }
  }
}

}  // namespace

int RunReplica(const DaemonOptions& options) {
  if (options.id < 0 || options.id >= static_cast<int>(options.config.replicas.size())) {
    fprintf(stderr, "lockstep replica: --id %d is not in %s (replicas 0..%zu)\n", options.id,
            options.config.path.c_str(), options.config.replicas.size() - 1);
    return 2;
  }
  Daemon d(options);
  return d.Run();
}

}  // namespace lockstep
