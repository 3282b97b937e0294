// peer_link.cc — see peer_link.h.
#include "guard/daemon/peer_link.h"

#include <cstring>
#include <tuple>

#include "consensus/assert.h"
#include "guard/net/wire.h"

namespace lockstep {

namespace {

// Regions mapped ahead of time, so that promising a ballot never waits for a
// mapping (milliseconds).
constexpr size_t kSpareRegions = 2;
// Own regions kept: the current one and a couple before it, which messages
// still queued may announce. Older streams are never read again.
constexpr size_t kKeptRegions = 3;
constexpr uint64_t kSpareRetryUs = 1000000;  // after a failed mapping
constexpr int kMaxRecordsPerPoll = 1024;     // then the loop serves the rest of the pass
// Doorbells a peer gets without showing a sign of life in between (a backup:
// a change in its ack word; the leader: a change in its control word, which
// its heartbeat changes every millisecond). Over shared memory a doorbell is
// an active message that takes a slot of the peer's receive FIFO (64 slots
// in UCX 1.13, shared by every sender, freed in batches of 32) until the
// peer's worker reads it. A peer that is dead (or stopped) reads nothing:
// ringing it every heartbeat fills its FIFO within 64 ms, and UCX 1.13 then
// (1) starts a wireup on the endpoint that the dead peer never answers, and
// skips the endpoint's keepalive meanwhile, so the death is never reported;
// (2) queues every later send in the memory transport's pending queue,
// where it can never complete, not even after the endpoint is force-closed
// (flushing towards a full FIFO never ends). ucp_worker_arm then returns
// BUSY for good and the daemon never sleeps (a core at 100% for as long as
// the process lives). Holding doorbells back keeps the FIFO far from full
// (replicas - 1 senders x 4 slots), keepalive then reports the death, and a
// live peer loses nothing: the doorbell held back is rung as soon as the
// peer shows life, and a peer that is running polls its memory anyway.
constexpr int kRingCredits = 4;
// Thrifty doorbells (WokenForRecords): entries uncommitted this long ring
// every backup holding records it was not rung for.
constexpr uint64_t kWakeAllAfterUs = 2000;
// Ring space that is always worth a doorbell, as a fraction of the ring:
// a leader rings a backup this far behind in consuming (WokenForRecords),
// and a backup rings its leader when it freed this much (LeaderWaitsFor),
// whatever else says neither side waits.
constexpr uint64_t kRingShareRung = 4;  // a quarter
// UCX refused every arm for this long and this many times (not a moment
// of a busy loop): it cannot arm for now (see Arm()).
constexpr uint64_t kStuckArmUs = 100000;
constexpr uint64_t kStuckArmRefusals = 100;
constexpr uint64_t kUnarmableLogIntervalUs = 10000000;  // reports of a stuck UCX, at most

// What a message carries for the transport: the sender's UCX worker address
// and, from a backup, the region it opened for (ballot, stream); from a
// leader, its ack array.
struct TransportBlob {
  std::string worker_address;
  uint64_t region_addr = 0;
  std::string region_rkey;
  uint64_t region_size = 0;
};

std::string EncodeBlob(const TransportBlob& b) {
  ByteWriter w;
  w.bytes(b.worker_address);
  w.u64(b.region_addr);
  w.bytes(b.region_rkey);
  w.u64(b.region_size);
  return std::move(w.str());
}

bool DecodeBlob(std::string_view in, TransportBlob* b) {
  ByteReader r(in);
  return r.bytes(&b->worker_address) && r.u64(&b->region_addr) && r.bytes(&b->region_rkey) &&
         r.u64(&b->region_size) && r.done();
}

}  // namespace

bool PeerLink::OpenTransport(const Options& o, const ReplicaLog& log, Transport* out) {
  std::string err;
  UcxTransport::Options uopt;
  uopt.kind = o.transport == "shm"   ? UcxTransport::Kind::kShm
              : o.transport == "tcp" ? UcxTransport::Kind::kTcp
                                     : UcxTransport::Kind::kAuto;
  uopt.name = "lockstep-" + std::to_string(o.id);
  out->ucx = UcxTransport::Create(uopt, &err);
  if (!out->ucx) {
    log("UCX transport (%s) failed: %s", o.transport.c_str(), err.c_str());
    return false;
  }
  out->ack_region = out->ucx->MapRegion(kAckSlotBytes * kMaxMemberIds, &err);
  if (!out->ack_region) {
    log("cannot map the ack array: %s", err.c_str());
    return false;
  }
  return true;
}

PeerLink::PeerLink(const Options& options, Transport transport, Replica& core,
                   const ReplicaLog& log)
    : opt_(options),
      core_(core),
      log_(log),
      ucx_(std::move(transport.ucx)),
      ack_region_(transport.ack_region) {
  // Sized for every id a replica may ever have: one added later (lockstep
  // member add) needs no reallocation while the rooms hold on to slots.
  LS_ASSERT(opt_.replicas >= 1 && opt_.replicas <= kMaxMemberIds, "replicas=%d", opt_.replicas);
  const int n = kMaxMemberIds;
  last_ack_.assign(n, AckWord{});
  last_rung_ack_.assign(n, AckWord{});
  ucx_peer_.assign(n, -1);
  ucx_peer_addr_.assign(n, "");
  remote_region_.assign(n, RemoteRegion{});
  remote_ack_.assign(n, -1);
  ring_peer_.assign(n, false);
  ring_credits_.assign(n, kRingCredits);
  ring_owed_.assign(n, false);
  records_unrung_.assign(n, false);
  ucx_->SetPeerErrorHandler(
      [this](UcxTransport::PeerId pid, std::string why) { OnTransportError(pid, why); });
  ucx_->SetDoorbellHandler([](uint64_t) {});
}

bool PeerLink::Arm() {
  if (ucx_->Arm()) {
    if (unarmable_logged_)
      log_("UCX arms its event fd again (after %lu ms)",
           (unsigned long)((NowUs() - unarmable_since_us_) / 1000));
    refused_arms_ = 0;
    unarmable_logged_ = false;
    return true;
  }
  // Events are pending: the pass goes round and progresses them. Over shm
  // UCX also refuses for a moment with nothing to progress (runs of up to a
  // few hundred us under load here, with none of our sends queued: likely a
  // sender off the CPU half-way through a write into our FIFO), and for good
  // while it holds sends it can only complete by polling (queued towards a
  // peer whose FIFO is full: dead, stopped or slow). Spinning through the
  // first keeps the commit path as fast as it was; spinning on the second
  // holds a core for as long as the peer does not drain. So only once UCX
  // has refused every arm for a long while does the loop sleep until the
  // next heartbeat instead (its fd, edge-triggered, wakes it for new events
  // only), polling 1000 times a second as an idle loop does anyway.
  uint64_t now = NowUs();
  if (refused_arms_++ == 0) unarmable_since_us_ = now;
  if (refused_arms_ < kStuckArmRefusals || now - unarmable_since_us_ < kStuckArmUs) return false;
  if (!unarmable_logged_ && now >= next_unarmable_log_us_) {
    unarmable_logged_ = true;
    next_unarmable_log_us_ = now + kUnarmableLogIntervalUs;
    log_(
        "UCX refused to arm its event fd %lu times over %lu ms (sends queued towards a peer "
        "that does not drain them?): sleeping on the heartbeat timer until it arms again",
        (unsigned long)refused_arms_, (unsigned long)((now - unarmable_since_us_) / 1000));
  }
  return true;
}

void PeerLink::OnTransportError(UcxTransport::PeerId pid, const std::string& why) {
  for (int r = 0; r < opt_.replicas; r++) {
    if (ucx_peer_[r] != pid) continue;
    log_("transport to replica %d failed: %s", r, why.c_str());
    ucx_peer_[r] = -1;
    ucx_peer_addr_[r].clear();
    remote_region_[r] = RemoteRegion{};
    remote_ack_[r] = -1;
    last_rung_ack_[r] = AckWord{};  // a restarted leader's array is fresh: ring for the next
    core_.OnPeerUnreachable(NowUs(), r);
  }
  // Close the endpoint now (UCX has already failed it, so this does not
  // wait): it releases the endpoint's remote keys and whatever it still had
  // queued. The peer, if it comes back, announces a fresh worker.
  ucx_->Disconnect(pid, 0);
}

int PeerLink::UcxPeer(int replica, const std::string& worker_address) {
  if (ucx_peer_[replica] >= 0 && ucx_peer_addr_[replica] == worker_address)
    return ucx_peer_[replica];
  if (ucx_peer_[replica] >= 0) {  // the peer restarted: a new worker
    ucx_->Disconnect(ucx_peer_[replica], 0);
    remote_region_[replica] = RemoteRegion{};
    remote_ack_[replica] = -1;
    last_rung_ack_[replica] = AckWord{};
  }
  std::string err;
  uint64_t t0 = NowUs();
  int pid = ucx_->Connect(worker_address, &err);
  if (opt_.verbose) log_("connected UCX to %d in %lu us", replica, (unsigned long)(NowUs() - t0));
  if (pid < 0) {
    log_("cannot reach replica %d through UCX: %s", replica, err.c_str());
    ucx_peer_[replica] = -1;
    return -1;
  }
  ucx_peer_[replica] = pid;
  ucx_peer_addr_[replica] = worker_address;
  ring_credits_[replica] = kRingCredits;
  ring_owed_[replica] = false;
  if (opt_.verbose)
    log_("UCX endpoint to replica %d: %s", replica, ucx_->DescribePeer(pid).c_str());
  return pid;
}

void PeerLink::OnMessage(const Message& m) {
  TransportBlob blob;
  if (m.transport.empty() || !DecodeBlob(m.transport, &blob) || blob.worker_address.empty()) return;
  int pid = UcxPeer(m.from, blob.worker_address);
  std::string err;
  if (pid >= 0 && (m.type == Message::Type::kPrepare || m.type == Message::Type::kHeartbeat)) {
    // From a leader (or candidate): its ack array.
    if (remote_ack_[m.from] < 0) {
      remote_ack_[m.from] =
          ucx_->AttachRemote(pid, blob.region_addr, blob.region_rkey, blob.region_size, &err);
      if (remote_ack_[m.from] < 0) log_("attach ack array of %d: %s", m.from, err.c_str());
    }
  } else if (pid >= 0 && (m.type == Message::Type::kPromise || m.type == Message::Type::kJoin)) {
    // From a backup: the region it opened for (ballot, stream).
    RemoteRegion& rr = remote_region_[m.from];
    if (rr.ballot != m.ballot || rr.stream_id != m.stream_id) {
      if (rr.remote >= 0) ucx_->DetachRemote(rr.remote);
      rr = RemoteRegion{
          m.ballot, m.stream_id,
          ucx_->AttachRemote(pid, blob.region_addr, blob.region_rkey, blob.region_size, &err)};
      if (rr.remote < 0) log_("attach region of %d: %s", m.from, err.c_str());
    }
  }
}

bool PeerLink::FillTransport(Message* m) {
  TransportBlob blob;
  blob.worker_address = ucx_->WorkerAddress();
  if (m->type == Message::Type::kPrepare || m->type == Message::Type::kHeartbeat) {
    blob.region_addr = ack_region_->remote_addr;
    blob.region_rkey = ack_region_->packed_rkey;
    blob.region_size = ack_region_->size;
  } else if (m->type == Message::Type::kPromise || m->type == Message::Type::kJoin) {
    const OwnRegion* found = nullptr;
    for (const auto& r : own_regions_)
      if (r.ballot == m->ballot && r.stream_id == m->stream_id) found = &r;
    if (!found) return false;  // superseded by a newer stream
    blob.region_addr = found->region->remote_addr;
    blob.region_rkey = found->region->packed_rkey;
    blob.region_size = found->region->size;
  }
  m->transport = EncodeBlob(blob);
  return true;
}

void PeerLink::EnsureRegion() {
  // The backup reads only the region of the (ballot, stream) it promised.
  Ballot b = core_.promised();
  uint64_t s = core_.stream_id();
  if (!own_regions_.empty() && own_regions_.back().ballot == b &&
      own_regions_.back().stream_id == s)
    return;
  if (core_.role() != Role::kBackup || BallotLeader(b) == opt_.id || b == 0) {
    reader_.reset();
    return;
  }
  UcxTransport::LocalRegion* region = TakeSpareRegion();
  if (!region) return;
  own_regions_.push_back(OwnRegion{b, s, region});
  while (own_regions_.size() > kKeptRegions) {
    // Never unmapped: over UCX's tcp transport puts are not checked against
    // any key at the target, so a deposed leader could still write to these
    // addresses. They are zeroed and reused, and a leader's late puts for
    // the stream that had the memory before still land in the stream that
    // has it now (after a partition, TCP delivers them all at once): only
    // records sealed with the reader's own stream are read (log_format.h).
    recycled_regions_.push_back(own_regions_.front().region);
    own_regions_.pop_front();
  }
  reader_ = std::make_unique<RingReader>(region->base + kControlBytes, opt_.ring_bytes, s);
  last_control_ = ControlWord{};
}

// Mapping a region costs milliseconds (allocation, zeroing, registration):
// too slow for the path of an election. Fresh, never-shared regions are
// prepared while the loop is idle and taken from here.
UcxTransport::LocalRegion* PeerLink::TakeSpareRegion() {
  if (spare_regions_.empty()) MapSpareRegion();
  if (spare_regions_.empty()) return nullptr;
  auto* r = spare_regions_.front();
  spare_regions_.pop_front();
  return r;
}

bool PeerLink::MapSpareRegion() {
  if (!recycled_regions_.empty()) {
    auto* r = recycled_regions_.front();
    recycled_regions_.pop_front();
    memset(r->base, 0, r->size);
    spare_regions_.push_back(r);
    return true;
  }
  std::string err;
  uint64_t t0 = NowUs();
  auto* region = ucx_->MapRegion(kControlBytes + opt_.ring_bytes, &err);
  if (!region) {
    log_("cannot map a log region of %lu bytes: %s",
         (unsigned long)(kControlBytes + opt_.ring_bytes), err.c_str());
    return false;
  }
  if (opt_.verbose) log_("mapped a spare log region in %lu us", (unsigned long)(NowUs() - t0));
  spare_regions_.push_back(region);
  return true;
}

bool PeerLink::PrepareSpareRegion(uint64_t now) {
  if (spare_regions_.size() >= kSpareRegions || now < next_spare_try_us_) return false;
  if (!MapSpareRegion()) next_spare_try_us_ = now + kSpareRetryUs;
  if (NowUs() - now > kSlowStepUs)
    log_("mapping a spare region took %lu us", (unsigned long)(NowUs() - now));
  return true;
}

bool PeerLink::PollMemory(uint64_t now) {
  bool busy = false;
  if (core_.role() == Role::kLeader) {
    for (int r = 0; r < opt_.replicas; r++) {
      if (r == opt_.id) continue;
      AckWord w;
      if (!ReadAck(ack_region_->base + r * kAckSlotBytes, &w)) continue;
      if (memcmp(&w, &last_ack_[r], sizeof w) == 0) continue;
      last_ack_[r] = w;
      SawLifeFrom(r);
      uint64_t rejected = core_.rejected_acks();
      core_.OnAck(now, r, w);
      if (core_.rejected_acks() != rejected && rejected < 10)
        log_(
            "REJECTED an ack from replica %d: it claims entries up to %lu durable, past this "
            "leader's log end %lu (corrupt or forged; ignored)",
            r, (unsigned long)w.durable_index, (unsigned long)core_.last_index());
      busy = true;
    }
    return busy;
  }
  if (!reader_ || own_regions_.empty()) return false;
  const OwnRegion& cur = own_regions_.back();
  if (cur.ballot != core_.promised() || cur.stream_id != core_.stream_id()) return false;
  ControlWord cw;
  if (ReadControl(cur.region->base, &cw) && memcmp(&cw, &last_control_, sizeof cw) != 0) {
    last_control_ = cw;
    SawLifeFrom(BallotLeader(cur.ballot));
    core_.OnControl(now, cw);
    busy = true;
  }
  DecodedRecord rec;
  bool drained = false;
  for (int i = 0; i < kMaxRecordsPerPoll && reader_; i++) {
    if (!reader_->Peek(&rec)) {
      drained = true;
      break;
    }
    Entry e;
    e.index = rec.header.index;
    e.ballot = rec.header.ballot;
    e.type = static_cast<EntryType>(rec.header.type);
    e.payload.assign(rec.payload.data(), rec.payload.size());
    uint64_t pos = reader_->pos();
    reader_->Consume(rec);
    // The reader only moves forward within its stream: a record it accepted
    // is never read twice.
    LS_ASSERT(reader_->pos() > pos, "ring reader stuck at %lu", (unsigned long)pos);
    uint64_t rejected = core_.rejected_records();
    core_.OnRecord(now, cur.ballot, cur.stream_id, e, rec.header.commit_index, reader_->pos());
    if (core_.rejected_records() != rejected && rejected < 10)
      log_(
          "REJECTED a record from leader %d: entry %lu of type %u and ballot %s in the stream "
          "of %s, commit %lu (corrupt or forged; asked for a fresh stream)",
          BallotLeader(cur.ballot), (unsigned long)e.index, (unsigned)rec.header.type,
          BallotString(e.ballot).c_str(), BallotString(cur.ballot).c_str(),
          (unsigned long)rec.header.commit_index);
    busy = true;
    if (core_.stream_id() != cur.stream_id) break;  // the core asked for a fresh stream
  }
  if (drained) core_.OnStreamDrained(now, cur.ballot, cur.stream_id);
  return busy;
}

void PeerLink::Put(const Ready& rd, uint64_t now) {
  std::string err;
  uint32_t woken =
      rd.puts.empty() && uncommitted_since_us_ == 0 ? 0 : WokenForRecords(now, !rd.puts.empty());
  for (const auto& put : rd.puts) {
    RemoteRegion& rr = remote_region_[put.to];
    if (rr.remote < 0 || rr.ballot != put.ballot || rr.stream_id != put.stream_id) continue;
    if (!ucx_->Put(rr.remote, put.offset, put.bytes.data(), put.bytes.size(), &err)) {
      log_("put to replica %d failed: %s", put.to, err.c_str());
      continue;
    }
    records_unrung_[put.to] = true;
  }
  for (int r = 0; r < opt_.replicas; r++) {
    if (!records_unrung_[r] || !((woken >> r) & 1)) continue;
    records_unrung_[r] = false;
    ring_peer_[r] = true;
  }
  // A control word alone (heartbeat, commit index) rings no doorbell: a
  // backup reads it on its next pass, at most a heartbeat away since its
  // loop never sleeps longer, and nothing a client waits for hangs on it (a
  // backup's apply follows the commit the client already has). Ringing for
  // it woke each backup a second time per input and once per heartbeat.
  for (const auto& cop : rd.controls) {
    RemoteRegion& rr = remote_region_[cop.to];
    if (rr.remote < 0 || rr.ballot != cop.word.ballot || rr.stream_id != cop.word.stream_id)
      continue;
    ucx_->Put(rr.remote, 0, &cop.word, sizeof cop.word, &err);
  }
  // An ack that only echoes a heartbeat rings no doorbell either: the
  // leader reads its ack array on every pass, and it passes at least once a
  // heartbeat. Ringing for echoes woke the leader once per heartbeat per
  // backup, at idle and between a single client's inputs alike. What the
  // leader may be waiting for (entries made durable, which commit; ring
  // space freed, which a full ring waits on; a new ballot or stream) rings,
  // unless the leader has shown it no longer waits (LeaderWaitsFor).
  for (const auto& a : rd.acks) {
    int remote = remote_ack_[a.to];
    if (remote < 0) continue;
    if (!ucx_->Put(remote, static_cast<size_t>(opt_.id) * kAckSlotBytes, &a.word, sizeof a.word,
                   &err))
      continue;
    AckWord& rung = last_rung_ack_[a.to];
    bool new_stream = a.word.ballot != rung.ballot || a.word.stream_id != rung.stream_id;
    bool progress =
        a.word.durable_index != rung.durable_index || a.word.consumed_pos != rung.consumed_pos;
    if (new_stream || (progress && LeaderWaitsFor(a.word, rung))) {
      ring_peer_[a.to] = true;
      rung = a.word;
    }
  }
  for (int r = 0; r < opt_.replicas; r++) {
    if (!ring_peer_[r]) continue;
    ring_peer_[r] = false;
    Ring(r);
  }
}

// Thrifty doorbells: the backups a leader's new records wake. A commit
// needs the durable acks of a majority, the leader's own write included,
// so of the other voters only Majority()-1 are waited for: the eager ones,
// kept from one entry to the next while they keep up (each has acked
// everything committed), else those furthest along. The rest get the
// records in their memory without a doorbell and take them on their own
// next pass, at most a heartbeat later (their loop never sleeps longer),
// as one durable write and one replay for all that came meanwhile instead
// of one each: at one client one backup of two no longer wakes per input
// (its loop, its write and its flush: ~3 context switches). Entries left
// uncommitted for kWakeAllAfterUs (an eager backup that died, stalled or
// is slow) ring every backup holding unrung records, and the choice is
// made anew. A backup whose ring is a quarter full is rung too (the leader
// would otherwise wait for its space), and one more when the leader's own
// disk lags behind the commit index. Acks are unaffected: each backup
// rings for what the leader still waits for (LeaderWaitsFor).
uint32_t PeerLink::WokenForRecords(uint64_t now, bool new_records) {
  const uint64_t commit = core_.commit_index(), last = core_.last_index();
  if (commit >= last) {
    uncommitted_since_us_ = 0;
  } else if (uncommitted_since_us_ == 0 || commit != uncommitted_commit_) {
    uncommitted_since_us_ = now;  // entries wait from now (or the commit moved)
    uncommitted_commit_ = commit;
  }
  const Membership& ms = core_.membership();
  uint32_t all = 0;
  for (int r = 0; r < opt_.replicas; r++)
    if (r != opt_.id) all |= 1u << r;
  // Entries of an earlier pass still wait (inputs pipelined, many clients):
  // then every backup is rung, so that the first acks commit, as the loss
  // of the slower backup's ack lowered 16 clients' throughput here by
  // 10-15% for a few percent less CPU per input.
  bool pipelined = false;
  if (new_records) {
    pipelined = commit < last_seen_by_put_;
    last_seen_by_put_ = last;
  }
  if (core_.role() != Role::kLeader || !ms.IsVoter(opt_.id) ||
      (uncommitted_since_us_ != 0 && now - uncommitted_since_us_ >= kWakeAllAfterUs)) {
    eager_ = 0;
    return all;
  }
  if (pipelined) return all;
  uint32_t woken = 0;
  for (int r = 0; r < opt_.replicas; r++)
    if (r != opt_.id && core_.PeerRingUse(r) * kRingShareRung >= opt_.ring_bytes) woken |= 1u << r;
  auto rank = [&](int r) {  // larger first: keeps up, was eager, furthest along
    bool keeps_up = core_.PeerMatch(r) >= commit;
    return std::tuple(keeps_up, ((eager_ >> r) & 1) != 0, core_.PeerMatch(r), -r);
  };
  uint32_t eager = 0;
  // Our own write is one of the majority, unless our disk lags (a commit
  // went past it: a frozen or failing disk), and then a backup stands in.
  int need = ms.Majority() - (core_.durable_index() >= commit ? 1 : 0) -
             __builtin_popcount(woken & ms.voters);
  for (; need > 0; need--) {
    int best = -1;
    for (int r = 0; r < opt_.replicas; r++)
      if (r != opt_.id && ms.IsVoter(r) && !(((woken | eager) >> r) & 1) &&
          (best < 0 || rank(r) > rank(best)))
        best = r;
    if (best < 0) break;
    eager |= 1u << best;
  }
  eager_ = eager;
  return woken | eager;
}

// The leader's newest control word says it has committed everything this
// ack makes durable and sent nothing this backup has not consumed: the
// other backup's ack (or its own write) made the majority first, so this
// ack decides nothing and waking the leader for it would only cost a
// context switch (at one client, ~0.5 of the leader's ~3.5 wake-ups per
// input; at 16, the second backup's ack of nearly every batch). The ack
// itself is in the leader's memory all the same, read on its next pass
// (within a heartbeat), which is all that lag, leadership moves and lease
// echoes need. The control word is read afresh, not taken from the
// pass's PollMemory: at one client the leader commits (through the other
// backup) while this backup's own write is in progress, and only the word
// as it is now shows that. A quarter of the ring freed since the last
// doorbell rings regardless: a leader whose ring filled may be waiting
// for that space with a control word older than its latest puts.
bool PeerLink::LeaderWaitsFor(const AckWord& ack, const AckWord& rung) const {
  if (ack.consumed_pos - rung.consumed_pos >= opt_.ring_bytes / kRingShareRung) return true;
  if (own_regions_.empty()) return true;
  const OwnRegion& cur = own_regions_.back();
  if (cur.ballot != ack.ballot || cur.stream_id != ack.stream_id) return true;
  ControlWord cw;
  if (!ReadControl(cur.region->base, &cw) || cw.ballot != ack.ballot ||
      cw.stream_id != ack.stream_id)
    return true;
  return ack.durable_index > cw.commit_index || ack.consumed_pos < cw.sent_pos;
}

void PeerLink::Ring(int replica) {
  if (ucx_peer_[replica] < 0) return;
  if (ring_credits_[replica] == 0) {
    ring_owed_[replica] = true;  // rung when the peer shows life (SawLifeFrom)
    return;
  }
  ring_credits_[replica]--;
  ring_owed_[replica] = false;
  std::string err;
  ucx_->Ring(ucx_peer_[replica], 0, &err);
}

// The peer ran since our last doorbells (it wrote to our memory): whatever
// we rang has been read, or will be by the pass it is in.
void PeerLink::SawLifeFrom(int replica) {
  if (replica < 0 || replica >= opt_.replicas || replica == opt_.id) return;
  ring_credits_[replica] = kRingCredits;
  if (ring_owed_[replica]) Ring(replica);
}

}  // namespace lockstep
