// peer_link.h — the one-sided half of the link between replicas, over UCX:
// this replica's ack array (a leader's backups put their acks there), the
// log regions it opens as a backup (one per promised ballot and stream,
// prepared ahead while idle) and the reader of the current one, the remote
// regions and ack arrays of its peers, and the doorbells that wake a peer
// after a put. It polls memory for what the peers put and carries out the
// core's puts; what it finds goes to the core.
//
// The addresses and keys of regions travel inside the protocol messages
// (Message::transport, an opaque blob to everyone else): this file fills
// the blob of outgoing messages and attaches what incoming ones announce.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "consensus/core.h"
#include "consensus/region.h"
#include "consensus/transport_ucx.h"
#include "guard/common/replica_log.h"

namespace lockstep {

class PeerLink {
 public:
  struct Options {
    int id = 0;
    int replicas = 0;       // ids 0..replicas-1 known so far (SetKnownReplicas adds more)
    std::string transport;  // "shm", "tcp" or "auto"
    uint64_t ring_bytes = 0;
    bool verbose = false;
  };
  // The UCX worker and the ack array: made before the core exists (neither
  // needs it). False, logged, when they cannot be.
  struct Transport {
    std::unique_ptr<UcxTransport> ucx;
    UcxTransport::LocalRegion* ack_region = nullptr;
  };
  static bool OpenTransport(const Options& options, const ReplicaLog& log, Transport* out);

  PeerLink(const Options& options, Transport transport, Replica& core, const ReplicaLog& log);
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // The worker's event fd (readable when UCX has events for a sleeper).
  // Register it with the loop as a wake-only (edge-triggered) fd: after a
  // true Arm() that UCX could not honour, it may stay readable.
  int event_fd() const { return ucx_->EventFd(); }
  bool Progress() { return ucx_->Progress(); }
  // Before sleeping: false if UCX has events pending (go round again). True
  // when UCX armed its fd, and also when it has refused to for a long while
  // (sends queued towards a peer that does not drain them): then the loop
  // sleeps on its heartbeat timer instead of spinning, and the fd wakes it
  // only for new events.
  bool Arm();

  // Acks (leader), or the control word and new records of the current
  // region (backup), handed to the core. True if anything was found.
  bool PollMemory(uint64_t now);
  // A backup opens a region for the (ballot, stream) it promised, and reads
  // only that one.
  void EnsureRegion();
  // Carries out the core's puts, control words and acks, then rings the
  // doorbell of every peer that got one and has shown signs of life since
  // its last few doorbells (see kRingCredits in peer_link.cc). A leader's
  // records ring only the backups a commit waits for (WokenForRecords).
  void Put(const Ready& ready, uint64_t now);
  // Idle: prepares spare regions so an election need not map one. True if
  // it tried (the loop goes round again).
  bool PrepareSpareRegion(uint64_t now);

  // The address book grew (a replica added through the log): ids up to
  // replicas-1 are polled and rung from now on.
  void SetKnownReplicas(int replicas) { opt_.replicas = std::max(opt_.replicas, replicas); }

  // Outgoing message: fills m->transport. False when the message announces
  // a region that a newer stream has superseded (do not send it).
  bool FillTransport(Message* m);
  // Incoming message: connects to the sender's worker and attaches the ack
  // array or region it announces.
  void OnMessage(const Message& m);

 private:
  struct RemoteRegion {
    Ballot ballot = 0;
    uint64_t stream_id = 0;
    int remote = -1;
  };
  struct OwnRegion {
    Ballot ballot;
    uint64_t stream_id;
    UcxTransport::LocalRegion* region;
  };
  int UcxPeer(int replica, const std::string& worker_address);
  void Ring(int replica);
  bool LeaderWaitsFor(const AckWord& ack, const AckWord& rung) const;
  uint32_t WokenForRecords(uint64_t now, bool new_records);
  void SawLifeFrom(int replica);
  UcxTransport::LocalRegion* TakeSpareRegion();
  bool MapSpareRegion();
  void OnTransportError(UcxTransport::PeerId pid, const std::string& why);

  Options opt_;
  Replica& core_;
  const ReplicaLog& log_;
  std::unique_ptr<UcxTransport> ucx_;
  UcxTransport::LocalRegion* ack_region_;

  std::vector<AckWord> last_ack_;            // leader: the last ack seen from each backup
  std::vector<AckWord> last_rung_ack_;       // backup: the last ack it rang each leader for
  std::vector<int> ucx_peer_;                // by replica: PeerId or -1
  std::vector<std::string> ucx_peer_addr_;   // worker address it was made for
  std::vector<RemoteRegion> remote_region_;  // leader: each backup's region for our stream
  std::vector<int> remote_ack_;              // backup: each leader's ack array
  std::vector<bool> ring_peer_;              // put to since the last doorbell
  std::vector<int> ring_credits_;            // doorbells left before the peer shows life
  std::vector<bool> ring_owed_;              // a doorbell was held back for want of credits
  // Leader, thrifty doorbells (WokenForRecords): the backups rung for
  // records last time, which backups hold records put without a doorbell,
  // and since when the log has had an uncommitted entry (0: it has none).
  uint32_t eager_ = 0;
  std::vector<bool> records_unrung_;
  uint64_t uncommitted_since_us_ = 0;
  uint64_t uncommitted_commit_ = 0;  // the commit index when that began
  uint64_t last_seen_by_put_ = 0;    // the log's last index at the previous puts
  uint64_t refused_arms_ = 0;        // in a row (UCX has not armed since)
  uint64_t unarmable_since_us_ = 0;  // the first of them
  uint64_t next_unarmable_log_us_ = 0;
  bool unarmable_logged_ = false;

  std::deque<OwnRegion> own_regions_;  // newest last; a couple kept for deferred messages
  std::deque<UcxTransport::LocalRegion*> spare_regions_;
  std::deque<UcxTransport::LocalRegion*> recycled_regions_;
  uint64_t next_spare_try_us_ = 0;
  std::unique_ptr<RingReader> reader_;  // of own_regions_.back()
  ControlWord last_control_{};
};

}  // namespace lockstep
