// checkpoint_transfer.h — state transfer: a replica that lacks entries every
// live peer has truncated (down for long, its disk wiped, brand new) fetches
// a peer's checkpoint over the daemons' TCP channel, authenticated like any
// client. The peer streams the checkpoint's files as they are on its disk
// (kCheckpointPart frames of 1 MB, then kCheckpointDone); the receiver
// writes them under a staging name in its own store, renames the staging
// dir into place and verifies every file against the MANIFEST that came
// with them. A broken or damaged transfer is removed and tried again from
// the next peer; it never counts, and is never restored.
//
// Both ends are blocking I/O on threads of their own, never the event loop.
// A fetched checkpoint keeps the peer's MANIFEST (replica id included):
// ServerPipeline relocates its images when it restores it (checkpoint/relocate.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/store.h"
#include "guard/common/config.h"
#include "guard/net/tls.h"

namespace lockstep {

// Sends checkpoints to peers that ask (one thread per request).
class CheckpointSenders {
 public:
  using LogFn = std::function<void(const std::string&)>;
  explicit CheckpointSenders(LogFn log) : log_(std::move(log)) {}
  ~CheckpointSenders();  // waits for transfers in flight
  // Sends the newest checkpoint with index >= min_index in store over `to`
  // (its request read), then closes it. While there is none and `coming`
  // says one is being taken (a leader's own, for a repair: ServerPipeline::
  // StartLeaderCheckpoint), it waits for it, up to kComingWaitUs; once it
  // says none is, it may say why (that checkpoint failed), and the peer is
  // told.
  using ComingFn = std::function<bool(std::string* why_none)>;
  void Serve(std::unique_ptr<Stream> to, const CheckpointStore* store, uint64_t min_index,
             ComingFn coming = {});
  static constexpr uint64_t kComingWaitUs = 10000000;
  static constexpr uint64_t kComingPollUs = 20000;

 private:
  struct Sender {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void Reap();  // joins finished senders
  LogFn log_;
  std::vector<Sender> senders_;
};

// Fetches one checkpoint from a peer (a thread).
class CheckpointFetcher {
 public:
  using LogFn = std::function<void(const std::string&)>;
  CheckpointFetcher(const ClusterConfig& config, int id, CheckpointStore* store, LogFn log)
      : cfg_(config), id_(id), store_(store), log_(std::move(log)) {}
  ~CheckpointFetcher();  // waits for a fetch in flight

  // Asks each peer in turn for a checkpoint with index >= min_index; the
  // replicas in `first` before the others.
  // only_first: ask nobody else (a repair wants a replica whose server
  // agrees with the leader's, not any peer's).
  void Start(uint64_t min_index, const std::vector<int>& first = {}, bool only_first = false);
  bool running() const { return thread_.joinable() && !done_.load(); }
  bool active() const { return thread_.joinable(); }
  // False while the fetch runs. Once it is over, true: *ok says whether a
  // checkpoint came (*index, which may be 0: a cloned start's image) and
  // *summary where from, or why none could be had.
  bool Collect(bool* ok, uint64_t* index, std::string* summary);

 private:
  bool FetchFrom(int peer, uint64_t min_index, uint64_t* index, std::string* error);

  const ClusterConfig& cfg_;
  int id_;
  CheckpointStore* store_;
  LogFn log_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  bool ok_ = false;
  uint64_t index_ = 0;
  std::string summary_;
};

}  // namespace lockstep
