/* shim_internal.h — what the shim's own files (shim.c, shim_wait.c,
 * shim_serial.c, shim_output.c, shim_stack.c, shim_random.c,
 * shim_unchecked.c, shim_clock.c, shim_inspect.c) share.
 * Nothing here is exported from the library: the server and its other
 * libraries never see these names. */
#ifndef LOCKSTEP_SHIM_INTERNAL_H
#define LOCKSTEP_SHIM_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "preload/shim_abi.h"

#define LS_MAX_FD 65536
#define LS_HIDDEN __attribute__((visibility("hidden")))

/* shim.c */
LS_HIDDEN extern struct ls_shim_header* hdr; /* the daemon's region; NULL: not attached */
LS_HIDDEN extern pthread_mutex_t mu;         /* the connection table's lock */
LS_HIDDEN void shim_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* shim.c: the connection table and the delivery FIFO, shared with
 * shim_wait.c (epoll and poll). All of it under `mu`. */
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
};

/* The delivery window: the head run (see find_head_run in shim.c). */
struct head_run {
  struct conn* c;
  uint64_t end;
  int close;
};

LS_HIDDEN extern int active;         /* attached to a daemon's region */
LS_HIDDEN extern int wake_server_fd; /* the daemon's eventfd that wakes the server */
LS_HIDDEN extern struct conn* by_fd[LS_MAX_FD];
LS_HIDDEN extern uint8_t wake_in_epfd[LS_MAX_FD];    /* the wake eventfd is in this epoll set */
LS_HIDDEN extern uint64_t fifo_head_seq, fifo_count; /* seqs fifo_head_seq .. +count-1 */
LS_HIDDEN extern uint32_t head_reports; /* times the server was told the head is readable */
LS_HIDDEN extern struct conn* log_closed_list[256]; /* closed by the log, EOF not yet read */
LS_HIDDEN extern int log_closed_n;
LS_HIDDEN extern int (*real_epoll_ctl)(int, int, int, struct epoll_event*);
LS_HIDDEN extern int (*real_epoll_pwait)(int, struct epoll_event*, int, int, const sigset_t*);
LS_HIDDEN extern int (*real_poll)(struct pollfd*, nfds_t, int);
LS_HIDDEN extern int (*real_close)(int);
LS_HIDDEN extern int (*real_ppoll)(struct pollfd*, nfds_t, const struct timespec*, const sigset_t*);
LS_HIDDEN extern int (*real_select)(int, fd_set*, fd_set*, fd_set*, struct timeval*);
LS_HIDDEN extern int (*real_pselect)(int, fd_set*, fd_set*, fd_set*, const struct timespec*,
                                     const sigset_t*);
LS_HIDDEN uint64_t now_ns(void); /* CLOCK_MONOTONIC */
LS_HIDDEN struct chunk* fifo_at(uint64_t seq);
LS_HIDDEN int gate_bypassed(void);
LS_HIDDEN void drain_done(void);
/* The reply gate (shim.c): an input waits for the server's output on fd. */
LS_HIDDEN int reply_gate_pending(void);
LS_HIDDEN void reply_gate_sent(int fd, uint64_t end);
/* fd's output reached `end` */                           /* applies the daemon's completions */
LS_HIDDEN uint32_t kernel_interest(const struct conn* c); /* epoll events the kernel watches */
LS_HIDDEN void ingest(struct conn* c); /* kernel bytes into the inbox, submitted */
LS_HIDDEN struct head_run find_head_run(void);
LS_HIDDEN int ready(struct conn* c); /* the server may read c now (bytes or EOF) */
/* serial_inputs (shim_serial.c); mu held, except serial_init. serial_done:
 * the calling thread has finished the input it read, if it read one. */
LS_HIDDEN void serial_init(int flags); /* LOCKSTEP_SHIM_SERIAL: ls_serial_flag */
/* Without mu, from the send wrappers: the server's output on fd reached `end`. */
LS_HIDDEN void serial_sent(int fd, uint64_t end);
LS_HIDDEN int executing_other(const struct conn* c); /* not c's turn: another input runs */
LS_HIDDEN void serial_begin(struct conn* c);         /* this thread read an input of c */
LS_HIDDEN void serial_closed(const struct conn* c);  /* the server closed c */
LS_HIDDEN int chunk_finished(const struct chunk* h); /* shim.c: read (or dropped) whole */
LS_HIDDEN void serial_done(int my_epfd);             /* my_epfd: the set it waits in next, or -1 */
/* Around each wait of the server's on a condition variable (shim_clock.c,
 * shim_serial.c): a holder let go while it waits takes the turn back before
 * it returns (shim_serial.c, "Condition variables"). Not under mu. */
LS_HIDDEN void serial_cond_enter(pthread_cond_t* c);
LS_HIDDEN void serial_cond_leave(pthread_mutex_t* m);
/* A thread about to sleep in poll/select/read registers its own eventfd
 * (returned; -1 if none) with the connection it waits for (shim_serial.c,
 * "Threads waiting"); it takes its wake-up, leaves, and relays the daemon's
 * wake-up to the others when it was the one that read it. mu held, except
 * waiter_took_wake. */
LS_HIDDEN int waiter_enter(struct conn* c);
LS_HIDDEN void waiter_leave(void);
LS_HIDDEN void waiter_took_wake(void);
LS_HIDDEN void waiters_relay(void);
/* Per epoll set, the shim's own eventfd (fd + 1; 0: none), which
 * serial_done writes to wake just the thread waiting in that set. */
LS_HIDDEN extern int set_wake_fd[LS_MAX_FD];
/* How long one input may hold the next connection's back (shim_serial.c). */
#define LS_SERIAL_EXEC_NS 5000000000ull
/* How often (and how soon) the executing thread's state is looked at. */
#define LS_SERIAL_LOOK_NS 1000000ull
/* How long a holder asleep on anything but a condition variable (a latch,
 * a futex of the server's own) keeps the turn (shim_serial.c, holder_holds). */
#define LS_SERIAL_ASLEEP_ELSEWHERE_NS 100000000ull
/* 0: no thread holds an input (serial_inputs); 2: one does and the next
 * agreed input is c's (or, with c NULL, that of a connection in epoll set
 * epfd): the thread waiting for it looks again every LS_SERIAL_LOOK_NS, to
 * notice the holder asleep (shim_serial.c, executing_other); 1: one does, and
 * waiting threads look again every LS_SERIAL_IDLE_LOOK_MS (a wake-up lost
 * on the way costs that much, never a hang). mu held. */
#define LS_SERIAL_IDLE_LOOK_MS 5
LS_HIDDEN int serial_holding(const struct conn* c, int epfd);
LS_HIDDEN uint64_t readable(struct conn* c); /* agreed bytes the server may read now */
LS_HIDDEN int eof_ready(struct conn* c);     /* the server may read c's EOF now */
/* The tracked connection under fd, or NULL. */
LS_HIDDEN extern int forked_child; /* a process the server forked (shim.c) */
LS_HIDDEN void refuse_forked(const char* what) __attribute__((noreturn));
LS_HIDDEN void listen_check(int fd); /* before listen(): refused in a forked process */
static inline struct conn* tracked(int fd) {
  if (fd < 0 || fd >= LS_MAX_FD) return NULL;
  if (!active) {
    if (forked_child && by_fd[fd]) refuse_forked("used a client connection");
    return NULL;
  }
  return by_fd[fd];
}

/* shim_output.c */
/* The region is mapped at base: hash outputs if its geometry is sane and
 * LOCKSTEP_SHIM_OUTPUT_DIGESTS allows. */
LS_HIDDEN void out_init(char* base);
/* A connection becomes tracked under fd: give it an output slot and a fresh
 * stream. Called with mu held. */
LS_HIDDEN void out_open(int fd, uint32_t conn, int replay_slot);
/* The stream under fd ends (LS_OUT_SHUT or LS_OUT_CLOSED). */
LS_HIDDEN void out_end(int fd, uint32_t flag);
/* In a forked child: nothing is hashed any more. */
LS_HIDDEN void out_after_fork(void);
/* fd's output stream offset (bytes compared so far); UINT64_MAX when not hashed. */
LS_HIDDEN uint64_t out_offset(int fd);
/* The server read n (> 0) bytes of iov from the tracked connection fd. */
LS_HIDDEN void out_input(int fd, const struct iovec* iov, int iovcnt, size_t n);
/* A send on fd would block (EAGAIN): an EPOLLET server hears the next
 * EPOLLOUT edge (shim_wait.c). */
LS_HIDDEN void wait_send_blocked(int fd);

/* shim_stack.c: the server's stack at a send. */
/* Where a send wrapper was called from: its return address and where that
 * lies (the frame pointer's word above; stack_take checks it). Declared
 * first thing in each wrapper by SEND_SITE. */
struct send_site {
  void* const* ra_slot;
  void* ra;
};
#define SEND_SITE(name)                                                        \
  const struct send_site name = {(void* const*)__builtin_frame_address(0) + 1, \
                                 __builtin_return_address(0)}
struct send_stack {
  uint32_t depth;
  uint64_t chain; /* the cached chain it is (equal ids: equal stacks); 0: walked plainly */
  uintptr_t pc[LS_STACK_DEPTH];
};
/* Sets the walker up: stacks are taken from now on. */
LS_HIDDEN void stack_init(void);
/* The stack of the send whose wrapper was called from site, the shim's
 * frames left out. */
LS_HIDDEN void stack_take(struct send_stack* s, const struct send_site* site);

/* shim_inspect.c: connections accepted while this replica does not lead. */
/* 1: fd (accepted, from peer's port) is an inspector's, served; 0: refuse it. */
LS_HIDDEN int inspect_admit(int fd, int port, const char* peer);
/* 1 when fd is an inspection connection and this replica has led since: its
 * reads must return EOF. */
LS_HIDDEN int inspection_closed(int fd);
LS_HIDDEN void inspect_forget(int fd); /* fd is closed or reused */

/* shim_unchecked.c: replies left out of the hashed stream. */
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

/* shim_random.c */
/* fd -> 1 + the stream slot of a random device the server opened (with
 * LOCKSTEP_SHIM_RANDOM_SEED set); 0: not one. */
LS_HIDDEN extern _Atomic(uint8_t) rnd_fd_slot[LS_MAX_FD];
static inline int rnd_tracked(int fd) {
  return fd >= 0 && fd < LS_MAX_FD && atomic_load_explicit(&rnd_fd_slot[fd], memory_order_relaxed);
}
/* read/readv of a tracked fd: the real call, its bytes replaced by the
 * fd's deterministic stream. */
LS_HIDDEN ssize_t rnd_readv(int fd, const struct iovec* iov, int iovcnt);
/* The server closes fd: it is no random device of ours any more. */
LS_HIDDEN void rnd_forget_slow(int fd);
static inline void rnd_forget(int fd) {
  if (rnd_tracked(fd)) rnd_forget_slow(fd);
}

/* shim_clock.c */
/* LOCKSTEP_SHIM_SAME_CLOCK=1 in the process the daemon started (and not in
 * a forked child): the server's wall clock reads the stamps of its inputs. */
LS_HIDDEN extern int clk_on;
/* The server began to read an input stamped clock_ns (0: no stamp): its
 * wall clock reads that from now on, never less than before. mu held. */
LS_HIDDEN void clk_enter(uint64_t clock_ns);

#endif
