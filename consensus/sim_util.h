// sim_util.h — small helpers the simulator's files share (sim.cc, the
// cluster; sim_invariants.cc, its checks; sim_run.cc, the randomized run):
// message formatting, tracing, values compared, and our own random draws.
// Internal to the simulator.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

#include "consensus/log_format.h"

namespace lockstep::sim_util {

inline std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string Format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

using U = unsigned long long;

// A payload as a trace or a violation shows it: at most 24 characters.
inline std::string Short(const std::string& s) {
  if (s.size() <= 24) return s;
  return s.substr(0, 20) + Format("..(%zu)", s.size());
}

// The same value (what Paxos compares): type and payload, whatever the ballot.
inline bool SameValue(const Entry& a, const Entry& b) {
  return a.type == b.type && a.payload == b.payload;
}

// A line of the run's trace, inside SimCluster's members (tracing, Trace).
#define SIM_TRACE(...)                         \
  do {                                         \
    if (tracing()) Trace(Format(__VA_ARGS__)); \
  } while (0)

// Our own draws instead of <random>'s distributions, whose algorithms differ
// between standard libraries: a seed replays the same run everywhere.
inline uint64_t Uniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return lo;
  uint64_t span = hi - lo + 1;
  return span == 0 ? rng() : lo + rng() % span;
}
inline double Unit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}
inline bool Bernoulli(std::mt19937_64& rng, double p) {
  return p > 0 && Unit(rng) < p;
}

}  // namespace lockstep::sim_util
