// answers.h — the JSON a daemon answers the CLI and its peers with, read
// back: its status (FrontDoor::StatusJson) and its checkpoint list
// (ServerPipeline::CheckpointListJson). The text comes from another
// process, possibly of another version or broken: a reader reports what is
// wrong and never throws (a peer's status is read in threads with no catch).
// fuzz/fuzz_json feeds them arbitrary bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "guard/common/json.h"

namespace lockstep {

// A daemon's status, the fields its readers use; a field that is missing
// or of another type reads as its default.
struct DaemonStatus {
  std::string role;  // "leader", "backup", ...
  std::string ballot, disk_error;
  uint64_t commit_index = 0, last_index = 0, first_index = 0, applied_index = 0;
  // How much longer the leader's lease holds, and a backup guards one (0: none).
  uint64_t lease_left_us = 0, lease_guard_left_us = 0;
  // Reads the leader's shim served under its lease, and read-only requests
  // it sent through the log for want of one.
  uint64_t lease_reads = 0, lease_misses = 0;
  bool server_read_all = true;
  bool serving = false;  // leads, and its server serves clients (not catching up)
  int server_pid = 0;
  // The nested status objects as sent ("checkpoint": ServerPipeline's
  // CheckpointStatusJson; "output": OutputGuard's; "state_checks":
  // StateChecker's); null when absent or not objects.
  Json checkpoint, output, state_checks;
  // The configuration the replica holds ({voters, learners, next_id, index,
  // committed, this_replica}) and its peers in it ([{id, member, match,
  // stream}]), as sent; null / empty from an older daemon.
  Json membership, peers;
};

// false (and *error says why) when text is not a JSON object.
bool ParseDaemonStatus(std::string_view text, DaemonStatus* status, std::string* error);

// One checkpoint of a `checkpoint list` answer; missing fields read as defaults.
struct CheckpointListItem {
  int replica = -1;
  uint64_t index = 0, bytes = 0;
  int64_t time_unix = 0, dump_us = 0;
  bool ok = false;
  std::string path, error;
  Json json;  // the item as sent, for `checkpoint list --json`
};

// false (and *error says why) when text is not a JSON array; items that are
// not objects are left out.
bool ParseCheckpointList(std::string_view text, std::vector<CheckpointListItem>* items,
                         std::string* error);

}  // namespace lockstep
