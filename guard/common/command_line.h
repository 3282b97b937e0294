// command_line.h — a server's command line (cluster.toml's server.command,
// a profile's command) split into argv and joined back, the way a shell
// would quote it. Checked by the config parser, used to start the server.
#pragma once

#include <string>
#include <vector>

namespace lockstep {

// Splits a command line into argv the way a shell would without expansions:
// whitespace separates, '...' quotes literally, "..." quotes with backslash
// escapes, a backslash outside quotes escapes the next character; "" is an
// empty argument. false and *error on an unbalanced quote or a trailing
// backslash.
bool SplitCommand(const std::string& cmd, std::vector<std::string>* argv, std::string* error);

// The inverse of SplitCommand: quotes each argument only where needed.
std::string JoinCommand(const std::vector<std::string>& argv);

}  // namespace lockstep
