// core.cc — the Multi-Paxos state machine of one replica (see core.h).
// Long functions on purpose: each handler reads top to bottom.
#include "consensus/core.h"

#include <algorithm>
#include <array>
#include <functional>

#include "consensus/assert.h"

namespace lockstep {

const char* RoleName(Role r) {
  switch (r) {
    case Role::kBackup: return "backup";
    case Role::kCandidate: return "candidate";
    case Role::kLeader: return "leader";
  }
  return "?";
}

const char* TransferStateName(TransferState s) {
  switch (s) {
    case TransferState::kNone: return "none";
    case TransferState::kWaiting: return "waiting";
    case TransferState::kHandedOver: return "handed-over";
    case TransferState::kTimedOut: return "timed-out";
    case TransferState::kLostLeadership: return "lost-leadership";
  }
  return "?";
}

const char* MessageTypeName(Message::Type t) {
  switch (t) {
    case Message::Type::kPrepare: return "prepare";
    case Message::Type::kPromise: return "promise";
    case Message::Type::kNack: return "nack";
    case Message::Type::kHeartbeat: return "heartbeat";
    case Message::Type::kJoin: return "join";
    case Message::Type::kPreVote: return "pre-vote";
    case Message::Type::kPreVoteReply: return "pre-vote-reply";
    case Message::Type::kNeedCheckpoint: return "need-checkpoint";
    case Message::Type::kTakeOver: return "take-over";
  }
  return "?";
}

Replica::Replica(const CoreConfig& config, DurableState state, uint64_t now_us)
    : config_(config), rng_(config.seed * 1000003 + config.id) {
  LS_ASSERT(config.replicas >= 1 && config.replicas <= kMaxReplicas, "replicas=%d",
            config.replicas);
  LS_ASSERT(Membership::InRange(config.id), "id=%d", config.id);
  promised_ = durable_promised_ = state.promised;
  max_round_seen_ = BallotRound(state.promised);
  first_index_ = state.first_index;
  base_membership_ = state.membership.value_or(Membership::Initial(config.replicas));
  for (auto& e : state.slots) {
    slots_.push_back(std::move(e));
    NoteSlotWritten(slots_.back());
  }
  RefreshMembership();
  commit_index_ = std::min(state.commit_index, last_index());
  if (commit_index_ + 1 < first_index_) commit_index_ = first_index_ - 1;
  durable_index_ = last_index();
  accepted_upto_ = commit_index_;
  stream_id_ = config.incarnation << 32;  // stream ids grow across restarts
  may_vote_ = !state.damaged;
  peers_.resize(kMaxMemberIds);
  ResetElectionTimer(now_us);
  // A (re)started replica first listens for a few message-heartbeat periods:
  // a live leader finds it and it rejoins without disturbing anyone.
  election_deadline_us_ += 3 * config_.message_heartbeat_us;
  // A single replica is its own majority.
  if (config.replicas == 1) election_deadline_us_ = now_us;
  // Before a restart we may have echoed a heartbeat whose lease still runs.
  if (config.replicas > 1) lease_guard_until_us_ = now_us + config_.LeaseGuardUs();
}

int Replica::leader() const {
  if (role_ == Role::kLeader) return config_.id;
  if (role_ == Role::kBackup && promised_ != 0 && BallotLeader(promised_) != config_.id)
    return BallotLeader(promised_);
  return -1;
}

const Entry* Replica::At(uint64_t index) const {
  if (index < first_index_ || index > last_index()) return nullptr;
  return &slots_[index - first_index_];
}

Entry* Replica::MutableAt(uint64_t index) {
  if (index < first_index_ || index > last_index()) return nullptr;
  return &slots_[index - first_index_];
}

void Replica::ResetElectionTimer(uint64_t now_us) {
  std::uniform_int_distribution<uint64_t> d(config_.election_timeout_min_us,
                                            config_.election_timeout_max_us);
  election_deadline_us_ = now_us + d(rng_);
}

// ---------------------------------------------------------------- ticking

void Replica::Tick(uint64_t now_us) {
  if (role_ == Role::kLeader) {
    if (now_us >= next_control_us_) {
      heartbeat_counter_++;
      // Its put happens after this (TakeReady): a lease counted from here
      // ends no later than one counted from the put.
      heartbeat_sent_us_.emplace_back(heartbeat_counter_, now_us);
      if (heartbeat_sent_us_.size() > 256) heartbeat_sent_us_.pop_front();
      ForEachId(OtherMembers(), [&](int p) {
        if (peers_[p].ready) PutControl(p);
      });
      next_control_us_ = now_us + config_.heartbeat_us;
    }
    if (now_us >= next_message_heartbeat_us_) {
      ForEachId(OtherMembers(), [&](int p) {
        Message m;
        m.type = Message::Type::kHeartbeat;
        m.from = config_.id;
        m.to = p;
        m.ballot = promised_;
        m.commit_index = commit_index_;
        m.stream_id = peers_[p].ready ? peers_[p].stream_id : 0;
        m.sent_pos = peers_[p].sent_pos;
        ready_.messages.push_back(std::move(m));
      });
      next_message_heartbeat_us_ = now_us + config_.message_heartbeat_us;
    }
    // A leader cut off from a majority steps down so clients look elsewhere.
    // Not soon: its backups may merely be stalled (waiting on a disk they
    // share with it, or descheduled) while it runs, and stepping down then
    // forces an election that nothing else needed. Waiting is safe: without
    // a majority it commits nothing, so its clients only wait.
    const uint64_t step_down_after_us =
        std::max<uint64_t>(4 * config_.election_timeout_max_us, config_.step_down_min_us);
    // A removed leader (its removal not yet committed) counts only others.
    int heard = membership_.IsVoter(config_.id) ? 1 : 0;
    ForEachId(OtherVoters(), [&](int p) {
      if (peers_[p].last_heard_us + config_.election_timeout_max_us >= now_us) heard++;
    });
    if (heard >= Majority()) {
      last_majority_contact_us_ = now_us;
    } else if (now_us > last_majority_contact_us_ + step_down_after_us) {
      StepDown(now_us, promised_);
    }
    if (transferring()) StepTransfer(now_us);
    MaybeStepAsideRemoved(now_us);
    return;
  }
  if (now_us >= election_deadline_us_) {
    if (MayStand(now_us)) {
      StartPreVote(now_us);
    } else if (MayStand(lease_guard_until_us_)) {
      // Only a lease we guard stands in the way (the leader's connection
      // closed, OnLeaderGone): stand as soon as it ends, with the same
      // jitter, as the other backups that saw its last heartbeat will.
      std::uniform_int_distribution<uint64_t> jitter(0, config_.election_timeout_min_us / 20);
      election_deadline_us_ = lease_guard_until_us_ + jitter(rng_);
    } else {
      ResetElectionTimer(now_us);
    }
  }
}

bool Replica::MayStand(uint64_t now_us) const {
  return may_vote_ && membership_.IsVoter(config_.id) && commit_index_ >= lead_after_commit_ &&
         now_us >= election_hold_until_us_ && now_us >= lease_guard_until_us_;
}

uint64_t Replica::LeaseUntil() const {
  if (config_.lease_us == 0 || role_ != Role::kLeader || commit_index_ < lease_from_index_)
    return 0;
  // The heartbeat a majority has echoed, ourselves included (we echo the
  // newest): everyone who echoed it guards at least until it was put plus
  // the lease, and any other candidate needs the promise of one of them.
  // Called every pass of the daemon's loop: no allocation.
  // Only the voters of our configuration: a removed leader counts not itself.
  std::array<uint64_t, kMaxMemberIds> echoes{};
  int n = 0;
  ForEachId(membership_.voters, [&](int p) {
    echoes[n++] = p == config_.id ? heartbeat_counter_ : peers_[p].heartbeat_echo;
  });
  std::sort(echoes.begin(), echoes.begin() + n, std::greater<uint64_t>());
  uint64_t echoed = echoes[Majority() - 1];
  if (echoed == 0) return 0;
  for (const auto& [counter, sent_us] : heartbeat_sent_us_)
    if (counter == echoed) return sent_us + config_.lease_us;
  return 0;  // older than every put we remember: long expired
}

void Replica::OnLeaderGone(uint64_t now_us) {
  if (role_ != Role::kBackup) return;
  last_leader_contact_us_ = 0;
  std::uniform_int_distribution<uint64_t> jitter(0, config_.election_timeout_min_us / 20);
  election_deadline_us_ = std::min(election_deadline_us_, now_us + jitter(rng_));
}

void Replica::OnLocalStall(uint64_t now_us, uint64_t gap_us) {
  // Silence during the gap is not counted against anyone: each clock that
  // judges a peer by its silence moves on by the gap, capped at now.
  auto credit = [&](uint64_t& at) { at = std::min(now_us, at + gap_us); };
  if (role_ == Role::kLeader) {
    credit(last_majority_contact_us_);  // the backups' silence was our deafness
    return;
  }
  // Known gone (OnLeaderGone): the short deadline it set stands.
  if (role_ == Role::kBackup && leader() >= 0 && last_leader_contact_us_ == 0) return;
  // It cannot tell a dead leader from its own gap (the VM stopped, or every
  // replica waited on the one disk they share): the gap is added to the
  // leader's time, for its own candidacy and for the pre-votes it grants.
  if (last_leader_contact_us_ != 0) credit(last_leader_contact_us_);
  if (unheard_ack_index_) credit(unheard_ack_since_us_);  // nor the leader's silence on our acks
  election_deadline_us_ += gap_us;
  if (prevoting_) {
    prevoting_ = false;  // started on a view the gap made stale
    ResetElectionTimer(now_us);
  }
}

// ---------------------------------------------------------------- proposals

std::string Replica::WhyNotProposing() const {
  if (role_ != Role::kLeader) {
    int l = leader();
    return l >= 0 ? "not the leader (replica " + std::to_string(l) + " is)"
                  : "no leader at the moment (election in progress)";
  }
  if (transferring())
    return "leadership is moving to replica " + std::to_string(transfer_.target) +
           " (retry there in a moment)";
  return "";
}

ProposeResult Replica::Propose(uint64_t now_us, EntryType type, std::string payload) {
  (void)now_us;
  ProposeResult r;
  r.error = WhyNotProposing();
  if (!r.error.empty()) return r;
  if (payload.size() > max_payload()) {
    r.error = "proposal of " + std::to_string(payload.size()) +
              " bytes exceeds the log region's limit of " + std::to_string(max_payload()) +
              " bytes";
    return r;
  }
  if (type == EntryType::kConfig) {
    r.error = "membership changes are proposed one at a time with ProposeMembershipChange";
    return r;
  }
  LS_ASSERT(IsSlotType(type), "type %d", static_cast<int>(type));
  r.ok = true;
  r.index = Append(type, std::move(payload));
  return r;
}

uint64_t Replica::Append(EntryType type, std::string payload) {
  LS_ASSERT(role_ == Role::kLeader, "append while %s", RoleName(role_));
  Entry e;
  e.index = last_index() + 1;
  e.ballot = promised_;
  e.type = type;
  e.payload = std::move(payload);
  slots_.push_back(e);
  if (NoteSlotWritten(e)) RefreshMembership();
  std::vector<Entry> batch;
  batch.push_back(std::move(e));
  Persist(std::move(batch), 0, {});
  ForEachId(OtherMembers(), [&](int p) { Pump(p); });
  if (membership_.voters == (1u << config_.id)) AdvanceCommit();
  return last_index();
}

// ---------------------------------------------------------------- persistence

// The commit index an op writes into its records. Recovery takes the highest
// one it finds, and a torn write keeps only the op's first records, so the
// index may cover only slots whose current values reach the disk before this
// op's first record: those durable already or written by earlier ops. (A
// commit index covering a slot rewritten later in the same op would make a
// restart trust the stale value the tear left there.)
uint64_t Replica::CommitForNextPersist(bool grouping) const {
  uint64_t covered = durable_index_;
  size_t earlier = pending_persists_.size() - (grouping ? 1 : 0);
  for (size_t i = 0; i < earlier; i++) covered = std::max(covered, pending_persists_[i].upto);
  return std::min(commit_index_, covered);
}

void Replica::Persist(std::vector<Entry> entries, Ballot promise, std::vector<Message> then_send) {
  uint64_t upto = 0;
  for (const Entry& e : entries) upto = std::max(upto, e.index);
  if (!ready_.persists.empty()) {  // group: one op per TakeReady
    PersistOp& op = ready_.persists.back();
    for (auto& e : entries) op.entries.push_back(std::move(e));
    op.promise = std::max(op.promise, promise);
    op.commit_index = CommitForNextPersist(/*grouping=*/true);
    PendingPersist& pp = pending_persists_.back();
    LS_ASSERT(pp.seq == op.seq, "persist queue out of step");
    pp.upto = std::max(pp.upto, upto);
    pp.promise = std::max(pp.promise, promise);
    for (auto& m : then_send) pp.then_send.push_back(std::move(m));
    return;
  }
  PersistOp op;
  op.seq = next_persist_seq_++;
  op.entries = std::move(entries);
  op.promise = promise;
  op.commit_index = CommitForNextPersist(/*grouping=*/false);
  pending_persists_.push_back(PendingPersist{op.seq, upto, promise, std::move(then_send)});
  ready_.persists.push_back(std::move(op));
}

void Replica::ClampPendingPersists(uint64_t index) {
  // Slot `index` gets a new value: earlier writes no longer prove it durable.
  if (index == 0) return;
  durable_index_ = std::min(durable_index_, index - 1);
  for (auto& pp : pending_persists_) pp.upto = std::min(pp.upto, index - 1);
}

void Replica::SetSlot(const Entry& e) {
  LS_ASSERT(e.index >= first_index_ && e.index <= last_index() + 1, "slot %lu outside [%lu, %lu]",
            (unsigned long)e.index, (unsigned long)first_index_, (unsigned long)last_index() + 1);
  LS_ASSERT(e.index > commit_index_, "overwriting committed slot %lu (commit %lu)",
            (unsigned long)e.index, (unsigned long)commit_index_);
  ClampPendingPersists(e.index);
  if (e.index == last_index() + 1) {
    slots_.push_back(e);
  } else {
    *MutableAt(e.index) = e;
  }
  if (NoteSlotWritten(e)) RefreshMembership();
}

void Replica::OnPersisted(uint64_t now_us, uint64_t seq) {
  std::vector<Message> to_send;
  while (!pending_persists_.empty() && pending_persists_.front().seq <= seq) {
    PendingPersist& pp = pending_persists_.front();
    durable_index_ = std::max(durable_index_, std::min(pp.upto, last_index()));
    durable_promised_ = std::max(durable_promised_, pp.promise);
    for (auto& m : pp.then_send) to_send.push_back(std::move(m));
    pending_persists_.pop_front();
  }
  for (auto& m : to_send) {
    // A deferred reply is stale if we promised something higher meanwhile.
    if (m.ballot < promised_) continue;
    ready_.messages.push_back(std::move(m));
  }
  if (role_ == Role::kLeader) {
    AdvanceCommit();
    MaybeStepAsideRemoved(now_us);
  } else if (role_ == Role::kCandidate) {
    MaybeWin(now_us);
  } else {
    ack_dirty_ = true;
  }
}

// ---------------------------------------------------------------- elections

// Sends (type, ballot, our commit index) to every other member of our
// configuration (a pre-vote: to the voters, the only ones who grant).
void Replica::Broadcast(Message::Type type, Ballot ballot) {
  uint32_t to = type == Message::Type::kPreVote ? OtherVoters() : OtherMembers();
  if (type == Message::Type::kPrepare) prepared_ = to;
  ForEachId(to, [&](int p) {
    Message m;
    m.type = type;
    m.from = config_.id;
    m.to = p;
    m.ballot = ballot;
    m.commit_index = commit_index_;
    if (type == Message::Type::kPrepare) m.handed_over = handed_over_;
    ready_.messages.push_back(std::move(m));
  });
}

// A prepare of our ballot to a voter phase 1 taught us of (MaybeWin).
void Replica::SendPrepare(int to) {
  prepared_ |= 1u << to;
  Message m;
  m.type = Message::Type::kPrepare;
  m.from = config_.id;
  m.to = to;
  m.ballot = promised_;
  m.commit_index = commit_index_;
  m.handed_over = handed_over_;
  ready_.messages.push_back(std::move(m));
}

// Tells the sender of a message about a ballot below our promise that it is
// stale, so a deposed leader or losing candidate learns of the newer round.
void Replica::SendNack(const Message& m) {
  Message nack;
  nack.type = Message::Type::kNack;
  nack.from = config_.id;
  nack.to = m.from;
  nack.ballot = m.ballot;
  nack.promised = promised_;
  ready_.messages.push_back(std::move(nack));
}

// A leader that keeps speaking but commits nothing this backup acked an
// election timeout ago does not hear its backups: a one-way partition (what
// it sends goes out, what is sent to it is lost), or its acks' path wedged.
// Its words then stop counting as a live leader, so the backups, which all
// see the same, elect one of themselves; it would step down by itself only
// much later (Tick: step_down_min_us). A backup whose acks reach it sees
// them committed well within the timeout, whatever the load: commit needs a
// majority of acks, not the leader's own disk. Only a heartbeat or a control
// word starts a probe: they carry the leader's commit index as it is now,
// where a record carries it as it was when the record was put, which a
// backup draining a backlog (after a restore, a stall) reads long after.
bool Replica::LeaderHearsUs(uint64_t now_us, uint64_t leader_commit, bool current) {
  if (unheard_ack_index_ && leader_commit >= unheard_ack_index_) unheard_ack_index_ = 0;
  uint64_t acked = std::min(durable_index_, accepted_upto_);
  if (current && !unheard_ack_index_ && may_vote_ && acked > leader_commit) {
    unheard_ack_index_ = acked;
    unheard_ack_since_us_ = now_us;
  }
  return !unheard_ack_index_ || now_us < unheard_ack_since_us_ + config_.election_timeout_max_us;
}

void Replica::NoteLeaderAlive(uint64_t now_us, uint64_t leader_commit, bool current) {
  if (!LeaderHearsUs(now_us, leader_commit, current)) return;
  last_leader_contact_us_ = now_us;
  prevoting_ = false;
  ResetElectionTimer(now_us);
}

void Replica::StartPreVote(uint64_t now_us) {
  if (membership_.voters == (1u << config_.id)) {
    StartElection(now_us);
    return;
  }
  prevoting_ = true;
  prevote_ballot_ = MakeBallot(std::max(max_round_seen_, BallotRound(promised_)) + 1, config_.id);
  prevote_grants_ = {config_.id};
  Broadcast(Message::Type::kPreVote, prevote_ballot_);
  ResetElectionTimer(now_us);
}

void Replica::HandlePreVote(uint64_t now_us, const Message& m) {
  // Grant when we would promise the ballot and have no live leader ourselves.
  // A lease we guard counts as a live leader: our promise would break it.
  bool leader_alive = role_ == Role::kLeader ||
                      (role_ == Role::kBackup && leader() >= 0 &&
                       now_us < last_leader_contact_us_ + config_.election_timeout_min_us) ||
                      now_us < lease_guard_until_us_;
  Message reply;
  reply.type = Message::Type::kPreVoteReply;
  reply.from = config_.id;
  reply.to = m.from;
  reply.ballot = m.ballot;
  // Whatever this replica is in its own configuration: a learner may be a
  // voter in the candidate's already (promoted before it knows), a removed
  // replica may not know it is. The candidate counts only its voters.
  reply.granted = may_vote_ && m.ballot > promised_ && !leader_alive;
  ready_.messages.push_back(std::move(reply));
}

void Replica::HandlePreVoteReply(uint64_t now_us, const Message& m) {
  if (!prevoting_ || m.ballot != prevote_ballot_ || !m.granted || role_ == Role::kLeader) return;
  prevote_grants_.insert(m.from);
  uint32_t grants = 0;
  for (int g : prevote_grants_) grants |= 1u << g;
  if (membership_.IsMajority(grants)) StartElection(now_us);
}

void Replica::StartElection(uint64_t now_us, Ballot handed_over) {
  prevoting_ = false;
  handed_over_ = handed_over;
  uint64_t round = std::max(max_round_seen_, BallotRound(promised_)) + 1;
  Ballot b = MakeBallot(round, config_.id);
  if (role_ == Role::kLeader) ready_.lost_leadership = true;
  role_ = Role::kCandidate;
  promised_ = b;
  max_round_seen_ = round;
  promises_.clear();
  Message self;
  self.type = Message::Type::kPromise;
  self.from = self.to = config_.id;
  self.ballot = b;
  self.commit_index = commit_index_;
  promises_[config_.id] = std::move(self);  // our own log is read directly
  Persist({}, b, {});
  Broadcast(Message::Type::kPrepare, b);
  ResetElectionTimer(now_us);
}

// Whether a prepare for m.ballot may have our promise now: not while we
// guard a lease, unless the leader whose lease it is handed over to m's
// sender (it gave the lease up before it sent kTakeOver).
bool Replica::LeaseAllowsPromise(uint64_t now_us, const Message& m) {
  if (now_us >= lease_guard_until_us_) return true;
  if (m.handed_over == 0 || m.handed_over != promised_) return false;
  lease_guard_until_us_ = 0;
  return true;
}

void Replica::MaybeWin(uint64_t now_us) {
  if (role_ != Role::kCandidate) return;
  // Our own promise must be durable before we lead, even when the others'
  // promises alone make a majority: a leader whose promise is lost in a
  // crash restarts below its ballot, may run for the very same ballot again
  // and, fed late promises from its first run, propose other values under a
  // ballot whose entries some backups already hold. OnPersisted retries.
  if (durable_promised_ < promised_) return;
  // promises_ holds one promise of this ballot per sender, our own included;
  // only those of voters count.
  uint32_t promised = 0;
  for (const auto& [from, m] : promises_) promised |= 1u << from;
  if (!membership_.IsMajority(promised)) return;
  std::vector<Entry> chosen;
  uint64_t known_commit = 0, end = 0;
  if (!ChoosePhaseOneValues(&chosen, &known_commit, &end)) {
    // Only possible when promisers truncated below what we lack: we would
    // need a snapshot. Stay candidate; someone better placed will win, and
    // stand for no election before catching up to what they committed:
    // each of our prepares would only reset the timer of the replica that
    // can lead.
    lead_after_commit_ = known_commit;
    ResetElectionTimer(now_us);
    return;
  }
  // Phase 1 may have taught us a newer configuration (a promiser's kConfig
  // entry): we lead only with a majority of it too (core.h), asking the
  // voters of it we did not ask yet.
  Membership after = base_membership_;
  for (const auto& [index, c] : config_entries_)
    if (index <= commit_index_ && c.from == after) after = c.to;
  for (const Entry& e : chosen) {
    if (e.type != EntryType::kConfig) continue;
    ConfigEntry c;
    std::string why = DecodeConfigEntry(e.payload, &c);
    LS_ASSERT(why.empty(), "chosen config entry %lu: %s", (unsigned long)e.index, why.c_str());
    if (c.from == after) after = c.to;
  }
  if (!after.IsMajority(promised)) {
    ForEachId(after.voters & ~prepared_ & ~(1u << config_.id), [&](int p) { SendPrepare(p); });
    return;
  }
  BecomeLeader(now_us, std::move(chosen), known_commit, end);
}

bool Replica::ChoosePhaseOneValues(std::vector<Entry>* chosen, uint64_t* known_commit_out,
                                   uint64_t* end_out) const {
  // Phase 1 is complete: pick, for every slot past our commit index, the
  // value accepted under the highest ballot among the promises.
  uint64_t known_commit = commit_index_;
  uint64_t end = last_index();
  for (const auto& [from, m] : promises_) {
    known_commit = std::max(known_commit, m.commit_index);
    for (const Entry& e : m.entries) end = std::max(end, e.index);
  }
  end = std::max(end, known_commit);
  *known_commit_out = known_commit;
  *end_out = end;
  for (uint64_t i = commit_index_ + 1; i <= end; i++) {
    const Entry* best = nullptr;
    if (i <= known_commit) {
      // Committed already: its value is what a promiser that knows it
      // committed holds. The highest-ballot rule is not enough here: that
      // promiser may have truncated the slot (it is below its commit index),
      // and then the highest ballot among the others can be a stale value of
      // an old ballot, ours included, that lost the slot.
      for (const auto& [from, m] : promises_) {
        if (from == config_.id || m.commit_index < i) continue;
        for (const Entry& e : m.entries)
          if (e.index == i) best = &e;
        if (best) break;
      }
    } else {
      // Not known committed: Paxos' rule, the value accepted under the
      // highest ballot (no promiser truncates past its commit index).
      best = At(i);
      for (const auto& [from, m] : promises_) {
        if (from == config_.id) continue;
        for (const Entry& e : m.entries)
          if (e.index == i && (!best || e.ballot > best->ballot)) best = &e;
      }
    }
    if (!best) return false;
    Entry e = *best;
    if (i > known_commit) e.ballot = promised_;  // re-propose under our ballot
    chosen->push_back(std::move(e));
  }
  return true;
}

void Replica::BecomeLeader(uint64_t now_us, std::vector<Entry> chosen, uint64_t known_commit,
                           uint64_t end) {
  for (const Entry& e : chosen) SetSlot(e);
  LS_ASSERT(last_index() == end, "log end %lu != %lu", (unsigned long)last_index(),
            (unsigned long)end);
  if (!chosen.empty()) Persist(std::move(chosen), 0, {});
  commit_index_ = known_commit;
  ballot_start_index_ = known_commit + 1;
  proposed_from_ = end + 1;
  lease_from_index_ = end;  // what earlier leaders may have acknowledged
  heartbeat_sent_us_.clear();
  role_ = Role::kLeader;
  for (auto& p : peers_) p = PeerStream{};
  std::map<int, Message> promises;
  promises.swap(promises_);
  for (const auto& [from, m] : promises)
    if (from != config_.id && ((OtherMembers() >> from) & 1))
      StartPeerStream(from, m.stream_id, m.commit_index, now_us);
  next_control_us_ = now_us;
  next_message_heartbeat_us_ = now_us;
  last_majority_contact_us_ = now_us;
  commit_changed_ = true;
  if (membership_.voters == (1u << config_.id)) AdvanceCommit();
}

void Replica::StepDown(uint64_t now_us, Ballot seen) {
  if (role_ == Role::kLeader) ready_.lost_leadership = true;
  if (transferring()) {
    transfer_.state = TransferState::kLostLeadership;
    transfer_.ended_us = now_us;
  }
  if (role_ != Role::kBackup) {
    role_ = Role::kBackup;
    for (auto& p : peers_) p = PeerStream{};
    promises_.clear();
  }
  max_round_seen_ = std::max(max_round_seen_, BallotRound(seen));
  ResetElectionTimer(now_us);
}

void Replica::OpenStream() {
  // A fresh region: whatever anyone writes into an older one is never read.
  stream_id_++;
  accepted_upto_ = commit_index_;
  consumed_pos_ = 0;
  stall_suspect_pos_ = 0;
  last_heartbeat_seen_ = 0;
  stall_armed_ = false;
  ack_dirty_ = false;
}

void Replica::Promise(uint64_t now_us, Ballot b, const Message* prepare) {
  LS_ASSERT(b > promised_, "promise %s not above %s", BallotString(b).c_str(),
            BallotString(promised_).c_str());
  StepDown(now_us, b);
  prevoting_ = false;
  promised_ = b;
  unheard_ack_index_ = 0;  // a new leader: nothing of ours is unheard by it yet
  OpenStream();
  std::vector<Message> then_send;
  Message reply;
  reply.from = config_.id;
  reply.to = BallotLeader(b);
  reply.ballot = b;
  reply.stream_id = stream_id_;
  reply.commit_index = commit_index_;
  if (prepare) {
    reply.type = Message::Type::kPromise;
    for (uint64_t i = std::max(prepare->commit_index + 1, first_index_); i <= last_index(); i++)
      reply.entries.push_back(*At(i));
  } else {
    reply.type = Message::Type::kJoin;
    last_join_us_ = now_us;
  }
  then_send.push_back(std::move(reply));
  Persist({}, b, std::move(then_send));
}

void Replica::HandlePrepare(uint64_t now_us, const Message& m) {
  if (m.ballot > promised_ && may_vote_ && LeaseAllowsPromise(now_us, m)) {
    Promise(now_us, m.ballot, &m);
    return;
  }
  max_round_seen_ = std::max(max_round_seen_, BallotRound(m.ballot));
  if (m.ballot < promised_) {
    SendNack(m);
  }
}

void Replica::HandlePromise(uint64_t now_us, const Message& m) {
  if (m.ballot != promised_) return;
  // Entries come from the network: a configuration entry that does not
  // decode makes the whole promise worthless (never asserted on).
  ConfigEntry scratch;
  for (const Entry& e : m.entries)
    if (e.type == EntryType::kConfig && !DecodeConfigEntry(e.payload, &scratch).empty()) {
      rejected_records_++;
      return;
    }
  if (role_ == Role::kLeader) {  // a late promise doubles as a join
    if (((OtherMembers() >> m.from) & 1) && m.stream_id > peers_[m.from].stream_id)
      StartPeerStream(m.from, m.stream_id, m.commit_index, now_us);
    return;
  }
  if (role_ != Role::kCandidate) return;
  promises_[m.from] = m;
  MaybeWin(now_us);
}

void Replica::HandleHeartbeat(uint64_t now_us, const Message& m) {
  if (m.ballot < promised_) {
    SendNack(m);
    return;
  }
  if (m.ballot > promised_) {
    // A leader we never promised to: it finished phase 1 without us. Promise
    // its ballot and ask for a stream.
    Promise(now_us, m.ballot, nullptr);
    return;
  }
  if (role_ != Role::kBackup) return;
  NoteLeaderAlive(now_us, m.commit_index, /*current=*/true);
  commit_index_ = std::max(commit_index_, std::min(m.commit_index, accepted_upto_));
  // Lost puts leave the stream short of what the leader sent. Being behind
  // is not enough to tell: a busy backup reads its ring in bounded passes,
  // and after it was descheduled it handles a burst of queued heartbeats
  // before the ring. A rejoin restarts the stream from the commit index, so
  // taking a slow backup for a stalled one makes it slower still (a
  // livelock of rejoins under load): the suspicion is checked once the ring
  // was read to its end (OnStreamDrained).
  if (stall_armed_ && m.stream_id == stream_id_ && consumed_pos_ < stall_check_pos_)
    stall_suspect_pos_ = std::max(stall_suspect_pos_, stall_check_pos_);
  bool unknown_to_leader = m.stream_id != stream_id_;
  stall_check_pos_ = m.sent_pos;
  stall_armed_ = m.stream_id == stream_id_;
  if (unknown_to_leader && now_us >= last_join_us_ + 2 * config_.message_heartbeat_us)
    SendJoin(now_us);
}

void Replica::OnStreamDrained(uint64_t now_us, Ballot ballot, uint64_t stream_id) {
  if (role_ != Role::kBackup || ballot != promised_ || stream_id != stream_id_) return;
  if (stall_suspect_pos_ == 0) return;
  if (consumed_pos_ >= stall_suspect_pos_) {
    stall_suspect_pos_ = 0;  // it was only behind
    return;
  }
  if (now_us >= last_join_us_ + 2 * config_.message_heartbeat_us) SendJoin(now_us);
}

void Replica::SendJoin(uint64_t now_us) {
  OpenStream();
  last_join_us_ = now_us;
  Message j;
  j.type = Message::Type::kJoin;
  j.from = config_.id;
  j.to = BallotLeader(promised_);
  j.ballot = promised_;
  j.stream_id = stream_id_;
  j.commit_index = commit_index_;
  if (durable_promised_ >= promised_) {
    ready_.messages.push_back(std::move(j));
  } else {
    std::vector<Message> then;
    then.push_back(std::move(j));
    Persist({}, 0, std::move(then));
  }
}

void Replica::HandleJoin(uint64_t now_us, const Message& m) {
  if (m.ballot < promised_) {
    SendNack(m);
    return;
  }
  if (role_ != Role::kLeader || m.ballot != promised_ || !((OtherMembers() >> m.from) & 1)) return;
  // Only a newer stream: a stream started again under the same id would put
  // its records from position 0 again while the backup's reader is already
  // further on, and the two would wait for each other for good (the backup
  // reads nothing, the leader takes its acks for ones of a stream it never
  // sent that far). That happened when the stream had been marked not ready
  // (OnPeerUnreachable) and a late or duplicated join of it arrived. A
  // backup whose stream the leader dropped learns so from the heartbeat
  // (stream 0) and joins with a fresh id.
  if (m.stream_id > peers_[m.from].stream_id)
    StartPeerStream(m.from, m.stream_id, m.commit_index, now_us);
}

void Replica::OnMessage(uint64_t now_us, const Message& m) {
  if (!Membership::InRange(m.from) || m.from == config_.id) return;
  // A pre-vote's ballot is hypothetical: nobody is bound by it.
  if (m.type != Message::Type::kPreVote && m.type != Message::Type::kPreVoteReply)
    max_round_seen_ = std::max(max_round_seen_, BallotRound(m.ballot));
  switch (m.type) {
    case Message::Type::kPrepare: HandlePrepare(now_us, m); break;
    case Message::Type::kPromise: HandlePromise(now_us, m); break;
    case Message::Type::kHeartbeat: HandleHeartbeat(now_us, m); break;
    case Message::Type::kJoin: HandleJoin(now_us, m); break;
    case Message::Type::kPreVote: HandlePreVote(now_us, m); break;
    case Message::Type::kPreVoteReply: HandlePreVoteReply(now_us, m); break;
    case Message::Type::kNeedCheckpoint: HandleNeedCheckpoint(now_us, m); break;
    case Message::Type::kTakeOver: HandleTakeOver(now_us, m); break;
    case Message::Type::kNack:
      max_round_seen_ = std::max(max_round_seen_, BallotRound(m.promised));
      if (m.promised > promised_ && role_ != Role::kBackup) StepDown(now_us, m.promised);
      break;
  }
}

// ---------------------------------------------------------------- streams (leader)

void Replica::StartPeerStream(int peer, uint64_t stream_id, uint64_t peer_commit, uint64_t now_us) {
  if (peer == config_.id) return;
  PeerStream& p = peers_[peer];
  p = PeerStream{};
  p.stream_id = stream_id;
  p.next_put = peer_commit + 1;
  p.match = peer_commit;
  p.last_heard_us = now_us;
  if (p.next_put < first_index_) {
    p.needs_snapshot = true;
    SendNeedCheckpoint(peer);
    return;
  }
  p.ready = true;
  PutControl(peer);
  Pump(peer);
  AdvanceCommit();
}

// The peer needs entries we truncated: it must bring its state machine
// forward from a checkpoint (its own or one fetched from a replica that
// has it) of at least our first index - 1, then join again.
void Replica::SendNeedCheckpoint(int peer) {
  Message m;
  m.type = Message::Type::kNeedCheckpoint;
  m.from = config_.id;
  m.to = peer;
  m.ballot = promised_;
  m.commit_index = first_index_ - 1;
  ready_.messages.push_back(std::move(m));
}

void Replica::HandleNeedCheckpoint(uint64_t now_us, const Message& m) {
  (void)now_us;
  if (m.ballot != promised_ || role_ != Role::kBackup || m.from != BallotLeader(promised_)) return;
  if (m.commit_index <= commit_index_) return;  // we caught up meanwhile
  checkpoint_needed_ = std::max(checkpoint_needed_, m.commit_index);
}

bool Replica::InstallCheckpoint(uint64_t now_us, uint64_t index) {
  return InstallCheckpoint(now_us, index, membership_);
}

bool Replica::InstallCheckpoint(uint64_t now_us, uint64_t index,
                                const Membership& membership_at_index) {
  if (index <= commit_index_ || role_ == Role::kLeader) return false;
  base_membership_ = membership_at_index;
  config_entries_.clear();
  // Every slot we hold is at or below index (we lacked entries below the
  // leader's truncation, which is at most index), or beyond it and unknown
  // to be chosen: drop them all; the leader streams from index + 1.
  slots_.clear();
  first_index_ = index + 1;
  commit_index_ = index;
  durable_index_ = index;
  accepted_upto_ = index;
  checkpoint_needed_ = 0;
  commit_changed_ = true;
  ClampPendingPersists(index + 1);  // writes in flight prove nothing past index
  RefreshMembership();
  Persist({}, 0, {});
  ready_.persists.back().truncate_below = index + 1;
  ready_.persists.back().membership = base_membership_;
  if (role_ == Role::kBackup) SendJoin(now_us);
  CheckInvariants();
  return true;
}

void Replica::Pump(int peer) {
  PeerStream& p = peers_[peer];
  if (!p.ready || role_ != Role::kLeader) return;
  if (p.next_put < first_index_) {
    // We truncated slots this peer still needs (a checkpoint was taken while
    // it lagged): only a snapshot brings it forward, as in StartPeerStream.
    p.ready = false;
    p.needs_snapshot = true;
    SendNeedCheckpoint(peer);
    return;
  }
  const uint64_t ring = config_.ring_bytes;
  std::string run;
  uint64_t run_pos = 0;
  auto flush = [&] {
    if (run.empty()) return;
    LS_ASSERT(run_pos % ring + run.size() <= ring,
              "put of %zu bytes at ring offset %lu crosses the end", run.size(),
              (unsigned long)(run_pos % ring));
    ready_.puts.push_back(
        PutOp{peer, promised_, p.stream_id, kControlBytes + run_pos % ring, std::move(run)});
    run.clear();
  };
  while (p.next_put <= last_index() && run.size() < config_.max_put_bytes) {
    const Entry* e = At(p.next_put);
    LS_ASSERT(e != nullptr, "pump of missing slot %lu", (unsigned long)p.next_put);
    size_t size = RecordSize(e->payload.size());
    Placement pl = PlaceRecord(p.sent_pos, size, ring);
    if (pl.next_pos - p.consumed_pos > ring) break;  // ring full: wait for the reader
    // One put is one contiguous range of the ring, so a run ends with the
    // lap: when the record wraps (after a kWrap record, or nothing if even
    // that does not fit) and also when it starts exactly at offset 0 of the
    // next lap (the previous record ended flush with the ring's end).
    if (pl.record_pos != p.sent_pos || pl.record_pos % ring == 0) {
      flush();
      if (pl.wrap_record) {
        std::string wrap(RecordSize(0), '\0');
        EncodeRecord(reinterpret_cast<uint8_t*>(wrap.data()), EntryType::kWrap, promised_, 0, 0,
                     pl.wrap_pos, {}, p.stream_id);
        ready_.puts.push_back(PutOp{peer, promised_, p.stream_id,
                                    kControlBytes + pl.wrap_pos % ring, std::move(wrap)});
      }
    }
    if (run.empty()) run_pos = pl.record_pos;
    size_t at = run.size();
    run.resize(at + size);
    // Sealed with the stream (log_format.h): a late put of an older stream
    // into the same memory is never read as part of this one.
    EncodeRecord(reinterpret_cast<uint8_t*>(run.data()) + at, e->type, e->ballot, e->index,
                 commit_index_, pl.record_pos, e->payload, p.stream_id);
    p.sent_pos = pl.next_pos;
    p.next_put++;
  }
  flush();
}

void Replica::PutControl(int peer) {
  const PeerStream& p = peers_[peer];
  ControlOp op;
  op.to = peer;
  op.word.ballot = promised_;
  op.word.stream_id = p.stream_id;
  op.word.commit_index = commit_index_;
  op.word.heartbeat = heartbeat_counter_;
  op.word.sent_pos = p.sent_pos;
  SealControl(&op.word);
  ready_.controls.push_back(op);
}

void Replica::OnAck(uint64_t now_us, int from, const AckWord& w) {
  if (role_ != Role::kLeader || !Membership::InRange(from) || from == config_.id) return;
  PeerStream& p = peers_[from];
  if (!p.ready || w.ballot != promised_ || w.stream_id != p.stream_id) return;
  // A peer acks on its stream only what we sent it: an ack past our log end
  // is corrupt or forged (its check is a checksum, not a MAC), and comes from
  // the network: dropped and counted, never trusted, never asserted on.
  if (w.durable_index > last_index()) {
    rejected_acks_++;
    return;
  }
  p.last_heard_us = now_us;
  p.match = std::max(p.match, w.durable_index);
  // An echo of a heartbeat we never put is as forged as the ack above
  // would be; it renews no lease.
  if (w.heartbeat_echo <= heartbeat_counter_)
    p.heartbeat_echo = std::max(p.heartbeat_echo, w.heartbeat_echo);
  if (w.consumed_pos > p.consumed_pos && w.consumed_pos <= p.sent_pos) {
    p.consumed_pos = w.consumed_pos;
    Pump(from);
  }
  AdvanceCommit();
  if (transferring() && from == transfer_.target) StepTransfer(now_us);
  MaybeStepAsideRemoved(now_us);
}

void Replica::OnPeerUnreachable(uint64_t now_us, int peer) {
  (void)now_us;
  if (!Membership::InRange(peer) || peer == config_.id) return;
  if (role_ == Role::kLeader) peers_[peer].ready = false;  // it rejoins with a fresh stream
}

bool Replica::OwnWriteMayCommit() const {
  if (role_ != Role::kLeader) return true;
  if (!membership_.IsVoter(config_.id)) return true;  // its disk counts for nothing: no harm
  int ahead = 0;
  ForEachId(OtherVoters(), [&](int p) { ahead += peers_[p].match > commit_index_; });
  return ahead >= Majority() - 1;
}

void Replica::AdvanceCommit() {
  if (role_ != Role::kLeader) return;
  // The voters of our configuration; a removed leader's own disk counts not.
  std::array<uint64_t, kMaxMemberIds> durable{};
  int n = 0;
  ForEachId(membership_.voters, [&](int p) {
    durable[n++] = p == config_.id ? std::min(durable_index_, last_index()) : peers_[p].match;
  });
  std::sort(durable.begin(), durable.begin() + n, std::greater<uint64_t>());
  uint64_t candidate = durable[Majority() - 1];
  if (candidate > commit_index_) {
    // Every slot past the commit index we recovered carries our ballot, so a
    // majority holding it durably means it is chosen.
    commit_index_ = candidate;
    commit_changed_ = true;
  }
}

// ---------------------------------------------------------------- backup side

void Replica::OnRecord(uint64_t now_us, Ballot ballot, uint64_t stream_id, const Entry& e,
                       uint64_t record_commit, uint64_t next_pos) {
  if (role_ != Role::kBackup || ballot != promised_ || stream_id != stream_id_) return;
  // A record is another process's bytes (the leader's writes into our
  // region, checksummed by whoever wrote them): never asserted on. One whose
  // type holds no slot (a promise's or a truncation's, which our recovery
  // would read as such once on disk), or that carries another ballot above
  // the commit index it names, is corrupt or forged: dropped, counted, and a
  // fresh stream asked for.
  ConfigEntry scratch;
  if (!IsSlotType(e.type) || (e.ballot != ballot && e.index > record_commit) ||
      (e.type == EntryType::kConfig && !DecodeConfigEntry(e.payload, &scratch).empty())) {
    rejected_records_++;
    SendJoin(now_us);
    return;
  }
  NoteLeaderAlive(now_us, record_commit, /*current=*/false);
  consumed_pos_ = next_pos;
  ack_dirty_ = true;
  if (e.index <= commit_index_ || e.index < first_index_) {
    accepted_upto_ = std::max(accepted_upto_, e.index);
  } else if (e.index != accepted_upto_ + 1) {
    SendJoin(now_us);  // the stream skipped a slot: ask for a fresh one
    return;
  } else {
    const Entry* have = At(e.index);
    if (!(have && *have == e && durable_index_ >= e.index)) {
      SetSlot(e);
      Persist({e}, 0, {});
    }
    accepted_upto_ = e.index;
  }
  commit_index_ = std::max(commit_index_, std::min(record_commit, accepted_upto_));
  if (!may_vote_ && catch_up_target_ && commit_index_ >= catch_up_target_) may_vote_ = true;
}

void Replica::OnControl(uint64_t now_us, const ControlWord& w) {
  if (role_ != Role::kBackup || w.ballot != promised_ || w.stream_id != stream_id_) return;
  // A leader that has not heard our acks for an election timeout (a one-way
  // partition) is not echoed: our guard would then hold off the election
  // that replaces it, for a lease it cannot renew anyway. The guard of the
  // heartbeats we did echo runs its course.
  if (w.heartbeat != last_heartbeat_seen_ && LeaderHearsUs(now_us, w.commit_index, true)) {
    last_heartbeat_seen_ = w.heartbeat;
    // Our ack will echo it: from now on we guard the lease it renews.
    lease_guard_until_us_ = std::max(lease_guard_until_us_, now_us + config_.LeaseGuardUs());
    NoteLeaderAlive(now_us, w.commit_index, /*current=*/true);
    ack_dirty_ = true;  // echo it: the leader's proof that we are alive
  }
  uint64_t c = std::min(w.commit_index, accepted_upto_);
  if (c > commit_index_) commit_index_ = c;
  // A replica that lost its log (damaged) may have forgotten a promise: it
  // neither acks nor votes until it has seen the leader commit without it.
  if (!may_vote_ && catch_up_target_ == 0) catch_up_target_ = w.commit_index + 1;
  if (!may_vote_ && catch_up_target_ && commit_index_ >= catch_up_target_) may_vote_ = true;
}

void Replica::SendAck() {
  ack_dirty_ = false;
  if (role_ != Role::kBackup || promised_ == 0 || BallotLeader(promised_) == config_.id) return;
  if (!may_vote_) return;  // see OnControl: not yet trusted to ack
  AckOp op;
  op.to = BallotLeader(promised_);
  op.word.ballot = promised_;
  op.word.stream_id = stream_id_;
  op.word.durable_index = std::min(durable_index_, accepted_upto_);
  op.word.consumed_pos = consumed_pos_;
  op.word.heartbeat_echo = last_heartbeat_seen_;
  SealAck(&op.word);
  ready_.acks.push_back(op);
}

// ---------------------------------------------------------------- truncation

bool Replica::TruncateBelow(uint64_t index) {
  if (index > commit_index_ + 1 || index <= first_index_) return index <= first_index_;
  while (first_index_ < index) {
    slots_.pop_front();
    first_index_++;
  }
  // Configuration entries dropped: the configuration they made is the base now.
  while (!config_entries_.empty() && config_entries_.begin()->first < index) {
    const ConfigEntry& c = config_entries_.begin()->second;
    if (c.from == base_membership_) base_membership_ = c.to;
    config_entries_.erase(config_entries_.begin());
  }
  RefreshMembership();
  Persist({}, 0, {});
  ready_.persists.back().truncate_below = index;
  ready_.persists.back().membership = base_membership_;
  return true;
}

// ---------------------------------------------------------------- output

void Replica::CheckInvariants() const {
  LS_ASSERT(commit_index_ + 1 >= first_index_, "commit %lu below first %lu",
            (unsigned long)commit_index_, (unsigned long)first_index_);
  LS_ASSERT(commit_index_ <= last_index(), "commit %lu past log end %lu",
            (unsigned long)commit_index_, (unsigned long)last_index());
  LS_ASSERT(durable_index_ <= last_index(), "durable %lu past log end %lu",
            (unsigned long)durable_index_, (unsigned long)last_index());
  LS_ASSERT(durable_promised_ <= promised_, "durable promise above promise");
  if (role_ == Role::kLeader) {
    LS_ASSERT(BallotLeader(promised_) == config_.id, "leading a ballot of another replica");
    // One membership change in flight at a time: of the configuration
    // entries this leader proposed (phase 1 chose those below
    // proposed_from_), at most one is past its commit index, and it is the
    // one in effect (it proposed only once the previous one committed).
    if (config_.planted_bug != PlantedBug::kMembershipWithoutRules) {
      int own_uncommitted = 0;
      uint64_t own = 0;
      for (auto it = config_entries_.upper_bound(std::max(commit_index_, proposed_from_ - 1));
           it != config_entries_.end(); ++it) {
        own_uncommitted++;
        own = it->first;
      }
      LS_ASSERT(own_uncommitted <= 1, "%d membership changes proposed under ballot %s uncommitted",
                own_uncommitted, BallotString(promised_).c_str());
      LS_ASSERT(own_uncommitted == 0 || membership_index_ == own,
                "the uncommitted change at %lu proposed under ballot %s is not in effect",
                (unsigned long)own, BallotString(promised_).c_str());
    }
  }
  LS_ASSERT(membership_index_ == 0 ? membership_ == base_membership_
                                   : config_entries_.count(membership_index_) &&
                                         config_entries_.at(membership_index_).to == membership_,
            "configuration %s not from entry %lu", membership_.ToString().c_str(),
            (unsigned long)membership_index_);
  LS_ASSERT(membership_index_ == 0 ||
                (membership_index_ >= first_index_ && membership_index_ <= last_index() &&
                 At(membership_index_)->type == EntryType::kConfig),
            "configuration from entry %lu outside the log [%lu, %lu]",
            (unsigned long)membership_index_, (unsigned long)first_index_,
            (unsigned long)last_index());
  if (role_ == Role::kBackup) {
    LS_ASSERT(accepted_upto_ <= last_index(), "accepted %lu past log end %lu",
              (unsigned long)accepted_upto_, (unsigned long)last_index());
  }
}

Ready Replica::TakeReady() {
  if (role_ == Role::kLeader && commit_changed_) {
    ForEachId(OtherMembers(), [&](int p) {
      if (peers_[p].ready) PutControl(p);
    });
    commit_changed_ = false;
  }
  if (ack_dirty_) SendAck();
  CheckInvariants();
  ready_.commit_index = commit_index_;
  Ready out = std::move(ready_);
  ready_ = Ready{};
  return out;
}

}  // namespace lockstep
