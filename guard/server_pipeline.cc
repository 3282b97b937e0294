// server_pipeline.cc — see server_pipeline.h.
#include "guard/server_pipeline.h"

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <vector>

#include "consensus/assert.h"
#include "guard/wire.h"

namespace lockstep {

namespace {

constexpr uint64_t kMaxInputsInFlight = 256;  // proposed, not yet committed
// Work per pass, so that heartbeats go out between passes: the shim's
// submissions taken, and committed entries applied (a replica replaying a
// long log after a restart still answers its peers meanwhile).
constexpr uint64_t kSubmitBytesPerPass = 1 << 20;
constexpr uint64_t kApplyBytesPerPass = 4 << 20;
constexpr int kApplyEntriesPerPass = 1024;
constexpr uint64_t kSubmissionOverhead = 64;  // bytes a submission counts beyond its payload
constexpr uint64_t kMaxChunk = 256 << 10;     // largest DATA payload the shim submits
constexpr uint64_t kHealthCheckUs = 100000;   // how often the server's exit is checked
constexpr uint64_t kInputReportUs = 10000000;

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
  std::string err;
  uint64_t max_chunk = std::min<uint64_t>(kMaxChunk, core_.max_payload() - kInputHeader - 64);
  shim_ = std::make_unique<ShimChannel>();
  if (!shim_->Create(static_cast<uint32_t>(max_chunk), &err)) {
    log_("cannot set up the channel to the server's shim: %s", err.c_str());
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
    log_("server command: %s", err.c_str());
    return false;
  }
  for (auto& a : argv) a = SubstituteCommand(a, me_.server_port, dir);
  std::string cmd = JoinCommand(argv);
  server_ = std::make_unique<ServerProcess>();
  if (!server_->Start(argv, dir, me_.dir + "/server.log", shim_->ServerEnv(me_.server_port),
                      shim_->ServerFds(), &err)) {
    log_("cannot start the server: %s", err.c_str());
    return false;
  }
  if (!server_->WaitReady(me_.host, me_.server_port, cfg_.server.ready_timeout_ms, &err)) {
    log_("%s", err.c_str());
    return false;
  }
  if (!shim_->shim_attached()) {
    log_(
        "the preload shim did not attach to the server (a static binary, or LD_PRELOAD "
        "removed?): its inputs would not be agreed, so this replica stops");
    return false;
  }
  replayer_ = std::make_unique<Replayer>(
      shim_.get(), me_.host, me_.server_port,
      [this](int fd, bool add, bool writable) {
        if (add) {
          loop_.Add(fd, [this, fd](uint32_t events) {
            if (!replayer_->Owns(fd)) return false;  // closed; the number awaits reuse
            replayer_->OnEvent(fd, events);
            return true;
          });
        }
        loop_.Watch(fd, writable);
      },
      [this](const std::string& m) { log_("%s", m.c_str()); });
  loop_.Add(shim_->wake_daemon_fd(), [this](uint32_t) {
    shim_->Awake();
    return false;
  });
  log_("server up (pid %d) on %s:%d: %s", server_->pid(), me_.host.c_str(), me_.server_port,
       cmd.c_str());
  return true;
}

void ServerPipeline::StopServer() {
  server_.reset();
}

int ServerPipeline::server_pid() const {
  return server_ ? server_->pid() : 0;
}

size_t ServerPipeline::replay_connections() const {
  return replayer_ ? replayer_->open_connections() : 0;
}

bool ServerPipeline::Healthy(uint64_t now) {
  if (shim_ && !shim_->error().empty()) {
    log_("the channel to the server's shim is corrupt (%s); this replica stops",
         shim_->error().c_str());
    return false;
  }
  if (!server_ || now < next_health_check_us_) return true;
  next_health_check_us_ = now + kHealthCheckUs;
  std::string how;
  if (server_->Exited(&how)) {
    log_("the server %s; this replica stops (lockstep cluster restart --id %d starts it again)",
         how.c_str(), me_.id);
    return false;
  }
  return true;
}

bool ServerPipeline::PrepareSleep() {
  return !shim_ || shim_->PrepareSleep(holding_submissions_, replayer_ && replayer_->Gated());
}

void ServerPipeline::Awake() {
  if (shim_) shim_->Awake();
}

void ServerPipeline::OnRoleChange() {
  if (!shim_) return;
  bool leading = core_.role() == Role::kLeader;
  shim_->SetLeader(leading);
  // A new leader closes the connections it did not accept: their clients
  // talked to another replica's server. It does so once everything that
  // may still commit from before its election is applied.
  close_old_pending_ = leading;
  close_old_after_ = core_.last_index();
}

// A new leader's server must first execute everything committed before its
// election, in order, or a client would read stale data (or INCR a stale
// counter): until then the shim's inputs wait in the ring (its accept waits
// for the outcome). The connections of earlier leaders are closed first.
bool ServerPipeline::ReadyToServe() {
  if (serving_ballot_ == core_.promised()) return true;
  if (close_old_pending_ || applied_ < close_old_after_ || !replayer_->Idle()) return false;
  serving_ballot_ = core_.promised();
  log_("serving clients: the server has executed the log up to index %lu", (unsigned long)applied_);
  return true;
}

// Hands the shim's inputs to the log (leader), or refuses them.
bool ServerPipeline::ProcessSubmissions(uint64_t now) {
  if (!shim_) return false;
  holding_submissions_ = core_.role() == Role::kLeader && !ReadyToServe();
  if (holding_submissions_) return false;
  bool did = false;
  bool leading = core_.role() == Role::kLeader && disk_error_.empty();
  // Bounded per pass (heartbeats go out between passes) and in flight (a
  // client streaming megabytes must not queue the whole stream in memory).
  uint64_t budget_bytes = kSubmitBytesPerPass;
  ShimChannel::Submission s;
  while (budget_bytes > 0 && shim_->Peek(&s)) {
    if (leading && core_.last_index() - core_.commit_index() >= kMaxInputsInFlight) {
      holding_submissions_ = true;  // sleep until commits make room, do not spin on them
      break;
    }
    budget_bytes -= std::min<uint64_t>(budget_bytes, s.bytes.size() + kSubmissionOverhead);
    did = true;
    bool ok = false;
    if (leading) {
      ConnKey key{core_.promised(), s.conn};
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
            core_.Propose(now, EntryType::kInput, EncodeInput(s.kind, key, s.seq, s.bytes));
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

bool ServerPipeline::OwnConn(const ConnKey& k) const {
  auto it = own_conns_.find(k.no);
  return it != own_conns_.end() && it->second == k;
}

// Hands committed entries, in log order, to the server: our own shim's
// inputs are released to it, everyone else's are replayed over TCP.
bool ServerPipeline::ApplyCommitted(uint64_t now) {
  if (!shim_) return false;
  bool did = false;
  uint64_t commit = core_.commit_index();
  LS_ASSERT(applied_ <= commit, "applied %lu past the commit index %lu", (unsigned long)applied_,
            (unsigned long)commit);
  // Bounded per pass, so that a replica replaying a long log (after a
  // restart) still answers heartbeats in between.
  uint64_t budget_bytes = kApplyBytesPerPass;
  for (int n = 0; applied_ < commit && n < kApplyEntriesPerPass && budget_bytes > 0; n++) {
    uint64_t i = applied_ + 1;
    const Entry* e = core_.At(i);
    if (!e) {
      if (i < core_.first_index()) {
        if (!truncated_warned_)
          log_(
              "cannot replay entries %lu..%lu: the log was truncated; this replica's server "
              "misses them",
              (unsigned long)i, (unsigned long)core_.first_index() - 1);
        truncated_warned_ = true;
        applied_ = core_.first_index() - 1;
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
  LS_ASSERT(applied_ <= commit, "applied %lu past the commit index %lu", (unsigned long)applied_,
            (unsigned long)commit);
  if (close_old_pending_ && core_.role() == Role::kLeader && applied_ >= close_old_after_) {
    close_old_pending_ = false;
    for (const ConnKey& k : open_conns_) {
      if (k.ballot == core_.promised() || closing_.count(k)) continue;
      if (core_.Propose(now, EntryType::kInput, EncodeInput(LS_SUB_CLOSE, k, 0, "")).ok)
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
