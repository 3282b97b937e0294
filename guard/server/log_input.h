// log_input.h — the payload of a kInput log entry: what the leader's shim
// saw (an accepted connection, bytes a client sent, a close), naming the
// connection by the ballot that accepted it, and the leader's wall clock
// when it proposed it. One encoder and one decoder, used by the server
// pipeline (which proposes and applies inputs) and by `lockstep log` (which
// shows them).
//
// Layout: kind u8, ballot u64, conn u32, seq u64, bytes (u32 length +
// bytes), clock_ns u64, out_before u64. The last two were added later: an
// entry written before them still decodes, with 0 for what it lacks
// (clock_ns 0, "no stamp": its input runs at the previous input's time;
// out_before 0: no reply gate).
//
// A TICK (timers_in_log: a wait of the server timed out, preload/shim_abi.h
// "Ticks") names no connection: its key is (the proposing leader's ballot,
// the epoll set's fd), its bytes are empty and clock_ns is the time the
// server's clock moves to when it fires.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "guard/common/conn_key.h"

namespace lockstep {

struct Input {
  uint8_t kind = 0;  // LS_SUB_ACCEPT / DATA / CLOSE / TICK
  ConnKey key;
  uint64_t seq = 0;  // the shim's submission number (0: a CLOSE the daemon proposed)
  std::string bytes;
  // The leader's CLOCK_REALTIME (ns) when it proposed the input, never
  // below an earlier entry's: the server's wall clock while it processes
  // the input where the profile says same_clock (preload/shim_clock.c).
  uint64_t clock_ns = 0;
  // The connection's output stream offset when the leader's shim took this
  // input from the kernel: how much of its replies the leader's server had
  // sent. A backup's server reads the input only once it has sent as much on
  // its copy of the connection (the reply gate, preload/shim_rings.c drain_order),
  // so that a server that would read ahead and work on the next request while
  // a thread still answers the previous one (clamd's IDSESSION) sees the
  // requests on every replica as the leader's did, one reply at a time.
  uint64_t out_before = 0;
};
constexpr size_t kInputHeader = 1 + 8 + 4 + 8 + 4 + 8 + 8;  // everything but the bytes

std::string EncodeInput(uint8_t kind, ConnKey key, uint64_t seq, std::string_view bytes,
                        uint64_t clock_ns, uint64_t out_before = 0);
bool DecodeInput(std::string_view payload, Input* in);
// One line for people: "DATA 3.1/7 38 bytes after 5 bytes out: *3\r\n$3\r\nSET..."
// (escaped, at most max_bytes of the input shown; "after N bytes out": its
// out_before, where not 0), or "TICK 3.1 epoll set 9".
// Bytes for people: printable ASCII as is, \r \n \\ and \xNN for the rest.
std::string EscapeBytes(std::string_view bytes);
std::string DescribeInput(const Input& in, size_t max_bytes = 80);

}  // namespace lockstep
