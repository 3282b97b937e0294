// transport_ucx.h — one-sided writes between replica daemons through UCX.
//
// One UcxTransport owns one UCP context and one worker. It is single-threaded:
// every call must come from the same thread (the worker runs in
// UCS_THREAD_MODE_SINGLE). No exceptions cross this API; failures come back as
// false / -1 / nullptr plus a message in *error.
//
// What the transport does, per kind (UCX 1.13.1; numbers from tools/ucx_probe.cc
// on the 2-core dev VM, two processes):
//  - kShm  (UCX_TLS=posix,sysv,cma,self): regions are allocated by UCX's sysv
//          memory domain (ucp_mem_map with UCP_MEM_MAP_ALLOCATE), so a Put is
//          a memcpy into the peer's segment (64 B put+flush ~0.07 us). It lands
//          with no action by the target and raises no event there. Doorbells
//          are active messages; the sender also signals the target's abstract
//          unix socket, which wakes its EventFd (~45 us).
//  - kTcp  (UCX_TLS=tcp,self): puts are UCX "sw RMA" (active messages): a Put
//          lands only when the target calls Progress(); the target's EventFd()
//          becomes readable when data arrives (after Arm()). 64 B put+flush
//          ~17 us with the target polling, ~35 us with it asleep in epoll.
//  - kAuto: UCX's own choice (rc/dc on an RDMA NIC, shm on one host, tcp).
//
// Peer death (UCP_ERR_HANDLING_MODE_PEER) is reported through the error
// handler. Over shm it is found by UCX keepalive, a check of the peer's pid
// that runs only inside Progress()/Flush() (every keepalive_ms); over tcp by
// the socket error. Call Progress() regularly.
//
// Gotchas (all measured or read in UCX 1.13.1 sources):
//  - Shared-memory transports need UCX_MM_ERROR_HANDLING=y to be usable with
//    UCP_ERR_HANDLING_MODE_PEER (set here); otherwise ucp_ep_create fails with
//    "Destination is unreachable".
//  - kShm peers must share the IPC namespace (else unreachable) and the PID
//    namespace (keepalive checks the peer's own getpid(): across PID
//    namespaces a killed peer is never detected). Across network namespaces
//    puts work but active messages do not (the wake-up signal is an abstract
//    unix socket, which is per network namespace): Ring() is silently never
//    delivered, and stats().doorbells_pending grows. Use kTcp across netns.
//  - Over tcp the target writes a put to the raw address in the message
//    without checking any key (ucp_put_handler memcpy's to puth->address).
//    Unmapping a region does not revoke a peer's access: a stale peer's put
//    then corrupts whatever memory is at that address. Only RDMA revokes.
//  - Over shm a put to an address outside the rkey's segment crashes the
//    *sender*; Put() checks the range given to AttachRemote, so that size must
//    be right.
//  - ucp_put_nbx can complete a put immediately only up to 127 bytes (UCX
//    caches max_put_short in an int8_t); larger puts are copied into a pooled
//    buffer first (over shm they then complete at once; ~0.14 us for 4 KiB).
//  - Over shm a doorbell (an active message) takes a slot of the peer's
//    receive FIFO (64 slots, shared by all senders, freed by the peer's
//    Progress() in batches of 32). Never ring a peer that shows no sign of
//    life more than a few times: once its FIFO is full, UCX 1.13 starts a
//    wireup on the endpoint and skips its keepalive until the peer answers,
//    so a dead peer is never reported; and sends queued towards a full FIFO
//    never complete, not even when the endpoint is force-closed, so Arm()
//    returns false for good (the caller spins) until the worker is destroyed.
//  - UCX is not fork-safe: create transports after fork(), in the child.
//  - UCX installs SIGSEGV/SIGBUS/... handlers that print a backtrace
//    (UCX_HANDLE_ERRORS, an environment-only setting) and hooks malloc/mmap
//    (UCX_MEM_MALLOC_HOOKS) process-wide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

// Opaque UCX handles (from <ucp/api/ucp_def.h>), so includers need no UCX headers.
typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_mem* ucp_mem_h;
typedef struct ucp_rkey* ucp_rkey_h;

namespace lockstep {

class UcxTransport {
 public:
  enum class Kind { kShm, kTcp, kAuto };

  struct Options {
    Kind kind = Kind::kAuto;
    // UCX_KEEPALIVE_INTERVAL. UCX's default is 20 s; peer death over shared
    // memory is only detected by keepalive, so keep this short. 0 = UCX default.
    // Over tcp too: without it (tried) a backup's stream once stayed broken
    // for good after a one-way partition healed, in 1 of 6 such fault runs;
    // with it, a keepalive failure during a partition can make UCX 1.13
    // abort the process when the peer's puts arrive afterwards (see
    // guard/cli/cluster.cc KeepReplica, which starts it again).
    int keepalive_ms = 100;
    // UCX_NET_DEVICES for kTcp/kAuto ("" = all). E.g. "lo" or "eth0".
    std::string net_devices;
    // Name shown in UCX's logs.
    std::string name = "lockstep";
    // Flush() polls the worker this long before it sleeps on the event fd
    // (1 ms slices). Spinning holds a CPU the target may need: on a 2-core
    // host a long spin delays a target that must run to complete the flush.
    int flush_spin_us = 50;
    // Bytes of copied puts allowed in flight per peer before Put() refuses
    // (a peer that stopped draining, e.g. behind a partition over tcp).
    size_t max_pending_bytes_per_peer = size_t{64} << 20;
  };

  static std::unique_ptr<UcxTransport> Create(Kind kind, std::string* error);
  static std::unique_ptr<UcxTransport> Create(const Options& options, std::string* error);
  ~UcxTransport();

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  Kind kind() const { return kind_; }

  // Opaque bytes to hand to peers over our own message channel.
  std::string WorkerAddress() const { return worker_address_; }

  // Local memory peers may put into. Zero-filled; page-aligned; size rounded
  // up to whole pages. Owned by the transport until UnmapRegion (or destruction).
  // Over tcp, do not unmap a region while a peer that holds its rkey may still
  // write (see the gotchas above): retire it and reuse it later instead.
  struct LocalRegion {
    uint8_t* base = nullptr;
    size_t size = 0;
    std::string packed_rkey;   // hand to peers together with remote_addr
    uint64_t remote_addr = 0;  // address peers use (== base)
  };
  LocalRegion* MapRegion(size_t size, std::string* error);
  void UnmapRegion(LocalRegion*);

  using PeerId = int;
  // ucp_ep_create with UCP_ERR_HANDLING_MODE_PEER; returns id >= 0, or -1.
  PeerId Connect(const std::string& peer_worker_address, std::string* error);
  // Flushes outstanding puts for at most flush_timeout_ms (skipped if the peer
  // is already known dead), then force-closes the endpoint. Never blocks
  // longer than about flush_timeout_ms + 1 s. Remotes of this peer are detached.
  void Disconnect(PeerId, int flush_timeout_ms = 100);
  bool PeerAlive(PeerId) const;

  using RemoteId = int;
  RemoteId AttachRemote(PeerId, uint64_t remote_addr, const std::string& packed_rkey, size_t size,
                        std::string* error);
  void DetachRemote(RemoteId);

  // Non-blocking one-sided write of len bytes at offset into the remote region.
  // The caller may reuse its buffer on return (the transport copies the data
  // into a pooled buffer when UCX cannot complete the put immediately).
  // Returns false (with error) on a dead peer, an unknown id, an out-of-range
  // offset, or more than max_pending_bytes_per_peer queued. On the fast path
  // (<= 127 bytes over shm or RDMA: UCX completes the put inside the call)
  // nothing is copied or allocated; other puts are copied into pooled buffers
  // (no malloc once the pool is warm).
  bool Put(RemoteId, size_t offset, const void* data, size_t len, std::string* error);

  // Doorbell: a small active message that wakes a peer sleeping in epoll on
  // its EventFd(). Carries a uint64 tag. Delivered by the peer's Progress().
  // Over shm it occupies a slot of the peer's receive FIFO until then (see
  // the gotchas): do not ring a peer that has stopped showing signs of life.
  bool Ring(PeerId, uint64_t tag, std::string* error);

  // Makes progress (drains the worker); returns true if anything happened.
  // Delivers queued doorbells and peer errors to the handlers.
  bool Progress();
  void SetDoorbellHandler(std::function<void(uint64_t tag)>);
  // An epoll fd owned by UCX (do not close it); add it to your epoll set.
  int EventFd() const { return event_fd_; }
  // ucp_worker_arm. false = events are pending: call Progress() again, do not sleep.
  // Also false, however often Progress() runs, while sends wait for room at a
  // peer (a full shm FIFO): UCX must poll for them and does not arm.
  bool Arm();

  // Waits until all outstanding puts to this peer are complete at the remote.
  // Bounded by timeout_ms; false on failure, dead peer or timeout.
  bool Flush(PeerId, int timeout_ms, std::string* error);

  // Errors seen on an endpoint (peer death) are reported via this callback
  // (from Progress()/Flush()), never by aborting. Reported once per peer.
  void SetPeerErrorHandler(std::function<void(PeerId, std::string)>);

  // Diagnostics.
  struct Stats {
    uint64_t puts_immediate = 0;  // completed inside ucp_put_nbx, no copy
    uint64_t puts_copied = 0;     // needed a pooled copy of the data
    uint64_t puts_pending = 0;    // copied puts still in flight now
    uint64_t doorbells_sent = 0;
    uint64_t doorbells_pending = 0;  // sent but not yet completed locally; a number
                                     // that keeps growing means the peer is unreachable
                                     // for active messages (e.g. shm across netns)
    uint64_t doorbells_received = 0;
  };
  Stats stats() const { return stats_; }
  // UCX's view of the endpoint's transports (ucp_ep_print_info), for logs.
  std::string DescribePeer(PeerId) const;

 private:
  struct Peer;
  struct Remote;
  struct Block;  // pooled copy buffer

  explicit UcxTransport(Kind kind);
  bool Init(const Options& options, std::string* error);

  Peer* GetPeer(PeerId) const;
  Block* GetBlock(size_t len);
  void ReleaseBlock(Block*);
  void DeliverQueued();
  void CloseEp(Peer* peer, bool force, int timeout_ms);

  friend struct UcxTransportCallbacks;  // UCX callbacks, defined in transport_ucx.cc

  Kind kind_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string worker_address_;
  size_t page_size_ = 4096;
  size_t max_pending_bytes_ = size_t{64} << 20;
  int flush_spin_us_ = 50;

  std::vector<std::unique_ptr<LocalRegion>> regions_;
  std::vector<ucp_mem_h> region_memh_;            // parallel to regions_
  std::vector<std::unique_ptr<Peer>> peers_;      // index = PeerId; kept (closed) after Disconnect
  std::vector<std::unique_ptr<Remote>> remotes_;  // index = RemoteId

  // Pool of copy buffers, one free list per power-of-two size class.
  std::vector<std::vector<Block*>> free_blocks_;
  std::vector<Block*> all_blocks_;

  std::function<void(uint64_t)> doorbell_handler_;
  std::function<void(PeerId, std::string)> error_handler_;
  std::vector<uint64_t> queued_doorbells_;
  std::vector<uint64_t> delivering_doorbells_;
  std::vector<std::pair<PeerId, std::string>> queued_errors_;
  bool in_delivery_ = false;
  Stats stats_;
};

}  // namespace lockstep
