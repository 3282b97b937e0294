// daemon.cc — one replica: the protocol core and the rooms around it.
//
// One thread runs the loop (event_loop.h). Each pass polls memory for what
// the peers put (peer_link.h), the disk writer's completions and the
// sockets (front_door.h), feeds what it finds to the core, hands the
// server's inputs to the log and committed entries to the server
// (server_pipeline.h), and carries out what the core asks (TakeReady). The
// durable writes go out through io_uring from this loop and complete on an
// eventfd it watches (DiskWriter); a second thread, the writer's, takes
// what the ring cannot (a new segment, a truncation, retries), a third
// opens outbound connections to peers.
//
// This file owns the core, the durable log and the rooms, recovers the log
// at start, and carries out the core's Ready: the durable writes here, the
// rest through the rooms.
#include "guard/daemon/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "consensus/assert.h"
#include "consensus/core.h"
#include "consensus/disk_log.h"
#include "guard/common/event_loop.h"
#include "guard/common/json.h"
#include "guard/common/replica_log.h"
#include "guard/daemon/daemon_metrics.h"
#include "guard/daemon/failpoints.h"
#include "guard/daemon/front_door.h"
#include "guard/daemon/leader_address.h"
#include "guard/daemon/peer_link.h"
#include "guard/net/client.h"
#include "guard/net/metrics_server.h"
#include "guard/net/netns_hosts.h"
#include "guard/output/output_guard.h"
#include "guard/server/server_pipeline.h"
#include "guard/server/state_check.h"

namespace lockstep {

namespace {

constexpr uint64_t kTruncateCheckUs = 1000000;
constexpr auto kPeerCheckpointPoll = std::chrono::seconds(2);
constexpr int kArmTries = 4;  // arms refused in a row before a sleep gives way to a pass

class Daemon : public EventLoop::Body {
 public:
  explicit Daemon(const DaemonOptions& o)
      : opt_(o), cfg_(WithRoomForEveryId(o.config)), me_(cfg_.replicas[o.id]), log_(me_.id) {}
  int Run();

  // EventLoop::Body
  void OwnGap(uint64_t now, uint64_t gap_us) override;
  PassReport Pass(uint64_t now) override;
  bool IdleWork(uint64_t now) override { return peer_->PrepareSpareRegion(now); }
  bool PrepareSleep() override;
  void Awake() override { pipeline_->Awake(); }

 private:
  // The address book (cfg_.replicas) grows in place, on the loop thread, when
  // the log adds a replica; the rooms and threads that hold cfg_ read an
  // entry only below the count they were told (FrontDoor::KnowReplicas), and
  // the capacity reserved here means no entry ever moves.
  static ClusterConfig WithRoomForEveryId(ClusterConfig c) {
    c.replicas.reserve(kMaxMemberIds);
    return c;
  }
  void LearnAddresses(uint64_t now);
  void NoteMemberState();
  bool Init();
  bool RecoverLog(DurableState* state);
  void OnPeerMessage(Message m);
  bool PollDisk(uint64_t now);
  bool Drain(uint64_t now);
  bool DrainOnce(uint64_t now);
  void Persist(std::vector<PersistOp>& persists);
  void NoteRoleChange();
  void SampleMetrics(uint64_t now);
  void TruncateLog(uint64_t now);
  FailpointReply SetFailpoint(const std::string& text);

  DaemonOptions opt_;
  ClusterConfig cfg_;
  const ReplicaConfig& me_;
  ReplicaLog log_;
  // Before everything that updates it (the disk writer's thread observes
  // its writes), so that it goes last.
  std::unique_ptr<DaemonMetrics> metrics_;
  std::atomic<int> n_{0};  // replicas with an address: cfg_.replicas[0..n_-1]
  uint64_t next_address_look_us_ = 0;
  Membership last_membership_;  // NoteMemberState's (voters 0: none yet)
  bool last_membership_committed_ = true;
  bool memory_mode_ = false;
  std::unique_ptr<Replica> core_;
  std::unique_ptr<DiskLog> disk_;
  std::unique_ptr<DiskWriter> writer_;
  std::string disk_error_;
  uint64_t durable_seq_seen_ = 0;  // the disk writer's completions already given to the core
  uint64_t ring_writes_seen_ = 0;  // ... and its ring writes already counted in the metrics
  bool ring_given_up_logged_ = false;
  uint64_t last_persist_seq_ = 0;  // the core numbers its persists in increasing order
  std::vector<uint64_t> memory_completions_;

  // The rooms; the loop first, since the others register fds with it.
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<PeerLink> peer_;
  std::unique_ptr<FrontDoor> front_;
  std::unique_ptr<ServerPipeline> pipeline_;
  std::unique_ptr<OutputGuard> output_;            // with a server only
  std::unique_ptr<StateChecker> state_;            // with a profile's state_probe only
  std::unique_ptr<LeaderAddress> leader_address_;  // cluster.toml's leader_address, if any
  std::unique_ptr<MetricsServer> metrics_server_;  // cluster.toml's metrics_port, if any

  // When each peer last had a live stream from us (leader): a peer gone
  // longer than kPeerGraceUs no longer holds back the truncation of the log.
  std::vector<uint64_t> peer_live_us_;
  std::vector<uint64_t> peer_match_seen_;
  uint64_t next_truncate_us_ = 0;
  uint64_t local_stalls_ = 0;  // OnLocalStall calls, for the log
  uint64_t next_stall_log_us_ = 0;
  // The newest checkpoint each peer holds, asked every 2 s while we lead (a
  // thread: blocking status requests): the leader's log below one of them
  // can go, since a backup lacking it fetches that checkpoint instead.
  void PollPeerCheckpoints();
  std::thread peer_poll_;
  std::atomic<bool> leading_{false}, stop_poll_{false};
  std::array<std::atomic<uint64_t>, kMaxMemberIds> peer_checkpoint_{};

  // Failpoints (guard/daemon/failpoints.h): only with failpoints = true in
  // cluster.toml or LOCKSTEP_FAILPOINTS=1.
  bool failpoints_allowed_ = false;
  MessageFaults message_faults_;

  Role last_role_ = Role::kBackup;
  Ballot last_ballot_ = 0;
  uint64_t last_stream_ = 0;
  int exit_code_ = 0;
};

// Stream ids must grow across restarts of a replica: the leader ignores a
// join whose stream id is not above the last one it saw from that replica,
// and a restarted backup would ask for a stream forever. The incarnation
// (the ids' upper half) is the larger of a quarter-second clock (it covers
// a replica whose directory was wiped) and one past the last run's, kept in
// DIR/incarnation (it covers restarts within the same quarter second; a
// clock at (time(nullptr) << 8 | microseconds) did not: two starts in one
// second went down half the time).
uint64_t NextIncarnation(const std::string& dir) {
  constexpr uint64_t kEpoch = 1700000000;  // 2023: the clock part lasts past 2090 in 32 bits
  uint64_t clock = (static_cast<uint64_t>(time(nullptr)) - kEpoch) * 4 +
                   static_cast<uint64_t>(NowUs() % 1000000) / 250000;
  uint64_t last = 0;
  std::string path = dir + "/incarnation";
  if (FILE* f = fopen(path.c_str(), "r")) {
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) == 1) last = v;
    fclose(f);
  }
  uint64_t next = std::max(clock, last + 1) & 0xffffffffull;
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    std::string text = std::to_string(next) + "\n";
    bool ok =
        write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
    close(fd);
    if (ok) rename(tmp.c_str(), path.c_str());
  }
  return next;
}

bool Daemon::RecoverLog(DurableState* state) {
  if (memory_mode_) return true;
  DiskLogOptions dopt;
  dopt.dir = me_.dir + "/log";
  dopt.segment_bytes = cfg_.segment_bytes;
  dopt.lock_wait_ms = 5000;  // a SIGKILLed predecessor may still be exiting
  RecoveredLog rec;
  std::string err;
  disk_ = DiskLog::Open(dopt, &rec, &err);
  if (!disk_) {
    log_("cannot open the log in %s: %s", dopt.dir.c_str(), err.c_str());
    return false;
  }
  if (rec.torn_tail)
    log_(
        "log tail was torn by an interrupted write (%s): dropped, never served; the rest comes "
        "from peers",
        rec.problem.c_str());
  if (rec.damaged)
    log_(
        "LOG DAMAGED: %s. The damaged part is refused; this replica recovers it from its peers "
        "and does not vote until it has caught up",
        rec.problem.c_str());
  state->promised = rec.promised;
  state->commit_index = rec.commit_index;
  state->first_index = rec.truncated_below ? rec.truncated_below : 1;
  state->slots = std::move(rec.slots);
  state->damaged = rec.damaged;
  if (!state->slots.empty()) state->first_index = state->slots.front().index;
  if (!rec.truncate_note.empty()) {
    // The configuration the truncated entries made (Replica::TruncateBelow).
    Membership m;
    std::string why = DecodeMembership(rec.truncate_note, &m);
    if (!why.empty()) {
      log_("cannot recover the log in %s: its last truncation's record of the configuration: %s",
           dopt.dir.c_str(), why.c_str());
      return false;
    }
    state->membership = m;
    log_("recovered configuration at the log's start: %s", m.ToString().c_str());
  }
  log_("recovered log: %zu slots from %lu, promised ballot %s, commit index %lu",
       state->slots.size(), (unsigned long)state->first_index, BallotString(rec.promised).c_str(),
       (unsigned long)rec.commit_index);
  DaemonMetrics* m = metrics_.get();
  // LOCKSTEP_NO_IO_URING=1: every write through the disk thread, as before
  // io_uring (to compare the two, or where a sandbox refuses io_uring).
  const char* no_ring = getenv("LOCKSTEP_NO_IO_URING");
  bool use_ring = !(no_ring && *no_ring && strcmp(no_ring, "0") != 0);
  writer_ = std::make_unique<DiskWriter>(
      disk_.get(),
      [m](double us, size_t records, bool ok) {
        if (!ok) return m->disk_write_errors->Add();
        m->disk_write->ObserveUs(static_cast<uint64_t>(us));
        m->log_records->Add(records);
      },
      use_ring);
  if (writer_->ring())
    log_("durable writes: io_uring from the loop, %s", SyncModeName(disk_->mode()));
  else
    log_("durable writes: the disk thread, %s (%s)", SyncModeName(disk_->mode()),
         writer_->ring_problem().c_str());
  return true;
}

bool Daemon::Init() {
  EventLoop::BlockShutdownSignals();  // before any thread starts
  n_ = static_cast<int>(cfg_.replicas.size());
  metrics_ = std::make_unique<DaemonMetrics>(n_, me_.id);
  peer_live_us_.assign(kMaxMemberIds, NowUs());
  peer_match_seen_.assign(kMaxMemberIds, 0);
  memory_mode_ = cfg_.durability == "memory";
  if (mkdir(me_.dir.c_str(), 0755) < 0 && errno != EEXIST) {
    log_("cannot create %s: %s", me_.dir.c_str(), strerror(errno));
    return false;
  }
  DurableState state;
  if (!RecoverLog(&state)) return false;
  const char* fp = getenv("LOCKSTEP_FAILPOINTS");
  failpoints_allowed_ = cfg_.failpoints || (fp && std::string(fp) == "1");
  if (failpoints_allowed_)
    log_("failpoints allowed (%s): an admin may inject faults here",
         cfg_.failpoints ? "failpoints = true in cluster.toml" : "LOCKSTEP_FAILPOINTS=1");

  PeerLink::Options popt;
  popt.id = me_.id;
  popt.replicas = n_;
  popt.transport = cfg_.transport;
  popt.ring_bytes = cfg_.ring_bytes;
  popt.verbose = opt_.verbose;
  PeerLink::Transport transport;
  if (!PeerLink::OpenTransport(popt, log_, &transport)) return false;

  CoreConfig cc;
  cc.id = me_.id;
  cc.replicas = cfg_.voters;  // the log's first configuration; the log says the rest
  cc.ring_bytes = cfg_.ring_bytes;
  cc.heartbeat_us = cfg_.heartbeat_us;
  cc.election_timeout_min_us = cfg_.election_timeout_min_us;
  cc.election_timeout_max_us = cfg_.election_timeout_max_us;
  cc.lease_us = cfg_.lease_us;
  // Backups stalled on the disk they share with the leader, or a VM pause
  // that the leader's loop came out of first, must not make it step down
  // (0.3-0.9 s pauses happen here): 2 s without a majority, at least.
  cc.step_down_min_us = 2000000;
  cc.seed = static_cast<uint64_t>(getpid()) ^ NowUs();
  cc.incarnation = NextIncarnation(me_.dir);
  core_ = std::make_unique<Replica>(cc, std::move(state), NowUs());
  peer_ = std::make_unique<PeerLink>(popt, std::move(transport), *core_, log_);

  EventLoop::Options lopt;
  lopt.heartbeat_us = cfg_.heartbeat_us;
  lopt.spin_us = cfg_.spin_us;
  lopt.verbose = opt_.verbose;
  loop_ = std::make_unique<EventLoop>(lopt, log_);
  FrontDoor::Hooks hooks;
  hooks.on_peer_message = [this](Message m) { OnPeerMessage(std::move(m)); };
  hooks.fill_transport = [this](Message* m) { return peer_->FillTransport(m); };
  hooks.server_status = [this] {
    return ServerStatus{pipeline_->applied(),
                        pipeline_->server_read_all(),
                        pipeline_->server_pid(),
                        pipeline_->replay_connections(),
                        pipeline_->CheckpointStatusJson(NowUs()),
                        output_ ? output_->StatusJson() : Json(),
                        state_ ? state_->StatusJson() : Json(),
                        pipeline_->lease_reads(),
                        pipeline_->lease_misses(),
                        pipeline_->serving()};
  };
  hooks.on_peer_frame = [this](int from, FrameKind kind, std::string_view body) {
    if (output_) output_->OnPeerFrame(from, kind, body, NowUs());
  };
  hooks.divergence = [this](const DivergenceRequest& req) {
    return output_ ? output_->Divergence(req)
                   : std::string(req.op == DivergenceOp::kList ? "[]" : "");
  };
  hooks.failpoint = [this](const std::string& spec) { return SetFailpoint(spec); };
  hooks.serve_checkpoint = [this](std::unique_ptr<Stream> to, uint64_t min_index) {
    pipeline_->ServeCheckpoint(std::move(to), min_index);
  };
  hooks.serve_inspection = [this](std::unique_ptr<Stream> to, const std::string& who,
                                  const std::string& peer, const std::string& program) {
    pipeline_->ServeInspection(std::move(to), who, peer, program);
  };
  hooks.checkpoint = [this](CheckpointOp op) {
    if (op == CheckpointOp::kList) return CheckpointReply{true, pipeline_->CheckpointListJson()};
    std::string why = pipeline_->RequestCheckpoint();
    return CheckpointReply{why.empty(), why};
  };
  front_ = std::make_unique<FrontDoor>(cfg_, me_.id, opt_.verbose, *loop_, *core_, disk_error_,
                                       std::move(hooks), log_);
  front_->CountBytes({metrics_->client_bytes_in, metrics_->client_bytes_out,
                      metrics_->peer_bytes_in, metrics_->peer_bytes_out});
  if (!front_->Listen()) return false;
  if (me_.metrics_port) {
    metrics_server_ =
        std::make_unique<MetricsServer>([this] { return metrics_->registry.Render(); },
                                        [this](const std::string& m) { log_("%s", m.c_str()); });
    std::string err;
    if (!metrics_server_->Start(me_.host, me_.metrics_port, &err)) {
      log_("%s", err.c_str());
      return false;
    }
  }
  // These fds only wake the loop: the pass polls UCX and the disk anyway.
  loop_->Add(peer_->event_fd(), nullptr);
  if (writer_) loop_->Add(writer_->EventFd(), nullptr);
  pipeline_ = std::make_unique<ServerPipeline>(cfg_, me_.id, *loop_, *core_, disk_error_, log_);
  if (cfg_.has_server() && !pipeline_->Start()) return false;
  if (cfg_.has_server())
    output_ =
        std::make_unique<OutputGuard>(cfg_, me_.id, *core_, *pipeline_, log_,
                                      [this](int to, FrameKind kind, const std::string& body) {
                                        return front_->SendFrameToPeer(to, kind, body);
                                      });
  if (cfg_.has_server() && !cfg_.server.state_probe.empty()) {
    state_ = std::make_unique<StateChecker>(
        cfg_, me_, [this](const std::string& m) { log_("%s", m.c_str()); });
    pipeline_->set_probe_port([this] { return state_->probe_port(); });
  }
  if (cfg_.has_server() && !cfg_.leader_address.empty()) {
    leader_address_ = std::make_unique<LeaderAddress>(cfg_.leader_host, cfg_.leader_port, me_.host,
                                                      me_.server_port, cfg_.leader_interface, log_);
  }
  front_->StartConnector();
  peer_poll_ = std::thread([this] { PollPeerCheckpoints(); });
  log_(
      "up: %d replicas (configuration %s), transport %s, durability %s%s, peers on %s:%d, "
      "clients on %s:%d, %s",
      n_.load(), core_->membership().ToString().c_str(), cfg_.transport.c_str(),
      cfg_.durability.c_str(),
      memory_mode_ ? " (NOT durable: a majority holds entries in RAM only)" : "", me_.host.c_str(),
      me_.peer_port, me_.host.c_str(), me_.client_port,
      me_.metrics_port
          ? ("metrics on http://" + me_.host + ":" + std::to_string(me_.metrics_port) + "/metrics")
                .c_str()
          : "no metrics listener (no metrics_port)");
  return true;
}

int Daemon::Run() {
  if (!Init()) {
    if (front_) front_->StopConnector();
    return 1;
  }
  loop_->Run(*this);
  metrics_server_.reset();
  stop_poll_ = true;
  if (peer_poll_.joinable()) peer_poll_.join();
  front_->StopConnector();
  pipeline_->StopServer();
  writer_.reset();  // drains pending durable writes
  log_("stopped (commit index %lu)", (unsigned long)core_->commit_index());
  return exit_code_;
}

// This loop itself did not look for a while (a long durable write in the
// previous pass, the scheduler, the VM stopped): the silence it saw
// meanwhile is its own, not its peers'. Told before the messages that waited
// meanwhile are handled, so that a pre-vote among them is judged with the
// gap already credited. (Every replica blocked at once on the one disk they
// share here was issue 9's leader change under load: the gap was measured
// from the end of the pass that held the write, so the write never counted,
// and a pre-vote that waited through it was granted.)
//
// Only what exceeds the loop's own_gap_us is credited: a replica whose every
// pass is slow (a long catch-up, a starved CPU) still lets most of the time
// count, so it cannot hold off an election for ever, neither its own nor,
// through the pre-votes it refuses, its peers'.
void Daemon::OwnGap(uint64_t now, uint64_t gap_us) {
  core_->OnLocalStall(now, gap_us - std::min(gap_us, loop_->own_gap_us()));
  local_stalls_++;
  metrics_->own_gaps->Add();
  if (gap_us > cfg_.election_timeout_min_us / 2 && now >= next_stall_log_us_) {
    next_stall_log_us_ = now + 1000000;
    log_("own gap of %lu us: not counted against the peers (%lu such gaps so far)",
         (unsigned long)gap_us, (unsigned long)local_stalls_);
  }
}

PassReport Daemon::Pass(uint64_t now) {
  PassReport r;
  r.progressed = peer_->Progress();
  r.polled = peer_->PollMemory(now);
  r.disk = PollDisk(now);
  r.t_polled = NowUs();
  core_->Tick(now);
  LearnAddresses(now);
  r.submitted = pipeline_->ProcessSubmissions(now);
  r.t_submitted = NowUs();
  // Entries appended since the last pass (the front door's proposals, the
  // server's inputs just now) are stamped here; their commit is seen below.
  metrics_->commit_clock.OnAppended(core_->role() == Role::kLeader, core_->last_index(),
                                    r.t_submitted);
  r.drained = Drain(now);
  r.t_drained = NowUs();
  r.applied = pipeline_->ApplyCommitted(now);
  if (output_) output_->Step(now);
  if (state_) state_->Step(now, pipeline_->serving(), pipeline_->client_data_committed());
  // A leader that lost touch with its majority for an election timeout lets
  // the address go before it steps down: by then another is being elected,
  // and a stale holder would draw clients (as the ARP answer they find).
  if (leader_address_)
    leader_address_->Want(pipeline_->serving() &&
                          now <= core_->last_majority_contact_us() + cfg_.election_timeout_max_us);
  r.t_applied = NowUs();
  metrics_->commit_clock.OnCommitted(core_->commit_index(), r.t_applied, metrics_->commit_latency);
  SampleMetrics(now);
  if (!pipeline_->Healthy(now)) {
    exit_code_ = 1;
    loop_->Stop();
  }
  TruncateLog(now);
  return r;
}

// The log is kept from where this replica's server would need it after a
// restore (its oldest kept checkpoint, or on the leader the newest one a
// peer holds, which a restore here would fetch); a leader also keeps what a
// backup heard from within the grace period has yet to receive, and what
// an open output question would quote in its report (OutputGuard::
// LogNeededFrom). A backup gone longer does not hold the log: it comes back
// from a checkpoint.
void Daemon::TruncateLog(uint64_t now) {
  leading_ = core_->role() == Role::kLeader;
  if (now < next_truncate_us_) return;
  next_truncate_us_ = now + kTruncateCheckUs;
  uint64_t below = pipeline_->log_needed_from();
  // The peers that count: the members of the configuration (a removed
  // replica holds back nothing, one added does).
  const Membership& ms = core_->membership();
  const uint32_t peers = (ms.voters | ms.learners) & ~(1u << me_.id);
  if (core_->role() == Role::kLeader)
    ForEachId(peers, [&](int r) {
      if (peer_checkpoint_[r].load()) below = std::max(below, peer_checkpoint_[r].load() + 1);
    });
  if (below <= 1) return;  // no checkpoint (or no server): every entry is needed
  below = std::min({below, pipeline_->applied() + 1, core_->commit_index() + 1});
  // An open output question keeps what its divergence report would quote.
  if (uint64_t quoted = output_ ? output_->LogNeededFrom() : 0) below = std::min(below, quoted);
  if (core_->role() == Role::kLeader) {
    uint64_t grace_us = cfg_.checkpoint.lagging_backup_grace_s * 1000000;
    ForEachId(peers, [&](int r) {
      // Live: it keeps up, or at least moves. A stream the transport has not
      // yet found dead counts for nothing on its own.
      uint64_t match = core_->PeerMatch(r);
      if (match >= core_->commit_index() || match != peer_match_seen_[r]) peer_live_us_[r] = now;
      peer_match_seen_[r] = match;
      if (now - peer_live_us_[r] < grace_us) below = std::min(below, core_->PeerMatch(r) + 1);
    });
  }
  if (below <= core_->first_index()) return;
  uint64_t from = core_->first_index();
  if (core_->TruncateBelow(below))
    log_("log truncated: entries %lu..%lu dropped (a checkpoint covers them)", (unsigned long)from,
         (unsigned long)below - 1);
}

// The log named a replica this daemon has no address for (one `lockstep
// member add` added): cluster.toml, which the command wrote first, has it.
// Entries already known must read the same (an address cannot change under
// a running replica); new ones are appended in place (WithRoomForEveryId).
void Daemon::LearnAddresses(uint64_t now) {
  const Membership& ms = core_->membership();
  uint32_t unknown = (ms.voters | ms.learners) >> n_.load();
  if (!unknown || now < next_address_look_us_) return;
  next_address_look_us_ = now + 1000000;
  ClusterConfig fresh;
  std::string err;
  if (!LoadClusterConfig(cfg_.path, &fresh, &err)) {
    log_(
        "the configuration %s names replicas this daemon has no address for, and %s does not "
        "load: %s",
        ms.ToString().c_str(), cfg_.path.c_str(), err.c_str());
    return;
  }
  int known = n_.load();
  for (int r = 0; r < known && r < static_cast<int>(fresh.replicas.size()); r++) {
    const ReplicaConfig &a = cfg_.replicas[r], &b = fresh.replicas[r];
    if (a.host != b.host || a.peer_port != b.peer_port || a.client_port != b.client_port ||
        a.server_port != b.server_port || a.netns != b.netns) {
      log_(
          "%s gives replica %d another address than this daemon started with: ignored (restart "
          "this replica to take it)",
          cfg_.path.c_str(), r);
      return;
    }
  }
  int grown = std::min(static_cast<int>(fresh.replicas.size()), kMaxMemberIds);
  if (grown <= known) {
    log_("the configuration %s names replicas that %s has no [[replica]] section for yet",
         ms.ToString().c_str(), cfg_.path.c_str());
    return;
  }
  LS_ASSERT(cfg_.replicas.capacity() >= static_cast<size_t>(grown), "address book moved");
  for (int r = known; r < grown; r++) {
    cfg_.replicas.push_back(fresh.replicas[r]);
    log_("replica %d is at %s (peer port %d, client port %d): from %s", r,
         fresh.replicas[r].host.c_str(), fresh.replicas[r].peer_port, fresh.replicas[r].client_port,
         cfg_.path.c_str());
  }
  n_ = grown;
  peer_->SetKnownReplicas(grown);
  front_->KnowReplicas(grown);
}

// Logs each change of the configuration, and what this replica is in it:
// a replica taken out stands for no election and says so.
void Daemon::NoteMemberState() {
  // Every pass: a compare of two small values, nothing more, until it changes.
  const Membership& now = core_->membership();
  const bool committed = core_->membership_index() <= core_->commit_index();
  if (now == last_membership_ && committed == last_membership_committed_) return;
  bool first = last_membership_.voters == 0;
  last_membership_ = now;
  last_membership_committed_ = committed;
  if (first && core_->membership_index() == 0) return;  // the initial one, said at "up"
  MemberState state = core_->member_state();
  log_("configuration %s (entry %lu%s): this replica is a %s%s", now.ToString().c_str(),
       (unsigned long)core_->membership_index(),
       core_->membership_index() <= core_->commit_index() ? ", committed" : ", not yet committed",
       MemberStateName(state),
       state == MemberState::kRemoved
           ? ": not in the configuration, it stands for no election (lockstep member list)"
           : "");
}

void Daemon::PollPeerCheckpoints() {
  while (!stop_poll_.load()) {
    if (leading_.load() && cfg_.has_server()) {
      for (int r = 0; r < n_ && !stop_poll_.load(); r++) {
        if (r == me_.id) continue;
        std::string err;
        DaemonStatus st;
        auto c = Client::Connect(cfg_, r, 300, &err, Principal::kReplica, me_.id);
        if (!c || !c->Status(&st, &err, 1000)) continue;
        uint64_t index = JsonU64(st.checkpoint, "index", UINT64_MAX);
        if (index != UINT64_MAX) peer_checkpoint_[r] = index;
      }
    }
    for (auto t = std::chrono::steady_clock::now() + kPeerCheckpointPoll;
         std::chrono::steady_clock::now() < t && !stop_poll_.load();)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

FailpointReply Daemon::SetFailpoint(const std::string& text) {
  if (!failpoints_allowed_)
    return {false,
            "failpoints are off on this replica (failpoints = true in cluster.toml, or "
            "LOCKSTEP_FAILPOINTS=1 in its environment)"};
  FailpointSpec spec;
  std::string err;
  if (!ParseFailpointSpec(text, &spec, &err)) return {false, err};
  if ((spec.disk_delay_ms || spec.torn_write) && !disk_)
    return {false,
            "disk_delay_ms and torn_write need a durable log (this replica has durability "
            "= memory)"};
  message_faults_.Set(spec);
  if (disk_) {
    disk_->SetAppendDelayUs(spec.disk_delay_ms * 1000);
    disk_->TearNextAppend(spec.torn_write);  // a new spec clears an unspent one
  }
  if (spec.clock_jump_ms) clock_jump_us += uint64_t{spec.clock_jump_ms} * 1000;
  std::string now = FormatFailpointSpec(spec);
  log_("failpoint: %s (messages dropped so far %lu, delayed %lu)", now.c_str(),
       (unsigned long)message_faults_.dropped(), (unsigned long)message_faults_.delayed());
  return {true, now};
}

bool Daemon::PrepareSleep() {
  if (!pipeline_->PrepareSleep()) return false;  // work arrived meanwhile
  if (writer_) {
    // A leader's own write that cannot commit anything by itself wakes
    // nobody: the ack that commits it comes with a doorbell, and that pass
    // reads the completion too (one wake-up of the loop per input less).
    writer_->SetWakeWanted(core_->OwnWriteMayCommit());
    if (writer_->Published()) return false;  // completed meanwhile: go round
    // A backup whose write is out has nothing to do before it completes:
    // records that come meanwhile can only go into its next write, and its
    // ack waits for this one. So it sleeps until the completion (or the
    // next heartbeat) without arming UCX: no doorbell wakes it, the
    // records wait in its memory and go out as one write, as when its loop
    // blocked in a synchronous write. (Armed, at 16 clients it woke for
    // each doorbell: daemons 2.6-2.9 switches and 62-65 us CPU per SET,
    // against 1.5 and 45-48 us blocking.)
    if (core_->role() == Role::kBackup && writer_->RingWriteOut()) return true;
  }
  // UCX refuses to arm while it holds an event, and over shm that is often
  // only the wake-up datagram of a doorbell this pass already progressed
  // (each refusal pops one). Progressing again and finding nothing, the
  // loop can arm at once instead of making a whole pass for it.
  for (int tries = 0; tries < kArmTries; tries++) {
    if (peer_->Arm()) return true;
    if (peer_->Progress()) break;  // something came: a pass must see it
  }
  pipeline_->Awake();  // UCX has events pending: go round again
  return false;
}

void Daemon::OnPeerMessage(Message m) {
  peer_->OnMessage(m);
  core_->OnMessage(NowUs(), m);
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
    log_("DURABLE WRITE FAILED: %s. New proposals are refused; nothing acknowledged is lost.",
         c.error.c_str());
    front_->FailWaiters("not committed: this replica cannot write its log (" + c.error +
                        "); outcome unknown");
  }
  if (c.error.empty() && !disk_error_.empty()) {
    log_("durable writes work again");
    disk_error_.clear();
  }
  LS_ASSERT(c.durable_seq >= durable_seq_seen_, "durable seq went back from %lu to %lu",
            (unsigned long)durable_seq_seen_, (unsigned long)c.durable_seq);
  if (!c.ring_problem.empty() && !ring_given_up_logged_) {
    ring_given_up_logged_ = true;
    log_("durable writes: io_uring given up (%s); the disk thread writes from now on",
         c.ring_problem.c_str());
  }
  if (c.ring_writes > ring_writes_seen_) {
    metrics_->disk_ring_writes->Add(c.ring_writes - ring_writes_seen_);
    ring_writes_seen_ = c.ring_writes;
  }
  if (c.durable_seq > durable_seq_seen_) {
    durable_seq_seen_ = c.durable_seq;
    core_->OnPersisted(now, c.durable_seq);
    busy = true;
  }
  return busy;
}

// ---------------------------------------------------------------- carrying out

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
  // Before anything the step produced leaves: a lease it ended (a promise
  // to another ballot, a hand-over) must stop the shim's reads first.
  pipeline_->PublishLease(core_->LeaseUntil());
  peer_->EnsureRegion();
  bool busy = !rd.empty();
  peer_->Put(rd, now);
  // Durable writes after the puts: those are already on their way to the
  // backups, whose writes overlap ours.
  Persist(rd.persists);
  for (auto& m : message_faults_.Due(now)) front_->SendToPeer(&m);
  for (auto& m : rd.messages)
    if (!message_faults_.Intercept(m, now)) front_->SendToPeer(&m);
  NoteMemberState();
  if (rd.lost_leadership)
    front_->FailWaiters("leadership lost before commit; outcome unknown (retry at the new leader)");
  NoteRoleChange();
  front_->ReplyWaiters(now);
  front_->ReplyLeaderMove(now);
  front_->FlushClients();
  front_->ExpireHandshakes(now);
  return busy;
}

// Everything the core produced since the last write forms one batch, and
// the writer merges whatever queued while a write was out (group commit
// without a timer).
void Daemon::Persist(std::vector<PersistOp>& persists) {
  for (auto& p : persists) {
    LS_ASSERT(p.seq > last_persist_seq_, "persist seq %lu after %lu", (unsigned long)p.seq,
              (unsigned long)last_persist_seq_);
    last_persist_seq_ = p.seq;
    for (const auto& e : p.entries) metrics_->log_bytes->Add(e.payload.size());
    if (memory_mode_) {
      memory_completions_.push_back(p.seq);
      continue;
    }
    std::vector<OwnedRecord> batch;
    if (p.promise)
      batch.push_back(OwnedRecord{EntryType::kPromise, p.promise, 0, p.commit_index, ""});
    for (auto& e : p.entries)
      batch.push_back(OwnedRecord{e.type, e.ballot, e.index, p.commit_index, std::move(e.payload)});
    // With io_uring (Submit) every replica's loop goes on while its write is
    // out and sleeps in epoll, not in the write: one sleep per write where
    // a blocking O_DIRECT|O_DSYNC write slept twice (data, then the cache
    // flush this disk needs). Without it (WriteNow below): the leader hands
    // every write to the disk thread, so its loop keeps putting heartbeats,
    // acks and proposals while the disk works (16 clients: ~20-30% more
    // commits per second), and a backup writes here whenever the thread is
    // idle: its ack waits on this write anyway, and a write here that takes
    // long is its own gap, not counted against the leader (OnLocalStall). A
    // leader that wrote here was silent for as long as the disk stalled: a
    // frozen disk held its loop 600 ms, a backup that had finished its own
    // write first heard nothing for 59 ms and was elected (test_stalls, CI).
    bool leader_async = core_->role() == Role::kCandidate || core_->role() == Role::kLeader;
    if (p.truncate_below || !disk_error_.empty() || leader_async || writer_->ring())
      writer_->Submit(p.seq, std::move(batch), p.truncate_below,
                      p.membership ? EncodeMembership(*p.membership) : std::string());
    else if (writer_->WriteNow(p.seq, std::move(batch)) && opt_.verbose)
      loop_->NoteInlineWrite(writer_->Poll().last_write_us);
  }
}

// The core's gauges into the metrics (daemon_metrics.h) every pass (a few
// relaxed stores: a scrape right after a commit shows it; sampled every
// 10 ms they lagged a burst of commits by up to 20 entries here), and the
// rooms' own counts at most every kSampleUs (they cost more: the front door
// counts its connections).
void Daemon::SampleMetrics(uint64_t now) {
  DaemonMetrics& m = *metrics_;
  Ballot b = core_->promised();
  m.ballot_round->Set(static_cast<double>(BallotRound(b)));
  m.ballot_leader->Set(BallotLeader(b));
  m.voters->Set(core_->membership().VoterCount());
  m.learners->Set(__builtin_popcount(core_->membership().learners));
  uint64_t commit = core_->commit_index(), applied = pipeline_->applied();
  m.commit_index->Set(static_cast<double>(commit));
  m.applied_index->Set(static_cast<double>(applied));
  m.first_index->Set(static_cast<double>(core_->first_index()));
  m.last_index->Set(static_cast<double>(core_->last_index()));
  m.replay_lag->Set(cfg_.has_server() && commit > applied ? static_cast<double>(commit - applied)
                                                          : 0);
  bool leading = core_->role() == Role::kLeader;
  for (int r = 0; r < n_ && r < static_cast<int>(m.peer_lag.size()); r++) {
    if (!m.peer_lag[r]) continue;
    uint64_t match = core_->PeerMatch(r), last = core_->last_index();
    m.peer_lag[r]->Set(leading && last > match ? static_cast<double>(last - match) : 0);
  }
  m.disk_error->Set(disk_error_.empty() ? 0 : 1);
  uint64_t lease = core_->LeaseUntil();
  m.lease_left->Set(lease > now ? static_cast<double>(lease - now) / 1e6 : 0);
  if (now < m.next_sample_us) return;
  m.lease_reads->Set(pipeline_->lease_reads());
  m.lease_misses->Set(pipeline_->lease_misses());
  m.next_sample_us = now + DaemonMetrics::kSampleUs;
  Checkpointer::Counts cp = pipeline_->CheckpointCounts();
  m.checkpoints_taken->Set(cp.taken);
  m.checkpoints_failed->Set(cp.failed);
  if (cp.taken != m.checkpoints_seen) {  // at most one per sample: seconds apart
    m.checkpoints_seen = cp.taken;
    m.checkpoint_dump->ObserveUs(cp.last_dump_us);
    m.checkpoint_last_bytes->Set(static_cast<double>(cp.last_bytes));
  }
  if (output_) {
    OutputGuard::Counts o = output_->counts();
    m.divergences->Set(o.divergences);
    m.repairs_ok->Set(o.repairs_ok);
    m.repairs_failed->Set(o.repairs_failed);
    m.recurrences->Set(o.recurrences);
  }
  m.client_connections->Set(static_cast<double>(front_->client_connections()));
  m.tls_handshake_failures->Set(front_->tls_handshakes_failed());
  m.auth_failures->Set(front_->handshakes_dropped());
}

// Logs role and ballot changes (tests and eval/ read these lines), and
// tells the server pipeline.
void Daemon::NoteRoleChange() {
  if (core_->role() == Role::kBackup && core_->stream_id() != last_stream_) {
    if (last_stream_ && core_->promised() == last_ballot_)
      log_("stream of ballot %s broke; asked the leader for a fresh one",
           BallotString(core_->promised()).c_str());
    last_stream_ = core_->stream_id();
  }
  if (core_->role() == last_role_ && core_->promised() == last_ballot_) return;
  metrics_->SetRole(core_->role());
  if (core_->promised() != last_ballot_) metrics_->leader_changes->Add();
  pipeline_->OnRoleChange();
  if (core_->role() == Role::kLeader) peer_live_us_.assign(kMaxMemberIds, NowUs());
  if (core_->role() == Role::kLeader)
    log_("leader of ballot %s (commit index %lu, log end %lu)",
         BallotString(core_->promised()).c_str(), (unsigned long)core_->commit_index(),
         (unsigned long)core_->last_index());
  else if (core_->role() == Role::kCandidate)
    log_("candidate for ballot %s (%s)", BallotString(core_->promised()).c_str(),
         core_->last_leader_contact_us()
             ? ("leader last heard " +
                std::to_string((NowUs() - core_->last_leader_contact_us()) / 1000) + " ms ago")
                   .c_str()
             : "no live leader known");
  else if (last_role_ == Role::kLeader && core_->promised() == last_ballot_ &&
           core_->election_hold_until_us() > NowUs())
    // Replica::HandOver (the output guard found this leader's server wrong,
    // or its server is stopped or was killed).
    log_(
        "backup, promised ballot %s (handed its leadership over; standing for no election for up "
        "to %lu ms)",
        BallotString(core_->promised()).c_str(),
        (unsigned long)((core_->election_hold_until_us() - NowUs()) / 1000));
  else
    log_("backup, promised ballot %s", BallotString(core_->promised()).c_str());
  last_role_ = core_->role();
  last_ballot_ = core_->promised();
}

}  // namespace

int RunReplica(const DaemonOptions& options) {
  if (options.id < 0 || options.id >= static_cast<int>(options.config.replicas.size())) {
    fprintf(stderr, "lockstep replica: --id %d is not in %s (replicas 0..%zu)\n", options.id,
            options.config.path.c_str(), options.config.replicas.size() - 1);
    return 2;
  }
  if (options.config.replicas[options.id].removed) {
    fprintf(stderr,
            "lockstep replica: replica %d was taken out of the cluster (removed = true in %s); "
            "its id is never used again: add a new replica instead (lockstep member add)\n",
            options.id, options.config.path.c_str());
    return 2;
  }
  if (options.config.secret.empty()) {
    fprintf(stderr,
            "lockstep replica: %s has no 'secret' in [cluster]: that is a client's copy; a "
            "replica needs the cluster's own (the file `lockstep cluster up` wrote)\n",
            options.config.path.c_str());
    return 2;
  }
  // A replica of namespace hosts lives in its own (its server with it).
  const std::string& netns = options.config.replicas[options.id].netns;
  std::string err;
  if (!netns.empty() && !EnterNetns(netns, &err)) {
    fprintf(stderr, "lockstep replica: %s\n", err.c_str());
    return 2;
  }
  pid_t log_copier = StartLogCopier();
  int rc;
  {
    Daemon d(options);
    rc = d.Run();
  }
  StopLogCopier(log_copier);
  return rc;
}

}  // namespace lockstep
