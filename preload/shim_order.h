/* shim_order.h — the delivery order's queries (shim_order.c): what the
 * server may read now, what the kernel watches for a tracked connection,
 * which listener is the client port. Above shim_state.h and shim_clock.h
 * (README.md, "Layers"). mu held unless said otherwise. */
#ifndef LOCKSTEP_SHIM_ORDER_H
#define LOCKSTEP_SHIM_ORDER_H

#include <stdint.h>

#include "preload/shim_state.h"

/* The delivery window: the head run (see find_head_run). */
struct head_run {
  struct conn* c;
  uint64_t end;
  int close;
};

LS_HIDDEN int chunk_finished(const struct chunk* h); /* read (or dropped) whole */
LS_HIDDEN int gate_bypassed(void); /* the server ignores the head: every connection reads */
LS_HIDDEN struct head_run find_head_run(void);
LS_HIDDEN struct chunk* head_tick(void); /* the agreed tick at the head, any set's */
/* The agreed tick at the head, when it is epoll set epfd's; else NULL. */
LS_HIDDEN struct chunk* tick_at_head(int epfd);
LS_HIDDEN uint64_t readable(struct conn* c); /* agreed bytes the server may read now */
LS_HIDDEN int eof_ready(struct conn* c);     /* the server may read c's EOF now */
LS_HIDDEN int ready(struct conn* c);         /* the server may read c now (bytes or EOF) */
LS_HIDDEN uint32_t kernel_interest(const struct conn* c); /* epoll events the kernel watches */
LS_HIDDEN void rearm_kernel(struct conn* c);              /* ... registered anew */
/* A send on fd would block (EAGAIN): an EPOLLET server hears the next
 * EPOLLOUT edge (shim_wait.c). Without mu. */
LS_HIDDEN void wait_send_blocked(int fd);
LS_HIDDEN int is_client_listener(int lfd); /* lfd listens on the client port */
LS_HIDDEN void listen_check(int fd);       /* before listen(): refused in a forked process */

#endif
