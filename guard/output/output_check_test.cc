// output_check_test.cc — the leader's judge of output digests
// (guard/output/output_check.h): who diverged, from what, and when it cannot tell.
#include "guard/output/output_check.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

constexpr int kLeader = 0;
const ConnKey kConn{7, 3};

OutputPoint Pt(uint64_t offset, uint64_t digest, uint64_t applied = 0, ConnKey key = kConn) {
  return OutputPoint{key, offset, digest, applied};
}

// p with one of its flags set (ended, cut).
OutputPoint With(OutputPoint p, bool OutputPoint::*flag) {
  p.*flag = true;
  return p;
}

TEST(OutputCheck, EqualDigestsAgree) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(100, 0xaa, 10));
  c.OnBackupPoint(1, Pt(100, 0xaa), 0);
  c.OnBackupPoint(2, Pt(100, 0xaa), 0);
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.checks(), 2u);
  EXPECT_EQ(c.unchecked(), 0u);
}

// After a membership change (lockstep member add/remove): a replica added
// later is checked, one removed is neither checked nor waited for, and the
// verdict waits for every member's word, not the first three ids'.
TEST(OutputCheck, TheMembersOfTheConfigurationAreChecked) {
  OutputChecker c(3, kLeader);
  c.SetMembers(0b1011, 3);  // voters {0, 1, 3}: replica 2 removed, 3 added
  c.OnLeaderPoint(Pt(100, 0xaa, 10));
  c.OnBackupPoint(2, Pt(100, 0xee), 0);  // a removed replica: ignored
  c.OnBackupPoint(1, Pt(100, 0xaa), 0);
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.checks(), 1u);
  c.OnBackupPoint(3, Pt(100, 0xcc), 0);
  std::vector<Divergence> v = c.Poll(2);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 3);
  EXPECT_EQ(v[0].agreeing, std::vector<int>{1});
  EXPECT_FALSE(c.suspended(2));
}

TEST(OutputCheck, AStreamAgreedToItsEndNamesTheLeadersAppliedIndexThere) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(40, 0xaa, 10));
  c.OnLeaderPoint(Pt(90, 0xbb, 12));
  EXPECT_EQ(c.AgreedToEnd(1, kConn), 0u);  // nothing reported yet
  c.OnBackupPoint(1, Pt(40, 0xaa), 0);
  c.OnBackupPoint(2, Pt(40, 0xaa), 0);
  c.OnBackupPoint(2, Pt(90, 0xbb), 0);
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.AgreedToEnd(1, kConn), 0u);  // agreed at 40 only: not to the end
  EXPECT_EQ(c.AgreedToEnd(2, kConn), 12u);
  EXPECT_EQ(c.AgreedToEnd(2, ConnKey{7, 4}), 0u);  // another connection
  c.OnLeaderPoint(Pt(130, 0xcc, 15));              // the stream goes on: not the end any more
  EXPECT_EQ(c.AgreedToEnd(2, kConn), 0u);
}

TEST(OutputCheck, TheBackupThatDiffersAloneDiverged) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(100, 0xaa, 10));
  c.OnLeaderPoint(Pt(250, 0xbb, 14));
  c.OnBackupPoint(1, Pt(100, 0xaa), 0);
  c.OnBackupPoint(2, Pt(100, 0xaa), 0);
  c.OnBackupPoint(2, Pt(250, 0xcc), 0);
  EXPECT_TRUE(c.Poll(1).empty());  // backup 1 has not spoken at 250 yet
  c.OnBackupPoint(1, Pt(250, 0xbb), 2);
  std::vector<Divergence> v = c.Poll(3);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 2);
  EXPECT_EQ(v[0].key, kConn);
  EXPECT_EQ(v[0].offset, 250u);
  EXPECT_EQ(v[0].leader_digest, 0xbbu);
  EXPECT_EQ(v[0].replica_digest, 0xccu);
  EXPECT_EQ(v[0].agreed_offset, 100u);  // where it last agreed: the log window 10..14
  EXPECT_EQ(v[0].agreed_applied, 10u);
  EXPECT_EQ(v[0].differ_applied, 14u);
  EXPECT_EQ(v[0].agreeing, std::vector<int>{1});
  EXPECT_TRUE(c.suspended(2));
  // Suspended until repaired: its points are not judged again meanwhile.
  c.OnLeaderPoint(Pt(300, 0xdd));
  c.OnBackupPoint(2, Pt(300, 0xee), 4);
  EXPECT_TRUE(c.Poll(5).empty());
  c.Resume(2);
  c.OnBackupPoint(2, Pt(300, 0xdd), 6);
  EXPECT_TRUE(c.Poll(7).empty());
}

// A place still open when a replica was judged divergent elsewhere (its
// verdict waits for the other backup's word) holds the replaced server's
// digest: once the replica is repaired and resumed, that digest is not
// judged (it made a second report of a repaired replica).
TEST(OutputCheck, WhatARepairedReplicaReportedBeforeItsRepairIsNotJudged) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(100, 0xaa, 10));
  c.OnLeaderPoint(Pt(250, 0xbb, 14));
  c.OnBackupPoint(2, Pt(100, 0xcc), 0);
  c.OnBackupPoint(1, Pt(100, 0xaa), 0);
  c.OnBackupPoint(2, Pt(250, 0xdd), 1);  // backup 1 has not spoken at 250 yet
  c.OnBackupPoint(2, Pt(400, 0xee), 1);  // nor the leader at 400
  std::vector<Divergence> v = c.Poll(2);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].offset, 100u);
  c.Resume(2);  // repaired
  EXPECT_TRUE(c.Poll(2 + OutputChecker::kVerdictWaitUs).empty());
  c.OnLeaderPoint(Pt(400, 0xff, 16));
  EXPECT_TRUE(c.Poll(3 + OutputChecker::kPendingUs).empty());
  EXPECT_EQ(c.open(), 0u);
}

// What a test waits for before it asserts that nothing diverged: each
// backup's end of the stream settled, and no question open.
TEST(OutputCheck, EndsSettledAndOpenQuestionsAreCounted) {
  OutputChecker c(3, kLeader);
  OutputPoint end = Pt(250, 0xbb);
  end.ended = true;
  c.OnBackupPoint(1, end, 0);  // before the leader's own point: pending
  EXPECT_EQ(c.open(), 1u);
  EXPECT_EQ(c.ends_settled(1), 0u);
  c.OnLeaderPoint(Pt(250, 0xbb, 14));
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.ends_settled(1), 1u);
  EXPECT_EQ(c.open(), 0u);
  end.digest = 0xcc;  // backup 2 ends differently: open until judged
  c.OnBackupPoint(2, end, 2);
  EXPECT_EQ(c.ends_settled(2), 1u);
  EXPECT_EQ(c.open(), 1u);
  EXPECT_EQ(c.Poll(3).size(), 1u);  // backup 1 agreed there: judged at once
  EXPECT_EQ(c.open(), 0u);
  // An end the leader never reaches is given up on after kPendingUs.
  OutputPoint longer = Pt(400, 0xdd);
  longer.ended = true;
  c.OnBackupPoint(1, longer, 10);
  EXPECT_EQ(c.open(), 1u);
  c.Poll(10 + OutputChecker::kPendingUs);
  EXPECT_EQ(c.ends_settled(1), 2u);
  EXPECT_EQ(c.open(), 0u);
}

TEST(OutputCheck, AnOpenQuestionHoldsTheLogFromTheLastAgreement) {
  // The leader keeps its log from the oldest entry a pending verdict may
  // quote (Daemon::TruncateLog): backup 2 agreed at 100 (entry 10) and
  // differs at 250 (entry 14) while backup 1 has not spoken there yet.
  OutputChecker c(3, kLeader);
  EXPECT_EQ(c.OldestOpenIndex(), UINT64_MAX);
  c.OnLeaderPoint(Pt(100, 0xaa, 10));
  c.OnLeaderPoint(Pt(250, 0xbb, 14));
  c.OnBackupPoint(1, Pt(100, 0xaa), 0);
  c.OnBackupPoint(2, Pt(100, 0xaa), 0);
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.OldestOpenIndex(), UINT64_MAX);  // all agreed: nothing open
  c.OnBackupPoint(2, Pt(250, 0xcc, 14), 2);
  EXPECT_TRUE(c.Poll(3).empty());
  EXPECT_EQ(c.OldestOpenIndex(), 10u);
  // A backup point ahead of the leader's waits too, from its last agreement.
  c.OnBackupPoint(1, Pt(400, 0xdd, 16), 4);
  EXPECT_EQ(c.OldestOpenIndex(), 10u);
  c.OnBackupPoint(1, Pt(250, 0xbb), 5);
  ASSERT_EQ(c.Poll(6).size(), 1u);  // backup 2 judged: its question is closed
  c.OnLeaderPoint(Pt(400, 0xdd, 16));
  EXPECT_TRUE(c.Poll(7).empty());
  EXPECT_EQ(c.OldestOpenIndex(), UINT64_MAX);
}

TEST(OutputCheck, ABackupCheckedEqualFurtherOnAgreesWithoutWaiting) {
  // Under load the backups' writes end at different offsets: backup 2 never
  // reports 250, but it agreed at 400, and a digest covers everything
  // before it. The verdict on backup 1 comes at once, not after
  // kVerdictWaitUs.
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(100, 0xaa, 10));
  c.OnLeaderPoint(Pt(250, 0xbb, 14));
  c.OnLeaderPoint(Pt(400, 0xcc, 16));
  c.OnBackupPoint(1, Pt(250, 0x99), 0);
  EXPECT_TRUE(c.Poll(1).empty());  // backup 2 not heard from yet
  c.OnBackupPoint(2, Pt(400, 0xcc), 2);
  std::vector<Divergence> v = c.Poll(3);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_EQ(v[0].agreeing, std::vector<int>{2});
  // Equal only before the place says nothing about it: that waits.
  OutputChecker d(3, kLeader);
  d.OnLeaderPoint(Pt(100, 0xaa, 10));
  d.OnLeaderPoint(Pt(250, 0xbb, 14));
  d.OnBackupPoint(2, Pt(100, 0xaa), 0);
  d.OnBackupPoint(1, Pt(250, 0x99), 0);
  EXPECT_TRUE(d.Poll(1).empty());
  v = d.Poll(1 + OutputChecker::kVerdictWaitUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_TRUE(v[0].agreeing.empty());
}

TEST(OutputCheck, AStreamOfAnotherLengthIsADivergence) {
  // Backup 1's reply was 2 bytes shorter (SPOP popped another member): its
  // stream ends at 225, the leader's at 227, and no offset past 100 is
  // common. Once its 225 is still its newest after kPendingUs, and it was
  // handed what the leader had at its 227, that is a divergence.
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(100, 0xaa, 10));
  c.OnLeaderPoint(Pt(227, 0xbb, 14));
  c.OnBackupPoint(1, Pt(100, 0xaa, 10), 0);
  c.OnBackupPoint(1, Pt(225, 0xcc, 14), 5);
  // Backup 2 lags: its 150 is not its newest for long, and it was not
  // handed what the leader had.
  c.OnBackupPoint(2, Pt(150, 0xdd, 12), 5);
  EXPECT_TRUE(c.Poll(6).empty());
  c.OnBackupPoint(2, Pt(227, 0xbb, 14), 7);  // then it catches up, equal
  std::vector<Divergence> v = c.Poll(5 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_TRUE(v[0].length_differs);
  EXPECT_EQ(v[0].offset, 227u);
  EXPECT_EQ(v[0].replica_offset, 225u);
  EXPECT_EQ(v[0].agreed_offset, 100u);
  EXPECT_EQ(v[0].agreeing, std::vector<int>{2});
  EXPECT_TRUE(c.suspended(1));
  EXPECT_FALSE(c.suspended(2));
  // A point that a newer one of the same backup followed is only unchecked.
  OutputChecker d(3, kLeader);
  d.OnLeaderPoint(Pt(227, 0xbb, 14));
  d.OnBackupPoint(1, Pt(225, 0xcc, 14), 0);
  d.OnBackupPoint(1, Pt(227, 0xbb, 14), 1);
  EXPECT_TRUE(d.Poll(OutputChecker::kPendingUs).empty());
  EXPECT_EQ(d.unchecked(), 1u);
  // And one taken before the backup was handed the leader's inputs.
  OutputChecker e(3, kLeader);
  e.OnLeaderPoint(Pt(227, 0xbb, 14));
  e.OnBackupPoint(1, Pt(225, 0xcc, 13), 0);
  EXPECT_TRUE(e.Poll(OutputChecker::kPendingUs).empty());
}

TEST(OutputCheck, AStreamThatEndedShortIsADivergenceWhateverItWasHanded) {
  // Backup 1's server refused what the leader's accepted (a login) and
  // closed the connection at 60, before it was handed the leader's next
  // inputs (entry 14); the leader's stream goes on to 227. A backup behind
  // may yet catch up, but a stream that ended never grows.
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(40, 0xaa, 10));
  c.OnLeaderPoint(Pt(227, 0xbb, 14));
  c.OnBackupPoint(1, Pt(40, 0xaa, 10), 0);
  c.OnBackupPoint(2, Pt(40, 0xaa, 10), 0);
  c.OnBackupPoint(2, Pt(227, 0xbb, 14), 1);
  OutputPoint closed = Pt(60, 0xcc, 11);
  closed.ended = true;
  c.OnBackupPoint(1, closed, 2);
  EXPECT_TRUE(c.Poll(3).empty());
  std::vector<Divergence> v = c.Poll(2 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_TRUE(v[0].length_differs);
  EXPECT_EQ(v[0].replica_offset, 60u);
  EXPECT_EQ(v[0].agreed_offset, 40u);
  // The same point not ended is a backup behind: unchecked, not judged.
  OutputChecker d(3, kLeader);
  d.OnLeaderPoint(Pt(227, 0xbb, 14));
  d.OnBackupPoint(1, Pt(60, 0xcc, 11), 0);
  EXPECT_TRUE(d.Poll(OutputChecker::kPendingUs).empty());
  EXPECT_EQ(d.unchecked(), 1u);
  // Both backups ended alike, short of the leader: they outvote it.
  OutputChecker e(3, kLeader);
  e.OnLeaderPoint(Pt(227, 0xbb, 14));
  e.OnBackupPoint(1, closed, 0);
  e.OnBackupPoint(2, closed, 1);
  v = e.Poll(1 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, kLeader);
}

TEST(OutputCheck, WhatABackupSentPastWhereTheLeadersClientLeftIsNotCompared) {
  // The leader's client reset the connection after the 274 bytes of a
  // reply's headers: the leader's server's next send failed, its stream is
  // cut at 274 and closed there. The backups' servers sent the whole reply
  // (5126 bytes) and closed: past the cut, so not a length divergence, and
  // no backup outvotes the leader either.
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(274, 0xaa, 10));
  const OutputPoint cut = With(Pt(274, 0xaa, 10), &OutputPoint::cut);
  c.OnLeaderPoint(cut);
  const OutputPoint whole = With(Pt(5126, 0xbb, 10), &OutputPoint::ended);
  for (int r : {1, 2}) {
    c.OnBackupPoint(r, Pt(274, 0xaa, 10), 0);
    c.OnBackupPoint(r, whole, 1);
  }
  EXPECT_TRUE(c.Poll(2).empty());
  EXPECT_TRUE(c.Poll(2 + OutputChecker::kPendingUs).empty());
  EXPECT_EQ(c.checks(), 2u);  // their bytes before the cut were compared
  EXPECT_EQ(c.past_cut(), 2u);
  EXPECT_EQ(c.ends_settled(1), 1u);
  EXPECT_EQ(c.open(), 0u);
  EXPECT_FALSE(c.suspended(1) || c.suspended(2) || c.suspended(kLeader));

  // Not a hole: a backup whose bytes before the cut differ is judged.
  OutputChecker d(3, kLeader);
  d.OnLeaderPoint(cut);
  d.OnBackupPoint(1, Pt(274, 0xaa, 10), 0);
  d.OnBackupPoint(2, Pt(274, 0xcc, 10), 0);
  d.OnBackupPoint(2, whole, 1);
  std::vector<Divergence> v = d.Poll(2 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 2);
  EXPECT_EQ(v[0].offset, 274u);

  // Nor one whose stream ended short of the cut leader's (d636465).
  OutputChecker e(3, kLeader);
  e.OnLeaderPoint(Pt(40, 0xaa, 10));
  e.OnLeaderPoint(With(Pt(274, 0xdd, 10), &OutputPoint::cut));
  e.OnBackupPoint(1, Pt(40, 0xaa, 10), 0);
  e.OnBackupPoint(1, With(Pt(60, 0xcc, 10), &OutputPoint::ended), 1);
  e.OnBackupPoint(2, Pt(40, 0xaa, 10), 0);
  e.OnBackupPoint(2, whole, 1);
  v = e.Poll(2 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_TRUE(v[0].length_differs);
  EXPECT_EQ(e.past_cut(), 1u);

  // Without the cut, the same backups sending on past the leader's end are
  // judged (they outvote it: every backup ends alike).
  OutputChecker f(3, kLeader);
  f.OnLeaderPoint(Pt(274, 0xaa, 10));
  for (int r : {1, 2}) f.OnBackupPoint(r, whole, 1);
  v = f.Poll(2 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_TRUE(v[0].length_differs);

  // A send the kernel took just before the reset, counted after the cut:
  // the leader's stream ends at its newest point, and what the backups sent
  // up to there is compared.
  OutputChecker g(3, kLeader);
  g.OnLeaderPoint(cut);
  g.OnLeaderPoint(Pt(1000, 0xee, 10));
  g.OnBackupPoint(1, Pt(1000, 0xef, 10), 0);
  g.OnBackupPoint(2, whole, 1);
  v = g.Poll(2 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_EQ(v[0].offset, 1000u);
  EXPECT_EQ(g.past_cut(), 1u);
}

TEST(OutputCheck, StreamsPastTheCutAreNotJudgedForLength) {
  // The leader's server, told its sends succeeded after its client left at
  // 274, wrote the whole reply (5126) before it read EOF at the CLOSE; the
  // backups' servers, whose daemons read their replies more slowly, read EOF
  // after 3000 and 4000 bytes. Where each stopped is timing, not state.
  auto cut_leader = [](OutputChecker* k) {
    k->OnLeaderPoint(Pt(100, 0xaa, 10));
    k->OnLeaderPoint(With(Pt(274, 0xbb, 10), &OutputPoint::cut));
    k->OnLeaderPoint(With(Pt(5126, 0xcc, 11), &OutputPoint::ended));
  };
  OutputChecker c(3, kLeader);
  cut_leader(&c);
  c.OnBackupPoint(1, Pt(100, 0xaa, 10), 0);
  c.OnBackupPoint(1, With(Pt(3000, 0xdd, 11), &OutputPoint::ended), 1);
  c.OnBackupPoint(2, Pt(100, 0xaa, 10), 0);
  c.OnBackupPoint(2, With(Pt(4000, 0xee, 11), &OutputPoint::ended), 1);
  EXPECT_TRUE(c.Poll(2 + OutputChecker::kPendingUs).empty());
  EXPECT_EQ(c.past_cut(), 2u);
  EXPECT_FALSE(c.suspended(1) || c.suspended(2) || c.suspended(kLeader));

  // Nor where they stand, both at one offset (their daemons stopped reading
  // their replay connections when the CLOSE came), with everything applied.
  OutputChecker s(3, kLeader);
  cut_leader(&s);
  for (int r : {1, 2}) s.OnBackupPoint(r, Pt(2048, 0xdd, 11), 0);
  EXPECT_TRUE(s.Poll(2 + OutputChecker::kPendingUs).empty());
  EXPECT_EQ(s.past_cut(), 2u);
  EXPECT_FALSE(s.suspended(kLeader));

  // One that ended before the cut still is.
  OutputChecker d(3, kLeader);
  cut_leader(&d);
  d.OnBackupPoint(1, Pt(100, 0xaa, 10), 0);
  d.OnBackupPoint(1, With(Pt(200, 0xdd, 11), &OutputPoint::ended), 1);
  std::vector<Divergence> v = d.Poll(2 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_TRUE(v[0].length_differs);
}

TEST(OutputCheck, BackupsEndingAlikeOutvoteALeaderOfAnotherLength) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(227, 0xbb, 14));
  c.OnBackupPoint(1, Pt(225, 0xcc, 14), 0);
  c.OnBackupPoint(2, Pt(225, 0xcc, 15), 1);
  std::vector<Divergence> v = c.Poll(OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, kLeader);
  EXPECT_TRUE(v[0].length_differs);
  EXPECT_EQ(v[0].replica_offset, 225u);
  EXPECT_EQ(v[0].agreeing, (std::vector<int>{1, 2}));
  EXPECT_TRUE(c.suspended(kLeader));
  // Backups that end alike but with other bytes do not outvote it.
  OutputChecker d(3, kLeader);
  d.OnLeaderPoint(Pt(227, 0xbb, 14));
  d.OnBackupPoint(1, Pt(225, 0xcc, 14), 0);
  d.OnBackupPoint(2, Pt(225, 0xdd, 14), 1);
  v = d.Poll(1 + OutputChecker::kPendingUs);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_EQ(v[1].replica, 2);
}

TEST(OutputCheck, BackupsThatAgreeWithEachOtherOutvoteTheLeader) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(64, 0x11, 5));
  c.OnBackupPoint(1, Pt(64, 0x22), 0);
  c.OnBackupPoint(2, Pt(64, 0x22), 0);
  std::vector<Divergence> v = c.Poll(1);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, kLeader);
  EXPECT_EQ(v[0].replica_digest, 0x22u);
  EXPECT_EQ(v[0].agreeing, (std::vector<int>{1, 2}));
}

TEST(OutputCheck, BackupsThatDisagreeAmongThemselvesDoNotOutvoteTheLeader) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(64, 0x11));
  c.OnBackupPoint(1, Pt(64, 0x22), 0);
  c.OnBackupPoint(2, Pt(64, 0x33), 0);
  std::vector<Divergence> v = c.Poll(1);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_EQ(v[1].replica, 2);
}

TEST(OutputCheck, ASilentBackupIsWaitedForThenTheLeaderStands) {
  OutputChecker c(3, kLeader);
  c.OnLeaderPoint(Pt(64, 0x11));
  c.OnBackupPoint(1, Pt(64, 0x22), 1000);
  EXPECT_TRUE(c.Poll(1000 + OutputChecker::kVerdictWaitUs - 1).empty());
  std::vector<Divergence> v = c.Poll(1000 + OutputChecker::kVerdictWaitUs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 1);
  EXPECT_TRUE(v[0].agreeing.empty());
}

TEST(OutputCheck, ABackupAheadOfTheLeaderWaitsForItsPoint) {
  OutputChecker c(3, kLeader);
  c.OnBackupPoint(1, Pt(64, 0x22), 0);  // the leader's record not read yet
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.checks(), 0u);
  c.OnLeaderPoint(Pt(64, 0x22, 5));
  EXPECT_TRUE(c.Poll(2).empty());
  EXPECT_EQ(c.checks(), 1u);
  // A point the leader never has (its writes ended at other offsets),
  // taken before that backup had what the leader had at its newest point,
  // is given up after a while and counted, not judged (see
  // AStreamOfAnotherLengthIsADivergence for when it is).
  c.OnBackupPoint(2, Pt(65, 0x99, 4), 10);
  EXPECT_TRUE(c.Poll(10 + OutputChecker::kPendingUs).empty());
  EXPECT_EQ(c.unchecked(), 1u);
}

// A backup's waiting point is looked at again only when the leader puts a
// point on its connection (Poll), whichever connection that is, and also
// after the leader's points there were forgotten and begin again.
TEST(OutputCheck, AWaitingPointIsComparedWhenTheLeadersPointComes) {
  OutputChecker c(3, kLeader);
  ConnKey other{7, 4};
  c.OnLeaderPoint(Pt(10, 0x1));
  c.OnBackupPoint(1, Pt(20, 0x2), 0);      // ahead of the leader on kConn
  c.OnLeaderPoint(Pt(20, 0x3, 0, other));  // a point elsewhere: no match
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.checks(), 0u);
  EXPECT_EQ(c.open(), 1u);
  c.ForgetConn(kConn);
  c.OnLeaderPoint(Pt(20, 0x2));  // the connection's points begin again
  EXPECT_TRUE(c.Poll(2).empty());
  EXPECT_EQ(c.checks(), 1u);
  EXPECT_EQ(c.open(), 0u);
}

TEST(OutputCheck, PointsOfAForgottenConnectionAreNotCompared) {
  OutputChecker c(3, kLeader);
  ConnKey other{7, 4};
  c.OnLeaderPoint(Pt(10, 0x1));
  c.OnLeaderPoint(Pt(10, 0x5, 0, other));
  c.ForgetConn(kConn);
  c.OnBackupPoint(1, Pt(10, 0x2), 0);
  c.OnBackupPoint(1, Pt(10, 0x5, 0, other), 0);
  EXPECT_TRUE(c.Poll(1).empty());
  EXPECT_EQ(c.checks(), 1u);
}

TEST(OutputCheck, TheLeaderKeepsItsNewestPointsOfEachKind) {
  OutputChecker c(3, kLeader);
  const uint64_t n = OutputChecker::kPointsPerConn;
  for (uint64_t i = 1; i <= n + 10; i++) c.OnLeaderPoint(Pt(i * 10, i));
  OutputPoint mark = Pt(4096, 0x4096);
  mark.mark = true;
  c.OnLeaderPoint(mark);                       // kept apart: the recent ones do not push it out
  c.OnLeaderPoint(Pt((n + 10) * 10, n + 10));  // the same offset again (a close)
  c.OnBackupPoint(1, Pt(10 * 10, 10), 0);      // older than the newest n: gone
  c.OnBackupPoint(1, Pt(11 * 10, 11), 0);      // the oldest kept
  c.OnBackupPoint(1, Pt((n + 10) * 10, n + 10), 0);
  c.OnBackupPoint(2, Pt(4096, 0x4096), 0);
  c.OnBackupPoint(2, Pt(200 * 10, 0xbad), 0);
  EXPECT_EQ(c.checks(), 4u);
  std::vector<Divergence> v = c.Poll(OutputChecker::kVerdictWaitUs + 1);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].replica, 2);
  EXPECT_EQ(v[0].offset, 2000u);
  EXPECT_EQ(v[0].leader_digest, 200u);
}

}  // namespace
}  // namespace lockstep
