/* shim_abi.h — the contract between the preload shim (inside the server) and
 * its replica daemon: a shared-memory region with its rings, the replay
 * slots, the output windows and a few words.
 * Plain C11, included by both sides (guard/ compiles it as C++).
 *
 * The daemon creates the region (a memfd) and two eventfds, and starts the
 * server with them inherited; the environment tells the shim where they are:
 *   LOCKSTEP_SHIM_FD           the region's fd (mmap it, size in the header)
 *   LOCKSTEP_SHIM_WAKE_SERVER  eventfd the daemon writes to wake shim threads
 *   LOCKSTEP_SHIM_WAKE_DAEMON  eventfd the shim writes to wake the daemon
 *   LOCKSTEP_SHIM_PID          the pid the shim serves: any other process
 *                              (an exec'd child) passes everything through
 *   LOCKSTEP_SHIM_PORT         the server's client port: only connections
 *                              accepted on a socket bound to it are touched
 *   LOCKSTEP_SHIM_OUTPUT_DIGESTS  "0": the shim does not hash what the server
 *                              sends (see "Output" below); anything else or
 *                              unset: it does
 *   LOCKSTEP_SHIM_RANDOM_SEED  64 hex digits, the same on every replica: the
 *                              server's randomness comes from them
 *                              (shim_random.c); empty or unset: untouched
 *   LOCKSTEP_SHIM_SAME_CLOCK   "1": the server's wall clock reads the stamp
 *                              of the input it processes (the `clock_ns` of
 *                              the records below; shim_clock.c); anything
 *                              else or unset: the real clock
 *   LOCKSTEP_SHIM_TIMERS       "1" (with SAME_CLOCK): the server's timeouts
 *                              are log entries, see "Ticks" below; anything
 *                              else or unset: they are its own
 *   LOCKSTEP_SHIM_CLONED       "1" (with TIMERS): the server is the image
 *                              every replica's starts from (cloned_start):
 *                              its monotonic clocks read the stamp less the
 *                              wall clock's lead at its start-up
 *                              (shim_clock.c)
 *
 * Flow on the leader:
 *   shim  --submission ring-->  daemon   ACCEPT / DATA / CLOSE, each with a seq
 *   shim  <--completion ring--  daemon   COMMITTED seq / DROPPED seq / CLOSE conn
 * Submissions get seqs 1, 2, 3... in ring order; the daemon proposes them in
 * that order, so COMMITTED outcomes arrive in increasing seq order.
 *
 * Flow on a backup: the daemon replays committed inputs over real local TCP
 * connections. Before connecting, it binds the connection's local port (on
 * `replay_source`), marks it in `replay_port_bits` and claims a `replay`
 * slot; the shim takes a connection for that slot only from that address
 * and port, and only one per claim (a process elsewhere that picks the same
 * port number, or a second connection, is refused). It writes inputs as they
 * commit and publishes, in the order ring, the order in which the server may
 * read them (slot, length). The shim takes what the kernel has on those
 * connections into their inboxes and lets the server read them in exactly
 * that order, as it does with agreed inputs on the leader; it counts in the
 * slot what the server has read (and whether it read EOF).
 *
 * After a restore from a checkpoint: CRIU brings the server's replay sockets
 * back closed (their daemon ends are gone, and a TCP connection cannot be
 * resumed from one side). The daemon opens a fresh connection per open slot
 * from a new local port, writes that port into the slot and sets `reattach`
 * before the restored server runs; the shim accepts it and puts it in place
 * of the dead socket under the same fd number (dup2), re-registering the
 * server's epoll interest, so the server never sees the swap. Byte counts
 * (read_bytes, the shim's stream offsets) carry on from the checkpoint.
 *
 * Output (every replica): the shim hashes what the server sends on the
 * connections it tracks (client connections on the leader, replay
 * connections everywhere): write, send, sendto, sendmsg, sendmmsg, writev
 * and sendfile, counting only the bytes the kernel accepted (but see
 * LS_OUT_CUT). Each
 * connection's output is one stream of bytes, and its digest at stream
 * offset o is XXH64 (seed 0) of the bytes [0, o): it does not depend on how
 * the server chunked its writes. At the end of every output call that
 * advanced a stream, and where a stream crosses a multiple of
 * `out_mark_bytes` inside a call, the shim publishes an ls_out_record into
 * the output ring. The ring has a single producer as the daemon sees it
 * (one head, every record below it complete): the server's threads take
 * turns through a producer lock held only to copy one record, never across
 * a call, and a thread that cannot have it after a short spin (or a signal
 * handler that interrupted its own thread's copy) drops its record
 * (out_dropped_busy) rather than wait. Per-connection latest-record slots
 * would need no lock, but a slot keeps only the newest digest, and the
 * comparison needs the digest at given offsets. A full ring is never
 * waited for either: the record is dropped and counted (out_dropped_full).
 * A dropped record is a skipped check: the next record of the stream is
 * complete on its own. The shim never wakes the daemon for records: the
 * daemon reads them when it runs.
 * The leader's daemon needs the record of every send (a backup's point may
 * fall at the end of any of them); a backup's daemon only samples its
 * connections, every LS_OUT_SAMPLE_US, from the window's (end, end_digest).
 * So outside LS_MODE_LEADER the record at the end of a send is published
 * only when it names a new connection, falls on a mark, or comes after the
 * connection's last record by LS_OUT_SAMPLE_US or more (a reply after a
 * quiet spell is checked at once); records of marks, shutdown, close and
 * lost output always are. Under load that is one record in tens.
 * Each tracked connection also gets an output slot (while there are free
 * ones): its last LS_OUT_WINDOW bytes, the byte at stream offset o at
 * bytes[o % LS_OUT_WINDOW], under a seqlock. A closed connection's window
 * stays readable until its slot is reused (least recently freed first).
 * Shutdown for writing and close end the stream (LS_OUT_SHUT,
 * LS_OUT_CLOSED records). On the leader, a client that went away mid-reply
 * cuts the stream (LS_OUT_CUT). After a restore the streams carry on from the
 * checkpoint's offsets and digests (they live in the server's memory).
 *
 * Ticks (LOCKSTEP_SHIM_TIMERS, the profile's `timers_in_log`): a server
 * does work of its own when a wait times out (redis expires keys in its
 * 100 ms cron), at a different moment on each replica. So on the leader a
 * wait in an epoll set that holds tracked connections never times out by
 * itself: once its timeout has passed on the server's clock (the stamp) the
 * shim submits a TICK naming the set (its epoll fd: the same number on every
 * replica of a deterministic server), with the clock the wait timed out at
 * as the least stamp the entry may carry. When the TICK is agreed, the wait
 * (or the next one in that set) returns with nothing from the shim and the
 * server's clock moves to the entry's stamp. On a backup the daemon orders
 * it like an input (LS_ORDER_TICK, slot = the set's fd): the same wait
 * returns at the same point of the log, under the same stamp, and never
 * otherwise. While timers are on, CLOCK_MONOTONIC (and _COARSE, _RAW,
 * BOOTTIME) read the stamp as well: servers compute their timers with it.
 * A thread that such a wait returns for anything but its tick (a new
 * connection: accepts are not in the delivery order) reads its clocks
 * standing still until it takes a tick or an input (shim_clock.c, clk_hold):
 * a timer it looks at there never fires out of the log's order.
 *
 * Sleeping: a side about to sleep announces it (server_sleepers for a
 * server's thread that sleeps watching the eventfd, futex_sleepers for one
 * in a FUTEX_WAIT on done_futex, daemon_sleeping), then re-checks its ring,
 * then sleeps; the other side writes the eventfd, or FUTEX_WAKEs
 * done_futex, only when that announcement is set (a wake-up nobody waits
 * for is a system call per input for nothing). Both sides use sequentially consistent
 * atomics for the announce/check pairs.
 */
#ifndef LOCKSTEP_SHIM_ABI_H
#define LOCKSTEP_SHIM_ABI_H

#include <stdint.h>

#ifdef __cplusplus
#include <atomic>
#define LS_ATOMIC(t) std::atomic<t>
#define LS_ALIGN64 alignas(64)
#else
#include <stdalign.h>
#include <stdatomic.h>
#define LS_ATOMIC(t) _Atomic(t)
#define LS_ALIGN64 _Alignas(64)
#endif

#define LS_SHIM_MAGIC 0x4c53484du /* "LSHM" */
#define LS_SHIM_VERSION 19u

#define LS_SUB_RING_BYTES (16u << 20) /* submissions: records of up to max_chunk bytes */
#define LS_DONE_RING_SLOTS (1u << 16) /* completions: fixed 24-byte slots */
#define LS_MAX_REPLAY 4096u           /* replay connections open at once */
#define LS_ORDER_SLOTS (1u << 16)     /* replay order: fixed 24-byte slots */
#define LS_OUT_RING_SLOTS (1u << 16)  /* output records: fixed 32-byte slots (at most) */
#define LS_OUT_SLOTS 4096u            /* connections with an output window at once */
#define LS_OUT_WINDOW 4096u           /* recent output bytes kept per connection */
#define LS_OUT_MARK_BYTES (64u << 10) /* default mark interval (daemon may choose) */
#define LS_OUT_NONE 0xffffu           /* ls_out_record: no replay slot / no out slot */
#define LS_SEND_STACKS 8u             /* recent sends whose stacks a window keeps */
#define LS_STACK_DEPTH 14u            /* return addresses kept per send */
#define LS_OUT_SAMPLE_US 20000u       /* a backup samples its connections' outputs this often */
#define LS_MAX_INSPECT 64u            /* inspection connections claimed and not yet accepted */

/* Daemon -> shim: what a newly accepted client connection is. */
enum ls_mode {
  LS_MODE_PASSTHROUGH = 0, /* not the leader: only the daemon's inspections are served */
  LS_MODE_LEADER = 1,      /* the leader: new connections' inputs are agreed first */
  /* The daemon is stopping its server (SIGTERM): as PASSTHROUGH, and its
   * timers are its own again: no tick will come, and a server that acts on
   * SIGTERM from its timer (redis's cron) would otherwise never do so. */
  LS_MODE_STOPPING = 2
};

/* LOCKSTEP_SHIM_SERIAL (daemon -> shim, environment): serial_inputs and how
 * an input's turn ends (preload/shim_serial.c), a sum of these. */
enum ls_serial_flag {
  LS_SERIAL_ON = 1,          /* the profile's serial_inputs */
  LS_SERIAL_UNTIL_REPLY = 2, /* serial_until_reply */
  LS_SERIAL_SLEEP_KEEPS = 4  /* serial_sleep_keeps_turn */
};

/* Submission record kinds (shim -> daemon). */
enum ls_sub_kind {
  LS_SUB_ACCEPT = 1, /* conn was accepted; payload: the peer address as text */
  LS_SUB_DATA = 2,   /* payload: bytes the client sent */
  LS_SUB_CLOSE = 3,  /* the client closed (EOF/reset) or the server closed the conn */
  LS_SUB_TICK = 4,   /* a wait timed out ("Ticks"); conn 0, payload: struct ls_tick */
  LS_SUB_WRAP = 15   /* ring only: continue at offset 0 */
};

/* Completion kinds (daemon -> shim). */
enum ls_done_kind {
  LS_DONE_COMMITTED = 1, /* submission `seq` is agreed: deliver it */
  LS_DONE_DROPPED = 2,   /* submission `seq` will never be agreed: discard it */
  LS_DONE_CLOSE = 3      /* the log closed shim connection `conn`: EOF after its data */
};

struct ls_sub_record { /* followed by `len` payload bytes, then padding to 8 */
  uint32_t len;
  uint8_t kind;
  uint8_t pad[3];
  uint32_t conn; /* the shim's connection number (1, 2, ...; never reused) */
  uint32_t pad2;
  uint64_t seq;
  /* DATA, CLOSE: the connection's output stream offset (shim_output.c) when
   * the shim took this input from the kernel: the replies the server had
   * sent by then. A backup's server may read the input only once it has sent
   * as much (the reply gate, shim_rings.c drain_order). */
  uint64_t out_before;
};

/* The payload of a TICK submission. */
struct ls_tick {
  uint32_t waiter; /* the epoll set (its fd) whose wait timed out */
  uint32_t pad;
  /* The server's clock (ns, CLOCK_REALTIME) at which the wait's timeout
   * passed: the entry's stamp is at least this, so that every replica's
   * server finds the timer due when the tick fires. */
  uint64_t min_clock_ns;
};

struct ls_done_record {
  uint64_t seq;  /* COMMITTED / DROPPED */
  uint32_t conn; /* CLOSE (and, informatively, the others) */
  uint32_t kind;
  /* COMMITTED: the leader's wall clock (CLOCK_REALTIME, ns) stamped on the
   * input's log entry; the server's clock while it processes the input
   * (shim_clock.c). 0: none. */
  uint64_t clock_ns;
};

/* Replay order (daemon -> shim): the order in which the server may read
 * what the daemon wrote to its replay connections. */
enum ls_order_kind {
  LS_ORDER_DATA = 1, /* `len` more bytes on replay slot `slot` */
  LS_ORDER_EOF = 2,  /* then EOF on it */
  LS_ORDER_TICK = 3  /* a wait in epoll set `slot` (its fd) times out ("Ticks") */
};

struct ls_order_record {
  uint32_t slot; /* TICK: the epoll set's fd */
  uint32_t kind;
  uint64_t len;
  uint64_t clock_ns;   /* DATA, TICK: the entry's wall-clock stamp, as ls_done_record's */
  uint64_t out_before; /* the entry's out_before (ls_sub_record): the reply gate */
};

/* Output record flags (shim -> daemon). */
enum ls_out_flag {
  /* `offset` is a positive multiple of out_mark_bytes: every replica has a
   * record there (unless dropped), however its server chunked the stream. */
  LS_OUT_MARK = 1,
  LS_OUT_SHUT = 2,   /* the server shut the connection down for writing: the stream ends */
  LS_OUT_CLOSED = 4, /* the server closed the connection: the stream ends, the slot is freed */
  /* Some output of this connection could not be hashed (a signal handler
   * sent on it while the interrupted thread was hashing it, or a sendfile
   * source could not be read back): this digest and every later one of the
   * connection mean nothing. Skip them. */
  LS_OUT_LOST = 8,
  /* The leader's client is gone (a send failed with EPIPE or ECONNRESET, or
   * the shim took a reset from the kernel): nothing the server sends on the
   * connection from here on reaches anyone. Once per connection, on the
   * leader only, at the stream's offset then. The bytes of every send that
   * failed so (write, send, sendto, sendmsg, sendmmsg, writev, sendfile)
   * are in the stream, and the server is told they were sent: what it meant
   * to send, which the backups' servers did; it reads on, up to EOF after
   * what was agreed before the connection's CLOSE (shim_output.c as_sent).
   * A backup's stream may go on past where the leader's stops (its server's
   * sends succeed: the daemon reads them); those bytes are not compared,
   * the ones before still are. */
  LS_OUT_CUT = 16
};

/* One digest of one connection's output stream. */
struct ls_out_record {
  uint64_t offset;      /* stream offset: the digest covers the bytes [0, offset) */
  uint64_t digest;      /* XXH64, seed 0, of those bytes */
  uint32_t conn;        /* the shim's connection number (the leader's ACCEPT `conn`) */
  uint16_t replay_slot; /* the replay slot of a replay connection; LS_OUT_NONE: a client's */
  uint16_t out_slot;    /* the connection's output window; LS_OUT_NONE: it has none */
  uint32_t flags;       /* ls_out_flag bits */
  uint32_t pad;
};

/* An output window's header (the bytes are in a separate array, see
 * win_bytes_offset). Written by the shim under a seqlock: `seq` is odd while
 * it writes; read seq, then the rest, then seq again, and retry if it moved. */
enum ls_out_state { LS_OUT_FREE = 0, LS_OUT_LIVE = 1, LS_OUT_ENDED = 2, LS_OUT_GONE = 3 };
struct ls_out_slot {
  LS_ATOMIC(uint32_t) seq;
  LS_ATOMIC(uint32_t) state;       /* ls_out_state: ENDED after shutdown, GONE after close */
  LS_ATOMIC(uint32_t) conn;        /* the shim's connection number */
  LS_ATOMIC(uint32_t) replay_slot; /* or LS_OUT_NONE */
  LS_ATOMIC(uint64_t) end;         /* stream offset just past the newest byte */
  LS_ATOMIC(uint64_t) sends;       /* sends recorded in the window's stacks, ever */
  LS_ATOMIC(uint64_t) end_digest;  /* the stream's digest at `end` (a backup's samples) */
  LS_ATOMIC(uint32_t) lost;        /* LS_OUT_LOST: the digests mean nothing any more */
  uint32_t pad32;
  uint64_t pad[2];
};

/* The server's stack at one send on a connection (its return addresses,
 * innermost first, the shim's own frames left out), and the stream offsets
 * its compared bytes took. Each output slot keeps the last LS_SEND_STACKS,
 * send k at [k % LS_SEND_STACKS], under the window's seqlock: a divergence
 * report names the server's functions that sent the first differing byte
 * (guard/server/symbolize.h). */
struct ls_send_stack {
  uint64_t start, end; /* [start, end): stream offsets of the send's bytes */
  uint32_t depth;      /* valid entries of pc */
  uint32_t pad;
  uint64_t pc[LS_STACK_DEPTH];
};

struct ls_replay_slot {
  LS_ATOMIC(uint32_t) port;       /* local port of the daemon's end; 0: free */
  LS_ATOMIC(uint32_t) eof_read;   /* the server read EOF on it */
  LS_ATOMIC(uint64_t) read_bytes; /* bytes the server has read from it */
  /* Set by the daemon after a restore (checkpoint/): the server's socket for
   * this slot is a dead copy, and the connection from `port` takes its place
   * under the same fd number. The shim clears it once done. */
  LS_ATOMIC(uint32_t) reattach;
  /* Set by the shim once the server accepted the connection from `port`
   * (or, after a restore, once the fresh one took the dead one's place);
   * cleared by the daemon when it claims the slot. Until then the daemon's
   * end is connected while the server has not seen it: not at rest. */
  LS_ATOMIC(uint32_t) accepted;
  /* The shim's number of the connection (the `conn` of its output records),
   * set before `accepted`. */
  LS_ATOMIC(uint32_t) conn;
  /* Which use of the slot this is: a number the daemon draws anew (never 0,
   * from a random start) each time it claims or reattaches the slot, set
   * before `port`. The shim remembers the claim whose connection its server
   * closed, to drop that connection's leftover order records: a port cannot
   * tell, since the next claim may get the same port from the kernel. */
  LS_ATOMIC(uint32_t) claim;
};

/* An inspection connection the daemon is about to open to its own server
 * (`lockstep inspect`, guard/server/inspection.h), the only connection a
 * replica that does not lead serves besides its replay connections: the
 * daemon binds a local
 * port on `inspect_source` (never with SO_REUSEADDR or SO_REUSEPORT, so no
 * other socket can hold that address and port while its socket does),
 * writes the port here, and connects. While this replica does not lead, the
 * shim serves a connection its server accepts only if it comes from
 * inspect_source and a port of a slot whose `accepted` it can turn from 0
 * to 1: one connection per claim. Once the inspection ends the daemon
 * clears `port` before its socket lets go of the address and port, so a
 * claim the shim never took (this replica led then: the connection was a
 * client's through the log; or the connect failed) cannot serve whoever
 * binds that port later. Slots are claimed round-robin. */
struct ls_inspect_slot {
  LS_ATOMIC(uint32_t) port;     /* the daemon's bound local port; 0: none */
  LS_ATOMIC(uint32_t) accepted; /* the shim took the connection from `port` */
};

struct ls_shim_header {
  uint32_t magic;
  uint32_t version;
  uint64_t size;       /* bytes in the whole mapping */
  uint64_t sub_offset; /* submission ring: offset from the header, bytes */
  uint64_t sub_bytes;
  uint64_t done_offset; /* completion ring: offset, slot count */
  uint64_t done_slots;
  uint64_t order_offset; /* replay order ring: offset, slot count */
  uint64_t order_slots;
  uint32_t max_chunk;      /* largest DATA payload the daemon accepts */
  uint32_t out_mark_bytes; /* mark interval of output records: a power of two, or 0 (none) */
  uint64_t out_offset;     /* output ring: offset, slot count (a power of two) */
  uint64_t out_slots;
  uint64_t win_offset;       /* output windows: LS_OUT_SLOTS ls_out_slot headers */
  uint64_t win_bytes_offset; /* and LS_OUT_SLOTS * LS_OUT_WINDOW bytes */
  uint64_t stacks_offset;    /* and LS_OUT_SLOTS * LS_SEND_STACKS ls_send_stack */

  /* Written by the daemon. */
  LS_ALIGN64 LS_ATOMIC(uint32_t) mode;
  LS_ATOMIC(uint32_t) daemon_sleeping;
  LS_ATOMIC(uint32_t) done_futex;     /* bumped after every batch of completions */
  LS_ATOMIC(uint32_t) replay_waiting; /* the daemon waits for the server to read a replay input */
  /* The IPv4 address (network order) the daemon's replay connections come
   * from, each from a port it has bound before marking it in
   * replay_port_bits: the shim admits a replay connection only from there,
   * once per claim of its slot. 0: none yet (none admitted). */
  LS_ATOMIC(uint32_t) replay_source;
  /* The IPv4 address (network order) of the daemon's inspection
   * connections (ls_inspect_slot). 0: none yet. */
  LS_ATOMIC(uint32_t) inspect_source;
  /* Lease reads (LOCKSTEP_SHIM_LEASE_READS_RESP): until this CLOCK_MONOTONIC
   * time no other replica can lead (consensus/core.h LeaseUntil), so a
   * read-only request may be served by this server without the log. 0: no
   * lease (not leading, not serving yet, no lease configured). Written by
   * the daemon before it sends anything after a change that ends it (a
   * hand-over's kTakeOver, a promise to another ballot). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) lease_until_ns;

  /* Written by the shim. */
  LS_ALIGN64 LS_ATOMIC(uint32_t) server_sleepers;
  LS_ATOMIC(uint32_t) shim_attached; /* the shim in the server mapped the region */
  LS_ATOMIC(uint32_t) out_enabled;   /* the shim hashes outputs (LOCKSTEP_SHIM_OUTPUT_DIGESTS) */
  /* The pid of a process the server forked that went to serve a client
   * (accept on the client port, or a read or wait on a connection): not
   * replicated, so refused (shim_state.c, refuse_forked); the daemon stops. */
  LS_ATOMIC(uint32_t) forked_served;
  LS_ATOMIC(uint32_t) futex_sleepers; /* threads in FUTEX_WAIT on done_futex */

  /* Submission ring positions (monotonic byte counts). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) sub_head; /* shim: bytes published */
  LS_ALIGN64 LS_ATOMIC(uint64_t) sub_tail; /* daemon: bytes consumed */
  /* Completion ring positions (monotonic slot counts). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) done_head; /* daemon: slots published */
  LS_ALIGN64 LS_ATOMIC(uint64_t) done_tail; /* shim: slots consumed */
  /* Replay order ring positions (monotonic record counts). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) order_head; /* daemon: records published */
  LS_ALIGN64 LS_ATOMIC(uint64_t) order_tail; /* shim: records taken */
  /* Output ring positions (monotonic record counts). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) out_head; /* shim: records published */
  LS_ALIGN64 LS_ATOMIC(uint64_t) out_tail; /* daemon: records consumed */
  /* Output counters (shim; monotonic). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) out_dropped_full; /* records dropped: the ring was full */
  LS_ATOMIC(uint64_t) out_dropped_busy;            /* records dropped: producer lock busy */
  LS_ATOMIC(uint64_t) out_unhashed;  /* output calls whose bytes could not be hashed */
  LS_ATOMIC(uint64_t) out_unslotted; /* tracked connections that got no output slot */
  /* Lease reads (shim; monotonic): requests served under the lease, and the
   * read-only ones that went through the log for want of one. */
  LS_ALIGN64 LS_ATOMIC(uint64_t) lease_reads;
  LS_ATOMIC(uint64_t) lease_misses;

  LS_ALIGN64 LS_ATOMIC(uint64_t) replay_port_bits[65536 / 64];
  struct ls_replay_slot replay[LS_MAX_REPLAY];
  struct ls_inspect_slot inspect[LS_MAX_INSPECT];
};

static inline uint64_t ls_shim_region_bytes(void) {
  uint64_t h = (sizeof(struct ls_shim_header) + 4095) & ~(uint64_t)4095;
  return h + LS_SUB_RING_BYTES + (uint64_t)LS_DONE_RING_SLOTS * sizeof(struct ls_done_record) +
         (uint64_t)LS_ORDER_SLOTS * sizeof(struct ls_order_record) +
         (uint64_t)LS_OUT_RING_SLOTS * sizeof(struct ls_out_record) +
         (uint64_t)LS_OUT_SLOTS * sizeof(struct ls_out_slot) +
         (uint64_t)LS_OUT_SLOTS * LS_OUT_WINDOW +
         (uint64_t)LS_OUT_SLOTS * LS_SEND_STACKS * sizeof(struct ls_send_stack);
}

#endif
