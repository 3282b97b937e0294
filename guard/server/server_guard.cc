// server_guard.cc — the part of ServerPipeline that keeps the server alive
// and bounded: checkpoints of a backup's server at a log index, restores of
// the newest good one (at a restart, and when the server dies), and the
// crash-loop stop. See server_pipeline.h for the class and
// checkpoint/README.md for what a checkpoint holds and why.
//
// A checkpoint at index k must hold the server having executed exactly the
// entries up to k. A backup therefore stops applying when one is due, waits
// until the server has read everything it was handed (Replayer::Idle) and
// then lets CRIU freeze and dump it; applying resumes once the dump is done
// and the data directory copied. The leader pauses its server only when a
// repair needs its state (no backup agrees with it: StartLeaderCheckpoint).
#include <poll.h>
#include <signal.h>

#include <cstring>
#include <filesystem>

#include "checkpoint/relocate.h"
#include "checkpoint/spawn.h"
#include "consensus/assert.h"
#include "guard/common/json.h"
#include "guard/net/client.h"
#include "guard/server/restore_point.h"
#include "guard/server/server_pipeline.h"

namespace lockstep {

namespace {
// After a failed state transfer, the next try waits this long.
constexpr uint64_t kFetchRetryUs = 3000000;
// A cloned start asks for replica 0's image this often until it has one,
// and says it is waiting this often.
constexpr uint64_t kCloneRetryUs = 200000;
constexpr uint64_t kCloneSayUs = 5000000;
// How long a cloned start's origin waits for each peer's status.
constexpr int kClonePeerTimeoutMs = 500;
// How long a due checkpoint waits for the server to read its inputs before
// it is put off by a whole interval (a server that stopped reading one
// connection must not stop this replica from applying).
constexpr uint64_t kRestWaitUs = 1000000;
// The same for a leader's own checkpoint, whose clients' connections must
// close first (through the log) and whose inputs are refused meanwhile:
// failing sooner gives them back sooner.
constexpr uint64_t kLeaderRestWaitUs = 2000000;
}  // namespace

void ServerPipeline::OpenCheckpoints() {
  senders_ =
      std::make_unique<CheckpointSenders>([this](const std::string& m) { log_("%s", m.c_str()); });
  if (!cfg_.checkpoint.enabled) return;
  checkpointer_ = std::make_unique<Checkpointer>(
      cfg_.checkpoint, me_.id, static_cast<int>(cfg_.replicas.size()), me_.dir,
      [this](const std::string& m) { log_("%s", m.c_str()); });
  std::string err;
  if (!checkpointer_->Open(&err)) {
    log_("CHECKPOINTS OFF: cannot open the checkpoint store in %s: %s", me_.dir.c_str(),
         err.c_str());
    checkpointer_.reset();
    return;
  }
  fetcher_ =
      std::make_unique<CheckpointFetcher>(cfg_, me_.id, &checkpointer_->store(),
                                          [this](const std::string& m) { log_("%s", m.c_str()); });
}

// A leader whose server is stopped (SIGSTOP, a debugger holding it) serves
// nobody, while its daemon goes on leading and nothing else would move the
// clients: after kStoppedHandOverUs it hands leadership to the backup
// furthest along (Replica::HandOver, as a divergent leader does), and it may
// lead again once its server runs. A CRIU dump also stops the server (a
// leader dumps only for a repair, LeaderCheckpointStep): not counted. A
// server merely busy (a long command) is not stopped: every replica's would
// be as slow.
void ServerPipeline::HandOverIfStopped(uint64_t now) {
  char state = core_.role() == Role::kLeader && server_ ? ProcessState(server_->pid()) : 0;
  bool stopped = (state == 'T' || state == 't') && !(checkpointer_ && checkpointer_->dumping());
  if (!stopped) {
    stopped_since_us_ = 0;
    return;
  }
  if (!stopped_since_us_) stopped_since_us_ = now;
  if (now - stopped_since_us_ < kStoppedHandOverUs) return;
  int successor = core_.FurthestReadyPeer();
  if (successor >= 0 && core_.HandOver(now, successor, kStoppedHoldUs))
    log_(
        "this leader's server (pid %d) has been stopped for %lu ms: handed leadership over to "
        "replica %d",
        (int)server_->pid(), (unsigned long)((now - stopped_since_us_) / 1000), successor);
  stopped_since_us_ = 0;
}

void ServerPipeline::ServeCheckpoint(std::unique_ptr<Stream> to, uint64_t min_index) {
  senders_->Serve(std::move(to), checkpointer_ ? &checkpointer_->store() : nullptr, min_index,
                  [news = leader_cp_news_](std::string* why) { return news->Coming(why); });
  // Nothing recent enough here: a backup that has executed that far takes
  // one now, so that the peer's next try finds it. Without this, a replica
  // whose log the leader truncated past would wait for the next checkpoint
  // the policy makes, which never comes while the cluster is idle.
  if (checkpointer_ && checkpointer_->newest_index() < min_index && applied_ >= min_index &&
      core_.role() == Role::kBackup && server_ && server_failed_.empty() &&
      !checkpointer_->requested() && !checkpointer_->dumping()) {
    log_("a peer needs a checkpoint at index >= %lu and the newest here is %lu: taking one",
         (unsigned long)min_index, (unsigned long)checkpointer_->newest_index());
    checkpointer_->Request();
  }
}

void ServerPipeline::ServeInspection(std::unique_ptr<Stream> to, const std::string& who,
                                     const std::string& peer, const std::string& program) {
  if (!inspections_) inspections_ = std::make_unique<Inspections>(cfg_, me_, log_);
  bool running = server_ && shim_ && server_failed_.empty();
  inspections_->Serve(std::move(to), who, peer, program, running ? shim_.get() : nullptr,
                      core_.role() == Role::kLeader);
}

uint64_t ServerPipeline::log_needed_from() const {
  if (!checkpointer_) return 0;
  // The oldest kept checkpoint, not the newest: if the newest is found
  // damaged at a restore, the one before it still has its log.
  return checkpointer_->oldest_kept_index() + 1;
}

std::string ServerPipeline::server_state() const {
  if (!cfg_.has_server()) return "none";
  if (!server_failed_.empty()) return server_failed_;
  return server_ ? "running" : "stopped";
}

std::string ServerPipeline::RequestCheckpoint() {
  if (!cfg_.has_server()) return "this cluster runs no server";
  if (!checkpointer_) return "checkpoints are off on this replica (see its log)";
  if (checkpointer_->broken())
    return "CRIU cannot dump this server (see `lockstep cluster status`)";
  if (!server_failed_.empty()) return "the server is not running: " + server_failed_;
  if (core_.role() != Role::kBackup)
    return "replica " + std::to_string(me_.id) +
           " is not a backup: the leader never pauses its server for a checkpoint on request (only "
           "when a repair needs its state)";
  checkpointer_->Request();
  return "";
}

Checkpointer::Counts ServerPipeline::CheckpointCounts() const {
  return checkpointer_ ? checkpointer_->counts() : Checkpointer::Counts{};
}

Json ServerPipeline::CheckpointStatusJson(uint64_t now) const {
  Json o = checkpointer_ ? checkpointer_->StatusJson(now)
                         : Json{{"index", 0}, {"age_s", -1}, {"enabled", false}};
  o["server_state"] = server_state();
  o["crashes"] = crashes_;
  o["restored_from"] = restored_index_;
  return o;
}

std::string ServerPipeline::CheckpointListJson() const {
  Json list = Json::array();
  if (checkpointer_) {
    for (const CheckpointInfo& cp : checkpointer_->List())
      list.push_back({{"replica", me_.id},
                      {"index", cp.index},
                      {"time_unix", cp.meta.time_unix},
                      {"bytes", cp.bytes},
                      {"dump_us", cp.meta.dump_us},
                      {"ok", cp.ok},
                      {"path", cp.path},
                      {"error", cp.error}});
  }
  return JsonText(list);
}

// ---------------------------------------------------------------- checkpoints

bool ServerPipeline::CheckpointStep(uint64_t now) {
  if (!checkpointer_ || !server_) return false;
  std::string data_dir = me_.dir + "/server";
  if (dump_watch_fd_ >= 0) {
    checkpointer_->Poll(data_dir, now);  // copies the data directory once criu is done
    if (checkpointer_->dumping()) return true;
    loop_.Remove(dump_watch_fd_);
    dump_watch_fd_ = -1;
    if (leader_cp_ == LeaderCheckpoint::kDumping)  // (a former leader's is no repair's any more)
      leader_cp_ =
          core_.role() == Role::kLeader ? LeaderCheckpoint::kCommitting : LeaderCheckpoint::kNone;
    return false;
  }
  if (core_.role() != Role::kBackup) {  // the leader pauses its server only for a repair
    checkpoint_wanted_ = false;
    return LeaderCheckpointStep(now);
  }
  // A server a repair is replacing with a peer's checkpoint is known to be
  // wrong (a divergent one, or a former leader's): a checkpoint of it could
  // be restored or sent to a peer later. Nor does it wait for it to rest.
  if (repair_transfer_ == RepairTransfer::kRunning) {
    checkpoint_wanted_ = false;
    return false;
  }
  if (!checkpoint_wanted_) {
    if (!checkpointer_->Due(applied_ - ticks_applied_, log_bytes_applied_, now)) return false;
    checkpoint_wanted_ = true;
    rest_wait_since_us_ = now;
  }
  std::string busy = RestBusy();
  if (busy.empty() && applied_ > core_.commit_index()) busy = "applied past the commit index";
  if (!busy.empty()) {
    // A former leader's own clients' inputs and connections settle only as
    // the log is applied (their commits, the new leader's CLOSEs): applying
    // goes on while they are busy, else the wait could only time out, and
    // those clients waited the whole kRestWaitUs for replies already
    // committed (after `lockstep leader move`: 2 moves in 25 waited ~1 s).
    if (now - rest_wait_since_us_ < kRestWaitUs) return !replayer_->Busy().empty();
    log_("checkpoint put off: the server did not come to rest within %lu ms (%s)",
         (unsigned long)(kRestWaitUs / 1000), busy.c_str());
    checkpointer_->Postpone(applied_ - ticks_applied_, log_bytes_applied_, now);
    checkpoint_wanted_ = false;
    return false;
  }
  checkpoint_wanted_ = false;
  return TakeCheckpoint(now);
}

// Why the server is not at rest for a checkpoint ("" if it is): what it was
// handed and has not read, its own clients' inputs and connections.
std::string ServerPipeline::RestBusy() const {
  std::string busy = replayer_->Busy();
  if (busy.empty() && !own_pending_.empty()) busy = "inputs of its own clients in flight";
  if (busy.empty() && !own_conns_.empty())
    busy = std::to_string(own_conns_.size()) + " connections of its own clients open";
  if (busy.empty() && !closing_.empty()) busy = "connections being closed";
  return busy;
}

bool ServerPipeline::TakeCheckpoint(uint64_t now, bool may_break) {
  RestorePoint rp;
  rp.server_fds = server_fds_;
  rp.open_conns = open_conns_;
  rp.replay_conns = replayer_->OpenConns();
  rp.log_bytes = log_bytes_applied_;
  rp.ticks = ticks_applied_;
  rp.membership = EncodeMembership(core_.MembershipAt(applied_));
  if (!checkpointer_->StartDump(applied_, applied_ - ticks_applied_, log_bytes_applied_,
                                server_->pid(), EncodeRestorePoint(rp), now, may_break))
    return false;
  dump_watch_fd_ = checkpointer_->fd();
  LS_ASSERT(dump_watch_fd_ >= 0, "a dump runs without a pidfd");
  loop_.Add(dump_watch_fd_, [](uint32_t) { return false; });  // wakes the loop when criu exits
  return true;
}

// ---------------------------------------------------------------- the leader's own checkpoint

bool ServerPipeline::StartLeaderCheckpoint(uint64_t now, std::string* why_not) {
  if (core_.role() != Role::kLeader)
    *why_not = "this replica does not lead";
  else if (!server_ || !server_failed_.empty())
    *why_not = "its server is not running";
  else if (!checkpointer_)
    *why_not = "checkpoints are off on the leader";
  else
    why_not->clear();
  if (!why_not->empty()) return false;
  leader_cp_news_->Set(true);
  if (leader_cp_ == LeaderCheckpoint::kPreparing) return true;  // not at rest yet: it serves
  if (leader_cp_ == LeaderCheckpoint::kDumping || leader_cp_ == LeaderCheckpoint::kCommitting) {
    leader_cp_again_ = true;  // of the server before this was asked: another follows
    return true;
  }
  leader_cp_ = LeaderCheckpoint::kPreparing;
  leader_cp_since_us_ = now;
  leader_cp_index_ = 0;
  // Every connection open in the log is closed through it, this leader's
  // own clients' too (ApplyCommitted, as a restored leader does); inputs
  // are refused meanwhile (ProcessSubmissions), so the server comes to rest.
  close_old_pending_ = true;
  close_old_after_ = core_.last_index();
  close_all_open_ = true;
  log_(
      "checkpointing this leader's own server for a repair: closing every client connection and "
      "refusing new inputs until it rests");
  return true;
}

void ServerPipeline::FailLeaderCheckpoint(const std::string& why) {
  leader_cp_ = LeaderCheckpoint::kNone;
  leader_cp_again_ = false;
  // A backup waiting for it is told there is none, and why.
  leader_cp_news_->Set(false, "the leader's checkpoint of its own server failed: " + why);
  log_("LEADER CHECKPOINT FAILED: %s; serving clients again", why.c_str());
}

// At rest means what it means for a backup's checkpoint, and more: none of
// this leader's own connections open or in flight (their TCP ends cannot
// move to another host), none being closed, every committed entry applied.
// What the shim holds for the server (inputs handed to it and not yet read,
// EOFs) is in the image and is read by the restored server as by this one.
bool ServerPipeline::LeaderCheckpointStep(uint64_t now) {
  switch (leader_cp_) {
    case LeaderCheckpoint::kPreparing: {
      if (core_.role() != Role::kLeader) {
        FailLeaderCheckpoint("leadership moved before the server came to rest");
        return false;
      }
      // A connection whose ACCEPT was in flight when the sweep went out is
      // open in the log only now: another sweep closes it.
      if (!close_old_pending_ && own_pending_.empty()) {
        for (const auto& [no, key] : own_conns_) {
          if (!open_conns_.count(key) || closing_.count(key)) continue;
          close_old_pending_ = true;
          close_old_after_ = applied_;
          close_all_open_ = true;
          break;
        }
      }
      std::string busy = close_old_pending_ ? "connections about to be closed" : RestBusy();
      if (busy.empty() && applied_ != core_.commit_index())
        busy = "entries committed and not yet applied";
      if (!busy.empty()) {
        if (now - leader_cp_since_us_ < kLeaderRestWaitUs) return false;  // applying goes on
        FailLeaderCheckpoint("the server did not come to rest within " +
                             std::to_string(kLeaderRestWaitUs / 1000) + " ms (" + busy + ")");
        return false;
      }
      leader_cp_index_ = applied_;
      if (!TakeCheckpoint(now, /*may_break=*/false)) {
        FailLeaderCheckpoint(checkpointer_->last_error());
        return false;
      }
      leader_cp_ = LeaderCheckpoint::kDumping;
      log_("leader checkpoint %lu: the server rests after %.1f ms; dumping it",
           (unsigned long)leader_cp_index_, (now - leader_cp_since_us_) / 1000.0);
      return true;
    }
    case LeaderCheckpoint::kCommitting:
      // Serving again meanwhile: Healthy's Poll collects the commit.
      if (checkpointer_->committing()) return false;
      if (checkpointer_->newest_index() >= leader_cp_index_) {
        leader_cp_ = LeaderCheckpoint::kNone;
        log_("leader checkpoint %lu committed, %.1f ms after it was asked for",
             (unsigned long)leader_cp_index_, (now - leader_cp_since_us_) / 1000.0);
        if (leader_cp_again_) {
          leader_cp_again_ = false;
          std::string ignored;
          StartLeaderCheckpoint(now, &ignored);
        } else {
          leader_cp_news_->Set(false);
        }
      } else {
        FailLeaderCheckpoint(checkpointer_->last_error().empty()
                                 ? "the dump was abandoned (see the log)"
                                 : checkpointer_->last_error());
      }
      return false;
    default: return false;
  }
}

// ---------------------------------------------------------------- restores

// The log now starts past `index`: the core takes the configuration at it
// from the checkpoint just restored (its log lacks the entries that made it).
void ServerPipeline::InstallRestored(uint64_t now, uint64_t index) {
  if (restored_membership_)
    core_.InstallCheckpoint(now, index, *restored_membership_);
  else
    core_.InstallCheckpoint(now, index);
}

bool ServerPipeline::RestoreServer(const CheckpointInfo& cp, std::string* error) {
  RestorePoint rp;
  if (!DecodeRestorePoint(cp.meta.extra, &rp)) {
    *error = "its record of the daemon's side does not decode (written by another version?)";
    return false;
  }
  restored_membership_.reset();
  if (!rp.membership.empty()) {
    Membership m;
    std::string why = DecodeMembership(rp.membership, &m);
    if (!why.empty()) {
      *error = "its record of the cluster's configuration: " + why;
      return false;
    }
    restored_membership_ = m;
  }
  if (dump_watch_fd_ >= 0) {
    loop_.Remove(dump_watch_fd_);
    dump_watch_fd_ = -1;
    checkpointer_->AbandonDump("the server is replaced from checkpoint " +
                               std::to_string(cp.index));
  }
  if (server_) server_->Kill();  // its state is being replaced: no graceful stop
  DropServer();
  uint64_t t0 = NowUs();
  std::string dir = me_.dir + "/server";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!checkpointer_->store().RestoreDataDir(cp.index, dir, error)) return false;
  // The server's output goes to server.log (opened for appending), which
  // the image names: a replica whose server never ran here (cloned_start)
  // has none yet.
  if (FILE* f = fopen((me_.dir + "/server.log").c_str(), "a")) fclose(f);
  // Another replica's images name its files, its port and, on hosts of
  // their own, its address: restore a view of them that names ours.
  std::string img_dir = cp.path + "/img";
  if (cp.meta.replica_id != static_cast<uint64_t>(me_.id)) {
    if (cp.meta.replica_id >= cfg_.replicas.size()) {
      *error = "it was taken by replica " + std::to_string(cp.meta.replica_id) +
               ", which this cluster does not have";
      return false;
    }
    const ReplicaConfig& from = cfg_.replicas[cp.meta.replica_id];
    Relocation r{std::filesystem::absolute(from.dir).lexically_normal().string(),
                 std::filesystem::absolute(me_.dir).lexically_normal().string(),
                 static_cast<uint32_t>(from.server_port),
                 static_cast<uint32_t>(me_.server_port),
                 from.host,
                 me_.host};
    img_dir = me_.dir + "/restore-view";
    if (!BuildRelocatedView(cp.path + "/img", img_dir, r, error)) return false;
  }
  CriuJob job;
  CriuOptions o;
  o.timeout_ms = static_cast<int>(cfg_.checkpoint.timeout_ms);
  o.file_locks = cfg_.checkpoint.file_locks;
  if (!job.StartRestore(img_dir, me_.dir + "/restore.pid", {}, o, error)) return false;
  CriuResult r;
  job.Wait(&r);
  if (!r.ok) {
    *error = r.error + " (criu's log: " + r.log_path + ")";
    return false;
  }
  std::vector<std::string> argv;
  std::string ignored;
  SplitCommand(cfg_.server.command, &argv, &ignored);
  server_ = std::make_unique<ServerProcess>();
  server_->Adopt(r.restored_pid, argv.empty() ? "server" : argv[0], me_.dir + "/server.log");
  shim_ = std::make_unique<ShimChannel>();
  if (!shim_->Adopt(r.restored_pid, rp.server_fds, error)) {
    kill(r.restored_pid, SIGKILL);
    DropServer();
    return false;
  }
  server_fds_ = rp.server_fds;
  ConnectServer();
  // Fresh replay connections in place of the restored (closed) ones; they
  // connect now and the server accepts them as soon as it runs.
  replayer_->Reattach(rp.replay_conns);
  applied_ = cp.index;
  restored_index_ = cp.index;
  log_bytes_applied_ = rp.log_bytes;
  ticks_applied_ = std::min(rp.ticks, applied_);
  open_conns_ = rp.open_conns;
  ResumeRole();
  bytes_read_seen_ = 0;
  last_read_change_us_ = NowUs();  // it has the suffix to read
  kill(r.restored_pid, SIGCONT);
  checkpointer_->NoteRestore();
  // The restored checkpoint is the last one taken, for the policy: the next
  // is due an interval (of entries, log bytes, seconds) after it.
  checkpointer_->Postpone(cp.index - ticks_applied_, rp.log_bytes, NowUs());
  log_(
      "restored checkpoint %lu in %.0f ms (server pid %d, %zu replay connections); replaying "
      "the log from entry %lu",
      (unsigned long)cp.index, (NowUs() - t0) / 1000.0, r.restored_pid, rp.replay_conns.size(),
      (unsigned long)cp.index + 1);
  return true;
}

void ServerPipeline::ResumeRole() {
  bool leading = core_.role() == Role::kLeader;
  shim_->SetLeader(leading);
  if (!leading) return;
  // Like a new leader: catch the server up, close every connection (its own
  // clients' died with the old server, whose inputs are now replayed), then
  // serve.
  serving_ballot_ = 0;
  close_old_pending_ = true;
  close_old_after_ = core_.last_index();
  close_all_open_ = true;
}

bool ServerPipeline::RestoreNewest(uint64_t max_index, const char* why) {
  // The log must hold every entry after the checkpoint.
  uint64_t oldest_usable = core_.first_index() - 1;
  for (;;) {
    std::optional<CheckpointInfo> cp = checkpointer_->NewestGood(max_index);
    if (!cp) return false;
    if (cp->index < oldest_usable) {
      log_(
          "checkpoint %lu is older than this replica's log, which starts at entry %lu: it "
          "cannot be brought forward",
          (unsigned long)cp->index, (unsigned long)core_.first_index());
      return false;
    }
    std::string err;
    if (RestoreServer(*cp, &err)) return true;
    log_("CANNOT RESTORE checkpoint %lu (%s): %s; trying an older one", (unsigned long)cp->index,
         why, err.c_str());
    if (cp->index == 0) return false;
    max_index = cp->index - 1;
  }
}

bool ServerPipeline::Recover(const std::string& how, uint64_t now) {
  crashes_++;
  // A leader's clients are served by nobody until its server is back (a
  // checkpoint's restore and the log's replay, or a fresh start: hundreds
  // of ms), while a backup's server is up: leadership goes to the backup
  // furthest along first, as for a stopped server (HandOverIfStopped), and
  // this server comes back as a backup's. Not when the server crashed by
  // itself: an input that crashes it crashes every replica's, and handing
  // over would only move leadership from one dying server to the next.
  if (core_.role() == Role::kLeader && server_ && !server_->Crashed()) {
    int successor = core_.FurthestReadyPeer();
    if (successor >= 0 && core_.HandOver(now, successor, kStoppedHoldUs))
      log_(
          "this leader's server died: handed leadership over to replica %d while it is brought "
          "back",
          successor);
  }
  // The input it died on: the newest one whose bytes it had begun to read,
  // if it was still at work: something unread, or reading shortly before
  // (a crash handler may take a while: redis writes a report first). A
  // server killed while idle names no input.
  bool all_read = true;
  uint64_t entry = replayer_ ? replayer_->EntryBeingRead(&all_read) : 0;
  bool working = !all_read || now - last_read_change_us_ <= kCrashAttributionUs ||
                 (replayer_ && replayer_->BytesRead() != bytes_read_seen_);
  if (!working) entry = 0;
  // A crash's own words (an assertion, a sanitizer's summary) are the
  // likeliest to be the log's last lines: quoted, they reach whoever reads
  // this log, on CI the only thing left of the run.
  std::string said = server_ && server_->Crashed() ? server_->LogTail(4) : "";
  log_("SERVER DIED: the server %s %s %lu%s%s", how.c_str(),
       entry ? "while executing log entry" : "with the log applied up to entry",
       (unsigned long)(entry ? entry : applied_),
       said.empty() ? "" : "; its log ends:", said.c_str());
  // No crash loop: the same input twice, or three deaths in a row without
  // the log moving on, and the server is not brought back again.
  deaths_without_progress_ = applied_ <= last_death_applied_ ? deaths_without_progress_ + 1 : 1;
  last_death_applied_ = applied_;
  std::string loop;
  if (entry && entry == last_crash_entry_)
    loop = "the server died twice at log entry " + std::to_string(entry) + " (" + how +
           "): an input that kills it";
  else if (deaths_without_progress_ >= kMaxDeathsWithoutProgress)
    loop = "the server died " + std::to_string(deaths_without_progress_) +
           " times without getting past log entry " + std::to_string(applied_) + " (" + how + ")";
  if (!loop.empty()) {
    server_failed_ = loop + "; it is not restored again (lockstep cluster restart --id " +
                     std::to_string(me_.id) + " tries again)";
    log_("SERVER NOT RESTORED: %s. This replica keeps its log and votes.", server_failed_.c_str());
    DropServer();
    return true;
  }
  if (entry) last_crash_entry_ = entry;
  uint64_t before = applied_;
  if (checkpointer_ && RestoreNewest(before, "the server died")) return true;
  if (core_.first_index() > 1) {
    DropServer();
    RebuildFromPeer("the server died");
    return true;
  }
  if (cfg_.server.cloned_start) {  // a fresh server would not be a clone
    DropServer();
    CloneFromPeer("the server died and no checkpoint here restores");
    return true;
  }
  std::string err;
  if (!StartAfresh("the server died", &err)) {
    server_failed_ = "the server died and cannot be started again: " + err;
    log_("SERVER NOT RESTORED: %s", server_failed_.c_str());
  }
  return true;
}

bool ServerPipeline::StartAfresh(const char* why, std::string* error) {
  LS_ASSERT(core_.first_index() == 1, "a fresh server needs the whole log (it starts at %lu)",
            (unsigned long)core_.first_index());
  if (dump_watch_fd_ >= 0) {
    loop_.Remove(dump_watch_fd_);
    dump_watch_fd_ = -1;
    checkpointer_->AbandonDump("the server is started afresh");
  }
  if (server_) server_->Kill();  // its state is being replaced: no graceful stop
  DropServer();
  if (!LaunchServer(error)) {
    DropServer();
    return false;
  }
  open_conns_.clear();
  restored_index_ = 0;
  ResumeRole();
  bytes_read_seen_ = 0;
  last_read_change_us_ = NowUs();
  log_("%s; no checkpoint to restore: started the server afresh; replaying the whole log", why);
  return true;
}

// ---------------------------------------------------------------- state transfer

void ServerPipeline::RebuildFromPeer(const std::string& why) {
  uint64_t need = core_.first_index() - 1;
  LS_ASSERT(need > 0, "a log from entry 1 rebuilds any server");
  if (!fetcher_) {
    server_failed_ = why + ", the log starts at entry " + std::to_string(need + 1) +
                     " and checkpoints are off here: the server cannot be rebuilt";
    log_("SERVER NOT STARTED: %s", server_failed_.c_str());
    return;
  }
  log_(
      "%s; no checkpoint here brings the server to the log's start (entry %lu): fetching one "
      "from a peer",
      why.c_str(), (unsigned long)need + 1);
  fetch_for_ = FetchFor::kNoServer;
  fetch_min_ = need;
  if (!fetcher_->active()) fetcher_->Start(fetch_min_);
}

bool ServerPipeline::RestoreIndex(uint64_t index, std::string* error) {
  for (const CheckpointInfo& cp : checkpointer_->List())
    if (cp.index == index && cp.ok) return RestoreServer(cp, error);
  *error = "checkpoint " + std::to_string(index) + " is not in the store";
  return false;
}

void ServerPipeline::TransferStep(uint64_t now) {
  uint64_t need = core_.checkpoint_needed();
  if (!fetcher_) {
    if (need && !transfer_off_warned_)
      log_(
          "this replica lacks entries the leader truncated (up to %lu) and has checkpoints off: "
          "it cannot catch up (turn [checkpoint] on)",
          (unsigned long)need);
    transfer_off_warned_ = need != 0;
    return;
  }
  // A dump in flight finishes first: a restore now would swap the data
  // directory under it (dumps are short; a fetch waits for them).
  if (checkpointer_->dumping()) return;
  if (fetcher_->active()) {
    uint64_t index = 0;
    bool fetched = false;
    std::string summary;
    if (!fetcher_->Collect(&fetched, &index, &summary)) return;  // still fetching
    std::string err;
    if (!fetched && fetch_for_ == FetchFor::kClone) {
      // Replica 0's image comes a moment after the cluster starts (its
      // server's start-up, the dump): asked again soon, said now and then.
      if (now - clone_said_us_ >= kCloneSayUs) {
        log_(
            "cloned start: waiting %.1f s so far for a peer's checkpoint to start the server "
            "from (%s)",
            (now - clone_since_us_) / 1e6, summary.c_str());
        clone_said_us_ = now;
      }
      next_fetch_us_ = now + kCloneRetryUs;
      return;
    }
    if (!fetched) {
      log_("STATE TRANSFER FAILED: %s; trying again in %lu s", summary.c_str(),
           (unsigned long)(kFetchRetryUs / 1000000));
    } else if (!RestoreIndex(index, &err)) {
      log_("STATE TRANSFER FAILED: cannot restore the fetched checkpoint %lu: %s",
           (unsigned long)index, err.c_str());
    } else {
      checkpointer_->NoteFetched();
      if (clone_hold_) {
        core_.HoldCandidacy(0);  // its server runs: it may lead
        clone_hold_ = false;
        log_("cloned start: the server runs from checkpoint %lu, %.1f s after it was asked for",
             (unsigned long)index, (now - clone_since_us_) / 1e6);
      }
      // Only a backup the leader truncated past moves its log: a server
      // rebuilt for a log that still holds what follows the checkpoint keeps
      // that log whole (slots past the checkpoint may hold the only other
      // copy of a chosen entry). Restored past the commit index it knows,
      // it applies on once the commit index passes it (ApplyCommitted).
      if (fetch_for_ == FetchFor::kLagging) InstallRestored(now, index);
      log_("state transfer: %s, restored; the log goes on from entry %lu", summary.c_str(),
           (unsigned long)index + 1);
      if (fetch_for_ == FetchFor::kRepair) {
        repair_transfer_ = RepairTransfer::kDone;
        repair_transfer_index_ = index;
      }
      fetch_for_ = FetchFor::kNone;
      return;
    }
    if (fetch_for_ == FetchFor::kRepair && ++repair_fetch_failures_ >= kRepairFetchTries) {
      repair_transfer_ = RepairTransfer::kFailed;
      repair_transfer_error_ =
          index ? "the fetched checkpoint " + std::to_string(index) + " does not restore: " + err
                : summary;
      fetch_for_ = FetchFor::kNone;
      return;
    }
    // A lagging backup asks again from what the leader says then; a dead
    // server's fetch is simply tried again.
    if (fetch_for_ == FetchFor::kLagging) fetch_for_ = FetchFor::kNone;
    next_fetch_us_ = now + kFetchRetryUs;
    return;
  }
  if (now < next_fetch_us_) return;
  if (fetch_for_ == FetchFor::kNoServer) {
    fetcher_->Start(fetch_min_);
    return;
  }
  if (fetch_for_ == FetchFor::kClone) {
    fetcher_->Start(0, {0});  // replica 0 has the image first
    return;
  }
  if (fetch_for_ == FetchFor::kRepair) {  // again from those that agree, never from the others
    fetcher_->Start(fetch_min_, repair_sources_, /*only_first=*/true);
    return;
  }
  if (!need || core_.role() != Role::kBackup) return;
  std::vector<CheckpointInfo> listed = checkpointer_->List();
  // Restarted from its own checkpoint, the server may already be where the
  // leader's log begins: the commit index it told the leader lagged what it
  // had applied (the checkpoint proves those entries chosen). Nothing to
  // restore; a checkpoint at that index keeps a restart local.
  if (server_ && applied_ >= need && !listed.empty() && listed.front().index == applied_ &&
      listed.front().ok) {
    log_("the leader's log begins past this replica's commit index; the server is already at %lu",
         (unsigned long)applied_);
    core_.InstallCheckpoint(now, applied_);
    return;
  }
  // A checkpoint of our own may be recent enough (listed first: verifying
  // one that is too old would hash it on every retry for nothing).
  std::optional<CheckpointInfo> own;
  if (!listed.empty() && listed.front().index >= need) own = checkpointer_->NewestGood(UINT64_MAX);
  std::string err;
  if (own && own->index >= need) {
    if (RestoreServer(*own, &err)) {
      InstallRestored(now, own->index);
      return;
    }
    log_("cannot restore this replica's checkpoint %lu: %s", (unsigned long)own->index,
         err.c_str());
  }
  log_(
      "this replica lacks entries the leader truncated (it needs a checkpoint of index >= %lu): "
      "fetching one from a peer",
      (unsigned long)need);
  fetch_for_ = FetchFor::kLagging;
  fetch_min_ = need;
  fetcher_->Start(need);
}

// ---------------------------------------------------------------- cloned start
//
// With the profile's cloned_start, only one server is ever started from its
// command line: replica 0's, in a new cluster. It is dumped at index 0 once
// it is ready, before its first input, and every other server, on any
// replica and at any time, is a restore of a checkpoint: that image or a
// later one, which descends from it. Whatever a server draws at its start
// where the shim cannot reach (MariaDB's my_rnd seeds, start times, hash
// seeds, where its allocator put things) is then the same on every replica,
// and the same inputs in the same order keep it so.

bool ServerPipeline::IsCloneOrigin(std::string* why_not) {
  if (me_.id != 0) {
    *why_not = "cloned_start: replica 0 starts the first server";
    return false;
  }
  if (core_.last_index() > 0 || checkpointer_->kept() > 0) {
    *why_not = "cloned_start: this replica has a log or checkpoints of this cluster";
    return false;
  }
  // Replica 0 with nothing is the origin of a new cluster, unless its peers
  // say the cluster is older (this replica's directory was lost): a fresh
  // server here would differ from theirs, and any of their checkpoints
  // serves instead. A peer that does not answer yet says nothing: at a new
  // cluster's start they all come up at once.
  for (int r = 0; r < static_cast<int>(cfg_.replicas.size()); r++) {
    if (r == me_.id) continue;
    std::string err;
    DaemonStatus st;
    auto c = Client::Connect(cfg_, r, kClonePeerTimeoutMs, &err, Principal::kReplica, me_.id);
    if (!c || !c->Status(&st, &err, 4 * kClonePeerTimeoutMs)) continue;
    uint64_t kept = JsonU64(st.checkpoint, "kept");
    if (st.commit_index != 0 || kept != 0) {
      *why_not = "cloned_start: replica " + std::to_string(r) +
                 " has this cluster's state (commit index " + std::to_string(st.commit_index) +
                 ", " + std::to_string(kept) + " checkpoints) and this replica has none";
      return false;
    }
  }
  return true;
}

bool ServerPipeline::StartCloneOrigin() {
  std::string err;
  if (!LaunchServer(&err)) {
    log_("%s", err.c_str());
    return false;
  }
  if (!checkpointer_) {  // LaunchServer turns them off when CRIU could not restore
    log_("SERVER NOT STARTED: cloned_start needs checkpoints, which are off here (see above)");
    return false;
  }
  uint64_t t0 = NowUs();
  if (!TakeCheckpoint(t0)) {
    log_("SERVER NOT STARTED: cloned_start: cannot dump the server every replica's starts from: %s",
         checkpointer_->last_error().c_str());
    return false;
  }
  // Waited for here, before the loop runs: nothing reaches the server
  // meanwhile (no leader yet), and the image is in the store before any
  // peer can ask for it.
  std::string data_dir = me_.dir + "/server";
  while (checkpointer_->dumping() || checkpointer_->committing()) {
    pollfd p{dump_watch_fd_, POLLIN, 0};
    if (checkpointer_->dumping())
      poll(&p, 1, 100);
    else
      usleep(5000);
    checkpointer_->Poll(data_dir, NowUs());
  }
  loop_.Remove(dump_watch_fd_);
  dump_watch_fd_ = -1;
  if (checkpointer_->kept() == 0) {
    log_(
        "SERVER NOT STARTED: cloned_start: the dump of the server every replica's starts from "
        "failed: %s",
        checkpointer_->last_error().c_str());
    return false;
  }
  log_(
      "cloned start: the server dumped at index 0 in %.0f ms; every other replica's server "
      "starts from this image",
      (NowUs() - t0) / 1000.0);
  return true;
}

void ServerPipeline::CloneFromPeer(const std::string& why) {
  LS_ASSERT(fetcher_, "cloned_start runs with checkpoints");
  log_("%s: fetching a peer's checkpoint to start the server from", why.c_str());
  fetch_for_ = FetchFor::kClone;
  fetch_min_ = 0;
  next_fetch_us_ = 0;
  clone_since_us_ = clone_said_us_ = NowUs();
  // A leader without a server serves nobody: it stands for no election
  // until its server runs (it still votes).
  core_.HoldCandidacy(UINT64_MAX);
  clone_hold_ = true;
}

}  // namespace lockstep
