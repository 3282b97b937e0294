/* shim_clock.h — the wall clock the server reads (shim_clock.c) and the
 * monotonic clock every layer above it times with. Above shim_state.h
 * only (README.md, "Layers"). */
#ifndef LOCKSTEP_SHIM_CLOCK_H
#define LOCKSTEP_SHIM_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "preload/shim_state.h"

LS_HIDDEN uint64_t now_ns(void);        /* the real CLOCK_MONOTONIC */
LS_HIDDEN uint64_t now_coarse_ns(void); /* the real CLOCK_MONOTONIC_COARSE */
LS_HIDDEN uint64_t real_wall_ns(void);  /* the real CLOCK_REALTIME */
/* LOCKSTEP_SHIM_SAME_CLOCK=1 in the process the daemon started (and not in
 * a forked child): the server's wall clock reads the stamps of its inputs. */
LS_HIDDEN extern int clk_on;
/* LOCKSTEP_SHIM_TIMERS=1 too: the server's timeouts are ticks in the log
 * (shim_abi.h, "Ticks"), and its monotonic clocks read the stamp. */
LS_HIDDEN extern int clk_ticks;
/* The server's wall clock now: the stamp, or the real clock before the
 * first input. */
LS_HIDDEN uint64_t clk_now_ns(void);
/* Timers in the log: this thread waits in a ticking epoll set; whatever
 * wakes it but its tick leaves its clocks standing still at what it read
 * last (shim_clock.c), until clk_release: it took a tick or read an input. */
LS_HIDDEN void clk_hold(void);
LS_HIDDEN void clk_release(void);
/* The server began to read an input stamped clock_ns (0: no stamp): its
 * wall clock reads that from now on, never less than before. mu held. */
LS_HIDDEN void clk_enter(uint64_t clock_ns);
/* A deadline on clock id the server computed from the stamp, as one on the
 * real clock (out, or abs itself when that clock is real). */
LS_HIDDEN const struct timespec* clk_deadline(clockid_t id, const struct timespec* abs,
                                              struct timespec* out);
/* The condition variable waits on CLOCK_MONOTONIC (else CLOCK_REALTIME). */
LS_HIDDEN int cond_is_monotonic(const pthread_cond_t* c);

#endif
