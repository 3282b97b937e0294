// symbolize_test.cc — guard/server/symbolize.h on this very process: addresses of
// its own functions, of libc's, and of nothing, named from /proc/self/maps
// and the ELF files.
#include "guard/server/symbolize.h"

#include <execinfo.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

// Not static, not inlined: the test binary's symbol table names it.
extern "C" __attribute__((noinline)) int lockstep_symbolize_probe(std::vector<uint64_t>* pcs) {
  void* frames[8];
  int n = backtrace(frames, 8);
  int first = 0;
#ifdef __SANITIZE_ADDRESS__
  first = 1;  // ASan's interceptor of backtrace() is frame 0
#endif
  for (int i = first; i < n; i++) pcs->push_back(reinterpret_cast<uint64_t>(frames[i]));
  return n;
}

namespace lockstep {
namespace {

TEST(Symbolizer, NamesFunctionsOfTheProgramAndOfLibc) {
  Symbolizer s(getpid());
  auto probe = reinterpret_cast<uint64_t>(&lockstep_symbolize_probe);
  std::string d = s.Describe(probe + 4);
  EXPECT_EQ(d.rfind("lockstep_symbolize_probe+0x4 (symbolize_test)", 0), 0u) << d;
  // A function of libc, exported in its dynamic symbols.
  std::string w = s.Describe(reinterpret_cast<uint64_t>(&getpid) + 4);
  EXPECT_NE(w.find("getpid"), std::string::npos) << w;
  EXPECT_NE(w.find("libc.so"), std::string::npos) << w;
  EXPECT_NE(s.Describe(16).find("(not mapped)"), std::string::npos);
}

TEST(Symbolizer, AStackReadsInnermostFirst) {
  std::vector<uint64_t> pcs;
  ASSERT_GE(lockstep_symbolize_probe(&pcs), 2);
  Symbolizer s(getpid());
  std::string stack = s.DescribeStack(pcs);
  // #0 is the probe itself (backtrace returns into it), #1 its caller, this test.
  EXPECT_EQ(stack.rfind("#0 lockstep_symbolize_probe+0x", 0), 0u) << stack;
  EXPECT_NE(stack.find("\n#1 "), std::string::npos) << stack;
  EXPECT_NE(stack.find("AStackReadsInnermostFirst"), std::string::npos) << stack;
}

}  // namespace
}  // namespace lockstep
