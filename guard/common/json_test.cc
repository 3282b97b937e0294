// json_test.cc — the JSON helpers (json.h), fed what another process might
// send: numbers that are not whole, too large, negative, or missing.
#include "guard/common/json.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(JsonNumbers, WholeNumbersAreRead) {
  std::string s = R"({"commit_index":42,"age_s":-3,"big":18446744073709551615})";
  EXPECT_EQ(JsonU64(s, "commit_index"), 42u);
  EXPECT_EQ(JsonI64(s, "age_s"), -3);
  EXPECT_EQ(JsonU64(s, "big"), UINT64_MAX);
}

TEST(JsonNumbers, AnythingElseIsAbsentNeverAThrow) {
  // std::stoull took "12abc" as 12, threw on "abc" and on 2^64: the daemon
  // read a peer's checkpoint index with it, in a thread with no catch.
  std::string s = R"({"word":"abc","tail":"12abc","huge":18446744073709551616,"neg":-1,"empty":"",)"
                  R"("frac":1.5})";
  for (const char* key : {"word", "tail", "huge", "neg", "empty", "frac", "missing"}) {
    EXPECT_EQ(JsonU64(s, key, 7), 7u) << key;
  }
  EXPECT_EQ(JsonI64(s, "neg", 7), -1);
  EXPECT_EQ(JsonI64(s, "word", 7), 7);
}

}  // namespace
}  // namespace lockstep
