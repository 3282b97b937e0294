// bench.h — `lockstep bench consensus|failover` and `lockstep demo`: their
// command lines, added to lockstep's (main.cc), and what they run.
#pragma once

#include "guard/cli/options.h"

namespace lockstep {
void AddBench(CommandLine& cl);
void AddDemo(CommandLine& cl);
}  // namespace lockstep
