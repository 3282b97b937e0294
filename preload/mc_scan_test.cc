// mc_scan_test.cc — preload/mc_scan.h on its own: which client bytes are a
// memcached lease read, and which reply bytes a connection leaves unhashed,
// for request and reply streams cut at every possible place (the scanners
// must not care how the server's reads and sends chunk them).
#include "preload/mc_scan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

int Lease(const char* list, const std::string& bytes) {
  mc_list l{};
  EXPECT_EQ(mc_list_parse(&l, list), 0);
  return mc_lease_requests(&l, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

TEST(McList, TakesOnlyTheReadsItKnows) {
  mc_list l{};
  EXPECT_EQ(mc_list_parse(&l, "get, gets, mg"), 0);
  EXPECT_EQ(l.cmds, uint32_t{MC_CMD_GET | MC_CMD_GETS | MC_CMD_MG});
  EXPECT_EQ(mc_list_parse(&l, "get"), 0);
  EXPECT_EQ(l.cmds, uint32_t{MC_CMD_GET});
  for (const char* bad : {"get,", "get,,gets", "GET", "gat", "set", "get gets", "stats", ",get"}) {
    EXPECT_EQ(mc_list_parse(&l, bad), -1) << bad;
    EXPECT_EQ(l.cmds, 0u) << bad;
  }
}

TEST(McLease, WholeReadOnlyRequestsAreLeaseReads) {
  const char* all = "get, gets, mg";
  EXPECT_EQ(Lease(all, "get k\r\n"), 1);
  EXPECT_EQ(Lease(all, "get k\n"), 1);
  EXPECT_EQ(Lease(all, "gets a b c\r\n"), 1);
  EXPECT_EQ(Lease(all, "get a\r\nget b\r\nmg c v f t\r\nmg d k O123 s c b\r\n"), 4);
  EXPECT_EQ(Lease(all, "get " + std::string(250, 'k') + "\r\n"), 1);
  EXPECT_EQ(Lease("get", "gets k\r\n"), 0);  // not listed
  EXPECT_EQ(Lease("get", "mg k v\r\n"), 0);
}

TEST(McLease, AnythingElseGoesThroughTheLog) {
  const char* all = "get, gets, mg";
  // incomplete
  EXPECT_EQ(Lease(all, "get k"), 0);
  EXPECT_EQ(Lease(all, "get k\r"), 0);
  EXPECT_EQ(Lease(all, "get a\r\nget b"), 0);
  // mixed with a write, or a write alone
  EXPECT_EQ(Lease(all, "get a\r\nset a 0 0 1\r\nx\r\n"), 0);
  EXPECT_EQ(Lease(all, "set a 0 0 1\r\nx\r\nget a\r\n"), 0);
  EXPECT_EQ(Lease(all, "gat 10 k\r\n"), 0);
  EXPECT_EQ(Lease(all, "gats 10 k\r\n"), 0);
  EXPECT_EQ(Lease(all, "touch k 10\r\n"), 0);
  EXPECT_EQ(Lease(all, "incr k 1\r\n"), 0);
  // oversized: a key memcached refuses, a line longer than ours
  EXPECT_EQ(Lease(all, "get " + std::string(251, 'k') + "\r\n"), 0);
  std::string many = "get";
  while (many.size() <= MC_LINE) many += " key";
  EXPECT_EQ(Lease(all, many + "\r\n"), 0);
  // malformed
  EXPECT_EQ(Lease(all, "\r\n"), 0);
  EXPECT_EQ(Lease(all, "get\r\n"), 0);
  EXPECT_EQ(Lease(all, "get \r\n"), 0);
  EXPECT_EQ(Lease(all, "GET k\r\n"), 0);
  EXPECT_EQ(Lease(all, "get a\rb\r\n"), 0);
  EXPECT_EQ(Lease(all, std::string("\x80\x00\x00\x01", 4)), 0);
  // mg flags that write, stay quiet or report accesses
  for (const char* f : {"q", "T30", "N30", "E5", "I", "h", "l", "vv", "R30", "M"})
    EXPECT_EQ(Lease(all, std::string("mg k v ") + f + "\r\n"), 0) << f;
  EXPECT_EQ(Lease(all, "mg\r\n"), 0);
}

// A connection: what the server read (some bytes of it lease reads) and the
// reply bytes it leaves checked.
struct Conn {
  mc_in in{};
  mc_out out{};
  mc_queue queue{};
  uint64_t tail = 0;

  static int Push(void* ctx, uint64_t number) {
    auto* c = static_cast<Conn*>(ctx);
    if (c->tail - c->out.head >= MC_QUEUE) return 0;
    c->queue.at[c->tail++ % MC_QUEUE] = number;
    return 1;
  }
  void Read(const std::string& bytes, bool lease) {
    mc_scan_requests(lease, &in, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                     Push, this);
  }
  std::string Send(const std::string& bytes) {
    std::string kept;
    auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    size_t left = bytes.size();
    while (left > 0) {
      int skipped = 0;
      const char* form = nullptr;
      size_t run = mc_output_run(&out, &queue, tail, p, left, &skipped, &form);
      EXPECT_GT(run, 0u);
      if (!skipped) kept.append(reinterpret_cast<const char*>(p), run);
      if (form) kept += "<" + std::string(form, MC_CANON_LEN) + ">";
      p += run;
      left -= run;
    }
    return kept;
  }
};

struct Exchange {
  std::string request, reply;
  bool lease;
};

std::vector<Exchange> Session() {
  return {
      {"set k 0 0 5\r\nhello\r\n", "STORED\r\n", false},
      {"get k\r\n", "VALUE k 0 5\r\nhello\r\nEND\r\n", true},
      {"get nope\r\n", "END\r\n", true},
      {"set bin 7 0 4\r\n\r\nEN\r\n", "STORED\r\n", false},  // a value that looks like lines
      {"gets k bin\r\n", "VALUE k 0 5 1\r\nhello\r\nVALUE bin 7 4 2\r\n\r\nEN\r\nEND\r\n", true},
      {"incr n 1\r\n", "NOT_FOUND\r\n", false},
      {"mg k v f t\r\n", "VA 5 f0 t-1\r\nhello\r\n", true},
      {"mg nope v\r\n", "EN\r\n", true},
      {"mg k\r\n", "HD\r\n", true},
      {"cas k 0 0 2 1\r\nhi\r\n", "STORED\r\n", false},
      {"get k\r\n", "VALUE k 0 2\r\nhi\r\nEND\r\n", false},  // through the log: checked
      {"stats\r\n", "STAT pid 1\r\nSTAT uptime 5\r\nEND\r\n", false},
      {"delete k\r\n", "DELETED\r\n", false},
      {"get " + std::string(251, 'x') + "\r\n", "CLIENT_ERROR bad command line format\r\n", true},
      {"version\r\n", "VERSION 1.6.21\r\n", false},
      {"set e 0 -1 0\r\n\r\n", "STORED\r\n", false},
      {"md e\r\n", "HD\r\n", false},
      {"mn\r\n", "MN\r\n", false},
  };
}

std::string Checked(const std::vector<Exchange>& s) {
  std::string kept;
  for (const auto& e : s)
    if (!e.lease) kept += e.reply;
  return kept;
}

TEST(McScan, LeaseRepliesAreLeftOutWhereverTheStreamsAreCut) {
  const auto session = Session();
  const std::string want = Checked(session);
  std::string replies;
  for (const auto& e : session) replies += e.reply;
  // Requests read one exchange at a time (a lease read is its own read);
  // all replies sent at the end, cut at every place into two sends.
  for (size_t cut = 0; cut <= replies.size(); cut++) {
    Conn c;
    for (const auto& e : session) c.Read(e.request, e.lease);
    ASSERT_NE(c.in.state, MC_IN_OFF);
    std::string kept = c.Send(replies.substr(0, cut));
    kept += c.Send(replies.substr(cut));
    ASSERT_EQ(kept, want) << "cut at " << cut;
  }
  // Each request's reply sent before the next is read, requests in
  // single bytes (a non-lease one may arrive in any pieces).
  Conn c;
  std::string kept;
  for (const auto& e : session) {
    if (e.lease) {
      c.Read(e.request, true);
    } else {
      for (char b : e.request) c.Read(std::string(1, b), false);
    }
    for (char b : e.reply) kept += c.Send(std::string(1, b));
  }
  EXPECT_EQ(kept, want);
  EXPECT_EQ(c.in.requests, session.size());
}

TEST(McScan, UncertainRequestsEndTheScanning) {
  for (const char* req :
       {"set k 0 0 1 noreply\r\nx\r\n", "delete k noreply\r\n", "mg k v q\r\n", "mg k q v\r\n",
        "ms k 1\r\nx\r\n", "set k 0 0\r\n", "set k x 0 1\r\nx\r\n", "set k 0 0 1\r\nxy\r\n",
        "stats cachedump 1\r\n", "watch\r\n", "quit\r\n", "\r\n", "lru_crawler metadump all\r\n",
        "get a\rb\r\n", "\x80\x01"}) {
    Conn c;
    c.Read(req, false);
    EXPECT_EQ(c.in.state, MC_IN_OFF) << req;
    // and no lease read is recognised after it by the shim (it checks the state)
  }
  Conn c;
  std::string setline = "set " + std::string(251, 'k') + " 0 0 1\r\nx\r\n";
  c.Read(setline, false);
  EXPECT_EQ(c.in.state, MC_IN_OFF);
  Conn d;
  d.Read("get k\r\n", false);
  EXPECT_EQ(d.in.state, MC_IN_START);
}

TEST(McScan, AFullQueueEndsTheScanning) {
  Conn c;
  for (int i = 0; i < MC_QUEUE; i++) c.Read("get k\r\n", true);
  EXPECT_EQ(c.in.state, MC_IN_START);
  c.Read("get k\r\n", true);
  EXPECT_EQ(c.in.state, MC_IN_OFF);
}

// stats cachedump lists items in LRU order, which lease reads move on the
// leader only: its reply is compared as a sum over its lines.
TEST(McScan, ACachedumpComparesItsItemsInAnyOrder) {
  auto checked = [](const std::string& items, bool lease_before) {
    Conn c;
    if (lease_before) c.Read("get a\r\n", true);
    EXPECT_FALSE(c.in.no_lease);
    c.Read("stats cachedump 1 0\r\nstats cachedump 2 0\r\nget b\r\n", false);
    EXPECT_EQ(c.in.state, MC_IN_START);
    EXPECT_TRUE(c.in.no_lease);  // the state probe's connection: its reads through the log
    std::string replies = (lease_before ? "VALUE a 0 1\r\nx\r\nEND\r\n" : "") + items +
                          "END\r\nCLIENT_ERROR no\r\nVALUE b 0 1\r\ny\r\nEND\r\n";
    std::string kept;
    for (char b : replies) kept += c.Send(std::string(1, b));
    return kept;
  };
  const std::string ab = "ITEM a [1 b; 0 s]\r\nITEM b [1 b; 0 s]\r\n";
  const std::string ba = "ITEM b [1 b; 0 s]\r\nITEM a [1 b; 0 s]\r\n";
  std::string kept = checked(ab, false);
  EXPECT_EQ(kept, checked(ba, true));  // the lease read's reply left out, the order free
  const std::string get_b = "VALUE b 0 1\r\ny\r\nEND\r\n";  // checked as it is
  EXPECT_EQ(kept.size(), 2 * (MC_CANON_LEN + 2) + get_b.size());
  EXPECT_EQ(kept.substr(kept.size() - get_b.size()), get_b);
  EXPECT_NE(kept, checked("ITEM a [1 b; 0 s]\r\nITEM c [1 b; 0 s]\r\n", false));
  EXPECT_NE(kept, checked("ITEM a [1 b; 0 s]\r\n", false));
  EXPECT_NE(kept, checked("ITEM a [2 b; 0 s]\r\nITEM b [1 b; 0 s]\r\n", false));
}

TEST(McScan, UnknownRepliesAreCheckedInFull) {
  Conn c;
  c.Read("stats\r\n", false);
  c.Read("get k\r\n", true);
  // a line inside STAT lines that is none of memcached's: checked from there on
  std::string odd = "STAT a 1\r\nWHAT\r\nEND\r\nEND\r\n";
  EXPECT_EQ(c.Send(odd), odd);
  EXPECT_EQ(c.out.state, MC_OUT_OFF);
}

}  // namespace
