// daemon_metrics.h — the lockstep_* metrics one replica daemon exports at
// GET /metrics (cluster.toml metrics_port; guard/net/metrics_server.h), and
// the bookkeeping that measures commit latency.
//
// The daemon owns one DaemonMetrics. Three kinds of update:
//   - events, where they happen: a durable write observed by the disk writer
//     (any thread), a frame's bytes counted by its connection, a change of
//     ballot, a commit (CommitClock, below);
//   - gauges the daemon samples from the core each pass (cheap: a few
//     relaxed stores);
//   - counts a room keeps itself (checkpoints, divergences, repairs, TLS
//     failures), mirrored into counters at most every kSampleUs: the room
//     keeps no pointer into the registry.
// Cost, measured here (-O2, a loaded 2-core VM): an observation 33 ns (two
// lock-prefixed adds), a committed entry's stamp and observation 60 ns, the
// pass's gauges 9 ns; at 25000 commits a second that is 0.15% of a core.
// Rendering the ~9.7 KB exposition takes 93 us, on the listener's thread.
// Every metric's name, type and help text are in daemon_metrics.cc, and
// ops/ (the Grafana dashboard, the alert rules) uses these names.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "consensus/core.h"
#include "guard/common/metrics.h"

namespace lockstep {

// Propose → commit time of the entries this replica appends while it leads.
// A ring of (index, time appended) slots, written as the log grows and read
// as the commit index passes them: no allocation, two stores per entry.
// Entries appended before this replica led (re-proposed by an election) are
// not measured; more than kSlots entries in flight at once lose their
// stamps (and are not measured either).
class CommitClock {
 public:
  static constexpr size_t kSlots = 1 << 16;  // >= FrontDoor::kMaxUncommitted
  // Called with the log's end after anything may have been appended.
  void OnAppended(bool leading, uint64_t last_index, uint64_t now_us);
  // Called with the commit index; observes each newly committed stamped entry.
  void OnCommitted(uint64_t commit_index, uint64_t now_us, Histogram* latency);

 private:
  struct Slot {
    uint64_t index = 0;
    uint64_t appended_us = 0;
  };
  bool leading_ = false;
  uint64_t stamped_to_ = 0;    // entries up to here have a stamp (or predate leading)
  uint64_t committed_to_ = 0;  // entries up to here were looked at
  std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
};

struct DaemonMetrics {
  explicit DaemonMetrics(int replicas, int my_id);

  MetricsRegistry registry;

  // Role and ballot.
  std::array<Gauge*, 3> role{};  // by Role: leader, candidate, backup (1: this one)
  Gauge* voters;                 // the configuration's (consensus/membership.h)
  Gauge* learners;
  Gauge* ballot_round;
  Gauge* ballot_leader;
  Counter* leader_changes;
  // The log.
  Gauge* commit_index;
  Gauge* applied_index;
  Gauge* first_index;
  Gauge* last_index;
  Gauge* replay_lag;
  Histogram* commit_latency;
  std::vector<Gauge*> peer_lag;  // by replica id (own: none); the leader's view
  // The durable log.
  Histogram* disk_write;
  Counter* disk_write_errors;
  Counter* disk_ring_writes;
  Gauge* disk_error;
  Counter* log_bytes;
  Counter* log_records;
  // Checkpoints (server/checkpointer).
  Counter* checkpoints_taken;
  Counter* checkpoints_failed;
  Histogram* checkpoint_dump;
  Gauge* checkpoint_last_bytes;
  // Output checking (output/output_guard).
  Counter* divergences;
  Counter* repairs_ok;
  Counter* repairs_failed;
  Counter* recurrences;
  // The front door.
  Gauge* client_connections;
  Counter* client_bytes_in;
  Counter* client_bytes_out;
  Counter* peer_bytes_in;
  Counter* peer_bytes_out;
  Counter* tls_handshake_failures;
  Counter* auth_failures;
  // Lease reads (consensus/core.h LeaseUntil; preload/shim_rings.c).
  Gauge* lease_left;
  Counter* lease_reads;
  Counter* lease_misses;
  // The loop.
  Counter* own_gaps;

  CommitClock commit_clock;
  uint64_t next_sample_us = 0;
  uint64_t checkpoints_seen = 0;  // taken, when last mirrored (a new one's dump is observed)
  static constexpr uint64_t kSampleUs = 10000;

  void SetRole(Role r);
};

}  // namespace lockstep
