/* shim_unchecked.h — replies left out of the hashed stream
 * (shim_unchecked.c, with resp_scan.h). Above shim_state.h only
 * (README.md, "Layers"). */
#ifndef LOCKSTEP_SHIM_UNCHECKED_H
#define LOCKSTEP_SHIM_UNCHECKED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "preload/shim_state.h"

LS_HIDDEN extern int unck_on; /* LOCKSTEP_SHIM_UNCHECKED_RESP names commands, or lease reads */
LS_HIDDEN void unck_init(void);
/* Lease reads (LOCKSTEP_SHIM_LEASE_READS_RESP, or _MEMCACHED for memcached's
 * text protocol, mc_scan.h): the leader serves a client's
 * request made only of these read-only commands without the log while its
 * daemon holds the lease (shim_rings.c lease_serve); their replies are left
 * out of the hashed stream, as the backups never see them. hashed: the
 * output is hashed (the replies must then be found and left out). */
LS_HIDDEN extern int lease_on;
LS_HIDDEN void lease_init(int hashed);
/* n bytes a client sent on a connection whose earlier bytes the server has
 * all read (output slot `slot`, -1: not hashed): how many requests they
 * hold when they are whole multibulk requests, each of a lease-read
 * command, at a request boundary outside MULTI (memcached: whole get, gets
 * or mg lines, mc_lease_requests), and their replies fit in
 * the slot's queue; 0 otherwise (they go through the log). Under mu. */
LS_HIDDEN int unck_lease_requests(int slot, const char* p, size_t n);
/* A fresh connection in output slot slot (with the slot's output lock). */
LS_HIDDEN void unck_open(int slot);
/* The server read n bytes of iov on slot's connection (under mu), of which
 * the first lease_n are a lease read's: all their requests' replies are
 * left out. */
LS_HIDDEN void unck_input(int slot, const struct iovec* iov, int iovcnt, size_t n, size_t lease_n);
/* The server sent the first n bytes of iov on slot's connection (with the
 * slot's output lock): feed(ctx, run) for each run of checked bytes, in
 * order; returns how many there were. count_only: only count them (feed may
 * be NULL), leaving the scanner where it was. */
LS_HIDDEN size_t unck_output(int slot, const struct iovec* iov, size_t iovcnt, size_t n,
                             int count_only, void (*feed)(void* ctx, const char* p, size_t n),
                             void* ctx);

#endif
