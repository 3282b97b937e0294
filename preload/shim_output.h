/* shim_output.h — the output side (shim_output.c): each tracked
 * connection's stream hash, window and digest records, and the send
 * wrappers. Above shim_state.h, shim_clock.h, shim_order.h, shim_stack.h,
 * shim_unchecked.h and shim_random.h (README.md, "Layers"); what it tells
 * the layers above (a send finished) goes through hooks.output_reached. */
#ifndef LOCKSTEP_SHIM_OUTPUT_H
#define LOCKSTEP_SHIM_OUTPUT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "preload/shim_state.h"

/* The region is mapped at base: hash outputs if its geometry is sane and
 * LOCKSTEP_SHIM_OUTPUT_DIGESTS allows. */
LS_HIDDEN void out_init(char* base);
/* A connection becomes tracked under fd: give it an output slot and a fresh
 * stream. Called with mu held. */
LS_HIDDEN void out_open(int fd, uint32_t conn, int replay_slot);
/* The stream under fd ends (LS_OUT_SHUT or LS_OUT_CLOSED). */
LS_HIDDEN void out_end(int fd, uint32_t flag);
/* In a forked child: nothing is hashed any more. */
LS_HIDDEN void out_after_fork(void);
/* fd's output slot, or -1 when its output is not hashed. */
LS_HIDDEN int out_slot(int fd);
/* fd's output stream offset (bytes compared so far); UINT64_MAX when not hashed. */
LS_HIDDEN uint64_t out_offset(int fd);
/* The leader's client on fd is gone: its stream is cut where it stands
 * (LS_OUT_CUT, once). Not the leader: nothing. Keeps errno. */
LS_HIDDEN void out_cut(int fd);
/* The server read n (> 0) bytes of iov from the tracked connection fd, the
 * first lease_n of them a lease read's (shim_rings.c lease_serve). */
LS_HIDDEN void out_input(int fd, const struct iovec* iov, int iovcnt, size_t n, size_t lease_n);

#endif
