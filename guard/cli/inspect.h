// inspect.h — `lockstep inspect`'s client side: an admin's connection to a
// replica's own server through that replica's daemon (TLS, admin_secret;
// the daemon's relay is guard/server/inspection.h). Three ways to use it:
// stdin/stdout (like nc), a PROGRAM given a local port to connect to
// ({host} and {port} in its arguments), or a local listener that serves
// until killed (--listen, for the test harness's forwarders).
#pragma once

#include <string>
#include <vector>

#include "guard/common/config.h"

namespace lockstep {

struct InspectOptions {
  int id = 0;
  // >= 0: listen on 127.0.0.1:listen_port (0: any free port, printed) and
  // relay each connection, until killed; with a program, it connects there.
  int listen_port = -1;
  std::vector<std::string> program;  // PROGRAM ARGS ({host}, {port} replaced)
};

// Runs the inspection; returns the exit status: PROGRAM's with a program,
// else 0 once the server's side ended, 1 when the inspection was refused
// or broke (said on stderr).
int RunInspect(const ClusterConfig& config, const InspectOptions& options);

}  // namespace lockstep
