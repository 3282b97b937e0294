// bench.h — `lockstep bench consensus|failover` and `lockstep demo`.
#pragma once

namespace lockstep {
int CmdBench(int argc, char** argv);
int CmdDemo(int argc, char** argv);
}  // namespace lockstep
