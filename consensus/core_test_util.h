// core_test_util.h — what the core's simulator tests share (core_test.cc,
// core_partition_test.cc): a quiet cluster's options, waiting for a leader,
// committing, and checking that every replica holds the committed values.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "consensus/core.h"
#include "consensus/sim.h"

namespace lockstep {

// A well-behaved network and disk: no loss, duplication, tearing or slow
// outliers, no random faults. Tests inject their own faults.
inline SimOptions Quiet(int replicas, uint64_t seed) {
  SimOptions o;
  o.replicas = replicas;
  o.seed = seed;
  o.faults = false;
  o.drop_rate = 0;
  o.dup_rate = 0;
  o.put_drop_rate = 0;
  o.torn_put_rate = 0;
  o.slow_rate = 0;
  o.slow_disk_rate = 0;
  o.unreachable_notice_rate = 0;
  o.torn_tail_rate = 0;
  return o;
}

inline std::string Report(const SimCluster& c) {
  return c.violation() + "\nlast events:\n" + c.TraceTail();
}

#define ASSERT_CLEAN(c) ASSERT_FALSE((c).failed()) << Report(c)

inline int WaitLeader(SimCluster& c, uint64_t max_us = 500'000) {
  c.RunUntil([&] { return c.Leader() >= 0; }, max_us);
  return c.Leader();
}

// Proposes payload at replica r and tracks it for the acknowledged-entry
// check; its index, or 0 (a test failure, with the refusal) when r refused.
inline uint64_t ProposeTracked(SimCluster& c, int r, const std::string& payload) {
  ProposeResult res = c.Propose(r, EntryType::kInput, payload);
  if (!res.ok) {
    ADD_FAILURE() << "proposal refused: " << res.error;
    return 0;
  }
  c.Track(r, res.index, EntryType::kInput, payload);
  return res.index;
}

// Proposes at the current leader and waits until the leader committed it.
inline uint64_t CommitOnLeader(SimCluster& c, const std::string& payload,
                               uint64_t max_us = 300'000) {
  int l = WaitLeader(c);
  if (l < 0) return 0;
  ProposeResult r = c.Propose(l, EntryType::kInput, payload);
  if (!r.ok) return 0;
  c.Track(l, r.index, EntryType::kInput, payload);
  if (!c.RunUntil([&] { return c.replica(l) && c.replica(l)->commit_index() >= r.index; }, max_us))
    return 0;
  return r.index;
}

// Every replica that is up has committed index.
inline bool LiveCommitted(const SimCluster& c, uint64_t index) {
  for (int r = 0; r < c.size(); r++)
    if (c.replica(r) && c.replica(r)->commit_index() < index) return false;
  return true;
}

// Proposes at the current leader and waits until every live replica committed it.
inline uint64_t Commit(SimCluster& c, const std::string& payload, uint64_t max_us = 1'000'000) {
  int l = WaitLeader(c);
  if (l < 0) return 0;
  ProposeResult r = c.Propose(l, EntryType::kInput, payload);
  if (!r.ok) return 0;
  c.Track(l, r.index, EntryType::kInput, payload);
  if (!c.RunUntil([&] { return LiveCommitted(c, r.index); }, max_us)) return 0;
  return r.index;
}

inline std::vector<int> Others(const SimCluster& c, int r) {
  std::vector<int> o;
  for (int i = 0; i < c.size(); i++)
    if (i != r) o.push_back(i);
  return o;
}

// Every replica holds the committed value at every committed index it has.
inline void ExpectAllAgree(SimCluster& c) {
  c.CheckAcknowledged();
  ASSERT_CLEAN(c);
  for (int r = 0; r < c.size(); r++) {
    const Replica* x = c.replica(r);
    if (!x) continue;
    for (uint64_t i = x->first_index(); i <= x->commit_index(); i++) {
      auto it = c.committed().find(i);
      ASSERT_NE(it, c.committed().end()) << "r" << r << " slot " << i;
      EXPECT_EQ(it->second.payload, x->At(i)->payload) << "r" << r << " slot " << i;
    }
  }
}

// Every replica commits up to last (backup b, the one that was behind, says
// where it stood otherwise), leader still leads, and all agree.
inline void ExpectCaughtUp(SimCluster& c, int b, uint64_t last, int leader) {
  ASSERT_TRUE(c.RunUntil([&] { return c.AllCommitted(last); }, 1'000'000))
      << "backup r" << b << " commit " << c.replica(b)->commit_index() << " of " << last << "\n"
      << Report(c);
  EXPECT_EQ(c.Leader(), leader);
  ExpectAllAgree(c);
}

}  // namespace lockstep
