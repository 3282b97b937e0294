// server_test.cc — unit tests of guard/server.{h,cc}: command templates,
// PATH lookup, and ServerProcess with /bin/sh standing in for a server (the
// preload library here is an empty one built for this test).
#include "guard/server/server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace lockstep {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/lockstep-server-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path_ + "'";
    EXPECT_EQ(system(cmd.c_str()), 0);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Waits until the file holds `needle` (the child writes it asynchronously).
std::string WaitFor(const std::string& path, const std::string& needle) {
  for (int i = 0; i < 400; i++) {
    std::string s = ReadFile(path);
    if (s.find(needle) != std::string::npos) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return ReadFile(path);
}

bool Gone(pid_t pid) {  // not running (absent or a zombie nobody reaped yet)
  if (kill(pid, 0) != 0) return true;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t p = stat.rfind(')');
  return p == std::string::npos || (p + 2 < stat.size() && stat[p + 2] == 'Z');
}

bool WaitGone(pid_t pid) {
  for (int i = 0; i < 400 && !Gone(pid); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return Gone(pid);
}

// A listening socket on a free loopback port.
int Listen(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

TEST(Command, Substitute) {
  EXPECT_EQ(SubstituteCommand("srv --port {port} --dir {dir}/x {port}", 7600, "/d"),
            "srv --port 7600 --dir /d/x 7600");
  EXPECT_EQ(SubstituteCommand("{por} {dir", 1, "/d"), "{por} {dir");
  // {host}: the replica's address (127.0.0.1 unless given).
  EXPECT_EQ(SubstituteCommand("--bind {host}:{port}", 7600, "/d"), "--bind 127.0.0.1:7600");
  EXPECT_EQ(SubstituteCommand("--bind {host}", 7600, "/d", "10.201.1.10"), "--bind 10.201.1.10");
}

TEST(Command, Split) {
  std::vector<std::string> argv;
  std::string err;
  ASSERT_TRUE(
      SplitCommand("  redis-server --save \"\" --x 'a b' c\\ d \"q\\\"uote\" ", &argv, &err));
  EXPECT_EQ(argv, (std::vector<std::string>{"redis-server", "--save", "", "--x", "a b", "c d",
                                            "q\"uote"}));
  ASSERT_TRUE(SplitCommand("a'b'\"c\" 'it'\\''s'", &argv, &err));
  EXPECT_EQ(argv, (std::vector<std::string>{"abc", "it's"}));
  ASSERT_TRUE(SplitCommand("   ", &argv, &err));
  EXPECT_TRUE(argv.empty());
  EXPECT_FALSE(SplitCommand("srv 'open", &argv, &err));
  EXPECT_NE(err.find("unbalanced '"), std::string::npos) << err;
  EXPECT_FALSE(SplitCommand("srv \"open", &argv, &err));
  EXPECT_NE(err.find("unbalanced \""), std::string::npos) << err;
  EXPECT_FALSE(SplitCommand("srv \\", &argv, &err));
}

TEST(Command, JoinRoundTrips) {
  std::vector<std::string> in = {"srv", "--save", "", "a b", "it's", "{dir}/x", "$HOME", "q\"x"};
  std::vector<std::string> out;
  std::string err;
  std::string joined = JoinCommand(in);
  ASSERT_TRUE(SplitCommand(joined, &out, &err)) << err;
  EXPECT_EQ(out, in) << joined;
  EXPECT_EQ(JoinCommand({"redis-server", "--port", "{port}"}), "redis-server --port {port}");
}

TEST(Command, ResolveExecutable) {
  std::string path, err;
  ASSERT_TRUE(ResolveExecutable("sh", &path, &err)) << err;
  EXPECT_EQ(path[0], '/');
  EXPECT_EQ(access(path.c_str(), X_OK), 0);
  EXPECT_FALSE(ResolveExecutable("lockstep-no-such-program", &path, &err));
  EXPECT_EQ(err, "server command 'lockstep-no-such-program' not found in PATH");
  EXPECT_FALSE(ResolveExecutable("/no/such/binary", &path, &err));
  EXPECT_EQ(err, "server command '/no/such/binary' does not exist");
  EXPECT_FALSE(ResolveExecutable("/etc", &path, &err));
  EXPECT_NE(err.find("is a directory"), std::string::npos) << err;
}

TEST(ServerProcess, EnvironmentDirectoryAndDescriptors) {
  TempDir t;
  std::string dir = t.path() + "/data/server";  // created by Start
  std::string log = t.path() + "/server.log";
  int keep[2], drop[2];
  ASSERT_EQ(pipe2(keep, O_CLOEXEC), 0);
  ASSERT_EQ(pipe(drop), 0);  // not CLOEXEC, but not kept: must be closed in the child
  // No $(...): the shell would hold a pipe open while it runs.
  std::string script =
      "echo fds; ls -v /proc/$$/fd; echo pid=$LOCKSTEP_SHIM_PID self=$$; "
      "echo preload=$LD_PRELOAD; echo foo=$FOO; echo cwd; pwd; echo stdin; "
      "readlink /proc/$$/fd/0; echo done";
  ServerProcess s;
  std::string err;
  ASSERT_TRUE(s.Start({"sh", "-c", script}, dir, log, {{"FOO", "bar baz"}}, {keep[1]}, &err))
      << err;
  std::string out = WaitFor(log, "done");
  std::string how;
  for (int i = 0; i < 400 && !s.Exited(&how); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(how, "exited with status 0");
  EXPECT_NE(out.find("pid=" + std::to_string(s.pid()) + " self=" + std::to_string(s.pid())),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(PreloadLibraryPath()), std::string::npos) << out;
  EXPECT_NE(out.find("foo=bar baz"), std::string::npos) << out;
  EXPECT_NE(out.find("cwd\n" + dir + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("fds\n0\n1\n2\n" + std::to_string(keep[1]) + "\npid="), std::string::npos)
      << out;
  EXPECT_NE(out.find("stdin\n/dev/null\n"), std::string::npos) << out;
  for (int fd : {keep[0], keep[1], drop[0], drop[1]}) close(fd);
}

TEST(ServerProcess, ExistingPreloadIsKeptFirst) {
  TempDir t;
  std::string log = t.path() + "/server.log";
  setenv("LD_PRELOAD", PreloadLibraryPath().c_str(), 1);  // anything loadable
  ServerProcess s;
  std::string err;
  bool ok = s.Start({"sh", "-c", "echo preload=$LD_PRELOAD"}, t.path(), log, {}, {}, &err);
  unsetenv("LD_PRELOAD");
  ASSERT_TRUE(ok) << err;
  std::string p = PreloadLibraryPath();
  // (An ASan build puts its runtime ahead of both: AddAsanRuntime in server.cc.)
  std::string out = WaitFor(log, "preload=");
#ifdef __SANITIZE_ADDRESS__
  EXPECT_NE(out.find(":" + p + ":" + p + "\n"), std::string::npos) << out;
#else
  EXPECT_NE(out.find("preload=" + p + ":" + p), std::string::npos) << out;
#endif
}

TEST(ServerProcess, ExecFailureIsReported) {
  TempDir t;
  std::string bad = t.path() + "/not-a-program";
  std::ofstream(bad) << "\x7f"
                     << "garbage";
  chmod(bad.c_str(), 0755);
  ServerProcess s;
  std::string err;
  EXPECT_FALSE(s.Start({bad}, t.path(), t.path() + "/log", {}, {}, &err));
  EXPECT_EQ(err, "cannot run " + bad + ": " + strerror(ENOEXEC));
  EXPECT_EQ(s.pid(), 0);
  EXPECT_FALSE(s.Start({"lockstep-no-such-program"}, t.path(), t.path() + "/log", {}, {}, &err));
  EXPECT_EQ(err, "server command 'lockstep-no-such-program' not found in PATH");
  EXPECT_FALSE(s.Start({"sh"}, t.path(), t.path() + "/log", {}, {999}, &err));
  EXPECT_NE(err.find("fd 999"), std::string::npos) << err;
}

TEST(ServerProcess, WaitReady) {
  TempDir t;
  int port;
  int lfd = Listen(&port);
  ServerProcess s;
  std::string err;
  ASSERT_TRUE(s.Start({"sleep", "100"}, t.path(), t.path() + "/log", {}, {}, &err)) << err;
  EXPECT_TRUE(s.WaitReady("127.0.0.1", port, 2000, &err)) << err;
  close(lfd);  // nobody listens there now
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(s.WaitReady("127.0.0.1", port, 200, &err));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_NE(err.find("is not listening on 127.0.0.1:" + std::to_string(port) + " after 200 ms"),
            std::string::npos)
      << err;
  s.Stop();
  std::string how;
  EXPECT_TRUE(s.Exited(&how));
  EXPECT_EQ(how, "killed by signal 15");
}

// A server that listens before it serves says so in its log (ready_log):
// listening alone is not ready then.
TEST(ServerProcess, WaitReadyForTheLogLine) {
  TempDir t;
  int port;
  int lfd = Listen(&port);
  ServerProcess s;
  std::string err;
  ASSERT_TRUE(s.Start({"sh", "-c", "echo starting; sleep 0.5; echo serving now; sleep 100"},
                      t.path(), t.path() + "/log", {}, {}, &err))
      << err;
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(s.WaitReady("127.0.0.1", port, 5000, &err, "serving now")) << err;
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(400));
  EXPECT_FALSE(s.WaitReady("127.0.0.1", port, 200, &err, "never said"));
  EXPECT_NE(err.find("listens on 127.0.0.1:" + std::to_string(port) +
                     " but its log has not said \"never said\" (the profile's ready_log) after "
                     "200 ms"),
            std::string::npos)
      << err;
  close(lfd);
  s.Stop();
}

TEST(ServerProcess, ExitBeforeListeningQuotesTheLog) {
  TempDir t;
  std::string log = t.path() + "/server.log";
  ServerProcess s;
  std::string err;
  ASSERT_TRUE(s.Start({"sh", "-c", "for i in 1 2 3 4 5 6 7; do echo line$i; done; exit 3"},
                      t.path(), log, {}, {}, &err))
      << err;
  EXPECT_FALSE(s.WaitReady("127.0.0.1", 1, 5000, &err));
  EXPECT_NE(err.find("server sh exited with status 3 before listening on 127.0.0.1:1"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("last lines of " + log + ":\n  line3\n  line4\n  line5\n  line6\n  line7"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("line2"), std::string::npos) << err;
}

TEST(ServerProcess, StopKillsTheGroupAndIgnoresTheCallersSignalMask) {
  TempDir t;
  std::string log = t.path() + "/server.log";
  // The daemon blocks SIGTERM (it reads it from a signalfd): the server must not inherit that.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  ServerProcess s;
  std::string err;
  bool ok = s.Start({"sh", "-c", "sleep 100 & echo child=$!; wait"}, t.path(), log, {}, {}, &err);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(ok) << err;
  std::string out = WaitFor(log, "child=");
  pid_t child = atoi(out.substr(out.find("child=") + 6).c_str());
  ASSERT_GT(child, 0);
  auto start = std::chrono::steady_clock::now();
  s.Stop();
  // Back as soon as the group is gone, not after the 3 s before SIGKILL.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2900));
  EXPECT_TRUE(Gone(s.pid()));
  EXPECT_TRUE(WaitGone(child));
  std::string how;
  EXPECT_TRUE(s.Exited(&how));
  EXPECT_EQ(how, "killed by signal 15");
}

TEST(ServerProcess, StopEscalatesToSigkill) {
  TempDir t;
  ServerProcess s;
  std::string err;
  ASSERT_TRUE(s.Start({"sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"}, t.path(),
                      t.path() + "/log", {}, {}, &err))
      << err;
  WaitFor(t.path() + "/log", "ready");
  auto start = std::chrono::steady_clock::now();
  s.Stop();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(2900));
  EXPECT_LT(took, std::chrono::seconds(20));  // SIGKILL after the 3 s, not a wait for ever
  std::string how;
  EXPECT_TRUE(s.Exited(&how));
  EXPECT_EQ(how, "killed by signal 9");
  EXPECT_TRUE(Gone(s.pid()));
}

// What checkpoints need (checkpoint/): the server is the init of its own pid
// namespace, leading its own session; its death takes its children along.
TEST(ServerProcess, OwnPidNamespace) {
  TempDir t;
  std::string log = t.path() + "/server.log";
  ServerProcess s;
  s.set_own_pid_namespace(true);
  std::string err;
  // ps without the preload: in an ASan build that holds the ASan runtime,
  // under which procps's ps hangs in textdomain().
  ASSERT_TRUE(s.Start(
      {"sh", "-c", "echo pid=$$ sid=$(env -u LD_PRELOAD ps -o sid= -p $$); sleep 100 & wait"},
      t.path(), log, {}, {}, &err))
      << err;
  ASSERT_TRUE(s.own_pid_namespace()) << "no new pid namespace (not root?)";
  std::string out = WaitFor(log, "sid=");
  EXPECT_NE(out.find("pid=1 "), std::string::npos) << out;
  char a[64] = "", b[64] = "";
  ASSERT_GT(readlink(("/proc/" + std::to_string(s.pid()) + "/ns/pid").c_str(), a, sizeof a - 1), 0);
  ASSERT_GT(readlink("/proc/self/ns/pid", b, sizeof b - 1), 0);
  EXPECT_STRNE(a, b);
  EXPECT_EQ(getsid(s.pid()), s.pid());
  s.Stop();  // the group's SIGTERM ends sleep; then sh, the init, exits
  std::string how;
  EXPECT_TRUE(s.Exited(&how));
  EXPECT_TRUE(Gone(s.pid()));
}

TEST(ServerProcess, DiesWithItsParent) {
  TempDir t;
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t helper = fork();
  if (helper == 0) {  // a stand-in daemon that dies without stopping its server
    ServerProcess s;
    std::string err;
    if (!s.Start({"sleep", "100"}, t.path(), t.path() + "/log", {}, {}, &err)) _exit(1);
    pid_t pid = s.pid();
    if (write(p[1], &pid, sizeof pid) != sizeof pid) _exit(1);
    _exit(0);
  }
  close(p[1]);
  pid_t server = 0;
  ASSERT_EQ(read(p[0], &server, sizeof server), static_cast<ssize_t>(sizeof server));
  close(p[0]);
  int st;
  waitpid(helper, &st, 0);
  EXPECT_TRUE(WaitGone(server));
}

}  // namespace
}  // namespace lockstep
