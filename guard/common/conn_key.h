// conn_key.h — a client connection as the log names it, shared by every
// layer that speaks of connections (the log's inputs, the wire's output
// reports, the replayer, the output check) without pulling in any of them.
#pragma once

#include <compare>
#include <cstdint>

namespace lockstep {

// A client connection as the log names it: the ballot whose leader accepted
// it, and that leader's shim connection number.
struct ConnKey {
  uint64_t ballot = 0;
  uint32_t no = 0;
  auto operator<=>(const ConnKey&) const = default;
};

}  // namespace lockstep
