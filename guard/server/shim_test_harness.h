// shim_test_harness.h — what the tests of the preload shim under real
// servers share (shim_output_test.cc, shim_replay_test.cc): Harness starts a
// server under the real shim (build/lib/liblockstep_preload.so) and plays its
// daemon through ShimChannel; beside it the test's socket and RESP helpers,
// the redis command line and inputs, and a one-shot XXH64 written
// independently of preload/stream_hash.h that the shim's digests are checked
// against. Test-only: linked into those tests (guard/CMakeLists.txt), never
// into lockstep_guard.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "guard/net/test_ports.h"
#include "guard/server/server.h"
#include "guard/server/shim_channel.h"

namespace lockstep::shim_test {

using Clock = std::chrono::steady_clock;
using OutputDigest = ShimChannel::OutputDigest;

// XXH64 with seed 0, one shot, straight from the specification.
uint64_t Xxh64(std::string_view s);

// ------------------------------------------------------------ sockets

// FreePort: guard/net/test_ports.h.
// The local port of a bound socket.
int LocalPort(int fd);
// Sends all of s (a test failure if a send fails).
void SendAll(int fd, std::string_view s);
// Reads into *buf until done(*buf) or EOF (false) or 20 s (false).
bool ReadUntil(int fd, std::string* buf, const std::function<bool(const std::string&)>& done);
// Something listens on 127.0.0.1:port (/proc/net/tcp, state 0A).
bool Listening(int port);

// ------------------------------------------------------------ RESP

// A RESP command of args.
std::string Resp(const std::vector<std::string>& args);
// Where the RESP reply starting at pos ends; 0 while it is incomplete.
size_t RespEnd(const std::string& b, size_t pos);
// How many whole RESP replies b holds.
size_t RespReplies(const std::string& b);

// ------------------------------------------------------------ the harness

// A real server under the real shim, and this test as its daemon.
class Harness {
 public:
  struct Options {
    bool leader = true;                 // commit client inputs (else: replay connections)
    uint32_t ring = LS_OUT_RING_SLOTS;  // output ring records
    int digests = -1;                   // LOCKSTEP_SHIM_OUTPUT_DIGESTS: -1 unset, 0, 1
    bool poll = true;                   // the pump drains the output ring
    // Client DATA submissions wait for the test's Complete (leader only),
    // as a leader's inputs wait for their agreement.
    bool hold_data = false;
    std::string unchecked_replies = "";  // LOCKSTEP_SHIM_UNCHECKED_RESP
  };
  struct HeldInput {
    uint64_t seq = 0;
    uint32_t conn = 0;
    std::string bytes;
  };
  struct Replay {
    int fd = -1;
    int slot = -1;
    uint32_t conn = 0;
  };

  Harness();
  ~Harness();
  const std::string& dir() const { return dir_; }
  int port() const { return port_; }

  bool Start(const std::vector<std::string>& argv_template, Options o, std::string* error);

  // A client connection (the leader's kind): its fd and shim number.
  int Connect(uint32_t* conn);
  // A replay connection (a backup's kind), accepted by the server.
  Replay ConnectReplay();
  // A replay connection from local port `port` whose first input is
  // ordered before the server accepts it (guard/server/replay.cc may do so); the
  // slot is claimed anew, which may be the one just released.
  Replay ConnectReplayFrom(int port, std::string_view first_input);
  // The daemon's side of a replay connection the server closed.
  void ReleaseReplay(Replay* r);
  // Replays bytes as one input (its order first, as guard/server/replay.cc does).
  // out_before: the reply gate's mark (how much the leader's server had sent
  // there when the input came; 0: none).
  void ReplayInput(const Replay& r, std::string_view bytes, uint64_t out_before = 0);
  // Orders the next `len` bytes of r, sent before by the test itself.
  void OrderInput(const Replay& r, size_t len, uint64_t out_before = 0);

  // With hold_data: waits until at least n DATA submissions were held (all
  // held so far, oldest first, in *held); Complete gives one its outcome.
  bool WaitHeld(size_t n, std::vector<HeldInput>* held);
  void Complete(uint32_t kind, const HeldInput& input);

  std::vector<OutputDigest> Records(uint32_t conn);
  // Waits for a record of conn at `offset` or past it (with all of `flags`).
  bool WaitRecord(uint32_t conn, uint64_t offset, uint32_t flags = 0);
  // Waits until the window of connection `conn` (its out_slot as its first
  // record names it) reaches `offset`, and gives the digest there: what a
  // backup's daemon samples, its shim publishing few of a busy
  // connection's records (shim_abi.h, "Output").
  bool WaitNow(uint32_t conn, uint64_t offset, uint64_t* digest);
  bool Window(int out_slot, uint32_t conn, ShimChannel::OutputWindow* w);
  pid_t server_pid() const { return server_.pid(); }
  ShimChannel::OutputStats Stats();
  void set_polling(bool on) { polling_ = on; }
  // One PollOutput now (the first one makes this daemon a consumer).
  void PollOnce();
  std::string channel_error();
  // Waits up to 60 s for the server to exit; returns its log.
  std::string WaitExit();

 private:
  // Polls `pred` (under mu_) for up to 20 s.
  bool Wait(const std::function<bool()>& pred);
  void Pump();

  std::string dir_;
  int port_ = 0;
  Options opt_;
  ShimChannel ch_;
  ServerProcess server_;
  std::mutex mu_;  // ch_, records_, accepts_, held_
  std::vector<OutputDigest> records_;
  std::map<std::string, uint32_t> accepts_;  // peer address -> shim connection number
  std::vector<HeldInput> held_;              // hold_data: DATA submissions, in order
  std::atomic<bool> polling_{true};
  std::atomic<bool> stop_{false};
  std::thread pump_;
};

// ------------------------------------------------------------ redis

// redis-server's command line for Harness::Start.
extern const std::vector<std::string> kRedis;

// n bytes of letters, different for each seed.
std::string Pattern(size_t n, char seed);

// A few commands of each kind of reply; one reply crosses a mark (64 KiB).
std::vector<std::vector<std::string>> RedisCommands();

}  // namespace lockstep::shim_test
