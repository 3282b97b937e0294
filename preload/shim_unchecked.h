/* shim_unchecked.h — replies left out of the hashed stream
 * (shim_unchecked.c, with resp_scan.h). Above shim_state.h only
 * (README.md, "Layers"). */
#ifndef LOCKSTEP_SHIM_UNCHECKED_H
#define LOCKSTEP_SHIM_UNCHECKED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "preload/shim_state.h"

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

#endif
