// checkpoint_test_util.h — what checkpoint_test.cc and checkpoint_store_test.cc
// share: a temporary directory, and files written, read, damaged and listed.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace lockstep::checkpoint_test {
namespace fs = std::filesystem;

// A fresh directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/lockstep-ckpt-XXXXXX";
    path_ = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& text, mode_t mode = 0644) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  chmod(path.c_str(), mode);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string ProcState(pid_t pid) {  // "T (stopped)", "S (sleeping)", ... or "" if gone
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("State:", 0) == 0) {
      size_t at = line.find_first_not_of(" \t", 6);
      return at == std::string::npos ? "" : line.substr(at);
    }
  return "";
}

inline pid_t ProcParent(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("PPid:", 0) == 0) return static_cast<pid_t>(std::stol(line.substr(5)));
  return -1;
}

inline void FlipByte(const std::string& path, off_t at) {
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  unsigned char c;
  ASSERT_EQ(pread(fd, &c, 1, at), 1);
  c ^= 0x01;
  ASSERT_EQ(pwrite(fd, &c, 1, at), 1);
  close(fd);
}

// The names in dir (not recursive), sorted.
inline std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace lockstep::checkpoint_test
