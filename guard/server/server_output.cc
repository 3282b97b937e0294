// server_output.cc — the server pipeline's side of output checking: the
// shim's output digests named as the log names connections, the recent
// bytes of a connection for a divergence report, the two repairs of a
// divergent server (roll back to an own checkpoint, or take a peer's), and
// the failpoint that makes a leader's server diverge. The judging is
// guard/output/output_guard.cc's.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "guard/server/server_pipeline.h"
#include "guard/server/symbolize.h"

namespace lockstep {

namespace {
constexpr size_t kOutputNamesKept = 16384;
}  // namespace

bool ServerPipeline::PollOutput(OutputPoint* p, uint32_t* flags, OutputSource* src) {
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
    p->cut = (d.flags & LS_OUT_CUT) != 0;
    *flags = d.flags;
    if (src) *src = OutputSource{d.conn, named->second.out_slot};
    // A closed connection's name stays: its window lasts until the slot is
    // reused, and a report may still want it.
    return true;
  }
  return false;
}

bool ServerPipeline::LatestOutput(const OutputSource& src, OutputPoint* p) const {
  if (!shim_ || !shim_->OutputNow(src.out_slot, src.conn, &p->offset, &p->digest)) return false;
  p->applied = applied_;
  p->mark = p->ended = p->cut = false;
  return true;
}

bool ServerPipeline::RecentOutput(const ConnKey& key, ShimChannel::OutputWindow* w) const {
  if (!shim_) return false;
  // The newest number with that name (a connection has one per server).
  for (auto it = output_names_.rbegin(); it != output_names_.rend(); ++it)
    if (it->second.key == key && it->second.out_slot >= 0)
      return shim_->RecentOutput(it->second.out_slot, it->first, w);
  return false;
}

std::vector<SendStack> ServerPipeline::DescribeSends(const ShimChannel::OutputWindow& w) const {
  std::vector<SendStack> out;
  if (w.sends.empty() || server_pid() <= 0) return out;
  Symbolizer names(server_pid());
  for (const auto& s : w.sends) out.push_back({s.start, s.end, names.DescribeStack(s.pcs)});
  return out;
}

bool ServerPipeline::RollBack(uint64_t max_index, uint64_t* restored, bool* afresh,
                              std::string* error) {
  *afresh = false;
  if (checkpointer_ && RestoreNewest(max_index, "rolling back a divergent server")) {
    *restored = applied_;  // the checkpoint's index (0: a cloned start's image)
    return true;
  }
  // No checkpoint (none taken yet, or checkpoints off), but the whole log:
  // the empty server it started as is the oldest checkpoint of all. Not
  // under a cloned start: a server started afresh is not the image every
  // other replica's runs from (its start-up draws differ).
  if (core_.first_index() == 1 && !cfg_.server.cloned_start) {
    if (!StartAfresh("rolling back a divergent server", error)) return false;
    *restored = 0;
    *afresh = true;
    return true;
  }
  if (cfg_.server.cloned_start) {
    *error = "no checkpoint at or below entry " + std::to_string(max_index) +
             " restores (under a cloned start a server started afresh is no clone)";
    return false;
  }
  *error = !checkpointer_ ? "checkpoints are off on this replica, and its log starts at entry " +
                                std::to_string(core_.first_index())
                          : "no good checkpoint at or below entry " + std::to_string(max_index) +
                                " that this replica's log (from entry " +
                                std::to_string(core_.first_index()) + ") can bring forward";
  return false;
}

// Failpoint for the test of a divergent leader: LOCKSTEP_FAILPOINT=
// flip-proposal:MARKER makes this replica, while it leads, propose the first
// client input that contains MARKER with the byte after MARKER changed
// (once per daemon), while its own server executes the bytes as the client
// sent them. Its server then holds what the log does not and the backups,
// which replay the log, agree with each other: the leader is the divergent
// replica. (flip-input, MaybeFlipInput, changes what a backup's server
// reads and leaves the log alone. The same on a leader needs the shim: a
// leader's server reads its clients' bytes from the shim's own buffers.)
bool ServerPipeline::MaybeFlipProposal(std::string_view bytes, std::string* flipped) {
  static const char* spec = getenv("LOCKSTEP_FAILPOINT");
  static bool fired = false;
  constexpr std::string_view kPrefix = "flip-proposal:";
  if (!spec || fired || strncmp(spec, kPrefix.data(), kPrefix.size()) != 0) return false;
  std::string_view marker(spec + kPrefix.size());
  size_t at = marker.empty() ? std::string_view::npos : bytes.find(marker);
  if (at == std::string_view::npos || at + marker.size() >= bytes.size()) return false;
  fired = true;
  flipped->assign(bytes);
  (*flipped)[at + marker.size()] ^= 0x01;
  log_(
      "FAILPOINT: proposed a client input with a byte flipped; this leader's server executes it "
      "unflipped");
  return true;
}

void ServerPipeline::StartRepairTransfer(const std::vector<int>& agreeing, uint64_t min_index) {
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
  // The log brings it forward from there; and it must hold what the
  // leader's order asks for (RepairOrder::min_index).
  fetch_min_ = std::max(core_.first_index() - 1, min_index);
  repair_sources_ = agreeing;
  std::string from;
  for (int p : agreeing) from += (from.empty() ? "" : ", ") + std::to_string(p);
  log_("repair: fetching a checkpoint of index >= %lu from replica %s", (unsigned long)fetch_min_,
       from.c_str());
  fetcher_->Start(fetch_min_, agreeing, /*only_first=*/true);
}

}  // namespace lockstep
