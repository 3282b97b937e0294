/* shim_state.c — the shim's shared state, its lowest layer (README.md,
 * "Layers"; shim_state.h says what each piece is): the daemon's region and
 * its rings, the lock, the connection table, the delivery FIFO, the wake
 * eventfds, the real calls the layers above share, the hooks, the log, and
 * the refusal of a forked process that touches a client connection. It
 * calls nothing of the shim's own: only libc.
 *
 * Same rules as shim.c: no C++, errno preserved, no allocation. */
#define _GNU_SOURCE
#include "preload/shim_state.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "preload/shim_abi.h"

/* ------------------------------------------------------------ real calls */

/* Resolved by shim.c's constructor (shim_init); real_write by whoever needs
 * it first (LS_REAL). */
ssize_t (*real_write)(int, const void*, size_t);
ssize_t (*real_recv)(int, void*, size_t, int);

int (*real_close)(int);
int (*real_epoll_ctl)(int, int, int, struct epoll_event*);
int (*real_epoll_pwait)(int, struct epoll_event*, int, int, const sigset_t*);
int (*real_poll)(struct pollfd*, nfds_t, int);
int (*real_ppoll)(struct pollfd*, nfds_t, const struct timespec*, const sigset_t*);
int (*real_select)(int, fd_set*, fd_set*, fd_set*, struct timeval*);
int (*real_pselect)(int, fd_set*, fd_set*, fd_set*, const struct timespec*, const sigset_t*);

/* ------------------------------------------------------------ state */

int active;
struct ls_shim_header* hdr;
char* sub_ring;
struct ls_done_record* done_ring;
struct ls_order_record* order_ring;
int wake_server_fd = -1;
int wake_daemon_fd = -1;
int client_port;
/* A process started by one the server forked (LOCKSTEP_SHIM_PID names
 * another): never attached; refused if it listens on or accepts from the
 * client port (refuse_forked). */
int descendant;
uint32_t max_chunk;

pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

#define LS_WAKES_DUE 8
static __thread int wakes_due[LS_WAKES_DUE];
static __thread int wakes_due_n;

void wake_after_unlock(int efd) {
  for (int i = 0; i < wakes_due_n; i++)
    if (wakes_due[i] == efd) return;
  if (wakes_due_n == LS_WAKES_DUE) {
    (void)eventfd_write(efd, 1); /* more than a wake-up needs: now */
    return;
  }
  wakes_due[wakes_due_n++] = efd;
}

void mu_unlock(void) {
  int due[LS_WAKES_DUE], n = wakes_due_n;
  for (int i = 0; i < n; i++) due[i] = wakes_due[i];
  wakes_due_n = 0;
  pthread_mutex_unlock(&mu);
  if (!n) return;
  int saved = errno;
  for (int i = 0; i < n; i++) (void)eventfd_write(due[i], 1);
  errno = saved;
}
struct conn* by_fd[LS_MAX_FD];
struct conn* by_slot[LS_MAX_REPLAY]; /* replay connections by slot */
/* The claim (ls_replay_slot::claim) of the replay connection the server
 * closed on this slot (0: none): the slot's order records are skipped while
 * the slot is still under that claim, and wait (a new connection, not
 * accepted yet) once the daemon has claimed the slot again (drain_order). */
uint32_t slot_closed_claim[LS_MAX_REPLAY];
uint8_t listen_kind[LS_MAX_FD]; /* 0 unknown, 1 client port, 2 other */
uint8_t wake_in_epfd[LS_MAX_FD];
int set_wake_fd[LS_MAX_FD];
uint8_t wake_exclusive[LS_MAX_FD];
int excl_sets[LS_EXCL_SETS];
int excl_sets_n;
uint64_t drained_gen;
struct conn* tick_conns[LS_MAX_FD];
struct chunk fifo[LS_FIFO_SLOTS];
uint64_t fifo_head_seq = 1, fifo_count;
uint64_t next_conn_no = 1;
uint64_t head_since_ns; /* when the current head chunk became the head */
uint64_t head_seen_seq;
uint32_t head_reports;
struct conn* log_closed_list[256];
int log_closed_n;
struct conn* lease_ready_list[LS_LEASE_READY];
int lease_ready_n;
struct ls_hooks hooks;

void shim_log(const char* fmt, ...) {
  char buf[512];
  int n = snprintf(buf, sizeof buf, "lockstep shim[%d]: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  LS_REAL(write); /* not shim_output.c's write: that lies above */
  (void)!real_write(2, buf, (size_t)n);
}

int env_int(const char* name) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : -1;
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
    LS_REAL(write);
    (void)!real_write(wake_daemon_fd, &one, sizeof one);
  }
  _exit(70); /* EX_SOFTWARE */
}

/* ------------------------------------------------------------ the FIFO */

struct chunk* fifo_at(uint64_t seq) {
  if (seq < fifo_head_seq || seq >= fifo_head_seq + fifo_count) return NULL;
  return &fifo[seq & (LS_FIFO_SLOTS - 1)];
}

void conn_unref(struct conn* c) {
  if (--c->refs == 0 && c->fd < 0) {
    free(c->inbox);
    free(c);
  }
}
