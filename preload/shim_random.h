/* shim_random.h — the same randomness on every replica (shim_random.c).
 * Above shim_state.h and shim_order.h (README.md, "Layers"). */
#ifndef LOCKSTEP_SHIM_RANDOM_H
#define LOCKSTEP_SHIM_RANDOM_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "preload/shim_state.h"

/* fd -> 1 + the stream slot of a random device the server opened (with
 * LOCKSTEP_SHIM_RANDOM_SEED set); 0: not one. */
LS_HIDDEN extern _Atomic(uint8_t) rnd_fd_slot[LS_MAX_FD];
static inline int rnd_tracked(int fd) {
  return fd >= 0 && fd < LS_MAX_FD && atomic_load_explicit(&rnd_fd_slot[fd], memory_order_relaxed);
}
/* read/readv of a tracked fd: the real call, its bytes replaced by the
 * fd's deterministic stream. */
LS_HIDDEN ssize_t rnd_readv(int fd, const struct iovec* iov, int iovcnt);
/* The server closes fd: it is no random device of ours any more. */
LS_HIDDEN void rnd_forget_slow(int fd);
static inline void rnd_forget(int fd) {
  if (rnd_tracked(fd)) rnd_forget_slow(fd);
}

#endif
