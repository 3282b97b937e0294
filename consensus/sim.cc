// sim.cc — the deterministic simulator (see sim.h).
#include "consensus/sim.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "consensus/assert.h"
#include "consensus/sim_util.h"

namespace lockstep {

using namespace sim_util;

namespace {

// LS_ASSERT inside the core throws this while a simulator is alive, so a
// broken invariant becomes a reported violation with its seed.
struct CoreAssertion : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void ThrowingAssertHandler(const std::string& message) {
  throw CoreAssertion(message);
}

}  // namespace

// ---------------------------------------------------------------- setup

SimCluster::SimCluster(const SimOptions& options)
    : opt_(options), n_(options.membership ? kMaxMemberIds : options.replicas), rng_(options.seed) {
  LS_ASSERT(options.replicas >= 1 && options.replicas <= kMaxReplicas, "replicas=%d",
            options.replicas);
  SetAssertHandler(&ThrowingAssertHandler);
  committed_membership_ = Membership::Initial(options.replicas);
  ever_committed_members_ = committed_membership_.voters;
  memberships_seen_.push_back(committed_membership_);
  nodes_.resize(n_);
  pending_.resize(n_);
  links_.assign(n_, std::vector<bool>(n_, true));
  hold_one_sided_until_.assign(n_, std::vector<uint64_t>(n_, 0));
  one_sided_tail_.assign(n_, std::vector<uint64_t>(n_, 0));
  for (int r = 0; r < opt_.replicas; r++) {
    nodes_[r].present = true;
    try {
      StartReplica(r);
    } catch (const CoreAssertion& e) {
      Fail(std::string("core: ") + e.what());
    }
  }
}

SimCluster::~SimCluster() {
  SetAssertHandler(nullptr);
}

void SimCluster::StartReplica(int r) {
  Node& nd = nodes_[r];
  nd.incarnation = next_incarnation_++;
  CoreConfig cfg;
  cfg.id = r;
  cfg.replicas = opt_.replicas;  // the initial configuration, also for a later replica
  cfg.ring_bytes = opt_.ring_bytes;
  cfg.heartbeat_us = opt_.heartbeat_us;
  cfg.message_heartbeat_us = opt_.message_heartbeat_us;
  cfg.election_timeout_min_us = opt_.election_timeout_min_us;
  cfg.election_timeout_max_us = opt_.election_timeout_max_us;
  cfg.step_down_min_us = opt_.step_down_min_us;
  cfg.lease_us = opt_.lease_us;
  cfg.max_put_bytes = opt_.max_put_bytes;
  cfg.seed = opt_.seed * 0x9e3779b97f4a7c15ull + nd.incarnation * 7919;
  cfg.incarnation = nd.incarnation;
  cfg.promote_within_entries = opt_.promote_within_entries;
  if (opt_.membership_bug) cfg.planted_bug = PlantedBug::kMembershipWithoutRules;
  nd.paused = false;
  nd.disk.clear();
  nd.disk_scheduled = 0;
  nd.disk_free_at = 0;
  nd.batch_start = 0;
  nd.persisted_while_paused.clear();
  ResetMemory(nd);
  nd.acks.assign(static_cast<size_t>(n_) * kAckSlotBytes, 0);
  nd.last_acks.assign(n_, AckWord{});
  nd.deferred.clear();
  nd.checked_upto = 0;
  nd.last_commit = 0;
  nd.durable_checked = UINT64_MAX;  // set from the restarted replica below
  SIM_TRACE("r%d: start incarnation %llu from durable promise %s commit %llu slots [%llu, %llu]", r,
            (U)nd.incarnation, BallotString(nd.durable.promised).c_str(),
            (U)nd.durable.commit_index, (U)nd.durable.first_index,
            (U)(nd.durable.first_index + nd.durable.slots.size() - 1));
  nd.rep = std::make_unique<Replica>(cfg, nd.durable, now_);
  nd.durable_checked = nd.rep->durable_index();  // its log is its disk
  Event tick;
  tick.kind = Ev::kTick;
  tick.to = r;
  tick.incarnation = nd.incarnation;
  Schedule(now_ + 1 + rng_() % opt_.tick_us, std::move(tick));
  SyncRegion(r);
  Drain(r);
  CheckInvariants();
}

// ---------------------------------------------------------------- randomness, events

bool SimCluster::Chance(double p) {
  return Bernoulli(rng_, p);
}

uint64_t SimCluster::Delay() {
  uint64_t hi = lossy_ && Chance(opt_.slow_rate) ? opt_.slow_max_us : opt_.delay_max_us;
  return Uniform(rng_, opt_.delay_min_us, hi);
}

// A one-sided write held back (HoldOneSided) lands after the hold ends, one
// every hold_drain_us in the order issued, and a write issued while they
// still land queues behind them (one connection, first in first out).
uint64_t SimCluster::OneSidedAt(int from, int to) {
  uint64_t at = now_ + Delay();
  uint64_t& tail = one_sided_tail_[from][to];
  if (now_ >= hold_one_sided_until_[from][to] && tail <= now_) return at;
  at = std::max({at, hold_one_sided_until_[from][to], tail + opt_.hold_drain_us});
  tail = at;
  return at;
}

void SimCluster::Schedule(uint64_t at, Event ev) {
  events_.emplace(std::make_pair(std::max(at, now_), next_event_seq_++), std::move(ev));
}

void SimCluster::RunUntilTime(uint64_t t) {
  while (!failed() && !events_.empty() && events_.begin()->first.first <= t) {
    auto it = events_.begin();
    now_ = std::max(now_, it->first.first);
    Event ev = std::move(it->second);
    events_.erase(it);
    steps_++;
    try {
      Process(ev);
      CheckInvariants();
    } catch (const CoreAssertion& e) {
      Fail(std::string("core: ") + e.what());
    }
  }
  if (!failed()) now_ = std::max(now_, t);
}

bool SimCluster::RunUntil(const std::function<bool()>& pred, uint64_t max_us) {
  uint64_t end = now_ + max_us;
  if (pred()) return true;
  while (!failed() && !events_.empty() && events_.begin()->first.first <= end) {
    RunUntilTime(events_.begin()->first.first);
    if (pred()) return true;
  }
  if (!failed()) now_ = std::max(now_, end);
  return !failed() && pred();
}

void SimCluster::Fail(const std::string& what) {
  if (!violation_.empty()) return;
  violation_ = Format("%s (at t=%lluus, seed %llu, %d replicas)", what.c_str(), (U)now_,
                      (U)opt_.seed, opt_.replicas);
  SIM_TRACE("VIOLATION: %s", violation_.c_str());
  for (int r = 0; r < n_; r++)
    if (nodes_[r].present) SIM_TRACE("  %s", Describe(r).c_str());
}

void SimCluster::Trace(const std::string& line) {
  std::string l = Format("[%9lluus] ", (U)now_) + line;
  if (opt_.verbose) fprintf(stderr, "%s\n", l.c_str());
  if (trace_keep_) {
    trace_.push_back(std::move(l));
    while (trace_.size() > opt_.trace_lines + 2 * kMaxReplicas + 2) trace_.pop_front();
  }
}

std::string SimCluster::TraceTail() const {
  std::string out;
  for (const auto& l : trace_) out += l + "\n";
  return out;
}

std::string SimCluster::Describe(int r) const {
  const Node& nd = nodes_[r];
  if (!nd.rep) {
    return Format("r%d: down (durable promise %s commit %llu slots [%llu, %llu])", r,
                  BallotString(nd.durable.promised).c_str(), (U)nd.durable.commit_index,
                  (U)nd.durable.first_index,
                  (U)(nd.durable.first_index + nd.durable.slots.size() - 1));
  }
  const Replica& x = *nd.rep;
  return Format(
      "r%d: inc %llu %s%s promised %s stream %llx commit %llu durable %llu log [%llu, %llu]%s", r,
      (U)nd.incarnation, RoleName(x.role()), nd.paused ? " (paused)" : "",
      BallotString(x.promised()).c_str(), (U)x.stream_id(), (U)x.commit_index(),
      (U)x.durable_index(), (U)x.first_index(), (U)x.last_index(),
      opt_.membership ? (" " + std::string(MemberStateName(x.member_state())) + " in " +
                         x.membership().ToString())
                            .c_str()
                      : "");
}

// ---------------------------------------------------------------- events

void SimCluster::Process(Event& ev) {
  Node& nd = nodes_[ev.to];
  switch (ev.kind) {
    case Ev::kTick: {
      if (!nd.rep || nd.incarnation != ev.incarnation) return;  // the chain of a dead incarnation
      uint64_t jitter = opt_.tick_us / 2 + rng_() % (opt_.tick_us + 1);
      Schedule(now_ + std::max<uint64_t>(1, jitter), ev);
      if (nd.paused) return;
      nd.rep->Tick(now_);
      Poll(ev.to);
      MaybeInstallCheckpoint(ev.to);
      Drain(ev.to);
      return;
    }
    case Ev::kMessage: {
      const Message& m = ev.msg;
      if (!nd.rep || !links_[m.from][m.to]) {
        SIM_TRACE("r%d -> r%d: %s %s lost", m.from, m.to, MessageTypeName(m.type),
                  BallotString(m.ballot).c_str());
        return;
      }
      if (nd.paused) {
        nd.deferred.push_back(m);
        return;
      }
      SIM_TRACE("r%d -> r%d: %s ballot %s stream %llx commit %llu entries %zu", m.from, m.to,
                MessageTypeName(m.type), BallotString(m.ballot).c_str(), (U)m.stream_id,
                (U)m.commit_index, m.entries.size());
      nd.rep->OnMessage(now_, m);
      SyncRegion(ev.to);
      Drain(ev.to);
      return;
    }
    case Ev::kPut:
    case Ev::kControl: {
      Ballot b = ev.kind == Ev::kPut ? ev.ballot : ev.control.ballot;
      uint64_t s = ev.kind == Ev::kPut ? ev.stream : ev.control.stream_id;
      auto it = nd.rep ? nd.region_buffer.find({b, s}) : nd.region_buffer.end();
      if (!nd.rep || !links_[ev.from][ev.to] || it == nd.region_buffer.end()) {
        SIM_TRACE("r%d -> r%d: %s into region %s/%llx lost", ev.from, ev.to,
                  ev.kind == Ev::kPut ? "put" : "control", BallotString(b).c_str(), (U)s);
        return;
      }
      // The region's buffer, which a newer stream may be using by now.
      std::vector<uint8_t>& mem = nd.buffers[it->second];
      if (ev.kind == Ev::kPut) {
        if (ev.offset < kControlBytes || ev.offset + ev.bytes.size() > mem.size()) {
          Fail(Format("put from r%d of %zu bytes at offset %llu outside the region of %zu bytes",
                      ev.from, ev.bytes.size(), (U)ev.offset, mem.size()));
          return;
        }
        memcpy(mem.data() + ev.offset, ev.bytes.data(), ev.bytes.size());
        if (!nd.has_reader || nd.reading != RegionKey{b, s}) stale_region_puts_++;
        SIM_TRACE("r%d -> r%d: put %zu bytes at ring offset %llu of %s/%llx", ev.from, ev.to,
                  ev.bytes.size(), (U)(ev.offset - kControlBytes), BallotString(b).c_str(), (U)s);
      } else {
        memcpy(mem.data(), &ev.control, sizeof ev.control);
        SIM_TRACE("r%d -> r%d: control %s/%llx commit %llu heartbeat %llu sent %llu", ev.from,
                  ev.to, BallotString(b).c_str(), (U)s, (U)ev.control.commit_index,
                  (U)ev.control.heartbeat, (U)ev.control.sent_pos);
      }
      if (nd.paused) return;
      Poll(ev.to);
      Drain(ev.to);
      return;
    }
    case Ev::kAck: {
      if (!nd.rep || !links_[ev.from][ev.to]) {
        SIM_TRACE("r%d -> r%d: ack lost", ev.from, ev.to);
        return;
      }
      memcpy(nd.acks.data() + static_cast<size_t>(ev.from) * kAckSlotBytes, &ev.ack, sizeof ev.ack);
      SIM_TRACE("r%d -> r%d: ack %s/%llx durable %llu consumed %llu echo %llu", ev.from, ev.to,
                BallotString(ev.ack.ballot).c_str(), (U)ev.ack.stream_id, (U)ev.ack.durable_index,
                (U)ev.ack.consumed_pos, (U)ev.ack.heartbeat_echo);
      if (nd.paused) return;
      Poll(ev.to);
      Drain(ev.to);
      return;
    }
    case Ev::kDisk: {
      if (!nd.rep || nd.incarnation != ev.incarnation) return;  // lost with its process
      if (nd.disk.empty() || nd.disk.front().seq != ev.seq) {
        Fail(Format("r%d: disk completion %llu out of order", ev.to, (U)ev.seq));
        return;
      }
      PersistOp op = std::move(nd.disk.front());
      nd.disk.pop_front();
      nd.disk_scheduled--;
      ApplyDurable(ev.to, op);
      if (nd.paused) {
        nd.persisted_while_paused.push_back(op.seq);
        return;
      }
      nd.rep->OnPersisted(now_, op.seq);
      SyncRegion(ev.to);
      Drain(ev.to);
      return;
    }
    case Ev::kCrash: {
      // Aimed crashes respect the fault budget: at most a minority down.
      if (!nd.rep || nd.incarnation != ev.incarnation || !opt_.faults || !lossy_) return;
      if (Down() >= Tolerate()) return;
      SIM_TRACE("fault: aimed crash of r%d", ev.to);
      Crash(ev.to);
      Event restart;
      restart.kind = Ev::kRestart;
      restart.to = ev.to;
      Schedule(now_ + Uniform(rng_, opt_.restart_min_us, opt_.restart_max_us), std::move(restart));
      return;
    }
    case Ev::kRestart: {
      if (nd.rep || !nd.present) return;
      SIM_TRACE("fault: restart r%d", ev.to);
      StartReplica(ev.to);
      return;
    }
    case Ev::kUnreachable: {
      if (!nd.rep || nd.paused) return;
      SIM_TRACE("r%d: peer r%d unreachable", ev.to, ev.from);
      nd.rep->OnPeerUnreachable(now_, ev.from);
      // As the daemon does when its connection to the leader closes.
      if (nd.rep->role() == Role::kBackup && nd.rep->leader() == ev.from)
        nd.rep->OnLeaderGone(now_);
      Drain(ev.to);
      return;
    }
  }
}

// The replica reads the region of (promised, stream) when it is a backup,
// as the daemon does (guard/daemon/peer_link.cc, EnsureRegion); a change of either
// gives it a zeroed region, and it never reads an older one again. Like the
// daemon it keeps the three newest regions and recycles the buffers of
// older ones, whose addresses the leaders that had them still put to.
void SimCluster::SyncRegion(int r) {
  Node& nd = nodes_[r];
  if (!nd.rep) return;
  const Replica& x = *nd.rep;
  Ballot b = x.promised();
  if (x.role() != Role::kBackup || b == 0 || BallotLeader(b) == r) {
    nd.has_reader = false;
    nd.reader.reset();
    return;
  }
  RegionKey key{b, x.stream_id()};
  if (nd.has_reader && nd.reading == key) return;
  auto it = nd.region_buffer.find(key);
  if (it == nd.region_buffer.end()) {
    size_t buf;
    if (!nd.free_buffers.empty()) {
      buf = nd.free_buffers.front();
      nd.free_buffers.pop_front();
      std::fill(nd.buffers[buf].begin(), nd.buffers[buf].end(), 0);
    } else {
      buf = nd.buffers.size();
      nd.buffers.emplace_back(kControlBytes + opt_.ring_bytes, 0);
    }
    it = nd.region_buffer.emplace(key, buf).first;
    nd.region_order.push_back(key);
    while (nd.region_order.size() > 3) {  // older streams are never read again
      nd.free_buffers.push_back(nd.region_buffer[nd.region_order.front()]);
      nd.region_order.pop_front();
    }
    SIM_TRACE("r%d: reads region %s/%llx (buffer %zu)", r, BallotString(b).c_str(), (U)key.second,
              buf);
  }
  nd.reading = key;
  nd.has_reader = true;
  nd.reader = std::make_unique<RingReader>(nd.buffers[it->second].data() + kControlBytes,
                                           opt_.ring_bytes, key.second);
  nd.last_control = ControlWord{};
}

void SimCluster::Poll(int r) {
  Node& nd = nodes_[r];
  if (!nd.rep) return;
  Replica& x = *nd.rep;
  SyncRegion(r);
  if (x.role() == Role::kLeader) {
    for (int p = 0; p < n_; p++) {
      if (p == r) continue;
      AckWord w;
      if (!ReadAck(nd.acks.data() + static_cast<size_t>(p) * kAckSlotBytes, &w)) continue;
      if (memcmp(&w, &nd.last_acks[p], sizeof w) == 0) continue;
      nd.last_acks[p] = w;
      x.OnAck(now_, p, w);
    }
    return;
  }
  if (!nd.has_reader) return;
  const RegionKey key = nd.reading;
  const uint8_t* mem = nd.buffers[nd.region_buffer.at(key)].data();
  ControlWord cw;
  if (ReadControl(mem, &cw) && memcmp(&cw, &nd.last_control, sizeof cw) != 0) {
    nd.last_control = cw;
    x.OnControl(now_, cw);
  }
  DecodedRecord rec;
  bool drained = false;
  for (int i = 0; i < 4096 && nd.has_reader; i++) {
    if (!nd.reader->Peek(&rec)) {
      drained = true;
      break;
    }
    Entry e;
    e.index = rec.header.index;
    e.ballot = rec.header.ballot;
    e.type = static_cast<EntryType>(rec.header.type);
    e.payload.assign(rec.payload.data(), rec.payload.size());  // copied out of the ring first
    nd.reader->Consume(rec);
    SIM_TRACE("r%d: record %llu (%s, ballot %s, %s) commit %llu in %s/%llx, next pos %llu", r,
              (U)e.index, EntryTypeName(e.type), BallotString(e.ballot).c_str(),
              Short(e.payload).c_str(), (U)rec.header.commit_index, BallotString(key.first).c_str(),
              (U)key.second, (U)nd.reader->pos());
    x.OnRecord(now_, key.first, key.second, e, rec.header.commit_index, nd.reader->pos());
    if (x.promised() != key.first || x.stream_id() != key.second) {
      SyncRegion(r);
      break;
    }
  }
  if (drained) x.OnStreamDrained(now_, key.first, key.second);
}

void SimCluster::ApplyDurable(int r, const PersistOp& op) {
  DurableState& d = nodes_[r].durable;
  if (op.promise != 0) {
    if (op.promise < d.promised)
      Fail(Format("r%d: durable promise goes back from %s to %s", r,
                  BallotString(d.promised).c_str(), BallotString(op.promise).c_str()));
    d.promised = std::max(d.promised, op.promise);
  }
  for (const Entry& e : op.entries) {
    if (e.index < d.first_index) continue;  // below a truncation: committed long ago
    if (e.type == EntryType::kConfig) {
      ConfigEntry c;
      if (DecodeConfigEntry(e.payload, &c).empty()) NoteMembership(c.to);
    }
    RecordAcceptance(r, e);
    uint64_t last = d.first_index + d.slots.size() - 1;
    if (e.index == last + 1) {
      d.slots.push_back(e);
    } else if (e.index <= last) {
      d.slots[e.index - d.first_index] = e;
    } else {
      Fail(Format("r%d: durable write of slot %llu leaves a gap after %llu", r, (U)e.index,
                  (U)last));
      return;
    }
  }
  d.commit_index = std::max(d.commit_index, op.commit_index);
  if (op.truncate_below > d.first_index) {
    uint64_t drop = std::min<uint64_t>(op.truncate_below - d.first_index, d.slots.size());
    d.slots.erase(d.slots.begin(), d.slots.begin() + static_cast<long>(drop));
    d.first_index = op.truncate_below;
    if (op.membership) d.membership = op.membership;
  }
  SIM_TRACE("r%d: durable seq %llu: promise %s, %zu entries, commit %llu, truncate %llu", r,
            (U)op.seq, BallotString(op.promise).c_str(), op.entries.size(), (U)op.commit_index,
            (U)op.truncate_below);
}

void SimCluster::ScheduleDisk(int r) {
  Node& nd = nodes_[r];
  if (nd.disk_held) return;
  // Group commit, as the daemon's disk writer does: writes issued while the
  // disk is busy wait and then go down together in the next batch.
  while (nd.disk_scheduled < nd.disk.size()) {
    const PersistOp& op = nd.disk[nd.disk_scheduled++];
    uint64_t t;
    if (nd.disk_free_at > now_ && now_ <= nd.batch_start) {
      t = nd.disk_free_at;  // joins the batch that has not started yet
    } else {
      uint64_t hi =
          lossy_ && Chance(opt_.slow_disk_rate) ? opt_.slow_disk_max_us : opt_.disk_max_us;
      hi = std::max(hi, opt_.disk_min_us);
      nd.batch_start = std::max(now_, nd.disk_free_at);
      t = nd.batch_start + Uniform(rng_, opt_.disk_min_us, hi);
      nd.disk_free_at = t;
    }
    Event ev;
    ev.kind = Ev::kDisk;
    ev.to = r;
    ev.incarnation = nd.incarnation;
    ev.seq = op.seq;
    Schedule(t, std::move(ev));
  }
}

void SimCluster::Drain(int r) {
  Node& nd = nodes_[r];
  if (!nd.rep) return;
  Ready rd = nd.rep->TakeReady();
  if (rd.lost_leadership) SIM_TRACE("r%d: lost leadership", r);
  if (nd.transfer_waiting && !nd.rep->transferring()) {
    TransferState ended = nd.rep->transfer().state;
    if (ended == TransferState::kHandedOver) transfers_handed_over_++;
    if (ended == TransferState::kTimedOut) transfers_timed_out_++;
    SIM_TRACE("r%d: leader move to r%d ended: %s", r, nd.rep->transfer().target,
              TransferStateName(ended));
  }
  nd.transfer_waiting = nd.rep->transferring();
  // Paxos' acceptor rule, checked where it becomes visible: a replica speaks
  // for a ballot (promise, join, ack of entries, or leading it) only once its
  // promise of that ballot is durable, else a crash could make it forget the
  // promise and vote for an older ballot after the new leader counted on it.
  const Ballot durable_promise = nd.durable.promised;
  auto undurable = [&](Ballot b, const char* what) {
    if (b <= durable_promise) return false;
    Fail(Format("r%d: %s for ballot %s while its durable promise is %s", r, what,
                BallotString(b).c_str(), BallotString(durable_promise).c_str()));
    return true;
  };
  for (const Message& m : rd.messages) {
    if ((m.type == Message::Type::kPromise || m.type == Message::Type::kJoin ||
         m.type == Message::Type::kHeartbeat) &&
        undurable(m.ballot, MessageTypeName(m.type)))
      return;
  }
  for (const PutOp& p : rd.puts)
    if (undurable(p.ballot, "put")) return;
  for (const ControlOp& c : rd.controls)
    if (undurable(c.word.ballot, "control word")) return;
  for (const AckOp& a : rd.acks) {
    // An ack that claims nothing past the commit index accepts nothing new.
    if (a.word.durable_index > nd.rep->commit_index() && undurable(a.word.ballot, "ack")) return;
  }
  for (Message& m : rd.messages) {
    if (m.to < 0 || m.to >= n_ || m.to == r || m.from != r) {
      Fail(Format("r%d: message %s addressed from r%d to r%d", r, MessageTypeName(m.type), m.from,
                  m.to));
      return;
    }
    SIM_TRACE("r%d sends r%d: %s ballot %s stream %llx commit %llu promised %s entries %zu", r,
              m.to, MessageTypeName(m.type), BallotString(m.ballot).c_str(), (U)m.stream_id,
              (U)m.commit_index, BallotString(m.promised).c_str(), m.entries.size());
    LS_ASSERT(static_cast<int>(m.type) < Message::kTypes, "message type %d",
              static_cast<int>(m.type));
    sent_[static_cast<int>(m.type)]++;
    if (lossy_ && Chance(opt_.drop_rate)) {
      SIM_TRACE("  (dropped)");
      continue;
    }
    int copies = lossy_ && Chance(opt_.dup_rate) ? 2 : 1;
    for (int c = 0; c < copies; c++) {
      Event ev;
      ev.kind = Ev::kMessage;
      ev.to = m.to;
      ev.from = r;
      ev.msg = m;
      Schedule(now_ + Delay(), std::move(ev));
    }
  }
  for (PutOp& p : rd.puts) {
    if (p.to < 0 || p.to >= n_ || p.to == r) {
      Fail(Format("r%d: put addressed to r%d", r, p.to));
      return;
    }
    SIM_TRACE("r%d puts r%d: %zu bytes at offset %llu of %s/%llx", r, p.to, p.bytes.size(),
              (U)p.offset, BallotString(p.ballot).c_str(), (U)p.stream_id);
    put_bytes_ += p.bytes.size();
    if (lossy_ && Chance(opt_.put_drop_rate)) {
      SIM_TRACE("  (dropped)");
      continue;
    }
    Event ev;
    ev.kind = Ev::kPut;
    ev.to = p.to;
    ev.from = r;
    ev.ballot = p.ballot;
    ev.stream = p.stream_id;
    if (lossy_ && p.bytes.size() > 1 && Chance(opt_.torn_put_rate)) {
      // Torn: two parts land at independent times, so either may be seen alone.
      size_t cut = 1 + rng_() % (p.bytes.size() - 1);
      Event second = ev;
      ev.offset = p.offset;
      ev.bytes = p.bytes.substr(0, cut);
      second.offset = p.offset + cut;
      second.bytes = p.bytes.substr(cut);
      SIM_TRACE("  (torn at %zu)", cut);
      Schedule(OneSidedAt(r, p.to), std::move(ev));
      Schedule(OneSidedAt(r, p.to), std::move(second));
      continue;
    }
    ev.offset = p.offset;
    ev.bytes = std::move(p.bytes);
    Schedule(OneSidedAt(r, p.to), std::move(ev));
  }
  for (ControlOp& c : rd.controls) {
    if (lossy_ && Chance(opt_.drop_rate)) continue;
    Event ev;
    ev.kind = Ev::kControl;
    ev.to = c.to;
    ev.from = r;
    ev.control = c.word;
    Schedule(OneSidedAt(r, c.to), std::move(ev));
  }
  for (AckOp& a : rd.acks) {
    if (a.to < 0 || a.to >= n_ || a.to == r) {
      Fail(Format("r%d: ack addressed to r%d", r, a.to));
      return;
    }
    if (lossy_ && Chance(opt_.drop_rate)) continue;
    Event ev;
    ev.kind = Ev::kAck;
    ev.to = a.to;
    ev.from = r;
    ev.ack = a.word;
    Schedule(OneSidedAt(r, a.to), std::move(ev));
  }
  for (const AckOp& a : rd.acks) {
    if (a.word.durable_index > nd.rep->durable_index()) {
      Fail(Format("r%d: acks durable index %llu past its durable index %llu", r,
                  (U)a.word.durable_index, (U)nd.rep->durable_index()));
      return;
    }
  }
  // Durability claims: a slot being written anew is not durable yet, unless
  // the disk already holds exactly this value there.
  for (const PersistOp& op : rd.persists) {
    // The commit index rides in every record of the write and recovery takes
    // the highest it finds; a tear may keep only the first records. So it
    // must not cover a slot this very write changes.
    for (const Entry& e : op.entries) {
      if (e.index > op.commit_index) continue;
      const Entry* before = DurableAt(r, e.index);
      for (const PersistOp& earlier : nd.disk)
        for (const Entry& w : earlier.entries)
          if (w.index == e.index) before = &w;
      if (!before || !(*before == e)) {
        Fail(
            Format("r%d: a durable write carries commit index %llu but changes slot %llu: a torn "
                   "write would leave a stale value under that commit index",
                   r, (U)op.commit_index, (U)e.index));
        return;
      }
    }
    for (const Entry& e : op.entries) {
      const Entry* d = DurableAt(r, e.index);
      if (e.index <= nd.rep->durable_index() && !(d && *d == e)) {
        Fail(Format("r%d: claims slot %llu durable (durable index %llu) while its write is pending",
                    r, (U)e.index, (U)nd.rep->durable_index()));
        return;
      }
      if (e.index > 0) nd.durable_checked = std::min(nd.durable_checked, e.index - 1);
    }
  }
  for (PersistOp& op : rd.persists) {
    SIM_TRACE(
        "r%d: persist seq %llu: promise %s, %zu entries from %llu, commit %llu, truncate %llu", r,
        (U)op.seq, BallotString(op.promise).c_str(), op.entries.size(),
        (U)(op.entries.empty() ? 0 : op.entries.front().index), (U)op.commit_index,
        (U)op.truncate_below);
    // A crash aimed at the window before this write completes.
    double aim = op.promise != 0 ? opt_.crash_on_promise_rate
                 : nd.rep->role() == Role::kLeader && !op.entries.empty()
                     ? opt_.crash_on_append_rate
                     : 0;
    if (opt_.faults && lossy_ && Chance(aim)) {
      Event ev;
      ev.kind = Ev::kCrash;
      ev.to = r;
      ev.incarnation = nd.incarnation;
      Schedule(now_ + rng_() % (2 * opt_.disk_max_us + 1), std::move(ev));
    }
    nd.disk.push_back(std::move(op));
  }
  ScheduleDisk(r);
  // A leader that just learned of a commit may crash before telling anyone:
  // the next leader must find the chosen value without knowing it committed.
  if (rd.commit_index > nd.last_commit && nd.rep->role() == Role::kLeader && opt_.faults &&
      lossy_ && Chance(opt_.crash_on_commit_rate)) {
    Event ev;
    ev.kind = Ev::kCrash;
    ev.to = r;
    ev.incarnation = nd.incarnation;
    Schedule(now_ + rng_() % (opt_.delay_min_us + 1), std::move(ev));
  }
  nd.last_commit = std::max(nd.last_commit, rd.commit_index);
}

// Paxos' invariant, checked on what replicas durably accepted (whether or
// not anyone learned of it): once a value is chosen at a slot — accepted
// under one ballot by a majority — every acceptance at that slot under a
// higher ballot carries the same value. And a ballot proposes one value per
// slot. A violation here is a wrong choice in phase 1 even if no replica
// ever reported the slot committed.
void SimCluster::RecordAcceptance(int r, const Entry& e) {
  SlotHistory& h = accepted_[e.index];
  Acceptance& a = h.by_ballot[e.ballot];
  if (a.acceptors == 0) {
    a.type = e.type;
    a.payload = e.payload;
  } else if (a.type != e.type || a.payload != e.payload) {
    Fail(Format("paxos: ballot %s proposed two values at slot %llu: '%s' and '%s' (r%d)",
                BallotString(e.ballot).c_str(), (U)e.index, Short(a.payload).c_str(),
                Short(e.payload).c_str(), r));
    return;
  }
  a.acceptors |= 1u << r;
  bool majority_of_each = true;
  for (const Membership& m : memberships_seen_) majority_of_each &= m.IsMajority(a.acceptors);
  if (majority_of_each && (!h.chosen || e.ballot < h.chosen_ballot)) {
    h.chosen = true;
    h.chosen_ballot = e.ballot;
  }
  if (!h.chosen) return;
  const Acceptance& c = h.by_ballot[h.chosen_ballot];
  for (auto it = h.by_ballot.upper_bound(h.chosen_ballot); it != h.by_ballot.end(); ++it) {
    if (it->second.type != c.type || it->second.payload != c.payload) {
      Fail(Format("paxos: slot %llu chose '%s' at ballot %s, but ballot %s carries '%s' (r%d)",
                  (U)e.index, Short(c.payload).c_str(), BallotString(h.chosen_ballot).c_str(),
                  BallotString(it->first).c_str(), Short(it->second.payload).c_str(), r));
      return;
    }
  }
}

const Entry* SimCluster::DurableAt(int r, uint64_t index) const {
  const DurableState& d = nodes_[r].durable;
  if (index < d.first_index || index >= d.first_index + d.slots.size()) return nullptr;
  return &d.slots[index - d.first_index];
}

int SimCluster::Down() const {
  int d = 0;
  for (const Node& nd : nodes_) d += nd.present && (!nd.rep || nd.paused);
  return d;
}

int SimCluster::Tolerate() const {
  int voters = committed_membership_.VoterCount();
  for (const Node& nd : nodes_)
    if (nd.rep && nd.rep->role() == Role::kLeader)
      voters = std::min(voters, nd.rep->membership().VoterCount());
  return (voters - 1) / 2;
}

// ---------------------------------------------------------------- membership

void SimCluster::NoteMembership(const Membership& m) {
  if (std::find(memberships_seen_.begin(), memberships_seen_.end(), m) == memberships_seen_.end())
    memberships_seen_.push_back(m);
}

void SimCluster::AddNode(int r) {
  Node& nd = nodes_[r];
  LS_ASSERT(!nd.present && !nd.rep && nd.incarnation == 0, "node r%d added twice", r);
  SIM_TRACE("membership: node r%d starts empty", r);
  nd.present = true;
  nd.durable = DurableState{};
  StartReplica(r);
}

void SimCluster::RetireNode(int r) {
  Node& nd = nodes_[r];
  if (!nd.present) return;
  SIM_TRACE("membership: node r%d retires", r);
  if (nd.rep) CrashImpl(r, false, 0, 0);
  nd.present = false;
}

ProposeResult SimCluster::ProposeMembershipChange(int r, const MembershipChange& change) {
  ProposeResult res;
  bool ran = Operate(r, [&](Replica& x) {
    res = x.ProposeMembershipChange(now_, change);
    SIM_TRACE("r%d: propose %s r%d -> %s %llu %s", r, MembershipChangeKindName(change.kind),
              change.id, res.ok ? "index" : "refused", (U)res.index, res.error.c_str());
  });
  if (!ran) res.error = "replica down";
  return res;
}

void SimCluster::MaybeInstallCheckpoint(int r) {
  Node& nd = nodes_[r];
  if (!opt_.membership || !nd.rep || nd.rep->role() != Role::kBackup) return;
  uint64_t index = nd.rep->checkpoint_needed();
  if (index == 0 || index > MaxCommitted()) return;
  // The state machine at `index` is the committed record up to it; its
  // configuration, the one the committed entries at or below it made.
  auto it = committed_configs_.upper_bound(index);
  Membership at =
      it == committed_configs_.begin() ? Membership::Initial(opt_.replicas) : std::prev(it)->second;
  if (nd.rep->InstallCheckpoint(now_, index, at)) {
    checkpoints_installed_++;
    SIM_TRACE("r%d: installed a checkpoint at %llu (%s)", r, (U)index, at.ToString().c_str());
  }
}

// ---------------------------------------------------------------- controls

void SimCluster::Crash(int r) {
  Node& nd = nodes_[r];
  if (!nd.rep) return;
  bool tear = lossy_ && !nd.disk.empty() && Chance(opt_.torn_tail_rate);
  size_t whole = 0, records = 0;
  if (tear) {
    whole = rng_() % nd.disk.size();
    size_t n = nd.disk[whole].entries.size();
    records = n == 0 ? 0 : rng_() % n;
  }
  CrashImpl(r, tear, whole, records);
}

void SimCluster::CrashTorn(int r, size_t whole, size_t records) {
  if (!nodes_[r].rep) return;
  CrashImpl(r, true, whole, records);
}

void SimCluster::CrashImpl(int r, bool tear, size_t whole, size_t records) {
  Node& nd = nodes_[r];
  SIM_TRACE("r%d: CRASH (%zu durable writes pending)", r, nd.disk.size());
  crashes_++;
  if (tear && whole < nd.disk.size()) {
    // Some of what was in flight reached the disk: whole writes whose
    // completion the replica never saw, then a prefix of the next one.
    for (size_t i = 0; i < whole; i++) ApplyDurable(r, nd.disk[i]);
    PersistOp part = nd.disk[whole];
    size_t keep = std::min(records, part.entries.size());
    part.entries.resize(keep);
    if (keep == 0) part.commit_index = 0;  // the commit index rides in slot records
    part.truncate_below = 0;
    part.membership.reset();
    ApplyDurable(r, part);
    SIM_TRACE("r%d: torn tail: %zu writes and %zu records of the next reached the disk", r, whole,
              keep);
  }
  nd.rep.reset();
  nd.paused = false;
  nd.disk.clear();
  nd.disk_scheduled = 0;
  ResetMemory(nd);
  nd.deferred.clear();
  nd.persisted_while_paused.clear();
  pending_[r].clear();  // their outcome is unknown to the client
  // The transport of some peers notices the lost connection.
  for (int p = 0; p < n_; p++) {
    if (p == r || !nodes_[p].rep || !Chance(opt_.unreachable_notice_rate)) continue;
    Event ev;
    ev.kind = Ev::kUnreachable;
    ev.to = p;
    ev.from = r;
    Schedule(now_ + Delay() + 1000, std::move(ev));
  }
}

void SimCluster::Restart(int r) {
  if (nodes_[r].rep || !nodes_[r].present) return;
  try {
    StartReplica(r);
  } catch (const CoreAssertion& e) {
    Fail(std::string("core: ") + e.what());
  }
}

void SimCluster::Pause(int r) {
  Node& nd = nodes_[r];
  if (!nd.rep || nd.paused) return;
  SIM_TRACE("r%d: PAUSE (%s %s)", r, RoleName(nd.rep->role()),
            BallotString(nd.rep->promised()).c_str());
  nd.paused = true;
  nd.paused_at_us = now_;
}

void SimCluster::Resume(int r) {
  Node& nd = nodes_[r];
  if (!nd.rep || !nd.paused) return;
  SIM_TRACE("r%d: RESUME (%zu messages, %zu durable writes waiting)", r, nd.deferred.size(),
            nd.persisted_while_paused.size());
  nd.paused = false;
  try {
    std::vector<Message> msgs;
    msgs.swap(nd.deferred);
    std::vector<uint64_t> done;
    done.swap(nd.persisted_while_paused);
    // What happened during the pause is seen in one go: the clock jumped.
    // Like the daemon, it credits its peers the time it did not look.
    nd.rep->OnLocalStall(now_, now_ - nd.paused_at_us);
    nd.rep->Tick(now_);
    Drain(r);
    for (uint64_t seq : done) {
      nd.rep->OnPersisted(now_, seq);
      Drain(r);
    }
    // Messages that queued up meanwhile are handled after the first tick,
    // in their order of arrival: a resumed leader acts on its stale view first.
    uint64_t at = now_;
    for (Message& m : msgs) {
      Event ev;
      ev.kind = Ev::kMessage;
      ev.to = r;
      ev.from = m.from;
      ev.msg = std::move(m);
      at += 1 + rng_() % 20;
      Schedule(at, std::move(ev));
    }
    Poll(r);
    Drain(r);
    CheckInvariants();
  } catch (const CoreAssertion& e) {
    Fail(std::string("core: ") + e.what());
  }
}

void SimCluster::NotifyUnreachable(int at, int peer) {
  Event ev;
  ev.kind = Ev::kUnreachable;
  ev.to = at;
  ev.from = peer;
  Schedule(now_ + Delay(), std::move(ev));
}

void SimCluster::SetLink(int from, int to, bool connected) {
  if (links_[from][to] != connected)
    SIM_TRACE("link r%d -> r%d %s", from, to, connected ? "restored" : "CUT");
  links_[from][to] = connected;
}

void SimCluster::HoldOneSided(int from, int to, uint64_t until_us) {
  SIM_TRACE("one-sided writes r%d -> r%d held until %lluus", from, to, (U)until_us);
  hold_one_sided_until_[from][to] = until_us;
}

void SimCluster::ResetMemory(Node& nd) {
  nd.buffers.clear();
  nd.region_buffer.clear();
  nd.region_order.clear();
  nd.free_buffers.clear();
  nd.has_reader = false;
  nd.reader.reset();
}

void SimCluster::Partition(const std::set<int>& side) {
  for (int a = 0; a < n_; a++)
    for (int b = 0; b < n_; b++)
      if (a != b && side.count(a) != side.count(b)) SetLink(a, b, false);
}

void SimCluster::Heal() {
  for (int a = 0; a < n_; a++)
    for (int b = 0; b < n_; b++)
      if (a != b) SetLink(a, b, true);
}

void SimCluster::HoldDisk(int r, bool hold) {
  nodes_[r].disk_held = hold;
  if (!hold && nodes_[r].rep) ScheduleDisk(r);
}

bool SimCluster::Operate(int r, const std::function<void(Replica&)>& op) {
  Node& nd = nodes_[r];
  if (!nd.rep || nd.paused) return false;
  try {
    op(*nd.rep);
    Drain(r);
    CheckInvariants();
  } catch (const CoreAssertion& e) {
    Fail(std::string("core: ") + e.what());
  }
  return true;
}

ProposeResult SimCluster::Propose(int r, EntryType type, std::string payload) {
  ProposeResult res;
  bool ran = Operate(r, [&](Replica& x) {
    std::string shown = Short(payload);
    res = x.Propose(now_, type, std::move(payload));
    SIM_TRACE("r%d: propose %s -> %s %llu %s", r, shown.c_str(), res.ok ? "index" : "refused",
              (U)res.index, res.error.c_str());
  });
  if (!ran) res.error = "replica down";
  return res;
}

bool SimCluster::HandOver(int r, int successor, uint64_t hold_us) {
  bool ok = false;
  Operate(r, [&](Replica& x) {
    ok = x.HandOver(now_, successor, hold_us);
    SIM_TRACE("r%d: hand over to r%d, hold %llu us -> %s", r, successor, (U)hold_us,
              ok ? "done" : "refused");
  });
  return ok;
}

std::string SimCluster::TransferLeadership(int r, int target, uint64_t timeout_us,
                                           uint64_t hold_us) {
  std::string why = "core assertion";
  bool ran = Operate(r, [&](Replica& x) {
    why = x.TransferLeadership(now_, target, timeout_us, hold_us);
    if (why.empty()) transfers_++;
    SIM_TRACE("r%d: move leadership to r%d (timeout %llu us, hold %llu us) -> %s", r, target,
              (U)timeout_us, (U)hold_us, why.empty() ? "started" : why.c_str());
  });
  return ran ? why : "replica down or paused";
}

void SimCluster::Track(int r, uint64_t index, EntryType type, const std::string& payload) {
  Tracked t;
  t.replica = r;
  t.incarnation = nodes_[r].incarnation;
  t.index = index;
  t.entry.index = index;
  t.entry.type = type;
  t.entry.payload = payload;
  pending_[r][index] = std::move(t);
  CheckInvariants();
}

bool SimCluster::TruncateBelow(int r, uint64_t index) {
  bool ok = false;
  Operate(r, [&](Replica& x) {
    ok = x.TruncateBelow(index);
    SIM_TRACE("r%d: truncate below %llu -> %s (log [%llu, %llu])", r, (U)index,
              ok ? "ok" : "refused", (U)x.first_index(), (U)x.last_index());
  });
  return ok;
}

int SimCluster::Leader() const {
  int best = -1;
  for (int r = 0; r < n_; r++) {
    const Replica* x = replica(r);
    if (!x || nodes_[r].paused || x->role() != Role::kLeader) continue;
    if (!x->membership().IsVoter(r) && x->commit_index() >= x->membership_index())
      continue;  // removed, and stepping aside
    if (best < 0 || x->promised() > replica(best)->promised()) best = r;
  }
  return best;
}

bool SimCluster::MajorityCommitted(uint64_t index) const {
  uint32_t done = 0;
  for (int r = 0; r < n_; r++) {
    const Replica* x = replica(r);
    if (x && x->commit_index() >= index) done |= 1u << r;
  }
  return committed_membership_.IsMajority(done);
}

bool SimCluster::AllCommitted(uint64_t index) const {
  for (int r = 0; r < n_; r++) {
    if (!committed_membership_.IsMember(r)) continue;
    const Replica* x = replica(r);
    if (!x || x->commit_index() < index) return false;
  }
  return true;
}

}  // namespace lockstep
