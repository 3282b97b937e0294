/* shim_wait.c — the shim's epoll and poll: a server waiting for its
 * tracked connections hears that one is readable only when the delivery
 * order lets it read (an agreed input at the head of the FIFO, or EOF),
 * never because the kernel has client bytes; those are ingested (submitted
 * for agreement) here as they arrive. With timers in the log, an epoll
 * wait's timeout is agreed too (a tick, see epoll_pwait). The daemon's wake eventfd rides in
 * each epoll set and poll call, so a completion wakes the server. The
 * connection table and the FIFO are shim_state.c's, the delivery order
 * shim_order.c's.
 *
 * Same rules as shim.c: errno preserved, no allocation. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include "preload/shim_abi.h"
#include "preload/shim_clock.h"
#include "preload/shim_order.h"
#include "preload/shim_rings.h"
#include "preload/shim_serial.h"
#include "preload/shim_state.h"

/* ------------------------------------------------------------ epoll */

/* The wake eventfd rides in every epoll set that holds a tracked connection,
 * edge-triggered and never read on this path: each write by the daemon then
 * wakes every set once, whichever thread waits in which (a thread that read
 * it would take the wake-up from the others), and the count it keeps does
 * not make any set spin. poll's path reads it (a level it would spin on).
 * Under serial_inputs it rides with EPOLLEXCLUSIVE ("Exclusive wake-ups",
 * below), and the set's own eventfd is made first: it is how the wake-up is
 * passed on. mu held. */
static void ensure_wake(int epfd) {
  if (epfd < 0 || epfd >= LS_MAX_FD || wake_in_epfd[epfd]) return;
  struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = LS_WAKE_TAG};
  /* The set's own eventfd, the same way: serial_inputs hands the next input
   * to the thread waiting here without waking every other thread. */
  if (!set_wake_fd[epfd]) {
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd >= 0 && real_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) == 0)
      set_wake_fd[epfd] = fd + 1;
    else if (fd >= 0)
      real_close(fd);
  }
  if (serial_enabled() && set_wake_fd[epfd] && excl_sets_n < LS_EXCL_SETS) {
    struct epoll_event xev = {.events = EPOLLIN | EPOLLET | EPOLLEXCLUSIVE,
                              .data.u64 = LS_WAKE_TAG};
    if (real_epoll_ctl(epfd, EPOLL_CTL_ADD, wake_server_fd, &xev) == 0) {
      wake_in_epfd[epfd] = 1;
      wake_exclusive[epfd] = 1;
      excl_sets[excl_sets_n++] = epfd;
      return;
    }
  }
  if (real_epoll_ctl(epfd, EPOLL_CTL_ADD, wake_server_fd, &ev) == 0 || errno == EEXIST)
    wake_in_epfd[epfd] = 1;
}

/* Exclusive wake-ups (serial_inputs). A server that runs an epoll loop per
 * thread (memcached's four workers and its main thread) had every thread
 * woken by each of the daemon's writes, and all but one went back to sleep:
 * its servers made 16 context switches per SET at one connection against 5
 * with one worker (scripts/bench memcached). With EPOLLEXCLUSIVE the kernel
 * wakes one set whose thread waits (it queues the event, too, in the sets
 * before that one whose threads are busy, which see it at their next wait).
 * The thread woken, or any epoll waiter that finds the daemon's rings drained
 * since the last relay (drained_gen: by a thread in poll or read, say),
 * passes the wake-up on through their own eventfds to the other sets that
 * now have something to tell their servers: the head run's connection, an
 * agreed tick at the head, a connection the log closed, a lease read. Under
 * serial_inputs nothing else becomes readable: the next connection's input
 * waits for the turn, which serial_done hands to its set (wake_next_turn).
 * Anything less certain wakes every set: a change of mode (leader, backup,
 * stopping: ticks are asked for, or not, and dropped inputs break
 * connections) and a bypassed gate. A set looks by itself every 11 ms while
 * inputs are pending, as before. mu held. */
static uint64_t relayed_gen;
static int relayed_mode = -1;

static void relay_to_set(int epfd, int my_epfd) {
  if (epfd >= 0 && epfd < LS_MAX_FD && epfd != my_epfd && wake_exclusive[epfd])
    wake_after_unlock(set_wake_fd[epfd] - 1);
}

/* Adds epfd to sets[*n] once. */
static void relay_add(int* sets, int* n, int epfd) {
  for (int i = 0; i < *n; i++)
    if (sets[i] == epfd) return;
  if (*n < LS_EXCL_SETS) sets[(*n)++] = epfd;
}

static void relay_wake(int my_epfd) {
  relayed_gen = drained_gen;
  int mode = (int)atomic_load(&hdr->mode);
  int all = mode != relayed_mode || (fifo_count && gate_bypassed());
  relayed_mode = mode;
  if (all) {
    for (int i = 0; i < excl_sets_n; i++) relay_to_set(excl_sets[i], my_epfd);
    return;
  }
  int sets[LS_EXCL_SETS], n = 0;
  struct head_run r = find_head_run();
  if (r.c) relay_add(sets, &n, r.c->epfd);
  struct chunk* tick = head_tick();
  if (tick) relay_add(sets, &n, tick->c->epfd);
  for (int i = 0; i < log_closed_n; i++)
    if (log_closed_list[i]->fd >= 0 && ready(log_closed_list[i]))
      relay_add(sets, &n, log_closed_list[i]->epfd);
  for (int i = 0; i < lease_ready_n; i++)
    if (lease_ready_list[i]->consumed < lease_ready_list[i]->unordered_end)
      relay_add(sets, &n, lease_ready_list[i]->epfd);
  for (int i = 0; i < n; i++) relay_to_set(sets[i], my_epfd);
}

int epoll_ctl(int epfd, int op, int fd, struct epoll_event* event) {
  struct conn* c = tracked(fd);
  if (!c && clk_ticks && active && op == EPOLL_CTL_ADD && is_client_listener(fd)) {
    /* Timers in the log: the set that watches the client port ticks too
     * (memcached's 1 s clock runs in its listener thread's loop). */
    int saved = errno;
    pthread_mutex_lock(&mu);
    ensure_wake(epfd);
    mu_unlock();
    errno = saved;
  }
  if (!c) return real_epoll_ctl(epfd, op, fd, event);
  int saved = errno;
  pthread_mutex_lock(&mu);
  ensure_wake(epfd);
  if (op == EPOLL_CTL_DEL) {
    c->epfd = -1;
    c->events = 0;
    mu_unlock();
    errno = saved;
    return real_epoll_ctl(epfd, op, fd, event);
  }
  /* The kernel tells us about the socket (level-triggered, tagged with the
   * fd); the server hears from us. ADD and MOD arm afresh: what is ready now
   * is reported, edge-triggered or not, as the kernel does. The kernel's
   * ADD/MOD happens before mu is let go, as the kernel's own is atomic: once
   * armed here, another thread's wait may be told of the connection at once,
   * serve it and close it, and a MOD still to come then failed with EBADF in
   * the thread that re-armed it (mt_epoll_server under EPOLLONESHOT: the
   * client's EOF taken by a second thread between the re-arm and the MOD). */
  c->epfd = epfd;
  c->events = event->events;
  c->data = event->data;
  c->disarmed = 0;
  c->et_until = 0;
  c->et_eof_told = 0;
  c->et_out_told = 0;
  struct epoll_event ev = {.events = kernel_interest(c), .data.u64 = LS_CONN_TAG | (uint64_t)fd};
  if (c->detached) { /* a dead restored socket stays out of the kernel's set */
    mu_unlock();
    errno = saved;
    return 0;
  }
  errno = saved;
  int r = real_epoll_ctl(epfd, op, fd, &ev); /* never blocks */
  int err = errno;
  mu_unlock();
  errno = err;
  return r;
}

/* Adds (or merges) an event for the server; -1 when out is full. */
static int put_event(struct epoll_event* out, int n, int max, uint32_t events, epoll_data_t data) {
  for (int i = 0; i < n; i++)
    if (out[i].data.u64 == data.u64) {
      out[i].events |= events;
      return n;
    }
  if (n >= max) return -1;
  out[n].events = events;
  out[n].data = data;
  return n + 1;
}

/* Tells the server `events` of tracked connection c, as its registration
 * asks: nothing while one-shot disarmed (and disarmed once told); under
 * EPOLLET, input only when more agreed bytes (or the EOF) became readable
 * since the last time, EPOLLOUT only once until a send would block. Called
 * with mu held; returns the new count of events in out. */
static uint64_t tell_gen; /* counts the epoll waits' looks, under mu (conn.told_gen) */

static int tell(struct epoll_event* out, int n, int max, struct conn* c, uint32_t events) {
  if (c->disarmed) return n;
  uint64_t until = 0;
  int eof = 0;
  if (c->events & EPOLLET) {
    if (events & EPOLLIN) {
      until = c->consumed + (uint64_t)readable(c);
      eof = eof_ready(c);
      if (until <= c->et_until && (!eof || c->et_eof_told)) events &= ~(uint32_t)EPOLLIN;
    }
    if (c->et_out_told) events &= ~(uint32_t)EPOLLOUT;
  }
  if (!events) return n;
  int m = put_event(out, n, max, events, c->data);
  if (m < 0) return n; /* no room: told next time */
  c->told_gen = tell_gen;
  int kernel_changes = 0;
  if (c->events & EPOLLET) {
    if (events & EPOLLIN) {
      c->et_until = until;
      c->et_eof_told |= eof;
    }
    if (events & EPOLLOUT) kernel_changes = c->et_out_told = 1;
  }
  if (c->events & EPOLLONESHOT) kernel_changes = c->disarmed = 1;
  if (kernel_changes) rearm_kernel(c);
  return m;
}

/* The connections whose agreed inputs come next after the head run's, in
 * the log's order, told to the server in that order beside the head: one
 * wake-up then takes many logged inputs (16 connections' SETs cost one
 * epoll wait and one pass of the server's loop instead of 16). Only the
 * head run is readable (readable()); a server that handles its events in
 * the order given (redis, libev's and libevent's loops) reads each in turn
 * as the one before it finishes, and one that reads out of order gets
 * EAGAIN and hears of it again at its next wait. Hence level-triggered,
 * not one-shot, non-blocking sockets only: an edge told early, a one-shot
 * disarmed early or a blocking read out of order would lose the wake-up or
 * hang the thread. Not under serial_inputs (a thread per connection: the
 * turn is handed over there, shim_serial.c). Stops at a chunk not agreed,
 * a tick or an EOF (their waits and reads are the head's rules), and after
 * LS_TELL_AHEAD chunks. mu held. */
#define LS_TELL_AHEAD 64

static int told_early(struct conn* c) {
  if (c->nonblocking == NONBLOCKING_UNKNOWN) {
    int saved = errno;
    int flags = fcntl(c->fd, F_GETFL);
    errno = saved;
    c->nonblocking = flags >= 0 && (flags & O_NONBLOCK) ? NONBLOCKING_YES : NONBLOCKING_NO;
  }
  return c->nonblocking == NONBLOCKING_YES && !(c->events & (EPOLLET | EPOLLONESHOT));
}

static int tell_next_runs(int epfd, struct epoll_event* out, int n, int max) {
  if (serial_enabled()) return n;
  int looked = 0;
  for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count && n < max; s++) {
    struct chunk* ch = fifo_at(s);
    if (chunk_finished(ch)) continue;
    if (ch->state != CH_COMMITTED || ch->kind == LS_SUB_TICK || ch->kind == LS_SUB_CLOSE) break;
    if (ch->kind != LS_SUB_DATA) continue;
    if (++looked > LS_TELL_AHEAD) break;
    struct conn* c = ch->c;
    if (c->told_gen == tell_gen || c->fd < 0 || c->epfd != epfd || !(c->events & EPOLLIN)) continue;
    if (told_early(c)) n = tell(out, n, max, c, EPOLLIN);
  }
  return n;
}

/* Tracked connections of epoll set epfd that the server may read now. */
static int ready_events(int epfd, struct epoll_event* out, int n, int max) {
  if (gate_bypassed()) {
    for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count && n < max; s++) {
      struct conn* c = fifo_at(s)->c;
      if (fifo_at(s)->state == CH_PENDING) break;
      if (c->fd >= 0 && c->epfd == epfd && (c->events & EPOLLIN) && ready(c))
        n = tell(out, n, max, c, EPOLLIN);
    }
  } else {
    struct head_run r = find_head_run();
    struct conn* c = r.c;
    uint64_t end = c && r.end > c->received ? c->received : r.end; /* replayed bytes in flight */
    if (c && c->fd >= 0 && c->epfd == epfd && (c->events & EPOLLIN) &&
        (end > c->consumed || r.close) && n < max) {
      int told = tell(out, n, max, c, EPOLLIN);
      if (told > n) head_reports++;
      n = told;
    }
    n = tell_next_runs(epfd, out, n, max);
  }
  for (int i = 0; i < log_closed_n && n < max; i++) {
    struct conn* c = log_closed_list[i];
    if (c->fd >= 0 && c->epfd == epfd && (c->events & EPOLLIN) && ready(c))
      n = tell(out, n, max, c, EPOLLIN);
  }
  /* Lease reads, outside the delivery order (shim_rings.c lease_serve);
   * those the server has read leave the list. Once per connection a call. */
  for (int i = 0; i < lease_ready_n;) {
    struct conn* c = lease_ready_list[i];
    if (c->fd < 0 || c->consumed >= c->unordered_end) {
      lease_ready_list[i] = lease_ready_list[--lease_ready_n];
      c->in_lease_ready = 0;
      continue;
    }
    if (n < max && c->epfd == epfd && (c->events & EPOLLIN) && c->told_gen != tell_gen)
      n = tell(out, n, max, c, EPOLLIN);
    i++;
  }
  return n;
}

/* Ticks (shim_abi.h, "Ticks"): with timers in the log, a wait in a set
 * that holds tracked connections never times out by itself. On the leader,
 * once its timeout has passed on the server's clock, it submits a TICK and
 * waits on until that is agreed (or an input comes); every replica's wait
 * in that set returns when the tick reaches the head of the delivery order,
 * with the server's clock at the tick's stamp. A backup (or a leader whose
 * tick is in flight) looks at the mode every LS_TICK_LOOK_MS: it may become
 * the leader meanwhile. */
#define LS_TICK_LOOK_MS 100

int epoll_pwait(int epfd, struct epoll_event* events, int maxevents, int timeout,
                const sigset_t* sigmask) {
  /* Every set is filtered, also one that holds no tracked connection yet:
   * another thread may add one (and the wake eventfd) while this one waits
   * in the kernel, which would then hand it the shim's tags (slapd crashed
   * on that: its listener waits in epoll while pool threads add sockets). */
  if (!active || epfd < 0 || epfd >= LS_MAX_FD || maxevents <= 0)
    return real_epoll_pwait(epfd, events, maxevents, timeout, sigmask);
  int saved = errno;
  /* Ticks: a wait in a set with tracked connections takes its set's tick
   * at the head (takes_ticks); one with a timeout never times out by itself
   * (ticking). */
  int takes_ticks = 0;
  if (clk_ticks && wake_in_epfd[epfd] && atomic_load(&hdr->mode) != LS_MODE_STOPPING) {
    pthread_mutex_lock(&mu);
    struct conn* t = tick_conn(epfd);
    if (t) t->tick_waited = 1;
    mu_unlock();
    takes_ticks = t != NULL;
    if (takes_ticks) clk_hold(); /* until its tick, or an input it reads */
  }
  int ticking = takes_ticks && timeout != 0;
  uint64_t deadline =
      ticking || timeout < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout * 1000000ull;
  /* The server's clock at which this wait times out (0: never). */
  uint64_t tick_at = ticking && timeout > 0 ? clk_now_ns() + (uint64_t)timeout * 1000000ull : 0;
  struct epoll_event kernel[256];
  int kmax = maxevents < 256 ? maxevents : 256;
  int n = 0;
  for (;;) {
    /* Anything agreed already? Then only look at the kernel, don't wait. */
    pthread_mutex_lock(&mu);
    serial_done(epfd); /* waiting again: what this thread read is executed */
    drain_done();
    struct conn* tick = takes_ticks ? take_tick(epfd) : NULL;
    if (tick) {
      serial_begin(tick); /* the timer's work is this thread's turn until it waits again */
      mu_unlock();
      break; /* the wait times out here, on every replica */
    }
    tell_gen++; /* events[] starts afresh */
    n = ready_events(epfd, events, 0, maxevents);
    if (wake_exclusive[epfd] && drained_gen != relayed_gen) relay_wake(epfd);
    int look_soon = serial_holding(NULL, epfd);
    int tick_wait_ms = -1; /* ticking: how long the kernel may keep us */
    if (ticking && n == 0 && atomic_load(&hdr->mode) == LS_MODE_STOPPING) {
      mu_unlock(); /* no tick will come: the wait times out (LS_MODE_STOPPING) */
      break;
    }
    if (ticking && n == 0) {
      int leading = atomic_load(&hdr->mode) == LS_MODE_LEADER;
      if (!leading || tick_pending(epfd) || !tick_at) {
        tick_wait_ms = tick_at || !leading ? LS_TICK_LOOK_MS : -1;
      } else {
        uint64_t now = real_wall_ns();
        if (now >= tick_at && now_ns() >= tick_retry_at(epfd)) submit_tick(epfd, tick_at);
        if (tick_pending(epfd))
          tick_wait_ms = LS_TICK_LOOK_MS; /* its outcome wakes us */
        else if (now < tick_at)
          tick_wait_ms = (int)((tick_at - now + 999999) / 1000000);
        else
          tick_wait_ms = 10; /* the last was dropped: asked again soon */
      }
    }
    mu_unlock();
    int wait_ms = 0;
    if (n == 0) {
      uint64_t now = now_ns();
      if (ticking)
        wait_ms = tick_wait_ms;
      else if (deadline == UINT64_MAX)
        wait_ms = -1;
      else
        wait_ms = now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
      /* Inputs pending: look again now and then (the gate may open, see gate_bypassed). */
      if ((fifo_count || reply_gate_pending()) && wake_in_epfd[epfd] &&
          (wait_ms < 0 || wait_ms > 11))
        wait_ms = 11;
    }
    int cap = look_soon == 2 ? 1 : -1;
    if (cap > 0 && (wait_ms < 0 || wait_ms > cap)) wait_ms = cap;
    int sleeping = wait_ms != 0;
    if (sleeping) {
      atomic_fetch_add(&hdr->server_sleepers, 1);
      if (atomic_load(&hdr->done_head) != atomic_load(&hdr->done_tail)) wait_ms = 0;
    }
    int k = real_epoll_pwait(epfd, kernel, kmax, wait_ms, sigmask);
    int err = errno;
    if (sleeping) atomic_fetch_sub(&hdr->server_sleepers, 1);
    if (k < 0) {
      if (n > 0) break;
      errno = err;
      return -1;
    }
    pthread_mutex_lock(&mu);
    int woken = 0; /* by the daemon's eventfd: relay_wake */
    for (int i = 0; i < k; i++) {
      uint64_t tag = kernel[i].data.u64;
      if (tag == LS_WAKE_TAG) { /* edge-triggered, left unread: ensure_wake */
        woken = 1;
        continue;
      }
      if ((tag & LS_TAG_MASK) == LS_CONN_TAG) {
        int fd = (int)(tag & 0xffffffffu);
        struct conn* c = fd < LS_MAX_FD ? by_fd[fd] : NULL;
        if (!c) continue;
        if (kernel[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) ingest(c);
        if (c->detached) continue; /* a dead restored socket: nothing to tell */
        /* Only what the server asked for and we do not synthesise. */
        uint32_t other = kernel[i].events & c->events & ~(uint32_t)(EPOLLIN | EPOLLRDHUP);
        if (other) n = tell(events, n, maxevents, c, other);
        continue;
      }
      int m = put_event(events, n, maxevents, kernel[i].events, kernel[i].data);
      if (m >= 0) n = m;
    }
    drain_done();
    n = ready_events(epfd, events, n, maxevents);
    if (wake_exclusive[epfd] && (woken || drained_gen != relayed_gen)) relay_wake(epfd);
    /* A tick at the head now ends this wait too, with what else it found. */
    struct conn* took = takes_ticks ? take_tick(epfd) : NULL;
    if (took) serial_begin(took);
    mu_unlock();
    if (n > 0 || took) break;
    if (deadline != UINT64_MAX && now_ns() >= deadline) break;
  }
  errno = saved;
  return n;
}

int epoll_wait(int epfd, struct epoll_event* events, int maxevents, int timeout) {
  return epoll_pwait(epfd, events, maxevents, timeout, NULL);
}

int epoll_pwait2(int epfd, struct epoll_event* events, int maxevents,
                 const struct timespec* timeout, const sigset_t* sigmask) {
  int ms = -1;
  if (timeout) {
    uint64_t ns = (uint64_t)timeout->tv_sec * 1000000000ull + (uint64_t)timeout->tv_nsec;
    ms = (int)((ns + 999999) / 1000000);
  }
  return epoll_pwait(epfd, events, maxevents, ms, sigmask);
}

/* ------------------------------------------------------------ poll */

static int any_tracked(const struct pollfd* fds, nfds_t nfds) {
  for (nfds_t i = 0; i < nfds; i++)
    if (tracked(fds[i].fd)) return 1;
  return 0;
}

static uint64_t deadline_of(const struct timespec* t) {
  if (!t) return UINT64_MAX;
  return now_ns() + (uint64_t)t->tv_sec * 1000000000ull + (uint64_t)t->tv_nsec;
}

/* poll, ppoll, select and pselect on fds of which some are tracked: one loop
 * (deadline: now_ns() time, UINT64_MAX for none; sigmask as ppoll's). */
static int poll_tracked(struct pollfd* fds, nfds_t nfds, uint64_t deadline,
                        const sigset_t* sigmask) {
  int saved = errno;
  struct pollfd k[1026];
  for (;;) {
    /* Tracked fds: POLLIN means "agreed bytes or EOF wait"; the kernel's
     * POLLIN only feeds ingest. The wake eventfd rides along at the end. */
    int n = 0;
    pthread_mutex_lock(&mu);
    serial_done(-1);
    drain_done();
    for (nfds_t i = 0; i < nfds; i++) {
      k[i] = fds[i];
      k[i].revents = 0;
      struct conn* c = tracked(fds[i].fd);
      if (c && (fds[i].events & POLLIN) && ready(c)) k[i].revents = POLLIN;
      if (c && c->eof_submitted) k[i].events &= ~(short)POLLIN;
      /* A replay connection's bytes are taken by whoever drains the order
       * (shim_rings.c, replay_interest): this thread wakes for its turn. */
      if (c && replay_owes_nothing(c))
        k[i].events &= ~(short)(POLLIN | POLLPRI | POLLRDNORM | POLLRDBAND | POLLRDHUP);
      if (k[i].revents) n++;
    }
    /* This thread's own eventfd rides along too (shim_serial.c, "Threads waiting"),
     * registered with the one tracked connection it waits to read, if one. */
    struct conn* waits_for = NULL;
    int reading = 0;
    for (nfds_t i = 0; i < nfds; i++) {
      struct conn* c = tracked(fds[i].fd);
      if (c && (fds[i].events & POLLIN)) waits_for = reading++ ? NULL : c;
    }
    int look_soon = serial_holding(waits_for, -1);
    uint64_t look_ns = look_soon == 2 ? serial_look_ns() : 0;
    int mine = waiter_enter(waits_for, look_soon == 1);
    int watch = wake_watch_claim();
    mu_unlock();
    k[nfds].fd = watch ? wake_server_fd : -1; /* -1: ignored by poll */
    k[nfds].events = POLLIN;
    k[nfds + 1].fd = mine; /* -1: ignored by poll */
    k[nfds + 1].events = POLLIN;
    k[nfds + 1].revents = 0;
    int wait_ms = 0;
    if (n == 0) {
      uint64_t now = now_ns();
      wait_ms = deadline == UINT64_MAX ? -1
                : now >= deadline      ? 0
                                       : (int)((deadline - now + 999999) / 1000000);
      if ((fifo_count || reply_gate_pending()) && (wait_ms < 0 || wait_ms > 11)) wait_ms = 11;
    }
    short synth[1024];
    for (nfds_t i = 0; i < nfds; i++) synth[i] = k[i].revents;
    int sleeping = wait_ms != 0;
    if (sleeping) {
      atomic_fetch_add(&hdr->server_sleepers, 1);
      if (atomic_load(&hdr->done_head) != atomic_load(&hdr->done_tail)) wait_ms = 0;
    }
    struct timespec ts = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000l};
    if (look_ns && (wait_ms < 0 || (uint64_t)wait_ms * 1000000ull > look_ns)) {
      wait_ms = 1; /* next in line: looks at the holder again soon (serial_holding 2) */
      ts = (struct timespec){0, (long)look_ns};
    }
    int r = real_ppoll(k, nfds + 2, wait_ms < 0 ? NULL : &ts, sigmask);
    int err = errno;
    if (sleeping) atomic_fetch_sub(&hdr->server_sleepers, 1);
    int took = 0;
    if (r > 0 && (k[nfds].revents & POLLIN)) {
      eventfd_t v;
      took = eventfd_read(wake_server_fd, &v) == 0;
    }
    if (r > 0 && (k[nfds + 1].revents & POLLIN)) waiter_took_wake();
    pthread_mutex_lock(&mu);
    waiter_leave();
    if (took) {
      drain_done();
      waiters_relay();
    }
    if (r < 0) {
      wake_watch_leave();
      mu_unlock();
      errno = err;
      return -1;
    }
    n = 0;
    for (nfds_t i = 0; i < nfds; i++) {
      struct conn* c = tracked(fds[i].fd);
      short rev = k[i].revents;
      if (c) {
        if (rev & (POLLIN | POLLHUP | POLLERR)) ingest(c);
        rev &= ~(short)(POLLIN | POLLHUP | POLLERR | POLLRDHUP);
        drain_done();
        if ((fds[i].events & POLLIN) && ready(c)) rev |= POLLIN;
        rev |= synth[i];
      }
      fds[i].revents = rev;
      if (rev) n++;
    }
    int leaving = n > 0 || (deadline != UINT64_MAX && now_ns() >= deadline);
    if (leaving) wake_watch_leave();
    mu_unlock();
    if (leaving) {
      errno = saved;
      return n;
    }
  }
}

/* Resolved again here (LS_REAL) when a library polls before the shim's
 * constructor ran. */

int poll(struct pollfd* fds, nfds_t nfds, int timeout) {
  LS_REAL(poll);
  if (!active || nfds > 1024 || !any_tracked(fds, nfds)) return real_poll(fds, nfds, timeout);
  return poll_tracked(fds, nfds,
                      timeout < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout * 1000000ull, NULL);
}

int ppoll(struct pollfd* fds, nfds_t nfds, const struct timespec* timeout,
          const sigset_t* sigmask) {
  LS_REAL(ppoll);
  if (!active || nfds > 1024 || !any_tracked(fds, nfds))
    return real_ppoll(fds, nfds, timeout, sigmask);
  return poll_tracked(fds, nfds, deadline_of(timeout), sigmask);
}

/* select and pselect: the same wait over a pollfd per fd named in a set. */
static int select_tracked(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, uint64_t deadline,
                          const sigset_t* sigmask, int* handled) {
  struct pollfd p[FD_SETSIZE];
  nfds_t n = 0;
  int any = 0;
  *handled = 0;
  if (!active || nfds < 0 || nfds > FD_SETSIZE) return 0;
  for (int fd = 0; fd < nfds; fd++) {
    short ev =
        (short)((rd && FD_ISSET(fd, rd) ? POLLIN : 0) | (wr && FD_ISSET(fd, wr) ? POLLOUT : 0) |
                (ex && FD_ISSET(fd, ex) ? POLLPRI : 0));
    if (!ev) continue;
    p[n].fd = fd;
    p[n].events = ev;
    p[n].revents = 0;
    n++;
    any |= tracked(fd) != NULL;
  }
  if (!any) return 0;
  *handled = 1;
  int r = poll_tracked(p, n, deadline, sigmask);
  if (r < 0) return -1;
  for (nfds_t i = 0; i < n; i++)
    if (p[i].revents & POLLNVAL) {
      errno = EBADF;
      return -1;
    }
  if (rd) FD_ZERO(rd);
  if (wr) FD_ZERO(wr);
  if (ex) FD_ZERO(ex);
  int bits = 0;
  for (nfds_t i = 0; i < n; i++) {
    short got = p[i].revents, asked = p[i].events;
    if ((asked & POLLIN) && (got & (POLLIN | POLLHUP | POLLERR))) FD_SET(p[i].fd, rd), bits++;
    if ((asked & POLLOUT) && (got & (POLLOUT | POLLERR))) FD_SET(p[i].fd, wr), bits++;
    if ((asked & POLLPRI) && (got & POLLPRI)) FD_SET(p[i].fd, ex), bits++;
  }
  return bits;
}

int select(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, struct timeval* timeout) {
  LS_REAL(select);
  struct timespec t;
  if (timeout) {
    t.tv_sec = timeout->tv_sec;
    t.tv_nsec = timeout->tv_usec * 1000l;
  }
  uint64_t deadline = active ? deadline_of(timeout ? &t : NULL) : 0;
  int handled;
  int r = select_tracked(nfds, rd, wr, ex, deadline, NULL, &handled);
  if (!handled) return real_select(nfds, rd, wr, ex, timeout);
  if (timeout) { /* Linux's select leaves the time not slept in *timeout */
    int saved = errno;
    uint64_t now = now_ns(), left = deadline > now ? deadline - now : 0;
    timeout->tv_sec = (time_t)(left / 1000000000ull);
    timeout->tv_usec = (suseconds_t)(left % 1000000000ull / 1000);
    errno = saved;
  }
  return r;
}

int pselect(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, const struct timespec* timeout,
            const sigset_t* sigmask) {
  LS_REAL(pselect);
  int handled;
  int r = select_tracked(nfds, rd, wr, ex, active ? deadline_of(timeout) : 0, sigmask, &handled);
  if (!handled) return real_pselect(nfds, rd, wr, ex, timeout, sigmask);
  return r;
}

/* The fortified entry points (_FORTIFY_SOURCE, as Debian builds servers):
 * glibc's own would call its internal poll, past the wrappers above. */
extern void __chk_fail(void) __attribute__((noreturn));

int __poll_chk(struct pollfd* fds, nfds_t nfds, int timeout, size_t fds_len) {
  if (fds_len / sizeof *fds < nfds) __chk_fail();
  return poll(fds, nfds, timeout);
}

int __ppoll_chk(struct pollfd* fds, nfds_t nfds, const struct timespec* timeout,
                const sigset_t* sigmask, size_t fds_len) {
  if (fds_len / sizeof *fds < nfds) __chk_fail();
  return ppoll(fds, nfds, timeout, sigmask);
}
