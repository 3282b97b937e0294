// log_input_test.cc — the codec of a kInput entry's payload (log_input.h):
// what the leader writes decodes to the same input, its wall-clock stamp and
// reply gate included, and an entry written before either existed still
// decodes.
#include "guard/server/log_input.h"

#include <gtest/gtest.h>

#include "guard/net/wire.h"
#include "preload/shim_abi.h"

namespace lockstep {
namespace {

TEST(LogInput, RoundTripsWithTheClockStamp) {
  std::string p =
      EncodeInput(LS_SUB_DATA, ConnKey{7, 3}, 42, "SET k v\r\n", 1795455335560975123ull, 4242);
  EXPECT_EQ(p.size(), kInputHeader + 9);
  Input in;
  ASSERT_TRUE(DecodeInput(p, &in));
  EXPECT_EQ(in.kind, LS_SUB_DATA);
  EXPECT_EQ(in.key, (ConnKey{7, 3}));
  EXPECT_EQ(in.seq, 42u);
  EXPECT_EQ(in.bytes, "SET k v\r\n");
  EXPECT_EQ(in.clock_ns, 1795455335560975123ull);
  EXPECT_EQ(in.out_before, 4242u);
  EXPECT_EQ(DescribeInput(in), "DATA 0.7/3 9 bytes after 4242 bytes out: SET k v\\r\\n");
}

TEST(LogInput, AnEntryFromBeforeTheReplyGateDecodesWithoutOne) {
  ByteWriter w;
  w.u8(LS_SUB_DATA);
  w.u64(9);
  w.u32(1);
  w.u64(3);
  w.bytes("x");
  w.u64(77);  // the stamp, and nothing after it
  Input in;
  in.out_before = 5;  // overwritten
  ASSERT_TRUE(DecodeInput(w.str(), &in));
  EXPECT_EQ(in.clock_ns, 77u);
  EXPECT_EQ(in.out_before, 0u);
  EXPECT_EQ(DescribeInput(in), "DATA 0.9/1 1 bytes: x");
}

TEST(LogInput, AnEntryFromBeforeTheStampDecodesWithoutOne) {
  // The layout before the stamp: kind, ballot, conn, seq, bytes.
  ByteWriter w;
  w.u8(LS_SUB_CLOSE);
  w.u64(9);
  w.u32(1);
  w.u64(0);
  w.bytes("");
  Input in;
  in.clock_ns = 5;  // overwritten
  ASSERT_TRUE(DecodeInput(w.str(), &in));
  EXPECT_EQ(in.kind, LS_SUB_CLOSE);
  EXPECT_EQ(in.key, (ConnKey{9, 1}));
  EXPECT_EQ(in.clock_ns, 0u);
}

TEST(LogInput, APartOfAStampOrMoreIsNoInput) {
  std::string p = EncodeInput(LS_SUB_ACCEPT, ConnKey{1, 1}, 1, "127.0.0.1:5", 99);
  Input in;
  EXPECT_FALSE(DecodeInput(std::string_view(p).substr(0, p.size() - 3), &in));
  EXPECT_FALSE(DecodeInput(p + "x", &in));
  EXPECT_FALSE(DecodeInput("a value from lockstep propose", &in));
  std::string bad = p;
  bad[0] = 9;  // no such kind
  EXPECT_FALSE(DecodeInput(bad, &in));
}

}  // namespace
}  // namespace lockstep
