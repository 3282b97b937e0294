/* shim_clock.h — the wall clock the server reads (shim_clock.c) and the
 * monotonic clock every layer above it times with. Above shim_state.h
 * only (README.md, "Layers"). */
#ifndef LOCKSTEP_SHIM_CLOCK_H
#define LOCKSTEP_SHIM_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "preload/shim_state.h"

LS_HIDDEN uint64_t now_ns(void); /* CLOCK_MONOTONIC */
/* LOCKSTEP_SHIM_SAME_CLOCK=1 in the process the daemon started (and not in
 * a forked child): the server's wall clock reads the stamps of its inputs. */
LS_HIDDEN extern int clk_on;
/* The server began to read an input stamped clock_ns (0: no stamp): its
 * wall clock reads that from now on, never less than before. mu held. */
LS_HIDDEN void clk_enter(uint64_t clock_ns);
/* A CLOCK_REALTIME deadline the server computed from the stamp, as one on
 * the real clock (out, or abs itself when the clock is real). */
LS_HIDDEN const struct timespec* clk_deadline(const struct timespec* abs, struct timespec* out);
/* The condition variable waits on CLOCK_MONOTONIC: its deadline is real. */
LS_HIDDEN int cond_is_monotonic(const pthread_cond_t* c);

#endif
