// core_membership_test.cc — membership change in the protocol core
// (core.h, "Membership change"; membership.h): the kConfig payload's
// decoder against garbage, the single-server rules of
// Replica::ProposeMembershipChange, learners, promotion, removal of a
// backup and of the leader, each under the simulator with its invariant
// checks on after every event; then randomized seeds with changes, and the
// planted bug the checks must find.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "consensus/core.h"
#include "consensus/core_test_util.h"
#include "consensus/membership.h"
#include "consensus/sim.h"

namespace lockstep {
namespace {

// A quiet cluster of three voters (ids 0..2) with node slots for later ids.
SimOptions QuietMembers(uint64_t seed) {
  SimOptions o = Quiet(3, seed);
  o.membership = true;
  o.promote_within_entries = 5;
  return o;
}

// The initial voters (0..2) other than r.
std::vector<int> OtherVoters(int r) {
  std::vector<int> o;
  for (int i = 0; i < 3; i++)
    if (i != r) o.push_back(i);
  return o;
}

ProposeResult Change(SimCluster& c, int leader, MembershipChangeKind kind, int id) {
  return c.ProposeMembershipChange(leader, MembershipChange{kind, id});
}

// Runs until the leader committed its configuration entry.
bool ChangeCommits(SimCluster& c, int leader, uint64_t index) {
  return c.RunUntil([&] { return c.replica(leader) && c.replica(leader)->commit_index() >= index; },
                    500'000);
}

// Adds replica `id` as a learner at the leader and starts its node.
void AddLearner(SimCluster& c, int leader, int id) {
  ProposeResult r = Change(c, leader, MembershipChangeKind::kAddLearner, id);
  ASSERT_TRUE(r.ok) << r.error;
  c.AddNode(id);
  ASSERT_TRUE(ChangeCommits(c, leader, r.index)) << Report(c);
}

// ---------------------------------------------------------------- the payload

TEST(CoreMembership, ConfigEntryRoundTripsAndChangesAreSingle) {
  Membership m = Membership::Initial(3);
  EXPECT_EQ(m.ToString(), "voters {0,1,2}");
  EXPECT_EQ(m.next_id, 3);
  Membership added;
  ASSERT_EQ(ApplyMembershipChange(m, {MembershipChangeKind::kAddLearner, 3}, &added), "");
  EXPECT_EQ(added.ToString(), "voters {0,1,2} learners {3}");
  ConfigEntry e{m, added}, back;
  std::string bytes = EncodeConfigEntry(e);
  ASSERT_EQ(bytes.size(), kConfigPayloadSize);
  ASSERT_EQ(DecodeConfigEntry(bytes, &back), "");
  EXPECT_EQ(back, e);
  // A fresh id only: an id below next_id was used before.
  Membership x;
  Membership gone;
  ASSERT_EQ(ApplyMembershipChange(m, {MembershipChangeKind::kRemove, 2}, &gone), "");
  EXPECT_NE(ApplyMembershipChange(gone, {MembershipChangeKind::kAddLearner, 2}, &x)
                .find("fresh id (3 or above)"),
            std::string::npos);
  EXPECT_NE(ApplyMembershipChange(added, {MembershipChangeKind::kAddLearner, 1}, &x)
                .find("already a voter"),
            std::string::npos);
  EXPECT_NE(ApplyMembershipChange(m, {MembershipChangeKind::kPromote, 1}, &x).find("not a learner"),
            std::string::npos);
  Membership one = Membership::Initial(1);
  EXPECT_NE(ApplyMembershipChange(one, {MembershipChangeKind::kRemove, 0}, &x).find("last voter"),
            std::string::npos);
  // One voter apart: every majority meets; two apart: not.
  Membership promoted;
  ASSERT_EQ(ApplyMembershipChange(added, {MembershipChangeKind::kPromote, 3}, &promoted), "");
  EXPECT_TRUE(MajoritiesIntersect(m, promoted));
  Membership two = promoted;
  two.voters |= 1u << 4;
  two.next_id = 5;
  EXPECT_FALSE(MajoritiesIntersect(m, two));
  // An entry that changes two replicas at once does not decode, even with
  // a right checksum (it is built by the encoder).
  EXPECT_NE(DecodeConfigEntry(EncodeConfigEntry({m, two}), &back).find("more than one replica"),
            std::string::npos);
}

TEST(CoreMembership, DecoderRejectsGarbageWithoutCrashing) {
  Membership m = Membership::Initial(5), to;
  ASSERT_EQ(ApplyMembershipChange(m, {MembershipChangeKind::kRemove, 2}, &to), "");
  const std::string good = EncodeConfigEntry({m, to});
  ConfigEntry out;
  // Every single bit flipped, every length cut short or grown.
  for (size_t i = 0; i < good.size() * 8; i++) {
    std::string bad = good;
    bad[i / 8] = static_cast<char>(bad[i / 8] ^ (1 << (i % 8)));
    EXPECT_NE(DecodeConfigEntry(bad, &out), "") << "bit " << i;
  }
  for (size_t n = 0; n < good.size() + 8; n++) {
    if (n == good.size()) continue;
    std::string bad = n < good.size() ? good.substr(0, n) : good + std::string(n - good.size(), 0);
    EXPECT_NE(DecodeConfigEntry(bad, &out), "") << "length " << n;
  }
  // Random bytes of the right length (and the right magic), many times.
  std::mt19937_64 rng(7);
  int accepted = 0;
  for (int i = 0; i < 200'000; i++) {
    std::string bad(kConfigPayloadSize, '\0');
    for (char& ch : bad) ch = static_cast<char>(rng());
    if (i % 2) bad.replace(0, 5, good.substr(0, 5));
    accepted += DecodeConfigEntry(bad, &out).empty();
  }
  EXPECT_EQ(accepted, 0);
  // A decoded entry's values are untouched by a failed decode.
  ASSERT_EQ(DecodeConfigEntry(good, &out), "");
  EXPECT_NE(DecodeConfigEntry("LKM1", &out), "");
  EXPECT_EQ(out.to, to);
}

// A configuration on its own (a truncation's note, a checkpoint's restore
// point): round trips, and every flipped bit or other length is refused.
TEST(CoreMembership, MembershipRecordRoundTripsAndRefusesDamage) {
  Membership m = Membership::Initial(3), learner;
  ASSERT_EQ(ApplyMembershipChange(m, {MembershipChangeKind::kAddLearner, 3}, &learner), "");
  const std::string good = EncodeMembership(learner);
  ASSERT_EQ(good.size(), kMembershipPayloadSize);
  Membership out;
  ASSERT_EQ(DecodeMembership(good, &out), "");
  EXPECT_EQ(out, learner);
  for (size_t i = 0; i < good.size() * 8; i++) {
    std::string bad = good;
    bad[i / 8] = static_cast<char>(bad[i / 8] ^ (1 << (i % 8)));
    EXPECT_NE(DecodeMembership(bad, &out), "") << "bit " << i;
  }
  for (size_t n = 0; n < good.size() + 4; n++) {
    if (n == good.size()) continue;
    std::string bad = n < good.size() ? good.substr(0, n) : good + std::string(n - good.size(), 0);
    EXPECT_NE(DecodeMembership(bad, &out), "") << "length " << n;
  }
  // A kConfig entry's payload is not a configuration record, nor the reverse.
  EXPECT_NE(DecodeMembership(EncodeConfigEntry({m, learner}), &out), "");
  EXPECT_EQ(out, learner);
}

// MembershipAt: the configuration in effect at an index of the log, what a
// checkpoint taken there records.
TEST(CoreMembership, MembershipAtFollowsTheLogsChanges) {
  SimCluster c(QuietMembers(3));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  uint64_t before = c.replica(l)->last_index();
  AddLearner(c, l, 3);
  const Replica& r = *c.replica(l);
  uint64_t added = r.membership_index();
  ASSERT_GT(added, before);
  EXPECT_EQ(r.MembershipAt(before), Membership::Initial(3));
  EXPECT_EQ(r.MembershipAt(added - 1), Membership::Initial(3));
  EXPECT_TRUE(r.MembershipAt(added).IsLearner(3));
  EXPECT_TRUE(r.MembershipAt(r.last_index()).IsLearner(3));
}

// ---------------------------------------------------------------- the rules

TEST(CoreMembership, ConfigEntriesGoThroughProposeMembershipChangeOnly) {
  SimCluster c(QuietMembers(1));
  int l = WaitLeader(c);
  ASSERT_GE(l, 0);
  ProposeResult r = c.Propose(l, EntryType::kConfig, "anything");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("ProposeMembershipChange"), std::string::npos) << r.error;
  int b = Others(c, l)[0];
  r = Change(c, b, MembershipChangeKind::kAddLearner, 3);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("not the leader"), std::string::npos) << r.error;
}

// Ongaro's rule: a new leader changes nothing before an entry of its own
// ballot committed; it appends a no-op for that, and the retry succeeds.
TEST(CoreMembership, RefusedBeforeAnEntryOfTheLeadersOwnBallotCommitted) {
  SimCluster c(QuietMembers(2));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int old = c.Leader();
  c.Crash(old);
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() >= 0; }, 500'000)) << Report(c);
  int l = c.Leader();
  uint64_t end = c.replica(l)->last_index();
  ProposeResult r = Change(c, l, MembershipChangeKind::kAddLearner, 3);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("entry of its own ballot"), std::string::npos) << r.error;
  ASSERT_EQ(c.replica(l)->last_index(), end + 1) << "a no-op appended";
  EXPECT_EQ(c.replica(l)->At(end + 1)->type, EntryType::kNoop);
  ASSERT_TRUE(ChangeCommits(c, l, end + 1)) << Report(c);
  r = Change(c, l, MembershipChangeKind::kAddLearner, 3);
  EXPECT_TRUE(r.ok) << r.error;
  c.Restart(old);
  c.AddNode(3);
  ASSERT_TRUE(ChangeCommits(c, l, r.index)) << Report(c);
  ExpectAllAgree(c);
}

// One change at a time: the next is refused until the last one commits.
TEST(CoreMembership, RefusedWhileAChangeIsUncommitted) {
  SimCluster c(QuietMembers(3));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  for (int b : Others(c, l)) c.HoldDisk(b, true);  // nothing commits meanwhile
  ProposeResult first = Change(c, l, MembershipChangeKind::kAddLearner, 3);
  ASSERT_TRUE(first.ok) << first.error;
  c.AddNode(3);
  c.RunFor(50'000);
  ProposeResult second = Change(c, l, MembershipChangeKind::kAddLearner, 4);
  EXPECT_FALSE(second.ok);
  EXPECT_NE(second.error.find("not committed yet"), std::string::npos) << second.error;
  EXPECT_NE(second.error.find("one change at a time"), std::string::npos) << second.error;
  for (int b : Others(c, l)) c.HoldDisk(b, false);
  ASSERT_TRUE(ChangeCommits(c, l, first.index)) << Report(c);
  second = Change(c, l, MembershipChangeKind::kAddLearner, 4);
  EXPECT_TRUE(second.ok) << second.error;
  c.AddNode(4);
  ASSERT_TRUE(ChangeCommits(c, l, second.index)) << Report(c);
  EXPECT_EQ(c.replica(l)->membership().ToString(), "voters {0,1,2} learners {3,4}");
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- learners

// A learner gets the stream and the whole log, but never counts: with the
// two other voters cut off, the leader and the learner commit nothing.
// Nor does it stand, even when no leader is left.
TEST(CoreMembership, LearnerCatchesUpButNeverCountsNorStands) {
  SimCluster c(QuietMembers(4));
  for (int i = 0; i < 10; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  AddLearner(c, l, 3);
  ASSERT_TRUE(c.RunUntil(
      [&] { return c.replica(3)->commit_index() >= c.replica(l)->commit_index(); }, 500'000))
      << Report(c);
  c.RunFor(20'000);  // its acks in
  EXPECT_EQ(c.replica(3)->member_state(), MemberState::kLearner);
  EXPECT_EQ(c.replica(l)->member_state(), MemberState::kVoter);
  EXPECT_EQ(c.replica(3)->At(1)->payload, c.replica(l)->At(1)->payload);
  EXPECT_GT(c.replica(l)->PeerMatch(3), 10u) << "its acks reach the leader";

  std::vector<int> voters = OtherVoters(l);
  for (int v : voters) c.SetLink(l, v, false), c.SetLink(v, l, false);
  uint64_t before = c.replica(l)->commit_index();
  ProposeResult r = c.Propose(l, EntryType::kInput, "only-learner-acks");
  ASSERT_TRUE(r.ok) << r.error;
  c.RunFor(100'000);
  EXPECT_EQ(c.replica(l)->commit_index(), before) << "a learner's ack committed an entry";
  EXPECT_GE(c.replica(3)->durable_index(), r.index) << "the learner holds it";

  // Leader gone for good: the two voters elect one of themselves; the
  // learner never runs.
  c.Crash(l);
  c.Heal();
  bool learner_ran = false;
  c.RunUntil(
      [&] {
        learner_ran |= c.replica(3) && c.replica(3)->role() != Role::kBackup;
        return learner_ran;
      },
      500'000);
  EXPECT_FALSE(learner_ran);
  EXPECT_TRUE(c.Leader() == voters[0] || c.Leader() == voters[1]) << Report(c);
  ASSERT_CLEAN(c);
}

// Promotion waits until the learner is within promote_within_entries of
// the last index, says how far it is, and once committed makes the
// learner a voter that counts and may stand.
TEST(CoreMembership, PromotionWaitsForTheLearnerToCatchUp) {
  SimCluster c(QuietMembers(5));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  AddLearner(c, l, 3);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->PeerMatch(3) >= c.replica(l)->last_index(); },
                         500'000));
  c.HoldDisk(3, true);  // its durable index stops
  for (int i = 0; i < 20; i++) ASSERT_GT(CommitOnLeader(c, "b" + std::to_string(i)), 0u);
  ProposeResult r = Change(c, l, MembershipChangeKind::kPromote, 3);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("has not caught up"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("entries behind the last index"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("within 5 entries"), std::string::npos) << r.error;
  c.HoldDisk(3, false);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->PeerMatch(3) >= c.replica(l)->last_index(); },
                         500'000));
  r = Change(c, l, MembershipChangeKind::kPromote, 3);
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(ChangeCommits(c, l, r.index)) << Report(c);
  EXPECT_EQ(c.replica(l)->membership().ToString(), "voters {0,1,2,3}");
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(3)->membership_index() >= r.index; }, 500'000));
  EXPECT_EQ(c.replica(3)->member_state(), MemberState::kVoter);
  ASSERT_GT(Commit(c, "with four voters"), 0u) << Report(c);
  ExpectAllAgree(c);
}

// A learner promoted before it knows (the entry never reached it) does
// not stand, though the others count it as a voter: with the leader gone,
// the two other voters need its promise (3 of 4), get it, and only then
// does it learn of its promotion and become a voter itself.
TEST(CoreMembership, PromotedLearnerStandsOnlyOnceItHoldsThePromotion) {
  SimCluster c(QuietMembers(10));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  AddLearner(c, l, 3);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->PeerMatch(3) >= c.replica(l)->last_index(); },
                         500'000));
  for (int v = 0; v < 3; v++) c.SetLink(v, 3, false);  // it hears nothing more
  ProposeResult r = Change(c, l, MembershipChangeKind::kPromote, 3);
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(ChangeCommits(c, l, r.index)) << Report(c);
  EXPECT_EQ(c.replica(l)->membership().VoterCount(), 4);
  EXPECT_EQ(c.replica(3)->member_state(), MemberState::kLearner);
  c.RunFor(100'000);  // its election timer ran out many times meanwhile
  EXPECT_EQ(c.replica(3)->role(), Role::kBackup);
  c.Crash(l);
  c.Heal();
  bool stood_early = false;
  ASSERT_TRUE(c.RunUntil(
      [&] {
        const Replica* x = c.replica(3);
        stood_early |= x->role() != Role::kBackup && x->member_state() != MemberState::kVoter;
        return c.Leader() >= 0;
      },
      500'000))
      << Report(c);
  EXPECT_FALSE(stood_early);
  EXPECT_NE(c.Leader(), 3);
  EXPECT_EQ(c.replica(3)->promised(), c.replica(c.Leader())->promised())
      << "the new leader's phase 1 had its promise";
  ASSERT_TRUE(
      c.RunUntil([&] { return c.replica(3)->member_state() == MemberState::kVoter; }, 500'000))
      << Report(c);
  ASSERT_CLEAN(c);
}

// A learner added after the leader truncated its log starts from a
// checkpoint (kNeedCheckpoint) that carries the configuration at its
// index, and then follows the stream.
TEST(CoreMembership, LearnerAddedPastATruncationInstallsACheckpoint) {
  SimCluster c(QuietMembers(6));
  for (int i = 0; i < 30; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  for (int r = 0; r < 3; r++) ASSERT_TRUE(c.TruncateBelow(r, 20));
  AddLearner(c, l, 3);
  ASSERT_TRUE(c.RunUntil(
      [&] { return c.replica(3)->commit_index() >= c.replica(l)->commit_index(); }, 500'000))
      << Report(c);
  EXPECT_GE(c.checkpoints_installed(), 1u);
  EXPECT_GE(c.replica(3)->first_index(), 20u);
  EXPECT_EQ(c.replica(3)->member_state(), MemberState::kLearner);
  EXPECT_EQ(c.replica(3)->membership(), c.replica(l)->membership());
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- removal

// A removed backup: the rest commit without it, and it learns of its
// removal (the stream goes on until the removal commits) and refuses to
// stand: member_state() says why.
TEST(CoreMembership, RemovedBackupIsNotNeededAndRefusesToStand) {
  SimCluster c(QuietMembers(7));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  int b = OtherVoters(l)[0];
  ProposeResult r = Change(c, l, MembershipChangeKind::kRemove, b);
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(ChangeCommits(c, l, r.index)) << Report(c);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->membership_index() >= r.index; }, 500'000));
  EXPECT_EQ(c.replica(b)->member_state(), MemberState::kRemoved);
  EXPECT_EQ(c.replica(l)->membership().VoterCount(), 2);
  // Two voters left: both are needed, the removed one is not.
  c.Partition({b});
  ASSERT_GT(CommitOnLeader(c, "without it"), 0u) << Report(c);
  // The leader gone too: the removed one never runs, and the last voter
  // cannot win alone (it waits: no majority).
  c.Crash(l);
  bool ran = false;
  c.RunUntil(
      [&] {
        ran |= c.replica(b)->role() != Role::kBackup;
        return ran;
      },
      300'000);
  EXPECT_FALSE(ran);
  EXPECT_EQ(c.Leader(), -1);
  c.Restart(l);
  c.Heal();
  ASSERT_GE(WaitLeader(c), 0);
  EXPECT_NE(c.Leader(), b);
  ASSERT_GT(CommitOnLeader(c, "after"), 0u) << Report(c);
  ASSERT_CLEAN(c);
}

// The leader removes itself: until the removal commits it leads without
// counting itself (its own disk alone commits nothing of the two others'
// majority), then it hands over to a voter and stands no more.
TEST(CoreMembership, RemovedLeaderStepsAsideOnceTheRemovalCommits) {
  SimCluster c(QuietMembers(8));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  std::vector<int> rest = OtherVoters(l);
  c.HoldDisk(rest[0], true);
  ProposeResult r = Change(c, l, MembershipChangeKind::kRemove, l);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(c.replica(l)->member_state(), MemberState::kRemoved);
  c.RunFor(50'000);
  // The leader's disk and rest[1]'s hold it: a majority of the old
  // voters, but not of the new ones without rest[0].
  EXPECT_GE(c.replica(l)->durable_index(), r.index);
  EXPECT_LT(c.replica(l)->commit_index(), r.index) << "the removed leader counted itself";
  EXPECT_EQ(c.replica(l)->role(), Role::kLeader);
  c.HoldDisk(rest[0], false);
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() >= 0 && c.Leader() != l; }, 500'000)) << Report(c);
  EXPECT_NE(c.replica(l)->role(), Role::kLeader);
  EXPECT_GE(c.replica(l)->commit_index(), r.index);
  EXPECT_TRUE(c.Leader() == rest[0] || c.Leader() == rest[1]);
  // Stays aside, even with the new leader gone for a while.
  int nl = c.Leader();
  c.Pause(nl);
  bool ran = false;
  c.RunUntil(
      [&] {
        ran |= c.replica(l)->role() != Role::kBackup;
        return ran;
      },
      200'000);
  EXPECT_FALSE(ran);
  c.Resume(nl);
  ASSERT_GT(CommitOnLeader(c, "after"), 0u) << Report(c);
  ASSERT_CLEAN(c);
}

// Learner -> voter -> back to three: add 3, promote it, remove 0 (whoever
// leads), and the cluster goes on with {1,2,3}, leases included.
TEST(CoreMembership, ReplaceAReplicaThroughTheLog) {
  SimCluster c(QuietMembers(9));
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  AddLearner(c, l, 3);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->PeerMatch(3) >= c.replica(l)->last_index(); },
                         500'000));
  ProposeResult r = Change(c, l, MembershipChangeKind::kPromote, 3);
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(ChangeCommits(c, l, r.index)) << Report(c);
  r = Change(c, l, MembershipChangeKind::kRemove, 0);
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(c.RunUntil(
      [&] {
        int x = c.Leader();
        return x > 0 && c.replica(x)->commit_index() >= r.index;
      },
      500'000))
      << Report(c);
  c.RetireNode(0);
  int nl = WaitLeader(c);
  ASSERT_GT(nl, 0);
  EXPECT_EQ(c.replica(nl)->membership().ToString(), "voters {1,2,3}");
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "b" + std::to_string(i)), 0u) << Report(c);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(nl)->LeaseUntil() > c.now(); }, 100'000));
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- many seeds

TEST(SimulationMembership, SeedsWithChangesUnderFaults) {
  uint64_t proposed = 0, committed = 0, checkpoints = 0;
  for (uint64_t s = 1; s <= 150; s++) {
    SimOptions o;
    o.seed = 70000 + s;
    o.membership = true;
    SimResult r = RunSimulation(o);
    ASSERT_TRUE(r.ok) << r.summary << "\n" << r.violation;
    proposed += r.membership_changes;
    committed += r.membership_committed;
    checkpoints += r.checkpoints_installed;
  }
  printf("150 seeds: %llu membership changes proposed, %llu committed, %llu checkpoints\n",
         (unsigned long long)proposed, (unsigned long long)committed,
         (unsigned long long)checkpoints);
  EXPECT_GT(committed, 150u * 5);
  EXPECT_GT(checkpoints, 0u);
}

TEST(SimulationMembership, FiveReplicasWithChanges) {
  for (uint64_t s = 1; s <= 40; s++) {
    SimOptions o;
    o.replicas = 5;
    o.seed = 71000 + s;
    o.membership = true;
    SimResult r = RunSimulation(o);
    ASSERT_TRUE(r.ok) << r.summary << "\n" << r.violation;
  }
}

// Changes under the harsher faults of core_test's SeedsChaos, and with
// truncation past lagging replicas (learners install checkpoints more
// often; progress is required of a majority).
TEST(SimulationMembership, SeedsWithChangesUnderChaosAndLaggingTruncation) {
  for (uint64_t s = 1; s <= 60; s++) {
    SimOptions o;
    o.seed = 72000 + s;
    o.membership = true;
    if (s % 2) {
      o.drop_rate = o.dup_rate = 0.1;
      o.put_drop_rate = 0.02;
      o.torn_put_rate = 0.4;
      o.slow_rate = 0.1;
      o.crash_every_us = 30'000;
      o.partition_every_us = 40'000;
      o.pause_every_us = 50'000;
    } else {
      o.truncate_lagging = true;
      o.truncate_every_us = 20'000;
    }
    SimResult r = RunSimulation(o);
    ASSERT_TRUE(r.ok) << r.summary << "\n" << r.violation;
    EXPECT_GT(r.membership_committed, 0u) << r.summary;
  }
}

// The planted bug (two changes at once, without the single-server rules)
// must be found as two majorities of different configurations, on some
// seed of the first 100.
TEST(SimulationMembership, PlantedBugIsFoundAsTwoMajorities) {
  int found = 0;
  uint64_t first = 0;
  for (uint64_t s = 1; s <= 100 && found == 0; s++) {
    SimOptions o;
    o.seed = s;
    o.membership = true;
    o.membership_bug = true;
    SimResult r = RunSimulation(o);
    if (!r.ok && r.violation.find("membership: two majorities") != std::string::npos) {
      found++;
      first = s;
    }
  }
  EXPECT_GT(found, 0) << "the checks missed the planted membership bug on 100 seeds";
  printf("planted membership bug found on seed %llu\n", (unsigned long long)first);
}

}  // namespace
}  // namespace lockstep
