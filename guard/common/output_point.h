// output_point.h — how a replica's output on a connection is described
// wherever it travels: a digest point (the shim's, read by the server
// pipeline, reported over the wire, judged by output/output_check.h) and a
// send's stack (taken by the shim, named by server/symbolize.h, quoted in
// repair results and divergence reports). Shapes only: the layers that
// carry them include this, not each other.
#pragma once

#include <cstdint>
#include <string>

#include "guard/common/conn_key.h"

namespace lockstep {

// One digest of one connection's output, as a replica saw it.
struct OutputPoint {
  ConnKey key;           // the connection, as the log names it
  uint64_t offset = 0;   // the digest covers the stream bytes [0, offset)
  uint64_t digest = 0;   // XXH64 of those bytes
  uint64_t applied = 0;  // log entries handed to that replica's server when it was seen
  bool mark = false;     // at a multiple of the shim's mark interval (kept longer)
  // The stream ends here: the server closed the connection or shut it down
  // for writing. No later input makes it longer (JudgeLength).
  bool ended = false;
  // The leader's only: its client went away here (LS_OUT_CUT): no client
  // receives the stream past this point, so what a backup sends past it is
  // not compared (OutputChecker::PastCut).
  bool cut = false;
};

// One of the server's sends on the connection: the stream offsets its bytes
// took, and the server's stack at the send (named by server/symbolize.h,
// one "#i function+0x.. (file)" line per frame).
struct SendStack {
  uint64_t start = 0, end = 0;
  std::string frames;
};

}  // namespace lockstep
