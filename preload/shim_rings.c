/* shim_rings.c — the shim's input side facing the daemon (README.md,
 * "Layers"): submissions into the submission ring (ACCEPT, DATA, CLOSE),
 * the daemon's outcomes from the done ring, the replay order from the order
 * ring and its reply gate, the FIFO's push and pop, the client bytes taken
 * from the kernel (ingest), a restored replay connection put back in
 * place, and the epoll sets' ticks (shim_abi.h "Ticks": submitted on the
 * leader, ordered on backups, taken by the waits of shim_wait.c). Above shim_state.c, shim_clock.c,
 * shim_order.c and shim_output.c (out_offset: the output each input came after).
 *
 * Same rules as shim.c: errno preserved, no allocation except when a
 * connection's inbox must grow; mu held unless said otherwise. */
#define _GNU_SOURCE
#include "preload/shim_rings.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "preload/shim_abi.h"
#include "preload/shim_clock.h"
#include "preload/shim_order.h"
#include "preload/shim_output.h"
#include "preload/shim_state.h"
#include "preload/shim_unchecked.h"

#define LS_TICK_RETRY_NS 10000000ull /* a dropped tick is asked for again after 10 ms */

/* ------------------------------------------------------------ signalling */

/* The first waker takes the announcement (exchange, not load): the other
 * submissions of the same burst, before the daemon has run, would each
 * write the eventfd again (one write per input under load). The daemon
 * announces again before its next sleep and re-checks its rings after. */
void wake_daemon(void) {
  if (atomic_exchange(&hdr->daemon_sleeping, 0)) {
    uint64_t one = 1;
    (void)!write(wake_daemon_fd, &one, sizeof one);
  }
}

void futex_wait_done(uint32_t seen, uint64_t timeout_ns) {
  struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
  atomic_fetch_add(&hdr->futex_sleepers, 1);
  if (atomic_load(&hdr->done_futex) == seen)
    syscall(SYS_futex, (uint32_t*)&hdr->done_futex, FUTEX_WAIT, seen, &ts, NULL, 0);
  atomic_fetch_sub(&hdr->futex_sleepers, 1);
}

/* ------------------------------------------------------------ the FIFO */

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

/* A tick at the head for a set in which no thread has ever waited (one
 * whose fd the server closed and reused, or a set of another replica's
 * server) would hold every input behind it forever: after LS_TICK_ORPHAN_NS
 * at the head it is passed over, and said so. Not a set whose thread is
 * merely busy (a long command): that one takes it when it comes back. */
#define LS_TICK_ORPHAN_NS 2000000000ull
static int tick_orphaned(struct chunk* h) {
  if (h->kind != LS_SUB_TICK || h->state != CH_COMMITTED || h->c->tick_waited) return 0;
  if (head_seen_seq != h->seq || now_ns() - head_since_ns < LS_TICK_ORPHAN_NS) return 0;
  shim_log("a tick for epoll set %d was passed over: no thread of the server waits in it",
           h->c->fd);
  h->c->consumed = h->end;
  return 1;
}

void fifo_pop_finished(void) {
  if (clk_on) clock_from_reads();
  while (fifo_count) {
    struct chunk* h = &fifo[fifo_head_seq & (LS_FIFO_SLOTS - 1)];
    if (!chunk_finished(h) && !tick_orphaned(h)) break;
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
    /* An input dropped after this one was submitted (the daemon lost its
     * leadership before it proposed the later one) left a hole past this
     * one's end, not before it: what came before the hole and is agreed
     * now is read by this server as by the backups' (a leader that stopped
     * leading once skipped it, and the backups' servers had executed a SET
     * its own never saw). */
    if (ch->kind == LS_SUB_DATA && (!c->broken || ch->end <= c->broken_at))
      c->committed_end = ch->end;
    if (ch->kind == LS_SUB_CLOSE) c->close_committed = 1;
  } else {
    ch->state = CH_DROPPED;
    if (ch->kind == LS_SUB_TICK) {
      /* Not leading (yet), or the entry lost its place: the wait asks
       * again, a little later. */
      if (c->tick_seq == ch->seq) c->tick_seq = 0;
      c->tick_retry_ns = now_ns() + LS_TICK_RETRY_NS;
    } else if (ch->kind == LS_SUB_ACCEPT) {
      c->accept_state = ACCEPT_DROPPED;
    } else {
      if (!c->broken || ch->start < c->broken_at) c->broken_at = ch->start;
      c->broken = 1;
    }
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
 * burst of replayed requests in another order than the leader's.
 *
 * A server whose reply differs from the leader's (redis's SPOP without
 * same_random: "member-7" here, "member-1234" there) may never send as
 * much: the output comparison judges that, and the gate must not stop the
 * replica meanwhile, nor its repair's replay of the same inputs. So a gate
 * opens early once the server has answered the input before (its output on
 * the connection moved past where it stood when that input was handed
 * over) and then sent nothing there for LS_REPLY_GATE_QUIET_TICKS looks at
 * least LS_REPLY_GATE_TICK_NS apart (counted looks, not elapsed time: a
 * whole-VM pause mid-reply is one look, not a quiet spell). Without any
 * answer it waits LS_REPLY_GATE_MAX_NS (a reply that comes only from a
 * timer). Everything after a closed gate waits too. */
#define LS_REPLY_GATE_MAX_NS 5000000000ull
#define LS_REPLY_GATE_TICK_NS 5000000ull
#define LS_REPLY_GATE_QUIET_TICKS 20
static _Atomic(int) gate_fd = -1;    /* waiting for output on this fd; -2: it came; -1: none */
static _Atomic(uint64_t) gate_need;  /* ... up to this stream offset */
static _Atomic(uint64_t) gate_sends; /* sends on gate_fd since the gate closed */
static uint64_t gate_tail;           /* the order record that waits */
static uint64_t gate_since_ns;
static uint64_t gates_expired, gates_short;
static uint64_t gate_sends_seen; /* gate_sends at the last quiet look */
static uint64_t gate_look_ns;    /* when the last quiet look was counted */
static int gate_quiet_looks;     /* looks without a send since */

int reply_gate_pending(void) {
  return atomic_load(&gate_fd) != -1;
}

void reply_gate_sent(int fd, uint64_t end) {
  int want = fd;
  if (atomic_load(&gate_fd) != fd) return;
  atomic_fetch_add(&gate_sends, 1);
  if (end >= atomic_load(&gate_need) && atomic_compare_exchange_strong(&gate_fd, &want, -2))
    (void)eventfd_write(wake_server_fd, 1); /* whoever waits drains the order again */
}

/* 1 when the gated connection's server answered the input before and has
 * been quiet there since for enough looks (above). */
static int gate_reply_over(struct conn* c, uint64_t now) {
  if (out_offset(c->fd) <= c->out_at_order) return 0; /* no answer yet */
  uint64_t sends = atomic_load(&gate_sends);
  if (sends != gate_sends_seen) {
    gate_sends_seen = sends;
    gate_quiet_looks = 0;
    gate_look_ns = now;
    return 0;
  }
  if (now - gate_look_ns >= LS_REPLY_GATE_TICK_NS) {
    gate_look_ns = now;
    gate_quiet_looks++;
  }
  return gate_quiet_looks >= LS_REPLY_GATE_QUIET_TICKS;
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
    gate_look_ns = now;
    gate_quiet_looks = 0;
    atomic_store(&gate_sends, 0);
    gate_sends_seen = 0;
    atomic_store(&gate_need, need);
    atomic_store(&gate_fd, c->fd);
    if (out_offset(c->fd) < need) return 0; /* else its reply came meanwhile */
  } else if (now - gate_since_ns < LS_REPLY_GATE_MAX_NS) {
    if (atomic_load(&gate_fd) == -2) atomic_store(&gate_fd, c->fd); /* not enough yet */
    if (out_offset(c->fd) >= need) goto open;
    if (!gate_reply_over(c, now)) return 0;
    if (gates_short++ < 10)
      shim_log(
          "reply gate: connection %u's reply ended at byte %llu, short of the leader's %llu (a "
          "reply that differs: the output check judges it); its next input delivered",
          c->no, (unsigned long long)out_offset(c->fd), (unsigned long long)need);
  } else if (gates_expired++ < 10) {
    shim_log(
        "reply gate: connection %u waited %.1f s for the server's output to reach byte %llu "
        "(it stands at %llu) before its next input; delivered anyway",
        c->no, (double)(now - gate_since_ns) / 1e9, (unsigned long long)need,
        (unsigned long long)out_offset(c->fd));
  }
open:
  atomic_store(&gate_fd, -1);
  return 1;
}

/* A replay connection whose socket still carries the daemon's bytes (not
 * a dead restored one: awaiting_reattach, below). */
static int replay_live(const struct conn* c) {
  return c->replay_slot >= 0 && c->fd >= 0 && !c->detached && !c->eof_submitted &&
         !atomic_load(&hdr->replay[c->replay_slot].reattach);
}
/* Everything ordered on c so far has been taken from the kernel (no EOF
 * ordered: that one is taken when it comes). */
static int ordered_all_taken(const struct conn* c) {
  return c->received >= c->committed_end && !c->close_committed;
}
int replay_owes_nothing(const struct conn* c) {
  return replay_live(c) && ordered_all_taken(c);
}
int replay_bytes_due(const struct conn* c) {
  return replay_live(c) && !ordered_all_taken(c);
}

/* A replay connection hears from the kernel only while the order owes it
 * bytes it has not taken yet, or its EOF. The daemon sends an input's bytes
 * before it orders them, so they mostly sit in the socket by the time the
 * order names them: taken here, by whichever thread drains the order, the
 * thread whose turn it is wakes once, for its turn, instead of once for the
 * bytes and again for the turn (memcached -t 4: a backup's servers 0.39
 * wake-ups per SET for the bytes alone). Bytes still on their way turn the
 * kernel's input back on. In an epoll set the interest goes off only here,
 * so a set registered before any order record hears the kernel as before;
 * in poll, each wait asks replay_owes_nothing. mu held. */
static void replay_interest(struct conn* c) {
  if (c->fd < 0 || c->detached || c->eof_submitted) return;
  if (!ordered_all_taken(c)) ingest(c);
  if (c->epfd < 0) return; /* in poll, if anywhere: its own wait asks */
  int off = ordered_all_taken(c);
  if (off != c->replay_in_off) {
    c->replay_in_off = off;
    rearm_kernel(c);
  }
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
    if (r->kind == LS_ORDER_TICK) { /* a wait in set `slot` times out here */
      struct conn* t = tick_conn((int)r->slot);
      if (!t) continue; /* not a set this shim can have (or no memory): said once */
      t->received++;
      push_chunk(t, LS_SUB_TICK, CH_COMMITTED)->clock_ns = r->clock_ns;
      continue;
    }
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
    if (c->fd >= 0) c->out_at_order = out_offset(c->fd);
    if (r->kind == LS_ORDER_DATA) {
      c->committed_end += r->len;
      push_chunk(c, LS_SUB_DATA, CH_COMMITTED)->clock_ns = r->clock_ns;
    } else {
      c->close_committed = 1;
      push_chunk(c, LS_SUB_CLOSE, CH_COMMITTED);
    }
    replay_interest(c);
  }
  if (tail != first) {
    drained_gen++;
    atomic_store_explicit(&hdr->order_tail, tail, memory_order_release);
    if (atomic_load(&hdr->replay_waiting)) wake_daemon();
  }
}

/* Takes the daemon's outcomes and replay order. Called with mu held. */
void drain_done(void) {
  uint64_t head = atomic_load_explicit(&hdr->done_head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(&hdr->done_tail, memory_order_relaxed);
  if (tail < head) drained_gen++;
  for (; tail < head; tail++) apply_done(&done_ring[tail % hdr->done_slots]);
  atomic_store_explicit(&hdr->done_tail, tail, memory_order_release);
  drain_order();
  fifo_pop_finished();
}

/* ------------------------------------------------------------ submissions */

/* Hands one input to the daemon. Called with mu held; may drop it while the
 * ring or the FIFO is full (back-pressure: the server's thread waits). */
uint64_t submit(struct conn* c, uint8_t kind, const void* bytes, uint32_t len) {
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
      uint64_t sent =
          kind == LS_SUB_ACCEPT || kind == LS_SUB_TICK || c->fd < 0 ? 0 : out_offset(c->fd);
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
    mu_unlock();
    futex_wait_done(seen, 1000000);
    pthread_mutex_lock(&mu);
    drain_done();
  }
}

/* ------------------------------------------------------------ ticks */

struct conn* tick_conn(int epfd) {
  if (epfd < 0 || epfd >= LS_MAX_FD) {
    static int said;
    if (!said++) shim_log("a tick names epoll set %d, which cannot be one; passed over", epfd);
    return NULL;
  }
  if (!tick_conns[epfd]) {
    /* Once per set, not per wait: the "no allocation" rule's exception. */
    struct conn* t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->is_ticks = 1;
    t->fd = epfd;
    t->epfd = epfd; /* serial_inputs wakes the thread waiting in this set for it */
    t->replay_slot = -1;
    tick_conns[epfd] = t;
  }
  return tick_conns[epfd];
}

void submit_tick(int epfd, uint64_t min_clock_ns) {
  struct conn* t = tick_conn(epfd);
  if (!t || t->tick_seq || now_ns() < t->tick_retry_ns) return;
  struct ls_tick tick = {.waiter = (uint32_t)epfd, .pad = 0, .min_clock_ns = min_clock_ns};
  t->received++;
  t->tick_seq = submit(t, LS_SUB_TICK, &tick, sizeof tick);
}

int tick_pending(int epfd) {
  struct conn* t = epfd >= 0 && epfd < LS_MAX_FD ? tick_conns[epfd] : NULL;
  return t && t->tick_seq;
}

uint64_t tick_retry_at(int epfd) {
  struct conn* t = epfd >= 0 && epfd < LS_MAX_FD ? tick_conns[epfd] : NULL;
  return t ? t->tick_retry_ns : 0;
}

struct conn* take_tick(int epfd) {
  struct chunk* ch = tick_at_head(epfd);
  if (!ch) return NULL;
  struct conn* t = ch->c;
  t->consumed = ch->end;
  if (t->tick_seq == ch->seq) t->tick_seq = 0;
  clk_enter(ch->clock_ns); /* the server's clock moves to the tick's stamp */
  clk_release();           /* ... in this thread too */
  fifo_pop_finished();
  return t;
}

void forget_ticks(int epfd) {
  struct conn* t = epfd >= 0 && epfd < LS_MAX_FD ? tick_conns[epfd] : NULL;
  if (!t) return;
  tick_conns[epfd] = NULL;
  t->fd = -1; /* its chunks are done with; freed with the last */
  t->refs++;
  conn_unref(t);
  fifo_pop_finished();
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
void reattach(struct conn* c, int fresh) {
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

/* A lease read (issue 26, LOCKSTEP_SHIM_LEASE_READS_RESP or _MEMCACHED): the n bytes a
 * client just sent on c (the last n of its inbox) are served by this server
 * without the log when they are whole read-only requests (shim_unchecked.c
 * unck_lease_requests), everything c sent before has been read by the
 * server, and the daemon's lease holds now. While it holds no other replica
 * can lead, so no write can have been acknowledged that this server has not
 * executed: a client hears of its write from this server's reply (the
 * daemon publishes a lease only once a new leader's server has caught up
 * with what former leaders committed). So the server may read them at once,
 * outside the delivery order (unordered_end): epoll reports the connection
 * beside the order's head, and a wake-up takes the lease reads of many
 * connections together, as the unreplicated server's does. Only when the
 * list of such connections is full do they go into the delivery FIFO as
 * agreed, behind every input taken before them. Their replies are left out
 * of the hashed stream (the backups never see them). 1: served so; 0: they
 * go through the log. Called with mu held. */
static int lease_serve(struct conn* c, const char* p, size_t n) {
  uint64_t before = c->received - n;
  if (c->consumed != before || c->committed_end != before || c->chunked_end != before ||
      c->broken || fifo_count >= LS_FIFO_SLOTS)
    return 0;
  int requests = unck_lease_requests(out_slot(c->fd), p, n);
  if (requests == 0) return 0;
  uint64_t until = atomic_load_explicit(&hdr->lease_until_ns, memory_order_acquire);
  if (until == 0 || now_ns() >= until) {
    atomic_fetch_add_explicit(&hdr->lease_misses, (uint64_t)requests, memory_order_relaxed);
    return 0;
  }
  c->committed_end = c->received;
  c->lease_end = c->received;
  if (c->in_lease_ready || lease_ready_n < LS_LEASE_READY) {
    c->unordered_end = c->received;
    c->chunked_end = c->received; /* the next input's chunk starts past them */
    if (!c->in_lease_ready) {
      lease_ready_list[lease_ready_n++] = c;
      c->in_lease_ready = 1;
    }
  } else {
    push_chunk(c, LS_SUB_DATA, CH_COMMITTED);
  }
  atomic_fetch_add_explicit(&hdr->lease_reads, (uint64_t)requests, memory_order_relaxed);
  return 1;
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
      if (!lease_on || !lease_serve(c, tail, (size_t)n)) submit(c, LS_SUB_DATA, tail, (uint32_t)n);
      if ((uint64_t)n < max_chunk) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    /* EOF, or the connection failed: the client is gone. A reset: nothing
     * the server sends on it reaches anyone any more (a half-close, EOF,
     * still reads replies). */
    if (n < 0 && errno == ECONNRESET && !discard) out_cut(c->fd);
    c->eof_submitted = 1;
    stop_kernel_input(c);
    if (!discard) submit(c, LS_SUB_CLOSE, NULL, 0);
    return;
  }
}
