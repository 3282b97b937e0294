/* shim_internal.h — what the shim's own files (shim.c, shim_output.c,
 * shim_random.c, shim_unchecked.c, shim_clock.c) share.
 * Nothing here is exported from the library: the server and its other
 * libraries never see these names. */
#ifndef LOCKSTEP_SHIM_INTERNAL_H
#define LOCKSTEP_SHIM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "preload/shim_abi.h"

#define LS_MAX_FD 65536
#define LS_HIDDEN __attribute__((visibility("hidden")))

/* shim.c */
LS_HIDDEN extern struct ls_shim_header* hdr; /* the daemon's region; NULL: not attached */
LS_HIDDEN extern pthread_mutex_t mu;         /* the connection table's lock */
LS_HIDDEN void shim_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* shim_output.c */
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
/* The server read n (> 0) bytes of iov from the tracked connection fd. */
LS_HIDDEN void out_input(int fd, const struct iovec* iov, int iovcnt, size_t n);

/* shim_unchecked.c: replies left out of the hashed stream. */
LS_HIDDEN extern int unck_on; /* LOCKSTEP_SHIM_UNCHECKED_RESP names commands */
LS_HIDDEN void unck_init(void);
/* A fresh connection in output slot slot (with the slot's output lock). */
LS_HIDDEN void unck_open(int slot);
/* The server read n bytes of iov on slot's connection (under mu). */
LS_HIDDEN void unck_input(int slot, const struct iovec* iov, int iovcnt, size_t n);
/* The server sent the first n bytes of iov on slot's connection (with the
 * slot's output lock): feed(ctx, run) for each run of checked bytes, in
 * order; returns how many there were. count_only: only count them (feed may
 * be NULL), leaving the scanner where it was. */
LS_HIDDEN size_t unck_output(int slot, const struct iovec* iov, size_t iovcnt, size_t n,
                             int count_only, void (*feed)(void* ctx, const char* p, size_t n),
                             void* ctx);

/* shim_random.c */
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

/* shim_clock.c */
/* LOCKSTEP_SHIM_SAME_CLOCK=1 in the process the daemon started (and not in
 * a forked child): the server's wall clock reads the stamps of its inputs. */
LS_HIDDEN extern int clk_on;
/* The server began to read an input stamped clock_ns (0: no stamp): its
 * wall clock reads that from now on, never less than before. mu held. */
LS_HIDDEN void clk_enter(uint64_t clock_ns);

#endif
