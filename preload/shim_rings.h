/* shim_rings.h — the input side facing the daemon (shim_rings.c): the
 * submission, done and order rings, the reply gate, the FIFO's pop, and
 * the client bytes taken from the kernel. Above shim_state.h, shim_clock.h,
 * shim_order.h and shim_output.h (README.md, "Layers"). mu held unless
 * said otherwise. */
#ifndef LOCKSTEP_SHIM_RINGS_H
#define LOCKSTEP_SHIM_RINGS_H

#include <stdint.h>

#include "preload/shim_state.h"

LS_HIDDEN void wake_daemon(void); /* the daemon sleeps: wake it */
/* Sleeps until the daemon's next outcome (done_futex moved past `seen`) or
 * for timeout_ns. Without mu. */
LS_HIDDEN void futex_wait_done(uint32_t seen, uint64_t timeout_ns);
LS_HIDDEN void fifo_pop_finished(void); /* drops the finished chunks at the head */
LS_HIDDEN void drain_done(void);        /* applies the daemon's completions and order */
/* Hands one input to the daemon; returns its seq. May drop mu while the
 * ring or the FIFO is full. */
LS_HIDDEN uint64_t submit(struct conn* c, uint8_t kind, const void* bytes, uint32_t len);
LS_HIDDEN void ingest(struct conn* c); /* kernel bytes into the inbox, submitted */
/* Puts the fresh connection in place of c's dead restored socket (closes fresh). */
LS_HIDDEN void reattach(struct conn* c, int fresh);
/* The reply gate: an input waits for the server's output on a connection. */
LS_HIDDEN int reply_gate_pending(void);
LS_HIDDEN void reply_gate_sent(int fd, uint64_t end); /* fd's output reached `end`; without mu */

#endif
