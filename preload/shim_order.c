/* shim_order.c — the delivery order's queries (README.md, "Layers"): which
 * connection the server may read now and how much (the head run, the gate),
 * when a chunk at the FIFO's head is done with, what the kernel is asked to
 * watch for a tracked connection, and which listener is the client port.
 * Above shim_state.c and shim_clock.c; whether another connection's input
 * executes (serial_inputs, above) it asks through hooks.executing_other.
 *
 * Same rules as shim.c: errno preserved, no allocation; mu held unless said
 * otherwise. */
#define _GNU_SOURCE
#include "preload/shim_order.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "preload/shim_abi.h"
#include "preload/shim_clock.h"
#include "preload/shim_state.h"

#define LS_GATE_BYPASS_REPORTS 16u      /* told this often it may read, and did not */
#define LS_GATE_BYPASS_NS 1000000000ull /* or 1 s without progress */

/* ------------------------------------------------------------ the FIFO head */

/* A chunk at the head is done with once the server can never need it again. */
int chunk_finished(const struct chunk* h) {
  const struct conn* c = h->c;
  if (h->state == CH_DROPPED) return 1;
  if (h->state != CH_COMMITTED) return 0;
  if (c->fd < 0) return 1; /* the server closed the connection */
  switch (h->kind) {
    case LS_SUB_ACCEPT: return 1;
    case LS_SUB_DATA: return c->consumed >= h->end;
    case LS_SUB_CLOSE: return c->eof_read;
    case LS_SUB_TICK: return c->consumed >= h->end; /* a wait in its set took it */
  }
  return 1;
}

/* The gate is open (every connection reads its agreed bytes) while the
 * server ignores the head input: it was told often enough that it may read
 * it and went on without, or a long time passed. Not a short timeout: a
 * server merely descheduled for a while (tens of ms happen here) must not
 * open it, or its order could differ from the backups'. */
int gate_bypassed(void) {
  if (!fifo_count) return 1;
  struct chunk* h = &fifo[fifo_head_seq & (LS_FIFO_SLOTS - 1)];
  if (h->state != CH_COMMITTED) return 0;
  /* A tick is taken by the next wait in its set, whenever the server comes
   * back to it (a long command is no reason to let others pass it). */
  if (h->kind == LS_SUB_TICK) return 0;
  if (hooks.executing_other(h->c)) return 0;
  return head_reports >= LS_GATE_BYPASS_REPORTS || now_ns() - head_since_ns > LS_GATE_BYPASS_NS;
}

/* ------------------------------------------------------------ readability */

/* The delivery window is the head run: the consecutive agreed inputs of one
 * connection at the FIFO head. Only that connection may read, and only up to
 * the end of its run; the next connection's turn comes once the server has
 * read it. So a server executes inputs in the log's order, which is the
 * order the backups replay.
 *
 * Why not a wider window (several connections' runs readable at once, in log
 * order, so the server takes several inputs per wake-up): the backups cannot
 * reproduce the server's order then. epoll does not report sockets in the
 * order their data arrived (a level-triggered socket reported once stays
 * queued at its old place), and with it memcached's stores, hence its CAS
 * uniques, came out in another order on the backups.
 *
 * Returns the head run's connection (NULL if the head input is not agreed
 * yet), with the stream offset its data runs to and whether it ends in EOF.
 * Called with mu held. */

struct head_run find_head_run(void) {
  struct head_run r = {NULL, 0, 0};
  for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count; s++) {
    struct chunk* ch = fifo_at(s);
    if (chunk_finished(ch)) continue;
    if (ch->state != CH_COMMITTED) break;
    if (ch->kind == LS_SUB_ACCEPT) continue;         /* delivered by accept itself */
    if (ch->kind == LS_SUB_TICK) break;              /* a wait takes it (tick_at_head) */
    if (r.c && ch->c != r.c) break;                  /* the next connection's run */
    if (!r.c && hooks.executing_other(ch->c)) break; /* serial_inputs: not its turn yet */
    if (!r.c) {
      r.c = ch->c;
      r.end = ch->c->consumed;
    }
    if (ch->kind == LS_SUB_DATA) {
      r.end = ch->end;
      if (clk_on) break; /* one input per read: each runs under its own stamp (shim_clock.c) */
    }
    if (ch->kind == LS_SUB_CLOSE) r.close = 1;
  }
  return r;
}

/* The agreed tick at the FIFO's head (the first chunk not done with),
 * whichever set's it is; NULL otherwise. Called with mu held. */
struct chunk* head_tick(void) {
  for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count; s++) {
    struct chunk* ch = fifo_at(s);
    if (chunk_finished(ch)) continue;
    return ch->state == CH_COMMITTED && ch->kind == LS_SUB_TICK ? ch : NULL;
  }
  return NULL;
}

/* The agreed tick at the FIFO's head, if it is epoll set epfd's: a wait in
 * that set takes it now. NULL otherwise. Called with mu held. */
struct chunk* tick_at_head(int epfd) {
  struct chunk* ch = head_tick();
  if (!ch || epfd < 0 || epfd >= LS_MAX_FD || ch->c != tick_conns[epfd]) return NULL;
  /* serial_inputs: a tick is a turn like an input's (the timer's work
   * must not run beside another thread's input). */
  return hooks.executing_other(ch->c) ? NULL : ch;
}

/* Bytes connection c may hand to the server now. Called with mu held. */
uint64_t readable(struct conn* c) {
  /* A replayed input may be allowed before all its bytes arrived. */
  uint64_t have = c->committed_end < c->received ? c->committed_end : c->received;
  if (c->consumed >= have) return 0;
  if (gate_bypassed()) return have - c->consumed;
  /* A lease read's bytes are the server's to read at once (lease_serve). */
  uint64_t end = c->unordered_end < have ? c->unordered_end : have;
  struct head_run r = find_head_run();
  if (r.c == c && r.end > end) end = r.end < have ? r.end : have;
  return end > c->consumed ? end - c->consumed : 0;
}

/* EOF may be reported once everything agreed before it was read. */
int eof_ready(struct conn* c) {
  if (c->eof_read) return 1;
  if (c->consumed < c->committed_end) return 0;
  if (c->log_closed) return 1;
  if (!c->close_committed) return 0;
  if (gate_bypassed()) return 1;
  struct head_run r = find_head_run();
  return r.c == c && r.close;
}

int ready(struct conn* c) {
  return readable(c) > 0 || eof_ready(c);
}

/* ------------------------------------------------------------ the kernel's interest */

/* The kernel interest the shim registers for a tracked connection: what the
 * server asked for, level-triggered and never one-shot (the shim must hear
 * every client byte to ingest it; shim_wait.c gives the server its one-shot
 * and edge semantics), without input once EOF was taken, and without the
 * events the server must not hear now: all but input while one-shot
 * disarmed, EPOLLOUT after an edge was told. */
uint32_t kernel_interest(const struct conn* c) {
  uint32_t kernel = c->events & ~(uint32_t)(EPOLLET | EPOLLONESHOT);
  /* Every flag a socket's arriving bytes raise (a server may ask for
   * EPOLLPRI beside EPOLLIN: MariaDB's poll does), or they would still wake. */
  if (c->replay_in_off)
    kernel &= ~(uint32_t)(EPOLLIN | EPOLLPRI | EPOLLRDNORM | EPOLLRDBAND | EPOLLRDHUP);
  if (c->disarmed) kernel &= (uint32_t)(EPOLLIN | EPOLLRDHUP);
  if (c->et_out_told) kernel &= ~(uint32_t)EPOLLOUT;
  if (c->eof_submitted) kernel &= ~(uint32_t)(EPOLLIN | EPOLLRDHUP);
  return kernel;
}

/* Registers c with the kernel anew, with the interest it has now. */
void rearm_kernel(struct conn* c) {
  if (c->epfd < 0 || c->detached) return;
  struct epoll_event ev = {.events = kernel_interest(c), .data.u64 = LS_CONN_TAG | (uint64_t)c->fd};
  real_epoll_ctl(c->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* A send on fd would block (EAGAIN): an EPOLLET server hears the next
 * EPOLLOUT edge (shim_wait.c, tell). Without mu. */
void wait_send_blocked(int fd) {
  struct conn* c = tracked(fd);
  if (!c) return;
  int saved = errno;
  pthread_mutex_lock(&mu);
  if (c->et_out_told) {
    c->et_out_told = 0;
    rearm_kernel(c);
  }
  mu_unlock();
  errno = saved;
}

/* ------------------------------------------------------------ listeners */

int is_client_listener(int lfd) {
  if (lfd < 0 || lfd >= LS_MAX_FD) return 0;
  if (!listen_kind[lfd]) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    int port = -1;
    if (getsockname(lfd, (struct sockaddr*)&a, &len) == 0) {
      if (a.ss_family == AF_INET) port = ntohs(((struct sockaddr_in*)&a)->sin_port);
      if (a.ss_family == AF_INET6) port = ntohs(((struct sockaddr_in6*)&a)->sin6_port);
    }
    listen_kind[lfd] = port == client_port ? 1 : 2;
  }
  return listen_kind[lfd] == 1;
}

void listen_check(int fd) {
  if ((forked_child || descendant) && is_client_listener(fd))
    refuse_forked("listens on the client port");
}
