/* shim_state.h — the shim's shared state, its lowest layer (README.md,
 * "Layers"): the daemon's region and its rings, the lock, the connection
 * table, the delivery FIFO, the wake eventfds, the real libc calls the
 * layers above share, and the hooks through which a lower layer tells (or
 * asks) a higher one something without calling up into it. Defined in
 * shim_state.c; every other file of the shim may include this.
 * Nothing here is exported from the library: the server and its other
 * libraries never see these names. */
#ifndef LOCKSTEP_SHIM_STATE_H
#define LOCKSTEP_SHIM_STATE_H

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "preload/shim_abi.h"

#define LS_MAX_FD 65536
#define LS_HIDDEN __attribute__((visibility("hidden")))

/* A real libc call looked up when first needed: the wrappers may run before
 * any constructor of ours (another library's constructor, the loader's). */
#define LS_REAL(fn)                                                         \
  do {                                                                      \
    if (__builtin_expect(!real_##fn, 0)) real_##fn = dlsym(RTLD_NEXT, #fn); \
  } while (0)

LS_HIDDEN extern struct ls_shim_header* hdr; /* the daemon's region; NULL: not attached */
LS_HIDDEN extern pthread_mutex_t mu;         /* the connection table's lock */
/* Lets go of mu, then writes the wake-ups wake_after_unlock() queued. */
LS_HIDDEN void mu_unlock(void);
/* Wakes the thread sleeping on eventfd `efd` once mu is let go (mu held):
 * woken while its waker still held mu, it found mu taken and slept again
 * on it at once (MariaDB at 16 threads: most of a backup's 0.8 futex
 * wake-ups per statement). Only for eventfds that are never closed while
 * the server runs (shim_serial.c's waiters' own: reused, not closed), since
 * the write comes after mu no longer guards the fd. */
LS_HIDDEN void wake_after_unlock(int efd);
LS_HIDDEN void shim_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
LS_HIDDEN int env_int(const char* name); /* the variable's number; -1 when unset or empty */

/* The connection table and the delivery FIFO. All of it under `mu`. */
#define LS_FIFO_SLOTS (1u << 16)
#define LS_WAKE_TAG 0x4c4f434b57414b45ull /* epoll data of the wake eventfd */
#define LS_CONN_TAG 0x4c53000000000000ull /* epoll data of a tracked fd: tag | fd */
#define LS_TAG_MASK 0xffff000000000000ull

enum chunk_state { CH_PENDING, CH_COMMITTED, CH_DROPPED };
/* Where a connection's ACCEPT stands (0, the calloc'd state, is pending). */
enum accept_state { ACCEPT_PENDING, ACCEPT_COMMITTED, ACCEPT_DROPPED };

struct conn;
struct chunk {
  struct conn* c;
  uint64_t seq;
  uint64_t start;    /* DATA: stream offset of this chunk's first byte */
  uint64_t end;      /* DATA: stream offset just past this chunk's bytes */
  uint64_t clock_ns; /* the input's wall-clock stamp, once agreed (shim_clock.c) */
  uint8_t kind;      /* LS_SUB_* */
  uint8_t state;
};

enum conn_nonblocking { NONBLOCKING_UNKNOWN, NONBLOCKING_YES, NONBLOCKING_NO };

struct conn {
  uint32_t no;
  int fd;              /* -1 once the server closed it */
  int refs;            /* chunks in the FIFO that point here */
  int accept_state;    /* enum accept_state */
  int eof_submitted;   /* CLOSE handed to the daemon: no more kernel input */
  int close_committed; /* the CLOSE is agreed */
  int log_closed;      /* a newer leader's CLOSE for this connection was agreed */
  int eof_read;        /* the server has read EOF */
  int broken;          /* an input was dropped: nothing past it is delivered */
  uint64_t broken_at;  /* ... the stream offset where the first dropped input began */
  int gap;         /* client bytes were discarded (not the leader): none past them is submitted */
  int replay_slot; /* >= 0: the daemon's replay connection (order from the order ring) */
  uint32_t replay_claim; /* the slot's claim it was accepted (or reattached) under */
  int detached;          /* a dead restored socket, taken out of the kernel's epoll set */
  char* inbox;           /* stream bytes from inbox_base on */
  uint64_t inbox_base, inbox_cap;
  uint64_t received;      /* stream bytes taken from the kernel */
  uint64_t committed_end; /* stream bytes agreed (contiguous) */
  uint64_t consumed;      /* stream bytes the server has read */
  uint64_t chunked_end;   /* stream offset where the next DATA chunk starts */
  /* Bytes up to here that the server has not read yet are a lease read's
   * (shim_rings.c lease_serve): their replies are left out of the stream. */
  uint64_t lease_end;
  /* Bytes up to here the server may read whatever the delivery order says:
   * a lease read's, served outside it (shim_rings.c lease_serve). While
   * some are unread the connection is in lease_ready_list (in_lease_ready). */
  uint64_t unordered_end;
  int in_lease_ready;
  /* The epoll call that last told the server about it (shim_wait.c). */
  uint64_t told_gen;
  /* Whether its socket is non-blocking, looked up once (fcntl) when epoll
   * first reports it ahead of its turn (shim_wait.c, tell_next_runs). */
  int nonblocking; /* enum conn_nonblocking */
  /* A replay connection's kernel input left out: nothing owed (shim_rings.c,
   * replay_interest). */
  int replay_in_off;
  /* Output on fd when its last agreed input was handed to the server
   * (drain_order): past it, the server has begun to answer that input (the
   * reply gate's "a shorter reply is over", shim_rings.c). */
  uint64_t out_at_order;
  /* The server's epoll registration (one epoll set per connection). */
  int epfd;
  uint32_t events;
  epoll_data_t data;
  /* What the server was told since its last ADD/MOD, so that EPOLLONESHOT
   * and EPOLLET mean for the shim's events what they mean for the kernel's
   * (shim_wait.c, tell). */
  int disarmed;      /* EPOLLONESHOT: reported once, silent until re-armed */
  uint64_t et_until; /* EPOLLET: agreed bytes up to here were reported */
  int et_eof_told;   /* EPOLLET: the readable EOF was reported */
  int et_out_told;   /* EPOLLET: writable reported; again once a send would block */
  /* An epoll set's ticks (shim_abi.h "Ticks"; tick_conns), not a client's
   * connection: fd is the set's, `received` counts the ticks pushed into the
   * FIFO, `consumed` those its waits took (a TICK chunk's `end` is its
   * number). No inbox, no epoll registration (epfd -1). */
  int is_ticks;
  int tick_waited;        /* a thread has waited in the set (else its ticks are orphans) */
  uint64_t tick_seq;      /* the leader's own TICK in flight (its seq), or 0 */
  uint64_t tick_retry_ns; /* its last was dropped: the next not before this (now_ns) */
};

LS_HIDDEN extern int active;         /* attached to a daemon's region */
LS_HIDDEN extern int wake_server_fd; /* the daemon's eventfd that wakes the server */
LS_HIDDEN extern int wake_daemon_fd; /* ours that wakes the daemon */
LS_HIDDEN extern int client_port;    /* the server's client port */
LS_HIDDEN extern int descendant;     /* started by a process the server forked */
LS_HIDDEN extern uint32_t max_chunk; /* the most bytes one DATA input carries */
/* The region's rings (shim_abi.h), set when it is mapped (shim.c). */
LS_HIDDEN extern char* sub_ring;
LS_HIDDEN extern struct ls_done_record* done_ring;
LS_HIDDEN extern struct ls_order_record* order_ring;
LS_HIDDEN extern struct conn* by_fd[LS_MAX_FD];
LS_HIDDEN extern struct conn* by_slot[LS_MAX_REPLAY]; /* replay connections by slot */
LS_HIDDEN extern uint32_t slot_closed_claim[LS_MAX_REPLAY];
LS_HIDDEN extern uint8_t listen_kind[LS_MAX_FD];     /* 0 unknown, 1 client port, 2 other */
LS_HIDDEN extern uint8_t wake_in_epfd[LS_MAX_FD];    /* the wake eventfd is in this epoll set */
LS_HIDDEN extern struct chunk fifo[LS_FIFO_SLOTS];   /* the delivery FIFO, by seq */
LS_HIDDEN extern uint64_t fifo_head_seq, fifo_count; /* seqs fifo_head_seq .. +count-1 */
LS_HIDDEN extern uint64_t next_conn_no;
LS_HIDDEN extern uint64_t head_since_ns; /* when the current head chunk became the head */
LS_HIDDEN extern uint64_t head_seen_seq;
LS_HIDDEN extern uint32_t head_reports; /* times the server was told the head is readable */
LS_HIDDEN extern struct conn* log_closed_list[256]; /* closed by the log, EOF not yet read */
LS_HIDDEN extern int log_closed_n;
/* Connections with a lease read the server has not read yet (unordered_end):
 * epoll reports them beside the delivery order's head. */
#define LS_LEASE_READY 256
LS_HIDDEN extern struct conn* lease_ready_list[LS_LEASE_READY];
LS_HIDDEN extern int lease_ready_n;
/* Per epoll set, the shim's own eventfd (fd + 1; 0: none), which
 * serial_done writes to wake just the thread waiting in that set. */
LS_HIDDEN extern int set_wake_fd[LS_MAX_FD];
/* Per epoll set, the daemon's wake eventfd is in it with EPOLLEXCLUSIVE
 * (shim_wait.c, "Exclusive wake-ups"); those sets, in excl_sets. */
#define LS_EXCL_SETS 64
LS_HIDDEN extern uint8_t wake_exclusive[LS_MAX_FD];
LS_HIDDEN extern int excl_sets[LS_EXCL_SETS];
LS_HIDDEN extern int excl_sets_n;
/* Bumped by drain_done when it took anything from the daemon's rings. */
LS_HIDDEN extern uint64_t drained_gen;
/* Per epoll set, its ticks (struct conn, is_ticks), created when a thread
 * first waits in it with timers on or its first tick is ordered. */
LS_HIDDEN extern struct conn* tick_conns[LS_MAX_FD];
LS_HIDDEN extern ssize_t (*real_write)(int, const void*, size_t);
LS_HIDDEN extern ssize_t (*real_recv)(int, void*, size_t, int);
LS_HIDDEN extern int (*real_close)(int);
LS_HIDDEN extern int (*real_epoll_ctl)(int, int, int, struct epoll_event*);
LS_HIDDEN extern int (*real_epoll_pwait)(int, struct epoll_event*, int, int, const sigset_t*);
LS_HIDDEN extern int (*real_poll)(struct pollfd*, nfds_t, int);
LS_HIDDEN extern int (*real_ppoll)(struct pollfd*, nfds_t, const struct timespec*, const sigset_t*);
LS_HIDDEN extern int (*real_select)(int, fd_set*, fd_set*, fd_set*, struct timeval*);
LS_HIDDEN extern int (*real_pselect)(int, fd_set*, fd_set*, fd_set*, const struct timespec*,
                                     const sigset_t*);

/* The chunk of seq, or NULL when it is not in the FIFO. */
LS_HIDDEN struct chunk* fifo_at(uint64_t seq);
/* Drops a reference to c: freed with the last one once the server closed it. */
LS_HIDDEN void conn_unref(struct conn* c);

LS_HIDDEN extern int forked_child; /* a process the server forked (shim.c) */
LS_HIDDEN void refuse_forked(const char* what) __attribute__((noreturn));
/* The tracked connection under fd, or NULL. */
static inline struct conn* tracked(int fd) {
  if (fd < 0 || fd >= LS_MAX_FD) return NULL;
  if (!active) {
    if (forked_child && by_fd[fd]) refuse_forked("used a client connection");
    return NULL;
  }
  return by_fd[fd];
}

/* Hooks: where a lower layer must tell (or ask) a higher one something, it
 * calls the function kept here, not a function above it. shim.c, on top,
 * sets them when the library is loaded (shim_init), before anything here
 * is attached; they are never NULL when called. */
struct ls_hooks {
  /* The delivery order (shim_order.c) asks serial_inputs (shim_serial.c,
   * executing_other) whether another connection's input executes, so that
   * c's must wait. mu held. */
  int (*executing_other)(const struct conn* c);
  /* The output side (shim_output.c) tells that the server's output on fd
   * reached stream offset `end` (a send finished): the reply gate
   * (shim_rings.c) and serial_until_reply (shim_serial.c). Without mu. */
  void (*output_reached)(int fd, uint64_t end);
  /* The output side asks, after a send on fd, a client connection of this
   * replica's, failed because its client is gone: 1 if the server must be
   * told it succeeded, since inputs agreed before the connection's CLOSE
   * may still be read there (shim_output.c as_sent); 0 once it has read all
   * that will ever come (its EOF is due): the failure goes through. The
   * input side takes the reset from the kernel first, so that the CLOSE is
   * submitted also for a server that only writes there. Without mu. */
  int (*client_gone)(int fd);
};
LS_HIDDEN extern struct ls_hooks hooks;

#endif
