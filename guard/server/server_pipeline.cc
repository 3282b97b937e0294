// server_pipeline.cc — see server_pipeline.h.
#include "guard/server/server_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <vector>

#include "consensus/assert.h"
#include "guard/net/wire.h"
#include "guard/server/log_input.h"

namespace lockstep {

namespace {

constexpr uint64_t kMaxInputsInFlight = 256;  // proposed, not yet committed
// Work per pass, so that heartbeats go out between passes: the shim's
// submissions taken, and committed entries applied (a replica replaying a
// long log after a restart still answers its peers meanwhile).
constexpr uint64_t kSubmitBytesPerPass = 1 << 20;
constexpr uint64_t kApplyBytesPerPass = 4 << 20;
constexpr int kApplyEntriesPerPass = 1024;
// Serial execution's batching (BatchBehindRound): the longest a new input
// waits for the round in flight before it goes on its own.
constexpr uint64_t kBatchBehindRoundUs = 2000;
// A backup's replay batch (HoldReplay): entries, and the longest hold.
constexpr uint64_t kReplayBatch = 8;
constexpr uint64_t kReplayHoldUs = 2000;
constexpr uint64_t kSubmissionOverhead = 64;  // bytes a submission counts beyond its payload
constexpr uint64_t kMaxChunk = 256 << 10;     // largest DATA payload the shim submits
constexpr uint64_t kInputReportUs = 10000000;
constexpr size_t kProbeConnsKept = 16;  // a report names a probe's connection seconds later

// The port of an ACCEPT's peer address ("127.0.0.1:5678"); 0 if none.
uint16_t PeerPort(std::string_view peer) {
  size_t colon = peer.rfind(':');
  if (colon == std::string_view::npos) return 0;
  unsigned port = 0;
  for (char c : peer.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return 0;
    port = port * 10 + static_cast<unsigned>(c - '0');
  }
  return port <= 65535 ? static_cast<uint16_t>(port) : 0;
}

}  // namespace

ServerPipeline::ServerPipeline(const ClusterConfig& config, int id, EventLoop& loop, Replica& core,
                               const std::string& disk_error, const ReplicaLog& log)
    : cfg_(config),
      me_(config.replicas[id]),
      loop_(loop),
      core_(core),
      disk_error_(disk_error),
      log_(log) {}

bool ServerPipeline::Start() {
  OpenCheckpoints();
  // A restarted replica restores its newest good checkpoint and replays only
  // the log after it; without one, the server starts empty and the whole
  // log is replayed. A log that no longer starts at entry 1 (truncated
  // below a checkpoint: a former leader's below a peer's) needs a
  // checkpoint at its start or later: a peer's if none here.
  if (checkpointer_ && RestoreNewest(UINT64_MAX, "restart")) return true;
  if (core_.first_index() > 1) {
    RebuildFromPeer("at the restart");
    return true;
  }
  if (cfg_.server.cloned_start) {
    if (!checkpointer_) {
      log_(
          "SERVER NOT STARTED: the profile's cloned_start starts every server from a "
          "checkpoint, and checkpoints are off here (see above)");
      return false;
    }
    std::string why_not;
    if (IsCloneOrigin(&why_not)) return StartCloneOrigin();
    CloneFromPeer(why_not);
    return true;
  }
  std::string err;
  if (!LaunchServer(&err)) {
    log_("%s", err.c_str());
    return false;
  }
  return true;
}

bool ServerPipeline::LaunchServer(std::string* error) {
  uint64_t max_chunk = std::min<uint64_t>(kMaxChunk, core_.max_payload() - kInputHeader - 64);
  shim_ = std::make_unique<ShimChannel>();
  if (!shim_->Create(static_cast<uint32_t>(max_chunk), error)) {
    *error = "cannot set up the channel to the server's shim: " + *error;
    return false;
  }
  // The server starts empty and is refilled from the log, so nothing from a
  // previous run may survive in its data directory.
  std::string dir = me_.dir + "/server";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!cfg_.server.data_template.empty()) {
    std::filesystem::copy(
        cfg_.server.data_template, dir,
        std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks,
        ec);
    if (ec) {
      *error = "cannot copy the data template " + cfg_.server.data_template + " to " + dir + ": " +
               ec.message();
      return false;
    }
  }
  for (const std::string& name : cfg_.server.rendered_files)
    if (!RenderFile(dir + "/" + name, me_.server_port, dir, me_.host, error)) return false;
  // Split first, then substitute: a data directory with spaces stays one argument.
  std::vector<std::string> argv;
  if (!SplitCommand(cfg_.server.command, &argv, error)) {
    *error = "server command: " + *error;
    return false;
  }
  for (auto& a : argv) a = SubstituteCommand(a, me_.server_port, dir, me_.host);
  std::string cmd = JoinCommand(argv);
  server_ = std::make_unique<ServerProcess>();
  // Pid 1 of its own pid namespace: CRIU can then restore it under the same pid.
  server_->set_own_pid_namespace(checkpointer_ != nullptr);
  server_fds_ = shim_->ServerFds();
  shim_->set_random_seed(ServerRandomSeed(cfg_));  // "" unless the profile's same_random
  shim_->set_same_clock(cfg_.server.same_clock);
  shim_->set_timers_in_log(cfg_.server.timers_in_log);
  shim_->set_cloned(cfg_.server.cloned_start);
  const auto& sv = cfg_.server;
  shim_->set_serial_inputs(
      !sv.serial_inputs ? 0
                        : LS_SERIAL_ON | (sv.serial_until_reply ? LS_SERIAL_UNTIL_REPLY : 0) |
                              (sv.serial_sleep_keeps_turn ? LS_SERIAL_SLEEP_KEEPS : 0));
  shim_->set_unchecked_greeting(cfg_.server.unchecked_greeting);
  shim_->set_unchecked_replies(cfg_.server.unchecked_replies);
  // Reads without the log need the lease: without one configured, none.
  shim_->set_lease_reads(cfg_.lease_us ? cfg_.server.lease_reads : "",
                         cfg_.server.lease_protocol == "memcached");
  if (!server_->Start(argv, dir, me_.dir + "/server.log", shim_->ServerEnv(me_.server_port),
                      server_fds_, error)) {
    *error = "cannot start the server: " + *error;
    return false;
  }
  if (!server_->WaitReady(me_.host, me_.server_port, cfg_.server.ready_timeout_ms, error,
                          cfg_.server.ready_log))
    return false;
  if (!shim_->shim_attached()) {
    *error =
        "the preload shim did not attach to the server (a static binary, or LD_PRELOAD "
        "removed?): its inputs would not be agreed, so this replica stops";
    return false;
  }
  if (checkpointer_ && !server_->own_pid_namespace()) {
    log_(
        "CHECKPOINTS OFF: the server cannot have a pid namespace of its own (no "
        "CAP_SYS_ADMIN?), which CRIU needs to restore it");
    checkpointer_.reset();
  }
  applied_ = 0;
  log_bytes_applied_ = 0;
  ticks_applied_ = 0;
  ConnectServer();
  log_("server up (pid %d) on %s:%d: %s", server_->pid(), me_.host.c_str(), me_.server_port,
       cmd.c_str());
  return true;
}

// Failpoint for the tests of output checking: LOCKSTEP_FAILPOINT=
// flip-input:MARKER makes this replica's server receive the first input it
// replays that contains MARKER with the byte after MARKER changed, once per
// daemon. Nothing else reads it.
void ServerPipeline::MaybeFlipInput(std::string* bytes, uint64_t index) {
  static const char* spec = getenv("LOCKSTEP_FAILPOINT");
  static bool fired = false;
  if (!spec || fired || strncmp(spec, "flip-input:", 11) != 0) return;
  size_t at = bytes->find(spec + 11);
  if (at == std::string::npos || at + strlen(spec + 11) >= bytes->size()) return;
  fired = true;
  (*bytes)[at + strlen(spec + 11)] ^= 0x01;
  log_("FAILPOINT: flipped a byte of log entry %lu as replayed to this server",
       (unsigned long)index);
}

void ServerPipeline::ConnectServer() {
  server_id_++;
  output_names_.clear();
  replayer_ = std::make_unique<Replayer>(
      shim_.get(), me_.host, me_.server_port,
      [this](int fd, bool add, bool writable) {
        if (add) {
          loop_.Add(fd, [this, fd](uint32_t events) {
            if (!replayer_ || !replayer_->Owns(fd)) return false;  // closed; awaits reuse
            replayer_->OnEvent(fd, events);
            return true;
          });
        }
        loop_.Watch(fd, writable);
      },
      [this](const std::string& m) { log_("%s", m.c_str()); });
  loop_.Add(shim_->wake_daemon_fd(), [this](uint32_t) {
    if (shim_) shim_->Awake();
    return false;
  });
}

void ServerPipeline::DropServer() {
  replayer_.reset();
  if (shim_) loop_.Remove(shim_->wake_daemon_fd());
  server_.reset();  // stops it (if it still runs) and reaps it
  shim_.reset();
  own_pending_.clear();
  own_conns_.clear();
  broken_own_.clear();
  closing_.clear();
}

void ServerPipeline::StopServer() {
  // Its timers fire on their own from here on: redis handles SIGTERM in its
  // cron, which waited for a tick that never came (3 s, then SIGKILL, on
  // every cluster down).
  if (shim_) shim_->SetStopping();
  server_.reset();
}

int ServerPipeline::server_pid() const {
  return server_ ? server_->pid() : 0;
}

size_t ServerPipeline::replay_connections() const {
  return replayer_ ? replayer_->open_connections() : 0;
}

bool ServerPipeline::server_read_all() const {
  return !replayer_ || replayer_->Idle();
}

bool ServerPipeline::Healthy(uint64_t now) {
  TransferStep(now);
  if (inspections_) inspections_->Reap(shim_.get());
  if (checkpointer_ && !checkpoint_wanted_ && !checkpointer_->dumping())
    checkpointer_->Poll(me_.dir + "/server", now);  // collects a commit that finished
  if (shim_ && !shim_->error().empty()) {
    log_("the channel to the server's shim is corrupt (%s); this replica stops",
         shim_->error().c_str());
    return false;
  }
  if (!server_ || !server_failed_.empty() || now < next_health_check_us_) return true;
  next_health_check_us_ = now + kHealthCheckUs;
  if (uint32_t pid = shim_->forked_served()) {
    // The shim said what that process did in the server's log: quote it.
    std::ifstream f(me_.dir + "/server.log");
    std::string line, said = "process " + std::to_string(pid) + " served a client";
    while (std::getline(f, line))
      if (line.find("REFUSED: ") != std::string::npos)
        said = line.substr(line.find("REFUSED: ") + 9);
    log_("REFUSED: %s; this replica stops", said.c_str());
    return false;
  }
  std::string how;
  if (server_->Exited(&how)) return Recover(how, now);
  HandOverIfStopped(now);
  uint64_t read = replayer_ ? replayer_->BytesRead() : 0;
  if (read != bytes_read_seen_) last_read_change_us_ = now;
  bytes_read_seen_ = read;
  return true;
}

bool ServerPipeline::PrepareSleep() {
  // Held for a commit that came later in the same pass: go round instead,
  // since the shim will not wake us for the held submissions.
  if (holding_submissions_ && core_.commit_index() != held_at_commit_) return false;
  return !shim_ || shim_->PrepareSleep(holding_submissions_, replayer_ && replayer_->Gated());
}

void ServerPipeline::Awake() {
  if (shim_) shim_->Awake();
}

void ServerPipeline::OnRoleChange() {
  if (!shim_) return;
  bool leading = core_.role() == Role::kLeader;
  shim_->SetLeader(leading);
  if (leading) NoteLogClock();
  // A new leader closes the connections it did not accept: their clients
  // talked to another replica's server. It does so once everything that
  // may still commit from before its election is applied.
  close_old_pending_ = leading;
  close_old_after_ = core_.last_index();
  if (!leading) close_all_open_ = false;  // a leader checkpoint's, or a restored leader's
  // A leader checkpoint is of this leadership's server: a later one starts afresh.
  if (leader_cp_ != LeaderCheckpoint::kDumping) leader_cp_ = LeaderCheckpoint::kNone;
  leader_cp_again_ = false;
  if (!leading) leader_cp_news_->Set(false, "the replica asked is no longer the leader");
}

// A new leader's server must first execute everything committed before its
// election, in order, or a client would read stale data (or INCR a stale
// counter): until then the shim's inputs are refused (ProcessSubmissions).
// The connections of earlier leaders are closed first.
bool ServerPipeline::ReadyToServe() {
  if (serving_ballot_ == core_.promised()) return true;
  if (close_old_pending_ || applied_ < close_old_after_ || !replayer_->Idle()) return false;
  serving_ballot_ = core_.promised();
  log_("serving clients: the server has executed the log up to index %lu", (unsigned long)applied_);
  return true;
}

void ServerPipeline::PublishLease(uint64_t lease_until_us) {
  if (!shim_) return;
  bool resting =
      leader_cp_ == LeaderCheckpoint::kPreparing || leader_cp_ == LeaderCheckpoint::kDumping;
  bool serving = core_.role() == Role::kLeader && serving_ballot_ == core_.promised() &&
                 disk_error_.empty() && !resting;
  // The shim reads the real monotonic clock; NowUs() is ahead of it by the
  // clock jumps a failpoint made (only ever forward, so the lease it
  // measured from an earlier heartbeat's put ends no later in real time).
  uint64_t jump = clock_jump_us.load(std::memory_order_relaxed);
  uint64_t until_ns = serving && lease_until_us > jump ? (lease_until_us - jump) * 1000 : 0;
  shim_->SetLease(until_ns);
}

// Hands the shim's inputs to the log (leader), or refuses them.
bool ServerPipeline::ProcessSubmissions(uint64_t now) {
  if (!shim_) return false;
  // A leader whose server is still catching up refuses its shim's inputs
  // (clients reconnect): held, they would sit in the shim's delivery order
  // ahead of the replayed entries the catch-up waits for, and neither would
  // ever move.
  bool catching_up = core_.role() == Role::kLeader && !ReadyToServe();
  // A leader checkpointing its own server for a repair refuses them too,
  // until the dump is done: its server must come to rest.
  bool resting =
      leader_cp_ == LeaderCheckpoint::kPreparing || leader_cp_ == LeaderCheckpoint::kDumping;
  holding_submissions_ = false;
  bool did = false;
  bool leading = core_.role() == Role::kLeader && disk_error_.empty() && !catching_up && !resting;
  held_at_commit_ = core_.commit_index();
  if (leading && BatchBehindRound(now)) {
    holding_submissions_ = true;  // the round's ack wakes us
    return false;
  }
  // Bounded per pass (heartbeats go out between passes) and in flight (a
  // client streaming megabytes must not queue the whole stream in memory).
  uint64_t budget_bytes = kSubmitBytesPerPass;
  ShimChannel::Submission s;
  while (budget_bytes > 0 && shim_->Peek(&s)) {
    // Leadership is moving (`lockstep leader move`): the inputs wait in the
    // shim, neither proposed nor refused. After the hand-over they are
    // refused like any backup's, and their clients reconnect to the new
    // leader; if the move fails, they are proposed here as usual.
    if (leading && core_.transferring()) {
      holding_submissions_ = true;
      break;
    }
    if (leading && core_.last_index() - core_.commit_index() >= kMaxInputsInFlight) {
      holding_submissions_ = true;  // sleep until commits make room, do not spin on them
      break;
    }
    budget_bytes -= std::min<uint64_t>(budget_bytes, s.bytes.size() + kSubmissionOverhead);
    did = true;
    bool ok = false;
    if (leading && s.kind == LS_SUB_TICK) {
      // A wait of the server timed out (preload/shim_abi.h "Ticks"): the
      // timeout fires on every replica at this entry, its clock then at
      // least the one the wait timed out at.
      ConnKey key{core_.promised(), s.tick_waiter};
      ProposeResult r =
          core_.Propose(now, EntryType::kInput,
                        EncodeInput(LS_SUB_TICK, key, s.seq, "", Stamp(s.tick_min_clock_ns), 0));
      ok = r.ok;
      if (ok) own_pending_[r.index] = OwnPending{s.seq, s.tick_waiter, s.kind, now, key.ballot};
    } else if (leading) {
      ConnKey key{core_.promised(), s.conn};
      if (s.kind == LS_SUB_ACCEPT) {
        own_conns_[s.conn] = key;
        ok = true;
        if (uint16_t port = probe_port_ ? probe_port_() : 0; port && PeerPort(s.bytes) == port) {
          probe_conns_.push_back(key);
          if (probe_conns_.size() > kProbeConnsKept) probe_conns_.pop_front();
        }
      } else {
        auto it = own_conns_.find(s.conn);
        ok = it != own_conns_.end() && !broken_own_.count(s.conn);
        if (ok) key = it->second;
      }
      if (ok) {
        std::string flipped;
        std::string_view bytes = s.bytes;
        if (s.kind == LS_SUB_DATA && MaybeFlipProposal(bytes, &flipped)) bytes = flipped;
        ProposeResult r = core_.Propose(
            now, EntryType::kInput, EncodeInput(s.kind, key, s.seq, bytes, Stamp(), s.out_before));
        ok = r.ok;
        if (ok) own_pending_[r.index] = OwnPending{s.seq, s.conn, s.kind, now};
      }
    }
    if (!ok) {
      shim_->Complete(LS_DONE_DROPPED, s.seq, s.conn);
      if (s.kind == LS_SUB_DATA || s.kind == LS_SUB_CLOSE) broken_own_.insert(s.conn);
      if (s.kind == LS_SUB_ACCEPT) own_conns_.erase(s.conn);
    }
    shim_->Pop();
  }
  return did;
}

bool ServerPipeline::OwnConn(const ConnKey& k) const {
  auto it = own_conns_.find(k.no);
  return it != own_conns_.end() && it->second == k;
}

// A server that executes one input at a time (serial_inputs) lets each of
// its many clients send its next request only once the last one executed,
// so at many clients new inputs reach the leader one by one, and each was
// a consensus round of its own: a durable write and a wake-up on every
// replica per MariaDB statement (the daemons' CPU per transaction was 60%
// of the servers'). Those inputs would wait in the server anyway, behind
// the ones already agreed. So while a round proposed in an earlier pass is
// in flight, new inputs wait for it (its ack wakes this loop) and then go
// as one round; a round stuck for kBatchBehindRoundUs (a backup gone) no
// longer holds them. At one client nothing is ever in flight when its next
// request comes: no latency is added.
bool ServerPipeline::BatchBehindRound(uint64_t now) const {
  if (!cfg_.server.serial_inputs) return false;
  auto oldest = own_pending_.upper_bound(core_.commit_index());
  return oldest != own_pending_.end() && oldest->second.proposed_us < now &&
         now - oldest->second.proposed_us < kBatchBehindRoundUs;
}

// A backup's server is woken once per batch of committed inputs, not once
// per input: at one client each input is its own commit, and replaying it
// at once woke every backup's server (and its daemon's replay send) once
// per input, ~2 context switches a backup for a server that no client
// waits on. So a backup holds what it has not applied until kReplayBatch
// entries wait or the oldest has waited kReplayHoldUs. Only a plain
// backup holds: a leader's own inputs are released at once (its clients
// wait), and a candidate or a replica catching up applies at once.
bool ServerPipeline::HoldReplay(uint64_t now, uint64_t commit) {
  if (applied_ >= commit || core_.role() != Role::kBackup || commit - applied_ >= kReplayBatch) {
    hold_since_us_ = 0;
    return false;
  }
  if (hold_since_us_ == 0) hold_since_us_ = now;
  if (now - hold_since_us_ >= kReplayHoldUs) {
    hold_since_us_ = 0;
    return false;
  }
  return true;
}

// Hands committed entries, in log order, to the server: our own shim's
// inputs are released to it, everyone else's are replayed over TCP.
bool ServerPipeline::ApplyCommitted(uint64_t now) {
  if (!shim_ || !server_failed_.empty()) return false;
  bool did = false;
  // A checkpoint is being prepared or dumped: the server stays at its index.
  if (CheckpointStep(now)) {
    did |= replayer_ && replayer_->Pump(now);
    did |= shim_ && shim_->Flush();
    return did;
  }
  uint64_t commit = core_.commit_index();
  if (applied_ > commit) {
    // Restored from a checkpoint this replica's log does not yet know to be
    // committed (the commit index reaches the disk lazily): it was, since
    // only committed entries are applied. Nothing to apply until it catches up.
    LS_ASSERT(applied_ == restored_index_, "applied %lu past the commit index %lu",
              (unsigned long)applied_, (unsigned long)commit);
    commit = applied_;
  }
  if (HoldReplay(now, commit)) return false;
  // Bounded per pass, so that a replica replaying a long log (after a
  // restart) still answers heartbeats in between.
  uint64_t budget_bytes = kApplyBytesPerPass;
  for (int n = 0; applied_ < commit && n < kApplyEntriesPerPass && budget_bytes > 0; n++) {
    uint64_t i = applied_ + 1;
    const Entry* e = core_.At(i);
    if (!e) {
      if (i < core_.first_index()) {
        // Never run the server on a partial log: rebuild it from a checkpoint.
        DropServer();
        RebuildFromPeer("entries " + std::to_string(i) + ".." +
                        std::to_string(core_.first_index() - 1) +
                        " it has not executed were truncated");
        return true;
      }
      break;
    }
    budget_bytes -= std::min<uint64_t>(budget_bytes, e->payload.size());
    log_bytes_applied_ += e->payload.size();
    Input in;
    bool is_input = e->type == EntryType::kInput && DecodeInput(e->payload, &in);
    auto pend = own_pending_.find(i);
    bool own_tick = false;  // our shim's tick, released to it, not replayed
    if (pend != own_pending_.end()) {
      const OwnPending& p = pend->second;
      bool ours = is_input && in.seq == p.seq && in.key.no == p.conn &&
                  (p.kind == LS_SUB_TICK ? in.kind == LS_SUB_TICK && in.key.ballot == p.ballot
                                         : in.kind != LS_SUB_TICK && OwnConn(in.key));
      own_tick = ours && p.kind == LS_SUB_TICK;
      shim_->Complete(ours ? LS_DONE_COMMITTED : LS_DONE_DROPPED, p.seq,
                      p.kind == LS_SUB_TICK ? 0 : p.conn, in.clock_ns);
      if (ours) {
        inputs_committed_++;
        // A state check's own requests are no client's: they make no check due.
        if (p.kind == LS_SUB_DATA && !IsStateProbe(in.key)) client_data_committed_++;
        input_commit_us_sum_ += static_cast<double>(now - p.proposed_us);
      }
      if (!ours && (p.kind == LS_SUB_DATA || p.kind == LS_SUB_CLOSE)) broken_own_.insert(p.conn);
      own_pending_.erase(pend);
    }
    if (is_input && in.kind == LS_SUB_TICK) {
      ticks_applied_++;
      clock_stamp_ = std::max(clock_stamp_, in.clock_ns);
      if (!own_tick) replayer_->Tick(in.key.no, i, in.clock_ns);
    } else if (is_input) {
      clock_stamp_ = std::max(clock_stamp_, in.clock_ns);
      bool own = OwnConn(in.key);
      switch (in.kind) {
        case LS_SUB_ACCEPT:
          open_conns_.insert(in.key);
          if (!own) replayer_->Accept(in.key);
          break;
        case LS_SUB_DATA:
          if (!own) {
            MaybeFlipInput(&in.bytes, i);
            replayer_->Data(in.key, in.bytes, i, in.clock_ns, in.out_before);
          }
          break;
        case LS_SUB_CLOSE:
          open_conns_.erase(in.key);
          closing_.erase(in.key);
          if (own) {
            if (in.seq == 0) shim_->Complete(LS_DONE_CLOSE, 0, in.key.no);
            own_conns_.erase(in.key.no);
            broken_own_.erase(in.key.no);
          } else {
            replayer_->Close(in.key, in.out_before);
          }
          break;
      }
    }
    applied_ = i;
    did = true;
  }
  LS_ASSERT(applied_ <= commit, "applied %lu past the commit index %lu", (unsigned long)applied_,
            (unsigned long)commit);
  if (close_old_pending_ && core_.role() == Role::kLeader && applied_ >= close_old_after_) {
    close_old_pending_ = false;
    // A restored leader's own connections died with its server, too.
    bool all = close_all_open_;
    close_all_open_ = false;
    for (const ConnKey& k : open_conns_) {
      if ((k.ballot == core_.promised() && !all) || closing_.count(k)) continue;
      if (core_.Propose(now, EntryType::kInput, EncodeInput(LS_SUB_CLOSE, k, 0, "", Stamp())).ok)
        closing_.insert(k);
    }
    did = true;
  }
  uint64_t t_entries = NowUs();
  did |= replayer_->Pump(now);
  uint64_t t_pumped = NowUs();
  did |= shim_->Flush();
  uint64_t t_flushed = NowUs();
  if (t_flushed - now > kSlowStepUs)
    log_("slow apply: entries %lu us, replay %lu us, outcomes %lu us (applied %lu, queued %lu)",
         (unsigned long)(t_entries - now), (unsigned long)(t_pumped - t_entries),
         (unsigned long)(t_flushed - t_pumped), (unsigned long)applied_,
         (unsigned long)replayer_->queued());
  ReportInputs(now);
  return did;
}

// The wall-clock stamp of an input proposed now (log_input.h): the leader's
// CLOCK_REALTIME, but never below a stamp already in the log, so that the
// servers' clocks (preload/shim_clock.c) never go backwards, also when this
// leader's clock is behind its predecessor's.
uint64_t ServerPipeline::Stamp(uint64_t at_least) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t now =
      static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  // A tick's least stamp comes from the server's memory: never trusted to
  // push the log's clock far ahead.
  clock_stamp_ = std::max({clock_stamp_, now, std::min(at_least, now + kTickAheadMaxNs)});
  return clock_stamp_;
}

// A new leader takes the newest stamp in its log as the floor of its own
// (Stamp): entries it has not applied yet, or applied before a restore from
// a checkpoint, are not in clock_stamp_. Stamps grow with the index, so the
// newest input entry has the newest; a few are looked at, at most.
void ServerPipeline::NoteLogClock() {
  constexpr int kLookBack = 1024;
  uint64_t i = core_.last_index();
  for (int n = 0; n < kLookBack && i >= core_.first_index() && i > 0; n++, i--) {
    const Entry* e = core_.At(i);
    Input in;
    if (!e || e->type != EntryType::kInput || !DecodeInput(e->payload, &in)) continue;
    if (in.clock_ns == 0) continue;  // an entry from before the stamps
    clock_stamp_ = std::max(clock_stamp_, in.clock_ns);
    return;
  }
}

void ServerPipeline::ReportInputs(uint64_t now) {
  if (now < next_input_report_us_) return;
  if (inputs_committed_)
    log_("%lu client inputs committed in the last 10 s, mean %.0f us from proposal to commit",
         (unsigned long)inputs_committed_, input_commit_us_sum_ / inputs_committed_);
  inputs_committed_ = 0;
  input_commit_us_sum_ = 0;
  next_input_report_us_ = now + kInputReportUs;
}

}  // namespace lockstep
