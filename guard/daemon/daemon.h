// daemon.h — one replica: the protocol core (consensus/core.h) wired to its
// adapters — the UCX transport for log regions, acks and doorbells, the TCP
// message channel to the other daemons, the durable log and the client port
// where proposals and status requests arrive.
#pragma once

#include <string>

#include "guard/common/config.h"

namespace lockstep {

struct DaemonOptions {
  ClusterConfig config;
  int id = 0;
  bool verbose = false;
};

// Runs until SIGTERM/SIGINT; returns the process exit code.
int RunReplica(const DaemonOptions& options);

}  // namespace lockstep
