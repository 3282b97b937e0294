// core_test.cc — the protocol core under the simulator (sim.h): hand-made
// scenarios for the known hard cases, tests that the checker itself catches
// violations, then many randomized seeds. Every scenario runs with the
// simulator's invariant checks on after every event (agreement, acknowledged
// entries kept, durable index backed by the disk, Paxos' chosen-value
// invariant on the disks, one leader per ballot, no replica speaking for a
// ballot it has not durably promised, no LS_ASSERT in the core), so "no
// violation" is part of each.
#include "consensus/core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "consensus/core_test_util.h"
#include "consensus/sim.h"

namespace lockstep {
namespace {

// ---------------------------------------------------------------- basics

TEST(Core, ElectsOneLeaderAndCommits) {
  SimCluster c(Quiet(3, 1));
  int l = WaitLeader(c);
  ASSERT_GE(l, 0);
  for (int i = 0; i < 20; i++) ASSERT_GT(Commit(c, "p" + std::to_string(i)), 0u) << Report(c);
  int leaders = 0;
  for (int r = 0; r < 3; r++) {
    leaders += c.replica(r)->role() == Role::kLeader;
    EXPECT_EQ(c.replica(r)->leader(), l);
  }
  EXPECT_EQ(leaders, 1);
  EXPECT_EQ(c.acknowledged(), 20u);
  ExpectAllAgree(c);
}

// The daemon's disk thread wakes the loop for a completion only when it can
// commit something: on a leader, once a backup holds entries past the
// commit index (three replicas: the leader's disk and that backup's make a
// majority); a lone replica is its own majority; a backup always acks.
TEST(Core, OwnWriteMayCommitOnlyWhereAMajorityCouldForm) {
  SimCluster c(Quiet(3, 11));
  int l = WaitLeader(c);
  ASSERT_GE(l, 0);
  ASSERT_GT(Commit(c, "x"), 0u) << Report(c);
  c.RunFor(20'000);  // every ack in: nobody holds anything past the commit
  EXPECT_FALSE(c.replica(l)->OwnWriteMayCommit());
  for (int b : Others(c, l)) EXPECT_TRUE(c.replica(b)->OwnWriteMayCommit());

  SimCluster one(Quiet(1, 12));
  int only = WaitLeader(one);
  ASSERT_EQ(only, 0);
  EXPECT_TRUE(one.replica(0)->OwnWriteMayCommit());
}

TEST(Core, ProposalAtBackupIsRefused) {
  SimCluster c(Quiet(3, 2));
  int l = WaitLeader(c);
  ASSERT_GE(l, 0);
  int b = Others(c, l)[0];
  ProposeResult r = c.Propose(b, EntryType::kInput, "x");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("not the leader"), std::string::npos) << r.error;
}

TEST(Core, OversizedProposalIsRejectedWithClearError) {
  SimCluster c(Quiet(3, 3));
  int l = WaitLeader(c);
  ASSERT_GE(l, 0);
  uint64_t limit = c.replica(l)->max_payload();
  EXPECT_EQ(limit, MaxRegionPayload(c.options().ring_bytes));
  ProposeResult r = c.Propose(l, EntryType::kInput, std::string(limit + 1, 'x'));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("exceeds the log region's limit of " + std::to_string(limit) + " bytes"),
            std::string::npos)
      << r.error;
  EXPECT_EQ(r.index, 0u);
  // Exactly the limit goes through, several times in a row (each wraps the ring).
  for (int i = 0; i < 5; i++) {
    std::string p(limit, static_cast<char>('a' + i));
    ASSERT_GT(Commit(c, p), 0u) << Report(c);
  }
  ExpectAllAgree(c);
}

TEST(Core, RingWrapsAroundManyTimes) {
  SimOptions o = Quiet(3, 4);
  o.torn_put_rate = 0.3;  // torn puts: readers must wait for the missing half
  SimCluster c(o);
  int l = WaitLeader(c);
  ASSERT_GE(l, 0);
  std::mt19937_64 rng(4);
  uint64_t last = 0;
  for (int i = 0; i < 3000; i++) {
    int leader = WaitLeader(c);
    ASSERT_GE(leader, 0);
    size_t size = rng() % 8 == 0 ? rng() % 3000 : rng() % 100;
    std::string p = "w" + std::to_string(i) + ":" + std::string(size, 'a' + i % 26);
    ProposeResult r = c.Propose(leader, EntryType::kInput, p);
    ASSERT_TRUE(r.ok) << r.error;
    c.Track(leader, r.index, EntryType::kInput, p);
    last = r.index;
    c.RunFor(rng() % 300);  // bursts and gaps: the ring fills up and drains
  }
  ASSERT_TRUE(c.RunUntil([&] { return c.AllCommitted(last); }, 2'000'000)) << Report(c);
  EXPECT_GT(c.put_bytes(), 10 * o.ring_bytes * 2);  // each backup's ring wrapped 10+ times
  EXPECT_EQ(c.acknowledged(), 3000u);
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- leader crashes

// The leader's own durable write completes, no backup gets the entry, the
// leader crashes: the entry must not be acknowledged, and whatever the
// others commit at that index is what everyone ends up with.
TEST(Core, LeaderCrashAfterOwnDurableWriteBeforeMajority) {
  SimCluster c(Quiet(3, 5));
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  for (int o : Others(c, l)) c.SetLink(l, o, false);  // its puts and words go nowhere
  ProposeResult r = c.Propose(l, EntryType::kInput, "lonely");
  ASSERT_TRUE(r.ok);
  c.Track(l, r.index, EntryType::kInput, "lonely");
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->durable_index() >= r.index; }, 100'000));
  EXPECT_LT(c.replica(l)->commit_index(), r.index);
  EXPECT_EQ(c.durable(l).slots.back().payload, "lonely");
  size_t acked = c.acknowledged();
  c.Crash(l);
  c.Heal();
  // The others elect a leader and commit something else at that index.
  c.RunUntil([&] { return c.Leader() >= 0; }, 500'000);
  int n = c.Leader();
  ASSERT_GE(n, 0);
  ASSERT_NE(n, l);
  ASSERT_GT(Commit(c, "after"), 0u) << Report(c);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(n)->commit_index() >= r.index; }, 500'000));
  // "lonely" may still survive: puts the leader issued before the partition
  // can land after it heals, and then phase 1 finds it under the highest
  // ballot and re-proposes it. Either way it was never acknowledged, and
  // every replica holds the same value at that index (checked below).
  // The old leader comes back with "lonely" on its disk and must give it up.
  c.Restart(l);
  ASSERT_GT(Commit(c, "rejoined"), 0u) << Report(c);
  EXPECT_EQ(c.replica(l)->At(r.index)->payload, c.committed().at(r.index).payload);
  EXPECT_EQ(c.acknowledged(), acked + 2);  // "after" and "rejoined", never "lonely"
  ExpectAllAgree(c);
}

// Same, but the entry also reached one backup, whose ack was lost: durable
// on a majority (that backup and the leader) under one ballot, it is chosen
// although nobody knows it. Never acknowledged, it must survive all the same.
TEST(Core, LeaderCrashWithEntryOnOneBackupOnly) {
  for (uint64_t seed = 1; seed <= 10; seed++) {
    SimCluster c(Quiet(3, seed));
    for (int i = 0; i < 3; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
    int l = c.Leader();
    int a = Others(c, l)[0], b = Others(c, l)[1];
    c.SetLink(l, b, false);  // b never sees it
    c.SetLink(a, l, false);  // a's acks never reach the leader
    ProposeResult r = c.Propose(l, EntryType::kInput, "maybe");
    ASSERT_TRUE(r.ok);
    c.Track(l, r.index, EntryType::kInput, "maybe");
    ASSERT_TRUE(c.RunUntil(
        [&] {
          return c.replica(a)->durable_index() >= r.index &&
                 c.replica(l)->durable_index() >= r.index;
        },
        100'000))
        << Report(c);
    EXPECT_LT(c.replica(l)->commit_index(), r.index);
    c.Crash(l);
    c.Heal();
    ASSERT_GT(Commit(c, "next"), 0u) << Report(c);
    c.Restart(l);
    ASSERT_GT(Commit(c, "last"), 0u) << Report(c);
    // Durable on a majority (a and the old leader): Paxos keeps it.
    EXPECT_EQ(c.committed().at(r.index).payload, "maybe");
    ExpectAllAgree(c);
  }
}

// An acknowledged entry survives its leader crashing right after the commit.
TEST(Core, AcknowledgedEntrySurvivesLeaderCrash) {
  for (uint64_t seed = 1; seed <= 10; seed++) {
    SimCluster c(Quiet(3, seed));
    ASSERT_GT(Commit(c, "warmup"), 0u) << Report(c);
    int l = c.Leader();
    ProposeResult r = c.Propose(l, EntryType::kInput, "acked");
    ASSERT_TRUE(r.ok);
    c.Track(l, r.index, EntryType::kInput, "acked");
    ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->commit_index() >= r.index; }, 100'000));
    EXPECT_EQ(c.acknowledged(), 2u);
    c.Crash(l);  // before the backups learn of the commit, typically
    ASSERT_GT(Commit(c, "next"), 0u) << Report(c);
    c.Restart(l);
    ASSERT_GT(Commit(c, "last"), 0u) << Report(c);
    for (int x = 0; x < 3; x++) EXPECT_EQ(c.replica(x)->At(r.index)->payload, "acked");
    ExpectAllAgree(c);
  }
}

// ---------------------------------------------------------------- stale leader

// A leader pauses, the others elect a new one, the old one resumes still
// believing it leads and proposes: its puts land in the backups' regions of
// the old ballot, which nobody reads, and change no log.
TEST(Core, DeposedLeaderWritesIntoOldRegionHarmlessly) {
  SimCluster c(Quiet(3, 6));
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int old = c.Leader();
  Ballot old_ballot = c.replica(old)->promised();
  std::vector<int> rest = Others(c, old);
  auto backup_of = [&](int leader) { return rest[0] == leader ? rest[1] : rest[0]; };
  c.Pause(old);
  // A new leader, streaming to the remaining backup.
  ASSERT_TRUE(c.RunUntil(
      [&] {
        int l = c.Leader();
        return l >= 0 && l != old && c.replica(l)->PeerReady(backup_of(l));
      },
      500'000))
      << Report(c);
  int backup = backup_of(c.Leader());
  std::vector<Entry> before;
  for (uint64_t i = c.replica(backup)->first_index(); i <= c.replica(backup)->last_index(); i++)
    before.push_back(*c.replica(backup)->At(i));
  uint64_t stale_before = c.stale_region_puts();
  c.Resume(old);
  ASSERT_EQ(c.replica(old)->role(), Role::kLeader);  // it does not know yet
  ASSERT_EQ(c.replica(old)->promised(), old_ballot);
  for (int i = 0; i < 5; i++) {
    ProposeResult r = c.Propose(old, EntryType::kInput, "stale" + std::to_string(i));
    ASSERT_TRUE(r.ok) << r.error;
    c.Track(old, r.index, EntryType::kInput, "stale" + std::to_string(i));
  }
  c.RunFor(20'000);
  EXPECT_GT(c.stale_region_puts(), stale_before);  // the stale puts did land
  // The backup's log is unchanged: nothing from the old ballot was read.
  ASSERT_EQ(c.replica(backup)->last_index() + 1 - c.replica(backup)->first_index(), before.size());
  for (const Entry& e : before) EXPECT_EQ(*c.replica(backup)->At(e.index), e);
  EXPECT_NE(c.replica(old)->role(), Role::kLeader);  // deposed by now
  ASSERT_GT(Commit(c, "after"), 0u) << Report(c);
  for (int r = 0; r < 3; r++)
    for (uint64_t i = c.replica(r)->first_index(); i <= c.replica(r)->commit_index(); i++)
      EXPECT_EQ(c.replica(r)->At(i)->payload.rfind("stale", 0), std::string::npos);
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- elections

// Two replicas stand in the same round (ballots (1, a) and (1, b)): at most
// one leader per ballot (checked after every event), and the cluster
// settles on a single leader that everyone follows.
TEST(Core, TwoCandidatesInOneRound) {
  int found = 0;
  for (uint64_t seed = 1; seed <= 200 && found < 5; seed++) {
    SimOptions o = Quiet(3, seed);
    o.election_timeout_min_us = o.election_timeout_max_us = 10'000;  // everyone at once
    SimCluster c(o);
    bool two = c.RunUntil(
        [&] {
          int n = 0;
          for (int r = 0; r < 3; r++) {
            const Replica* x = c.replica(r);
            n += x->role() == Role::kCandidate && BallotRound(x->promised()) == 1;
          }
          return n >= 2;
        },
        100'000);
    if (!two) continue;
    found++;
    ASSERT_TRUE(c.RunUntil(
        [&] {
          int l = c.Leader();
          if (l < 0) return false;
          for (int r = 0; r < 3; r++)
            if (c.replica(r)->leader() != l || c.replica(r)->promised() != c.replica(l)->promised())
              return false;
          return true;
        },
        1'000'000))
        << Report(c);
    ASSERT_GT(Commit(c, "settled"), 0u) << Report(c);
    int leaders = 0;
    for (int r = 0; r < 3; r++) leaders += c.replica(r)->role() == Role::kLeader;
    EXPECT_EQ(leaders, 1);
    ExpectAllAgree(c);
  }
  EXPECT_GE(found, 1) << "no seed produced two candidates in one round";
}

// ---------------------------------------------------------------- torn tails

// A backup's durable writes never complete before it crashes: it restarts
// without those entries (a torn tail is a lost one), does not count them,
// and catches up from the leader.
TEST(Core, BackupRestartsWithTornTailAndCatchesUp) {
  SimCluster c(Quiet(3, 7));
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  int b = Others(c, l)[0];
  uint64_t durable_last = c.replica(b)->last_index();
  c.HoldDisk(b, true);
  uint64_t last = 0;
  for (int i = 0; i < 10; i++) {
    ProposeResult r = c.Propose(l, EntryType::kInput, "t" + std::to_string(i));
    ASSERT_TRUE(r.ok);
    c.Track(l, r.index, EntryType::kInput, "t" + std::to_string(i));
    last = r.index;
  }
  // Committed by the leader and the other backup; b has them only in memory.
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->commit_index() >= last; }, 100'000));
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->last_index() >= last; }, 100'000));
  EXPECT_LE(c.replica(b)->durable_index(), durable_last);
  EXPECT_EQ(c.replica(l)->PeerMatch(b) <= durable_last, true);  // never acked what is not durable
  c.Crash(b);
  c.HoldDisk(b, false);
  EXPECT_EQ(c.durable(b).first_index + c.durable(b).slots.size() - 1, durable_last);
  c.Restart(b);
  EXPECT_EQ(c.replica(b)->last_index(), durable_last);
  EXPECT_LE(c.replica(b)->commit_index(), durable_last);
  ASSERT_TRUE(c.RunUntil([&] { return c.AllCommitted(last); }, 1'000'000)) << Report(c);
  EXPECT_EQ(c.replica(b)->At(last)->payload, "t9");
  ExpectAllAgree(c);
}

// The leader's own disk stalls; the backups make the entries durable and they
// commit without it. The leader crashes with the tail torn away, restarts,
// and gets the entries back from the new leader.
TEST(Core, LeaderRestartsWithTornTailEntriesSurvive) {
  SimCluster c(Quiet(3, 8));
  for (int i = 0; i < 3; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  c.HoldDisk(l, true);
  ProposeResult r = c.Propose(l, EntryType::kInput, "committed-by-backups");
  ASSERT_TRUE(r.ok);
  c.Track(l, r.index, EntryType::kInput, "committed-by-backups");
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->commit_index() >= r.index; }, 100'000))
      << Report(c);
  EXPECT_LT(c.replica(l)->durable_index(), r.index);
  EXPECT_EQ(c.acknowledged(), 4u);
  c.Crash(l);
  c.HoldDisk(l, false);
  EXPECT_LT(c.durable(l).first_index + c.durable(l).slots.size() - 1, r.index);
  ASSERT_GT(Commit(c, "next"), 0u) << Report(c);
  c.Restart(l);
  ASSERT_GT(Commit(c, "last"), 0u) << Report(c);
  EXPECT_EQ(c.replica(l)->At(r.index)->payload, "committed-by-backups");
  ExpectAllAgree(c);
}

// A backup with a stale tail (entries of an old ballot past its commit index)
// rejoins; the leader sends it committed slots with a commit index covering
// them, all in one durable write that rewrites the stale slots. The write is
// torn after its first record. The restarted backup must not take the
// commit index in that record as covering the stale slots the tear left.
TEST(Core, TornWriteDoesNotCommitStaleSlots) {
  SimCluster c(Quiet(3, 17));
  for (int i = 0; i < 3; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  int a = Others(c, l)[0], b = Others(c, l)[1];
  // b gets entries nobody else keeps: a stale tail.
  c.SetLink(l, a, false);
  c.SetLink(a, l, false);
  c.SetLink(b, l, false);
  c.HoldDisk(l, true);
  uint64_t last_stale = 0;
  for (int i = 0; i < 10; i++)
    last_stale = c.Propose(l, EntryType::kInput, "stale" + std::to_string(i)).index;
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->durable_index() >= last_stale; }, 100'000));
  c.Crash(l);
  c.HoldDisk(l, false);
  c.Heal();
  // b hears the others but they do not hear it: it follows without a stream.
  for (int x : Others(c, b)) c.SetLink(b, x, false);
  c.Restart(l);
  uint64_t last = 0;
  for (int i = 0; i < 100 && last < last_stale + 2; i++)
    last = CommitOnLeader(c, "good" + std::to_string(i));
  ASSERT_GE(last, last_stale + 2) << Report(c);
  int w = c.Leader();
  ASSERT_TRUE(
      c.RunUntil([&] { return c.durable(b).promised == c.replica(w)->promised(); }, 200'000))
      << Report(c);
  ASSERT_EQ(c.replica(b)->last_index(), last_stale);  // the stale tail is still there
  // Now b's joins get through; its disk holds everything it writes.
  c.HoldDisk(b, true);
  for (int x : Others(c, b)) c.SetLink(b, x, true);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->commit_index() >= last; }, 200'000))
      << Report(c);
  c.CrashTorn(b, 0, 1);  // only the first record of its first pending write survives
  c.HoldDisk(b, false);
  c.Restart(b);
  ASSERT_CLEAN(c);
  EXPECT_LT(c.replica(b)->commit_index(), last_stale);
  ASSERT_GT(Commit(c, "after"), 0u) << Report(c);
  ExpectAllAgree(c);
}

// A replica whose disk log was damaged (DurableState::damaged) may have
// forgotten promises and acks: it follows the leader but neither acks nor
// votes until it has seen the leader commit past where it rejoined.
TEST(Core, DamagedLogDoesNotVoteUntilCaughtUp) {
  SimCluster c(Quiet(3, 18));
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  int b = Others(c, l)[0];
  c.Crash(b);
  c.mutable_durable(b).damaged = true;
  c.mutable_durable(b).promised = 0;  // e.g. the promise record was lost
  c.Restart(b);
  EXPECT_FALSE(c.replica(b)->may_vote());
  // It learns the ballot from the leader's heartbeat and rejoins.
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->leader() == l; }, 200'000)) << Report(c);
  c.RunFor(30'000);  // its join has reached the leader
  ASSERT_TRUE(c.replica(l)->PeerReady(b));
  uint64_t match = c.replica(l)->PeerMatch(b);
  c.RunFor(20'000);
  EXPECT_FALSE(c.replica(b)->may_vote());
  EXPECT_EQ(c.replica(l)->PeerMatch(b), match);  // no acks while not trusted
  uint64_t last = 0;
  for (int i = 0; i < 5; i++) last = Commit(c, "b" + std::to_string(i));
  ASSERT_GT(last, 0u) << Report(c);
  EXPECT_TRUE(c.replica(b)->may_vote());
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->PeerMatch(b) >= last; }, 200'000)) << Report(c);
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- truncation

TEST(Core, TruncateBelow) {
  SimCluster c(Quiet(3, 11));
  uint64_t last = 0;
  for (int i = 0; i < 100; i++) last = Commit(c, "x" + std::to_string(i));
  ASSERT_GT(last, 0u) << Report(c);
  int l = c.Leader();
  int b = Others(c, l)[0];
  Replica* x = c.replica(b);
  uint64_t commit = x->commit_index();
  EXPECT_FALSE(c.TruncateBelow(b, commit + 2));  // only committed slots may go
  EXPECT_EQ(x->first_index(), 1u);
  ASSERT_TRUE(c.TruncateBelow(b, 50));
  EXPECT_EQ(x->first_index(), 50u);
  EXPECT_EQ(x->At(49), nullptr);
  ASSERT_NE(x->At(50), nullptr);
  EXPECT_EQ(x->last_index(), last);
  EXPECT_TRUE(c.TruncateBelow(b, 30));  // already below: nothing to do
  EXPECT_EQ(x->first_index(), 50u);
  c.RunFor(10'000);
  EXPECT_EQ(c.durable(b).first_index, 50u);  // the truncation reached the disk
  // A restart starts from the truncated log, and the replica keeps working.
  c.Crash(b);
  c.Restart(b);
  EXPECT_EQ(c.replica(b)->first_index(), 50u);
  // The leader truncates too, everything up to its commit index.
  ASSERT_TRUE(c.TruncateBelow(l, c.replica(l)->commit_index() + 1));
  for (int i = 0; i < 20; i++) last = Commit(c, "y" + std::to_string(i));
  ASSERT_GT(last, 0u) << Report(c);
  ExpectAllAgree(c);
}

// The leader truncates past what a lagging backup still needs (the guard
// checkpointed): the backup needs a snapshot, which is not the core's job,
// but the leader must not trip over the missing slots and the others go on.
// Cuts backup b off from leader l, commits 50 big entries without it (its
// ring fills, the stream to it stops) and truncates the leader's log past
// what b has; then reconnects it. Returns the last index committed.
uint64_t LagAndTruncate(SimCluster& c, int* l, int* b) {
  *l = c.Leader();
  *b = Others(c, *l)[0];
  c.SetLink(*l, *b, false);
  uint64_t last = 0;
  for (int i = 0; i < 50; i++) {
    std::string p = "z" + std::to_string(i) + std::string(4000, 'z');
    ProposeResult r = c.Propose(*l, EntryType::kInput, p);
    EXPECT_TRUE(r.ok);
    c.Track(*l, r.index, EntryType::kInput, p);
    last = r.index;
  }
  EXPECT_LT(c.replica(*l)->PeerMatch(*b), 10u);
  EXPECT_TRUE(c.RunUntil([&] { return c.replica(*l)->commit_index() >= last; }, 100'000));
  EXPECT_TRUE(c.TruncateBelow(*l, last));
  c.SetLink(*l, *b, true);
  return last;
}

TEST(Core, LeaderTruncatesPastALaggingBackup) {
  SimCluster c(Quiet(3, 12));
  ASSERT_GT(Commit(c, "warmup"), 0u) << Report(c);
  int l, b;
  LagAndTruncate(c, &l, &b);
  for (int i = 0; i < 20; i++) {
    int leader = WaitLeader(c);
    ASSERT_GE(leader, 0) << Report(c);
    ProposeResult r = c.Propose(leader, EntryType::kInput, "after" + std::to_string(i));
    if (r.ok) c.Track(leader, r.index, EntryType::kInput, "after" + std::to_string(i));
    c.RunFor(5'000);
  }
  ASSERT_CLEAN(c);
  ExpectAllAgree(c);
}

// The same lagging backup is told to bring a checkpoint (kNeedCheckpoint),
// installs one at the leader's commit index, and is streamed from there.
TEST(Core, LaggingBackupInstallsACheckpointAndRejoins) {
  SimCluster c(Quiet(3, 14));
  ASSERT_GT(Commit(c, "warmup"), 0u) << Report(c);
  int l, b;
  uint64_t last = LagAndTruncate(c, &l, &b);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->checkpoint_needed() > 0; }, 200'000))
      << Report(c);
  EXPECT_EQ(c.replica(b)->checkpoint_needed(), last - 1);
  EXPECT_FALSE(c.replica(b)->InstallCheckpoint(c.now(), 0));  // not past its commit index
  uint64_t k = c.replica(l)->commit_index();
  ASSERT_TRUE(c.replica(b)->InstallCheckpoint(c.now(), k));
  EXPECT_EQ(c.replica(b)->first_index(), k + 1);
  EXPECT_EQ(c.replica(b)->commit_index(), k);
  EXPECT_EQ(c.replica(b)->checkpoint_needed(), 0u);
  uint64_t after = Commit(c, "after-the-checkpoint");
  ASSERT_GT(after, k) << Report(c);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->commit_index() >= after; }, 200'000))
      << Report(c);
  ASSERT_CLEAN(c);
  ExpectAllAgree(c);
}

// A candidate whose log holds stale entries of an old ballot at slots that a
// promiser already committed — and truncated — must not take its own stale
// values as the committed ones: for slots at or below the highest commit
// index among the promises, only a promiser that knows them committed can
// tell their value.
TEST(Core, ElectionAfterTruncationKeepsCommittedValues) {
  SimCluster c(Quiet(3, 13));
  for (int i = 0; i < 3; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  int a = Others(c, l)[0], b = Others(c, l)[1];
  // 1. The leader's new entries reach only b, and nobody commits them: the
  //    leader hears no acks and its own disk is stalled.
  c.SetLink(l, a, false);
  c.SetLink(a, l, false);
  c.SetLink(b, l, false);
  c.HoldDisk(l, true);
  uint64_t first_stale = 0, last_stale = 0;
  for (int i = 0; i < 10; i++) {
    ProposeResult r = c.Propose(l, EntryType::kInput, "stale" + std::to_string(i));
    ASSERT_TRUE(r.ok);
    if (!first_stale) first_stale = r.index;
    last_stale = r.index;
  }
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(b)->durable_index() >= last_stale; }, 100'000))
      << Report(c);
  // 2. The leader crashes (losing them); b is cut off; the other two elect a
  //    leader and commit different values at those slots, then one more.
  c.Crash(l);
  c.HoldDisk(l, false);
  c.Heal();
  c.Partition({b});
  c.Restart(l);
  // Exactly up to one past the stale ones: after the truncation below, the
  // promiser that knows them committed reports none of them.
  uint64_t last = 0;
  for (int i = 0; i < 100 && last < last_stale + 1; i++)
    last = CommitOnLeader(c, "good" + std::to_string(i));
  ASSERT_EQ(last, last_stale + 1) << Report(c);
  for (uint64_t i = first_stale; i <= last_stale; i++)
    EXPECT_EQ(c.committed().at(i).payload.rfind("good", 0), 0u);
  // 3. The new follower truncates its committed prefix (a checkpoint), then
  //    the new leader crashes and b comes back.
  int w = c.Leader();
  int f = w == l ? a : l;
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(f)->commit_index() >= last; }, 100'000));
  ASSERT_TRUE(c.TruncateBelow(f, last));
  c.RunFor(5'000);
  c.Crash(w);
  c.Heal();
  // b cannot lead (it lacks committed slots nobody can send it any more), and
  // must not keep f from leading either.
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() == f; }, 1'000'000)) << Report(c);
  // With b needing a snapshot, f commits again once w is back.
  c.Restart(w);
  ASSERT_GT(CommitOnLeader(c, "after"), 0u) << Report(c);
  c.RunFor(100'000);
  ASSERT_CLEAN(c);
  for (uint64_t i = first_stale; i <= last_stale; i++) {
    for (int r = 0; r < 3; r++) {
      const Replica* x = c.replica(r);
      if (x->commit_index() >= i && x->At(i)) {
        EXPECT_EQ(x->At(i)->payload.rfind("good", 0), 0u);
      }
    }
  }
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- handing over

// A leader hands over to a live backup (its server diverged, say): the
// successor runs at once, well within an election timeout, wins the next
// ballot, and every entry the old leader had committed stays; the old
// leader follows it and does not run while held.
TEST(Core, HandOverElectsTheSuccessorAndKeepsCommittedEntries) {
  SimOptions o = Quiet(3, 31);
  SimCluster c(o);
  for (int i = 0; i < 10; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  int s = Others(c, l)[1];
  Ballot before = c.replica(l)->promised();
  // One more entry in flight: proposed, not yet known committed.
  ProposeResult last = c.Propose(l, EntryType::kInput, "in-flight");
  ASSERT_TRUE(last.ok);
  EXPECT_FALSE(c.HandOver(s, l, 1000)) << "only the leader hands over";
  EXPECT_FALSE(c.HandOver(l, l, 1000)) << "not to itself";
  uint64_t t0 = c.now();
  uint64_t prevotes = c.sent(Message::Type::kPreVote);
  ASSERT_TRUE(c.HandOver(l, s, 1'000'000));
  EXPECT_EQ(c.replica(l)->role(), Role::kBackup);
  EXPECT_EQ(c.replica(l)->leader(), -1);
  EXPECT_EQ(c.replica(l)->election_hold_until_us(), t0 + 1'000'000);
  EXPECT_FALSE(c.replica(l)->Propose(c.now(), EntryType::kInput, "late").ok);
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() == s; }, o.election_timeout_min_us)) << Report(c);
  EXPECT_GT(c.replica(s)->promised(), before);
  EXPECT_EQ(c.sent(Message::Type::kTakeOver), 1u);
  EXPECT_EQ(c.sent(Message::Type::kPreVote), prevotes) << "the successor runs without a pre-vote";
  // The old leader promised the new ballot and follows; the in-flight entry
  // was in its promise, so the new leader re-proposed it.
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->leader() == s; }, 100'000)) << Report(c);
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "b" + std::to_string(i)), 0u) << Report(c);
  EXPECT_EQ(c.committed().at(last.index).payload, "in-flight");
  EXPECT_EQ(c.Leader(), s);
  EXPECT_EQ(c.elections(), 2u);
  ExpectAllAgree(c);
}

// The successor is down: the take-over message goes nowhere, and the
// remaining backup is elected after its election timeout. The old leader,
// held, grants its pre-vote and promises, but does not run itself.
TEST(Core, HandOverToADeadSuccessorElectsTheOtherBackup) {
  SimOptions o = Quiet(3, 32);
  SimCluster c(o);
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  int dead = Others(c, l)[0], b = Others(c, l)[1];
  c.Crash(dead);
  ASSERT_TRUE(c.HandOver(l, dead, 10 * o.election_timeout_max_us));
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() >= 0; }, 5 * o.election_timeout_max_us))
      << Report(c);
  EXPECT_EQ(c.Leader(), b);
  ASSERT_GT(Commit(c, "after"), 0u) << Report(c);
  // The hold ends; the new leader keeps leading (the old one has a live leader).
  c.RunFor(10 * o.election_timeout_max_us);
  EXPECT_EQ(c.Leader(), b);
  c.Restart(dead);
  ASSERT_GT(Commit(c, "all back"), 0u) << Report(c);
  ExpectAllAgree(c);
}

// Without a hold, and with the successor cut off from everyone, the old
// leader may lead again under a new ballot: handing over never costs more
// than an election.
TEST(Core, HandOverToACutOffSuccessorWithoutHoldStillMakesProgress) {
  SimOptions o = Quiet(3, 33);
  SimCluster c(o);
  ASSERT_GT(Commit(c, "warmup"), 0u) << Report(c);
  int l = c.Leader();
  int s = Others(c, l)[0];
  c.Partition({s});
  ASSERT_TRUE(c.HandOver(l, s, 0));
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() >= 0 && c.Leader() != s; }, 500'000)) << Report(c);
  ASSERT_GT(CommitOnLeader(c, "after"), 0u) << Report(c);
  c.Heal();
  ASSERT_GT(Commit(c, "healed"), 0u) << Report(c);
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- leases

// A leader whose backups echo its heartbeats holds a lease that runs
// lease_us past the heartbeat they echoed. Cut off from them, it keeps
// leading a while (step-down waits) but its lease runs out, and the others
// elect a new leader only after that: the checker (SimCluster::CheckLease)
// looks at every step.
TEST(Core, LeaseRunsOutBeforeAnotherReplicaCanLead) {
  SimOptions o = Quiet(3, 41);
  SimCluster c(o);
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  c.RunFor(5 * o.heartbeat_us);
  uint64_t until = c.replica(l)->LeaseUntil();
  ASSERT_GT(until, c.now()) << "a leader whose backups echo its heartbeats holds a lease";
  EXPECT_LE(until, c.now() + o.lease_us);
  for (int b : Others(c, l)) {
    EXPECT_EQ(c.replica(b)->LeaseUntil(), 0u) << "backups hold none";
    EXPECT_GT(c.replica(b)->lease_guard_until_us(), c.now()) << "they guard the leader's";
  }
  c.Partition({l});
  uint64_t cut = c.now();
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() >= 0 && c.Leader() != l; }, 500'000)) << Report(c);
  EXPECT_GE(c.now(), c.replica(l)->LeaseUntil()) << "elected while the old lease held";
  EXPECT_EQ(c.replica(l)->role(), Role::kLeader) << "the cut-off leader still leads: no lease";
  EXPECT_EQ(c.replica(l)->LeaseUntil() > cut + o.lease_us, false);
  ASSERT_CLEAN(c);
  c.Heal();
  ASSERT_GT(Commit(c, "healed"), 0u) << Report(c);
  ExpectAllAgree(c);
}

// The check itself: stretched past the guard's margin (a leader clock that
// runs slow), the same cut-off leader's lease outlives the others' guard,
// and the election it allows is reported as a lease violation.
TEST(Checker, LeaseOutlivingItsGuardIsReported) {
  SimOptions o = Quiet(3, 41);
  o.lease_check_overrun_us = 3 * o.election_timeout_max_us;
  SimCluster c(o);
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  c.RunFor(5 * o.heartbeat_us);
  c.Partition({l});
  c.RunFor(500'000);
  ASSERT_TRUE(c.failed());
  EXPECT_NE(c.violation().find("lease: r" + std::to_string(l)), std::string::npos) << c.violation();
}

// A hand-over gives the lease up: the successor's prepare lifts the
// backups' guard, so it wins well within the guard's length.
TEST(Core, HandOverNeedNotWaitForTheLeaseGuard) {
  SimOptions o = Quiet(3, 42);
  SimCluster c(o);
  ASSERT_GT(Commit(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  int s = Others(c, l)[0];
  c.RunFor(5 * o.heartbeat_us);
  uint64_t t0 = c.now();
  ASSERT_TRUE(c.HandOver(l, s, 1'000'000));
  EXPECT_EQ(c.replica(l)->LeaseUntil(), 0u) << "handed over: no lease";
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() == s; }, 100'000)) << Report(c);
  CoreConfig cc;
  cc.lease_us = o.lease_us;
  EXPECT_LT(c.now() - t0, cc.LeaseGuardUs() / 2);
  ASSERT_GT(Commit(c, "after"), 0u) << Report(c);
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- moving leadership

// `lockstep leader move`: the leader stops taking proposals, waits until
// the target holds every entry (its disk held back here, so it cannot),
// then hands over; the target wins the next ballot and nothing the old
// leader had proposed is lost.
TEST(Core, TransferLeadershipWaitsForTheTargetThenHandsOver) {
  SimOptions o = Quiet(3, 41);
  SimCluster c(o);
  for (int i = 0; i < 10; i++) ASSERT_GT(Commit(c, "a" + std::to_string(i)), 0u) << Report(c);
  int l = c.Leader();
  int s = Others(c, l)[1];
  c.HoldDisk(s, true);
  ProposeResult last = c.Propose(l, EntryType::kInput, "in-flight");
  ASSERT_TRUE(last.ok);
  ASSERT_EQ(c.TransferLeadership(l, s, 1'000'000, 1'000'000), "") << Report(c);
  EXPECT_TRUE(c.replica(l)->transferring());
  ProposeResult refused = c.Propose(l, EntryType::kInput, "during");
  EXPECT_FALSE(refused.ok);
  EXPECT_NE(refused.error.find("moving to replica " + std::to_string(s)), std::string::npos)
      << refused.error;
  EXPECT_NE(c.TransferLeadership(l, s, 1'000'000, 0).find("already under way"), std::string::npos);
  c.RunFor(3 * o.election_timeout_max_us);
  EXPECT_EQ(c.Leader(), l) << "the target cannot have the log yet: no hand-over";
  EXPECT_TRUE(c.replica(l)->transferring());
  c.HoldDisk(s, false);
  ASSERT_TRUE(c.RunUntil([&] { return c.Leader() == s; }, 10 * o.election_timeout_max_us))
      << Report(c);
  EXPECT_EQ(c.replica(l)->transfer().state, TransferState::kHandedOver);
  EXPECT_EQ(c.sent(Message::Type::kTakeOver), 1u);
  ASSERT_TRUE(c.RunUntil([&] { return c.replica(l)->leader() == s; }, 100'000)) << Report(c);
  for (int i = 0; i < 5; i++) ASSERT_GT(Commit(c, "b" + std::to_string(i)), 0u) << Report(c);
  EXPECT_EQ(c.committed().at(last.index).payload, "in-flight");
  EXPECT_EQ(c.Leader(), s);
  ExpectAllAgree(c);
}

// A target that does not catch up in time: the transfer ends, the leader
// keeps leading and takes proposals again.
TEST(Core, TransferLeadershipTimesOutAndTheLeaderServesAgain) {
  SimOptions o = Quiet(3, 42);
  SimCluster c(o);
  ASSERT_GT(Commit(c, "warmup"), 0u) << Report(c);
  int l = c.Leader();
  int s = Others(c, l)[0];
  c.HoldDisk(s, true);
  ASSERT_TRUE(c.Propose(l, EntryType::kInput, "unheld").ok);
  ASSERT_EQ(c.TransferLeadership(l, s, 20'000, 0), "") << Report(c);
  ASSERT_TRUE(c.RunUntil([&] { return !c.replica(l)->transferring(); }, 200'000)) << Report(c);
  EXPECT_EQ(c.replica(l)->transfer().state, TransferState::kTimedOut);
  EXPECT_EQ(c.Leader(), l);
  c.HoldDisk(s, false);
  ASSERT_GT(CommitOnLeader(c, "after"), 0u) << Report(c);
  EXPECT_EQ(c.Leader(), l);
  ExpectAllAgree(c);
}

// Every refusal names its cause.
TEST(Core, TransferLeadershipRefusalsSayWhy) {
  SimOptions o = Quiet(3, 43);
  SimCluster c(o);
  ASSERT_GT(Commit(c, "warmup"), 0u) << Report(c);
  int l = c.Leader();
  int b = Others(c, l)[0], d = Others(c, l)[1];
  EXPECT_NE(c.TransferLeadership(b, d, 1000, 0).find("does not lead"), std::string::npos);
  EXPECT_NE(c.TransferLeadership(l, l, 1000, 0).find("already leads"), std::string::npos);
  EXPECT_NE(c.TransferLeadership(l, 7, 1000, 0).find("not a replica of this cluster (ids 0..2)"),
            std::string::npos);
  c.Crash(d);
  c.RunFor(3 * o.election_timeout_max_us);
  EXPECT_NE(c.TransferLeadership(l, d, 1000, 0).find("not ready to lead"), std::string::npos);
  c.Crash(b);
  c.RunFor(2 * o.election_timeout_max_us);
  if (c.replica(l)->role() == Role::kLeader) {
    EXPECT_NE(c.TransferLeadership(l, b, 1000, 0).find("no quorum"), std::string::npos);
  }
  EXPECT_FALSE(c.replica(l)->transferring());
  c.Restart(b);
  c.Restart(d);
  ASSERT_GT(Commit(c, "all back"), 0u) << Report(c);
  ExpectAllAgree(c);
}

// ---------------------------------------------------------------- the checker itself

// LS_ASSERT inside the core becomes a reported violation, with the seed.
// An ack that passes its checksum but claims entries the leader never sent
// (corrupt, or forged by someone who can write the leader's memory) used to
// trip an assertion and abort the leader. Dropped and counted now; the
// cluster goes on committing.
TEST(Core, AckPastTheLogEndIsRejectedNotAsserted) {
  SimCluster c(Quiet(3, 21));
  ASSERT_GT(CommitOnLeader(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  int p = (l + 1) % 3;
  Replica& leader = *c.replica(l);
  AckWord w = c.LastAck(l, p);
  ASSERT_EQ(w.ballot, leader.promised()) << "no ack of this ballot read yet";
  uint64_t commit = leader.commit_index(), match = leader.PeerMatch(p);
  w.durable_index = leader.last_index() + 100;
  SealAck(&w);
  leader.OnAck(c.now(), p, w);
  EXPECT_EQ(leader.rejected_acks(), 1u);
  EXPECT_EQ(leader.commit_index(), commit);
  EXPECT_EQ(leader.PeerMatch(p), match);
  ASSERT_GT(CommitOnLeader(c, "b"), 0u) << Report(c);
  EXPECT_EQ(c.Leader(), l);
  ASSERT_CLEAN(c);
}

// A record in a backup's region whose checksum holds but whose type holds
// no slot (16, a promise's on disk: recovery would have read it as one) or
// whose ballot is another's above its commit index tripped an assertion, or
// went to disk as it was. Dropped and counted now; the backup asks for a
// fresh stream and the cluster goes on.
TEST(Core, ForgedRegionRecordIsRejectedNotAssertedNorWritten) {
  SimCluster c(Quiet(3, 22));
  ASSERT_GT(CommitOnLeader(c, "a"), 0u) << Report(c);
  int l = c.Leader();
  Replica& b = *c.replica((l + 1) % 3);
  uint64_t end = b.last_index(), commit = b.commit_index();
  Entry promise{end + 1, b.promised(), static_cast<EntryType>(16), "x"};
  b.OnRecord(c.now(), b.promised(), b.stream_id(), promise, commit, 1u << 20);
  Entry foreign{end + 1, MakeBallot(BallotRound(b.promised()) + 5, l), EntryType::kInput, "y"};
  b.OnRecord(c.now(), b.promised(), b.stream_id(), foreign, commit, 1u << 20);
  EXPECT_EQ(b.rejected_records(), 2u);
  EXPECT_EQ(b.last_index(), end);
  ASSERT_GT(CommitOnLeader(c, "b"), 0u) << Report(c);
  ASSERT_CLEAN(c);
}

TEST(Checker, CoreAssertionIsReported) {
  SimCluster c(Quiet(3, 14));
  int l = WaitLeader(c);
  ASSERT_GE(l, 0);
  c.Propose(l, EntryType::kPromise, "not a slot type");  // violates an LS_ASSERT in Propose
  ASSERT_TRUE(c.failed());
  EXPECT_NE(c.violation().find("invariant violated"), std::string::npos) << c.violation();
  EXPECT_NE(c.violation().find("seed 14"), std::string::npos) << c.violation();
  EXPECT_FALSE(c.TraceTail().empty());
}

// A disk that returns a different value for a committed slot: the agreement
// check catches the replica committing it.
TEST(Checker, AgreementViolationIsReported) {
  SimCluster c(Quiet(3, 15));
  uint64_t idx = 0;
  for (int i = 0; i < 5; i++) idx = Commit(c, "v" + std::to_string(i));
  ASSERT_GT(idx, 0u);
  int b = Others(c, c.Leader())[0];
  c.RunFor(10'000);
  c.Crash(b);
  DurableState& d = c.mutable_durable(b);
  ASSERT_GE(d.commit_index, idx - 1);
  d.slots[idx - 1 - d.first_index].payload = "forged";
  c.Restart(b);
  ASSERT_TRUE(c.failed());
  EXPECT_NE(c.violation().find("agreement"), std::string::npos) << c.violation();
}

// A value accepted under a higher ballot at a slot where another value was
// chosen (accepted by a majority) breaks Paxos even if nobody learned the
// slot committed: the checker sees it on the disks.
TEST(Checker, PaxosViolationOnDisksIsReported) {
  SimCluster c(Quiet(3, 19));
  uint64_t idx = Commit(c, "chosen");
  ASSERT_GT(idx, 0u);
  int b = Others(c, c.Leader())[0];
  PersistOp forged;
  forged.seq = 0;
  Entry e;
  e.index = idx;
  e.ballot = c.replica(b)->promised() + (1 << 8);  // a later round
  e.type = EntryType::kInput;
  e.payload = "other";
  forged.entries.push_back(e);
  c.InjectDurableWrite(b, forged);
  ASSERT_TRUE(c.failed());
  EXPECT_NE(c.violation().find("paxos: slot " + std::to_string(idx) + " chose 'chosen'"),
            std::string::npos)
      << c.violation();
}

// A disk that forgets a promise (the durable write "completed" but did not
// stick): a crash would let the replica vote against its promise. Reported as
// soon as it speaks for a ballot its disk does not hold.
TEST(Checker, ForgottenPromiseIsReported) {
  SimCluster c(Quiet(3, 16));
  ASSERT_GT(Commit(c, "v"), 0u);
  int l = c.Leader();
  c.mutable_durable(Others(c, l)[0]).promised = 0;  // forgets the promise it made
  c.Propose(l, EntryType::kInput, "w");             // its ack of "w" speaks for the ballot
  c.RunFor(100'000);
  ASSERT_TRUE(c.failed());
  EXPECT_NE(c.violation().find("durable promise"), std::string::npos) << c.violation();
}

TEST(Checker, RunSimulationReportsAndIsDeterministic) {
  SimOptions o;
  o.seed = 42;
  o.duration_us = 300'000;
  SimResult a = RunSimulation(o);
  SimResult b = RunSimulation(o);
  EXPECT_TRUE(a.ok) << a.violation;
  EXPECT_EQ(a.summary, b.summary);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.committed, b.committed);
  EXPECT_EQ(a.digest, b.digest);
  o.seed = 43;
  SimResult d = RunSimulation(o);
  EXPECT_NE(a.steps, d.steps);
  EXPECT_NE(a.digest, d.digest);
  EXPECT_GT(a.committed, 100u);
  EXPECT_GT(a.elections, 0u);
}

// ---------------------------------------------------------------- many seeds

// LOCKSTEP_SIM_SEEDS_PERCENT=N runs N% of each test's seeds (at least one):
// scripts/sanitize runs these tests under ASan, several times slower.
uint64_t ScaledSeeds(uint64_t count) {
  const char* p = getenv("LOCKSTEP_SIM_SEEDS_PERCENT");
  int percent = p ? atoi(p) : 100;
  if (percent <= 0 || percent >= 100) return count;
  return std::max<uint64_t>(1, count * percent / 100);
}

void RunSeeds(int replicas, uint64_t first, uint64_t count, uint64_t duration_us,
              const std::function<void(SimOptions*)>& tune = nullptr) {
  count = ScaledSeeds(count);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t committed = 0, crashes = 0, elections = 0, lease_checks = 0;
  int failures = 0;
  for (uint64_t s = first; s < first + count; s++) {
    SimOptions o;
    o.replicas = replicas;
    o.seed = s;
    o.duration_us = duration_us;
    if (tune) tune(&o);
    SimResult r = RunSimulation(o);
    committed += r.committed;
    crashes += r.crashes;
    elections += r.elections;
    lease_checks += r.lease_checks;
    if (!r.ok) {
      ADD_FAILURE() << r.summary << "\n" << r.violation;
      if (++failures >= 3) break;
    }
  }
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf(
      "%d replicas, %llu seeds: %.1f ms per seed; %llu committed, %llu elections, %llu crashes, "
      "%llu steps under a lease\n",
      replicas, (unsigned long long)count, 1000 * sec / count, (unsigned long long)committed,
      (unsigned long long)elections, (unsigned long long)crashes, (unsigned long long)lease_checks);
}

// Leader moves under the simulator's faults: started often, most handed
// over, some timed out (a target down, cut off or paused), and every seed
// keeps the invariants.
TEST(Simulation, LeaderMovesUnderFaults) {
  uint64_t started = 0, handed = 0, timed_out = 0;
  for (uint64_t s = 1; s <= 40; s++) {
    SimOptions o;
    o.replicas = 3;
    o.seed = s;
    o.duration_us = 1'000'000;
    o.transfer_every_us = 40'000;
    SimResult r = RunSimulation(o);
    ASSERT_TRUE(r.ok) << r.summary << "\n" << r.violation;
    started += r.transfers;
    handed += r.transfers_handed_over;
    timed_out += r.transfers_timed_out;
  }
  printf("40 seeds: %llu leader moves started, %llu handed over, %llu timed out\n",
         (unsigned long long)started, (unsigned long long)handed, (unsigned long long)timed_out);
  EXPECT_GT(started, 100u);
  EXPECT_GT(handed, started / 4);
  EXPECT_GT(timed_out, 0u);
}

TEST(Simulation, Seeds3Replicas) {
  RunSeeds(3, 1, 300, 2'000'000);
}
// Every other run has leases (the simulator's default); without them the
// guard never holds an election back.
TEST(Simulation, SeedsWithoutLeases) {
  RunSeeds(3, 5001, 100, 2'000'000, [](SimOptions* o) { o->lease_us = 0; });
}
TEST(Simulation, Seeds5Replicas) {
  RunSeeds(5, 1001, 80, 2'000'000);
}
TEST(Simulation, Seeds7Replicas) {
  RunSeeds(7, 2001, 40, 2'000'000);
}

// Much harsher faults: 10% message loss and duplication, lost and torn puts,
// slow outliers, crashes, partitions and pauses several times as often.
TEST(Simulation, SeedsChaos) {
  auto chaos = [](SimOptions* o) {
    o->drop_rate = o->dup_rate = 0.1;
    o->put_drop_rate = 0.02;
    o->torn_put_rate = 0.4;
    o->slow_rate = 0.1;
    o->crash_every_us = 30'000;
    o->partition_every_us = 40'000;
    o->pause_every_us = 50'000;
  };
  RunSeeds(3, 3001, 150, 2'000'000, chaos);
  RunSeeds(5, 3501, 40, 2'000'000, chaos);
}

// Truncation past lagging replicas (they would need a snapshot): elections
// must still pick committed values right and a majority must go on.
TEST(Simulation, SeedsTruncatingPastLaggingReplicas) {
  auto lag = [](SimOptions* o) {
    o->truncate_lagging = true;
    o->truncate_every_us = 20'000;
  };
  RunSeeds(3, 4001, 150, 2'000'000, lag);
  RunSeeds(5, 4501, 40, 2'000'000, lag);
}

}  // namespace
}  // namespace lockstep
