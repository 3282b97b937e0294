// sim_util.h — small helpers the simulator's files share (sim.cc, the
// cluster; sim_run.cc, the randomized run): message formatting and our own
// random draws. Internal to the simulator.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

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
