/* shim_output.c — the output side of the LD_PRELOAD shim: the wrappers of
 * what the server sends (write, send, sendto, sendmsg, sendmmsg, writev,
 * sendfile, shutdown) and, for the connections shim.c tracks, each
 * connection's stream hash, its window of recent bytes and the digest
 * records of the output ring (shim_abi.h, "Output"). shim.c tells it when a
 * connection starts and ends (out_open, out_end); the rest is here.
 *
 * Same rules as shim.c: no C++, errno preserved on every path, and here no
 * allocation at all.
 */
#define _GNU_SOURCE
#include "preload/shim_output.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "preload/shim_abi.h"
#include "preload/shim_clock.h"
#include "preload/shim_order.h"
#include "preload/shim_random.h"
#include "preload/shim_stack.h"
#include "preload/shim_state.h"
#include "preload/shim_unchecked.h"
#include "preload/stream_hash.h"

static ssize_t (*real_send)(int, const void*, size_t, int);
static ssize_t (*real_sendto)(int, const void*, size_t, int, const struct sockaddr*, socklen_t);
static ssize_t (*real_sendmsg)(int, const struct msghdr*, int);
static int (*real_sendmmsg)(int, struct mmsghdr*, unsigned int, int);
static ssize_t (*real_writev)(int, const struct iovec*, int);
static ssize_t (*real_sendfile)(int, int, off_t*, size_t);
static ssize_t (*real_sendfile64)(int, int, off64_t*, size_t);
static int (*real_shutdown)(int, int);

/* The output calls may run before our constructor did (another library's
 * constructor writing to stderr): they look their real call up themselves
 * (LS_REAL; real_write is shim_state.c's, which its log shares). */

/* Output hashing (see "output" below). The hashing state of a connection
 * lives in a static table indexed by its output slot, never freed, so that a
 * send racing with a close can never touch freed memory. */
struct out_state {
  _Atomic(uintptr_t) owner; /* pthread_self() of the thread hashing it; 0: nobody */
  _Atomic(int) lost;        /* some output went unhashed: its digests mean nothing */
  int fd;                   /* the connection's fd; -1: the slot is not in use */
  uint32_t conn;            /* its number (the records' `conn`) */
  uint16_t replay_slot;     /* or LS_OUT_NONE */
  uint64_t next_mark;       /* stream offset of the next mark record */
  struct ls_stream_hash h;  /* h.total is the stream offset */
  int named;                /* a record of this connection reached the ring */
  uint64_t pushed_ns;       /* when the last send's record was published (out_push_sent) */
  uint64_t kept_chain;      /* the call chain of the window's newest kept stack (stack_keep) */
  /* unchecked_greeting: nothing read from the connection yet, so what the
   * server sends is its greeting, left out of the stream. */
  _Atomic(int) greeting;
  int cut; /* the LS_OUT_CUT record is out (the leader's client went away) */
};
/* LOCKSTEP_SHIM_UNCHECKED_GREETING=1 (the profile's `unchecked_greeting`):
 * what a server sends on a connection before it has read anything from it
 * (MariaDB's handshake with its random challenge, a banner with the host's
 * name and time) differs between replicas by nature and is not compared;
 * it is not in the stream's offsets either, like an unchecked reply. */
static int greeting_unchecked;
static int out_on;        /* hashing outputs (LOCKSTEP_SHIM_OUTPUT_DIGESTS) */
static uint64_t out_cap;  /* output ring slots, a power of two */
static uint64_t out_mark; /* mark interval, a power of two, or 0 */
static struct ls_out_record* out_ring;
static struct ls_out_slot* out_win;      /* window headers */
static char* out_bytes;                  /* window bytes, LS_OUT_WINDOW per slot */
static struct ls_send_stack* out_stacks; /* LS_SEND_STACKS per slot */
/* The server's stack at each send (shim_stack.c), kept beside the window;
 * LOCKSTEP_SHIM_SEND_STACKS=0: not taken. */
static int out_stacks_on;
static _Atomic(uintptr_t) out_ring_owner; /* the output ring's producer lock */
static struct out_state out_st[LS_OUT_SLOTS];
static _Atomic(uint16_t) out_of_fd[LS_MAX_FD]; /* output slot + 1; 0: not hashed */
/* Free output slots, least recently freed first (a closed connection's
 * window stays readable as long as possible). Under mu. */
static uint16_t out_free[LS_OUT_SLOTS];
static uint32_t out_free_head, out_free_count;
/* ------------------------------------------------------------ output */

/* What the server sends on a tracked connection is one stream per
 * connection. After each output call the kernel accepted bytes of, the shim
 * feeds exactly those bytes (the call's return value: a partial write
 * counts what was taken, EAGAIN and errors nothing) to the connection's
 * stream hash, copies the last of them into its window, and publishes a
 * record (offset, digest) into the output ring (shim_abi.h, "Output").
 *
 * This path runs in the server's threads, maybe in a signal handler: it
 * takes neither `mu` nor anything a signal handler could wait on forever,
 * allocates nothing and keeps errno. A connection's state is held by one
 * thread at a time (owner = pthread_self(): a server sending on one
 * connection from two threads without a lock of its own waits here for the
 * other's hashing; a signal handler that sends on the connection its own
 * thread is hashing cannot, and its bytes go unhashed: LS_OUT_LOST). The
 * ring's producer lock is held only to copy one record; a thread that
 * cannot have it after a short spin drops its record (out_dropped_busy).
 * Both locks are taken while the send returns, after the kernel ordered the
 * bytes; a server that serializes its sends (as any must, or its output is
 * interleaved at random) serializes the hashing with them. */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

void out_init(char* base) {
  /* The region's geometry is the daemon's: hash only if it is sane. */
  uint64_t cap = hdr->out_slots, mark = hdr->out_mark_bytes;
  uint64_t end_bytes = hdr->win_bytes_offset + (uint64_t)LS_OUT_SLOTS * LS_OUT_WINDOW;
  int sane = cap && cap <= LS_OUT_RING_SLOTS && !(cap & (cap - 1)) && !(mark & (mark - 1)) &&
             hdr->out_offset + cap * sizeof(struct ls_out_record) <= hdr->size &&
             hdr->win_offset + (uint64_t)LS_OUT_SLOTS * sizeof(struct ls_out_slot) <= hdr->size &&
             end_bytes <= hdr->size;
  const char* env = getenv("LOCKSTEP_SHIM_OUTPUT_DIGESTS");
  if (!sane) shim_log("output ring geometry is not sane; outputs are not hashed");
  out_on = sane && !(env && strcmp(env, "0") == 0);
  const char* greeting_env = getenv("LOCKSTEP_SHIM_UNCHECKED_GREETING");
  greeting_unchecked = greeting_env && strcmp(greeting_env, "1") == 0;
  if (out_on) {
    out_cap = cap;
    out_mark = mark;
    out_ring = (struct ls_out_record*)(base + hdr->out_offset);
    out_win = (struct ls_out_slot*)(base + hdr->win_offset);
    out_bytes = base + hdr->win_bytes_offset;
    out_stacks = (struct ls_send_stack*)(base + hdr->stacks_offset);
    const char* stacks_env = getenv("LOCKSTEP_SHIM_SEND_STACKS");
    out_stacks_on = !(stacks_env && strcmp(stacks_env, "0") == 0) &&
                    hdr->stacks_offset + (uint64_t)LS_OUT_SLOTS * LS_SEND_STACKS *
                                             sizeof(struct ls_send_stack) <=
                        hdr->size;
    if (out_stacks_on) stack_init();
    for (uint32_t i = 0; i < LS_OUT_SLOTS; i++) {
      out_free[i] = (uint16_t)i;
      out_st[i].fd = -1;
    }
    out_free_head = 0;
    out_free_count = LS_OUT_SLOTS;
    /* An image exec'd in place of the one that attached first (same pid):
     * the old one's connections are not ours. */
    if (atomic_load(&hdr->shim_attached))
      for (uint32_t i = 0; i < LS_OUT_SLOTS; i++)
        if (atomic_load(&out_win[i].state) != LS_OUT_FREE)
          atomic_store(&out_win[i].state, LS_OUT_GONE);
  }
  if (out_on) unck_init();
  lease_init(out_on);
  atomic_store(&hdr->out_enabled, (uint32_t)out_on);
}

/* The output slot of fd, or -1 when its output is not hashed. */
static inline int out_slot_of(int fd) {
  if (!out_on || fd < 0 || fd >= LS_MAX_FD) return -1;
  return (int)atomic_load_explicit(&out_of_fd[fd], memory_order_acquire) - 1;
}

int out_slot(int fd) {
  return out_slot_of(fd);
}

/* Sends in progress per output slot: the kernel may have taken (and the
 * client read) bytes not hashed yet. A client that got a reply and sent its
 * next request at once may have it taken by the leader's shim before the
 * thread that sent the reply has counted it: out_offset waits for them. */
static _Atomic(uint32_t) out_sending[LS_OUT_SLOTS];

static inline int send_begin(int fd) {
  int slot = out_slot_of(fd);
  if (slot >= 0) atomic_fetch_add(&out_sending[slot], 1);
  return slot;
}
static inline void send_end(int slot) {
  if (slot >= 0) atomic_fetch_sub(&out_sending[slot], 1);
}

/* How long out_offset waits, by the clock, for the sends in progress on a
 * connection to be counted. It once waited 2000 sched_yield()s, about a
 * millisecond when the sender is queued on another core: a slapd pool thread
 * preempted longer than that on a loaded machine, between the kernel taking
 * its reply and counting it, left the leader's out_before of the client's
 * next request one reply short. The backups' reply gate then let that request
 * in while the previous one still executed, its reader entered its clock
 * stamp (same_clock) before the previous modify took its entryCSN, and the
 * backups' directories differed from the leader's with no divergence report
 * (entryCSN is in no reply). A send blocked in the kernel (a full socket
 * buffer; non-blocking sockets never block) costs at most this: its bytes
 * are not what the client answered. */
#define LS_SEND_COUNT_WAIT_NS 250000000ull

uint64_t out_offset(int fd) {
  int slot = out_slot_of(fd);
  if (slot < 0) return UINT64_MAX;
  for (int i = 0; i < 64 && atomic_load(&out_sending[slot]); i++) sched_yield();
  if (atomic_load(&out_sending[slot])) {
    int saved = errno;
    uint64_t until = now_ns() + LS_SEND_COUNT_WAIT_NS;
    struct timespec pause = {0, 50000}; /* 50 us: the sender needs a core */
    while (atomic_load(&out_sending[slot]) && now_ns() < until)
      syscall(SYS_nanosleep, &pause, NULL);
    errno = saved;
  }
  return atomic_load_explicit(&out_win[slot].end, memory_order_acquire);
}

/* Takes st for this thread. 0: it cannot be had (this thread holds it: a
 * signal handler interrupted the thread's own hashing; or its holder did not
 * let go within ~0.1 s). */
static int out_lock(struct out_state* st) {
  uintptr_t me = (uintptr_t)pthread_self(), cur = 0;
  if (atomic_compare_exchange_strong_explicit(&st->owner, &cur, me, memory_order_acquire,
                                              memory_order_relaxed))
    return 1;
  if (cur == me) return 0;
  for (uint32_t i = 0; i < 100000; i++) {
    if (i < 128)
      cpu_relax();
    else
      sched_yield(); /* the holder was descheduled in its few hundred ns */
    cur = 0;
    if (atomic_compare_exchange_weak_explicit(&st->owner, &cur, me, memory_order_acquire,
                                              memory_order_relaxed))
      return 1;
  }
  return 0;
}

static void out_unlock(struct out_state* st) {
  atomic_store_explicit(&st->owner, 0, memory_order_release);
}

/* Output that could not be hashed: the connection's digests mean nothing
 * from now on. */
static void out_lose(struct out_state* st) {
  atomic_store(&st->lost, 1);
  atomic_store(&out_win[st - out_st].lost, 1); /* a backup's samples stop too */
  atomic_fetch_add_explicit(&hdr->out_unhashed, 1, memory_order_relaxed);
}

/* Publishes st's digest (at its current offset) in a record. Called with st
 * held, so one connection's records enter the ring in stream order. patient:
 * an end of a stream, which waits for the ring's lock (see below). */
static void out_push(struct out_state* st, int slot, uint32_t flags, uint64_t digest, int patient) {
  struct ls_out_record r = {.offset = st->h.total,
                            .digest = digest,
                            .conn = st->conn,
                            .replay_slot = st->replay_slot,
                            .out_slot = (uint16_t)slot,
                            .flags = flags};
  if (out_mark && r.offset && !(r.offset & (out_mark - 1))) r.flags |= LS_OUT_MARK;
  if (atomic_load_explicit(&st->lost, memory_order_relaxed)) r.flags |= LS_OUT_LOST;
  uintptr_t me = (uintptr_t)pthread_self(), cur = 0;
  int got = atomic_compare_exchange_strong_explicit(&out_ring_owner, &cur, me, memory_order_acquire,
                                                    memory_order_relaxed);
  /* A record of a send may be dropped: the next one of the stream covers it.
   * The record of a stream's end (close, shutdown, cut) waits for the lock
   * as out_lock does, yielding to a holder that was descheduled mid-copy:
   * dropped together with the last send's, it left the leader's stream
   * ending short of the backups', a false divergence in length (gerbera's
   * 16 threads on 2 loaded cores, a few in every run). */
  for (uint32_t i = 0; !got && cur != me && i < (patient ? 100000u : 256u); i++) {
    if (i < 256)
      cpu_relax();
    else
      sched_yield();
    cur = 0;
    got = atomic_compare_exchange_weak_explicit(&out_ring_owner, &cur, me, memory_order_acquire,
                                                memory_order_relaxed);
  }
  if (!got) {
    atomic_fetch_add_explicit(&hdr->out_dropped_busy, 1, memory_order_relaxed);
    return;
  }
  uint64_t head = atomic_load_explicit(&hdr->out_head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&hdr->out_tail, memory_order_acquire);
  if (head - tail >= out_cap) { /* full (or a tail past the head): never wait */
    atomic_fetch_add_explicit(&hdr->out_dropped_full, 1, memory_order_relaxed);
  } else {
    out_ring[head & (out_cap - 1)] = r;
    atomic_store_explicit(&hdr->out_head, head + 1, memory_order_release);
    st->named = 1;
  }
  atomic_store_explicit(&out_ring_owner, 0, memory_order_release);
}

/* The record at the end of a send (shim_abi.h, "Output"): every one on the
 * leader; on a backup, whose daemon samples the window every
 * LS_OUT_SAMPLE_US, only the first of a connection, one on a mark, one
 * with lost output, and one after LS_OUT_SAMPLE_US without (a reply after
 * a quiet spell is checked at once). */
static void out_push_sent(struct out_state* st, int slot, uint64_t digest) {
  uint64_t total = st->h.total;
  int mark = out_mark && total && !(total & (out_mark - 1));
  if (atomic_load_explicit(&hdr->mode, memory_order_relaxed) == LS_MODE_LEADER) {
    st->pushed_ns = 0; /* were it to lead no more, its next send's record goes out */
    out_push(st, slot, 0, digest, 0);
    return;
  }
  /* A coarse clock (a few ms) is fine for a 20 ms spacing, and costs less. */
  uint64_t now = now_coarse_ns(); /* real: the server's may read the stamp */
  if (st->named && !mark && !atomic_load_explicit(&st->lost, memory_order_relaxed) &&
      now - st->pushed_ns < (uint64_t)LS_OUT_SAMPLE_US * 1000)
    return;
  st->pushed_ns = now;
  out_push(st, slot, 0, digest, 0);
}

/* The window's seqlock: odd while it changes. */
static void win_begin(struct ls_out_slot* w) {
  uint32_t seq = atomic_load_explicit(&w->seq, memory_order_relaxed);
  atomic_store_explicit(&w->seq, seq + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
}

static void win_end(struct ls_out_slot* w, uint64_t end, uint64_t digest) {
  atomic_store_explicit(&w->end, end, memory_order_relaxed);
  atomic_store_explicit(&w->end_digest, digest, memory_order_relaxed);
  uint32_t seq = atomic_load_explicit(&w->seq, memory_order_relaxed);
  atomic_store_explicit(&w->seq, seq + 1, memory_order_release);
}

/* Feeds n sent bytes to st's stream: the hash, the window (only the bytes
 * at stream offsets >= keep_from, the call's last LS_OUT_WINDOW), and a
 * mark record wherever the stream crosses a mark before the call's end
 * (`more`: more of the call's bytes follow these). */
static void out_feed(struct out_state* st, int slot, uint64_t keep_from, const char* p, size_t n,
                     int more) {
  char* win = out_bytes + (size_t)slot * LS_OUT_WINDOW;
  while (n > 0) {
    size_t take = n;
    if (out_mark && st->next_mark - st->h.total < take) take = st->next_mark - st->h.total;
    uint64_t off = st->h.total;
    if (off + take > keep_from) {
      uint64_t from = off > keep_from ? off : keep_from;
      size_t len = (size_t)(off + take - from), at = (size_t)(from % LS_OUT_WINDOW);
      size_t first = len < LS_OUT_WINDOW - at ? len : LS_OUT_WINDOW - at;
      memcpy(win + at, p + (from - off), first);
      memcpy(win, p + (from - off) + first, len - first);
    }
    ls_stream_hash_update(&st->h, p, take);
    p += take;
    n -= take;
    if (out_mark && st->h.total == st->next_mark) {
      st->next_mark += out_mark;
      if (n > 0 || more) /* the call's end has its own record */
        out_push(st, slot, 0, ls_stream_hash_digest(&st->h), 0);
    }
  }
}

/* out_feed of the checked runs of a call's bytes (shim_unchecked.c). */
struct feed_ctx {
  struct out_state* st;
  int slot;
  uint64_t keep_from, end; /* end: the stream offset after the call */
};
static void feed_checked(void* ctx, const char* p, size_t n) {
  struct feed_ctx* f = ctx;
  out_feed(f->st, f->slot, f->keep_from, p, n, f->st->h.total + n < f->end);
}

/* Keeps it as the slot's newest send, whose bytes took the stream offsets
 * [start, end). A send from the same call chain as the newest kept, right
 * after it, extends that one: one stack, and more of the window's recent
 * sends named by the LS_SEND_STACKS kept. Inside the window's seqlock. */
static void stack_keep(struct out_state* st, int slot, const struct send_stack* s, uint64_t start,
                       uint64_t end) {
  if (!out_stacks_on || s->depth == 0 || end == start) return;
  struct ls_out_slot* w = &out_win[slot];
  uint64_t k = atomic_load_explicit(&w->sends, memory_order_relaxed);
  struct ls_send_stack* kept = out_stacks + (size_t)slot * LS_SEND_STACKS;
  if (k && s->chain && s->chain == st->kept_chain && kept[(k - 1) % LS_SEND_STACKS].end == start) {
    kept[(k - 1) % LS_SEND_STACKS].end = end;
    return;
  }
  struct ls_send_stack* to = &kept[k % LS_SEND_STACKS];
  to->start = start;
  to->end = end;
  memcpy(to->pc, s->pc, s->depth * sizeof to->pc[0]);
  to->depth = s->depth;
  st->kept_chain = s->chain;
  atomic_store_explicit(&w->sends, k + 1, memory_order_relaxed);
}

/* A send's bytes are hashed: its stack, the window's new end and the
 * digest there (inside the window's seqlock), and its record. The digest is
 * computed once for both. */
static void sent_end(struct out_state* st, int slot, const struct send_stack* stack,
                     uint64_t start) {
  uint64_t digest = ls_stream_hash_digest(&st->h);
  stack_keep(st, slot, stack, start, st->h.total);
  win_end(&out_win[slot], st->h.total, digest);
  out_push_sent(st, slot, digest);
}

/* fd's output so far is its greeting (unchecked_greeting). Under out_lock. */
static int greeting(struct out_state* st, int fd) {
  return st->fd == fd && atomic_load_explicit(&st->greeting, memory_order_relaxed);
}

/* The kernel took the first n (> 0) bytes of iov on fd, output slot slot. */
static void out_sent(int fd, int slot, const struct send_site* site, const struct iovec* iov,
                     size_t iovcnt, size_t n) {
  struct out_state* st = &out_st[slot];
  struct send_stack stack;
  stack_take(&stack, site);
  if (!out_lock(st)) {
    out_lose(st);
    return;
  }
  if (greeting(st, fd)) { /* not compared, not counted */
    out_unlock(st);
    return;
  }
  if (st->fd == fd) { /* else it was closed meanwhile */
    /* With unchecked replies, only the checked bytes enter the stream:
     * count them first, so that the window copy starts at the right one. */
    uint64_t end = st->h.total + (unck_on ? unck_output(slot, iov, iovcnt, n, 1, NULL, NULL) : n);
    uint64_t keep_from = end > LS_OUT_WINDOW ? end - LS_OUT_WINDOW : 0;
    uint64_t start = st->h.total;
    win_begin(&out_win[slot]);
    if (unck_on) {
      struct feed_ctx f = {st, slot, keep_from, end};
      unck_output(slot, iov, iovcnt, n, 0, feed_checked, &f);
      n = 0;
    }
    for (size_t i = 0; i < iovcnt && n > 0; i++) {
      size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
      out_feed(st, slot, keep_from, (const char*)iov[i].iov_base, k, n > k);
      n -= k;
    }
    sent_end(st, slot, &stack, start);
  }
  uint64_t total = st->h.total;
  out_unlock(st);
  /* A backup's next input may have waited for this (the reply gate), and the
   * executing input for its reply (serial_until_reply). */
  hooks.output_reached(fd, total);
}

/* sendfile took n (> 0) bytes of in_fd from offset `from`: they are read
 * back to be hashed (a file changed in between would be hashed as it is
 * now; one that cannot be read back loses the connection's digests). */
static void out_sent_file(int fd, int slot, const struct send_site* site, int in_fd, off64_t from,
                          size_t n) {
  struct out_state* st = &out_st[slot];
  struct send_stack stack;
  stack_take(&stack, site);
  if (!out_lock(st)) {
    out_lose(st);
    return;
  }
  if (greeting(st, fd)) {
    out_unlock(st);
    return;
  }
  if (st->fd == fd) {
    uint64_t end = st->h.total + n;
    uint64_t keep_from = end > LS_OUT_WINDOW && !unck_on ? end - LS_OUT_WINDOW : 0;
    char buf[4096];
    uint64_t start = st->h.total;
    win_begin(&out_win[slot]);
    while (n > 0) {
      ssize_t k = pread64(in_fd, buf, n < sizeof buf ? n : sizeof buf, from);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        out_lose(st);
        break;
      }
      if (unck_on) { /* more bytes may follow: `end` is an upper bound here */
        struct feed_ctx f = {st, slot, keep_from, end};
        struct iovec v = {buf, (size_t)k};
        unck_output(slot, &v, 1, (size_t)k, 0, feed_checked, &f);
      } else {
        out_feed(st, slot, keep_from, buf, (size_t)k, n > (size_t)k);
      }
      from += k;
      n -= (size_t)k;
    }
    sent_end(st, slot, &stack, start);
  }
  uint64_t total = st->h.total;
  out_unlock(st);
  /* A backup's next input may have waited for this (the reply gate), and the
   * executing input for its reply (serial_until_reply). */
  hooks.output_reached(fd, total);
}

/* The stream of fd ends: shut down for writing (LS_OUT_SHUT), or closed
 * (LS_OUT_CLOSED: the slot is freed, its window kept until reused). */
void out_end(int fd, uint32_t flag) {
  int slot = out_slot_of(fd);
  if (slot < 0) return;
  struct out_state* st = &out_st[slot];
  if (flag == LS_OUT_CLOSED) atomic_store_explicit(&out_of_fd[fd], 0, memory_order_release);
  if (!out_lock(st)) return; /* a signal handler closing what its thread sends on: leaked */
  int freed = 0;
  if (st->fd == fd) {
    atomic_store(&out_win[slot].state, flag == LS_OUT_CLOSED ? LS_OUT_GONE : LS_OUT_ENDED);
    out_push(st, slot, flag, ls_stream_hash_digest(&st->h), 1);
    if (flag == LS_OUT_CLOSED) {
      st->fd = -1;
      freed = 1;
    }
  }
  out_unlock(st);
  if (freed) {
    pthread_mutex_lock(&mu);
    out_free[(out_free_head + out_free_count) % LS_OUT_SLOTS] = (uint16_t)slot;
    out_free_count++;
    mu_unlock();
  }
}

/* A connection becomes tracked under fd: give it an output slot and a fresh
 * stream. Called with mu held. */
void out_open(int fd, uint32_t conn, int replay_slot) {
  if (!out_on || fd < 0 || fd >= LS_MAX_FD) return;
  if (!out_free_count) {
    atomic_fetch_add_explicit(&hdr->out_unslotted, 1, memory_order_relaxed);
    return;
  }
  int slot = out_free[out_free_head];
  struct out_state* st = &out_st[slot];
  if (!out_lock(st)) { /* a late sender of its old connection holds it: wait no longer */
    atomic_fetch_add_explicit(&hdr->out_unslotted, 1, memory_order_relaxed);
    return;
  }
  out_free_head = (out_free_head + 1) % LS_OUT_SLOTS;
  out_free_count--;
  st->fd = fd;
  st->conn = conn;
  st->replay_slot = replay_slot >= 0 ? (uint16_t)replay_slot : LS_OUT_NONE;
  atomic_store(&st->lost, 0);
  st->named = 0;
  st->cut = 0;
  st->pushed_ns = 0;
  st->kept_chain = 0;
  st->next_mark = out_mark;
  atomic_store(&st->greeting, greeting_unchecked);
  ls_stream_hash_init(&st->h);
  if (unck_on) unck_open(slot);
  struct ls_out_slot* w = &out_win[slot];
  win_begin(w);
  atomic_store_explicit(&w->state, LS_OUT_LIVE, memory_order_relaxed);
  atomic_store_explicit(&w->conn, conn, memory_order_relaxed);
  atomic_store_explicit(&w->replay_slot, st->replay_slot, memory_order_relaxed);
  atomic_store_explicit(&w->sends, 0, memory_order_relaxed);
  atomic_store_explicit(&w->lost, 0, memory_order_relaxed);
  win_end(w, 0, ls_stream_hash_digest(&st->h));
  out_unlock(st);
  atomic_store_explicit(&out_of_fd[fd], (uint16_t)(slot + 1), memory_order_release);
}

void out_cut(int fd) {
  if (atomic_load_explicit(&hdr->mode, memory_order_relaxed) != LS_MODE_LEADER) return;
  int slot = out_slot_of(fd);
  if (slot < 0) return;
  struct out_state* st = &out_st[slot];
  int saved = errno;
  if (out_lock(st)) { /* else a signal handler's own thread holds it: no cut, a report at worst */
    if (st->fd == fd && !st->cut) {
      st->cut = 1;
      out_push(st, slot, LS_OUT_CUT, ls_stream_hash_digest(&st->h), 1);
    }
    out_unlock(st);
  }
  errno = saved;
}

static size_t iov_bytes(const struct iovec* iov, size_t iovcnt) {
  size_t n = 0;
  for (size_t i = 0; i < iovcnt; i++) n += iov[i].iov_len;
  return n;
}

/* 1 when fd is a client connection this replica accepted as leader (not a
 * daemon's replay connection, not an inspector's), whose send just failed
 * with errno because its client is gone. */
static int gone_client_send(int fd) {
  if (errno != EPIPE && errno != ECONNRESET) return 0;
  struct conn* c = tracked(fd);
  return c && c->replay_slot < 0;
}

/* A send on fd, output slot slot, failed: if its client is gone (EPIPE,
 * ECONNRESET), the stream is cut (on the leader; shim_abi.h LS_OUT_CUT)
 * where the kernel's last send left it: at most the output count the
 * client's CLOSE carries (out_before, taken when ingest reads the reset, at
 * or after this), past which the backups' servers may read EOF. The bytes
 * of the send that failed (iov, when the caller has them) then enter the
 * stream as if sent, as every later failed send's do: the server is told
 * they were (as_sent), and the backups' servers, whose replay connections
 * stay open, did send them. Keeps errno. */
static void send_failed(int fd, int slot, const struct send_site* site, const struct iovec* iov,
                        size_t iovcnt) {
  if (!gone_client_send(fd)) return;
  int saved = errno;
  out_cut(fd);
  size_t meant = iov_bytes(iov, iovcnt);
  if (meant > 0) out_sent(fd, slot, site, iov, iovcnt, meant);
  errno = saved;
}

/* What a send returns to the server: n, or, when it failed because the
 * client of a connection this replica accepted is gone and inputs agreed
 * before the connection's CLOSE may still be read there, all `meant` bytes,
 * as if sent. A server told of the failure drops the connection at once
 * (redis frees the client): such inputs would never run here, while every
 * backup's server runs them (its replay connection stays open), and a SET
 * would be on the backups and not here. Told the send succeeded, it reads
 * on, until its EOF is due (hooks.client_gone): then the failure goes
 * through, so that a server that only writes stops too. */
static ssize_t as_sent(int fd, ssize_t n, size_t meant) {
  if (n >= 0 || meant == 0 || !gone_client_send(fd) || !hooks.client_gone(fd)) return n;
  return (ssize_t)meant;
}

void out_input(int fd, const struct iovec* iov, int iovcnt, size_t n, size_t lease_n) {
  int slot = out_slot_of(fd);
  if (slot >= 0 && n > 0) atomic_store_explicit(&out_st[slot].greeting, 0, memory_order_relaxed);
  if (slot >= 0 && unck_on) unck_input(slot, iov, iovcnt, n, lease_n);
}

/* The kernel took n bytes of a send (n <= 0: none, or an error): hash
 * them if fd's output is (slot >= 0); returns n with errno as the call left it. */
/* ... and ends the send that send_begin counted. */
static ssize_t sent(int fd, int slot, const struct send_site* site, const struct iovec* iov,
                    size_t iovcnt, ssize_t n) {
  if (slot < 0) return n;
  if (n <= 0) {
    if (n < 0) send_failed(fd, slot, site, iov, iovcnt);
    send_end(slot);
    if (n < 0 && errno == EAGAIN) wait_send_blocked(fd);
    return n;
  }
  int saved = errno;
  out_sent(fd, slot, site, iov, iovcnt, (size_t)n);
  send_end(slot);
  errno = saved;
  return n;
}

/* sent() of a send of len bytes from buf (all of them meant, should it fail). */
static ssize_t sent_buf(int fd, int slot, const struct send_site* site, const void* buf, size_t len,
                        ssize_t n) {
  struct iovec v = {(void*)buf, n > 0 ? (size_t)n : len};
  return sent(fd, slot, site, &v, 1, n);
}

ssize_t write(int fd, const void* buf, size_t len) {
  SEND_SITE(site);
  LS_REAL(write);
  int slot = send_begin(fd);
  return as_sent(fd, sent_buf(fd, slot, &site, buf, len, real_write(fd, buf, len)), len);
}

ssize_t send(int fd, const void* buf, size_t len, int flags) {
  SEND_SITE(site);
  LS_REAL(send);
  int slot = send_begin(fd);
  return as_sent(fd, sent_buf(fd, slot, &site, buf, len, real_send(fd, buf, len, flags)), len);
}

ssize_t sendto(int fd, const void* buf, size_t len, int flags, const struct sockaddr* addr,
               socklen_t addrlen) {
  SEND_SITE(site);
  LS_REAL(sendto);
  int slot = send_begin(fd);
  ssize_t n = real_sendto(fd, buf, len, flags, addr, addrlen);
  return as_sent(fd, sent_buf(fd, slot, &site, buf, len, n), len);
}

ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
  SEND_SITE(site);
  LS_REAL(sendmsg);
  int slot = send_begin(fd);
  ssize_t n = real_sendmsg(fd, msg, flags);
  if (n <= 0) { /* msg may be bad (EFAULT), not when the client is gone */
    int gone = n < 0 && (errno == EPIPE || errno == ECONNRESET);
    n = sent(fd, slot, &site, gone ? msg->msg_iov : NULL, gone ? msg->msg_iovlen : 0, n);
    return gone ? as_sent(fd, n, iov_bytes(msg->msg_iov, msg->msg_iovlen)) : n;
  }
  return sent(fd, slot, &site, msg->msg_iov, msg->msg_iovlen, n);
}

int sendmmsg(int fd, struct mmsghdr* vec, unsigned int vlen, int flags) {
  SEND_SITE(site);
  LS_REAL(sendmmsg);
  int slot = send_begin(fd);
  int r = real_sendmmsg(fd, vec, vlen, flags);
  if (slot < 0 || r <= 0) {
    send_end(slot);
    if (r < 0 && vlen > 0 && gone_client_send(fd) && hooks.client_gone(fd)) {
      /* The client is gone: every message as if sent (as_sent). */
      for (unsigned int i = 0; i < vlen; i++) {
        vec[i].msg_len = (unsigned int)iov_bytes(vec[i].msg_hdr.msg_iov, vec[i].msg_hdr.msg_iovlen);
        if (slot >= 0)
          send_failed(fd, slot, &site, vec[i].msg_hdr.msg_iov, vec[i].msg_hdr.msg_iovlen);
      }
      return (int)vlen;
    }
    return r;
  }
  int saved = errno;
  for (int i = 0; i < r; i++)
    if (vec[i].msg_len > 0)
      out_sent(fd, slot, &site, vec[i].msg_hdr.msg_iov, vec[i].msg_hdr.msg_iovlen, vec[i].msg_len);
  send_end(slot);
  errno = saved;
  return r;
}

ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  SEND_SITE(site);
  LS_REAL(writev);
  int slot = send_begin(fd);
  ssize_t n = sent(fd, slot, &site, iov, (size_t)iovcnt, real_writev(fd, iov, iovcnt));
  return n < 0 && iovcnt > 0 ? as_sent(fd, n, iov_bytes(iov, (size_t)iovcnt)) : n;
}

/* Where sendfile reads from: *offset, or in_fd's file position (which the
 * call advances). -1 if unknown (the bytes then go unhashed). */
static off64_t sendfile_start(int slot, int in_fd, const off64_t* offset) {
  if (slot < 0) return -1;
  int saved = errno;
  off64_t from = offset ? *offset : lseek64(in_fd, 0, SEEK_CUR);
  errno = saved;
  return from;
}

static void sendfile_done(int fd, int slot, const struct send_site* site, int in_fd, off64_t from,
                          ssize_t n) {
  int saved = errno;
  if (from >= 0)
    out_sent_file(fd, slot, site, in_fd, from, (size_t)n);
  else
    out_lose(&out_st[slot]);
  errno = saved;
}

/* A sendfile whose client is gone (as_sent): the count it meant, bounded by
 * what in_fd holds from where it reads, is hashed as if sent, *offset (or
 * in_fd's position) advanced as a sendfile that took it would, and that
 * count returned; n when nothing can be had. */
static ssize_t sendfile_as_sent(int out_fd, int slot, const struct send_site* site, int in_fd,
                                off64_t* offset, size_t count, ssize_t n) {
  if (n >= 0 || count == 0 || !gone_client_send(out_fd) || !hooks.client_gone(out_fd)) return n;
  int saved = errno;
  struct stat st;
  off64_t at = offset ? *offset : lseek64(in_fd, 0, SEEK_CUR);
  if (at < 0 || fstat(in_fd, &st) != 0 || st.st_size <= at) {
    errno = saved;
    return n;
  }
  size_t meant = (uint64_t)(st.st_size - at) < count ? (size_t)(st.st_size - at) : count;
  if (slot >= 0) {
    out_cut(out_fd); /* first: as send_failed */
    sendfile_done(out_fd, slot, site, in_fd, at, (ssize_t)meant);
  }
  if (offset)
    *offset = at + (off64_t)meant;
  else
    lseek64(in_fd, (off64_t)meant, SEEK_CUR);
  errno = saved;
  return (ssize_t)meant;
}

ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  SEND_SITE(site);
  LS_REAL(sendfile);
  int slot = send_begin(out_fd);
  off64_t from = sendfile_start(slot, in_fd, offset ? &(off64_t){*offset} : NULL);
  ssize_t n = real_sendfile(out_fd, in_fd, offset, count);
  if (slot >= 0 && n > 0) sendfile_done(out_fd, slot, &site, in_fd, from, n);
  send_end(slot);
  if (n >= 0) return n;
  off64_t at = offset ? *offset : 0;
  n = sendfile_as_sent(out_fd, slot, &site, in_fd, offset ? &at : NULL, count, n);
  if (offset) *offset = (off_t)at;
  return n;
}

ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t count) {
  SEND_SITE(site);
  LS_REAL(sendfile64);
  int slot = send_begin(out_fd);
  off64_t from = sendfile_start(slot, in_fd, offset);
  ssize_t n = real_sendfile64(out_fd, in_fd, offset, count);
  if (slot >= 0 && n > 0) sendfile_done(out_fd, slot, &site, in_fd, from, n);
  send_end(slot);
  return n >= 0 ? n : sendfile_as_sent(out_fd, slot, &site, in_fd, offset, count, n);
}

int shutdown(int fd, int how) {
  LS_REAL(shutdown);
  int r = real_shutdown(fd, how);
  if (r == 0 && (how == SHUT_WR || how == SHUT_RDWR) && out_slot_of(fd) >= 0) {
    int saved = errno;
    out_end(fd, LS_OUT_SHUT);
    errno = saved;
  }
  return r;
}

void out_after_fork(void) {
  out_on = 0;
}
