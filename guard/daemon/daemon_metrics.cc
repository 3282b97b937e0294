// daemon_metrics.cc — the names, types and help texts of the lockstep_*
// metrics (daemon_metrics.h), and CommitClock.
#include "guard/daemon/daemon_metrics.h"

#include <algorithm>

namespace lockstep {

void CommitClock::OnAppended(bool leading, uint64_t last_index, uint64_t now_us) {
  if (!leading) {
    leading_ = false;
    return;
  }
  if (!leading_) {  // just became leader: what is in the log now was not proposed by us
    leading_ = true;
    stamped_to_ = last_index;
    committed_to_ = std::max(committed_to_, last_index);
    return;
  }
  if (last_index <= stamped_to_) return;
  uint64_t from = std::max(stamped_to_ + 1, last_index >= kSlots ? last_index - kSlots + 1 : 1);
  for (uint64_t i = from; i <= last_index; i++) slots_[i % kSlots] = Slot{i, now_us};
  stamped_to_ = last_index;
}

void CommitClock::OnCommitted(uint64_t commit_index, uint64_t now_us, Histogram* latency) {
  if (!leading_) {
    committed_to_ = std::max(committed_to_, commit_index);
    return;
  }
  if (commit_index <= committed_to_) return;
  uint64_t from =
      std::max(committed_to_ + 1, commit_index >= kSlots ? commit_index - kSlots + 1 : 1);
  for (uint64_t i = from; i <= commit_index && i <= stamped_to_; i++) {
    const Slot& s = slots_[i % kSlots];
    if (s.index == i) latency->ObserveUs(now_us >= s.appended_us ? now_us - s.appended_us : 0);
  }
  committed_to_ = commit_index;
}

DaemonMetrics::DaemonMetrics(int replicas, int my_id) {
  MetricsRegistry& r = registry;
  r.AddGauge("lockstep_replica_id", "This daemon's replica id (cluster.toml [[replica]] id).")
      ->Set(my_id);
  r.AddGauge("lockstep_replicas", "Replicas in the cluster (cluster.toml).")->Set(replicas);
  const char* members_help =
      "Replicas in the configuration this replica holds (lockstep member list), by kind: "
      "voters count toward majorities, learners receive the log only.";
  voters = r.AddGauge("lockstep_members", members_help, {{"kind", "voter"}});
  learners = r.AddGauge("lockstep_members", members_help, {{"kind", "learner"}});
  const char* role_help =
      "1 for the role this replica has now (leader, candidate or backup), 0 for the others.";
  role[static_cast<int>(Role::kLeader)] =
      r.AddGauge("lockstep_role", role_help, {{"role", "leader"}});
  role[static_cast<int>(Role::kCandidate)] =
      r.AddGauge("lockstep_role", role_help, {{"role", "candidate"}});
  role[static_cast<int>(Role::kBackup)] =
      r.AddGauge("lockstep_role", role_help, {{"role", "backup"}});
  SetRole(Role::kBackup);
  ballot_round = r.AddGauge("lockstep_ballot_round",
                            "Round of the highest ballot this replica promised (ballots are "
                            "round.leader; a new election raises it).");
  ballot_leader = r.AddGauge("lockstep_ballot_leader",
                             "Leader id of the highest ballot this replica promised: the replica "
                             "that leads, or stands, in that ballot.");
  leader_changes = r.AddCounter(
      "lockstep_leader_changes_total",
      "Times the ballot this replica promised changed since it started (each ballot has one "
      "leader: an election, won or not).");
  commit_index = r.AddGauge("lockstep_commit_index", "Highest log index known committed here.");
  applied_index = r.AddGauge("lockstep_applied_index",
                             "Highest log index applied to this replica's server (its replay).");
  first_index = r.AddGauge("lockstep_first_index",
                           "Lowest log index this replica still holds (below: truncated, covered "
                           "by a checkpoint).");
  last_index = r.AddGauge("lockstep_last_index", "Highest log index this replica holds.");
  replay_lag = r.AddGauge("lockstep_replay_lag_entries",
                          "Entries committed but not yet applied to this replica's server "
                          "(commit index - applied index).");
  commit_latency = r.AddHistogram(
      "lockstep_commit_latency_seconds",
      "Leader only: time from an entry's append to the log (its proposal) to its commit (a "
      "majority holds it durable), per entry.");
  peer_lag.assign(replicas, nullptr);
  for (int id = 0; id < replicas; id++)
    if (id != my_id)
      peer_lag[id] = r.AddGauge("lockstep_peer_lag_entries",
                                "Leader only (0 elsewhere): entries of the leader's log a peer "
                                "does not yet hold (last index - the peer's match index).",
                                {{"peer", std::to_string(id)}});
  disk_write = r.AddHistogram("lockstep_disk_write_seconds",
                              "Duration of each append (write and fsync, one batch of records) "
                              "to the durable log.");
  disk_write_errors = r.AddCounter(
      "lockstep_disk_write_errors_total",
      "Appends to the durable log that failed (each retry counts; new proposals are refused "
      "meanwhile).");
  disk_ring_writes = r.AddCounter(
      "lockstep_disk_ring_writes_total",
      "Appends to the durable log written through io_uring from the replica's loop (the "
      "others went through its disk thread: a new segment, a truncation, a retry, or no "
      "io_uring at all).");
  disk_error =
      r.AddGauge("lockstep_disk_error", "1 while the durable log's writes fail, 0 otherwise.");
  log_bytes = r.AddCounter("lockstep_log_written_bytes_total",
                           "Payload bytes of the log entries this replica persisted (its share "
                           "of the clients' input).");
  log_records = r.AddCounter("lockstep_log_written_records_total",
                             "Records appended to the durable log (entries and promises).");
  checkpoints_taken = r.AddCounter(
      "lockstep_checkpoints_taken_total",
      "Checkpoints (CRIU dumps) of this replica's server taken and committed since it started.");
  checkpoints_failed = r.AddCounter(
      "lockstep_checkpoints_failed_total",
      "Checkpoints of this replica's server that failed since it started (the log says why).");
  checkpoint_dump = r.AddHistogram("lockstep_checkpoint_dump_seconds",
                                   "How long each taken checkpoint's CRIU dump took (the server "
                                   "is paused meanwhile).");
  checkpoint_last_bytes = r.AddGauge("lockstep_checkpoint_last_size_bytes",
                                     "Size of the newest checkpoint taken here (images and data "
                                     "directory), 0 before the first.");
  divergences = r.AddCounter("lockstep_divergences_total",
                             "Divergences this replica found while it led (a replica's output or "
                             "state differed from the others').");
  const char* repairs_help =
      "Repairs of divergent replicas this replica ordered while it led, by outcome.";
  repairs_ok = r.AddCounter("lockstep_repairs_total", repairs_help, {{"outcome", "repaired"}});
  repairs_failed = r.AddCounter("lockstep_repairs_total", repairs_help, {{"outcome", "failed"}});
  recurrences = r.AddCounter("lockstep_divergence_recurrences_total",
                             "Divergences that came back soon after their replica's repairs "
                             "(reported once as recurring; no more repairs ordered).");
  client_connections = r.AddGauge(
      "lockstep_client_connections",
      "Authenticated connections on this daemon's client port (lockstep commands, clients).");
  const char* client_help =
      "Bytes of frames on this daemon's client port (after TLS), by direction.";
  client_bytes_in =
      r.AddCounter("lockstep_client_port_bytes_total", client_help, {{"direction", "in"}});
  client_bytes_out =
      r.AddCounter("lockstep_client_port_bytes_total", client_help, {{"direction", "out"}});
  const char* peer_help =
      "Bytes of frames on this daemon's connections to its peers (after TLS; the log itself "
      "goes by UCX), by direction.";
  peer_bytes_in = r.AddCounter("lockstep_peer_port_bytes_total", peer_help, {{"direction", "in"}});
  peer_bytes_out =
      r.AddCounter("lockstep_peer_port_bytes_total", peer_help, {{"direction", "out"}});
  tls_handshake_failures = r.AddCounter(
      "lockstep_tls_handshake_failures_total",
      "Connections to the peer or client port closed before their TLS handshake completed "
      "(failed, too slow, or too many at once).");
  auth_failures = r.AddCounter(
      "lockstep_auth_failures_total",
      "Connections closed after TLS but before they authenticated (a wrong secret, no HELLO "
      "in time, too many at once).");
  lease_left = r.AddGauge("lockstep_lease_left_seconds",
                          "How much longer this leader's lease holds (0: none, or not leading).");
  lease_reads = r.AddCounter(
      "lockstep_lease_reads_total",
      "Read-only requests this leader's server answered under its lease, without the log "
      "(counted by its server's shim: from 0 again when the server restarts).");
  lease_misses = r.AddCounter(
      "lockstep_lease_misses_total",
      "Read-only requests that went through the log because no lease held when they came.");
  own_gaps = r.AddCounter("lockstep_own_gaps_total",
                          "Times this daemon's loop found it had not run for a while (the "
                          "machine or the VM stalled it): not counted against its peers.");
}

void DaemonMetrics::SetRole(Role now) {
  for (int i = 0; i < 3; i++) role[i]->Set(i == static_cast<int>(now) ? 1 : 0);
}

}  // namespace lockstep
