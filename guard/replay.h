// replay.h — feeds committed inputs into this replica's own copy of the
// server over real local TCP connections: an ACCEPT opens one, DATA writes
// the bytes, CLOSE closes it. Replies are read and discarded.
//
// Order: the server must execute inputs on different connections in the
// log's order, as the leader's did. The leader's shim hands its server one
// connection's run of inputs at a time (preload/shim.c, the delivery
// window); the replayer does the same: before it writes an input for
// connection B after one for A, it waits until the server has read
// everything written to A (the shim counts it in A's replay slot), or until
// the input has waited kGateBypassUs, as the leader's shim does.
#pragma once

#include <compare>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "guard/shim_channel.h"

namespace lockstep {

// A client connection as the log names it: the ballot whose leader accepted
// it, and that leader's shim connection number.
struct ConnKey {
  uint64_t ballot = 0;
  uint32_t no = 0;
  auto operator<=>(const ConnKey&) const = default;
};

class Replayer {
 public:
  static constexpr uint64_t kGateBypassUs = 10000;
  using WatchFn = std::function<void(int fd, bool add, bool writable)>;
  using LogFn = std::function<void(const std::string&)>;

  Replayer(ShimChannel* shim, std::string host, int port, WatchFn watch, LogFn log)
      : shim_(shim), host_(std::move(host)), port_(port), watch_(watch), log_(log) {}
  ~Replayer();

  void Accept(ConnKey k);
  void Data(ConnKey k, std::string_view bytes);
  void Close(ConnKey k);

  // Moves queued inputs into the sockets as the gate allows. True if it did
  // anything.
  bool Pump(uint64_t now_us);
  // True while the head input waits for the server to read an earlier one.
  bool Gated() const { return gated_; }
  bool Owns(int fd) const { return by_fd_.count(fd) != 0; }
  void OnEvent(int fd, uint32_t events);
  // Nothing queued, and the server has read everything handed to it.
  bool Idle() const;
  size_t open_connections() const { return conns_.size(); }
  uint64_t queued() const { return queue_.size(); }

 private:
  enum class Kind : uint8_t { kAccept, kData, kClose };
  struct Step {
    Kind kind;
    ConnKey key;
    std::string bytes;
  };
  struct Conn {
    int fd = -1;
    int slot = -1;
    uint64_t appended = 0;  // bytes handed to the socket (written or queued)
    std::string out;        // not yet accepted by the socket
    bool close_requested = false;
    bool write_shut = false;
    bool server_closed = false;  // the server closed its end
    bool want_write = false;     // watching for EPOLLOUT (the socket was full)
  };
  bool Open(ConnKey k, Conn* c);
  void FlushOut(Conn* c);
  void Finish(std::map<ConnKey, Conn>::iterator it);
  bool Drained(const ConnKey& k) const;  // the server read all we gave it
  bool MustWait(const ConnKey& k) const;

  ShimChannel* shim_;
  std::string host_;
  int port_;
  WatchFn watch_;
  LogFn log_;
  std::deque<Step> queue_;
  std::map<ConnKey, Conn> conns_;
  std::map<int, ConnKey> by_fd_;
  ConnKey last_;  // connection of the previous input handed to the server
  bool have_last_ = false;
  bool gated_ = false;
  uint64_t head_since_us_ = 0;
  uint64_t bypasses_ = 0;
};

}  // namespace lockstep
