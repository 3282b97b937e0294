// checkpointer.cc — see checkpointer.h.
#include "guard/server/checkpointer.h"

#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "checkpoint/spawn.h"
#include "guard/common/json.h"

namespace lockstep {

Checkpointer::Checkpointer(const CheckpointPolicy& policy, int replica_id, int replicas,
                           const std::string& replica_dir, LogFn log)
    : policy_(policy),
      id_(replica_id),
      replicas_(replicas > 0 ? replicas : 1),
      replica_dir_(replica_dir),
      log_(std::move(log)) {}

Checkpointer::~Checkpointer() {
  if (commit_thread_.joinable()) commit_thread_.join();
  job_.reset();  // kills a dump still running
  store_.Abort(&pending_);
}

bool Checkpointer::Open(std::string* error) {
  // A daemon killed mid-dump takes its criu along (PDEATHSIG), but not
  // always a helper criu had forked and stopped: nothing else ends those.
  for (pid_t pid : KillStrayCriu(replica_dir_ + "/checkpoints"))
    log_("killed criu process " + std::to_string(pid) +
         ", left dumping into this replica's checkpoints by its previous run");
  if (!store_.Open(replica_dir_, error)) return false;
  NoteKept();
  last_position_ = newest_index_;  // at most its position: the next restore says
  return true;
}

void Checkpointer::NoteKept() {
  bool newest = true;
  kept_ = 0;
  for (const auto& cp : store_.List()) {
    if (!cp.ok) continue;
    kept_++;
    if (newest) {
      newest_index_ = cp.index;
      newest_time_unix_ = cp.meta.time_unix;
      newest = false;
    }
    oldest_kept_index_ = cp.index;
  }
}

void Checkpointer::Postpone(uint64_t position, uint64_t log_bytes, uint64_t now_us) {
  requested_ = false;
  last_position_ = position;
  last_log_bytes_ = log_bytes;
  last_started_us_ = now_us;
}

bool Checkpointer::Due(uint64_t position, uint64_t log_bytes, uint64_t now_us) const {
  if (!policy_.enabled || !broken_.empty() || dumping() || commit_thread_.joinable()) return false;
  if (position <= last_position_ && !requested_) return false;
  if (requested_) return true;
  // Turns by log position: replica i's checkpoints fall due at the indices
  // k * E + i * E / n (E entries apart, n replicas), and likewise by bytes
  // of log. Every backup applies the same log, so two backups keeping up
  // never pause their servers together: they reach their turns E / n
  // entries apart. A restore or a put-off checkpoint moves to the next
  // turn, not off the schedule.
  auto due = [&](uint64_t now_at, uint64_t last_at, uint64_t every) {
    if (every == 0) return false;
    uint64_t turn = every * static_cast<uint64_t>(id_ % replicas_) / replicas_;
    uint64_t next = last_at < turn ? turn : ((last_at - turn) / every + 1) * every + turn;
    return now_at >= next;
  };
  if (due(position, last_position_, policy_.every_entries)) return true;
  if (due(log_bytes, last_log_bytes_, policy_.every_log_bytes)) return true;
  if (!last_started_us_) return false;  // the time rule counts from the first one
  return now_us - last_started_us_ >= policy_.every_seconds * 1000000;
}

bool Checkpointer::StartDump(uint64_t index, uint64_t position, uint64_t log_bytes,
                             pid_t server_pid, std::string extra, uint64_t now_us, bool may_break) {
  requested_ = false;
  last_started_us_ = now_us;
  last_position_ = position;
  dump_index_ = index;
  last_log_bytes_ = log_bytes;
  std::string err;
  if (!store_.Begin(index, &pending_, &err)) {
    last_error_ = "cannot begin checkpoint " + std::to_string(index) + ": " + err;
    log_("CHECKPOINT FAILED: " + last_error_);
    failed_++;
    return false;
  }
  CriuOptions o;
  o.timeout_ms = static_cast<int>(policy_.timeout_ms);
  o.leave_running = true;
  o.network_lock = false;  // at rest: nothing in flight on the replay connections (criu.h)
  o.file_locks = policy_.file_locks;
  job_ = std::make_unique<CriuJob>();
  if (!job_->StartDump(server_pid, pending_.img_dir, o, &err)) {
    store_.Abort(&pending_);
    last_error_ = "cannot start criu for checkpoint " + std::to_string(index) + ": " + err;
    log_("CHECKPOINT FAILED: " + last_error_);
    failed_++;
    return false;
  }
  pending_extra_ = std::move(extra);
  pending_started_us_ = now_us;
  dump_server_pid_ = server_pid;
  dump_may_break_ = may_break;
  return true;
}

void Checkpointer::AbandonDump(const std::string& why) {
  if (!job_ || !job_->running()) return;
  job_.reset();  // kills criu
  store_.Abort(&pending_);
  log_("checkpoint " + std::to_string(dump_index_) + " abandoned: " + why);
}

void Checkpointer::Poll(const std::string& data_dir, uint64_t now_us) {
  if (commit_thread_.joinable() && commit_done_.load()) FinishCommit();
  if (!job_ || !job_->running()) return;
  CriuResult r;
  if (!job_->Poll(&r)) {
    if (ProcessEnded(dump_server_pid_)) AbandonDump("the server died during the dump");
    return;
  }
  uint64_t index = pending_.index;
  if (!r.ok) {
    // criu's log goes with the aborted images: keep a copy where people look.
    std::string kept = replica_dir_ + "/criu-dump-failed.log";
    std::error_code ec;
    std::filesystem::copy_file(r.log_path, kept, std::filesystem::copy_options::overwrite_existing,
                               ec);
    // Out of space: criu says so, unless its own log could not take it
    // either; then the file system, still holding the images, tells.
    bool no_space = r.error.find(strerror(ENOSPC)) != std::string::npos ||
                    r.error.find(strerror(EDQUOT)) != std::string::npos;
    struct statvfs vfs;
    if (!no_space && statvfs(pending_.img_dir.c_str(), &vfs) == 0 &&
        static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < (1u << 20)) {
      no_space = true;
      r.error += " (" + std::string(strerror(ENOSPC)) + ": less than 1 MiB is free)";
    }
    store_.Abort(&pending_);
    failed_++;
    last_error_ = "criu could not dump the server at index " + std::to_string(index) + ": " +
                  r.error + " (criu's log: " + (ec ? r.log_path + ", lost" : kept) + ")";
    // A dump that fails for a reason in the server (something CRIU cannot
    // dump) fails every time: stop trying instead of freezing it again and
    // again. A timeout may be a passing stall, and a full file system may
    // get space back: try again at the next turn.
    // Nor does one whose server died under it (killed, or crashed: the
    // guard restores it).
    bool server_died = ProcessEnded(dump_server_pid_);
    if (server_died) last_error_ += "; the server died during the dump";
    bool passing = r.timed_out || no_space || server_died || !dump_may_break_;
    if (!passing) broken_ = r.error;
    log_("CHECKPOINT FAILED: " + last_error_ +
         (no_space ? "; the checkpoints' file system (" + store_.dir() +
                         ") is full: will try again at the next turn"
          : passing ? "; will try again"
                    : "; this replica keeps serving without checkpoints"));
    return;
  }
  last_dump_us_ = r.duration_us;
  std::string err;
  if (!store_.CopyDataDir(data_dir, &pending_, &err)) {
    failed_++;
    last_error_ =
        "cannot copy the server's data for checkpoint " + std::to_string(index) + ": " + err;
    log_("CHECKPOINT FAILED: " + last_error_);
    return;
  }
  // Hashing and fsyncing the images takes long for a big server: a thread.
  CheckpointMeta meta;
  meta.replica_id = static_cast<uint64_t>(id_);
  meta.time_unix = time(nullptr);
  meta.dump_us = r.duration_us;
  meta.extra = std::move(pending_extra_);
  commit_done_ = false;
  // Pruning verifies the checkpoints it keeps (hashing them again): there too.
  commit_thread_ = std::thread([this, meta] {
    LowerThisThreadsPriority();
    commit_ok_ = store_.Commit(&pending_, meta, &commit_error_, &committed_);
    pruned_.clear();
    prune_error_.clear();
    if (commit_ok_) store_.Prune(policy_.keep, &prune_error_, &pruned_);
    commit_done_ = true;
  });
  (void)now_us;
}

void Checkpointer::FinishCommit() {
  commit_thread_.join();
  if (!commit_ok_) {
    failed_++;
    last_error_ = "cannot commit checkpoint: " + commit_error_;
    log_("CHECKPOINT FAILED: " + last_error_ + "; older checkpoints are intact");
    return;
  }
  taken_++;
  last_taken_dump_us_ = static_cast<uint64_t>(std::max<int64_t>(committed_.meta.dump_us, 0));
  last_taken_bytes_ = committed_.bytes;
  newest_index_ = committed_.index;
  newest_time_unix_ = committed_.meta.time_unix;
  last_error_.clear();
  char line[256];
  snprintf(line, sizeof line, "checkpoint %lu taken: dump %.0f ms, %.1f MB",
           (unsigned long)committed_.index, committed_.meta.dump_us / 1000.0,
           committed_.bytes / 1e6);
  log_(line);
  if (!prune_error_.empty()) log_("pruning checkpoints: " + prune_error_);
  for (const auto& r : pruned_) log_("removed " + r);
  NoteKept();
}

std::optional<CheckpointInfo> Checkpointer::NewestGood(uint64_t max_index) {
  std::vector<std::string> skipped;
  auto cp = store_.NewestGood(max_index, &skipped);
  for (const auto& s : skipped) log_("refused checkpoint " + s);
  if (skipped.empty()) return cp;
  // The refused ones can never be used: remove them (Prune would anyway),
  // so that `checkpoint list` and the truncation point do not count them.
  for (const CheckpointInfo& c : store_.List()) {
    if (c.index > max_index || (cp && c.index <= cp->index)) continue;
    std::string err;
    if (store_.Remove(c.index, &err))
      log_("removed the refused checkpoint " + std::to_string(c.index));
    else
      log_("cannot remove the refused checkpoint " + std::to_string(c.index) + ": " + err);
  }
  NoteKept();
  return cp;
}

Json Checkpointer::StatusJson(uint64_t now_us) const {
  (void)now_us;
  uint64_t newest = newest_index_.load();
  return Json{{"index", newest},
              {"age_s", newest ? static_cast<int64_t>(time(nullptr)) - newest_time_unix_ : -1},
              {"kept", kept_},
              {"taken", taken_},
              {"failed", failed_},
              {"restores", restores_},
              {"fetched", fetched_},
              {"last_dump_us", last_dump_us_},
              {"dumping", dumping()},
              {"enabled", policy_.enabled && broken_.empty()},
              {"error", last_error_}};
}

}  // namespace lockstep
