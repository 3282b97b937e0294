// inspection_test.cc — the read-only filter of `lockstep inspect`
// (inspection.h RespFilter): which requests pass, how a request is cut from
// a stream that arrives in pieces, and the count of the server's replies
// that tells when a refused request's error may go out.
#include "guard/server/inspection.h"

#include <gtest/gtest.h>

#include <string>

namespace lockstep {
namespace {

using Verdict = RespFilter::Verdict;

Verdict Judge(const RespFilter& f, const std::string& in, size_t* len, std::string* name) {
  return f.Next(in, len, name);
}

TEST(RespFilter, OneWordAllowsEverySubcommandTwoWordsOnlyThatOne) {
  RespFilter f("GET, DEBUG DIGEST, config get");
  size_t len = 0;
  std::string name;
  EXPECT_EQ(Judge(f, "*2\r\n$3\r\nget\r\n$1\r\nk\r\n", &len, &name), Verdict::kAllow);
  EXPECT_EQ(len, 20u);
  EXPECT_EQ(Judge(f, "*2\r\n$5\r\nDEBUG\r\n$6\r\ndigest\r\n", &len, &name), Verdict::kAllow);
  EXPECT_EQ(Judge(f, "*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$1\r\n1\r\n", &len, &name),
            Verdict::kRefuse);
  EXPECT_EQ(name, "DEBUG SLEEP");  // named with the subcommand: some of DEBUG's pass
  EXPECT_EQ(Judge(f, "CONFIG GET dir\r\n", &len, &name), Verdict::kAllow);  // inline
  EXPECT_EQ(Judge(f, "config set dir /tmp\r\n", &len, &name), Verdict::kRefuse);
  EXPECT_EQ(name, "CONFIG SET");
  EXPECT_EQ(Judge(f, "SET k v\r\n", &len, &name), Verdict::kRefuse);
  EXPECT_EQ(name, "SET");
  EXPECT_EQ(len, 9u);
}

TEST(RespFilter, IncompleteRequestsWaitAndGarbageIsMalformed) {
  RespFilter f("GET");
  size_t len = 0;
  std::string name;
  std::string whole = "*2\r\n$3\r\nGET\r\n$5\r\nhello\r\n";
  for (size_t cut = 0; cut < whole.size(); cut++)
    EXPECT_EQ(Judge(f, whole.substr(0, cut), &len, &name), Verdict::kMore) << cut;
  EXPECT_EQ(Judge(f, whole + "*1\r\n", &len, &name), Verdict::kAllow);
  EXPECT_EQ(len, whole.size());
  EXPECT_EQ(Judge(f, "\r\n", &len, &name), Verdict::kSkip);  // redis answers nothing
  EXPECT_EQ(Judge(f, "*2\r\n+3\r\n", &len, &name), Verdict::kMalformed);
  EXPECT_EQ(Judge(f, "*x\r\n", &len, &name), Verdict::kMalformed);
  EXPECT_EQ(Judge(f, std::string(70000, 'a'), &len, &name), Verdict::kMalformed);
}

TEST(RespFilter, CountsWholeRepliesAcrossPiecesAndNesting) {
  RespFilter f("GET");
  std::string replies =
      "+OK\r\n"
      "$5\r\nhello\r\n"
      "$-1\r\n"
      "*2\r\n:1\r\n*1\r\n$1\r\nx\r\n"
      "%1\r\n+k\r\n+v\r\n"
      "|1\r\n+a\r\n+b\r\n:7\r\n"  // an attribute, then its reply
      ">2\r\n+message\r\n+m\r\n"  // a push: no reply to a request
      "-ERR no\r\n";
  for (char c : replies) ASSERT_TRUE(f.FeedReplies(std::string(1, c)));
  EXPECT_EQ(f.replies(), 7u);
  EXPECT_FALSE(f.FeedReplies("?what\r\n"));
}

}  // namespace
}  // namespace lockstep
