// symbolize.h — function names for code addresses of another process: the
// server's stack at a send, as the shim captured it (return addresses), for
// a divergence report. /proc/PID/maps says which file holds an address and
// where that file is mapped; the file's ELF symbol table (.symtab, else the
// dynamic one: redis exports its functions there) says which function
// contains it. No debug information is read: a function's name and the
// offset into it, which is what a person needs to find the send.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lockstep {

class Symbolizer {
 public:
  explicit Symbolizer(pid_t pid);  // reads the maps now; the files when first needed
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // "spopCommand+0x5a (redis-server)", "?? (libfoo.so+0x1234)", or
  // "0x7f... (not mapped)".
  std::string Describe(uint64_t pc);
  // One line per frame, innermost first: "#0 ...".
  std::string DescribeStack(const std::vector<uint64_t>& pcs);

 private:
  struct Mapping {
    uint64_t start, end, file_offset;
    std::string path;
  };
  struct ElfSymbols;  // one file's function symbols (symbolize.cc)
  ElfSymbols* SymbolsOf(const std::string& path);

  std::vector<Mapping> maps_;
  std::map<std::string, std::unique_ptr<ElfSymbols>> files_;
  std::string pid_root_;  // /proc/PID/root: paths as the process sees them
};

}  // namespace lockstep
