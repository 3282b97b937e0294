// assert.h — invariants that stay on in release builds. A broken invariant in
// a consensus protocol means data loss later; stop at once and say where.
#pragma once

#include <cstdio>
#include <cstdlib>

#define LS_ASSERT(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "lockstep: invariant violated at %s:%d: %s: ",      \
                   __FILE__, __LINE__, #cond);                                 \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n");                                              \
      std::abort();                                                            \
    }                                                                          \
  } while (0)
