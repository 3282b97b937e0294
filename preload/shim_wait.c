/* shim_wait.c — the shim's epoll and poll: a server waiting for its
 * tracked connections hears that one is readable only when the delivery
 * order lets it read (an agreed input at the head of the FIFO, or EOF),
 * never because the kernel has client bytes; those are ingested (submitted
 * for agreement) here as they arrive. The daemon's wake eventfd rides in
 * each epoll set and poll call, so a completion wakes the server. The
 * connection table and the FIFO are shim.c's (shim_internal.h).
 *
 * Same rules as shim.c: errno preserved, no allocation. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "preload/shim_abi.h"
#include "preload/shim_internal.h"

/* ------------------------------------------------------------ epoll */

static void ensure_wake(int epfd) {
  if (epfd < 0 || epfd >= LS_MAX_FD || wake_in_epfd[epfd]) return;
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = LS_WAKE_TAG};
  if (real_epoll_ctl(epfd, EPOLL_CTL_ADD, wake_server_fd, &ev) == 0 || errno == EEXIST)
    wake_in_epfd[epfd] = 1;
}

int epoll_ctl(int epfd, int op, int fd, struct epoll_event* event) {
  struct conn* c = tracked(fd);
  if (!c) return real_epoll_ctl(epfd, op, fd, event);
  int saved = errno;
  pthread_mutex_lock(&mu);
  ensure_wake(epfd);
  if (op == EPOLL_CTL_DEL) {
    c->epfd = -1;
    c->events = 0;
    pthread_mutex_unlock(&mu);
    errno = saved;
    return real_epoll_ctl(epfd, op, fd, event);
  }
  /* The kernel tells us about the socket (level-triggered, tagged with the
   * fd); the server hears from us. */
  c->epfd = epfd;
  c->events = event->events;
  c->data = event->data;
  struct epoll_event ev = {.events = kernel_interest(c), .data.u64 = LS_CONN_TAG | (uint64_t)fd};
  if (c->detached) { /* a dead restored socket stays out of the kernel's set */
    pthread_mutex_unlock(&mu);
    errno = saved;
    return 0;
  }
  pthread_mutex_unlock(&mu);
  errno = saved;
  return real_epoll_ctl(epfd, op, fd, &ev);
}

/* Adds (or merges) an event for the server. */
static int put_event(struct epoll_event* out, int n, int max, uint32_t events, epoll_data_t data) {
  for (int i = 0; i < n; i++)
    if (out[i].data.u64 == data.u64) {
      out[i].events |= events;
      return n;
    }
  if (n < max) {
    out[n].events = events;
    out[n].data = data;
    n++;
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
        n = put_event(out, n, max, EPOLLIN, c->data);
    }
  } else {
    struct head_run r = find_head_run();
    struct conn* c = r.c;
    uint64_t end = c && r.end > c->received ? c->received : r.end; /* replayed bytes in flight */
    if (c && c->fd >= 0 && c->epfd == epfd && (c->events & EPOLLIN) &&
        (end > c->consumed || r.close) && n < max) {
      n = put_event(out, n, max, EPOLLIN, c->data);
      head_reports++;
    }
  }
  for (int i = 0; i < log_closed_n && n < max; i++) {
    struct conn* c = log_closed_list[i];
    if (c->fd >= 0 && c->epfd == epfd && (c->events & EPOLLIN) && ready(c))
      n = put_event(out, n, max, EPOLLIN, c->data);
  }
  return n;
}

int epoll_pwait(int epfd, struct epoll_event* events, int maxevents, int timeout,
                const sigset_t* sigmask) {
  if (!active || epfd < 0 || epfd >= LS_MAX_FD || !wake_in_epfd[epfd] || maxevents <= 0)
    return real_epoll_pwait(epfd, events, maxevents, timeout, sigmask);
  int saved = errno;
  uint64_t deadline = timeout < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout * 1000000ull;
  struct epoll_event kernel[256];
  int kmax = maxevents < 256 ? maxevents : 256;
  int n = 0;
  for (;;) {
    /* Anything agreed already? Then only look at the kernel, don't wait. */
    pthread_mutex_lock(&mu);
    drain_done();
    n = ready_events(epfd, events, 0, maxevents);
    pthread_mutex_unlock(&mu);
    int wait_ms = 0;
    if (n == 0) {
      uint64_t now = now_ns();
      if (deadline == UINT64_MAX)
        wait_ms = -1;
      else
        wait_ms = now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
      /* Inputs pending: look again now and then (the gate may open, see gate_bypassed). */
      if (fifo_count && (wait_ms < 0 || wait_ms > 11)) wait_ms = 11;
    }
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
    for (int i = 0; i < k; i++) {
      uint64_t tag = kernel[i].data.u64;
      if (tag == LS_WAKE_TAG) {
        eventfd_t v;
        (void)!eventfd_read(wake_server_fd, &v); /* libc's own read: not our wrapper */
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
        if (other) n = put_event(events, n, maxevents, other, c->data);
        continue;
      }
      n = put_event(events, n, maxevents, kernel[i].events, kernel[i].data);
    }
    drain_done();
    n = ready_events(epfd, events, n, maxevents);
    pthread_mutex_unlock(&mu);
    if (n > 0) break;
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

int poll(struct pollfd* fds, nfds_t nfds, int timeout) {
  if (!active || nfds > 1024) return real_poll(fds, nfds, timeout);
  int any = 0;
  for (nfds_t i = 0; i < nfds && !any; i++) any = tracked(fds[i].fd) != NULL;
  if (!any) return real_poll(fds, nfds, timeout);
  int saved = errno;
  uint64_t deadline = timeout < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout * 1000000ull;
  struct pollfd k[1025];
  for (;;) {
    /* Tracked fds: POLLIN means "agreed bytes or EOF wait"; the kernel's
     * POLLIN only feeds ingest. The wake eventfd rides along at the end. */
    int n = 0;
    pthread_mutex_lock(&mu);
    drain_done();
    for (nfds_t i = 0; i < nfds; i++) {
      k[i] = fds[i];
      k[i].revents = 0;
      struct conn* c = tracked(fds[i].fd);
      if (c && (fds[i].events & POLLIN) && ready(c)) k[i].revents = POLLIN;
      if (c && c->eof_submitted) k[i].events &= ~(short)POLLIN;
      if (k[i].revents) n++;
    }
    pthread_mutex_unlock(&mu);
    k[nfds].fd = wake_server_fd;
    k[nfds].events = POLLIN;
    int wait_ms = 0;
    if (n == 0) {
      uint64_t now = now_ns();
      wait_ms = deadline == UINT64_MAX ? -1
                : now >= deadline      ? 0
                                       : (int)((deadline - now + 999999) / 1000000);
      if (fifo_count && (wait_ms < 0 || wait_ms > 11)) wait_ms = 11;
    }
    short synth[1024];
    for (nfds_t i = 0; i < nfds; i++) synth[i] = k[i].revents;
    int sleeping = wait_ms != 0;
    if (sleeping) {
      atomic_fetch_add(&hdr->server_sleepers, 1);
      if (atomic_load(&hdr->done_head) != atomic_load(&hdr->done_tail)) wait_ms = 0;
    }
    int r = real_poll(k, nfds + 1, wait_ms);
    int err = errno;
    if (sleeping) atomic_fetch_sub(&hdr->server_sleepers, 1);
    if (r < 0) {
      errno = err;
      return -1;
    }
    if (k[nfds].revents & POLLIN) {
      eventfd_t v;
      (void)!eventfd_read(wake_server_fd, &v);
    }
    n = 0;
    pthread_mutex_lock(&mu);
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
    pthread_mutex_unlock(&mu);
    if (n > 0 || (deadline != UINT64_MAX && now_ns() >= deadline)) {
      errno = saved;
      return n;
    }
  }
}
