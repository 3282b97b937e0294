// shim_input_test.cc — a leader's client inputs under the real preload shim
// and a real redis: the test plays the leader's daemon (shim_test_harness.h)
// and decides each input's outcome itself, in the orders a daemon that loses
// its leadership meets them.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "guard/server/shim_test_harness.h"

namespace lockstep::shim_test {
namespace {

// redis under a leader's shim whose inputs wait for the test's outcome, one
// client connection (conn, fd), and on it "SET a 1" then "SET b 2", held in
// two inputs (held).
struct TwoSetsHeld {
  Harness h;
  uint32_t conn = 0;
  int fd = -1;
  std::vector<Harness::HeldInput> held;

  void Start() {
    std::string err;
    ASSERT_TRUE(h.Start(kRedis, {.leader = true, .hold_data = true}, &err)) << err;
    fd = h.Connect(&conn);
    ASSERT_GE(fd, 0);
    SendAll(fd, Resp({"SET", "a", "1"}));
    ASSERT_TRUE(h.WaitHeld(1, &held));
    SendAll(fd, Resp({"SET", "b", "2"}));
    ASSERT_TRUE(h.WaitHeld(2, &held));
    ASSERT_EQ(held.size(), 2u);
    EXPECT_EQ(held[0].bytes, Resp({"SET", "a", "1"}));
    EXPECT_EQ(held[1].bytes, Resp({"SET", "b", "2"}));
  }
};

// A leader proposed a client's SET; before it was agreed the leadership
// moved, and the client's next SET, submitted meanwhile, was refused at
// once (the daemon no longer leads). The first SET was then agreed under
// the new leader: every backup's redis executes it, so this one must too.
// The shim used to deliver nothing past the refusal, this input included:
// the old leader's redis missed a SET the others had (a state check after
// an election found its reply stream 5 bytes short).
TEST(ShimInput, AnInputAgreedAfterALaterOneWasRefusedIsRead) {
  TwoSetsHeld t;
  ASSERT_NO_FATAL_FAILURE(t.Start());
  t.h.Complete(LS_DONE_DROPPED, t.held[1]);
  t.h.Complete(LS_DONE_COMMITTED, t.held[0]);
  std::string reply;
  EXPECT_TRUE(ReadUntil(t.fd, &reply, [](const std::string& b) { return RespReplies(b) >= 1; }))
      << "the agreed SET was never read by the server: " << reply;
  EXPECT_EQ(reply, "+OK\r\n");
  EXPECT_EQ(t.h.channel_error(), "");
  close(t.fd);
}

// A client pipelined two SETs and reset its connection before either was
// agreed. The first is agreed and executed; its reply's send fails (the
// client is gone). The second is agreed too, before the CLOSE the reset
// became: every backup's redis executes it, its replay connection still
// open. The leader's redis used to learn of the failed send and free the
// connection at once, never reading the second SET: a key the backups held
// and the leader did not. It must be told the send succeeded, and read on
// until EOF, as the backups' servers do.
TEST(ShimInput, AServerWhoseClientLeftReadsWhatWasAgreedBeforeItsClose) {
  TwoSetsHeld t;
  ASSERT_NO_FATAL_FAILURE(t.Start());
  linger reset{1, 0};  // close with a reset: the server's sends fail from here on
  ASSERT_EQ(setsockopt(t.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
  close(t.fd);
  t.h.Complete(LS_DONE_COMMITTED, t.held[0]);
  // Its reply was counted (a failed send's bytes enter the stream as if sent).
  ASSERT_TRUE(t.h.WaitRecord(t.conn, 5));
  t.h.Complete(LS_DONE_COMMITTED, t.held[1]);
  // Both replies, then the close: the stream the backups' servers send too.
  EXPECT_TRUE(t.h.WaitRecord(t.conn, 10, LS_OUT_CLOSED)) << "the second SET's reply never came";
  uint32_t reader_conn = 0;
  int reader = t.h.Connect(&reader_conn);
  SendAll(reader, Resp({"GET", "b"}));
  ASSERT_TRUE(t.h.WaitHeld(3, &t.held));
  t.h.Complete(LS_DONE_COMMITTED, t.held[2]);
  std::string reply;
  EXPECT_TRUE(ReadUntil(reader, &reply, [](const std::string& b) { return RespReplies(b) >= 1; }));
  EXPECT_EQ(reply, "$1\r\n2\r\n") << "the SET agreed before the client's close never ran";
  EXPECT_EQ(t.h.channel_error(), "");
  close(reader);
}

// A client that reads the start of a large reply and resets, with nothing
// more agreed on its connection: the server's next send fails for real (its
// EOF is due, nothing more will come), and the stream ends past the cut with
// that send's bytes, the reply's as the backups' servers send it.
TEST(ShimInput, AReplyWhoseClientLeftEndsWithTheFailedSendsBytes) {
  Harness h;
  std::string err;
  // apps/redis.toml's replies left unchecked: the stream is parsed as RESP.
  ASSERT_TRUE(h.Start(kRedis, {.leader = true, .unchecked_replies = "INFO, CLIENT LIST"}, &err))
      << err;
  uint32_t writer_conn = 0;
  int writer = h.Connect(&writer_conn);
  const std::string value = Pattern(8 << 20, 7);
  SendAll(writer, Resp({"SET", "big", value}));
  std::string ok;
  ASSERT_TRUE(ReadUntil(writer, &ok, [](const std::string& b) { return RespReplies(b) >= 1; }));
  uint32_t conn = 0;
  int fd = h.Connect(&conn);
  int small = 4096;  // a small receive buffer: the reply cannot fit in the kernel
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  SendAll(fd, Resp({"GET", "big"}));
  char some[1000];
  ASSERT_GT(read(fd, some, sizeof some), 0);
  linger reset{1, 0};
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
  close(fd);
  ASSERT_TRUE(h.WaitRecord(conn, 1, LS_OUT_CLOSED)) << "the server never closed the connection";
  const std::string whole = "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
  uint64_t cut_at = 0, end = 0, end_digest = 0;
  for (const auto& d : h.Records(conn)) {
    if (d.flags & LS_OUT_CUT) cut_at = d.offset;
    if (d.flags & LS_OUT_CLOSED) end = d.offset, end_digest = d.digest;
  }
  EXPECT_GT(cut_at, 0u) << "no cut";
  EXPECT_GE(end, cut_at);
  ASSERT_LE(end, whole.size());
  EXPECT_EQ(end_digest, Xxh64(std::string_view(whole).substr(0, end)));
  EXPECT_EQ(h.channel_error(), "");
  close(writer);
}

// Sixteen connections' inputs agreed at once: epoll tells redis of all of
// them in one wait (shim_wait.c, tell_next_runs), but each is read only in
// its turn, so redis executes them in the log's order (the order they were
// held), whatever order their outcomes came in. INCR of one key shows the
// order: the i-th input agreed must see i.
TEST(ShimInput, InputsAgreedTogetherExecuteInTheLogsOrder) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = true, .hold_data = true}, &err)) << err;
  constexpr int kConns = 16;
  std::map<uint32_t, int> fd_of;  // shim connection number -> our socket
  for (int i = 0; i < kConns; i++) {
    uint32_t conn = 0;
    int fd = h.Connect(&conn);
    ASSERT_GE(fd, 0);
    fd_of[conn] = fd;
  }
  for (auto [conn, fd] : fd_of) SendAll(fd, Resp({"INCR", "n"}));
  std::vector<Harness::HeldInput> held;
  ASSERT_TRUE(h.WaitHeld(kConns, &held));
  ASSERT_EQ(held.size(), size_t{kConns});
  for (int i = kConns - 1; i >= 0; i--) h.Complete(LS_DONE_COMMITTED, held[i]);
  for (int i = 0; i < kConns; i++) {
    std::string reply;
    EXPECT_TRUE(ReadUntil(fd_of[held[i].conn], &reply,
                          [](const std::string& b) { return RespReplies(b) >= 1; }));
    EXPECT_EQ(reply, ":" + std::to_string(i + 1) + "\r\n")
        << "the input agreed " << i + 1 << "th did not execute " << i + 1 << "th";
  }
  EXPECT_EQ(h.channel_error(), "");
  for (auto [conn, fd] : fd_of) close(fd);
}

}  // namespace
}  // namespace lockstep::shim_test
