// checkpointer_test.cc — when a backup's checkpoint falls due
// (Checkpointer::Due): backups take turns along the log, so that two that
// keep up never pause their servers at once.
#include "guard/server/checkpointer.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

CheckpointPolicy Every(uint64_t entries, uint64_t bytes = 0) {
  CheckpointPolicy p;
  p.every_entries = entries;
  p.every_log_bytes = bytes;
  p.every_seconds = 1000000;
  return p;
}

Checkpointer Make(const CheckpointPolicy& p, int id, int replicas) {
  return Checkpointer(p, id, replicas, "/nonexistent", [](const std::string&) {});
}

// The first index at which replica id's checkpoint is due, from a fresh start.
uint64_t FirstDue(const CheckpointPolicy& p, int id, int replicas) {
  Checkpointer c = Make(p, id, replicas);
  for (uint64_t i = 1; i < 100000; i++)
    if (c.Due(i, 0, 0)) return i;
  return 0;
}

TEST(Checkpointer, BackupsTakeTurnsAlongTheLog) {
  CheckpointPolicy p = Every(300);
  EXPECT_EQ(FirstDue(p, 0, 3), 300u);
  EXPECT_EQ(FirstDue(p, 1, 3), 100u);
  EXPECT_EQ(FirstDue(p, 2, 3), 200u);
}

TEST(Checkpointer, APutOffCheckpointWaitsForItsNextTurn) {
  Checkpointer c = Make(Every(300), 1, 3);
  c.Postpone(150, 0, 0);  // e.g. restored from a checkpoint at 150
  EXPECT_FALSE(c.Due(399, 0, 0));
  EXPECT_TRUE(c.Due(400, 0, 0));  // 100 + 300: still its own turn
}

TEST(Checkpointer, ByteTurnsAreStaggeredToo) {
  CheckpointPolicy p = Every(1000000, 3000);
  Checkpointer one = Make(p, 1, 3), two = Make(p, 2, 3);
  EXPECT_FALSE(one.Due(5, 999, 0));
  EXPECT_TRUE(one.Due(5, 1000, 0));
  EXPECT_FALSE(two.Due(5, 1999, 0));
  EXPECT_TRUE(two.Due(5, 2000, 0));
}

TEST(Checkpointer, ARequestIsDueAtOnce) {
  Checkpointer c = Make(Every(300), 2, 3);
  EXPECT_FALSE(c.Due(1, 0, 0));
  c.Request();
  EXPECT_TRUE(c.Due(1, 0, 0));
}

}  // namespace
}  // namespace lockstep
