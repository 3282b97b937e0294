// replay.h — feeds committed inputs into this replica's own copy of the
// server over real local TCP connections: an ACCEPT opens one, DATA writes
// the bytes, CLOSE closes it. Replies are read and discarded.
//
// Order: the server must execute inputs on different connections in the
// log's order, as the leader's did. The replayer writes each input as soon
// as it is committed, and first publishes its place in the order ring
// (preload/shim_abi.h); the shim in the server takes what arrives on replay
// connections into their inboxes and lets the server read it in that order,
// one connection's run at a time, exactly as it delivers agreed inputs on
// the leader. The shim counts in each connection's replay slot what the
// server has read, which tells a new leader when its server has caught up.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "guard/common/conn_key.h"
#include "guard/server/shim_channel.h"

namespace lockstep {

class Replayer {
 public:
  using WatchFn = std::function<void(int fd, bool add, bool writable)>;
  using LogFn = std::function<void(const std::string&)>;

  // Tells the shim where its connections come from (host, an IPv4 address).
  Replayer(ShimChannel* shim, std::string host, int port, WatchFn watch, LogFn log);
  ~Replayer();

  void Accept(ConnKey k);
  // index: the log entry the bytes come from (named if the server dies on
  // it); clock_ns: its wall-clock stamp, passed to the shim with the order.
  // out_before: its reply gate (log_input.h), passed to the shim with the order.
  void Data(ConnKey k, std::string_view bytes, uint64_t index = 0, uint64_t clock_ns = 0,
            uint64_t out_before = 0);
  void Close(ConnKey k, uint64_t out_before = 0);
  // A TICK entry (log_input.h): the server's wait in epoll set `waiter`
  // times out once it has read everything ordered before, its clock at
  // clock_ns (preload/shim_abi.h "Ticks").
  void Tick(uint32_t waiter, uint64_t index, uint64_t clock_ns);

  // Moves queued inputs into the sockets (and their order into the order
  // ring). True if it did anything.
  bool Pump(uint64_t now_us);
  // True while the order ring is full, or an accept waits: the server must
  // read first.
  bool Gated() const { return gated_; }
  bool Owns(int fd) const { return by_fd_.count(fd) != 0; }
  void OnEvent(int fd, uint32_t events);
  // Nothing queued, and the server has read everything handed to it (and
  // taken every tick ordered).
  bool Idle() const;
  // Every open connection is accepted, written out and read by the server up
  // to what was handed to it; *progress grows whenever the server reads.
  bool ServerTookAll(uint64_t* progress) const;
  // What has been handed to the server so far, and
  // whether the server has read it all since: "executed up to here" for a
  // repair's timing, which Idle() cannot say while new inputs keep coming.
  using HandedMark = std::map<ConnKey, uint64_t>;
  HandedMark HandedSoFar() const;
  bool ReadPast(const HandedMark& mark) const;
  // Why not Idle(), for the log: the first connection still busy and how.
  std::string Busy() const;

  // A connection the server holds, as a checkpoint records it: its replay
  // slot and the bytes handed to it (while Idle(), all read by the server).
  struct OpenConn {
    ConnKey key;
    int slot;
    uint64_t bytes;
  };
  std::vector<OpenConn> OpenConns() const;
  // After the server was restored from a checkpoint holding `conns` (their
  // sockets dead, see preload/shim_abi.h "After a restore"): opens a fresh
  // connection for each, which the shim puts in place of the dead one, and
  // carries on counting bytes from where the checkpoint was. Call it on a
  // fresh Replayer over the restored channel, before the server runs.
  void Reattach(const std::vector<OpenConn>& conns);
  size_t open_connections() const { return conns_.size(); }
  // The newest log entry whose bytes the server had begun to read (0: none
  // known); *all_read: it had read every byte it was handed. After the
  // server died, the input it most likely died on.
  uint64_t EntryBeingRead(bool* all_read) const;
  // Bytes the server has read on all replay connections (grows while it works).
  uint64_t BytesRead() const;
  uint64_t queued() const { return queue_.size(); }
  // The log's name for the connection the shim numbers shim_conn in replay
  // slot `slot` (its output records say both); false if unknown. A
  // connection that ended is still found for a while (its last records are
  // often read after it ended).
  bool KeyOfOutput(int slot, uint32_t shim_conn, ConnKey* key) const;

 private:
  enum class Kind : uint8_t { kAccept, kData, kClose, kTick };
  struct Step {
    Kind kind;
    ConnKey key;
    std::string bytes;
    uint64_t index = 0;
    uint64_t clock_ns = 0;
    uint64_t out_before = 0;
  };
  // A DATA input handed to a connection: where its bytes are in the stream.
  struct Handed {
    uint64_t index;
    int slot;  // -1 once the connection is gone
    uint64_t start;
    uint64_t end;
    uint64_t read_at_release = 0;  // what the server had read when it went
  };
  static constexpr size_t kHandedKept = 4096;
  // Replies a replay socket gathers before it wakes the loop (SO_RCVLOWAT):
  // well below the smallest receive buffer, so the server never stalls on
  // a full socket that does not wake us.
  static constexpr int kReplyBatchBytes = 16384;
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
  // Connects to the server from a fresh local port; slot < 0 claims a free
  // replay slot, slot >= 0 reuses a restored one for reattaching.
  bool Open(ConnKey k, Conn* c, int slot = -1);
  void FlushOut(Conn* c);
  void Finish(std::map<ConnKey, Conn>::iterator it);
  void ForgetHanded(int slot);                // the slot's connection is gone: its inputs were read
  void NoteGone(const ConnKey& k, int slot);  // before its slot is released (KeyOfOutput)
  bool Drained(const ConnKey& k) const;       // the server read all we gave it

  ShimChannel* shim_;
  std::string host_;
  int port_;
  WatchFn watch_;
  LogFn log_;
  std::deque<Step> queue_;
  std::deque<Handed> handed_;  // the last kHandedKept DATA inputs written
  uint64_t read_by_gone_ = 0;  // bytes the server read on connections now gone
  std::map<ConnKey, Conn> conns_;
  std::map<int, ConnKey> by_fd_;
  static constexpr size_t kGoneKept = 4096;
  std::map<uint32_t, ConnKey> gone_;  // shim connection number -> key, for ended ones
  bool gated_ = false;
  // Accepts wait for the server to read what was handed to it before them
  // (Pump), while it reads some at least every kAcceptAheadMaxUs: since when
  // the current one waits without the server reading (or 0), and what
  // ServerTookAll's progress said then.
  static constexpr uint64_t kAcceptAheadMaxUs = 100000;
  uint64_t accept_waiting_since_us_ = 0;
  uint64_t accept_waiting_progress_ = 0;
};

}  // namespace lockstep
