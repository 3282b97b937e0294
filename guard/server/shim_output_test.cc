// shim_output_test.cc — the output side of the preload shim, with real
// servers under the real shim (build/lib/liblockstep_preload.so): redis,
// memcached with 4 worker threads, and a small Python server that sends with
// every call the shim wraps (write, send, sendto, sendmsg, writev, sendfile
// with and without an offset, shutdown). The test plays the daemon through
// ShimChannel (shim_test_harness.h): on a leader it commits every input at
// once, on a backup it replays inputs over replay connections in order; it
// reads the digests with PollOutput and the windows with RecentOutput, and
// checks them against the bytes its own clients received, hashed here by a
// one-shot XXH64 written independently of preload/stream_hash.h (the
// harness's Xxh64, itself checked against published vectors below). The
// replay slots' reuse is shim_replay_test.cc's.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "guard/server/shim_channel.h"
#include "guard/server/shim_test_harness.h"
#include "guard/server/symbolize.h"
#include "preload/stream_hash.h"

namespace lockstep::shim_test {
namespace {

// ------------------------------------------------------------ reference hash

TEST(StreamHash, IsXxh64WhateverTheChunking) {
  // Published XXH64 vectors (the low 32 bits are also zstd's frame checksums).
  EXPECT_EQ(Xxh64(""), 0xef46db3751d8e999ull);
  EXPECT_EQ(Xxh64("a"), 0xd24ec4f1a98c6e5bull);
  EXPECT_EQ(Xxh64("abc"), 0x44bc2cf5ad770999ull);
  std::string data;
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 5000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    data.push_back(static_cast<char>(x));
  }
  for (int chunking = 1; chunking <= 70; chunking += 3) {
    ls_stream_hash h;
    ls_stream_hash_init(&h);
    size_t at = 0, step = 0;
    while (at < data.size()) {
      size_t n = std::min(data.size() - at, (step++ * 7919 + chunking) % (chunking + 40));
      ls_stream_hash_update(&h, data.data() + at, n);
      at += n;
      // A digest at any offset, and the stream goes on unchanged.
      ASSERT_EQ(ls_stream_hash_digest(&h), Xxh64(std::string_view(data).substr(0, at)))
          << "chunking " << chunking << " at " << at;
    }
  }
}

// ------------------------------------------------------------ records

// Every record of a stream is the XXH64 of the bytes received up to its
// offset, in stream order; returns the offsets.
std::vector<uint64_t> CheckRecords(const std::vector<OutputDigest>& recs,
                                   const std::string& received) {
  std::vector<uint64_t> offsets;
  uint64_t last = 0;
  for (const auto& d : recs) {
    EXPECT_TRUE(d.usable()) << d.offset;
    EXPECT_LE(d.offset, received.size());
    EXPECT_GE(d.offset, last);
    if (d.offset > received.size()) break;
    EXPECT_EQ(d.digest, Xxh64(std::string_view(received).substr(0, d.offset)))
        << "at offset " << d.offset;
    EXPECT_EQ((d.flags & LS_OUT_MARK) != 0,
              d.offset > 0 && d.offset % ShimChannel::kOutputMarkBytes == 0)
        << d.offset;
    last = d.offset;
    offsets.push_back(d.offset);
  }
  return offsets;
}

// ------------------------------------------------------------ redis

// The same inputs, one by one to a leader's client connection and pipelined
// into a backup's replay connection: the records fall at different offsets,
// and wherever both have one the digests agree (each is the hash of the
// bytes the client got up to there); the marks are at the same offsets.
// A backup's shim publishes the record of a send only now and then (its
// daemon samples the window): the first of a connection, and the first
// after LS_OUT_SAMPLE_US without one, so that a reply after a quiet spell
// is checked at once. Replies close together in between are not published,
// and the window still has the newest.
// Whether two replies were close in the shim's clock is known here only
// within bounds: a reply's send happens after its request was sent and
// before the next reply arrives (redis is one thread), and the shim's
// coarse clock lags by up to a tick. Each reply is checked against what
// those bounds allow, and the test goes on until both kinds were seen
// where the bounds leave no doubt (a loaded machine may make every reply
// slow for a while).
TEST(ShimOutput, ABackupPublishesTheReplyAfterAQuietSpell) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = false}, &err)) << err;
  Harness::Replay r = h.ConnectReplay();
  timespec res{};
  clock_getres(CLOCK_MONOTONIC_COARSE, &res);  // the shim's clock (shim_output.c)
  const auto tick = std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
  const auto sample = std::chrono::microseconds(LS_OUT_SAMPLE_US);
  struct Ask {
    Clock::time_point sent, received;
    uint64_t end;  // the stream's length after its reply
  };
  std::vector<Ask> asks;
  std::string got;
  auto ask = [&](const std::string& value) {
    size_t before = got.size();
    std::string reply = "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
    Ask a{Clock::now(), {}, 0};
    h.ReplayInput(r, Resp({"ECHO", value}));
    EXPECT_TRUE(ReadUntil(r.fd, &got,
                          [&](const std::string& b) { return b.size() >= before + reply.size(); }));
    a.received = Clock::now();
    a.end = got.size();
    asks.push_back(a);
  };
  ask("one");  // the first of a connection: published
  size_t close_ones = 0, quiet_ones = 0;
  for (auto deadline = Clock::now() + std::chrono::seconds(120);
       close_ones < 10 || quiet_ones < 2;) {
    ASSERT_LT(Clock::now(), deadline)
        << close_ones << " replies seen close together, " << quiet_ones << " after a quiet spell";
    for (int i = 0; i < 20; i++) ask("quick" + std::to_string(i));
    for (int i = 0; i < 3; i++) {
      std::this_thread::sleep_for(sample + 2 * tick + std::chrono::milliseconds(5));
      ask("after a quiet spell");
      ask("quick");  // bounds when the quiet one's send was done
    }
    h.PollOnce();  // the records of every reply but the last are in the ring
    std::set<uint64_t> published;
    for (const auto& d : h.Records(r.conn)) published.insert(d.offset);
    ASSERT_TRUE(published.count(asks[0].end)) << "the first reply";
    size_t last = 0;  // the last published reply before i
    close_ones = quiet_ones = 0;
    for (size_t i = 1; i + 1 < asks.size(); i++) {
      // The shim's gap between this send and the last published one.
      auto at_most = asks[i + 1].received - asks[last].sent;
      auto at_least = asks[i].sent - asks[last + 1].received;
      bool pub = published.count(asks[i].end) != 0;
      if (at_most <= sample - tick) {
        close_ones++;
        EXPECT_FALSE(pub) << "reply " << i << " published at most "
                          << std::chrono::duration<double, std::milli>(at_most).count()
                          << " ms after reply " << last;
      }
      if (at_least >= sample + tick) {
        quiet_ones++;
        EXPECT_TRUE(pub) << "reply " << i << " not published at least "
                         << std::chrono::duration<double, std::milli>(at_least).count()
                         << " ms after reply " << last;
      }
      if (pub) last = i;
    }
    if (HasFailure()) break;
  }
  // The window still has the newest reply.
  uint64_t digest = 0;
  ASSERT_TRUE(h.WaitNow(r.conn, got.size(), &digest));
  EXPECT_EQ(digest, Xxh64(got));
  close(r.fd);
  EXPECT_EQ(h.channel_error(), "");
  EXPECT_EQ(h.Stats().dropped_full, 0u);
}

TEST(ShimOutput, RedisDigestsDoNotDependOnChunking) {
  auto cmds = RedisCommands();
  std::string one_by_one, pipelined;
  std::vector<OutputDigest> a_recs, b_recs;
  uint64_t b_end_digest = 0;  // the backup's window at its end
  ShimChannel::OutputWindow a_win;
  {
    Harness h;
    std::string err;
    ASSERT_TRUE(h.Start(kRedis, {.leader = true}, &err)) << err;
    uint32_t conn;
    int fd = h.Connect(&conn);
    for (size_t i = 0; i < cmds.size(); i++) {
      SendAll(fd, Resp(cmds[i]));
      ASSERT_TRUE(
          ReadUntil(fd, &one_by_one, [&](const std::string& b) { return RespReplies(b) == i + 1; }))
          << "reply " << i;
    }
    ASSERT_TRUE(h.WaitRecord(conn, one_by_one.size()));
    // The window holds the stream's last LS_OUT_WINDOW bytes.
    a_recs = h.Records(conn);
    ASSERT_FALSE(a_recs.empty());
    ASSERT_TRUE(h.Window(a_recs.back().out_slot, conn, &a_win));
    EXPECT_EQ(a_win.start, one_by_one.size() - LS_OUT_WINDOW);
    EXPECT_EQ(a_win.bytes, one_by_one.substr(one_by_one.size() - LS_OUT_WINDOW));
    EXPECT_FALSE(a_win.ended);
    // The client leaves; the server closes: the stream ends, the window stays.
    close(fd);
    ASSERT_TRUE(h.WaitRecord(conn, one_by_one.size(), LS_OUT_CLOSED));
    a_recs = h.Records(conn);
    EXPECT_EQ(a_recs.back().flags & LS_OUT_CLOSED, uint32_t{LS_OUT_CLOSED});
    EXPECT_EQ(a_recs.back().offset, one_by_one.size());
    ShimChannel::OutputWindow after;
    ASSERT_TRUE(h.Window(a_recs.back().out_slot, conn, &after));
    EXPECT_TRUE(after.closed);
    EXPECT_EQ(after.bytes, a_win.bytes);
    EXPECT_FALSE(h.Window(a_recs.back().out_slot, conn + 1000, &after));  // not its connection
    auto st = h.Stats();
    EXPECT_TRUE(st.enabled);
    EXPECT_EQ(st.dropped_full + st.dropped_busy + st.unhashed + st.unslotted, 0u);
    EXPECT_EQ(h.channel_error(), "");
  }
  {
    Harness h;
    std::string err;
    ASSERT_TRUE(h.Start(kRedis, {.leader = false}, &err)) << err;
    Harness::Replay r = h.ConnectReplay();
    std::string all;
    for (const auto& c : cmds) all += Resp(c);
    h.ReplayInput(r, all);
    ASSERT_TRUE(ReadUntil(r.fd, &pipelined,
                          [&](const std::string& b) { return RespReplies(b) == cmds.size(); }));
    ASSERT_TRUE(h.WaitNow(r.conn, pipelined.size(), &b_end_digest));
    // The window moves before the record is published: the pump may not
    // have the mark's yet.
    ASSERT_TRUE(h.WaitRecord(r.conn, LS_OUT_MARK_BYTES, LS_OUT_MARK));
    b_recs = h.Records(r.conn);
    for (const auto& d : b_recs) EXPECT_EQ(d.replay_slot, r.slot);
    close(r.fd);
  }
  ASSERT_EQ(one_by_one, pipelined);
  std::vector<uint64_t> a = CheckRecords(a_recs, one_by_one);
  std::vector<uint64_t> b = CheckRecords(b_recs, pipelined);
  // One record per reply one by one on the leader; the backup's pipelined
  // replies went out in fewer sends, and its shim published the first, the
  // marks and those after a quiet spell only.
  EXPECT_GE(a.size(), cmds.size());
  EXPECT_LT(b.size(), a.size());
  EXPECT_NE(a, b);
  std::map<uint64_t, uint64_t> at_a;
  for (const auto& d : a_recs) at_a[d.offset] = d.digest;
  int common = 0, marks = 0;
  for (const auto& d : b_recs) {
    if (!at_a.count(d.offset)) continue;
    EXPECT_EQ(at_a[d.offset], d.digest) << "offset " << d.offset;
    common++;
    marks += (d.flags & LS_OUT_MARK) != 0;
  }
  EXPECT_GE(common, 1);  // the mark at 64 KiB, at least
  EXPECT_GE(marks, 1);
  // And the backup's window ends where the leader's stream does, alike.
  ASSERT_TRUE(at_a.count(pipelined.size()));
  EXPECT_EQ(b_end_digest, at_a[pipelined.size()]);
}

// Two connections whose replies differ in one byte: their digests agree up
// to it and differ at the first record past it; the windows show the bytes.
TEST(ShimOutput, RedisDifferingReplyDiffersFromTheFirstOffsetPastIt) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = true}, &err)) << err;
  std::string value = Pattern(2000, 1);
  std::string other = value;
  other[1500] ^= 1;
  uint32_t conn[2];
  std::string got[2];
  for (int i = 0; i < 2; i++) {
    int fd = h.Connect(&conn[i]);
    std::string key = "k" + std::to_string(i);
    std::vector<std::vector<std::string>> cmds = {
        {"SET", key, i == 0 ? value : other}, {"PING"}, {"GET", key}, {"PING"}, {"DBSIZE"}};
    for (size_t j = 0; j < cmds.size(); j++) {
      SendAll(fd, Resp(cmds[j]));
      ASSERT_TRUE(
          ReadUntil(fd, &got[i], [&](const std::string& b) { return RespReplies(b) == j + 1; }));
    }
    ASSERT_TRUE(h.WaitRecord(conn[i], got[i].size()));
    close(fd);
  }
  // DBSIZE answers 1 then 2: a second difference, after the first.
  ASSERT_EQ(got[0].size(), got[1].size());
  size_t diff = std::mismatch(got[0].begin(), got[0].end(), got[1].begin()).first - got[0].begin();
  ASSERT_LT(diff, got[0].size());
  auto r0 = h.Records(conn[0]), r1 = h.Records(conn[1]);
  CheckRecords(r0, got[0]);
  CheckRecords(r1, got[1]);
  std::map<uint64_t, uint64_t> at1;
  for (const auto& d : r1) at1[d.offset] = d.digest;
  bool first_past = true;
  int before = 0;
  for (const auto& d : r0) {
    ASSERT_TRUE(at1.count(d.offset)) << "both sent replies one by one: same offsets";
    if (d.offset <= diff) {
      EXPECT_EQ(d.digest, at1[d.offset]) << "offset " << d.offset << " is before the difference";
      before++;
    } else {
      EXPECT_NE(d.digest, at1[d.offset]) << "offset " << d.offset << " is past " << diff;
      if (first_past) {
        EXPECT_EQ(d.offset, RespEnd(got[0], got[0].find("$2000")));
      }
      first_past = false;
    }
  }
  EXPECT_EQ(before, 2);  // +OK, +PONG
  EXPECT_FALSE(first_past);
  // Each window holds its own bytes around the first difference.
  ShimChannel::OutputWindow w0, w1;
  ASSERT_TRUE(h.Window(r0.back().out_slot, conn[0], &w0));
  ASSERT_TRUE(h.Window(r1.back().out_slot, conn[1], &w1));
  ASSERT_LE(w0.start, diff);
  EXPECT_EQ(w0.start, w1.start);
  EXPECT_EQ(w0.bytes, got[0].substr(w0.start));
  EXPECT_EQ(w1.bytes, got[1].substr(w1.start));
  EXPECT_NE(w0.bytes[diff - w0.start], w1.bytes[diff - w1.start]);
}

// A daemon that does not keep up: records past a full ring are dropped and
// counted, the server never waits, and the next record is whole on its own.
TEST(ShimOutput, RedisFullRingDropsAndCounts) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = true, .ring = 16, .poll = false}, &err)) << err;
  h.PollOnce();  // a consumer from now on: Flush() no longer discards
  uint32_t conn;
  int fd = h.Connect(&conn);
  std::string got;
  for (size_t i = 0; i < 40; i++) {
    SendAll(fd, Resp({"PING"}));
    ASSERT_TRUE(ReadUntil(fd, &got, [&](const std::string& b) { return RespReplies(b) == i + 1; }));
  }
  // The shim publishes right after the send returns: the client may be faster.
  ShimChannel::OutputStats st;
  for (int i = 0; i < 2000 && (st = h.Stats()).published + st.dropped_full < 40; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(st.published, 16u);
  EXPECT_EQ(st.dropped_full, 24u);
  EXPECT_EQ(st.dropped_busy, 0u);
  h.PollOnce();
  auto recs = h.Records(conn);
  ASSERT_EQ(recs.size(), 16u);
  for (size_t i = 0; i < recs.size(); i++) EXPECT_EQ(recs[i].offset, 7 * (i + 1));  // +PONG\r\n
  CheckRecords(recs, got);
  // Room again: the 41st reply's record covers all 41, the dropped ones included.
  SendAll(fd, Resp({"PING"}));
  ASSERT_TRUE(ReadUntil(fd, &got, [&](const std::string& b) { return RespReplies(b) == 41; }));
  for (int i = 0; i < 2000 && h.Records(conn).size() < 17; i++) {
    h.PollOnce();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  recs = h.Records(conn);
  ASSERT_EQ(recs.size(), 17u);
  EXPECT_EQ(recs.back().offset, 41u * 7);
  EXPECT_EQ(recs.back().digest, Xxh64(got));
  EXPECT_EQ(h.Stats().dropped_full, 24u);
  close(fd);
}

// LOCKSTEP_SHIM_OUTPUT_DIGESTS=0: the shim hashes nothing.
TEST(ShimOutput, RedisWithDigestsOff) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start(kRedis, {.leader = true, .digests = 0}, &err)) << err;
  uint32_t conn;
  int fd = h.Connect(&conn);
  std::string got;
  SendAll(fd, Resp({"SET", "a", "b"}) + Resp({"GET", "a"}));
  ASSERT_TRUE(ReadUntil(fd, &got, [&](const std::string& b) { return RespReplies(b) == 2; }));
  EXPECT_EQ(got, "+OK\r\n$1\r\nb\r\n");
  // redis is one thread: once it answers the PING, the shim is done with
  // the sends before it (where a record would have been published).
  SendAll(fd, Resp({"PING"}));
  ASSERT_TRUE(ReadUntil(fd, &got, [&](const std::string& b) { return RespReplies(b) == 3; }));
  h.PollOnce();
  auto st = h.Stats();
  EXPECT_FALSE(st.enabled);
  EXPECT_EQ(st.published, 0u);
  EXPECT_TRUE(h.Records(conn).empty());
  close(fd);
}

// ------------------------------------------------------------ memcached

// memcached with 4 worker threads sends with sendmsg from several threads at
// once: each connection's records are still its own stream's digests.
TEST(ShimOutput, MemcachedFourThreadsFourConnections) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start({"memcached", "-p", "{port}", "-l", "127.0.0.1", "-U", "0", "-t", "4", "-m",
                       "64", "-u", "root"},
                      {.leader = true}, &err))
      << err;
  constexpr int kConns = 4, kOps = 150;
  uint32_t conn[kConns];
  int fds[kConns];
  std::string got[kConns];
  for (int i = 0; i < kConns; i++) fds[i] = h.Connect(&conn[i]);
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int i = 0; i < kConns; i++)
    clients.emplace_back([&, i] {
      for (int j = 0; j < kOps; j++) {
        std::string key = "c" + std::to_string(i) + "k" + std::to_string(j);
        std::string value = Pattern(static_cast<size_t>(1 + (j * 37) % 3000), static_cast<char>(i));
        std::string cmd = "set " + key + " 0 0 " + std::to_string(value.size()) + "\r\n" + value +
                          "\r\nget " + key + "\r\n";
        ssize_t n = send(fds[i], cmd.data(), cmd.size(), MSG_NOSIGNAL);
        if (n != static_cast<ssize_t>(cmd.size())) failures++;
        size_t ends = 0;
        if (!ReadUntil(fds[i], &got[i], [&](const std::string& b) {
              for (size_t p = 0; (p = b.find("END\r\n", p)) != std::string::npos; p += 5) ends++;
              bool done = ends >= static_cast<size_t>(j + 1);
              ends = 0;
              return done;
            }))
          failures++;
      }
    });
  for (auto& t : clients) t.join();
  ASSERT_EQ(failures, 0);
  for (int i = 0; i < kConns; i++) {
    ASSERT_TRUE(h.WaitRecord(conn[i], got[i].size())) << i;
    auto recs = h.Records(conn[i]);
    CheckRecords(recs, got[i]);
    EXPECT_GE(recs.size(), static_cast<size_t>(kOps));
    close(fds[i]);
  }
  auto st = h.Stats();
  EXPECT_EQ(st.dropped_full + st.unhashed + st.unslotted, 0u);
  std::cerr << "memcached -t 4: " << st.published << " records, " << st.dropped_busy
            << " dropped while another thread published\n";
}

// ------------------------------------------------------------ every call

// A server that answers each command line with its bytes sent by the call
// the command names. Each connection is served on a thread of its own.
const char kPythonServer[] = R"PY(
import os, socket, sys, threading

port = int(sys.argv[1])
data = bytes((i * 7 + 3) % 251 for i in range(1 << 20))
with open("file.bin", "wb") as f:
    f.write(data)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(64)

def payload(tag, n):
    unit = (tag + ":").encode() + bytes(range(32, 127))
    return (unit * (n // len(unit) + 1))[:n]

def serve(c):
    fd = c.fileno()
    src = os.open("file.bin", os.O_RDONLY)
    buf = b""
    while True:
        chunk = c.recv(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            cmd, n = line.split()[0].decode(), int(line.split()[1])
            d = payload(cmd, n)
            if cmd == "write":
                while d:
                    d = d[os.write(fd, d):]
            elif cmd == "send":
                while d:
                    d = d[c.send(d):]
            elif cmd == "sendto":
                while d:
                    d = d[c.sendto(d, c.getpeername()):]
            elif cmd == "sendmsg":
                while d:
                    d = d[c.sendmsg([d[: len(d) // 3], d[len(d) // 3 :]]):]
            elif cmd == "writev":
                while d:
                    d = d[os.writev(fd, [d[:5], d[5:9], d[9:]]):]
            elif cmd == "sendfile":  # from an offset: the file position stays
                off = (n * 13) % 4096
                end = off + n
                while off < end:
                    off += os.sendfile(fd, src, off, end - off)
            elif cmd == "sendfilepos":  # from the file position, which moves
                os.lseek(src, (n * 17) % 4096, os.SEEK_SET)
                left = n
                while left:
                    left -= os.sendfile(fd, src, None, left)
            elif cmd == "shutdown":
                c.shutdown(socket.SHUT_WR)
    c.close()

while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
)PY";

std::string Expected(const std::string& cmd, size_t n) {
  static const std::string file = [] {
    std::string f(1 << 20, 0);
    for (size_t i = 0; i < f.size(); i++) f[i] = static_cast<char>((i * 7 + 3) % 251);
    return f;
  }();
  if (cmd == "sendfile") return file.substr((n * 13) % 4096, n);
  if (cmd == "sendfilepos") return file.substr((n * 17) % 4096, n);
  std::string unit = cmd + ":";
  for (int c = 32; c < 127; c++) unit.push_back(static_cast<char>(c));
  std::string out;
  while (out.size() < n) out += unit;
  return out.substr(0, n);
}

TEST(ShimOutput, EveryOutputCallAndShutdown) {
  Harness h;
  { std::ofstream(h.dir() + "/server.py") << kPythonServer; }
  std::string err;
  ASSERT_TRUE(h.Start({"/usr/bin/python3", "{dir}/server.py", "{port}"}, {.leader = true}, &err))
      << err;
  const std::vector<std::string> calls = {"write",  "send",     "sendto",     "sendmsg",
                                          "writev", "sendfile", "sendfilepos"};
  constexpr int kConns = 3;
  uint32_t conn[kConns];
  int fds[kConns];
  std::string got[kConns], want[kConns];
  for (int i = 0; i < kConns; i++) fds[i] = h.Connect(&conn[i]);
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int i = 0; i < kConns; i++)
    clients.emplace_back([&, i] {
      for (int round = 0; round < 30; round++)
        for (size_t k = 0; k < calls.size(); k++) {
          // Mostly small; now and then more than the socket takes at once.
          size_t n = 1 + (round * 131 + k * 17 + i) % 200;
          if ((round + k + i) % 23 == 0) n = 150000 + round * 1000;
          want[i] += Expected(calls[k], n);
          std::string line = calls[k] + " " + std::to_string(n) + "\n";
          if (send(fds[i], line.data(), line.size(), MSG_NOSIGNAL) != (ssize_t)line.size())
            failures++;
          size_t need = want[i].size();
          if (!ReadUntil(fds[i], &got[i], [&](const std::string& b) { return b.size() >= need; }))
            failures++;
        }
      std::string line = "shutdown 0\n";
      if (send(fds[i], line.data(), line.size(), MSG_NOSIGNAL) != (ssize_t)line.size()) failures++;
      std::string rest;
      ReadUntil(fds[i], &rest, [](const std::string&) { return false; });  // to EOF
      if (!rest.empty()) failures++;
      shutdown(fds[i], SHUT_WR);  // the server reads EOF and closes
    });
  for (auto& t : clients) t.join();
  ASSERT_EQ(failures, 0);
  for (int i = 0; i < kConns; i++) {
    ASSERT_EQ(got[i], want[i]) << "connection " << i;
    ASSERT_TRUE(h.WaitRecord(conn[i], got[i].size(), LS_OUT_CLOSED)) << i;
    auto recs = h.Records(conn[i]);
    CheckRecords(recs, got[i]);
    // The end of the stream: shut down for writing, then closed, both at its end.
    ASSERT_GE(recs.size(), 2u);
    const auto& shut = recs[recs.size() - 2];
    const auto& closed = recs.back();
    EXPECT_EQ(shut.flags & (LS_OUT_SHUT | LS_OUT_CLOSED), uint32_t{LS_OUT_SHUT});
    EXPECT_EQ(closed.flags & LS_OUT_CLOSED, uint32_t{LS_OUT_CLOSED});
    EXPECT_EQ(shut.offset, got[i].size());
    EXPECT_EQ(closed.offset, got[i].size());
    // A record at every mark the stream crossed (unless one was dropped).
    std::set<uint64_t> marks;
    for (const auto& d : recs)
      if (d.flags & LS_OUT_MARK) marks.insert(d.offset);
    if (h.Stats().dropped_busy == 0) {
      EXPECT_EQ(marks.size(), got[i].size() / ShimChannel::kOutputMarkBytes);
    }
    ShimChannel::OutputWindow w;
    ASSERT_TRUE(h.Window(closed.out_slot, conn[i], &w));
    EXPECT_TRUE(w.closed);
    EXPECT_EQ(w.start, got[i].size() - LS_OUT_WINDOW);
    EXPECT_EQ(w.bytes, got[i].substr(w.start));
    close(fds[i]);
  }
  auto st = h.Stats();
  EXPECT_EQ(st.dropped_full + st.unhashed + st.unslotted, 0u);
  EXPECT_EQ(h.channel_error(), "");
}

// ------------------------------------------------------------ many sends

// Many small sends under a leader's shim (which publishes every send's
// record; a backup's, few), hashing on and off in turn: a sender
// (tools/shim_send_bench.c) writes small replies one call at a time on a
// replay connection, and this daemon drains the digests as a comparing
// daemon would. Every send is counted either way; with hashing on the last
// send's digest arrives and every send's record was published (or counted
// as dropped), with it off none is. It prints what a send took with and
// without hashing, for a look; it bounds no time (a test has no speed
// target): what output hashing costs is measured by `scripts/bench
// divergence` (eval/divergence.py), on vs off, at the application's level.
// Measured here on a quiet machine: 65-110 ns per send, against ~940 ns
// for the bare send; callgrind counts ~470 more instructions per send with
// hashing on (the XXH64 finalization, the window, the record).
TEST(ShimOutput, SendWithAndWithoutDigests) {
  constexpr int kCount = 100000, kRounds = 5;
  // Digests on/off -> ns per send of each run's fastest batch of 1000: the
  // machine's other load only ever adds to a batch.
  std::map<int, std::vector<double>> fastest;
  for (int round = 0; round < kRounds; round++)
    for (int on : {round % 2, 1 - round % 2}) {
      Harness h;
      std::string err;
      ASSERT_TRUE(h.Start({LOCKSTEP_SEND_BENCH, "{port}", std::to_string(kCount), "5"},
                          {.leader = true, .digests = on}, &err))
          << err;
      Harness::Replay r = h.ConnectReplay();
      std::thread reader([&] {
        char buf[65536];
        while (recv(r.fd, buf, sizeof buf, 0) > 0) {
        }
      });
      std::string log = h.WaitExit();
      reader.join();
      close(r.fd);
      unsigned long sends = 0, median = 0, min = 0;
      ASSERT_EQ(sscanf(log.c_str() + std::min(log.find("sends "), log.size()),
                       "sends %lu batch_ns_per_send_median %lu batch_ns_per_send_min %lu", &sends,
                       &median, &min),
                3)
          << log;
      ASSERT_EQ(sends, static_cast<unsigned long>(kCount));
      if (on) {
        ASSERT_TRUE(h.WaitRecord(r.conn, uint64_t{kCount} * 5)) << "the last send's digest";
        auto st = h.Stats();
        EXPECT_TRUE(st.enabled);
        EXPECT_GE(st.published + st.dropped_full, static_cast<uint64_t>(kCount));
      } else {
        auto st = h.Stats();
        EXPECT_FALSE(st.enabled);
        EXPECT_EQ(st.published, 0u);
      }
      fastest[on].push_back(static_cast<double>(min));
      std::cerr << "digests " << (on ? "on " : "off") << ": " << median
                << " ns per send (median of " << kCount / 1000 << " batches), " << min
                << " ns (fastest batch)\n";
    }
  auto mid = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double cost = mid(fastest[1]) - mid(fastest[0]);
  std::cerr << "hashing costs " << cost << " ns per send (fastest batches, median of " << kRounds
            << " runs each; a send of 5 bytes takes " << mid(fastest[0]) << " ns without)\n";
}

// The stack kept with each send names the server's own call chain, also
// when two chains differ only two frames above the send (tools/
// send_chains.c: via_a and via_b have the same frame), and back-to-back
// sends from one chain share an entry: which they can only when the shim
// recognized the chain from its cache rather than walking it again.
TEST(ShimOutput, SendStacks) {
  Harness h;
  std::string err;
  ASSERT_TRUE(h.Start({LOCKSTEP_SEND_CHAINS, "{port}", "aabab"}, {.leader = true}, &err)) << err;
  Harness::Replay r = h.ConnectReplay();
  ASSERT_TRUE(h.WaitRecord(r.conn, 5)) << "the last send's digest";
  int out_slot = -1;
  for (const auto& d : h.Records(r.conn)) out_slot = d.out_slot;
  ASSERT_GE(out_slot, 0);
  ShimChannel::OutputWindow w;
  ASSERT_TRUE(h.Window(out_slot, r.conn, &w));
  EXPECT_EQ(std::string(w.bytes.begin(), w.bytes.end()), "aabab");
  Symbolizer names(h.server_pid());
  std::vector<std::string> got;
  for (const auto& send : w.sends) {
    std::string stack = names.DescribeStack(send.pcs);
    SCOPED_TRACE(stack);
    // Innermost first; under ASan its write interceptor comes before send_one.
    auto at = [&](const std::string& fn) {
      size_t p = stack.find(" " + fn + "+0x");
      return p == std::string::npos
                 ? -1
                 : static_cast<int>(std::count(stack.begin(), stack.begin() + p, '\n'));
    };
    int send_one = at("send_one"), via_a = at("via_a"), via_b = at("via_b");
    ASSERT_GE(send_one, 0);
    EXPECT_EQ(at("through"), send_one + 1);
    EXPECT_TRUE((via_a == send_one + 2) != (via_b == send_one + 2));
    EXPECT_GT(at("main"), send_one + 2);
    got.push_back(std::to_string(send.start) + ".." + std::to_string(send.end) +
                  (via_a == send_one + 2 ? " a" : " b"));
  }
  EXPECT_EQ(got, (std::vector<std::string>{"0..2 a", "2..3 b", "3..4 a", "4..5 b"}));
  close(r.fd);
}

}  // namespace
}  // namespace lockstep::shim_test
