// shim_channel.h — the daemon's end of the shared-memory channel to the
// preload shim inside its server (the contract is preload/shim_abi.h):
// submissions in, outcomes out, the leader/passthrough mode, the sleep/wake
// handshake, the replay slots that let a backup keep the log's order, and
// the digests and recent bytes of what the server sent (PollOutput,
// RecentOutput).
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
  // output_ring_records: how many output records the ring holds, a power of
  // two up to LS_OUT_RING_SLOTS (smaller only to test a full ring).
  bool Create(uint32_t max_chunk, std::string* error,
              uint32_t output_ring_records = LS_OUT_RING_SLOTS);
  // The channel of a server restored from a checkpoint (checkpoint/): CRIU
  // gave it a copy of the region as it was at the dump and new eventfds, at
  // the fd numbers `server_fds` (ServerFds() of the channel it was started
  // with). Takes them from the stopped server (pidfd_getfd) and carries on
  // from the positions in the restored header.
  bool Adopt(pid_t server_pid, const std::vector<int>& server_fds, std::string* error);
  // What the server's environment needs (LOCKSTEP_SHIM_*), and which fds it keeps.
  // With set_output_digests() called before, it also sets
  // LOCKSTEP_SHIM_OUTPUT_DIGESTS (else the server inherits ours, if any).
  std::vector<std::pair<std::string, std::string>> ServerEnv(int server_port) const;
  void set_output_digests(bool on) { output_digests_env_ = on ? "1" : "0"; }
  // LOCKSTEP_SHIM_RANDOM_SEED for the server (64 hex digits: its randomness
  // is the same on every replica, preload/shim_random.c), or "": off. Always
  // set, so that the server never inherits one from our environment.
  void set_random_seed(const std::string& hex) { random_seed_env_ = hex; }
  // LOCKSTEP_SHIM_SAME_CLOCK for the server: on, its wall clock reads the
  // stamp of the input it processes (preload/shim_clock.c), the clock_ns
  // passed to Complete and PushOrder. Always set ("1" or "0"), as above.
  void set_same_clock(bool on) { same_clock_ = on; }
  // LOCKSTEP_SHIM_TIMERS for the server: on (with same_clock), its epoll
  // timeouts are submitted as ticks (preload/shim_abi.h "Ticks"). Always set.
  void set_timers_in_log(bool on) { timers_in_log_ = on; }
  // The server is the image every replica's starts from (cloned_start):
  // its monotonic clocks go on from their start-up readings under ticks
  // (preload/shim_clock.c).
  void set_cloned(bool on) { cloned_ = on; }
  // LOCKSTEP_SHIM_SERIAL for the server: on, one input executes at a time
  // whatever thread reads it (preload/shim_serial.c). Always set, as above.
  // LOCKSTEP_SHIM_SERIAL: 0, or a sum of ls_serial_flag (shim_abi.h).
  void set_serial_inputs(int flags) { serial_inputs_ = flags; }
  // LOCKSTEP_SHIM_UNCHECKED_GREETING: output before a connection's first
  // input is left out of the digests (preload/shim_output.c).
  void set_unchecked_greeting(bool on) { unchecked_greeting_ = on; }
  // LOCKSTEP_SHIM_UNCHECKED_RESP for the server: the commands whose replies
  // its shim leaves out of the hashed output (preload/shim_unchecked.c), or
  // "": none. Always set, like the seed.
  void set_unchecked_replies(const std::string& list) { unchecked_replies_env_ = list; }
  // LOCKSTEP_SHIM_LEASE_READS_RESP (LOCKSTEP_SHIM_LEASE_READS_MEMCACHED when
  // memcached: the list names memcached text-protocol commands): the
  // read-only commands the leader's shim may serve under the lease
  // (preload/shim_unchecked.c), or "": none.
  void set_lease_reads(const std::string& list, bool memcached) {
    lease_reads_env_ = list;
    lease_memcached_ = memcached;
  }
  // The lease the shim may serve reads under (CLOCK_MONOTONIC ns; 0: none).
  void SetLease(uint64_t until_ns);
  // Requests the shim served under the lease, and read-only ones it sent
  // through the log for want of a lease.
  uint64_t lease_reads() const;
  uint64_t lease_misses() const;
  std::vector<int> ServerFds() const { return {region_fd_, wake_server_fd_, wake_daemon_fd_}; }
  int wake_daemon_fd() const { return wake_daemon_fd_; }
  bool shim_attached() const;
  // The pid of a process the server forked that went to serve a client
  // (refused by the shim), or 0.
  uint32_t forked_served() const;

  void SetLeader(bool leader);
  // The server is about to be stopped: its timers and clocks are its own
  // again (LS_MODE_STOPPING).
  void SetStopping();

  // Non-empty once the shim wrote something impossible into the region
  // (the channel then neither takes submissions nor publishes outcomes).
  const std::string& error() const { return error_; }

  // Submissions, oldest first. The view stays valid until Pop().
  struct Submission {
    uint8_t kind;  // LS_SUB_ACCEPT, DATA, CLOSE or TICK (checked)
    uint32_t conn;
    uint64_t seq;
    std::string_view bytes;
    uint64_t out_before;  // ls_sub_record's
    // TICK: its payload (struct ls_tick), checked: the epoll set whose wait
    // timed out (< kMaxWaiter) and the least stamp its entry may carry.
    uint32_t tick_waiter = 0;
    uint64_t tick_min_clock_ns = 0;
  };
  // A tick's waiter is an epoll fd of the server: below the shim's fd table.
  static constexpr uint32_t kMaxWaiter = 65536;
  bool Peek(Submission* s);
  void Pop();

  // Replay order: the server may read `len` more bytes of replay slot
  // `slot` (LS_ORDER_DATA), or its EOF, after everything pushed before.
  // clock_ns: the input's wall-clock stamp (log_input.h). False when the
  // ring is full (wait for the shim). Published by Flush().
  // Order records pushed that the shim has not taken yet.
  uint64_t OrderPending() const;
  // Order records the shim has taken so far (it grows as the server reads).
  uint64_t OrderTaken() const;
  // out_before: the input's reply gate (log_input.h).
  // LS_ORDER_TICK: `slot` is the epoll set's fd (< kMaxWaiter), len 0.
  bool PushOrder(int slot, uint32_t kind, uint64_t len, uint64_t clock_ns = 0,
                 uint64_t out_before = 0);

  // Outcomes are queued here and published by Flush(), which wakes the
  // shim's sleeping threads. Returns whether anything was published.
  // clock_ns: a COMMITTED input's wall-clock stamp (log_input.h).
  void Complete(uint32_t kind, uint64_t seq, uint32_t conn, uint64_t clock_ns = 0);
  bool Flush();

  // Sleep handshake: announce, then re-check; false means work arrived.
  // With ignore_submissions, waiting submissions do not count (the daemon
  // is holding them back on purpose, until a commit) and new ones do not
  // wake it.
  // replay_waiting: the replayer waits for the server to read (the shim
  // then wakes us on replay reads, which it otherwise does not).
  bool PrepareSleep(bool ignore_submissions, bool replay_waiting);
  void Awake();

  // Replay connections (backups): the address they come from (IPv4, network
  // order: the shim admits them from there only); claim a slot for a local
  // port before connecting, read the server's progress on it, release it
  // after close.
  void SetReplaySource(uint32_t ipv4);
  // An inspection connection (guard/server/inspection.h) about to come from
  // ipv4 (network order) and `port`, bound there: the shim serves one
  // connection from there while this replica does not lead.
  void ClaimInspectSlot(uint32_t ipv4, int port);
  // That claim is over (its socket is still bound): no connection from
  // `port` is served any more.
  void RevokeInspectSlot(int port);
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
  // The shim's number of the connection accepted on the slot (the `conn` of
  // its output digests); valid once ReplayAccepted(slot).
  uint32_t ReplayConn(int slot) const;

  // ---- What the server sent (preload/shim_abi.h, "Output").
  // The shim hashes each tracked connection's output stream by byte offset
  // and publishes a digest at the end of every send that advanced it, plus
  // one wherever the stream crosses a multiple of kOutputMarkBytes inside a
  // send (every replica has those, however its server chunked its writes).
  // It never waits for the daemon: records past a full ring are dropped and
  // counted. A dropped record is a skipped check, never a wrong one.
  static constexpr uint64_t kOutputMarkBytes = LS_OUT_MARK_BYTES;
  struct OutputDigest {
    // The connection: the shim's number for it. On the leader that is the
    // `conn` of its ACCEPT submission (ConnKey::no under the ballot that
    // accepted it); for a replay connection, see ReplayConn(replay_slot).
    uint32_t conn = 0;
    int replay_slot = -1;  // >= 0: a replay connection (this slot); -1: a client's
    int out_slot = -1;     // where RecentOutput finds its last bytes; -1: nowhere
    uint64_t offset = 0;   // the digest covers the stream's bytes [0, offset)
    uint64_t digest = 0;   // XXH64 (seed 0) of them: preload/stream_hash.h
    uint32_t flags = 0;    // LS_OUT_MARK | LS_OUT_SHUT | LS_OUT_CLOSED | LS_OUT_LOST
    // LS_OUT_LOST: the shim missed some of this stream; this digest and all
    // later ones of the connection mean nothing (skip, never compare them).
    bool usable() const { return (flags & LS_OUT_LOST) == 0; }
  };
  // The next digest, oldest first; false when there is none (or the channel
  // failed: see error()). One connection's digests come in stream order.
  // The shim never wakes the daemon for them: call it on every pass.
  // Until the first call, Flush() discards what the shim published (so that
  // a daemon that does not compare outputs leaves the ring room).
  bool PollOutput(OutputDigest* d);
  // One output record as the shim wrote it, checked (PollOutput's check,
  // on its own for fuzz/fuzz_shim_ring.cc): false when it names a replay or
  // output slot out of range or an unknown flag (*d then untouched).
  static bool DecodeOutputRecord(const ls_out_record& r, OutputDigest* d);
  // Every flag an output record may carry; a record with any other is refused.
  static constexpr uint32_t kOutputFlags =
      LS_OUT_MARK | LS_OUT_SHUT | LS_OUT_CLOSED | LS_OUT_LOST | LS_OUT_CUT;
  // The latest bytes a connection sent, up to LS_OUT_WINDOW of them:
  // `bytes` are the stream's bytes [start, start + bytes.size()). False if
  // out_slot no longer holds connection `conn` (a closed connection's window
  // lasts until its slot is reused) or the shim kept changing it.
  struct OutputWindow {
    uint64_t start = 0;
    std::string bytes;
    // The server's last sends on it: the stream offsets of their bytes and
    // its stack at each (return addresses; guard/server/symbolize.h names them).
    struct Send {
      uint64_t start = 0, end = 0;
      std::vector<uint64_t> pcs;
    };
    std::vector<Send> sends;
    bool ended = false;  // the server shut it down for writing, or closed it
    bool closed = false;
  };
  bool RecentOutput(int out_slot, uint32_t conn, OutputWindow* w) const;
  // The newest offset of connection `conn`'s stream in window out_slot and
  // its digest there (a backup's sample: its shim does not publish every
  // send's record, shim_abi.h "Output"); false if the window no longer
  // holds it, its output was lost, or the shim kept changing it.
  bool OutputNow(int out_slot, uint32_t conn, uint64_t* end, uint64_t* digest) const;
  struct OutputStats {
    bool enabled = false;       // the shim hashes outputs (LOCKSTEP_SHIM_OUTPUT_DIGESTS)
    uint64_t published = 0;     // records the shim put into the ring
    uint64_t consumed = 0;      // records taken by PollOutput or discarded by Flush
    uint64_t dropped_full = 0;  // records dropped: the ring was full
    uint64_t dropped_busy = 0;  // records dropped: another thread was publishing
    uint64_t unhashed = 0;      // sends the shim could not hash (their streams are LOST)
    uint64_t unslotted = 0;     // connections without an output slot (no digests at all)
  };
  OutputStats GetOutputStats() const;

 private:
  void Fail(const std::string& why);
  void ReuseSlots();
  uint32_t NextClaim();             // a fresh ls_replay_slot::claim
  uint32_t next_inspect_slot_ = 0;  // round-robin (shim_abi.h ls_inspect_slot)
  void UseRings();
  bool TakeOutputHead(uint64_t* head);

  ls_shim_header* hdr_ = nullptr;
  char* sub_ring_ = nullptr;
  ls_done_record* done_ring_ = nullptr;
  ls_order_record* order_ring_ = nullptr;
  const ls_out_record* out_ring_ = nullptr;
  const ls_out_slot* out_win_ = nullptr;
  const char* out_bytes_ = nullptr;
  const ls_send_stack* out_stacks_ = nullptr;
  // The rings' geometry, as created: the copies in the header are the
  // shim's to read, not ours to trust.
  uint64_t sub_bytes_ = 0, done_slots_ = 0, order_slots_ = 0, out_slots_ = 0;
  // Positions the daemon publishes (monotonic; the header holds copies).
  uint64_t sub_tail_ = 0;         // submission bytes consumed
  uint64_t done_head_ = 0;        // completion records published
  uint64_t order_written_ = 0;    // order records written; published up to here by Flush()
  uint64_t order_published_ = 0;  // order records published
  uint64_t out_tail_ = 0;         // output records consumed (published every so often)
  bool output_consumer_ = false;  // PollOutput was called: Flush() leaves records alone
  std::string output_digests_env_;
  std::string random_seed_env_;
  bool same_clock_ = false;
  bool timers_in_log_ = false;
  bool cloned_ = false;
  int serial_inputs_ = 0;
  bool unchecked_greeting_ = false;
  std::string unchecked_replies_env_;
  std::string lease_reads_env_;
  bool lease_memcached_ = false;
  uint64_t size_ = 0;
  int region_fd_ = -1, wake_server_fd_ = -1, wake_daemon_fd_ = -1;
  uint64_t peeked_bytes_ = 0;  // record size of the submission Peek returned
  std::vector<ls_done_record> unflushed_;
  std::vector<int> free_slots_;
  uint32_t last_claim_ = 0;  // ls_replay_slot::claim: the last one drawn (random start)
  std::deque<std::pair<int, uint64_t>> held_slots_;  // (slot, order records written then)
  std::string error_;
};

// What the submission ring holds at the daemon's tail, read from memory the
// server may scribble on: Peek's parser, a pure function of the ring's
// bytes and the two positions (fuzz/fuzz_shim_ring.cc drives it with any
// bytes). ring_bytes and tail are the daemon's own (8-aligned; anything
// else is kCorrupt); head is the shim's. kRecord fills *s (bytes point into
// the ring) and *size (the record's bytes, padded to 8); kWrap: skip *size
// bytes to the ring's start; kCorrupt: *error says why.
enum class SubmissionAt { kEmpty, kRecord, kWrap, kCorrupt };
SubmissionAt ParseSubmission(const char* ring, uint64_t ring_bytes, uint64_t tail, uint64_t head,
                             ShimChannel::Submission* s, uint64_t* size, std::string* error);

}  // namespace lockstep
