// shim_test_harness.cc — the shared harness of the tests of the preload shim
// under real servers (shim_test_harness.h): the reference XXH64, the socket
// and RESP helpers, and Harness, which starts the server under the shim and
// plays its daemon (commits every input at once; replays in order; drains the
// output ring). Test-only: never linked into lockstep_guard.
#include "guard/server/shim_test_harness.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace lockstep::shim_test {
namespace {

uint64_t Rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
uint64_t Read64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
uint64_t Read32(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

}  // namespace

uint64_t Xxh64(std::string_view s) {
  constexpr uint64_t P1 = 11400714785074694791ull, P2 = 14029467366897019727ull,
                     P3 = 1609587929392839161ull, P4 = 9650029242287828579ull,
                     P5 = 2870177450012600261ull;
  auto round = [&](uint64_t acc, uint64_t in) { return Rotl(acc + in * P2, 31) * P1; };
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char* end = p + s.size();
  uint64_t h;
  if (s.size() >= 32) {
    uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = 0 - P1;
    while (end - p >= 32) {
      v1 = round(v1, Read64(p));
      v2 = round(v2, Read64(p + 8));
      v3 = round(v3, Read64(p + 16));
      v4 = round(v4, Read64(p + 24));
      p += 32;
    }
    h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
    for (uint64_t v : {v1, v2, v3, v4}) h = (h ^ round(0, v)) * P1 + P4;
  } else {
    h = P5;
  }
  h += s.size();
  for (; end - p >= 8; p += 8) h = Rotl(h ^ round(0, Read64(p)), 27) * P1 + P4;
  if (end - p >= 4) {
    h = Rotl(h ^ (Read32(p) * P1), 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; p++) h = Rotl(h ^ (*p * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

// ------------------------------------------------------------ sockets

int LocalPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

void SendAll(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << strerror(errno);
    s.remove_prefix(static_cast<size_t>(n));
  }
}

bool ReadUntil(int fd, std::string* buf, const std::function<bool(const std::string&)>& done) {
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!done(*buf)) {
    pollfd p{fd, POLLIN, 0};
    if (Clock::now() > deadline) return false;
    if (poll(&p, 1, 100) <= 0) continue;
    char tmp[65536];
    ssize_t n = recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf->append(tmp, static_cast<size_t>(n));
  }
  return true;
}

bool Listening(int port) {
  std::ifstream f("/proc/net/tcp");
  char want[16];
  snprintf(want, sizeof want, ":%04X", port);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    if (local.size() > 5 && local.substr(local.size() - 5) == want && state == "0A") return true;
  }
  return false;
}

// ------------------------------------------------------------ RESP

std::string Resp(const std::vector<std::string>& args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& a : args) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return out;
}

size_t RespEnd(const std::string& b, size_t pos) {
  size_t eol = b.find("\r\n", pos);
  if (pos >= b.size() || eol == std::string::npos) return 0;
  char t = b[pos];
  if (t == '+' || t == '-' || t == ':') return eol + 2;
  long n = atol(b.c_str() + pos + 1);
  if (t == '$') {
    size_t end = n < 0 ? eol + 2 : eol + 2 + static_cast<size_t>(n) + 2;
    return end <= b.size() ? end : 0;
  }
  if (t == '*') {
    size_t p = eol + 2;
    for (long i = 0; i < n; i++)
      if ((p = RespEnd(b, p)) == 0) return 0;
    return p;
  }
  return 0;
}

size_t RespReplies(const std::string& b) {
  size_t n = 0;
  for (size_t p = 0; (p = RespEnd(b, p)) != 0;) n++;
  return n;
}

// ------------------------------------------------------------ the harness

Harness::Harness() {
  char tmpl[] = "/tmp/lockstep-shim-output-XXXXXX";
  dir_ = mkdtemp(tmpl);
}

Harness::~Harness() {
  stop_ = true;
  if (pump_.joinable()) pump_.join();
  server_.Stop();
  std::string cmd = "rm -rf '" + dir_ + "'";
  EXPECT_EQ(system(cmd.c_str()), 0);
}

bool Harness::Start(const std::vector<std::string>& argv_template, Options o, std::string* error) {
  opt_ = o;
  polling_ = o.poll;
  port_ = FreePort();
  if (!ch_.Create(1 << 20, error, o.ring)) return false;
  ch_.SetReplaySource(htonl(INADDR_LOOPBACK));  // where ConnectReplay binds, as the daemon does
  if (o.digests >= 0) ch_.set_output_digests(o.digests != 0);
  ch_.set_unchecked_replies(o.unchecked_replies);
  // A consumer from the start: records published before the pump's first
  // pass would otherwise be passed over as nobody's (ShimChannel::Flush).
  OutputDigest first;
  if (o.poll) ch_.PollOutput(&first);
  ch_.SetLeader(o.leader);
  std::vector<std::string> argv;
  for (const auto& a : argv_template) argv.push_back(SubstituteCommand(a, port_, dir_));
  if (!server_.Start(argv, dir_, dir_ + "/server.log", ch_.ServerEnv(port_), ch_.ServerFds(),
                     error))
    return false;
  pump_ = std::thread([this] { Pump(); });
  // Ready once it listens: no connection to see it (it would be one more
  // for the shim, closed whenever the server gets to it).
  for (auto deadline = Clock::now() + std::chrono::seconds(10); !Listening(port_);) {
    std::string how;
    if (server_.Exited(&how) || Clock::now() > deadline) {
      *error = "the server is not listening: " + how;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!ch_.shim_attached()) {
    *error = "the shim did not attach";
    return false;
  }
  return true;
}

int Harness::Connect(uint32_t* conn) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port_));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string peer = "127.0.0.1:" + std::to_string(LocalPort(fd));
  *conn = 0;
  Wait([&] {
    auto it = accepts_.find(peer);
    if (it != accepts_.end()) *conn = it->second;
    return *conn != 0;
  });
  EXPECT_NE(*conn, 0u) << "no ACCEPT from " << peer;
  return fd;
}

Harness::Replay Harness::ConnectReplay() {
  Replay r;
  r.fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(r.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  {
    std::lock_guard<std::mutex> g(mu_);
    r.slot = ch_.ClaimReplaySlot(LocalPort(r.fd));
  }
  EXPECT_GE(r.slot, 0);
  a.sin_port = htons(static_cast<uint16_t>(port_));
  EXPECT_EQ(connect(r.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  Wait([&] { return ch_.ReplayAccepted(r.slot); });
  std::lock_guard<std::mutex> g(mu_);
  EXPECT_TRUE(ch_.ReplayAccepted(r.slot));
  r.conn = ch_.ReplayConn(r.slot);
  return r;
}

Harness::Replay Harness::ConnectReplayFrom(int port, std::string_view first_input) {
  Replay r;
  r.fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(r.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(r.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  {
    std::lock_guard<std::mutex> g(mu_);
    r.slot = ch_.ClaimReplaySlot(port);
    EXPECT_GE(r.slot, 0);
    EXPECT_TRUE(ch_.PushOrder(r.slot, LS_ORDER_DATA, first_input.size()));
    ch_.Flush();
  }
  a.sin_port = htons(static_cast<uint16_t>(port_));
  EXPECT_EQ(connect(r.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  SendAll(r.fd, first_input);
  return r;
}

void Harness::ReleaseReplay(Replay* r) {
  std::lock_guard<std::mutex> g(mu_);
  ch_.ReleaseReplaySlot(r->slot);
  close(r->fd);
  r->fd = -1;
}

void Harness::ReplayInput(const Replay& r, std::string_view bytes, uint64_t out_before) {
  OrderInput(r, bytes.size(), out_before);
  SendAll(r.fd, bytes);
}

void Harness::OrderInput(const Replay& r, size_t len, uint64_t out_before) {
  std::lock_guard<std::mutex> g(mu_);
  ASSERT_TRUE(ch_.PushOrder(r.slot, LS_ORDER_DATA, len, 0, out_before));
  ch_.Flush();
}

std::vector<OutputDigest> Harness::Records(uint32_t conn) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<OutputDigest> out;
  for (const auto& d : records_)
    if (d.conn == conn) out.push_back(d);
  return out;
}

bool Harness::WaitRecord(uint32_t conn, uint64_t offset, uint32_t flags) {
  return Wait([&] {
    for (const auto& d : records_)
      if (d.conn == conn && d.offset >= offset && (d.flags & flags) == flags) return true;
    return false;
  });
}

bool Harness::WaitNow(uint32_t conn, uint64_t offset, uint64_t* digest) {
  return Wait([&] {
    for (const auto& d : records_) {
      if (d.conn != conn || d.out_slot < 0) continue;
      uint64_t end = 0;
      return ch_.OutputNow(d.out_slot, conn, &end, digest) && end >= offset;
    }
    return false;
  });
}

bool Harness::Window(int out_slot, uint32_t conn, ShimChannel::OutputWindow* w) {
  std::lock_guard<std::mutex> g(mu_);
  return ch_.RecentOutput(out_slot, conn, w);
}

ShimChannel::OutputStats Harness::Stats() {
  std::lock_guard<std::mutex> g(mu_);
  return ch_.GetOutputStats();
}

void Harness::PollOnce() {
  std::lock_guard<std::mutex> g(mu_);
  OutputDigest d;
  while (ch_.PollOutput(&d)) records_.push_back(d);
}

std::string Harness::channel_error() {
  std::lock_guard<std::mutex> g(mu_);
  return ch_.error();
}

std::string Harness::WaitExit() {
  std::string how;
  for (int i = 0; i < 60000 && !server_.Exited(&how); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::ifstream f(dir_ + "/server.log");
  std::stringstream ss;
  ss << f.rdbuf() << how;
  return ss.str();
}

bool Harness::Wait(const std::function<bool()>& pred) {
  auto deadline = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (pred()) return true;
    }
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool Harness::WaitHeld(size_t n, std::vector<HeldInput>* held) {
  bool ok = Wait([&] { return held_.size() >= n; });
  std::lock_guard<std::mutex> g(mu_);
  *held = held_;
  return ok;
}

void Harness::Complete(uint32_t kind, const HeldInput& input) {
  std::lock_guard<std::mutex> g(mu_);
  ch_.Complete(kind, input.seq, input.conn);
}

void Harness::Pump() {
  while (!stop_) {
    {
      std::lock_guard<std::mutex> g(mu_);
      ShimChannel::Submission s;
      while (ch_.Peek(&s)) {  // every input is agreed at once, unless held
        if (s.kind == LS_SUB_ACCEPT) accepts_[std::string(s.bytes)] = s.conn;
        if (opt_.hold_data && s.kind == LS_SUB_DATA)
          held_.push_back({s.seq, s.conn, std::string(s.bytes)});
        else
          ch_.Complete(LS_DONE_COMMITTED, s.seq, s.conn);
        ch_.Pop();
      }
      ch_.Flush();
      OutputDigest d;
      while (polling_ && ch_.PollOutput(&d)) records_.push_back(d);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// ------------------------------------------------------------ redis

const std::vector<std::string> kRedis = {
    "redis-server", "--port",      "{port}", "--bind",       "127.0.0.1", "--dir",
    "{dir}",        "--save",      "",       "--appendonly", "no",        "--protected-mode",
    "no",           "--daemonize", "no",     "--io-threads", "1"};

std::string Pattern(size_t n, char seed) {
  std::string s(n, 0);
  for (size_t i = 0; i < n; i++) s[i] = static_cast<char>('a' + (i * 7 + seed) % 26);
  return s;
}

std::vector<std::vector<std::string>> RedisCommands() {
  return {{"SET", "greeting", "hello"},
          {"GET", "greeting"},
          {"INCR", "n"},
          {"INCR", "n"},
          {"RPUSH", "l", "a", "b", "c"},
          {"LRANGE", "l", "0", "-1"},
          {"SET", "big", Pattern(100000, 3)},  // its reply crosses a mark (64 KiB)
          {"GET", "big"},
          {"GET", "missing"},
          {"SET", "small", Pattern(3000, 5)},
          {"GET", "small"},
          {"PING"}};
}

}  // namespace lockstep::shim_test
