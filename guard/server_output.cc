// server_output.cc — the server pipeline's side of output checking: the
// shim's output digests named as the log names connections, the recent
// bytes of a connection for a divergence report, and the two repairs of a
// divergent server (roll back to an own checkpoint, or take a peer's).
// The judging is guard/output_guard.cc's.
#include <algorithm>

#include "guard/server_pipeline.h"

namespace lockstep {

namespace {
constexpr size_t kOutputNamesKept = 16384;
}  // namespace

bool ServerPipeline::PollOutput(OutputPoint* p, uint32_t* flags) {
  if (!shim_) return false;
  ShimChannel::OutputDigest d;
  while (shim_->PollOutput(&d)) {
    // The first record of a connection names it; later ones (and those read
    // after it ended, when the replayer or own_conns_ forgot it) find the
    // name here.
    auto named = output_names_.find(d.conn);
    if (named == output_names_.end()) {
      ConnKey key;
      bool known = false;
      if (d.replay_slot >= 0) {
        known = replayer_ && replayer_->KeyOfOutput(d.replay_slot, d.conn, &key);
      } else {
        auto own = own_conns_.find(d.conn);
        known = own != own_conns_.end();
        if (known) key = own->second;
      }
      if (!known) {
        unnamed_outputs_++;
        continue;
      }
      named = output_names_.emplace(d.conn, OutputName{key, d.out_slot}).first;
      // Numbers grow with each connection: the smallest are the oldest.
      while (output_names_.size() > kOutputNamesKept) output_names_.erase(output_names_.begin());
    }
    if (d.out_slot >= 0) named->second.out_slot = d.out_slot;
    if (!d.usable()) {
      unnamed_outputs_++;
      continue;
    }
    p->key = named->second.key;
    p->offset = d.offset;
    p->digest = d.digest;
    p->applied = applied_;
    p->mark = (d.flags & LS_OUT_MARK) != 0;
    *flags = d.flags;
    // A closed connection's name stays: its window lasts until the slot is
    // reused, and a report may still want it.
    return true;
  }
  return false;
}

bool ServerPipeline::RecentOutput(const ConnKey& key, ShimChannel::OutputWindow* w) const {
  if (!shim_) return false;
  // The newest number with that name (a connection has one per server).
  for (auto it = output_names_.rbegin(); it != output_names_.rend(); ++it)
    if (it->second.key == key && it->second.out_slot >= 0)
      return shim_->RecentOutput(it->second.out_slot, it->first, w);
  return false;
}

bool ServerPipeline::RollBack(uint64_t max_index, uint64_t* restored, std::string* error) {
  if (!checkpointer_) {
    *error = "checkpoints are off on this replica";
    return false;
  }
  if (!RestoreNewest(max_index, "rolling back a divergent server")) {
    *error = "no good checkpoint at or below entry " + std::to_string(max_index) +
             " that this replica's log (from entry " + std::to_string(core_.first_index()) +
             ") can bring forward";
    return false;
  }
  *restored = applied_;
  return true;
}

void ServerPipeline::StartRepairTransfer(const std::vector<int>& first) {
  repair_transfer_index_ = 0;
  repair_transfer_error_.clear();
  if (!fetcher_) {
    repair_transfer_ = RepairTransfer::kFailed;
    repair_transfer_error_ = "checkpoints are off on this replica";
    return;
  }
  if (fetcher_->active()) {
    repair_transfer_ = RepairTransfer::kFailed;
    repair_transfer_error_ = "a state transfer is already under way";
    return;
  }
  repair_transfer_ = RepairTransfer::kRunning;
  repair_fetch_failures_ = 0;
  fetch_for_ = FetchFor::kRepair;
  fetch_min_ = core_.first_index() - 1;  // the log brings it forward from there
  log_("repair: fetching a checkpoint of index >= %lu from a peer", (unsigned long)fetch_min_);
  fetcher_->Start(fetch_min_, first);
}

}  // namespace lockstep
