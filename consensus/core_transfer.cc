// core_transfer.cc — leadership leaving a replica on purpose (core.h):
// the hand-over of a leader unfit to lead (HandOver, and the successor it
// picks), the operator's transfer (TransferLeadership, StepTransfer), and
// the successor told to run (HandleTakeOver). The rest of the state
// machine is core.cc's.
#include <algorithm>

#include "consensus/assert.h"
#include "consensus/core.h"

namespace lockstep {

int Replica::FurthestReadyPeer(const std::vector<int>& among) const {
  // Voters only: a learner or a removed replica would not stand.
  int best = -1;
  ForEachId(OtherVoters(), [&](int p) {
    if (!peers_[p].ready) return;
    if (!among.empty() && std::find(among.begin(), among.end(), p) == among.end()) return;
    if (best < 0 || peers_[p].match > peers_[best].match) best = p;
  });
  return best;
}

bool Replica::HandOver(uint64_t now_us, int successor, uint64_t hold_us) {
  if (role_ != Role::kLeader || !Membership::InRange(successor) || successor == config_.id)
    return false;
  // Only leading changes: the promise, the log, the commit index and what
  // is durable stay as they are, so this is the step-down a leader cut off
  // from a majority takes (Tick), plus a hold on our own candidacy. Paxos'
  // safety does not depend on who runs or when; the hold only keeps this
  // replica from winning its leadership straight back.
  Ballot ballot = promised_;
  StepDown(now_us, ballot);
  election_hold_until_us_ = now_us + hold_us;
  Message m;
  m.type = Message::Type::kTakeOver;
  m.from = config_.id;
  m.to = successor;
  m.ballot = ballot;
  m.commit_index = commit_index_;
  ready_.messages.push_back(std::move(m));
  LS_ASSERT(role_ == Role::kBackup && promised_ == ballot && leader() < 0,
            "handed over, yet role %s, ballot %s", RoleName(role_),
            BallotString(promised_).c_str());
  CheckInvariants();
  return true;
}

std::string Replica::TransferLeadership(uint64_t now_us, int target, uint64_t timeout_us,
                                        uint64_t hold_us) {
  const int n = membership_.VoterCount();
  if (role_ != Role::kLeader) {
    int l = leader();
    return l >= 0 ? "this replica does not lead (replica " + std::to_string(l) + " does)"
                  : "this replica does not lead (an election is under way)";
  }
  if (!membership_.IsMember(target)) {
    bool initial = membership_ == Membership::Initial(n);
    return "replica " + std::to_string(target) + " is not a replica of this cluster (" +
           (initial ? "ids 0.." + std::to_string(n - 1) : membership_.ToString()) + ")";
  }
  if (!membership_.IsVoter(target))
    return "replica " + std::to_string(target) +
           " is a learner: it may lead only once promoted to voter";
  if (target == config_.id) return "replica " + std::to_string(target) + " already leads";
  if (transferring())
    return "a move to replica " + std::to_string(transfer_.target) + " is already under way";
  int heard = membership_.IsVoter(config_.id) ? 1 : 0;
  ForEachId(OtherVoters(), [&](int p) {
    if (peers_[p].ready && peers_[p].last_heard_us + config_.election_timeout_max_us >= now_us)
      heard++;
  });
  if (heard < Majority())
    return "no quorum: this leader heard from " + std::to_string(heard) + " of " +
           std::to_string(n) + " replicas within an election timeout (it needs " +
           std::to_string(Majority()) + ")";
  if (!peers_[target].ready ||
      peers_[target].last_heard_us + config_.election_timeout_max_us < now_us)
    return "replica " + std::to_string(target) +
           " is not ready to lead: it has no live stream from this leader (down, restarting "
           "or still catching up); try again when `lockstep cluster status` shows it caught up";
  transfer_ = TransferStatus{TransferState::kWaiting, target, now_us, 0, last_index()};
  transfer_deadline_us_ = now_us + timeout_us;
  transfer_hold_us_ = hold_us;
  StepTransfer(now_us);  // already caught up: hands over at once
  return "";
}

void Replica::StepTransfer(uint64_t now_us) {
  LS_ASSERT(role_ == Role::kLeader && transferring(), "transfer step while %s, %s", RoleName(role_),
            TransferStateName(transfer_.state));
  // Proposals are refused while waiting, and nothing else appends to a
  // leader's log: the log end the target must reach stays put.
  LS_ASSERT(last_index() == transfer_.last_index, "log grew from %lu to %lu during a transfer",
            (unsigned long)transfer_.last_index, (unsigned long)last_index());
  const int target = transfer_.target;
  // Committed too: the leader's own server then answers every input it
  // proposed before its connections close, so no client is left unsure.
  if (peers_[target].ready && peers_[target].match >= last_index() &&
      commit_index_ >= last_index()) {
    transfer_.state = TransferState::kHandedOver;  // before HandOver: its StepDown keeps it
    transfer_.ended_us = now_us;
    bool handed = HandOver(now_us, target, transfer_hold_us_);
    LS_ASSERT(handed, "hand-over to replica %d refused", target);
    return;
  }
  if (now_us >= transfer_deadline_us_) {
    transfer_.state = TransferState::kTimedOut;
    transfer_.ended_us = now_us;
  }
}

// The leader we promised stepped down for us: run now. No pre-vote (it
// protects a live leader from a replica that merely lost touch, and this
// one gave up), but the same conditions as any candidacy: phase 1 itself
// is what keeps every committed value.
void Replica::HandleTakeOver(uint64_t now_us, const Message& m) {
  if (role_ != Role::kBackup || m.ballot != promised_ || m.from != BallotLeader(promised_)) return;
  lease_guard_until_us_ = 0;  // its leader gave its lease up
  if (!MayStand(now_us)) return;
  StartElection(now_us, m.ballot);
}

}  // namespace lockstep
