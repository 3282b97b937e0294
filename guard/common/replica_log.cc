// replica_log.cc — see replica_log.h.
#include "guard/common/replica_log.h"

#include <cstdarg>
#include <cstdio>

namespace lockstep {

void ReplicaLog::operator()(const char* fmt, ...) const {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  localtime_r(&ts.tv_sec, &tm);
  fprintf(stderr, "%02d:%02d:%02d.%06ld replica %d: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
          ts.tv_nsec / 1000, id_, buf);
}

}  // namespace lockstep
