// resp_scan_test.cc — preload/resp_scan.h on its own: which reply bytes a
// connection leaves unchecked, for request and reply streams cut at every
// possible place (the scanners must not care how the server's reads and
// sends chunk them).
#include "preload/resp_scan.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Conn {
  resp_list list{};
  resp_in in{};
  resp_out out{};
  resp_queue queue{};
  uint64_t tail = 0;
  bool full = false;

  explicit Conn(const char* unchecked) { EXPECT_EQ(resp_list_parse(&list, unchecked), 0); }

  static int Push(void* ctx, uint64_t number) {
    auto* c = static_cast<Conn*>(ctx);
    if (c->tail - c->out.head >= RESP_QUEUE) {
      c->full = true;
      return 0;
    }
    c->queue.at[c->tail++ % RESP_QUEUE] = number;
    return 1;
  }
  void Read(const std::string& bytes) {
    resp_scan_requests(&list, &in, reinterpret_cast<const unsigned char*>(bytes.data()),
                       bytes.size(), Push, this);
  }
  // The checked bytes of what the server sent.
  std::string Send(const std::string& bytes) {
    std::string kept;
    auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    size_t left = bytes.size();
    while (left > 0) {
      int skipped = 0;
      size_t run = resp_output_run(&out, &queue, tail, p, left, &skipped);
      EXPECT_GT(run, 0u);
      if (!skipped) kept.append(reinterpret_cast<const char*>(p), run);
      p += run;
      left -= run;
    }
    return kept;
  }
};

// A request, the server's reply, and whether that reply is left unchecked.
struct Exchange {
  std::string request, reply;
  bool unchecked;
};

std::string Multibulk(const std::vector<std::string>& args) {
  std::string s = "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& a : args) s += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return s;
}

std::string Bulk(const std::string& s, char type = '$') {
  return type + std::to_string(s.size()) + "\r\n" + s + "\r\n";
}

const std::string kInfo = Bulk("# Server\r\nprocess_id:4242\r\nuptime:17\r\n");

std::vector<Exchange> Session() {
  return {
      {Multibulk({"SET", "k", "v"}), "+OK\r\n", false},
      {Multibulk({"info"}), kInfo, true},
      {Multibulk({"GET", "k"}), "$1\r\nv\r\n", false},
      {Multibulk({"INFO", "server"}), kInfo, true},
      {Multibulk({"CLIENT", "LIST"}), Bulk("id=3 addr=127.0.0.1:5 fd=8\r\n"), true},
      {Multibulk({"CLIENT", "ID"}), ":3\r\n", false},  // only CLIENT LIST is listed
      {"PING\r\n", "+PONG\r\n", false},                // inline
      {"info  memory\r\n", kInfo, true},               // inline, two spaces
      {Multibulk({"LRANGE", "l", "0", "-1"}), "*3\r\n$1\r\na\r\n*-1\r\n:7\r\n", false},
      {Multibulk({"GET", "missing"}), "$-1\r\n", false},
      {Multibulk({"HELLO", "3"}), "%2\r\n+server\r\n$5\r\nredis\r\n+proto\r\n:3\r\n", false},
      {Multibulk({"INFO"}), Bulk("txt:uptime:17\r\n", '='), true},  // RESP3 verbatim
      {Multibulk({"MULTI"}), "+OK\r\n", false},
      {Multibulk({"INFO"}), "+QUEUED\r\n", false},
      {Multibulk({"SET", "a", "1"}), "+QUEUED\r\n", false},
      {Multibulk({"EXEC"}), "*2\r\n" + kInfo + "+OK\r\n", true},  // holds INFO's reply
      {Multibulk({"MULTI"}), "+OK\r\n", false},
      {Multibulk({"SET", "a", "2"}), "+QUEUED\r\n", false},
      {Multibulk({"EXEC"}), "*1\r\n+OK\r\n", false},
      {Multibulk({"X"}), "|1\r\n+key\r\n:1\r\n_\r\n", false},  // an attribute, then a null
      {Multibulk({"MEMORY", "STATS"}), "%1\r\n+peak\r\n*2\r\n:1\r\n#t\r\n", true},
      {Multibulk({"ECHO", "INFO"}), "$4\r\nINFO\r\n", false},  // an argument, not the command
      {"*0\r\n\r\n", "", false},  // no command (and an empty inline line): no reply
      {Multibulk({"SET", std::string(70000, 'x'), "y"}), "+OK\r\n", false},
  };
}

std::string Expected(const std::vector<Exchange>& session) {
  std::string kept;
  for (const auto& e : session)
    if (!e.unchecked) kept += e.reply;
  return kept;
}

TEST(RespScan, ListParsesAndRefusesWhatItShould) {
  resp_list l;
  EXPECT_EQ(resp_list_parse(&l, "INFO, client list ,MEMORY"), 0);
  ASSERT_EQ(l.count, 3u);
  EXPECT_STREQ(l.cmd[1].word[0], "CLIENT");
  EXPECT_STREQ(l.cmd[1].word[1], "LIST");
  EXPECT_EQ(l.cmd[1].words, 2);
  for (const char* bad : {"", "INFO,", ",INFO", "INFO,,X", "A B C", "IN\"FO", "INFO;CLIENT",
                          "AAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}) {
    EXPECT_EQ(resp_list_parse(&l, bad), bad[0] ? -1 : 0) << bad;
    EXPECT_EQ(l.count, 0u) << bad;
  }
}

TEST(RespScan, LeavesOutExactlyTheUncheckedReplies) {
  Conn c("INFO, CLIENT LIST, MEMORY");
  auto session = Session();
  std::string kept;
  for (const auto& e : session) {  // one request at a time, answered
    c.Read(e.request);
    kept += c.Send(e.reply);
  }
  EXPECT_EQ(kept, Expected(session));
  EXPECT_FALSE(c.full);
}

TEST(RespScan, HowTheStreamsAreCutChangesNothing) {
  auto session = Session();
  std::string requests, replies;
  for (const auto& e : session) requests += e.request, replies += e.reply;
  std::mt19937 rng(7);
  for (int round = 0; round < 300; round++) {
    Conn c("INFO,CLIENT LIST,MEMORY");
    // Pipelined: every request read (in random pieces), then every reply
    // sent (in random pieces); or one byte at a time.
    size_t at = 0;
    while (at < requests.size()) {
      size_t n = round == 0 ? 1 : 1 + rng() % 64;
      c.Read(requests.substr(at, n));
      at += n;
    }
    std::string kept;
    at = 0;
    while (at < replies.size()) {
      size_t n = round == 0 ? 1 : 1 + rng() % 64;
      kept += c.Send(replies.substr(at, n));
      at += n;
    }
    ASSERT_EQ(kept, Expected(session)) << "round " << round;
  }
}

TEST(RespScan, NothingIsLeftOutWithoutAList) {
  Conn c("");
  auto session = Session();
  std::string all, kept;
  for (const auto& e : session) {
    c.Read(e.request);
    kept += c.Send(e.reply);
    all += e.reply;
  }
  EXPECT_EQ(kept, all);
}

TEST(RespScan, SubscribeEndsTheSkipping) {
  // After SUBSCRIBE, replies no longer answer requests one to one (a
  // message may come at any time): from there on everything is checked.
  Conn c("INFO");
  c.Read(Multibulk({"INFO"}));
  EXPECT_EQ(c.Send(kInfo), "");
  c.Read(Multibulk({"SUBSCRIBE", "a", "b"}));
  std::string subs =
      "*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n";
  EXPECT_EQ(c.Send(subs), subs);
  c.Read(Multibulk({"INFO"}));
  EXPECT_EQ(c.Send(kInfo), kInfo);
  EXPECT_EQ(c.in.state, RESP_IN_OFF);
}

TEST(RespScan, NotRespIsCheckedInFull) {
  Conn c("INFO");
  c.Read(Multibulk({"INFO"}));
  std::string odd = "HTTP/1.1 200 OK\r\n\r\n";
  EXPECT_EQ(c.Send(odd), odd);
  EXPECT_EQ(c.Send(kInfo), kInfo);  // the reply scanner gave up for good
  Conn d("INFO");
  d.Read("*1\r\n!4\r\nINFO\r\n");  // a malformed request: redis closes
  EXPECT_EQ(d.in.state, RESP_IN_OFF);
  EXPECT_EQ(d.Send(kInfo), kInfo);
}

TEST(RespScan, AFullQueueEndsTheSkippingAfterWhatItHolds) {
  Conn c("INFO");
  std::string requests, replies, expected;
  for (int i = 0; i < RESP_QUEUE + 5; i++) {
    requests += Multibulk({"INFO"});
    replies += kInfo;
    if (i >= RESP_QUEUE) expected += kInfo;
  }
  c.Read(requests);
  EXPECT_TRUE(c.full);
  EXPECT_EQ(c.Send(replies), expected);
}

TEST(RespScan, PushesAreNotReplies) {
  // A RESP3 push (client tracking) between replies is checked and does not
  // move the reply count.
  Conn c("INFO");
  c.Read(Multibulk({"GET", "k"}) + Multibulk({"INFO"}));
  std::string push = ">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n";
  EXPECT_EQ(c.Send("$1\r\nv\r\n" + push + kInfo), "$1\r\nv\r\n" + push);
}

}  // namespace
