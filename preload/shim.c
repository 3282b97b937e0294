/* shim.c — the LD_PRELOAD shim loaded into the unmodified server.
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
 * delivery window" below), so a server that serves ready connections in the
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
 * stamps here (apply_done, drain_order), the server reads one input at a
 * time (find_head_run), and what it reads sets the clock (clock_from_reads).
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
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "preload/shim_abi.h"
#include "preload/shim_internal.h"

#define LS_GATE_BYPASS_REPORTS 16u      /* told this often it may read, and did not */
#define LS_GATE_BYPASS_NS 1000000000ull /* or 1 s without progress */
#define LS_ACCEPT_WAIT_NS 2000000000ull

/* ------------------------------------------------------------ real calls */

static ssize_t (*real_read)(int, void*, size_t);
static ssize_t (*real_recv)(int, void*, size_t, int);
static ssize_t (*real_recvfrom)(int, void*, size_t, int, struct sockaddr*, socklen_t*);
static ssize_t (*real_recvmsg)(int, struct msghdr*, int);
static ssize_t (*real_readv)(int, const struct iovec*, int);
static int (*real_accept)(int, struct sockaddr*, socklen_t*);
static int (*real_accept4)(int, struct sockaddr*, socklen_t*, int);
LS_HIDDEN int (*real_close)(int);
LS_HIDDEN int (*real_epoll_ctl)(int, int, int, struct epoll_event*);
LS_HIDDEN int (*real_epoll_pwait)(int, struct epoll_event*, int, int, const sigset_t*);
LS_HIDDEN int (*real_poll)(struct pollfd*, nfds_t, int);
LS_HIDDEN int (*real_ppoll)(struct pollfd*, nfds_t, const struct timespec*, const sigset_t*);
LS_HIDDEN int (*real_select)(int, fd_set*, fd_set*, fd_set*, struct timeval*);
LS_HIDDEN int (*real_pselect)(int, fd_set*, fd_set*, fd_set*, const struct timespec*,
                              const sigset_t*);

/* ------------------------------------------------------------ state */

int active;                 /* shim_internal.h */
struct ls_shim_header* hdr; /* shim_internal.h */
static char* sub_ring;
static struct ls_done_record* done_ring;
static struct ls_order_record* order_ring;
int wake_server_fd = -1; /* shim_internal.h */
static int wake_daemon_fd = -1;
static int client_port;
/* A process started by one the server forked (LOCKSTEP_SHIM_PID names
 * another): never attached; refused if it listens on or accepts from the
 * client port (refuse_forked). */
static int descendant;
static uint32_t max_chunk;

pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* shim_internal.h */
struct conn* by_fd[LS_MAX_FD];                  /* shim_internal.h */
static struct conn* by_slot[LS_MAX_REPLAY];     /* replay connections by slot */
/* The claim (ls_replay_slot::claim) of the replay connection the server
 * closed on this slot (0: none): the slot's order records are skipped while
 * the slot is still under that claim, and wait (a new connection, not
 * accepted yet) once the daemon has claimed the slot again (drain_order). */
static uint32_t slot_closed_claim[LS_MAX_REPLAY];
static uint8_t listen_kind[LS_MAX_FD]; /* 0 unknown, 1 client port, 2 other */
uint8_t wake_in_epfd[LS_MAX_FD];       /* shim_internal.h */
int set_wake_fd[LS_MAX_FD];            /* shim_internal.h */
static struct chunk fifo[LS_FIFO_SLOTS];
uint64_t fifo_head_seq = 1, fifo_count; /* shim_internal.h */
static uint64_t next_conn_no = 1;
static uint64_t head_since_ns; /* when the current head chunk became the head */
static uint64_t head_seen_seq;
uint32_t head_reports;             /* shim_internal.h */
struct conn* log_closed_list[256]; /* shim_internal.h */
int log_closed_n;

uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void shim_log(const char* fmt, ...) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "lockstep shim[%d]: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  (void)!write(2, buf, (size_t)n);
}

static int env_int(const char* name) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : -1;
}

__attribute__((constructor)) static void shim_init(void) {
  int saved = errno;
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

/* A process the server forked is not replicated: what it reads from a client
 * would be neither agreed nor replayed on the backups. Children that exec
 * something else, or do their own work (redis's BGSAVE), never touch a
 * client connection and run on; one that does (a prefork server's worker)
 * is refused: it exits, telling why, and the daemon stops the replica
 * (forked_served) rather than let clients be served unreplicated. */
int forked_child;

void refuse_forked(const char* what) {
  shim_log(
      "REFUSED: process %d, %s of the process lockstep started, %s: lockstep replicates a "
      "server whose clients are served by the process it started (on any number of "
      "threads), not by processes it forks or starts; run the server without worker "
      "processes, and start it through a wrapper only if the wrapper execs it",
      (int)getpid(), descendant ? "a descendant" : "a forked child", what);
  struct ls_shim_header* h = hdr;
  int shm_fd = env_int("LOCKSTEP_SHIM_FD");
  if (!h && shm_fd >= 0) { /* a descendant: the region's fd stays open across exec */
    void* p = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
    if (p != MAP_FAILED && ((struct ls_shim_header*)p)->magic == LS_SHIM_MAGIC) h = p;
  }
  if (h) atomic_store(&h->forked_served, (uint32_t)getpid());
  if (wake_daemon_fd >= 0) {
    uint64_t one = 1;
    (void)!write(wake_daemon_fd, &one, sizeof one);
  }
  _exit(70); /* EX_SOFTWARE */
}

static void in_child_after_fork(void) {
  forked_child = active;
  active = 0;
  out_after_fork();
}
__attribute__((constructor)) static void shim_init_fork(void) {
  pthread_atfork(NULL, NULL, in_child_after_fork);
}

/* ------------------------------------------------------------ signalling */

/* The first waker takes the announcement (exchange, not load): the other
 * submissions of the same burst, before the daemon has run, would each
 * write the eventfd again (one write per input under load). The daemon
 * announces again before its next sleep and re-checks its rings after. */
static void wake_daemon(void) {
  if (atomic_exchange(&hdr->daemon_sleeping, 0)) {
    uint64_t one = 1;
    (void)!write(wake_daemon_fd, &one, sizeof one);
  }
}

static void futex_wait_done(uint32_t seen, uint64_t timeout_ns) {
  struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
  atomic_fetch_add(&hdr->server_sleepers, 1);
  if (atomic_load(&hdr->done_futex) == seen)
    syscall(SYS_futex, (uint32_t*)&hdr->done_futex, FUTEX_WAIT, seen, &ts, NULL, 0);
  atomic_fetch_sub(&hdr->server_sleepers, 1);
}

/* ------------------------------------------------------------ the FIFO */

struct chunk* fifo_at(uint64_t seq) {
  if (seq < fifo_head_seq || seq >= fifo_head_seq + fifo_count) return NULL;
  return &fifo[seq & (LS_FIFO_SLOTS - 1)];
}

static void conn_unref(struct conn* c) {
  if (--c->refs == 0 && c->fd < 0) {
    free(c->inbox);
    free(c);
  }
}

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
  }
  return 1;
}

/* same_clock (shim_clock.c): the server's wall clock reads the stamp of
 * the newest input it has read into. It reads in FIFO order, one input at a
 * time (find_head_run), so those are the agreed DATA chunks at the head:
 * the finished ones, about to be popped, and the one it is reading. */
static void clock_from_reads(void) {
  for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count; s++) {
    const struct chunk* ch = &fifo[s & (LS_FIFO_SLOTS - 1)];
    if (ch->kind == LS_SUB_DATA && ch->state == CH_COMMITTED && ch->c->consumed > ch->start)
      clk_enter(ch->clock_ns);
    if (!chunk_finished(ch)) break;
  }
}

static void fifo_pop_finished(void) {
  if (clk_on) clock_from_reads();
  while (fifo_count) {
    struct chunk* h = &fifo[fifo_head_seq & (LS_FIFO_SLOTS - 1)];
    if (!chunk_finished(h)) break;
    struct conn* c = h->c;
    fifo_head_seq++;
    fifo_count--;
    conn_unref(c);
  }
  if (fifo_count && head_seen_seq != fifo_head_seq) {
    head_seen_seq = fifo_head_seq;
    head_since_ns = now_ns();
    head_reports = 0;
  }
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
  if (executing_other(h->c)) return 0;
  return head_reports >= LS_GATE_BYPASS_REPORTS || now_ns() - head_since_ns > LS_GATE_BYPASS_NS;
}

/* ------------------------------------------------------------ completions */

static void apply_done(const struct ls_done_record* d) {
  if (d->kind == LS_DONE_CLOSE) {
    /* A newer leader closed one of our connections: find it by number. */
    for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count; s++) {
      struct chunk* ch = fifo_at(s);
      if (ch->c->no == d->conn) {
        if (!ch->c->log_closed && log_closed_n < 256) log_closed_list[log_closed_n++] = ch->c;
        ch->c->log_closed = 1;
        return;
      }
    }
    for (int fd = 0; fd < LS_MAX_FD; fd++) {
      struct conn* c = by_fd[fd];
      if (c && c->no == d->conn) {
        if (!c->log_closed && log_closed_n < 256) log_closed_list[log_closed_n++] = c;
        c->log_closed = 1;
        return;
      }
    }
    return;
  }
  struct chunk* ch = fifo_at(d->seq);
  if (!ch || ch->state != CH_PENDING) return;
  struct conn* c = ch->c;
  if (d->kind == LS_DONE_COMMITTED) {
    ch->state = CH_COMMITTED;
    ch->clock_ns = d->clock_ns;
    if (ch->kind == LS_SUB_ACCEPT) c->accept_state = ACCEPT_COMMITTED;
    if (ch->kind == LS_SUB_DATA && !c->broken) c->committed_end = ch->end;
    if (ch->kind == LS_SUB_CLOSE) c->close_committed = 1;
  } else {
    ch->state = CH_DROPPED;
    if (ch->kind == LS_SUB_ACCEPT)
      c->accept_state = ACCEPT_DROPPED;
    else
      c->broken = 1;
  }
}

static struct chunk* push_chunk(struct conn* c, uint8_t kind, uint8_t state) {
  uint64_t seq = fifo_head_seq + fifo_count;
  struct chunk* ch = &fifo[seq & (LS_FIFO_SLOTS - 1)];
  ch->c = c;
  ch->seq = seq;
  ch->kind = kind;
  ch->state = state;
  ch->end = kind == LS_SUB_DATA && state == CH_COMMITTED ? c->committed_end : c->received;
  ch->start = ch->end;
  ch->clock_ns = 0;
  if (kind == LS_SUB_DATA) {
    ch->start = c->chunked_end;
    c->chunked_end = ch->end;
  }
  c->refs++;
  if (fifo_count++ == 0) {
    head_seen_seq = seq;
    head_since_ns = now_ns();
    head_reports = 0;
  }
  return ch;
}

/* The reply gate (log_input.h, out_before). The leader's shim notes with
 * each input how much output its server had sent on that connection when
 * the input came; a backup's server may read the input only once it has
 * sent as much there. A client that waits for each reply thus reaches every
 * replica's server one request at a time, as it reached the leader's: a
 * server that reads ahead and starts the next request while a thread still
 * answers the previous one (clamd in IDSESSION: replies tagged by request,
 * in whatever order its threads finish) would otherwise answer a backup's
 * burst of replayed requests in another order than the leader's. An input
 * waits behind a gate for at most LS_REPLY_GATE_MAX_NS (a server whose
 * output differs, or comes from a timer, must not stop its replica: the
 * output comparison judges it), and everything after it waits too. */
#define LS_REPLY_GATE_MAX_NS 5000000000ull
static _Atomic(int) gate_fd = -1;   /* waiting for output on this fd; -2: it came; -1: none */
static _Atomic(uint64_t) gate_need; /* ... up to this stream offset */
static uint64_t gate_tail;          /* the order record that waits */
static uint64_t gate_since_ns;
static uint64_t gates_expired;

int reply_gate_pending(void) {
  return atomic_load(&gate_fd) != -1;
}

void reply_gate_sent(int fd, uint64_t end) {
  int want = fd;
  if (atomic_load(&gate_fd) == fd && end >= atomic_load(&gate_need) &&
      atomic_compare_exchange_strong(&gate_fd, &want, -2))
    (void)eventfd_write(wake_server_fd, 1); /* whoever waits drains the order again */
}

/* 1: the order record at `tail` (for c, needing `need`) may be taken. */
static int gate_open(uint64_t tail, struct conn* c, uint64_t need) {
  if (need == 0 || c->fd < 0 || out_offset(c->fd) >= need) {
    atomic_store(&gate_fd, -1);
    return 1;
  }
  uint64_t now = now_ns();
  if (atomic_load(&gate_fd) == -1 || gate_tail != tail) {
    gate_tail = tail;
    gate_since_ns = now;
    atomic_store(&gate_need, need);
    atomic_store(&gate_fd, c->fd);
    if (out_offset(c->fd) < need) return 0; /* else its reply came meanwhile */
  } else if (now - gate_since_ns < LS_REPLY_GATE_MAX_NS) {
    if (atomic_load(&gate_fd) == -2) atomic_store(&gate_fd, c->fd); /* not enough yet */
    if (out_offset(c->fd) < need) return 0;
  } else if (gates_expired++ < 10) {
    shim_log(
        "reply gate: connection %u waited %.1f s for the server's output to reach byte %llu "
        "(it stands at %llu) before its next input; delivered anyway",
        c->no, (double)(now - gate_since_ns) / 1e9, (unsigned long long)need,
        (unsigned long long)out_offset(c->fd));
  }
  atomic_store(&gate_fd, -1);
  return 1;
}

/* Takes the replay order the daemon published: each record allows the
 * server to read the next `len` bytes of one replay connection (or its EOF),
 * after everything before it. A record for a connection the server has not
 * accepted yet waits, and so do the ones after it; so does one behind its
 * reply gate (above). Called with mu held. */
static void drain_order(void) {
  uint64_t head = atomic_load_explicit(&hdr->order_head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(&hdr->order_tail, memory_order_relaxed);
  uint64_t first = tail;
  for (; tail < head && fifo_count < LS_FIFO_SLOTS; tail++) {
    const struct ls_order_record* r = &order_ring[tail % hdr->order_slots];
    if (r->slot >= LS_MAX_REPLAY) continue;
    struct conn* c = by_slot[r->slot];
    /* Nothing to deliver when the server closed the slot's connection
     * (slot_closed_claim), or the daemon released the slot (port 0): it does
     * so once the server closed it, and reuses it only after this ring
     * named it for the last time (shim_channel.cc ReleaseReplaySlot). A
     * server that closes after its reply while the client's EOF is still
     * ordered (HTTP/1.0) leaves such records behind. Not by port: the next
     * claim of the slot may get the same port, and its first input was then
     * dropped as the closed one's (gerbera under load: a backup's libupnp
     * read EOF first and answered 400). */
    uint32_t port = atomic_load(&hdr->replay[r->slot].port);
    uint32_t claim = atomic_load(&hdr->replay[r->slot].claim);
    /* Every record of an earlier claim was taken before the daemon claimed
     * the slot again: the record is the current claim's. A connection of an
     * earlier claim still under the slot was shut down by the server, not
     * yet closed (libupnp: shutdown, then close; the daemon released the
     * slot at the shutdown): the record waits for the new one's accept. */
    if (c && c->replay_claim != claim) c = NULL;
    if (!c && (port == 0 || slot_closed_claim[r->slot] == claim)) continue;
    if (!c) break; /* not accepted yet: it and all after it wait */
    if (!gate_open(tail, c, r->out_before)) break;
    if (r->kind == LS_ORDER_DATA) {
      c->committed_end += r->len;
      push_chunk(c, LS_SUB_DATA, CH_COMMITTED)->clock_ns = r->clock_ns;
    } else {
      c->close_committed = 1;
      push_chunk(c, LS_SUB_CLOSE, CH_COMMITTED);
    }
  }
  if (tail != first) {
    atomic_store_explicit(&hdr->order_tail, tail, memory_order_release);
    if (atomic_load(&hdr->replay_waiting)) wake_daemon();
  }
}

/* Takes the daemon's outcomes and replay order. Called with mu held. */
void drain_done(void) {
  uint64_t head = atomic_load_explicit(&hdr->done_head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(&hdr->done_tail, memory_order_relaxed);
  for (; tail < head; tail++) apply_done(&done_ring[tail % hdr->done_slots]);
  atomic_store_explicit(&hdr->done_tail, tail, memory_order_release);
  drain_order();
  fifo_pop_finished();
}

/* ------------------------------------------------------------ submissions */

/* Hands one input to the daemon. Called with mu held; may drop it while the
 * ring or the FIFO is full (back-pressure: the server's thread waits). */
static uint64_t submit(struct conn* c, uint8_t kind, const void* bytes, uint32_t len) {
  uint64_t need = (sizeof(struct ls_sub_record) + len + 7) & ~7ull;
  for (;;) {
    uint64_t head = atomic_load_explicit(&hdr->sub_head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&hdr->sub_tail, memory_order_acquire);
    uint64_t at = head % hdr->sub_bytes;
    uint64_t waste = at + need > hdr->sub_bytes ? hdr->sub_bytes - at : 0;
    if (fifo_count < LS_FIFO_SLOTS && head + waste + need - tail <= hdr->sub_bytes) {
      if (waste) {
        struct ls_sub_record* w = (struct ls_sub_record*)(sub_ring + at);
        w->kind = LS_SUB_WRAP;
        w->len = 0;
        head += waste;
        at = 0;
      }
      uint64_t seq = fifo_head_seq + fifo_count;
      struct ls_sub_record* r = (struct ls_sub_record*)(sub_ring + at);
      r->len = len;
      r->kind = kind;
      r->conn = c->no;
      r->pad2 = 0;
      r->seq = seq;
      uint64_t sent = kind == LS_SUB_ACCEPT || c->fd < 0 ? 0 : out_offset(c->fd);
      r->out_before = sent == UINT64_MAX ? 0 : sent;
      if (len) memcpy(r + 1, bytes, len);
      push_chunk(c, kind, CH_PENDING);
      atomic_store_explicit(&hdr->sub_head, head + need, memory_order_seq_cst);
      wake_daemon();
      return seq;
    }
    /* Full: wake the daemon and wait for it to catch up. */
    uint64_t one = 1;
    (void)!write(wake_daemon_fd, &one, sizeof one);
    uint32_t seen = atomic_load(&hdr->done_futex);
    pthread_mutex_unlock(&mu);
    futex_wait_done(seen, 1000000);
    pthread_mutex_lock(&mu);
    drain_done();
  }
}

static int inbox_reserve(struct conn* c, uint64_t more) {
  uint64_t used = c->received - c->inbox_base;
  uint64_t dead = c->consumed - c->inbox_base;
  if (dead > 0 && dead >= used / 2) { /* slide consumed bytes out */
    memmove(c->inbox, c->inbox + dead, used - dead);
    c->inbox_base += dead;
    used -= dead;
  }
  if (used + more <= c->inbox_cap) return 1;
  uint64_t cap = c->inbox_cap ? c->inbox_cap : 16384;
  while (cap < used + more) cap *= 2;
  char* p = realloc(c->inbox, cap);
  if (!p) return 0;
  c->inbox = p;
  c->inbox_cap = cap;
  return 1;
}

static void stop_kernel_input(struct conn* c) {
  if (c->epfd >= 0 && (c->events & EPOLLIN)) {
    struct epoll_event ev = {.events = kernel_interest(c),
                             .data.u64 = LS_CONN_TAG | (uint64_t)c->fd};
    real_epoll_ctl(c->epfd, EPOLL_CTL_MOD, c->fd, &ev);
  }
}

/* The kernel interest the shim registers for a tracked connection: what the
 * server asked for, level-triggered and never one-shot (the shim must hear
 * every client byte to ingest it; shim_wait.c gives the server its one-shot
 * and edge semantics), without input once EOF was taken, and without the
 * events the server must not hear now: all but input while one-shot
 * disarmed, EPOLLOUT after an edge was told. */
uint32_t kernel_interest(const struct conn* c) {
  uint32_t kernel = c->events & ~(uint32_t)(EPOLLET | EPOLLONESHOT);
  if (c->disarmed) kernel &= (uint32_t)(EPOLLIN | EPOLLRDHUP);
  if (c->et_out_told) kernel &= ~(uint32_t)EPOLLOUT;
  if (c->eof_submitted) kernel &= ~(uint32_t)(EPOLLIN | EPOLLRDHUP);
  return kernel;
}

/* A replay connection restored from a checkpoint whose fresh connection has
 * not been put in place yet (shim_abi.h, "After a restore"). Its socket is
 * dead: it is taken out of the kernel's epoll set so that its hang-up does
 * not wake the server's loop over and over. Called with mu held. */
static int awaiting_reattach(struct conn* c) {
  if (c->replay_slot < 0 || !atomic_load(&hdr->replay[c->replay_slot].reattach)) return 0;
  if (!c->detached && c->epfd >= 0) real_epoll_ctl(c->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  c->detached = 1;
  return 1;
}

/* Puts the fresh connection `fresh` in place of c's dead restored socket,
 * under c's fd number, with its flags and the server's epoll interest.
 * Called with mu held; closes `fresh`. */
static void reattach(struct conn* c, int fresh) {
  int status_flags = fcntl(c->fd, F_GETFL);
  int fd_flags = fcntl(c->fd, F_GETFD);
  if (!c->detached && c->epfd >= 0) real_epoll_ctl(c->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  if (dup2(fresh, c->fd) < 0) {
    shim_log("cannot put the replay connection of slot %d back in place: %s", c->replay_slot,
             strerror(errno));
    real_close(fresh);
    return;
  }
  real_close(fresh);
  if (status_flags >= 0) fcntl(c->fd, F_SETFL, status_flags);
  if (fd_flags >= 0) fcntl(c->fd, F_SETFD, fd_flags);
  if (c->epfd >= 0) {
    struct epoll_event ev = {.events = kernel_interest(c),
                             .data.u64 = LS_CONN_TAG | (uint64_t)c->fd};
    real_epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->fd, &ev);
  }
  c->detached = 0;
  atomic_store(&hdr->replay[c->replay_slot].reattach, 0);
  if (atomic_load(&hdr->replay_waiting)) wake_daemon();
}

/* Moves what the kernel holds for a client connection into its inbox and
 * hands it to the daemon. Called with mu held. */
void ingest(struct conn* c) {
  if (c->fd < 0 || c->eof_submitted) return;
  if (c->replay_slot >= 0) {
    if (awaiting_reattach(c)) return; /* a dead restored socket: its EOF means nothing */
    /* The daemon's replay connection: keep what arrives; the order ring
     * says when the server may read it. */
    for (int round = 0; round < 8; round++) {
      if (!inbox_reserve(c, max_chunk)) return;
      ssize_t n =
          real_recv(c->fd, c->inbox + (c->received - c->inbox_base), max_chunk, MSG_DONTWAIT);
      if (n > 0) {
        c->received += (uint64_t)n;
        if ((uint64_t)n < max_chunk) return;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      c->eof_submitted = 1; /* the daemon shut its side: nothing more comes */
      stop_kernel_input(c);
      return;
    }
    return;
  }
  int discard = c->broken || c->gap || c->log_closed || atomic_load(&hdr->mode) != LS_MODE_LEADER;
  for (int round = 0; round < 8; round++) {
    if (!inbox_reserve(c, max_chunk)) return;
    char* tail = c->inbox + (c->received - c->inbox_base);
    ssize_t n = real_recv(c->fd, tail, max_chunk, MSG_DONTWAIT);
    if (n > 0) {
      if (discard) {
        /* Not the leader any more: these bytes are never agreed, and the
         * stream has a hole from here on: nothing after it may be submitted
         * either (this replica may lead again before the log closes it).
         * Not `broken`: inputs submitted before the hole may still commit,
         * and then this server must read them as the backups do. */
        c->gap = 1;
        continue;
      }
      c->received += (uint64_t)n;
      submit(c, LS_SUB_DATA, tail, (uint32_t)n);
      if ((uint64_t)n < max_chunk) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    /* EOF, or the connection failed: the client is gone. */
    c->eof_submitted = 1;
    stop_kernel_input(c);
    if (!discard) submit(c, LS_SUB_CLOSE, NULL, 0);
    return;
  }
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
    if (ch->kind == LS_SUB_ACCEPT) continue;   /* delivered by accept itself */
    if (r.c && ch->c != r.c) break;            /* the next connection's run */
    if (!r.c && executing_other(ch->c)) break; /* serial_inputs: not its turn yet */
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

/* Bytes connection c may hand to the server now. Called with mu held. */
uint64_t readable(struct conn* c) {
  /* A replayed input may be allowed before all its bytes arrived. */
  uint64_t have = c->committed_end < c->received ? c->committed_end : c->received;
  if (c->consumed >= have) return 0;
  if (gate_bypassed()) return have - c->consumed;
  struct head_run r = find_head_run();
  if (r.c != c) return 0;
  uint64_t end = r.end < have ? r.end : have;
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
    if (done) serial_begin(c);
    c->consumed = from;
    head_reports = 0; /* the server is reading: progress, not neglect */
    head_since_ns = now_ns();
    fifo_pop_finished();
  }
  return done;
}

/* ------------------------------------------------------------ lookups */

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

static int is_client_listener(int lfd) {
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

/* ------------------------------------------------------------ read side */

static ssize_t read_tracked(struct conn* c, const struct iovec* iov, int iovcnt, int flags) {
  int peek = flags & MSG_PEEK;
  pthread_mutex_lock(&mu);
  for (;;) {
    drain_done();
    if (readable(c) > 0) {
      size_t n = take(c, iov, iovcnt, peek);
      if (!peek) note_replay_read(c, n);
      if (!peek && n) out_input(c->fd, iov, iovcnt, n);
      pthread_mutex_unlock(&mu);
      return (ssize_t)n;
    }
    if (eof_ready(c)) {
      if (!peek) {
        c->eof_read = 1;
        note_replay_read(c, 0);
        fifo_pop_finished();
      }
      pthread_mutex_unlock(&mu);
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
      pthread_mutex_unlock(&mu);
      errno = EAGAIN;
      return -1;
    }
    /* A blocking socket: wait for an outcome or for more client bytes. */
    uint32_t seen = atomic_load(&hdr->done_futex);
    int fd = c->fd;
    int want_kernel = !c->eof_submitted;
    int mine = waiter_enter(c);
    pthread_mutex_unlock(&mu);
    struct pollfd p[3] = {{.fd = wake_server_fd, .events = POLLIN},
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
    if (slot >= 0 && atomic_load(&hdr->replay[slot].reattach)) {
      pthread_mutex_lock(&mu);
      struct conn* restored = by_slot[slot];
      if (restored && restored->fd >= 0) {
        reattach(restored, fd); /* the server keeps its fd; this one is not its business */
        restored->replay_claim = atomic_load(&hdr->replay[slot].claim);
        atomic_store(&hdr->replay[slot].accepted, 1);
        drain_done();
        pthread_mutex_unlock(&mu);
        return LS_ACCEPT_NEXT;
      }
      atomic_store(&hdr->replay[slot].reattach, 0); /* the server had closed it: a new one */
      pthread_mutex_unlock(&mu);
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
      pthread_mutex_unlock(&mu);
      return fd;
    }
  }
  if (atomic_load(&hdr->mode) != LS_MODE_LEADER) {
    if (inspect_admit(fd, port, peer)) return fd; /* an inspector (shim_inspect.c) */
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
    pthread_mutex_unlock(&mu);
    futex_wait_done(seen, deadline - now < 10000000 ? deadline - now : 10000000);
    pthread_mutex_lock(&mu);
    drain_done();
  }
  if (c->accept_state == ACCEPT_COMMITTED) {
    by_fd[fd] = c;
    out_open(fd, c->no, -1);
    c->refs--;
    pthread_mutex_unlock(&mu);
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
  pthread_mutex_unlock(&mu);
  real_close(fd);
  errno = EAGAIN;
  return -1;
}

void listen_check(int fd) {
  if ((forked_child || descendant) && is_client_listener(fd))
    refuse_forked("listens on the client port");
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
      conn_unref(c);
      fifo_pop_finished();
      pthread_mutex_unlock(&mu);
    }
    listen_kind[fd] = 0;
    wake_in_epfd[fd] = 0;
    if (set_wake_fd[fd]) { /* an epoll set closed: its own eventfd with it */
      real_close(set_wake_fd[fd] - 1);
      set_wake_fd[fd] = 0;
    }
    inspect_forget(fd);
    errno = saved;
  }
  return real_close(fd);
}
