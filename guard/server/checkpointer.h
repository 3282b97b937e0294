// checkpointer.h — when and how a replica checkpoints its server, and which
// checkpoint a restore uses. It owns the replica's CheckpointStore
// (checkpoint/store.h), the CRIU dump in flight (a child process the event
// loop watches) and the commit that follows it (hashing and fsyncing
// hundreds of MB: a thread of its own, never the loop).
//
// The server pipeline decides what a checkpoint must capture (the server
// paused at a log index k with everything up to k executed, see
// ServerPipeline) and hands over the pieces; this class keeps the policy
// ([checkpoint] in cluster.toml), the bookkeeping and the status.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/criu.h"
#include "checkpoint/store.h"
#include "guard/common/config.h"
#include "guard/common/json.h"

namespace lockstep {

class Checkpointer {
 public:
  using LogFn = std::function<void(const std::string&)>;
  // replicas: the cluster's size, for the backups' turns (Due).
  Checkpointer(const CheckpointPolicy& policy, int replica_id, int replicas,
               const std::string& replica_dir, LogFn log);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  bool Open(std::string* error);
  CheckpointStore& store() { return store_; }

  // Policy: a checkpoint is due at `position` (the entries applied that the
  // entry rule counts: the applied index less the ticks among them, which
  // an idle server's timers write ten a second, issue 31; their bytes still
  // count) with log_bytes (the bytes of log applied so far). `requested`
  // (lockstep checkpoint now) makes it due at once.
  bool Due(uint64_t position, uint64_t log_bytes, uint64_t now_us) const;
  void Request() { requested_ = true; }
  // A due checkpoint could not be taken now (the server did not come to
  // rest), or the server was just restored from one: the next one is due a
  // full interval later, as if one was taken at `position`.
  void Postpone(uint64_t position, uint64_t log_bytes, uint64_t now_us);
  bool requested() const { return requested_; }

  // Starts the dump of the paused server at index; false (logged, and said
  // in the status) when it cannot start. Then Poll until it is no longer
  // dumping; the server may run again as soon as dumping() is false.
  // may_break: a dump CRIU refuses for a reason in the server turns
  // checkpoints off (broken()); a leader's one-off dump for a repair
  // (server_guard.cc) says false, since its refusal may be passing (a
  // connection in the listener's queue) and its backups' turns are not its.
  bool StartDump(uint64_t index, uint64_t position, uint64_t log_bytes, pid_t server_pid,
                 std::string extra, uint64_t now_us, bool may_break = true);
  bool dumping() const { return job_ && job_->running(); }
  // A finished dump's images are being hashed and fsynced (Poll collects it).
  bool committing() const { return commit_thread_.joinable(); }
  // Why the last checkpoint failed ("" after one succeeded).
  const std::string& last_error() const { return last_error_; }
  // The fd to watch while dumping (readable when criu exits), or -1.
  int fd() const { return job_ && job_->running() ? job_->fd() : -1; }
  // Kills a dump in flight and drops its images (the server it was dumping
  // is about to be replaced: its data directory no longer matches them).
  void AbandonDump(const std::string& why);
  // Collects a finished dump: copies data_dir (the server is still paused)
  // and starts the commit thread. Collects a finished commit too. A dump
  // whose server died under it is abandoned at once: criu may wait on the
  // dead process far longer than the timeout the caller could bear, and the
  // server cannot be reaped (and restored) while criu traces it.
  void Poll(const std::string& data_dir, uint64_t now_us);

  // The newest good checkpoint with index <= max_index; damaged ones are
  // refused, each said in the log.
  std::optional<CheckpointInfo> NewestGood(uint64_t max_index);

  // The newest committed checkpoint's index (0: none).
  uint64_t newest_index() const { return newest_index_.load(); }
  // The oldest checkpoint kept that reads back (0: none): the log below it
  // is no longer needed, since a restore uses it when every newer one is
  // refused. Refreshed when a checkpoint is committed or pruned.
  uint64_t oldest_kept_index() const { return oldest_kept_index_; }
  // How many good checkpoints the store holds (index 0 counts: a cloned
  // start's image, server_guard.cc).
  uint64_t kept() const { return kept_; }
  // Every checkpoint of this replica, newest first (as CheckpointStore::List).
  std::vector<CheckpointInfo> List() const { return store_.List(); }
  // Status JSON object: newest index and age, counts, the last error.
  Json StatusJson(uint64_t now_us) const;
  void NoteRestore() { restores_++; }
  // A checkpoint was fetched from a peer into the store.
  void NoteFetched() {
    fetched_++;
    NoteKept();
  }
  // CRIU cannot dump this server: checkpoints stop until a restart.
  bool broken() const { return !broken_.empty(); }
  // For the daemon's metrics: checkpoints taken and failed since start, and
  // the newest taken one's dump time and size (0 before one).
  struct Counts {
    uint64_t taken = 0, failed = 0;
    uint64_t last_dump_us = 0, last_bytes = 0;
  };
  Counts counts() const { return {taken_, failed_, last_taken_dump_us_, last_taken_bytes_}; }

 private:
  void FinishCommit();
  void NoteKept();  // refreshes newest/oldest kept from the store

  CheckpointPolicy policy_;
  int id_;
  int replicas_;
  std::string replica_dir_;
  LogFn log_;
  CheckpointStore store_;
  std::unique_ptr<CriuJob> job_;
  pid_t dump_server_pid_ = 0;  // the server the dump in flight is of
  bool dump_may_break_ = true;
  PendingCheckpoint pending_;
  std::string pending_extra_;
  uint64_t pending_started_us_ = 0;
  bool requested_ = false;
  std::thread commit_thread_;
  std::atomic<bool> commit_done_{false};
  bool commit_ok_ = false;
  std::string commit_error_;
  std::vector<std::string> pruned_;  // what the commit thread's prune removed, and why
  std::string prune_error_;
  CheckpointInfo committed_;
  std::atomic<uint64_t> newest_index_{0};
  uint64_t oldest_kept_index_ = 0;
  uint64_t kept_ = 0;
  int64_t newest_time_unix_ = 0;
  uint64_t last_position_ = 0;    // Due's position of the last checkpoint started
  uint64_t dump_index_ = 0;       // the log index of the dump started last
  uint64_t last_log_bytes_ = 0;   // log bytes applied then
  uint64_t last_started_us_ = 0;  // when
  uint64_t taken_ = 0, failed_ = 0, restores_ = 0, fetched_ = 0;
  int64_t last_dump_us_ = 0;
  uint64_t last_taken_dump_us_ = 0, last_taken_bytes_ = 0;  // counts()
  std::string last_error_;
  std::string broken_;  // why CRIU cannot dump this server
};

}  // namespace lockstep
