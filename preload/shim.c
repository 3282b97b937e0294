/* shim.c — the LD_PRELOAD shim loaded into the unmodified server; this
 * file is its top layer (README.md, "Layers"): the constructor that attaches
 * to the daemon's region and sets the hooks, accept, the reads, close and
 * fork. What it tells of below lives in the layers under it: the shared
 * state in shim_state.c, the delivery order in shim_order.c, the rings to
 * the daemon in shim_rings.c, the waits in shim_wait.c.
 *
 * On the leader it makes the server see a client's input only after the
 * replicated log agreed it:
 *  - accept/accept4 on the server's client port hands an ACCEPT to the daemon
 *    and returns the connection once that is agreed;
 *  - when the kernel has bytes for a client connection (seen by our
 *    epoll_wait/poll, or by a read that found nothing agreed), the shim reads
 *    them into the connection's inbox and submits them (DATA); the server's
 *    read returns EAGAIN meanwhile, so an event loop keeps many inputs in
 *    flight and they share one durable write;
 *  - once the daemon reports them COMMITTED, the connection reads as ready and
 *    read/recv/readv/recvmsg return the agreed bytes; EOF is an input (CLOSE)
 *    like any other.
 * Agreed inputs are handed to the server in the log's order (see "the
 * delivery window" in shim_order.c), so a server that serves ready connections in the
 * order it is told executes exactly the order the backups replay. A server
 * that keeps ignoring the connection whose turn it is (told it is readable
 * LS_GATE_BYPASS_REPORTS times without reading, or for LS_GATE_BYPASS_NS)
 * opens the gate for the others.
 *
 * On a backup the daemon replays inputs over local TCP connections; the shim
 * recognises them by their port, passes them through, and counts what the
 * server read from each so the daemon can keep the same order.
 *
 * On every replica it hashes what the server sends on those connections
 * (shim_output.c and shim_abi.h, "Output"): per connection, by stream
 * offset, published as digest records plus a window of the latest bytes.
 *
 * With LOCKSTEP_SHIM_RANDOM_SEED set, shim_random.c makes the server's
 * randomness the same on every replica; its reads of /dev/urandom come
 * through read/readv here (rnd_tracked), and close forgets them.
 *
 * With LOCKSTEP_SHIM_SAME_CLOCK=1, shim_clock.c makes the server's wall
 * clock read the stamp of the input it processes: the inputs carry their
 * stamps (shim_rings.c, apply_done, drain_order), the server reads one input
 * at a time (shim_order.c, find_head_run), and what it reads sets the clock
 * (shim_rings.c, clock_from_reads). With LOCKSTEP_SHIM_TIMERS=1 as well,
 * the timeouts of its epoll waits are agreed too (ticks: shim_wait.c,
 * epoll_pwait), and a tick moves the clock.
 *
 * Everything else (files, pipes, the server's outbound connections,
 * connections accepted while this replica is not the leader, and anything a
 * forked or exec'd child does) passes straight through.
 *
 * Rules for code here: no C++ and no exceptions, errno preserved on every
 * path, no allocation except when a connection's inbox must grow.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "preload/shim_abi.h"
#include "preload/shim_clock.h"
#include "preload/shim_inspect.h"
#include "preload/shim_order.h"
#include "preload/shim_output.h"
#include "preload/shim_random.h"
#include "preload/shim_rings.h"
#include "preload/shim_serial.h"
#include "preload/shim_state.h"

#define LS_ACCEPT_WAIT_NS 2000000000ull

/* ------------------------------------------------------------ real calls */

static ssize_t (*real_read)(int, void*, size_t);
static ssize_t (*real_recvfrom)(int, void*, size_t, int, struct sockaddr*, socklen_t*);
static ssize_t (*real_recvmsg)(int, struct msghdr*, int);
static ssize_t (*real_readv)(int, const struct iovec*, int);
static int (*real_accept)(int, struct sockaddr*, socklen_t*);
static int (*real_accept4)(int, struct sockaddr*, socklen_t*, int);

static void output_reached(int fd, uint64_t end);
static int reads_may_follow(int fd);

__attribute__((constructor)) static void shim_init(void) {
  int saved = errno;
  hooks.executing_other = executing_other; /* before anything is attached */
  hooks.output_reached = output_reached;
  hooks.client_gone = reads_may_follow;
  real_read = dlsym(RTLD_NEXT, "read");
  real_recv = dlsym(RTLD_NEXT, "recv");
  real_recvfrom = dlsym(RTLD_NEXT, "recvfrom");
  real_recvmsg = dlsym(RTLD_NEXT, "recvmsg");
  real_readv = dlsym(RTLD_NEXT, "readv");
  real_accept = dlsym(RTLD_NEXT, "accept");
  real_accept4 = dlsym(RTLD_NEXT, "accept4");
  real_close = dlsym(RTLD_NEXT, "close");
  real_epoll_ctl = dlsym(RTLD_NEXT, "epoll_ctl");
  real_epoll_pwait = dlsym(RTLD_NEXT, "epoll_pwait");
  real_poll = dlsym(RTLD_NEXT, "poll");
  real_ppoll = dlsym(RTLD_NEXT, "ppoll");
  real_select = dlsym(RTLD_NEXT, "select");
  real_pselect = dlsym(RTLD_NEXT, "pselect");

  /* Only the process the daemon started: an exec'd child inherits
   * LD_PRELOAD but is not the server. It may yet try to be (a wrapper that
   * forks and execs the real server instead of exec'ing it): it listens on
   * the client port, and is refused (refuse_forked). */
  if (env_int("LOCKSTEP_SHIM_PID") != (int)getpid()) {
    if (env_int("LOCKSTEP_SHIM_PID") > 0) {
      descendant = 1;
      client_port = env_int("LOCKSTEP_SHIM_PORT");
      wake_daemon_fd = env_int("LOCKSTEP_SHIM_WAKE_DAEMON");
    }
    goto out;
  }
  int shm_fd = env_int("LOCKSTEP_SHIM_FD");
  wake_server_fd = env_int("LOCKSTEP_SHIM_WAKE_SERVER");
  wake_daemon_fd = env_int("LOCKSTEP_SHIM_WAKE_DAEMON");
  client_port = env_int("LOCKSTEP_SHIM_PORT");
  serial_init(env_int("LOCKSTEP_SHIM_SERIAL"));
  if (shm_fd < 0 || wake_server_fd < 0 || wake_daemon_fd < 0 || client_port <= 0) {
    shim_log("LOCKSTEP_SHIM_* environment incomplete; passing everything through");
    goto out;
  }
  struct ls_shim_header probe;
  if (pread(shm_fd, &probe, sizeof probe.magic + sizeof probe.version + sizeof probe.size, 0) <
          16 ||
      probe.magic != LS_SHIM_MAGIC || probe.version != LS_SHIM_VERSION) {
    shim_log("shared region on fd %d is not a lockstep region (version %u); passing through",
             shm_fd, LS_SHIM_VERSION);
    goto out;
  }
  void* p = mmap(NULL, probe.size, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
  if (p == MAP_FAILED) {
    shim_log("mmap of the shared region failed: %s; passing through", strerror(errno));
    goto out;
  }
  hdr = p;
  sub_ring = (char*)p + hdr->sub_offset;
  done_ring = (struct ls_done_record*)((char*)p + hdr->done_offset);
  order_ring = (struct ls_order_record*)((char*)p + hdr->order_offset);
  max_chunk = hdr->max_chunk;
  out_init((char*)p);
  /* Our descriptors stay open across exec: a server started through a
   * wrapper that execs it (`sh -c 'exec redis-server ...'`, a language
   * runtime re-executing itself) keeps its pid, and the shim in the new image
   * must attach to the same region, or the server would run unreplicated
   * while the daemon saw the wrapper attach. Children the server forks and
   * execs get other pids and never attach (LOCKSTEP_SHIM_PID above). */
  atomic_store(&hdr->shim_attached, 1);
  active = 1;
out:
  errno = saved;
}

/* The hooks (shim_state.h): the send that finished tells the layers
 * above the output side. */
static void output_reached(int fd, uint64_t end) {
  reply_gate_sent(fd, end); /* a backup's next input may have waited for this */
  serial_sent(fd, end);     /* the executing input's reply (serial_until_reply) */
}

/* hooks.client_gone: inputs agreed before the connection's CLOSE may still
 * be read on fd, whose client is gone. */
static int reads_may_follow(int fd) {
  int saved = errno, more = 0;
  pthread_mutex_lock(&mu);
  struct conn* c = tracked(fd);
  if (c && c->replay_slot < 0) {
    if (!c->eof_submitted) ingest(c); /* the reset: the CLOSE goes to the log */
    drain_done();
    more = !eof_ready(c) && !(c->broken && c->consumed >= c->committed_end);
  }
  mu_unlock();
  errno = saved;
  return more;
}

static void in_child_after_fork(void) {
  forked_child = active;
  active = 0;
  out_after_fork();
}
__attribute__((constructor)) static void shim_init_fork(void) {
  pthread_atfork(NULL, NULL, in_child_after_fork);
}

/* ------------------------------------------------------------ reads */

/* Copies up to `len` agreed bytes (consuming them unless peek). mu held. */
static size_t take(struct conn* c, const struct iovec* iov, int iovcnt, int peek) {
  uint64_t avail = readable(c);
  uint64_t from = c->consumed;
  size_t done = 0;
  for (int i = 0; i < iovcnt && avail > 0; i++) {
    size_t n = iov[i].iov_len < avail ? iov[i].iov_len : avail;
    memcpy(iov[i].iov_base, c->inbox + (from - c->inbox_base), n);
    from += n;
    avail -= n;
    done += n;
  }
  if (!peek) {
    if (done) {
      serial_begin(c);
      clk_release(); /* this thread's clock reads its input's stamp */
    }
    c->consumed = from;
    head_reports = 0; /* the server is reading: progress, not neglect */
    head_since_ns = now_ns();
    fifo_pop_finished();
  }
  return done;
}

/* The server read n bytes (0: EOF) of a replay connection: the daemon
 * knows from these counts when its server has caught up (a new leader waits
 * for that before it serves clients). */
static void note_replay_read(struct conn* c, size_t n) {
  if (c->replay_slot < 0) return;
  if (n > 0)
    atomic_fetch_add(&hdr->replay[c->replay_slot].read_bytes, (uint64_t)n);
  else
    atomic_store(&hdr->replay[c->replay_slot].eof_read, 1);
  if (atomic_load(&hdr->replay_waiting)) wake_daemon();
}

/* ------------------------------------------------------------ read side */

static ssize_t read_tracked(struct conn* c, const struct iovec* iov, int iovcnt, int flags) {
  int peek = flags & MSG_PEEK;
  pthread_mutex_lock(&mu);
  for (;;) {
    drain_done();
    if (readable(c) > 0) {
      uint64_t from = c->consumed;
      size_t n = take(c, iov, iovcnt, peek);
      if (!peek) note_replay_read(c, n);
      /* The first lease_n bytes read are a lease read's (shim_rings.c). */
      size_t lease_n = c->lease_end > from ? (size_t)(c->lease_end - from) : 0;
      if (!peek && n) out_input(c->fd, iov, iovcnt, n, lease_n < n ? lease_n : n);
      wake_watch_leave();
      mu_unlock();
      return (ssize_t)n;
    }
    if (eof_ready(c)) {
      if (!peek) {
        c->eof_read = 1;
        note_replay_read(c, 0);
        fifo_pop_finished();
      }
      wake_watch_leave();
      mu_unlock();
      return 0;
    }
    /* Nothing agreed yet: take what the kernel has so that it gets agreed. */
    uint64_t had = c->received;
    ingest(c);
    if (c->replay_slot >= 0 && (c->received != had || c->eof_submitted) &&
        (readable(c) > 0 || eof_ready(c)))
      continue; /* replayed bytes the order already allows */
    int blocking = !(flags & MSG_DONTWAIT) && !(fcntl(c->fd, F_GETFL) & O_NONBLOCK);
    serial_done(-1); /* read dry: whatever it read is executed */
    if (!blocking) {
      wake_watch_leave();
      mu_unlock();
      errno = EAGAIN;
      return -1;
    }
    /* A blocking socket: wait for an outcome or for more client bytes. */
    uint32_t seen = atomic_load(&hdr->done_futex);
    int fd = c->fd;
    int want_kernel = !c->eof_submitted;
    int mine = waiter_enter(c, 0);
    int watch = wake_watch_claim();
    mu_unlock();
    struct pollfd p[3] = {{.fd = watch ? wake_server_fd : -1, .events = POLLIN},
                          {.fd = fd, .events = want_kernel ? POLLIN : 0},
                          {.fd = mine, .events = POLLIN}};
    atomic_fetch_add(&hdr->server_sleepers, 1);
    if (atomic_load(&hdr->done_futex) == seen) real_poll(p, mine >= 0 ? 3 : 2, 100);
    atomic_fetch_sub(&hdr->server_sleepers, 1);
    int took = 0;
    if (p[0].revents & POLLIN) {
      uint64_t v;
      took = real_read(wake_server_fd, &v, sizeof v) > 0;
    }
    if (mine >= 0 && (p[2].revents & POLLIN)) waiter_took_wake();
    pthread_mutex_lock(&mu);
    waiter_leave();
    if (took) {
      drain_done();
      waiters_relay();
    }
  }
}

ssize_t read(int fd, void* buf, size_t len) {
  struct conn* c = tracked(fd);
  if (c) {
    struct iovec v = {buf, len};
    return read_tracked(c, &v, 1, 0);
  }
  if (inspection_closed(fd)) return 0; /* EOF: shim_inspect.c */
  /* A random device (shim_random.c). */
  if (rnd_tracked(fd)) {
    struct iovec v = {buf, len};
    return rnd_readv(fd, &v, 1);
  }
  return real_read(fd, buf, len);
}

ssize_t recv(int fd, void* buf, size_t len, int flags) {
  struct conn* c = tracked(fd);
  if (c) {
    struct iovec v = {buf, len};
    return read_tracked(c, &v, 1, flags);
  }
  if (inspection_closed(fd)) return 0; /* EOF: shim_inspect.c */
  return real_recv(fd, buf, len, flags);
}

ssize_t recvfrom(int fd, void* buf, size_t len, int flags, struct sockaddr* addr,
                 socklen_t* addrlen) {
  struct conn* c = tracked(fd);
  if (c) {
    struct iovec v = {buf, len};
    ssize_t n = read_tracked(c, &v, 1, flags);
    if (n >= 0 && addr && addrlen) *addrlen = 0; /* connected TCP: no address, as the kernel */
    return n;
  }
  if (inspection_closed(fd)) return 0; /* EOF: shim_inspect.c */
  return real_recvfrom(fd, buf, len, flags, addr, addrlen);
}

ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  struct conn* c = tracked(fd);
  if (c) {
    ssize_t n = read_tracked(c, msg->msg_iov, (int)msg->msg_iovlen, flags);
    if (n >= 0) {
      msg->msg_namelen = 0;
      msg->msg_controllen = 0;
      msg->msg_flags = 0;
    }
    return n;
  }
  if (inspection_closed(fd)) return 0; /* EOF: shim_inspect.c */
  return real_recvmsg(fd, msg, flags);
}

ssize_t readv(int fd, const struct iovec* iov, int iovcnt) {
  struct conn* c = tracked(fd);
  if (c) return read_tracked(c, iov, iovcnt, 0);
  if (inspection_closed(fd)) return 0; /* EOF: shim_inspect.c */
  /* A random device (shim_random.c). */
  if (rnd_tracked(fd)) return rnd_readv(fd, iov, iovcnt);
  return real_readv(fd, iov, iovcnt);
}

/* ------------------------------------------------------------ accept */

static int peer_port_of(int fd, char* text, size_t text_len) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  text[0] = 0;
  if (getpeername(fd, (struct sockaddr*)&a, &len) != 0) return -1;
  char host[INET6_ADDRSTRLEN] = "";
  int port = -1;
  if (a.ss_family == AF_INET) {
    struct sockaddr_in* s = (struct sockaddr_in*)&a;
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    struct sockaddr_in6* s = (struct sockaddr_in6*)&a;
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    port = ntohs(s->sin6_port);
  }
  snprintf(text, text_len, "%s:%d", host, port);
  return port;
}

/* fd's peer as an IPv4 address (network order; a v4-mapped IPv6 one too),
 * 0 for anything else. */
static uint32_t peer_ipv4(int fd) {
  struct sockaddr_storage a;
  socklen_t len = sizeof a;
  if (getpeername(fd, (struct sockaddr*)&a, &len) != 0) return 0;
  if (a.ss_family == AF_INET) return ((struct sockaddr_in*)&a)->sin_addr.s_addr;
  if (a.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6*)&a)->sin6_addr)) {
    uint32_t v4;
    memcpy(&v4, ((struct sockaddr_in6*)&a)->sin6_addr.s6_addr + 12, 4);
    return v4;
  }
  return 0;
}

static int find_replay_slot(int port) {
  for (uint32_t i = 0; i < LS_MAX_REPLAY; i++)
    if (atomic_load(&hdr->replay[i].port) == (uint32_t)port) return (int)i;
  return -1;
}

/* A connection the real accept returned: decide what it is. Returns the fd
 * to give the server, -1 with errno set when it must not see it, or
 * LS_ACCEPT_NEXT when the shim took it for itself (look at the next one). */
#define LS_ACCEPT_NEXT (-2)
static int after_accept(int lfd, int fd, int flags) {
  if (fd < 0 || fd >= LS_MAX_FD || !is_client_listener(lfd)) return fd;
  char peer[80];
  int port = peer_port_of(fd, peer, sizeof peer);
  by_fd[fd] = NULL;
  inspect_forget(fd);
  out_end(fd, LS_OUT_CLOSED); /* a stale stream under this fd number (closed unseen) */
  if (port > 0 && (atomic_load(&hdr->replay_port_bits[port / 64]) >> (port % 64)) & 1) {
    int slot = find_replay_slot(port);
    /* The daemon's connection comes from replay_source, from a port it
     * bound there, once per claim (accepted is cleared with each claim and
     * reattach). Anything else that names the port (a process on another
     * address with the same port number, a second connection) would feed
     * the server bytes of its own as the log's: refused. */
    uint32_t source = atomic_load(&hdr->replay_source);
    if (slot >= 0 &&
        (!source || peer_ipv4(fd) != source || atomic_load(&hdr->replay[slot].accepted))) {
      static _Atomic(uint64_t) refused;
      uint64_t n = atomic_fetch_add(&refused, 1) + 1;
      if (n <= 3 || n % 1000 == 0)
        shim_log(
            "refused a connection from %s on replay slot %d's port: not the daemon's "
            "(%llu such so far)",
            peer, slot, (unsigned long long)n);
      real_close(fd);
      errno = EAGAIN;
      return -1;
    }
    if (slot >= 0 && atomic_load(&hdr->replay[slot].reattach)) {
      pthread_mutex_lock(&mu);
      struct conn* restored = by_slot[slot];
      if (restored && restored->fd >= 0) {
        reattach(restored, fd); /* the server keeps its fd; this one is not its business */
        restored->replay_claim = atomic_load(&hdr->replay[slot].claim);
        atomic_store(&hdr->replay[slot].accepted, 1);
        drain_done();
        mu_unlock();
        return LS_ACCEPT_NEXT;
      }
      atomic_store(&hdr->replay[slot].reattach, 0); /* the server had closed it: a new one */
      mu_unlock();
    }
    if (slot >= 0) {
      /* The daemon replaying the log: the order ring says what to read when. */
      struct conn* r = calloc(1, sizeof *r);
      if (!r) return fd;
      r->fd = fd;
      r->epfd = -1;
      r->replay_slot = slot;
      r->replay_claim = atomic_load(&hdr->replay[slot].claim); /* set before the port */
      r->accept_state = ACCEPT_COMMITTED;
      pthread_mutex_lock(&mu);
      slot_closed_claim[slot] = 0; /* claims are never 0 */
      r->no = (uint32_t)next_conn_no++;
      by_fd[fd] = r;
      by_slot[slot] = r;
      out_open(fd, r->no, slot);
      atomic_store(&hdr->replay[slot].conn, r->no);
      atomic_store(&hdr->replay[slot].accepted, 1);
      drain_done(); /* records may have waited for this connection */
      mu_unlock();
      return fd;
    }
  }
  if (atomic_load(&hdr->mode) != LS_MODE_LEADER) {
    if (inspect_admit(fd, port, peer_ipv4(fd), peer)) return fd; /* shim_inspect.c */
    /* A client, not an inspector: most likely one whose leader address
     * went stale. Served here, its writes would be acknowledged and never
     * agreed; closed, it asks for the leader again. */
    real_close(fd);
    errno = EAGAIN;
    return -1;
  }

  struct conn* c = calloc(1, sizeof *c);
  if (!c) { /* untracked on a leader would be served unagreed: refuse it */
    real_close(fd);
    errno = EAGAIN;
    return -1;
  }
  c->fd = fd;
  c->epfd = -1;
  c->replay_slot = -1;
  pthread_mutex_lock(&mu);
  c->no = (uint32_t)next_conn_no++;
  c->refs = 1; /* held by this function until the outcome is known */
  uint64_t seq = submit(c, LS_SUB_ACCEPT, peer, (uint32_t)strlen(peer));
  (void)seq;
  uint64_t deadline = now_ns() + LS_ACCEPT_WAIT_NS;
  while (c->accept_state == ACCEPT_PENDING) {
    uint64_t now = now_ns();
    if (now >= deadline) break;
    uint32_t seen = atomic_load(&hdr->done_futex);
    mu_unlock();
    futex_wait_done(seen, deadline - now < 10000000 ? deadline - now : 10000000);
    pthread_mutex_lock(&mu);
    drain_done();
  }
  if (c->accept_state == ACCEPT_COMMITTED) {
    by_fd[fd] = c;
    out_open(fd, c->no, -1);
    c->refs--;
    mu_unlock();
    return fd;
  }
  /* Refused (not the leader any more) or not agreed in time: the client
   * must reconnect. If the ACCEPT is agreed later, our CLOSE follows it. */
  if (c->accept_state == ACCEPT_PENDING) {
    c->eof_submitted = 1;
    submit(c, LS_SUB_CLOSE, NULL, 0);
  }
  c->fd = -1;
  conn_unref(c);
  mu_unlock();
  real_close(fd);
  errno = EAGAIN;
  return -1;
}

int accept4(int lfd, struct sockaddr* addr, socklen_t* addrlen, int flags) {
  if ((forked_child || descendant) && is_client_listener(lfd))
    refuse_forked("accepted a client connection");
  for (;;) {
    int fd = real_accept4(lfd, addr, addrlen, flags);
    if (!active || fd < 0) return fd;
    int saved = errno;
    int out = after_accept(lfd, fd, flags);
    if (out >= 0) {
      errno = saved;
      return out;
    }
    if (out == LS_ACCEPT_NEXT) continue;
    if (fcntl(lfd, F_GETFL) & O_NONBLOCK) {
      errno = EAGAIN;
      return -1;
    }
    /* A blocking listener: wait for the next connection instead. */
  }
}

int accept(int lfd, struct sockaddr* addr, socklen_t* addrlen) {
  if ((forked_child || descendant) && is_client_listener(lfd))
    refuse_forked("accepted a client connection");
  if (!active) return real_accept(lfd, addr, addrlen);
  return accept4(lfd, addr, addrlen, 0); /* the same call without flags */
}

/* ------------------------------------------------------------ close */

int close(int fd) {
  rnd_forget(fd); /* shim_random.c: a random device's stream (errno untouched) */
  if (active && fd >= 0 && fd < LS_MAX_FD) {
    int saved = errno;
    out_end(fd, LS_OUT_CLOSED);
    struct conn* c = by_fd[fd];
    if (c) {
      pthread_mutex_lock(&mu);
      by_fd[fd] = NULL;
      if (c->replay_slot >= 0 && by_slot[c->replay_slot] == c) {
        by_slot[c->replay_slot] = NULL;
        /* Its own claim, not the slot's: after the server's shutdown() the
         * daemon may have released the slot and claimed it again already. */
        slot_closed_claim[c->replay_slot] = c->replay_claim;
      }
      /* The server closed a client connection on its own: the backups'
       * copies must close theirs at the same point of the log. */
      if (c->replay_slot < 0 && !c->eof_submitted && !c->log_closed && !c->broken &&
          atomic_load(&hdr->mode) == LS_MODE_LEADER) {
        c->eof_submitted = 1;
        submit(c, LS_SUB_CLOSE, NULL, 0);
      }
      serial_closed(c);
      c->fd = -1;
      c->refs++;
      for (int i = 0; i < log_closed_n; i++)
        if (log_closed_list[i] == c) log_closed_list[i] = log_closed_list[--log_closed_n];
      for (int i = 0; c->in_lease_ready && i < lease_ready_n; i++)
        if (lease_ready_list[i] == c) {
          lease_ready_list[i] = lease_ready_list[--lease_ready_n];
          c->in_lease_ready = 0;
        }
      conn_unref(c);
      fifo_pop_finished();
      mu_unlock();
    }
    if (tick_conns[fd]) { /* an epoll set closed: its ticks with it */
      pthread_mutex_lock(&mu);
      forget_ticks(fd);
      mu_unlock();
    }
    listen_kind[fd] = 0;
    wake_in_epfd[fd] = 0;
    if (wake_exclusive[fd]) { /* relay_wake walks excl_sets under mu */
      pthread_mutex_lock(&mu);
      wake_exclusive[fd] = 0;
      for (int i = 0; i < excl_sets_n; i++)
        if (excl_sets[i] == fd) excl_sets[i--] = excl_sets[--excl_sets_n];
      mu_unlock();
    }
    if (set_wake_fd[fd]) { /* an epoll set closed: its own eventfd with it */
      real_close(set_wake_fd[fd] - 1);
      set_wake_fd[fd] = 0;
    }
    inspect_forget(fd);
    errno = saved;
  }
  return real_close(fd);
}
