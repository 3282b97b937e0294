// shim_channel.h — the daemon's end of the shared-memory channel to the
// preload shim inside its server (the contract is preload/shim_abi.h):
// submissions in, outcomes out, the leader/passthrough mode, the sleep/wake
// handshake, and the replay slots that let a backup keep the log's order.
//
// The region is shared with the server, whose memory a bug may corrupt: the
// daemon keeps its own copies of the rings' geometry and of the positions it
// publishes, and checks every position and length the shim writes before
// using it (in release builds too). A channel found corrupt stops working
// and says why in error().
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "preload/shim_abi.h"

namespace lockstep {

class ShimChannel {
 public:
  ShimChannel() = default;
  ~ShimChannel();
  ShimChannel(const ShimChannel&) = delete;
  ShimChannel& operator=(const ShimChannel&) = delete;

  // A memfd region and two eventfds, all inheritable by the server.
  bool Create(uint32_t max_chunk, std::string* error);
  // The channel of a server restored from a checkpoint (checkpoint/): CRIU
  // gave it a copy of the region as it was at the dump and new eventfds, at
  // the fd numbers `server_fds` (ServerFds() of the channel it was started
  // with). Takes them from the stopped server (pidfd_getfd) and carries on
  // from the positions in the restored header.
  bool Adopt(pid_t server_pid, const std::vector<int>& server_fds, std::string* error);
  // What the server's environment needs (LOCKSTEP_SHIM_*), and which fds it keeps.
  std::vector<std::pair<std::string, std::string>> ServerEnv(int server_port) const;
  std::vector<int> ServerFds() const { return {region_fd_, wake_server_fd_, wake_daemon_fd_}; }
  int wake_daemon_fd() const { return wake_daemon_fd_; }
  bool shim_attached() const;

  void SetLeader(bool leader);

  // Non-empty once the shim wrote something impossible into the region
  // (the channel then neither takes submissions nor publishes outcomes).
  const std::string& error() const { return error_; }

  // Submissions, oldest first. The view stays valid until Pop().
  struct Submission {
    uint8_t kind;
    uint32_t conn;
    uint64_t seq;
    std::string_view bytes;
  };
  bool Peek(Submission* s);
  void Pop();

  // Replay order: the server may read `len` more bytes of replay slot
  // `slot` (LS_ORDER_DATA), or its EOF, after everything pushed before.
  // False when the ring is full (wait for the shim). Published by Flush().
  bool PushOrder(int slot, uint32_t kind, uint64_t len);

  // Outcomes are queued here and published by Flush(), which wakes the
  // shim's sleeping threads. Returns whether anything was published.
  void Complete(uint32_t kind, uint64_t seq, uint32_t conn);
  bool Flush();

  // Sleep handshake: announce, then re-check; false means work arrived.
  // With ignore_submissions, waiting submissions do not count (the daemon
  // is holding them back on purpose).
  // replay_waiting: the replayer waits for the server to read (the shim
  // then wakes us on replay reads, which it otherwise does not).
  bool PrepareSleep(bool ignore_submissions, bool replay_waiting);
  void Awake();

  // Replay connections (backups): claim a slot for a local port before
  // connecting, read the server's progress on it, release it after close.
  int ClaimReplaySlot(int port);
  void ReleaseReplaySlot(int slot);
  // After a restore: slot (restored in use) now belongs to a fresh
  // connection from `port`, which the shim puts in place of the dead one
  // (preload/shim_abi.h, "After a restore"). Returns slot, or -1.
  int ReattachReplaySlot(int slot, int port);
  uint64_t ReplayRead(int slot) const;
  // The server has accepted the slot's connection (and the shim knows it).
  bool ReplayAccepted(int slot) const;
  bool ReplayEof(int slot) const;

 private:
  void Fail(const std::string& why);
  void ReuseSlots();
  void UseRings();

  ls_shim_header* hdr_ = nullptr;
  char* sub_ring_ = nullptr;
  ls_done_record* done_ring_ = nullptr;
  ls_order_record* order_ring_ = nullptr;
  // The rings' geometry, as created: the copies in the header are the
  // shim's to read, not ours to trust.
  uint64_t sub_bytes_ = 0, done_slots_ = 0, order_slots_ = 0;
  // Positions the daemon publishes (monotonic; the header holds copies).
  uint64_t sub_tail_ = 0;         // submission bytes consumed
  uint64_t done_head_ = 0;        // completion records published
  uint64_t order_written_ = 0;    // order records written; published up to here by Flush()
  uint64_t order_published_ = 0;  // order records published
  uint64_t size_ = 0;
  int region_fd_ = -1, wake_server_fd_ = -1, wake_daemon_fd_ = -1;
  uint64_t peeked_bytes_ = 0;  // record size of the submission Peek returned
  std::vector<ls_done_record> unflushed_;
  std::vector<int> free_slots_;
  std::deque<std::pair<int, uint64_t>> held_slots_;  // (slot, order records written then)
  std::string error_;
};

}  // namespace lockstep
