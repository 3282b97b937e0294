// shim_replay_test.cc — the reuse of a backup's replay slots, with real
// servers under the real preload shim (redis, and a small Python server that
// shuts a connection down and closes it only later): the test plays the
// backup's daemon (shim_test_harness.h), releases a replay slot when the
// server closed its connection, claims it again from the same local port, and
// checks that the next connection gets its first input; and that a thread
// waiting in poll wakes for its turn, not for bytes not yet ordered.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "guard/server/shim_test_harness.h"

namespace lockstep::shim_test {
namespace {

// A backup's server closes a replay connection after its reply (QUIT); the
// daemon releases the slot and claims it again for the next connection,
// from the same local port (the kernel hands out recently freed ports), and
// orders that connection's first input before the server accepted it. The
// shim used to tell the closed connection's leftover records by port, so it
// dropped this input as the closed one's: the server then read EOF first
// (gerbera under load answered 400 where the leader answered 200).
TEST(ShimReplay, SlotClaimedAgainFromTheSamePortGetsItsInput) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = false}, &err)) << err;
  Harness::Replay first = h.ConnectReplay();
  int port = LocalPort(first.fd);
  h.ReplayInput(first, Resp({"QUIT"}));
  std::string got;
  EXPECT_FALSE(ReadUntil(first.fd, &got, [](const std::string&) { return false; }));  // EOF
  EXPECT_EQ(got, "+OK\r\n");
  h.ReleaseReplay(&first);
  Harness::Replay next = h.ConnectReplayFrom(port, Resp({"PING"}));
  EXPECT_EQ(next.slot, first.slot);  // the same slot, the same port: only the claim differs
  std::string reply;
  EXPECT_TRUE(ReadUntil(next.fd, &reply, [](const std::string& b) { return RespReplies(b) == 1; }))
      << "no reply to the new connection's first input: " << reply;
  EXPECT_EQ(reply, "+PONG\r\n");
  EXPECT_EQ(h.channel_error(), "");
  close(next.fd);
}

// The same, with a server that shuts a connection down and closes it only
// later (libupnp: shutdown, then close): the daemon sees EOF at the
// shutdown, releases the slot and claims it again before the close. The
// shim gave the next connection's first input, ordered meanwhile, to the
// connection still open under the slot; and at the close it took the slot's
// new claim for the closed connection's, which dropped that input too.
const char kShutdownLaterServer[] = R"PY(
import select, socket, sys, time
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(16)
idle, _ = ls.accept()  # held open and watched: a wait on it looks at the order ring
while True:
    c, _ = ls.accept()
    line = b""
    while not line.endswith(b"\n"):
        got = c.recv(100)
        if not got:
            break
        line += got
    if line == b"quit\n":
        c.sendall(b"bye\n")
        c.shutdown(socket.SHUT_RDWR)
        for _ in range(10):
            select.select([idle], [], [], 0.05)
        c.close()
        select.select([idle], [], [], 0.05)
    elif line == b"ping\n":
        c.sendall(b"pong\n")
)PY";

TEST(ShimReplay, SlotClaimedAgainBeforeTheServerClosedGetsItsInput) {
  Harness h;
  { std::ofstream(h.dir() + "/server.py") << kShutdownLaterServer; }
  std::string err;
  ASSERT_TRUE(h.Start({"/usr/bin/python3", "{dir}/server.py", "{port}"}, {.leader = false}, &err))
      << err;
  Harness::Replay idle = h.ConnectReplay();
  Harness::Replay first = h.ConnectReplay();
  int port = LocalPort(first.fd);
  h.ReplayInput(first, "quit\n");
  std::string got;
  EXPECT_FALSE(ReadUntil(first.fd, &got, [](const std::string&) { return false; }));  // EOF
  EXPECT_EQ(got, "bye\n");
  h.ReleaseReplay(&first);  // within the server's 0.5 s between shutdown and close
  Harness::Replay next = h.ConnectReplayFrom(port, "ping\n");
  EXPECT_EQ(next.slot, first.slot);
  std::string reply;
  EXPECT_TRUE(ReadUntil(next.fd, &reply, [](const std::string& b) { return b.size() >= 5; }))
      << "no reply to the new connection's first input: " << reply;
  EXPECT_EQ(reply, "pong\n");
  EXPECT_EQ(h.channel_error(), "");
  close(next.fd);
  close(idle.fd);
}

// The reply gate with a reply that differs: the leader's server had sent 60
// bytes on the connection when GET came (its SPOP popped a longer member,
// say), this backup's sends "+OK\r\n" to the input before. The gate waits
// for output the server never sends; it used to hold GET for its whole
// 5 s, and every later input behind it (a divergent backup crawled, and the
// replay of its repair did too). It opens once the server has answered the
// input before and stays quiet there: ~0.1 s.
TEST(ShimReplay, AShorterReplyOpensTheReplyGateWithoutWaitingItsFiveSeconds) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = false}, &err)) << err;
  Harness::Replay r = h.ConnectReplay();
  h.ReplayInput(r, Resp({"SET", "a", "1"}));
  Clock::time_point start = Clock::now();
  h.ReplayInput(r, Resp({"GET", "a"}), 60);
  std::string got;
  EXPECT_TRUE(ReadUntil(r.fd, &got, [](const std::string& b) { return RespReplies(b) == 2; }))
      << got;
  double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(got, "+OK\r\n$1\r\n1\r\n");
  // Far below the 5 s a gate waits for a server that never answered (a VM
  // pause of up to a second fits in between).
  EXPECT_LT(waited, 3.0) << "GET waited behind the reply gate";
  EXPECT_EQ(h.channel_error(), "");
  close(r.fd);
}

// A backup's server thread waiting in poll for its replay connection, with
// POLLIN and POLLPRI as MariaDB asks: bytes the daemon sends before it
// orders them must not wake it (whoever drains the order takes them from the
// kernel; the thread wakes for its turn). They woke it once per send, since
// arriving bytes raise POLLPRI's wake-up too: a MariaDB backup's threads
// woke 0.6 times per statement for nothing. The server counts its own
// voluntary context switches; 100 unordered sends 3 ms apart cost it a
// handful at most (the 10 s poll's wake-ups for the two orders), not 100.
const char kPollCountingServer[] = R"PY(
import select, socket, sys
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(4)
c, _ = ls.accept()
c.setblocking(False)
p = select.poll()
p.register(c, select.POLLIN | select.POLLPRI)
def switches():
    with open("/proc/thread-self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches"))
buf = b""
while True:
    if not p.poll(10000):
        continue
    try:
        got = c.recv(4096)
    except BlockingIOError:
        continue
    if not got:
        break
    buf += got
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        if line == b"count":
            c.sendall(b"%d\n" % switches())
)PY";

TEST(ShimReplay, BytesNotYetOrderedDoNotWakeAThreadInPoll) {
  Harness h;
  { std::ofstream(h.dir() + "/server.py") << kPollCountingServer; }
  std::string err;
  ASSERT_TRUE(h.Start({"/usr/bin/python3", "{dir}/server.py", "{port}"}, {.leader = false}, &err))
      << err;
  Harness::Replay r = h.ConnectReplay();
  auto count = [&](std::string* got) {
    size_t had = got->size();
    return ReadUntil(r.fd, got,
                     [had](const std::string& b) { return b.size() > had && b.back() == '\n'; });
  };
  std::string got;
  h.ReplayInput(r, "count\n");
  ASSERT_TRUE(count(&got)) << got;
  long before = std::stol(got);
  constexpr int kSends = 100;
  for (int i = 0; i < kSends; i++) {
    SendAll(r.fd, i + 1 < kSends ? "x" : "\n");
    usleep(3000);
  }
  h.OrderInput(r, kSends);  // the server may read them now
  h.ReplayInput(r, "count\n");
  std::string second;
  ASSERT_TRUE(count(&second)) << second;
  long after = std::stol(second);
  EXPECT_LT(after - before, kSends / 4)
      << "the server's thread woke " << after - before << " times while " << kSends
      << " sends it could not read yet arrived";
  EXPECT_EQ(h.channel_error(), "");
  close(r.fd);
}

}  // namespace
}  // namespace lockstep::shim_test
