/* shim_clock.c — the same wall clock on every replica ("prevent what can be
 * prevented", issue 8 part 5).
 *
 * Each replica's server would otherwise read its own wall clock, at its own
 * moment: redis's TIME answers differ, and a key set with PX 200 expires at
 * another instant on each replica, so a GET 300 ms later finds it on a
 * backup that replayed both late and not on the leader. When the daemon
 * passes LOCKSTEP_SHIM_SAME_CLOCK=1 (the app profile's `same_clock`,
 * guard/common/config.h) to the process it started (LOCKSTEP_SHIM_PID), the wall
 * clock the server reads through libc is the stamp of the input it
 * processes: the leader's CLOCK_REALTIME when it proposed the input, carried
 * in the log entry (guard/server/log_input.h) and handed to the shim with the
 * input (ls_done_record on the leader, ls_order_record on backups:
 * shim_abi.h). Without the variable (or in any other process) nothing here
 * changes anything.
 *
 * What we chose, and why:
 *
 *  - "While it processes an input" is: from the moment the server reads
 *    into an input's bytes (shim_rings.c, clock_from_reads, when the read is
 *    taken) until it reads into the next one. Nothing else marks it: the
 *    shim does not know the server's commands. So that a read never spans
 *    two inputs (the leader may read two agreed inputs at once where a
 *    backup, whose second input arrives later, reads one), shim_order.c hands the
 *    server at most one input per read while this is on (find_head_run):
 *    every replica then reads the same bytes under the same stamp. Inputs
 *    of another connection come one at a time anyway. A command split over
 *    two inputs runs under the second one's stamp, everywhere.
 *
 *  - Between inputs the clock stays at the last input's stamp (frozen):
 *    whatever the server does from its timers then (redis's active expiry,
 *    its cron) sees the same time on every replica, and the clock never
 *    goes backwards (stamps only grow: the leader stamps max(previous,
 *    now), and the shim keeps the larger). The price: a server idle between
 *    inputs sees no time pass, so what its timers do by the wall clock
 *    waits for the next input (redis evicts expired keys then; a BLPOP
 *    timeout fires once some input arrives). And a duration the server
 *    measures on the wall clock within one input reads 0: redis's command
 *    durations (SLOWLOG, commandstats: it uses ustime() unless built with
 *    its hardware monotonic clock) and the time budget of its active-expiry
 *    cycle, which then goes on until few of the keys it samples are
 *    expired. Real time would be different on every replica.
 *
 *  - Before the server's first input (its start-up), the real clock: no
 *    agreed time exists yet, and a server's start-up is not replicated
 *    input. A backup replaying an old log may therefore see its clock step
 *    back once, at the first input, to that input's stamp.
 *
 *  - CLOCK_REALTIME, CLOCK_REALTIME_COARSE, gettimeofday, time and
 *    timespec_get(TIME_UTC) read the stamp; CLOCK_TAI reads the stamp plus
 *    the kernel's TAI offset (whole seconds: the same on replicas whose
 *    kernels agree on it). CLOCK_MONOTONIC, CLOCK_BOOTTIME and the CPU
 *    clocks stay real: servers run their timers and measure durations with
 *    them, and a frozen monotonic clock would stop their event loops.
 *
 *  - Unless timers are in the log too (LOCKSTEP_SHIM_TIMERS, the profile's
 *    `timers_in_log`, issue 31): then a wait's timeout is itself an input
 *    (a tick, shim_abi.h "Ticks"), which moves the stamp, so time passes on
 *    a quiet server, and the monotonic clocks (MONOTONIC, _COARSE, _RAW,
 *    BOOTTIME) read the stamp too: the server computes its timers from
 *    them (redis's ae), and which timer is due when a tick fires must be
 *    the same everywhere. The stamp is on the wall clock's scale, so the
 *    monotonic clocks step forward once, at the first input; they never go
 *    back. Unless the server is a clone (the profile's `cloned_start`,
 *    LOCKSTEP_SHIM_CLONED): then they read the stamp less the wall clock's
 *    lead over the monotonic one when the server started, so they go on
 *    from where its start-up left them (memcached counts its item times
 *    from a monotonic reading taken then). Every replica's server is the
 *    same image, lead included; without that, each replica's lead would be
 *    its own machine's and their monotonic clocks would differ.
 *
 *  - Once the daemon stops the server (LS_MODE_STOPPING), the stamp goes on
 *    with the real wall clock, held or not: no input will come, and the
 *    server's shutdown may wait for its own timers (redis's cron).
 *
 *  - With timers in the log, a thread woken in a ticking epoll set by
 *    anything but its tick (a new connection, a wait that a checkpoint's
 *    dump interrupted) finds its clocks standing still at what it read
 *    last, until it takes a tick or reads an input (clk_hold, clk_release).
 *    The stamp is the newest input any thread has read, and when such a
 *    wake-up comes differs on every replica (on a backup the daemon's
 *    replay connection arrives whenever the daemon reaches its ACCEPT):
 *    memcached's main thread, woken for a connection, looked at the clock,
 *    found the stamp past its 1 s timer's deadline while the tick for it
 *    was still on its way, and stepped `current_time` there, at another
 *    input on each replica (CI: items set in the same second expired a
 *    second apart on a backup). Standing still, the clock is never past
 *    the deadline the thread computed before it waited, so its timers fire
 *    at ticks only. What the thread last read is the same everywhere: a
 *    tick's or an input's stamp while it held the serial turn, or a
 *    cloned image's reading.
 *
 * The stamp lives in the server's memory: a CRIU checkpoint carries it, and
 * a restored server goes on from the checkpoint's time. A forked child (a
 * redis BGSAVE) reads the real clock: it processes no input.
 *
 * Not covered (stays as real as before): the monotonic clocks without
 * timers in the log, direct syscalls and the
 * vDSO called without libc (Go), rdtsc, libc's own internal reads (syslog's
 * timestamp), ftime, the file times the kernel writes (mtime), and a
 * server that ignores the input whose turn it is (shim_order.c opens the gate
 * then, and reads out of turn follow the head input's stamp).
 *
 * Hot path: one load and a branch before the real call; no allocation, no
 * lock (the stamp is one atomic word, written under shim_state.c's mu by the
 * thread that reads an input, read by any thread). errno is untouched: the
 * stamp path sets nothing, the real calls set what they would.
 */
#define _GNU_SOURCE
#include "preload/shim_clock.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "preload/shim_state.h"

/* ------------------------------------------------------------ real calls */

static int (*real_clock_gettime)(clockid_t, struct timespec*);
static int (*real_gettimeofday)(struct timeval*, void*);
static time_t (*real_time)(time_t*);
static int (*real_timespec_get)(struct timespec*, int);

/* These may run before our constructor (another library's constructor, or
 * the dynamic loader's): each looks its real call up itself when needed
 * (LS_REAL). */

/* ------------------------------------------------------------ state */

int clk_on;                      /* shim_clock.h */
int clk_ticks;                   /* shim_clock.h */
static _Atomic(uint64_t) clk_ns; /* the stamp the clock reads (0: no input yet: real) */
/* What the monotonic clocks read less than the stamp while timers are in
 * the log: 0, or a clone's wall clock lead at start-up (see above). */
static uint64_t clk_mono_behind_ns;

/* Per thread (clk_hold): whether its clocks stand still, and what it read
 * last from the wall and the monotonic family (ns on each one's scale; 0:
 * nothing yet). Recorded only while timers are in the log. */
static __thread int clk_held;
static __thread uint64_t clk_last_wall_ns;
static __thread uint64_t clk_last_mono_ns;

static void clk_in_child(void) {
  clk_on = 0; /* a forked child processes no input: the real clock */
  clk_ticks = 0;
}

__attribute__((constructor)) static void clk_init(void) {
  int saved = errno;
  LS_REAL(clock_gettime);
  LS_REAL(gettimeofday);
  LS_REAL(time);
  LS_REAL(timespec_get);
  const char* on = getenv("LOCKSTEP_SHIM_SAME_CLOCK");
  const char* pid = getenv("LOCKSTEP_SHIM_PID");
  /* Only the process the daemon started (see shim.c): an exec'd child
   * inherits the environment but is not the server. */
  if (on && strcmp(on, "1") == 0 && pid && atoi(pid) == (int)getpid()) {
    clk_on = 1;
    const char* timers = getenv("LOCKSTEP_SHIM_TIMERS");
    clk_ticks = timers && strcmp(timers, "1") == 0;
    const char* cloned = getenv("LOCKSTEP_SHIM_CLONED");
    if (clk_ticks && cloned && strcmp(cloned, "1") == 0) {
      struct timespec wall, mono;
      real_clock_gettime(CLOCK_REALTIME, &wall);
      real_clock_gettime(CLOCK_MONOTONIC, &mono);
      uint64_t w = (uint64_t)wall.tv_sec * 1000000000ull + (uint64_t)wall.tv_nsec;
      uint64_t m = (uint64_t)mono.tv_sec * 1000000000ull + (uint64_t)mono.tv_nsec;
      clk_mono_behind_ns = w > m ? w - m : 0;
    }
    pthread_atfork(NULL, NULL, clk_in_child);
  }
  errno = saved;
}

void clk_enter(uint64_t clock_ns) { /* shim_clock.h; called with mu held */
  if (!clock_ns) return;            /* an entry from before the stamps: the last one's time */
  if (clock_ns > atomic_load_explicit(&clk_ns, memory_order_relaxed))
    atomic_store_explicit(&clk_ns, clock_ns, memory_order_relaxed);
}

static uint64_t real_ns(clockid_t id) {
  struct timespec ts;
  LS_REAL(clock_gettime);
  real_clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Every layer's clock for timeouts (shim_clock.h): the real CLOCK_MONOTONIC
 * (the server's reads the stamp while timers are on). */
uint64_t now_ns(void) {
  return real_ns(CLOCK_MONOTONIC);
}

uint64_t now_coarse_ns(void) {
  return real_ns(CLOCK_MONOTONIC_COARSE);
}

uint64_t real_wall_ns(void) {
  return real_ns(CLOCK_REALTIME);
}

/* The clocks the shim answers: the wall family reads the stamp whenever
 * same_clock is on, the monotonic one only while timers are in the log
 * (it computes the server's timers then); any other clock stays real. */
enum clk_family { CLK_REAL, CLK_WALL, CLK_MONO };

static enum clk_family family_of(clockid_t id) {
  if (!clk_on) return CLK_REAL;
  if (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) return CLK_WALL;
  if (clk_ticks && (id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE ||
                    id == CLOCK_MONOTONIC_RAW || id == CLOCK_BOOTTIME))
    return CLK_MONO;
  return CLK_REAL;
}

static uint64_t* last_read(enum clk_family f) {
  return f == CLK_WALL ? &clk_last_wall_ns : &clk_last_mono_ns;
}

/* What family f reads now in this thread, on its own scale (the monotonic
 * one is the stamp less clk_mono_behind_ns); 0: the real clock (before the
 * first input, or a clock left real). Nothing recorded. */
static uint64_t clk_peek(enum clk_family f) {
  if (f == CLK_REAL || !clk_on) return 0;
  int stopping = hdr && atomic_load_explicit(&hdr->mode, memory_order_relaxed) == LS_MODE_STOPPING;
  if (clk_held && *last_read(f) && !stopping) return *last_read(f);
  uint64_t t = atomic_load_explicit(&clk_ns, memory_order_relaxed);
  if (!t) return 0;
  if (stopping) { /* no more inputs: the stamp goes on with the real clock, never back */
    uint64_t real = real_wall_ns();
    if (real > t) t = real;
  }
  return f == CLK_MONO && t > clk_mono_behind_ns ? t - clk_mono_behind_ns : t;
}

/* The same, as the server's read: remembered for clk_hold. */
static uint64_t clk_read(enum clk_family f) {
  uint64_t r = clk_peek(f);
  if (r && clk_ticks) *last_read(f) = r;
  return r;
}

/* The server read the real clock of family f (no stamp yet): remembered. */
static void clk_read_real(enum clk_family f, uint64_t ns) {
  if (f != CLK_REAL && clk_ticks) *last_read(f) = ns;
}

void clk_hold(void) { /* shim_clock.h */
  if (clk_ticks) clk_held = 1;
}

void clk_release(void) { /* shim_clock.h */
  clk_held = 0;
}

uint64_t clk_now_ns(void) {
  if (clk_held && (clk_last_wall_ns || clk_last_mono_ns)) {
    /* The later of the two readings (the monotonic one on the wall's
     * scale): the server computed its timeout from one of them. */
    uint64_t mono = clk_last_mono_ns ? clk_last_mono_ns + clk_mono_behind_ns : 0;
    return clk_last_wall_ns > mono ? clk_last_wall_ns : mono;
  }
  uint64_t t = clk_peek(CLK_WALL);
  return t ? t : real_wall_ns();
}

static void to_timespec(uint64_t ns, struct timespec* ts) {
  ts->tv_sec = (time_t)(ns / 1000000000ull);
  ts->tv_nsec = (long)(ns % 1000000000ull);
}

/* The kernel's TAI - UTC offset, rounded to whole seconds (it is whole; the
 * two reads are a few ns apart). */
static int64_t tai_offset_ns(void) {
  struct timespec utc, tai;
  if (real_clock_gettime(CLOCK_REALTIME, &utc) != 0 || real_clock_gettime(CLOCK_TAI, &tai) != 0)
    return 0;
  int64_t d = ((int64_t)tai.tv_sec - (int64_t)utc.tv_sec) * 1000000000ll +
              ((int64_t)tai.tv_nsec - (int64_t)utc.tv_nsec);
  int64_t s = (d + (d >= 0 ? 500000000ll : -500000000ll)) / 1000000000ll;
  return s * 1000000000ll;
}

/* ------------------------------------------------------------ the calls */

static uint64_t ns_of(const struct timespec* ts) {
  return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

int clock_gettime(clockid_t id, struct timespec* ts) {
  LS_REAL(clock_gettime);
  enum clk_family f = family_of(id);
  uint64_t t = clk_read(f);
  if (t) {
    to_timespec(t, ts);
    return 0;
  }
  if (id == CLOCK_TAI && (t = clk_peek(CLK_WALL))) {
    int saved = errno;
    to_timespec(t + (uint64_t)tai_offset_ns(), ts);
    errno = saved;
    return 0;
  }
  int rc = real_clock_gettime(id, ts);
  if (rc == 0) clk_read_real(f, ns_of(ts));
  return rc;
}

/* The wall clock as the server reads it (remembered for clk_hold). */
static uint64_t wall_read(void) {
  uint64_t t = clk_read(CLK_WALL); /* 0 without same_clock (clk_ticks implies it) */
  if (!t && clk_ticks) clk_read_real(CLK_WALL, t = real_wall_ns());
  return t;
}

int gettimeofday(struct timeval* restrict tv, void* restrict tz) {
  LS_REAL(gettimeofday);
  uint64_t t = wall_read();
  if (!t) return real_gettimeofday(tv, tz);
  if (tz) memset(tz, 0, sizeof(struct timezone)); /* obsolete: glibc >= 2.31 zeroes it too */
  tv->tv_sec = (time_t)(t / 1000000000ull);
  tv->tv_usec = (suseconds_t)(t % 1000000000ull / 1000);
  return 0;
}

time_t time(time_t* tloc) {
  LS_REAL(time);
  uint64_t t = wall_read();
  if (!t) return real_time(tloc);
  time_t s = (time_t)(t / 1000000000ull);
  if (tloc) *tloc = s;
  return s;
}

int timespec_get(struct timespec* ts, int base) {
  LS_REAL(timespec_get);
  uint64_t t = base == TIME_UTC ? wall_read() : 0;
  if (!t) return real_timespec_get(ts, base);
  to_timespec(t, ts);
  return base;
}

/* ------------------------------------------------------------ deadlines */

/* Waits until a deadline on a stamped clock (the wall clock; the monotonic
 * ones too while timers are in the log). A server computes such a deadline
 * from the clock it reads, now + timeout: here the stamp, which stands
 * still between inputs and so falls behind the real clock while the server
 * is idle. Waited for as given, the deadline would soon be long past, and
 * every idle thread that waits with a timeout would wake at once, read the
 * same stamp, compute the same past deadline and spin (MariaDB's and
 * libupnp's thread pools in pthread_cond_timedwait: 60% of a core per idle
 * mariadbd, 3.65 s of CPU per 10 s per idle gerbera). So such a deadline is
 * taken as "that long after the stamp" and waited for that long in real
 * time on the same clock; one at or before the stamp is already due. These
 * timeouts are each replica's own business: nothing the server computes is
 * stamped by when such a wait ends, only by the inputs it reads (and, with
 * timers in the log, by the ticks of its epoll waits). */
const struct timespec* clk_deadline(clockid_t id, const struct timespec* abs,
                                    struct timespec* out) {
  uint64_t t = clk_peek(family_of(id)); /* what the server computed it from */
  if (!t || !abs || abs->tv_nsec < 0 || abs->tv_nsec >= 1000000000l || abs->tv_sec < 0)
    return abs; /* the real clock, or not ours to judge (the call says EINVAL) */
  int saved = errno;
  uint64_t real = real_ns(id);
  errno = saved;
  uint64_t want = ns_of(abs);
  to_timespec(want > t ? real + (want - t) : real, out);
  return out;
}

/* glibc's condition variables keep their clock in __wrefs (bit 1:
 * CLOCK_MONOTONIC, set by pthread_condattr_setclock): a monotonic deadline
 * is real, unless timers are in the log. */
int cond_is_monotonic(const pthread_cond_t* c) {
  return (atomic_load_explicit((_Atomic(unsigned int)*)&c->__data.__wrefs, memory_order_relaxed) &
          2) != 0;
}

static int (*real_pthread_mutex_timedlock)(pthread_mutex_t*, const struct timespec*);
static int (*real_pthread_rwlock_timedrdlock)(pthread_rwlock_t*, const struct timespec*);
static int (*real_pthread_rwlock_timedwrlock)(pthread_rwlock_t*, const struct timespec*);
static int (*real_sem_timedwait)(sem_t*, const struct timespec*);
static int (*real_clock_nanosleep)(clockid_t, int, const struct timespec*, struct timespec*);

int pthread_mutex_timedlock(pthread_mutex_t* restrict m, const struct timespec* restrict abs) {
  LS_REAL(pthread_mutex_timedlock);
  struct timespec d;
  return real_pthread_mutex_timedlock(m, clk_deadline(CLOCK_REALTIME, abs, &d));
}

int pthread_rwlock_timedrdlock(pthread_rwlock_t* restrict l, const struct timespec* restrict abs) {
  LS_REAL(pthread_rwlock_timedrdlock);
  struct timespec d;
  return real_pthread_rwlock_timedrdlock(l, clk_deadline(CLOCK_REALTIME, abs, &d));
}

int pthread_rwlock_timedwrlock(pthread_rwlock_t* restrict l, const struct timespec* restrict abs) {
  LS_REAL(pthread_rwlock_timedwrlock);
  struct timespec d;
  return real_pthread_rwlock_timedwrlock(l, clk_deadline(CLOCK_REALTIME, abs, &d));
}

int sem_timedwait(sem_t* restrict s, const struct timespec* restrict abs) {
  LS_REAL(sem_timedwait);
  struct timespec d;
  return real_sem_timedwait(s, clk_deadline(CLOCK_REALTIME, abs, &d));
}

int clock_nanosleep(clockid_t id, int flags, const struct timespec* req, struct timespec* rem) {
  LS_REAL(clock_nanosleep);
  struct timespec d;
  if (flags & TIMER_ABSTIME) req = clk_deadline(id, req, &d);
  return real_clock_nanosleep(id, flags, req, rem);
}
