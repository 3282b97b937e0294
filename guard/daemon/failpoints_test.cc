// failpoints_test.cc — failpoint specs read and written back, and the peer
// messages MessageFaults drops or holds: seeded, in order per peer.
#include "guard/daemon/failpoints.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(FailpointSpec, ReadsWhatItWrites) {
  FailpointSpec s;
  std::string err;
  ASSERT_TRUE(ParseFailpointSpec("drop=0.25 delay_ms=10 jitter_ms=5 to=2 seed=9", &s, &err)) << err;
  EXPECT_EQ(s.drop, 0.25);
  EXPECT_EQ(s.delay_ms, 10u);
  EXPECT_EQ(s.to, 2);
  FailpointSpec again;
  ASSERT_TRUE(ParseFailpointSpec(FormatFailpointSpec(s), &again, &err)) << err;
  EXPECT_EQ(FormatFailpointSpec(again), FormatFailpointSpec(s));
  ASSERT_TRUE(ParseFailpointSpec("off", &s, &err));
  EXPECT_EQ(FormatFailpointSpec(s), "off");
}

TEST(FailpointSpec, BadInputIsNamed) {
  FailpointSpec s;
  std::string err;
  for (const char* bad : {"", "drop=1.5", "drop=nan", "delay_ms=abc", "delay_ms=700000", "to=64",
                          "torn_write=2", "nothing=1", "drop", "off drop=0.1", "seed=-1"}) {
    err.clear();
    EXPECT_FALSE(ParseFailpointSpec(bad, &s, &err)) << bad;
    EXPECT_FALSE(err.empty()) << bad;
  }
}

Message To(int to, uint64_t commit) {
  Message m;
  m.to = to;
  m.commit_index = commit;
  return m;
}

TEST(MessageFaults, HeldMessagesLeaveInOrderPerPeer) {
  FailpointSpec s;
  std::string err;
  ASSERT_TRUE(ParseFailpointSpec("delay_ms=10 jitter_ms=50 seed=3", &s, &err));
  MessageFaults f;
  f.Set(s);
  for (uint64_t i = 0; i < 100; i++) EXPECT_TRUE(f.Intercept(To(int(i % 2) + 1, i), 1000 * i));
  std::vector<uint64_t> last(3, 0);
  size_t out = 0;
  for (uint64_t now = 0; now < 1000000; now += 500) {
    for (const Message& m : f.Due(now)) {
      EXPECT_GE(m.commit_index, last[m.to]) << "to " << m.to;
      last[m.to] = m.commit_index;
      EXPECT_GE(now, m.commit_index * 1000 + 10000);  // never before its delay
      out++;
    }
  }
  EXPECT_EQ(out, 100u);
  EXPECT_EQ(f.delayed(), 100u);
}

TEST(MessageFaults, DropsReplayFromTheSeedAndSpareOtherPeers) {
  auto dropped = [](uint64_t seed) {
    FailpointSpec s;
    std::string err;
    EXPECT_TRUE(ParseFailpointSpec("drop=0.5 to=1 seed=" + std::to_string(seed), &s, &err));
    MessageFaults f;
    f.Set(s);
    std::vector<bool> out;
    for (int i = 0; i < 200; i++) {
      out.push_back(f.Intercept(To(1, i), i));
      EXPECT_FALSE(f.Intercept(To(2, i), i));  // to=1 only
    }
    return out;
  };
  auto a = dropped(5), b = dropped(5), c = dropped(6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  size_t n = std::count(a.begin(), a.end(), true);
  EXPECT_GT(n, 60u);
  EXPECT_LT(n, 140u);
}

}  // namespace
}  // namespace lockstep
