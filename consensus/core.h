// core.h — the Multi-Paxos protocol core of one replica. It does no I/O.
//
// The caller (the daemon, or the simulator) feeds it events — a tick, a
// proposal, a message from a peer, a record found in the log region, an ack
// word or control word seen in memory, a durable write completed — and
// drains the resulting work with TakeReady(): messages to send, bytes to put
// into peers' regions, words to put, records to make durable, and the new
// commit index. Everything the core knows about time comes from `now_us`
// arguments; its only randomness comes from the seed in its config, so a run
// under the simulator replays exactly.
//
// Protocol summary (DESIGN.md, "Protocol sketch"):
//  - Ballot b = (round, leader). A replica durably promises the highest ballot
//    it has seen in a PREPARE, and from then on reads only the log region it
//    opened for that ballot (one stream per (ballot, stream id)).
//  - The leader appends, persists locally and puts each record into every
//    backup's ring; a backup persists and acks (ballot, stream, durable index)
//    into the leader's ack slot; commit = majority-th highest durable index.
//  - A new leader runs phase 1: each promise carries the promiser's slots
//    past the candidate's commit index, the candidate takes the
//    highest-ballot value per index and re-proposes it under its ballot.
//  - A backup whose stream broke (restart, partition, lost puts) asks for a
//    fresh one with JOIN; the leader restarts it at the backup's commit + 1,
//    for a stream id above the one it has for that backup only. Records
//    are sealed with their stream (log_format.h), since a backup reuses a
//    region's memory for later streams.
//  - A leader the daemon finds unfit to lead (its server diverged) hands
//    over: it becomes a backup, stands for no election for a while, and
//    tells a named backup to run at once (TAKE-OVER), which then runs an
//    ordinary phase 1 (HandOver).
//  - An operator moves leadership (lockstep leader move): the leader stops
//    taking proposals, waits until the target has every entry durable, and
//    then hands over to it (TransferLeadership), so the target's phase 1
//    finds nothing to fetch and clients wait one election round trip.
//
// Membership change (ProposeMembershipChange; membership.h holds the
// configuration and its kConfig payload). SINGLE-SERVER changes, one at a
// time, each an ordinary log entry, effective where it is APPENDED (not
// where it commits): chosen over joint consensus because one voter at a
// time needs no second kind of quorum, and the simulator can check it.
//  - A kConfig entry names the configuration it was proposed against
//    (`from`) and the one it makes (`to`). A replica's configuration is the
//    chain of single changes its log makes from its base (CoreConfig's
//    voters 0..N-1, or what its last truncation or checkpoint recorded): an
//    entry applies where the configuration just before it is its `from`,
//    committed or not, and is INERT otherwise. Phase 1 picks values slot by
//    slot, so a log can hold, after a newer ballot's change, an older
//    ballot's change proposed against another history (the simulator found
//    one); were it applied, the log's last two configurations would be two
//    changes apart. An entry overwritten in a later ballot takes its change
//    with it. Every decision that counts replicas uses the voters of that
//    configuration: commit (AdvanceCommit), the lease (LeaseUntil), the
//    pre-vote, phase 1 (MaybeWin), the leader's step-down for want of a
//    majority (Tick), OwnWriteMayCommit, FurthestReadyPeer and
//    TransferLeadership.
//  - Effective on append, a leader's configuration is the committed one or
//    one change past it, and it counts the new voters at once for every
//    entry (Raft's rule). The price: a configuration can be undone when a
//    later ballot overwrites its entry, which the chain handles.
//  - Each change adds or removes ONE voter (adding or removing a learner
//    moves no voter), so every majority of the old voters meets every
//    majority of the new: two leaders, one on each side of a change, share
//    an acceptor, which has promised only one of their ballots.
//  - One change at a time: a leader proposes a change only when the entry
//    of its configuration is committed (LS_ASSERT in CheckInvariants: of
//    the entries it proposed, at most one config entry is uncommitted, and
//    it is the one in effect). Two uncommitted changes would let two live
//    leaders' configurations be two voters apart, with disjoint majorities
//    (the simulator's --membership-bug shows it).
//  - Ongaro's single-server bug (raft-dev, 2015): a new leader proposes a
//    change only once an entry of its OWN ballot committed (it appends a
//    no-op if it has none, and the caller retries). Without it: C0 =
//    {a,b,c,d}; leader a appends C1 = C0+e on a alone and stops; b, elected
//    by {b,c,d} without seeing it, appends C2 = C0-d at the same index and
//    commits it with {b,c}; a comes back and, with promises from {a,d,e}
//    (a majority of its C1, and d's log says nothing at that index), keeps
//    C1 and overwrites the committed C2. With the rule, b first commits a
//    no-op with a majority of C0, which meets every majority of C1; a's
//    phase 1 then finds b's higher-ballot values at and below the no-op's
//    index: C1 is overwritten if its index is among them, else it now
//    follows C2 in the chosen log, proposed against C0, and is inert. a's
//    configuration is C0 or C2, whose majorities meet {b,c}.
//  - Phase 1 may LEARN a newer configuration: a promise carries entries the
//    candidate lacks, possibly a kConfig. The candidate leads only with
//    promises from a majority of its own configuration's voters AND of the
//    configuration its log has once phase 1 picked its values (it sends
//    prepares to the voters of it it had not asked). A chosen entry is in
//    that log (Paxos, given intersecting majorities, by induction on
//    ballots), so its configuration is the committed one or one change
//    past it, like any leader's, and the promisers it needs are a majority
//    of it: the leader this makes is one a Raft election of that log would
//    make.
//  - A removed leader keeps leading until the entry that removes it
//    commits (it no longer counts itself toward any majority, its own disk
//    included), then hands over to the furthest voter (HandOver) and stands
//    for no election: it is kRemoved. A replica being removed keeps its
//    stream until its removal commits, so that it learns of it.
//  - Learners receive the stream (puts, control words, acks) like backups,
//    are counted by no leader or candidate whose configuration holds them
//    as learners, and never stand. They answer pre-votes and prepares as
//    any replica does (Raft: a server answers without consulting its
//    configuration), since a candidate may already hold them as voters;
//    refusing made elections stall when the only replicas left to answer
//    were a learner promoted before it knew and a leader removed before it
//    knew (the simulator found it). A learner promoted acts as a voter (may
//    stand) only once the entry promoting it is in its own log; the leader
//    may count its acks and promises before that, which is sound: they are
//    durable acceptances and promises.
//  - A replica not in its configuration (removed, or added and not yet
//    caught up to the entry that adds it) refuses to stand
//    (member_state() == kRemoved); it still promises, which counts only for
//    a candidate whose configuration holds it as a voter.
//  - Leases: a backup guards every heartbeat it echoes, learner or not, and
//    a lease counts only echoes of the leader's voters; since any candidate
//    needs a majority of a configuration whose majorities meet the
//    leader's, one of its promisers guards the lease (SimCluster::CheckLease).
//  - A promotion waits until the learner's durable index is within
//    CoreConfig::promote_within_entries of the leader's last index, so the
//    new majority can commit without waiting for it to copy the log.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "consensus/log_format.h"
#include "consensus/membership.h"
#include "consensus/region.h"

namespace lockstep {

enum class Role { kBackup, kCandidate, kLeader };
const char* RoleName(Role r);

// Where a leadership transfer (Replica::TransferLeadership) stands.
enum class TransferState : uint8_t {
  kNone,            // none asked for yet
  kWaiting,         // proposals refused until the target holds the whole log
  kHandedOver,      // the target held it: HandOver to it (it runs phase 1 now)
  kTimedOut,        // the target did not catch up in time: leading again
  kLostLeadership,  // this replica stopped leading meanwhile (a higher ballot)
};
const char* TransferStateName(TransferState s);

struct TransferStatus {
  TransferState state = TransferState::kNone;
  int target = -1;
  uint64_t started_us = 0;
  uint64_t ended_us = 0;    // when it left kWaiting
  uint64_t last_index = 0;  // the leader's log end when it started (it stays)
};

// A known membership bug planted on purpose (CoreConfig::planted_bug), so
// that a test shows the simulator's checks catch it. Never in production.
enum class PlantedBug : uint8_t {
  kNone,
  // ProposeMembershipChange skips the single-server rules: a change while
  // another is uncommitted, before an own-ballot commit, of a learner that
  // has not caught up.
  kMembershipWithoutRules,
};

struct CoreConfig {
  int id = 0;        // 0 .. replicas-1, or a later replica's fresh id (< kMaxMemberIds)
  int replicas = 3;  // 3, 5 or 7: the initial configuration's voters are 0 .. replicas-1
  uint64_t ring_bytes = 16 << 20;
  uint64_t heartbeat_us = 5000;           // control-word heartbeat period
  uint64_t message_heartbeat_us = 10000;  // heartbeat message period (rejoin path)
  uint64_t election_timeout_min_us = 10000;
  uint64_t election_timeout_max_us = 20000;
  // A leader that heard from no majority for max(this, 4 x
  // election_timeout_max_us) steps down (core.cc, Tick).
  uint64_t step_down_min_us = 0;
  uint64_t max_put_bytes = 1 << 20;  // bytes per put op (several records coalesce)
  uint64_t seed = 1;
  uint64_t incarnation = 0;  // differs on every restart (< 2^32): keeps stream ids increasing
  // Leader leases (0: none). A leader holds a lease until lease_us after it
  // put a heartbeat a majority (itself included) has echoed; a backup that
  // echoes one promises no other candidate for LeaseGuardUs() after it saw
  // it (and none for that long after it started, as it may have echoed one
  // before a restart). While its lease holds, no other replica can lead, so
  // the leader may answer reads from its own state (LeaseUntil). Needs
  // LeaseGuardUs() <= election_timeout_min_us, so that the guard never
  // delays an election a silent leader's timeout starts; it delays only the
  // fast one after the leader's connection closed (OnLeaderGone), which
  // cannot prove the leader's server stopped reading.
  uint64_t lease_us = 0;
  // How long a backup guards a lease after it saw the heartbeat: longer
  // than lease_us by a margin for the two clocks' rates (1/16, far above
  // the few hundred ppm by which monotonic clocks drift) and 500 us.
  uint64_t LeaseGuardUs() const { return lease_us ? lease_us + lease_us / 16 + 500 : 0; }
  // A learner is promoted only when its durable index is within this many
  // entries of the leader's last index (ProposeMembershipChange).
  uint64_t promote_within_entries = 1000;
  PlantedBug planted_bug = PlantedBug::kNone;  // tests of the simulator's checks only
};

struct Message {
  enum class Type : uint8_t {
    kPrepare = 1,
    kPromise,
    kNack,
    kHeartbeat,
    kJoin,
    kPreVote,         // "would you promise this ballot?" — changes nobody's state
    kPreVoteReply,    // granted: the sender has no live leader and would promise
    kNeedCheckpoint,  // leader -> backup: I truncated what you lack; bring a
                      // checkpoint of at least commit_index (then InstallCheckpoint)
    kTakeOver,        // leader of `ballot` -> backup: I stepped down (HandOver); run
                      // for the next ballot now, without a pre-vote
  };
  static constexpr int kTypes = 10;  // one past the highest type
  Type type = Type::kHeartbeat;
  int from = 0;
  int to = 0;
  Ballot ballot = 0;           // the ballot the message is about
  uint64_t stream_id = 0;      // promise/join: the sender's fresh stream; heartbeat: leader's view
  uint64_t commit_index = 0;   // sender's commit index
  uint64_t sent_pos = 0;       // heartbeat: how far the leader has written the receiver's stream
  Ballot promised = 0;         // nack: the ballot the sender promised
  Ballot handed_over = 0;      // prepare: the ballot whose leader handed over to the
                               // sender (kTakeOver): it gave up its lease
  bool granted = false;        // pre-vote reply
  std::vector<Entry> entries;  // promise: sender's slots past the candidate's commit
  std::string transport;       // opaque, filled and read by the transport adapter
};
static_assert(static_cast<int>(Message::Type::kTakeOver) + 1 == Message::kTypes,
              "kTypes is one past the highest message type");
const char* MessageTypeName(Message::Type t);

// Bytes to put into peer `to`'s region for (ballot, stream_id), at `offset`
// from the region's start (control word included).
struct PutOp {
  int to;
  Ballot ballot;
  uint64_t stream_id;
  uint64_t offset;
  std::string bytes;
};
struct ControlOp {
  int to;
  ControlWord word;
};
struct AckOp {
  int to;  // the leader
  AckWord word;
};
struct PersistOp {
  uint64_t seq;
  std::vector<Entry> entries;   // slot records, in order
  Ballot promise = 0;           // non-zero: record this promise first
  uint64_t commit_index = 0;    // written into each record (recovers commit on restart)
  uint64_t truncate_below = 0;  // non-zero: slots below this may be dropped
  // With truncate_below: the configuration in effect at truncate_below - 1
  // (the dropped slots may have held its entry); recovery hands it back in
  // DurableState::membership.
  std::optional<Membership> membership;
};

struct Ready {
  std::vector<Message> messages;
  std::vector<PutOp> puts;
  std::vector<ControlOp> controls;
  std::vector<AckOp> acks;
  std::vector<PersistOp> persists;
  uint64_t commit_index = 0;
  bool lost_leadership = false;  // proposals not yet committed have an unknown outcome
  bool empty() const {
    return messages.empty() && puts.empty() && controls.empty() && acks.empty() && persists.empty();
  }
};

// What a replica recovered from its disk log.
struct DurableState {
  Ballot promised = 0;
  uint64_t commit_index = 0;
  uint64_t first_index = 1;  // slots below were truncated
  std::vector<Entry> slots;  // contiguous from first_index
  bool damaged = false;      // log was corrupt: do not vote until caught up
  // The configuration at first_index - 1, recorded by the last truncation
  // or checkpoint (PersistOp::membership); none: CoreConfig::replicas'.
  std::optional<Membership> membership;
};

struct ProposeResult {
  bool ok = false;
  uint64_t index = 0;
  std::string error;
};

class Replica {
 public:
  Replica(const CoreConfig& config, DurableState state, uint64_t now_us);

  void Tick(uint64_t now_us);
  ProposeResult Propose(uint64_t now_us, EntryType type, std::string payload);
  void OnMessage(uint64_t now_us, const Message& m);
  // A slot record the region reader found in the stream (ballot, stream_id);
  // next_pos is the reader's position after it.
  void OnRecord(uint64_t now_us, Ballot ballot, uint64_t stream_id, const Entry& e,
                uint64_t record_commit, uint64_t next_pos);
  // The region reader found no further complete record in the current
  // stream (ballot, stream_id): everything that landed has been read. A
  // stall the heartbeat messages suggested is only acted on here.
  void OnStreamDrained(uint64_t now_us, Ballot ballot, uint64_t stream_id);
  void OnControl(uint64_t now_us, const ControlWord& w);
  void OnAck(uint64_t now_us, int from, const AckWord& w);
  void OnPersisted(uint64_t now_us, uint64_t seq);
  // The transport lost its connection to a peer: its stream is gone.
  void OnPeerUnreachable(uint64_t now_us, int peer);
  // The leader's process is known to be gone (its connection to us closed):
  // a backup stops counting on it and starts a pre-vote after a short random
  // delay instead of the full election timeout. Safety does not depend on
  // it; the pre-vote still needs a majority that has lost the leader too.
  void OnLeaderGone(uint64_t now_us);
  // The caller itself did not look at its messages for gap_us (a long
  // write, the scheduler, the VM stopped): silence seen meanwhile says
  // nothing about the others, so the gap does not count toward any timeout:
  // a backup's election timer and the pre-votes it grants, a leader's count
  // toward stepping down for want of a majority. Liveness only.
  void OnLocalStall(uint64_t now_us, uint64_t gap_us);
  // Drops slots below index (must be <= commit_index).
  bool TruncateBelow(uint64_t index);
  // A backup whose log lacks entries the leader truncated (kNeedCheckpoint)
  // brought its state machine to `index` from a checkpoint: its log now
  // starts at index + 1, everything up to index counts as committed, and it
  // asks the leader for a stream from there. False (nothing changes) unless
  // index is past this replica's commit index.
  // The configuration at `index` comes with the checkpoint (a replica that
  // lacks the entries cannot know it otherwise); the first form keeps the
  // configuration this replica holds (right when no change is ever made).
  bool InstallCheckpoint(uint64_t now_us, uint64_t index);
  bool InstallCheckpoint(uint64_t now_us, uint64_t index, const Membership& membership_at_index);
  // Leader only: proposes one membership change (core.h, "Membership
  // change"), appended as a kConfig entry and effective at once. Refused,
  // with the reason for a person, unless this replica leads, no leader move
  // is under way, an entry of its own ballot is committed (if it has none,
  // a no-op is appended: retry once it commits), the last configuration
  // entry is committed, the change is valid for the configuration
  // (membership.h) and, for a promotion, the learner's durable index is
  // within CoreConfig::promote_within_entries of the last index.
  ProposeResult ProposeMembershipChange(uint64_t now_us, const MembershipChange& change);
  // Leader only: gives up leading so that another replica leads, e.g. one
  // whose server agrees when this one's diverged. This replica becomes a
  // backup at once (its proposals not yet committed have an unknown
  // outcome: Ready::lost_leadership), stands for no election until now_us +
  // hold_us (it still promises and grants pre-votes, so the others elect
  // one of themselves), and tells `successor` to run for the next ballot
  // now (kTakeOver). The successor runs an ordinary phase 1, so nothing
  // committed is lost and no value changes; if the message is lost or the
  // successor cannot win, the remaining backups elect a leader after their
  // election timeout, as when a leader dies. False (nothing changes) unless
  // this replica leads and successor is another replica.
  bool HandOver(uint64_t now_us, int successor, uint64_t hold_us);
  // Leader only: moves leadership to `target` for maintenance. From now on
  // Propose refuses (the caller holds its inputs: they will go to the new
  // leader); once the target's durable index reaches this leader's last
  // index (Tick or the ack that says so), HandOver(target, hold_us), so
  // that the target's phase 1 has nothing to fetch. If that has not
  // happened by now_us + timeout_us, the transfer ends (kTimedOut) and
  // proposals are taken again. "" when it started (transfer() follows it),
  // else why not, for a person: not the leader, no such replica, the
  // target is this replica, the target has no live stream from us, no
  // majority heard from within an election timeout, or a transfer is
  // already under way. Safety rests on HandOver's phase 1, not on this.
  std::string TransferLeadership(uint64_t now_us, int target, uint64_t timeout_us,
                                 uint64_t hold_us);
  const TransferStatus& transfer() const { return transfer_; }
  bool transferring() const { return transfer_.state == TransferState::kWaiting; }
  // Stands for no election (no pre-vote, no take-over) before until_us; 0
  // lifts the hold. It still votes. A replica whose server is known to be
  // wrong holds off until it is repaired (HandOver sets the first hold).
  void HoldCandidacy(uint64_t until_us) { election_hold_until_us_ = until_us; }
  uint64_t election_hold_until_us() const { return election_hold_until_us_; }

  Ready TakeReady();

  // Queries.
  int id() const { return config_.id; }
  // The configuration this replica holds (the last in its log), where its
  // entry is (0: none in the log), and what this replica is in it.
  const Membership& membership() const { return membership_; }
  uint64_t membership_index() const { return membership_index_; }
  // The configuration in effect at `index` (>= first_index - 1, else the
  // base): what a checkpoint taken there records (InstallCheckpoint's).
  Membership MembershipAt(uint64_t index) const;
  MemberState member_state() const { return membership_.StateOf(config_.id); }
  Role role() const { return role_; }
  Ballot promised() const { return promised_; }
  int leader() const;  // -1 if unknown
  uint64_t commit_index() const { return commit_index_; }
  // Whether a durable write of this replica's own that completes now can
  // move anything: always, except on a leader that fewer than a majority
  // minus one backups have acked past its commit index (its own disk alone
  // commits nothing then; the ack that will is read with the write's
  // completion). The daemon's disk thread wakes the loop only when it can.
  bool OwnWriteMayCommit() const;
  uint64_t durable_index() const { return durable_index_; }
  uint64_t first_index() const { return first_index_; }
  uint64_t last_index() const { return first_index_ + slots_.size() - 1; }
  const Entry* At(uint64_t index) const;
  uint64_t stream_id() const { return stream_id_; }
  uint64_t max_payload() const { return MaxRegionPayload(config_.ring_bytes); }
  // Leader only: how far each peer's durable index trails the commit index.
  uint64_t PeerMatch(int peer) const { return peers_[peer].match; }
  // Bytes of the peer's ring put and not yet consumed (leader).
  uint64_t PeerRingUse(int peer) const {
    return peers_[peer].sent_pos - std::min(peers_[peer].sent_pos, peers_[peer].consumed_pos);
  }
  bool PeerReady(int peer) const { return peers_[peer].ready; }
  // Leader only: the successor a hand-over picks (HandOver): among `among`
  // (every other replica when empty), the one with a live stream furthest
  // along, so that its phase 1 is the shortest; -1 when none has one.
  int FurthestReadyPeer(const std::vector<int>& among = {}) const;
  // Acks dropped because they claimed more than this leader sent (OnAck).
  uint64_t rejected_acks() const { return rejected_acks_; }
  // Records dropped because their type or ballot cannot be right (OnRecord).
  uint64_t rejected_records() const { return rejected_records_; }
  bool may_vote() const { return may_vote_; }
  // Backup: non-zero when the leader said our log is behind its truncation:
  // the lowest checkpoint index that brings us forward.
  uint64_t checkpoint_needed() const { return checkpoint_needed_; }
  uint64_t last_leader_contact_us() const { return last_leader_contact_us_; }
  // Leader: until when (now_us clock) its lease holds, 0 when it holds none
  // (no lease configured, not leading, no majority echoed a recent
  // heartbeat, or entries of an earlier ballot not yet committed under its
  // own). Before then no other replica leads, so a read of the state made
  // by every committed entry is current (CoreConfig::lease_us).
  uint64_t LeaseUntil() const;
  // Backup: promises no other candidate before this (CoreConfig::lease_us).
  uint64_t lease_guard_until_us() const { return lease_guard_until_us_; }
  // Leader: when it last had a majority's contact (a Tick that saw one).
  uint64_t last_majority_contact_us() const { return last_majority_contact_us_; }

 private:
  struct PeerStream {
    bool ready = false;
    uint64_t stream_id = 0;
    uint64_t next_put = 1;
    uint64_t sent_pos = 0;
    uint64_t consumed_pos = 0;
    uint64_t match = 0;
    uint64_t last_heard_us = 0;
    uint64_t heartbeat_echo = 0;  // the newest of our heartbeats it echoed on this stream
    bool needs_snapshot = false;
  };
  struct PendingPersist {
    uint64_t seq;
    uint64_t upto;   // slots up to here are durable when this completes
    Ballot promise;  // promise this op records (0: none)
    std::vector<Message> then_send;
  };

  int Majority() const { return membership_.Majority(); }
  // Bit i: replica i is a voter (or a voter or learner) other than us.
  uint32_t OtherVoters() const { return membership_.voters & ~(1u << config_.id); }
  // Those we stream to and heartbeat: the members of our configuration
  // and, while the change that made it is uncommitted, of the one before
  // (a replica being removed learns it was, and stands no more).
  uint32_t OtherMembers() const;
  // Appends (type, payload) under our ballot, persists it and streams it.
  uint64_t Append(EntryType type, std::string payload);
  // The slot at e.index was (re)written, or slots were dropped: the
  // configuration entries and the configuration follow.
  // True when it held or holds a configuration entry (then RefreshMembership).
  bool NoteSlotWritten(const Entry& e);
  void RefreshMembership();
  // Leader: the entry removing this replica committed: hand over.
  void MaybeStepAsideRemoved(uint64_t now_us);
  // Phase 1's choice of values past our commit index (BecomeLeader); false
  // when some promiser truncated what we lack (then known_commit says how
  // far the others committed).
  bool ChoosePhaseOneValues(std::vector<Entry>* chosen, uint64_t* known_commit,
                            uint64_t* end) const;
  void SendPrepare(int to);
  void ResetElectionTimer(uint64_t now_us);
  void StartElection(uint64_t now_us, Ballot handed_over = 0);
  bool LeaseAllowsPromise(uint64_t now_us, const Message& m);
  void StartPreVote(uint64_t now_us);
  void HandlePreVote(uint64_t now_us, const Message& m);
  void HandlePreVoteReply(uint64_t now_us, const Message& m);
  // The leader spoke (a heartbeat, a control word, a record), saying it has
  // committed up to leader_commit (current: as of now, not as of when a
  // record was put): it counts as alive unless it hears us not
  // (LeaderHearsUs).
  void NoteLeaderAlive(uint64_t now_us, uint64_t leader_commit, bool current);
  bool LeaderHearsUs(uint64_t now_us, uint64_t leader_commit, bool current);
  void Broadcast(Message::Type type, Ballot ballot);
  void SendNack(const Message& m);
  void BecomeLeader(uint64_t now_us, std::vector<Entry> chosen, uint64_t known_commit,
                    uint64_t end);
  void MaybeWin(uint64_t now_us);
  void StepDown(uint64_t now_us, Ballot seen);
  void Promise(uint64_t now_us, Ballot b, const Message* prepare);
  void HandlePrepare(uint64_t now_us, const Message& m);
  void HandlePromise(uint64_t now_us, const Message& m);
  void HandleHeartbeat(uint64_t now_us, const Message& m);
  void HandleJoin(uint64_t now_us, const Message& m);
  void HandleNeedCheckpoint(uint64_t now_us, const Message& m);
  void HandleTakeOver(uint64_t now_us, const Message& m);
  bool MayStand(uint64_t now_us) const;  // may start a pre-vote or election now
  // Why a proposal is refused whatever it is ("" when it may go on): not
  // leading, or moving the leadership away (Propose, ProposeMembershipChange).
  std::string WhyNotProposing() const;
  // A transfer in kWaiting: hands over once the target holds the whole
  // log, or gives up at its deadline.
  void StepTransfer(uint64_t now_us);
  void SendNeedCheckpoint(int peer);
  void SendJoin(uint64_t now_us);
  void OpenStream();
  void StartPeerStream(int peer, uint64_t stream_id, uint64_t peer_commit, uint64_t now_us);
  void Pump(int peer);
  void PutControl(int peer);
  void SendAck();
  void AdvanceCommit();
  void SetSlot(const Entry& e);  // overwrite or append
  void Persist(std::vector<Entry> entries, Ballot promise, std::vector<Message> then_send);
  uint64_t CommitForNextPersist(bool grouping) const;
  void ClampPendingPersists(uint64_t index);
  Entry* MutableAt(uint64_t index);
  void CheckInvariants() const;

  CoreConfig config_;
  std::mt19937_64 rng_;
  // Membership: the configuration at first_index_ - 1, the configuration
  // entries in our log by index, and the one in effect (the last of them,
  // else the base) with its index (0: the base).
  Membership base_membership_;
  std::map<uint64_t, ConfigEntry> config_entries_;
  Membership membership_;
  uint64_t membership_index_ = 0;
  Role role_ = Role::kBackup;
  Ballot promised_ = 0;  // in memory; durable once its persist completes
  Ballot durable_promised_ = 0;
  uint64_t max_round_seen_ = 0;
  uint64_t rejected_acks_ = 0;
  uint64_t rejected_records_ = 0;
  bool may_vote_ = true;
  // Pre-vote (as in Raft's PreVote): a replica whose timer fired first asks
  // whether a majority also lost its leader, so one slow or restarted replica
  // cannot depose a working leader by promising itself a higher ballot.
  bool prevoting_ = false;
  Ballot prevote_ballot_ = 0;
  std::set<int> prevote_grants_;
  uint64_t last_leader_contact_us_ = 0;
  // The oldest ack of ours the leader has not yet committed (0: none
  // pending), and since when (LeaderHearsUs).
  uint64_t unheard_ack_index_ = 0;
  uint64_t unheard_ack_since_us_ = 0;
  uint64_t catch_up_target_ = 0;    // damaged log: may vote again past this commit
  uint64_t lead_after_commit_ = 0;  // lacks truncated committed slots: no elections before this
  uint64_t election_hold_until_us_ = 0;  // handed leadership over: no elections before this
  // Guarding a leader's lease: no promise to another candidate, no
  // candidacy, no pre-vote granted before this (CoreConfig::lease_us).
  uint64_t lease_guard_until_us_ = 0;
  Ballot handed_over_ = 0;  // candidate: the ballot whose leader handed over to us

  uint64_t first_index_ = 1;
  std::deque<Entry> slots_;
  uint64_t commit_index_ = 0;
  uint64_t durable_index_ = 0;

  // Persistence pipeline.
  uint64_t next_persist_seq_ = 1;
  std::deque<PendingPersist> pending_persists_;

  // Backup side: the stream we read.
  uint64_t stream_id_ = 0;
  uint64_t accepted_upto_ = 0;  // slots up to here are from the current stream (or committed)
  uint64_t consumed_pos_ = 0;
  uint64_t last_heartbeat_seen_ = 0;
  uint64_t last_join_us_ = 0;
  uint64_t checkpoint_needed_ = 0;
  bool join_sent_ = false;
  uint64_t stall_check_pos_ = 0;  // leader's sent_pos at the previous heartbeat message
  bool stall_armed_ = false;
  // A heartbeat found the stream short of what the leader had sent one
  // heartbeat earlier: a stall if the ring, read to its end, still is.
  uint64_t stall_suspect_pos_ = 0;
  bool ack_dirty_ = false;
  uint64_t election_deadline_us_ = 0;

  // Candidate side.
  std::map<int, Message> promises_;  // by sender, self included
  uint32_t prepared_ = 0;            // bit i: our prepare went to replica i
  bool self_promise_durable_ = false;

  // Leader side.
  std::vector<PeerStream> peers_;
  uint64_t heartbeat_counter_ = 0;
  uint64_t next_control_us_ = 0;
  uint64_t next_message_heartbeat_us_ = 0;
  uint64_t last_majority_contact_us_ = 0;
  uint64_t ballot_start_index_ = 0;  // first slot stamped with our ballot
  uint64_t proposed_from_ = 0;       // first slot we proposed (phase 1 chose those below)
  // Lease: the log end when we won; a lease needs it committed (LeaseUntil).
  uint64_t lease_from_index_ = 0;
  // When each recent heartbeat was first put (counter, now_us), oldest
  // first: a lease runs from the put of the heartbeat a majority echoed.
  std::deque<std::pair<uint64_t, uint64_t>> heartbeat_sent_us_;
  // Leadership transfer (TransferLeadership).
  TransferStatus transfer_;
  uint64_t transfer_deadline_us_ = 0;
  uint64_t transfer_hold_us_ = 0;
  bool commit_changed_ = false;

  Ready ready_;
};

}  // namespace lockstep
