// assert.h — invariants that stay on in release builds. A broken invariant in
// a consensus protocol means data loss later: stop at once and say where.
// The simulator installs a handler that reports the seed instead of dying.
#pragma once

#include <string>

namespace lockstep {
// Called with the message of a violated invariant; the default prints it and
// aborts. A handler that returns makes LS_ASSERT abort anyway.
using AssertHandler = void (*)(const std::string& message);
void SetAssertHandler(AssertHandler handler);
[[noreturn]] void AssertFailed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
}  // namespace lockstep

#define LS_ASSERT(cond, ...)                                                       \
  do {                                                                             \
    if (!(cond)) ::lockstep::AssertFailed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)
