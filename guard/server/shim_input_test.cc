// shim_input_test.cc — a leader's client inputs under the real preload shim
// and a real redis: the test plays the leader's daemon (shim_test_harness.h)
// and decides each input's outcome itself, in the orders a daemon that loses
// its leadership meets them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "guard/server/shim_test_harness.h"

namespace lockstep::shim_test {
namespace {

// A leader proposed a client's SET; before it was agreed the leadership
// moved, and the client's next SET, submitted meanwhile, was refused at
// once (the daemon no longer leads). The first SET was then agreed under
// the new leader: every backup's redis executes it, so this one must too.
// The shim used to deliver nothing past the refusal, this input included:
// the old leader's redis missed a SET the others had (a state check after
// an election found its reply stream 5 bytes short).
TEST(ShimInput, AnInputAgreedAfterALaterOneWasRefusedIsRead) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = true, .hold_data = true}, &err)) << err;
  uint32_t conn = 0;
  int fd = h.Connect(&conn);
  ASSERT_GE(fd, 0);
  std::vector<Harness::HeldInput> held;
  SendAll(fd, Resp({"SET", "a", "1"}));
  ASSERT_TRUE(h.WaitHeld(1, &held));
  SendAll(fd, Resp({"SET", "b", "2"}));
  ASSERT_TRUE(h.WaitHeld(2, &held));
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].bytes, Resp({"SET", "a", "1"}));
  EXPECT_EQ(held[1].bytes, Resp({"SET", "b", "2"}));
  h.Complete(LS_DONE_DROPPED, held[1]);
  h.Complete(LS_DONE_COMMITTED, held[0]);
  std::string reply;
  EXPECT_TRUE(ReadUntil(fd, &reply, [](const std::string& b) { return RespReplies(b) >= 1; }))
      << "the agreed SET was never read by the server: " << reply;
  EXPECT_EQ(reply, "+OK\r\n");
  EXPECT_EQ(h.channel_error(), "");
  close(fd);
}

}  // namespace
}  // namespace lockstep::shim_test
