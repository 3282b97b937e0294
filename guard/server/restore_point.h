// restore_point.h — what a checkpoint records beside the server's images
// (CheckpointMeta::extra, opaque to the store): the daemon-side state that
// goes with the server as it was dumped at a log index, so that a restore
// can carry on from there. One encoder and one decoder, used by the dump
// and the restore alike.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "guard/server/replay.h"

namespace lockstep {

struct RestorePoint {
  // The fd numbers of the shim channel inside the server (region, wake
  // server, wake daemon): CRIU restores them under the same numbers, and the
  // daemon takes them from there (ShimChannel::Adopt).
  std::vector<int> server_fds;
  // Connections open according to the log at the checkpoint's index.
  std::set<ConnKey> open_conns;
  // The replay connections the server holds, their slots and byte counts.
  std::vector<Replayer::OpenConn> replay_conns;
  // Bytes of log applied up to the index (the policy's byte rule).
  uint64_t log_bytes = 0;
  // TICK entries up to the index (the entry rule leaves them out). Added
  // later: a restore point without it decodes with 0.
  uint64_t ticks = 0;
  // The cluster's configuration at the index (consensus/membership.h
  // EncodeMembership): a replica that installs the checkpoint lacks the log
  // that made it (Replica::InstallCheckpoint). Added later still: "" in an
  // older restore point (then the replica keeps the configuration it holds).
  std::string membership;
};

std::string EncodeRestorePoint(const RestorePoint& p);
bool DecodeRestorePoint(std::string_view in, RestorePoint* p);

}  // namespace lockstep
