// core_membership.cc — the Replica's membership change (core.h,
// "Membership change"): the configuration its log makes, the leader's
// single-server changes, and a removed leader stepping aside. The rest of
// the state machine is core.cc's.
#include <algorithm>

#include "consensus/assert.h"
#include "consensus/core.h"

namespace lockstep {

bool Replica::NoteSlotWritten(const Entry& e) {
  bool had = config_entries_.erase(e.index) > 0;
  if (e.type != EntryType::kConfig) return had;
  ConfigEntry c;
  // Config payloads are checked where they enter (ProposeMembershipChange,
  // OnRecord, HandlePromise, recovery's checksums): one that does not decode
  // here means our own memory is wrong.
  std::string why = DecodeConfigEntry(e.payload, &c);
  LS_ASSERT(why.empty(), "config entry %lu: %s", (unsigned long)e.index, why.c_str());
  config_entries_[e.index] = c;
  return true;
}

void Replica::RefreshMembership() {
  // The chain of single changes from the base: an entry proposed against
  // another configuration than the one before it in this log is inert.
  membership_ = base_membership_;
  membership_index_ = 0;
  for (const auto& [index, c] : config_entries_) {
    if (c.from != membership_) continue;
    membership_ = c.to;
    membership_index_ = index;
  }
}

Membership Replica::MembershipAt(uint64_t index) const {
  Membership m = base_membership_;
  for (const auto& [at, c] : config_entries_) {
    if (at > index) break;
    if (c.from == m) m = c.to;
  }
  return m;
}

uint32_t Replica::OtherMembers() const {
  uint32_t m = membership_.voters | membership_.learners;
  if (membership_index_ > commit_index_) {
    const Membership& before = config_entries_.at(membership_index_).from;
    m |= before.voters | before.learners;
  }
  return m & ~(1u << config_.id);
}

void Replica::MaybeStepAsideRemoved(uint64_t now_us) {
  if (role_ != Role::kLeader || membership_.IsVoter(config_.id) ||
      commit_index_ < membership_index_)
    return;
  // The entry that removed us is committed: the new voters go on without
  // us. The furthest of them runs at once (no wait for our lease: a
  // hand-over gives it up); we stand no more (kRemoved).
  int successor = FurthestReadyPeer();
  if (successor >= 0) {
    HandOver(now_us, successor, config_.election_timeout_max_us);
  } else {
    StepDown(now_us, promised_);
  }
}

ProposeResult Replica::ProposeMembershipChange(uint64_t now_us, const MembershipChange& change) {
  (void)now_us;
  ProposeResult r;
  r.error = WhyNotProposing();
  if (!r.error.empty()) return r;
  const bool rules = config_.planted_bug != PlantedBug::kMembershipWithoutRules;
  if (rules && commit_index_ < ballot_start_index_) {
    // Ongaro's rule (core.h): an entry of our own ballot committed first.
    if (last_index() < ballot_start_index_) Append(EntryType::kNoop, "");
    r.error = "this leader has not yet committed an entry of its own ballot (index " +
              std::to_string(ballot_start_index_) + ", commit index " +
              std::to_string(commit_index_) + "): retry once it has";
    return r;
  }
  if (rules && membership_index_ > commit_index_) {
    r.error = "the previous membership change (entry " + std::to_string(membership_index_) + ": " +
              membership_.ToString() + ") is not committed yet (commit index " +
              std::to_string(commit_index_) + "): one change at a time";
    return r;
  }
  Membership next;
  std::string why = ApplyMembershipChange(membership_, change, &next);
  if (!why.empty()) {
    r.error = why;
    return r;
  }
  if (rules && change.kind == MembershipChangeKind::kPromote) {
    const PeerStream& p = peers_[change.id];
    uint64_t lag = last_index() - std::min(last_index(), p.match);
    if (!p.ready || lag > config_.promote_within_entries) {
      r.error =
          "learner " + std::to_string(change.id) + " has not caught up: " +
          (p.ready ? "its durable index " + std::to_string(p.match) + " is " + std::to_string(lag) +
                         " entries behind the last index " + std::to_string(last_index())
                   : std::string("it has no live stream from this leader")) +
          " (promoted once within " + std::to_string(config_.promote_within_entries) + " entries)";
      return r;
    }
  }
  r.index = Append(EntryType::kConfig, EncodeConfigEntry(ConfigEntry{membership_, next}));
  r.ok = true;
  LS_ASSERT(membership_ == next && membership_index_ == r.index, "config entry %lu not in effect",
            (unsigned long)r.index);
  // A replica in neither configuration gets no stream from us (one being
  // removed keeps it until the removal commits: OtherMembers).
  ForEachId(~OtherMembers() & ~(1u << config_.id) & ((1u << kMaxMemberIds) - 1),
            [&](int p) { peers_[p] = PeerStream{}; });
  AdvanceCommit();  // the new voters may make a majority already
  CheckInvariants();
  return r;
}

}  // namespace lockstep
