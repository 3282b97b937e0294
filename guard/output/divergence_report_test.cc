// divergence_report_test.cc — the hint a report gives (DivergenceHint) and
// the command it names (RequestCommand).
#include "guard/output/divergence_report.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(RequestCommand, NamesARespOrTextCommand) {
  EXPECT_EQ(RequestCommand("*3\r\n$4\r\nspop\r\n$1\r\ns\r\n$2\r\n10\r\n"), "SPOP");
  EXPECT_EQ(RequestCommand("get k1 k2\r\n"), "GET");
  EXPECT_EQ(RequestCommand("*1\r\n$4\r\nIN"), "");  // cut short
  EXPECT_EQ(RequestCommand(std::string("\x00\x01\x02", 3)), "");
  EXPECT_EQ(RequestCommand(""), "");
}

TEST(DivergenceHint, NamesTheOptionThatIsOff) {
  ClusterConfig::ServerConfig s;
  EXPECT_NE(DivergenceHint(s, "output", false, "").find("unchecked_greeting = true"),
            std::string::npos);
  std::string both = DivergenceHint(s, "output", true, "TIME");
  EXPECT_NE(both.find("same_random = true"), std::string::npos);
  EXPECT_NE(both.find("same_clock = true"), std::string::npos);
  s.same_clock = true;
  EXPECT_NE(DivergenceHint(s, "output", true, "SPOP").find("same_random = true"),
            std::string::npos);
  s.same_clock = false;
  s.same_random = true;
  EXPECT_NE(DivergenceHint(s, "state", true, "").find("same_clock = true"), std::string::npos);
  s.same_clock = true;
  EXPECT_NE(DivergenceHint(s, "output", true, "INFO").find("list INFO in unchecked_replies"),
            std::string::npos);
  EXPECT_EQ(DivergenceHint(s, "state", true, ""), "");
}

}  // namespace
}  // namespace lockstep
