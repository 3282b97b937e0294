// checkpoint_test.cc — CriuJob against the real criu and a real process in
// its own pid namespace (dump, kill, restore, resume), relocation, and
// CriuJob's error paths with a fake criu. The store's checks on disk are in
// checkpoint_store_test.cc.
//
// Needs root and CRIU (scripts/setup): without them the CRIU tests fail and
// say so rather than skip, because a skipped test would hide a broken setup.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/criu.h"
#include "checkpoint/relocate.h"
#include "checkpoint/spawn.h"
#include "checkpoint/store.h"

namespace lockstep {
namespace {

using namespace checkpoint_test;

// Fails the test unless root and the installed criu are there.
void RequireCriu() {
  ASSERT_EQ(geteuid(), 0u) << "the CRIU tests need root (criu dumps and restores processes)";
  ASSERT_EQ(access(DefaultCriuPath().c_str(), X_OK), 0)
      << "criu not found at " << DefaultCriuPath() << ": run scripts/setup";
}

// ---------------------------------------------------------------------------
// The server stand-in: python3 holding state in memory (a counter) and a
// listening socket on 127.0.0.1; each connection gets "<tag> <count>".
// SO_REUSEADDR as real servers set it: without it the restored listener
// cannot bind while connections it closed linger in TIME_WAIT (criu binds
// with the options as dumped and fails with EADDRINUSE).

constexpr const char* kServerProgram = R"(
import os, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 0))
s.listen(16)
with open(sys.argv[1] + '.tmp', 'w') as f:
    f.write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + '.tmp', sys.argv[1])
held = open(sys.argv[1] + '.held', 'a')  # a file kept open, as a server keeps its log
local = socket.socket(socket.AF_UNIX)  # a unix socket in its directory, as mariadbd's
local.bind(sys.argv[1] + '.sock')
local.listen(4)
count = 0
while True:
    c, _ = s.accept()
    count += 1
    c.sendall(('%s %d\n' % (sys.argv[2], count)).encode())
    c.close()
)";

// Started the way the daemon starts a server: pid 1 of a new pid namespace
// (clone(CLONE_NEWPID)), session leader there, our direct child.
class TestServer {
 public:
  ~TestServer() { Kill(); }

  bool Start(const std::string& dir, const std::string& tag, std::string* error) {
    port_file_ = dir + "/port";
    std::vector<std::string> args = {"/usr/bin/python3", "-c", kServerProgram, port_file_, tag};
    if (access(args[0].c_str(), X_OK) != 0) {
      *error = "the test needs /usr/bin/python3";
      return false;
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = static_cast<pid_t>(
        syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, nullptr, nullptr, nullptr, nullptr));
    if (pid == 0) {
      setsid();
      int null_fd = open("/dev/null", O_RDWR);
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(null_fd, 2);
      syscall(SYS_close_range, 3u, ~0u, 0u);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (pid < 0) {
      *error = std::string("clone(CLONE_NEWPID): ") + strerror(errno);
      return false;
    }
    pid_ = pid;
    for (int i = 0; i < 500; i++) {
      std::string text = ReadFile(port_file_);
      if (!text.empty()) {
        port_ = std::stoi(text);
        return true;
      }
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = 0;
        *error = "the test server exited at once";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    *error = "the test server did not write its port within 5 s";
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int st;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = 0;
  }

  // Takes over a restored server (our child thanks to --restore-sibling).
  void Adopt(pid_t pid) { pid_ = pid; }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
  std::string port_file_;
};

// criu dump of pid into dir (created), waited for; must succeed.
void DumpInto(pid_t pid, const std::string& dir, CriuResult* result) {
  fs::create_directories(dir);
  std::string error;
  CriuJob dump;
  ASSERT_TRUE(dump.StartDump(pid, dir, CriuOptions{}, &error)) << error;
  ASSERT_TRUE(dump.Wait(result, 30000));
  ASSERT_TRUE(result->ok) << result->error;
}

// Connects to 127.0.0.1:port and returns the line the server sends ("" on failure).
std::string Ask(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    char buf[256];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// ---------------------------------------------------------------------------
// The whole path with the real criu: dump a running server into a pending
// checkpoint, commit it, kill the server, restore it from the checkpoint.

TEST(CheckpointEndToEnd, DumpCommitKillRestoreResume) {
  RequireCriu();
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  TestServer server;
  std::string error;
  ASSERT_TRUE(server.Start(tmp.path(), "tag42", &error)) << error;
  ASSERT_EQ(Ask(server.port()), "tag42 1");

  CheckpointStore store;
  ASSERT_TRUE(store.Open(tmp / "replica", &error)) << error;
  PendingCheckpoint pending;
  ASSERT_TRUE(store.Begin(1000, &pending, &error)) << error;
  fs::create_directories(tmp / "data/sub");
  WriteFile(tmp / "data/dump.rdb", "the server's data");
  WriteFile(tmp / "data/sub/aof", "more");

  CriuJob dump;
  ASSERT_TRUE(dump.StartDump(server.pid(), pending.img_dir, CriuOptions{}, &error)) << error;
  ASSERT_TRUE(dump.running());
  ASSERT_GE(dump.fd(), 0);
  CriuResult result;
  // The pidfd becomes readable when criu exits: what the daemon's epoll waits for.
  struct pollfd pfd = {dump.fd(), POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 30000), 1) << "criu dump did not finish within 30 s";
  ASSERT_TRUE(dump.Poll(&result));
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_FALSE(dump.running());
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_GT(result.duration_us, 0);
  EXPECT_TRUE(fs::exists(pending.img_dir + "/inventory.img"));
  EXPECT_EQ(result.log_path, pending.img_dir + "/dump.log");
  fprintf(stderr, "criu dump took %.1f ms\n", result.duration_us / 1000.0);

  ASSERT_TRUE(store.CopyDataDir(tmp / "data", &pending, &error)) << error;
  CheckpointMeta meta;
  meta.replica_id = 2;
  meta.dump_us = result.duration_us;
  meta.extra = std::string("conn table\0\n\xff", 14);
  CheckpointInfo info;
  ASSERT_TRUE(store.Commit(&pending, meta, &error, &info)) << error;
  EXPECT_FALSE(pending.active());

  // --leave-running: the original serves on; the checkpoint holds count 1.
  ASSERT_EQ(Ask(server.port()), "tag42 2");
  server.Kill();  // the restore needs the old process dead and reaped

  auto good = store.NewestGood(UINT64_MAX);
  ASSERT_TRUE(good.has_value());
  EXPECT_EQ(good->index, 1000u);
  EXPECT_EQ(good->meta.extra, meta.extra);
  ASSERT_TRUE(store.RestoreDataDir(1000, tmp / "data", &error)) << error;
  EXPECT_EQ(ReadFile(tmp / "data/dump.rdb"), "the server's data");

  CriuJob restore;
  std::string pid_file = tmp / "restored.pid";
  ASSERT_TRUE(restore.StartRestore(good->path + "/img", pid_file, {}, CriuOptions{}, &error))
      << error;
  ASSERT_TRUE(restore.Wait(&result, 30000)) << "criu restore did not finish within 30 s";
  ASSERT_TRUE(result.ok) << result.error;
  ASSERT_GT(result.restored_pid, 0);
  server.Adopt(result.restored_pid);
  fprintf(stderr, "criu restore took %.1f ms\n", result.duration_us / 1000.0);

  EXPECT_EQ(ProcParent(result.restored_pid), getpid()) << "--restore-sibling makes it our child";
  // --leave-stopped: criu queues SIGSTOP, then detaches and exits, so the
  // stop may take effect a moment after criu is gone.
  std::string first_state = ProcState(result.restored_pid), state = first_state;
  for (int i = 0; i < 200 && state.substr(0, 1) != "T"; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    state = ProcState(result.restored_pid);
  }
  EXPECT_EQ(state.substr(0, 1), "T") << "--leave-stopped; right after criu: " << first_state;
  if (first_state != state) fprintf(stderr, "right after criu: %s\n", first_state.c_str());
  ASSERT_EQ(kill(result.restored_pid, SIGCONT), 0);
  // The restored memory says one connection was served; the same socket listens.
  EXPECT_EQ(Ask(server.port()), "tag42 2");
  EXPECT_EQ(Ask(server.port()), "tag42 3");
  EXPECT_NE(ProcState(result.restored_pid).substr(0, 1), "T");

  // The restore wrote its log into img/ without spoiling the checkpoint.
  EXPECT_TRUE(fs::exists(good->path + "/img/restore.log"));
  EXPECT_TRUE(store.Verify(1000, &error)) << error;
  server.Kill();
}

TEST(CheckpointEndToEnd, RestoreFailsWithCriusReasonWhileThePortIsTaken) {
  RequireCriu();
  TempDir tmp;
  TestServer server;
  std::string error;
  ASSERT_TRUE(server.Start(tmp.path(), "busy", &error)) << error;
  CriuResult result;
  ASSERT_NO_FATAL_FAILURE(DumpInto(server.pid(), tmp / "img", &result));

  // The original still listens on the port the images want to bind.
  CriuJob restore;
  ASSERT_TRUE(restore.StartRestore(tmp / "img", tmp / "pid", {}, CriuOptions{}, &error)) << error;
  ASSERT_TRUE(restore.Wait(&result, 30000));
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.restored_pid, 0);
  EXPECT_GT(result.exit_code, 0);
  EXPECT_EQ(result.error.rfind("criu restore failed: ", 0), 0u) << result.error;
  EXPECT_EQ(result.error.find("(criu/"), std::string::npos) << result.error;
  EXPECT_EQ(result.error.find("FAILED."), std::string::npos) << result.error;
  EXPECT_EQ(result.error.find('\n'), std::string::npos) << result.error;
  fprintf(stderr, "criu's reason: %s\n", result.error.c_str());
  EXPECT_EQ(Ask(server.port()), "busy 1") << "the original is unharmed";
}

// ---------------------------------------------------------------------------
// CriuJob's errors and plumbing.

// Another replica's checkpoint, relocated: restored while the original
// still runs and holds its port, it binds ours and opens our files.
TEST(CheckpointEndToEnd, RelocatedImagesRestoreUnderAnotherDirAndPort) {
  RequireCriu();
  TempDir tmp;
  fs::create_directories(tmp / "peer");
  fs::create_directories(tmp / "me");
  TestServer server;
  std::string error;
  ASSERT_TRUE(server.Start(tmp / "peer", "moved", &error)) << error;
  ASSERT_EQ(Ask(server.port()), "moved 1");
  CriuResult result;
  ASSERT_NO_FATAL_FAILURE(DumpInto(server.pid(), tmp / "img", &result));

  int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len), 0);
  int my_port = ntohs(a.sin_port);
  close(probe);

  Relocation r{tmp / "peer",
               tmp / "me",
               static_cast<uint32_t>(server.port()),
               static_cast<uint32_t>(my_port),
               "127.0.0.1",
               "127.0.0.1"};
  WriteFile(tmp / "me/port.held", "");
  ASSERT_TRUE(BuildRelocatedView(tmp / "img", tmp / "view", r, &error)) << error;
  EXPECT_TRUE(fs::is_symlink(tmp / "view/inventory.img"));
  EXPECT_FALSE(fs::is_symlink(tmp / "view/files.img"));
  std::string original = ReadFile(tmp / "img/files.img"), moved = ReadFile(tmp / "view/files.img");
  std::string again;
  int changed = 0;
  ASSERT_TRUE(RelocateFilesImage(original, r, &again, &changed, &error)) << error;
  EXPECT_EQ(again, moved);
  EXPECT_GE(changed, 3) << "the listening sockets and the held file";
  for (const char* name : {"port.held", "port.sock"}) {
    EXPECT_NE(moved.find(tmp / ("me/" + std::string(name))), std::string::npos) << name;
    EXPECT_EQ(moved.find(tmp / ("peer/" + std::string(name))), std::string::npos) << name;
  }
  std::string bad;
  EXPECT_FALSE(RelocateFilesImage("not an image", r, &bad, &changed, &error));

  TestServer moved_server;
  CriuJob restore;
  ASSERT_TRUE(restore.StartRestore(tmp / "view", tmp / "restored.pid", {}, CriuOptions{}, &error))
      << error;
  ASSERT_TRUE(restore.Wait(&result, 30000));
  ASSERT_TRUE(result.ok) << result.error;
  moved_server.Adopt(result.restored_pid);
  ASSERT_EQ(kill(result.restored_pid, SIGCONT), 0);
  EXPECT_EQ(Ask(my_port), "moved 2");        // the copy, on our port
  EXPECT_EQ(Ask(server.port()), "moved 2");  // the original, untouched, on its own
  bool holds_ours = false;
  for (const auto& e :
       fs::directory_iterator("/proc/" + std::to_string(result.restored_pid) + "/fd"))
    holds_ours |= fs::read_symlink(e.path()).string() == tmp / "me/port.held";
  EXPECT_TRUE(holds_ours);
  // The unix socket is bound where ours belongs, and the original keeps its own.
  for (const char* dir : {"me", "peer"}) {
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un u{};
    u.sun_family = AF_UNIX;
    std::string path = tmp / (std::string(dir) + "/port.sock");
    snprintf(u.sun_path, sizeof u.sun_path, "%s", path.c_str());
    EXPECT_EQ(connect(c, reinterpret_cast<sockaddr*>(&u), sizeof u), 0)
        << path << ": " << strerror(errno);
    close(c);
  }
  moved_server.Kill();
  server.Kill();
}

// A peer on a host of its own (netns hosts, real machines): its server
// listened on its own address, which a restore here must not try to bind.
// A files.img made by hand (criu/images/fdinfo.proto, sk-inet.proto): the
// listening socket on the peer's address and port, another listening on
// 0.0.0.0:the peer's port, and a connected one from the peer's address.
TEST(CheckpointRelocate, AListenersAddressBecomesOurHost) {
  auto varint = [](uint32_t field, uint64_t v) {
    std::string out(1, static_cast<char>(field << 3));
    do {
      uint8_t b = v & 0x7f;
      v >>= 7;
      out.push_back(static_cast<char>(v ? b | 0x80 : b));
    } while (v);
    return out;
  };
  auto len = [](uint32_t field, const std::string& data) {
    return std::string(1, static_cast<char>(field << 3 | 2)) +
           std::string(1, static_cast<char>(data.size())) + data;
  };
  auto addr = [](const char* text) {
    in_addr a{};
    EXPECT_EQ(inet_pton(AF_INET, text, &a), 1);
    return static_cast<uint64_t>(a.s_addr);
  };
  auto isk = [&](uint32_t state, uint32_t port, uint64_t src) {
    std::string sk = varint(1, 7) + varint(6, state) + varint(7, port) + varint(11, src);
    return varint(1, 2) + varint(2, 7) + len(4, sk);  // file_entry: type INETSK, id, isk
  };
  auto image = [](const std::vector<std::string>& entries) {
    std::string out;
    for (uint32_t magic : {0x54564319u, 0x56303138u})
      out.append(reinterpret_cast<char*>(&magic), 4);
    for (const auto& e : entries) {
      uint32_t n = static_cast<uint32_t>(e.size());
      out.append(reinterpret_cast<char*>(&n), 4);
      out += e;
    }
    return out;
  };
  const uint64_t peer = addr("10.201.7.10"), me = addr("10.201.7.11");
  std::string in = image({isk(10, 49152, peer), isk(10, 49152, 0), isk(1, 40000, peer)});
  Relocation r{"/peer", "/me", 49152, 49153, "10.201.7.10", "10.201.7.11"};
  std::string out, error;
  int changed = 0;
  ASSERT_TRUE(RelocateFilesImage(in, r, &out, &changed, &error)) << error;
  EXPECT_EQ(changed, 2) << "both listeners; not the connected socket";
  EXPECT_EQ(out, image({isk(10, 49153, me), isk(10, 49153, 0), isk(1, 40000, peer)}));

  r.from_host = r.to_host = "127.0.0.1";  // one host's loopback: the port alone moves
  ASSERT_TRUE(
      RelocateFilesImage(image({isk(10, 49152, addr("127.0.0.1"))}), r, &out, &changed, &error));
  EXPECT_EQ(out, image({isk(10, 49153, addr("127.0.0.1"))}));
}

TEST(CheckpointCriuJob, DumpOfAPidThatDoesNotExistFailsClearly) {
  RequireCriu();
  TempDir tmp;
  pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  int st;
  ASSERT_EQ(waitpid(gone, &st, 0), gone);
  CriuJob job;
  std::string error;
  EXPECT_FALSE(job.StartDump(gone, tmp.path(), CriuOptions{}, &error));
  EXPECT_EQ(error, "cannot dump pid " + std::to_string(gone) + ": no such process");
  EXPECT_FALSE(job.running());
  EXPECT_EQ(job.fd(), -1);
}

TEST(CheckpointCriuJob, RestoreFromAnEmptyDirFailsClearly) {
  RequireCriu();
  TempDir tmp;
  CriuJob job;
  std::string error;
  EXPECT_FALSE(job.StartRestore(tmp.path(), tmp / "pid", {}, CriuOptions{}, &error));
  EXPECT_EQ(error, "no criu images in " + tmp.path() + " (inventory.img is missing)");
  EXPECT_FALSE(job.running());
}

TEST(CheckpointCriuJob, RestoreFromAnEmptyInventoryReportsCriusError) {
  RequireCriu();
  TempDir tmp;
  WriteFile(tmp / "inventory.img", "");
  CriuJob job;
  std::string error;
  ASSERT_TRUE(job.StartRestore(tmp.path(), tmp / "pid", {}, CriuOptions{}, &error)) << error;
  CriuResult r;
  ASSERT_TRUE(job.Wait(&r, 30000));
  EXPECT_FALSE(r.ok);
  EXPECT_GT(r.exit_code, 0);
  EXPECT_EQ(r.error.rfind("criu restore failed: ", 0), 0u) << r.error;
  EXPECT_EQ(r.error.find("rlimit"), std::string::npos) << r.error;
  EXPECT_EQ(r.error.find("(criu/"), std::string::npos) << r.error;
  fprintf(stderr, "criu's reason: %s\n", r.error.c_str());
}

TEST(CheckpointCriuJob, MissingCriuSaysRunSetup) {
  TempDir tmp;
  CriuOptions opt;
  opt.criu_path = tmp / "no-criu-here";
  CriuJob job;
  std::string error;
  EXPECT_FALSE(job.StartDump(getpid(), tmp.path(), opt, &error));
  EXPECT_EQ(error, "criu not found (" + opt.criu_path + "): run scripts/setup");
}

TEST(CheckpointCriuJob, EnvironmentVariableChoosesTheBinary) {
  std::string saved = getenv("LOCKSTEP_CRIU") ? getenv("LOCKSTEP_CRIU") : "";
  setenv("LOCKSTEP_CRIU", "/opt/elsewhere/criu", 1);
  EXPECT_EQ(DefaultCriuPath(), "/opt/elsewhere/criu");
  unsetenv("LOCKSTEP_CRIU");
  EXPECT_EQ(DefaultCriuPath(), "/usr/local/sbin/criu");
  if (!saved.empty()) setenv("LOCKSTEP_CRIU", saved.c_str(), 1);
}

// A stand-in for criu: a shell script.
std::string FakeCriu(const TempDir& tmp, const std::string& body) {
  std::string path = tmp / "fake-criu";
  WriteFile(path, "#!/bin/sh\n" + body + "\n", 0755);
  return path;
}

TEST(CheckpointCriuJob, TimeoutKillsCriuAndSaysSo) {
  TempDir tmp;
  CriuOptions opt;
  opt.criu_path = FakeCriu(tmp, "exec sleep 30");
  opt.timeout_ms = 1000;
  CriuJob job;
  std::string error;
  auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.StartDump(getpid(), tmp.path(), opt, &error)) << error;
  CriuResult r;
  bool done = job.Poll(&r);
  int left = job.MsUntilTimeout();
  // What is left is the timeout less what has passed (a loaded machine may
  // have let some or all of it pass meanwhile).
  auto passed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now() - started)
                       .count();
  if (passed_ms < 1000) {
    EXPECT_FALSE(done);
  }
  if (!done) {
    EXPECT_LE(left, 1001);
    EXPECT_GE(left, 1000 - passed_ms);
  }
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(done || job.Wait(&r, 30000));
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, std::chrono::seconds(20)) << "waited for the fake criu's 30 s sleep";
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.term_signal, SIGKILL);
  EXPECT_GE(r.duration_us, 1000000);
  EXPECT_EQ(r.error.rfind("criu dump timed out after 1000 ms (killed)", 0), 0u) << r.error;
  EXPECT_EQ(job.MsUntilTimeout(), -1);
}

TEST(CheckpointCriuJob, WaitWithAShortLimitReturnsWhileCriuRuns) {
  TempDir tmp;
  CriuOptions opt;
  opt.criu_path = FakeCriu(tmp, "exec sleep 30");
  std::string error;
  CriuResult r;
  {
    CriuJob job;
    ASSERT_TRUE(job.StartDump(getpid(), tmp.path(), opt, &error)) << error;
    EXPECT_FALSE(job.Wait(&r, 50));
    EXPECT_TRUE(job.running());
    EXPECT_EQ(job.MsUntilTimeout(), -1);
    pid_t criu = job.pid();
    ASSERT_GT(criu, 0);
    EXPECT_EQ(kill(criu, 0), 0);
  }  // the destructor kills and reaps it
}

TEST(CheckpointCriuJob, CriuKilledBySignalIsReported) {
  TempDir tmp;
  CriuOptions opt;
  opt.criu_path = FakeCriu(tmp, "kill -SEGV $$");
  CriuJob job;
  std::string error;
  ASSERT_TRUE(job.StartDump(getpid(), tmp.path(), opt, &error)) << error;
  CriuResult r;
  ASSERT_TRUE(job.Wait(&r, 10000));
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.term_signal, SIGSEGV);
  EXPECT_EQ(r.error.rfind("criu was killed by signal 11 (", 0), 0u) << r.error;
}

TEST(CheckpointCriuJob, FailureReportsTheCauseFromCriusLog) {
  TempDir tmp;
  CriuOptions opt;
  // $5 is the images dir (dump -t PID -D DIR ...).
  opt.criu_path =
      FakeCriu(tmp,
               "{ echo '(00.000100) Error (criu/util.c:1534): rlimit: Can'\\''t setup "
               "RLIMIT_NOFILE for self: Operation not permitted'\n"
               "  echo '(00.000200) Error (criu/sk-inet.c:10): the first reason'\n"
               "  echo '(00.000300) 1: Error (criu/files.c:99): the last reason: EBUSY'\n"
               "  echo '(00.000400) Error (criu/cr-dump.c:1975): Dumping FAILED.'\n"
               "} > \"$5/dump.log\"; echo noise; exit 1");
  CriuJob job;
  std::string error;
  ASSERT_TRUE(job.StartDump(getpid(), tmp.path(), opt, &error)) << error;
  CriuResult r;
  ASSERT_TRUE(job.Wait(&r, 10000));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.error, "criu dump failed: the first reason (then: the last reason: EBUSY)");
  EXPECT_EQ(ReadFile(tmp / "dump.out"), "noise\n") << "criu's stdout goes to dump.out";
}

TEST(CheckpointCriuJob, FailureWithoutALogQuotesStderr) {
  TempDir tmp;
  CriuOptions opt;
  opt.criu_path = FakeCriu(tmp, "echo 'unknown option --frobnicate' >&2; exit 2");
  CriuJob job;
  std::string error;
  ASSERT_TRUE(job.StartDump(getpid(), tmp.path(), opt, &error)) << error;
  CriuResult r;
  ASSERT_TRUE(job.Wait(&r, 10000));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.error, "criu dump failed: unknown option --frobnicate");
}

TEST(CheckpointCriuJob, RestoreKeepsOnlyTheGivenFdsAndReadsThePidFile) {
  TempDir tmp;
  WriteFile(tmp / "inventory.img", "");
  std::string pid_file = tmp / "pid";
  WriteFile(pid_file, "999999\n");  // stale: StartRestore removes it first
  CriuOptions opt;
  opt.extra_args = {"--inherit-fd", "fd[40]:test"};
  // Lists its own fds, shows its args, writes a pid file the way criu does.
  opt.criu_path = FakeCriu(tmp,
                           "ls /proc/$$/fd | sort -n | tr '\\n' ' '\n"
                           "echo\necho \"$@\"\n"
                           "while [ $# -gt 0 ]; do [ \"$1\" = --pidfile ] && "
                           "{ [ -e \"$2\" ] && exit 3; echo 4321 > \"$2\"; }; shift; done");
  int kept = fcntl(open("/dev/null", O_RDONLY | O_CLOEXEC), F_DUPFD_CLOEXEC, 40);
  int leaked = fcntl(open("/dev/null", O_RDONLY), F_DUPFD, 41);  // no CLOEXEC: must still close
  ASSERT_EQ(kept, 40);
  ASSERT_EQ(leaked, 41);
  CriuJob job;
  std::string error;
  ASSERT_TRUE(job.StartRestore(tmp.path(), pid_file, {kept}, opt, &error)) << error;
  CriuResult r;
  ASSERT_TRUE(job.Wait(&r, 10000));
  close(kept);
  close(leaked);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.restored_pid, 4321);
  std::string out = ReadFile(tmp / "restore.out");
  std::string fds = out.substr(0, out.find('\n'));
  // 0-2, the kept fd, and ls's own directory fd (3 or 255 for some shells... ls opens it).
  EXPECT_NE(fds.find(" 40 "), std::string::npos) << fds;
  EXPECT_EQ(fds.find(" 41 "), std::string::npos) << fds;
  EXPECT_NE(out.find("restore -D " + tmp.path() +
                     " -d --restore-sibling --tcp-close --leave-stopped --network-lock skip "
                     "--pidfile " +
                     pid_file + " -o restore.log -v4 --inherit-fd fd[40]:test"),
            std::string::npos)
      << out;
}

TEST(CheckpointCriuJob, PassingAClosedFdIsRefused) {
  TempDir tmp;
  WriteFile(tmp / "inventory.img", "");
  CriuOptions opt;
  opt.criu_path = FakeCriu(tmp, "exit 0");
  CriuJob job;
  std::string error;
  EXPECT_FALSE(job.StartRestore(tmp.path(), tmp / "pid", {1000}, opt, &error));
  EXPECT_EQ(error, "cannot pass fd 1000 to criu: not an open fd >= 3");
}

TEST(CheckpointCriuJob, WaitsOnlyForCriuNeverForOtherChildren) {
  TempDir tmp;
  pid_t other = fork();
  if (other == 0) _exit(7);
  ASSERT_GT(other, 0);
  // Until it is a zombie (exited, not reaped): WNOWAIT leaves it unreaped.
  siginfo_t exited{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(other), &exited, WEXITED | WNOWAIT), 0)
      << strerror(errno);
  CriuOptions opt;
  opt.criu_path = FakeCriu(tmp, "exit 0");
  CriuJob job;
  std::string error;
  ASSERT_TRUE(job.StartDump(getpid(), tmp.path(), opt, &error)) << error;
  CriuResult r;
  ASSERT_TRUE(job.Wait(&r, 10000));
  EXPECT_TRUE(r.ok) << r.error;
  int st = 0;
  ASSERT_EQ(waitpid(other, &st, WNOHANG), other) << "the other child must still be unreaped";
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 7);
}

// A dump's criu dies with the thread that started it (the daemon's death
// kills its server anyway, and a criu whose target dies at the wrong moment
// waits for ever); a restore's criu does not.
TEST(CheckpointCriuJob, OnlyADumpsCriuDiesWithTheThreadThatStartedIt) {
  RequireCriu();
  TempDir tmp;
  TestServer server;
  std::string error;
  ASSERT_TRUE(server.Start(tmp.path(), "tag7", &error)) << error;
  fs::create_directories(tmp / "img");
  CriuJob dump;
  bool started = false;
  std::thread([&] {
    started = dump.StartDump(server.pid(), tmp / "img", CriuOptions{}, &error);
  }).join();  // the thread is gone before criu can have dumped anything
  ASSERT_TRUE(started) << error;
  CriuResult r;
  ASSERT_TRUE(dump.Wait(&r, 30000));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.term_signal, SIGKILL) << r.error;
  server.Kill();

  WriteFile(tmp / "inventory.img", "");  // criu refuses it: a quick, real failure
  CriuJob restore;
  std::thread([&] {
    started = restore.StartRestore(tmp.path(), tmp / "pid", {}, CriuOptions{}, &error);
  }).join();
  ASSERT_TRUE(started) << error;
  ASSERT_TRUE(restore.Wait(&r, 30000));
  EXPECT_EQ(r.term_signal, 0) << r.error;
  EXPECT_GT(r.exit_code, 0) << r.error;
}

// Two real criu processes (page servers, which wait for a client), one
// naming a dir under a replica's store, one elsewhere: only the first is
// killed.
TEST(CheckpointCriuJob, KillStrayCriuKillsOnlyCriuNamingTheDir) {
  RequireCriu();
  TempDir tmp;
  fs::create_directories(tmp / "replica/checkpoints/tmp-7/img");
  fs::create_directories(tmp / "replica/checkpoints-other/img");
  auto page_server = [&](const std::string& dir) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // a free port, for a moment
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
    close(s);
    SpawnOptions o;
    o.exe = DefaultCriuPath();
    o.argv = {o.exe,       "page-server", "-D",     dir,
              "--address", "127.0.0.1",   "--port", std::to_string(ntohs(addr.sin_port))};
    o.out_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    return Spawn(o).pid;
  };
  pid_t stray = page_server(tmp / "replica/checkpoints/tmp-7/img");
  pid_t other = page_server(tmp / "replica/checkpoints-other/img");
  ASSERT_GT(stray, 0);
  ASSERT_GT(other, 0);
  std::vector<pid_t> killed = KillStrayCriu(tmp / "replica/checkpoints/");
  // The stray, and maybe a short-lived fork of it with the same command
  // line (criu forks to probe the kernel as it starts: a full run once saw
  // one), never the other.
  EXPECT_NE(std::find(killed.begin(), killed.end(), stray), killed.end());
  EXPECT_EQ(std::find(killed.begin(), killed.end(), other), killed.end());
  int st = 0;
  ASSERT_EQ(waitpid(stray, &st, 0), stray);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  EXPECT_EQ(waitpid(other, &st, WNOHANG), 0) << "the other criu must still run";
  kill(other, SIGKILL);
  waitpid(other, &st, 0);
}

TEST(CheckpointCriuJob, CriuErrorReasonGivesTheCauseAndSkipsSummariesAndNoise) {
  const std::string rlimit =
      "(00.029199) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: "
      "Operation not permitted\n";
  // What a dump of a pid that does not exist logs.
  EXPECT_EQ(
      CriuErrorReason(rlimit + "(00.078574) Error (compel/src/lib/infect.c:417): Unable to detach "
                               "from 999999: No such process\n"
                               "(00.078588) Error (criu/cr-dump.c:1975): Dumping FAILED.\n"),
      "Unable to detach from 999999: No such process");
  // What a restore logs when its listening port is taken.
  EXPECT_EQ(
      CriuErrorReason(rlimit + "(00.031273)      1: Error (criu/sk-inet.c:1059): inet: Can't bind "
                               "inet socket (id 11): Address already in use\n"
                               "(00.031285)      1: Error (criu/files.c:1221): Unable to open fd=3 "
                               "id=0xb\n"
                               "(00.032266) Error (criu/cr-restore.c:2331): Restoring FAILED.\n"),
      "inet: Can't bind inet socket (id 11): Address already in use (then: Unable to open "
      "fd=3 id=0xb)");
  EXPECT_EQ(CriuErrorReason("(00.1) Error (criu/cr-restore.c:1): Restoring FAILED.\n"),
            "Restoring FAILED.");
  EXPECT_EQ(CriuErrorReason(rlimit + "(00.1) Warn  (criu/x.c:1): only a warning\n"), "");
}

}  // namespace
}  // namespace lockstep
