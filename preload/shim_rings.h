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
/* A replay connection the order owes nothing it has not taken from the
 * kernel (a wait leaves its kernel input out), or one it owes bytes or an
 * EOF still in the kernel or on their way. */
LS_HIDDEN int replay_owes_nothing(const struct conn* c);
LS_HIDDEN int replay_bytes_due(const struct conn* c);
/* Puts the fresh connection in place of c's dead restored socket (closes fresh). */
LS_HIDDEN void reattach(struct conn* c, int fresh);
/* Ticks (shim_abi.h "Ticks"). The set's tick record, created when first
 * needed (NULL: epfd cannot be a set, or no memory). */
LS_HIDDEN struct conn* tick_conn(int epfd);
/* The leader: epoll set epfd's wait timed out at server clock min_clock_ns;
 * a TICK is submitted unless one is in flight or was dropped < 10 ms ago. */
LS_HIDDEN void submit_tick(int epfd, uint64_t min_clock_ns);
LS_HIDDEN int tick_pending(int epfd);       /* the leader's own tick of the set is in flight */
LS_HIDDEN uint64_t tick_retry_at(int epfd); /* now_ns() before which none is submitted */
/* A wait in set epfd takes the agreed tick at the head, if it is the set's
 * (and, under serial_inputs, no input executes): the server's clock moves
 * to its stamp. Returns the set's tick record, NULL when none was taken. */
LS_HIDDEN struct conn* take_tick(int epfd);
LS_HIDDEN void forget_ticks(int epfd); /* the server closed epoll set epfd */
/* The reply gate: an input waits for the server's output on a connection. */
LS_HIDDEN int reply_gate_pending(void);
LS_HIDDEN void reply_gate_sent(int fd, uint64_t end); /* fd's output reached `end`; without mu */

#endif
