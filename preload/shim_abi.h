/* shim_abi.h — the contract between the preload shim (inside the server) and
 * its replica daemon: a shared-memory region with two rings and a few words.
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
 *
 * Flow on the leader:
 *   shim  --submission ring-->  daemon   ACCEPT / DATA / CLOSE, each with a seq
 *   shim  <--completion ring--  daemon   COMMITTED seq / DROPPED seq / CLOSE conn
 * Submissions get seqs 1, 2, 3... in ring order; the daemon proposes them in
 * that order, so COMMITTED outcomes arrive in increasing seq order.
 *
 * Flow on a backup: the daemon replays committed inputs over real local TCP
 * connections. Before connecting, it marks the connection's local port in
 * `replay_port_bits` and claims a `replay` slot. It writes inputs as they
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
 * Sleeping: a side about to sleep announces it (server_sleepers /
 * daemon_sleeping), then re-checks its ring, then sleeps; the other side
 * writes the eventfd (and, for shim threads, FUTEX_WAKEs done_futex) only
 * when the announcement is set. Both sides use sequentially consistent
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
#define LS_SHIM_VERSION 6u

#define LS_SUB_RING_BYTES (16u << 20) /* submissions: records of up to max_chunk bytes */
#define LS_DONE_RING_SLOTS (1u << 16) /* completions: fixed 16-byte slots */
#define LS_MAX_REPLAY 4096u           /* replay connections open at once */
#define LS_ORDER_SLOTS (1u << 16)     /* replay order: fixed 16-byte slots */

/* Daemon -> shim: what a newly accepted client connection is. */
enum ls_mode {
  LS_MODE_PASSTHROUGH = 0, /* not the leader: new connections are inspection-only */
  LS_MODE_LEADER = 1       /* the leader: new connections' inputs are agreed first */
};

/* Submission record kinds (shim -> daemon). */
enum ls_sub_kind {
  LS_SUB_ACCEPT = 1, /* conn was accepted; payload: the peer address as text */
  LS_SUB_DATA = 2,   /* payload: bytes the client sent */
  LS_SUB_CLOSE = 3,  /* the client closed (EOF/reset) or the server closed the conn */
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
};

struct ls_done_record {
  uint64_t seq;  /* COMMITTED / DROPPED */
  uint32_t conn; /* CLOSE (and, informatively, the others) */
  uint32_t kind;
};

/* Replay order (daemon -> shim): the order in which the server may read
 * what the daemon wrote to its replay connections. */
enum ls_order_kind {
  LS_ORDER_DATA = 1, /* `len` more bytes on replay slot `slot` */
  LS_ORDER_EOF = 2   /* then EOF on it */
};

struct ls_order_record {
  uint32_t slot;
  uint32_t kind;
  uint64_t len;
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
  uint32_t max_chunk; /* largest DATA payload the daemon accepts */
  uint32_t pad0;

  /* Written by the daemon. */
  LS_ALIGN64 LS_ATOMIC(uint32_t) mode;
  LS_ATOMIC(uint32_t) daemon_sleeping;
  LS_ATOMIC(uint32_t) done_futex;     /* bumped after every batch of completions */
  LS_ATOMIC(uint32_t) replay_waiting; /* the daemon waits for the server to read a replay input */

  /* Written by the shim. */
  LS_ALIGN64 LS_ATOMIC(uint32_t) server_sleepers;
  LS_ATOMIC(uint32_t) shim_attached; /* the shim in the server mapped the region */

  /* Submission ring positions (monotonic byte counts). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) sub_head; /* shim: bytes published */
  LS_ALIGN64 LS_ATOMIC(uint64_t) sub_tail; /* daemon: bytes consumed */
  /* Completion ring positions (monotonic slot counts). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) done_head; /* daemon: slots published */
  LS_ALIGN64 LS_ATOMIC(uint64_t) done_tail; /* shim: slots consumed */
  /* Replay order ring positions (monotonic record counts). */
  LS_ALIGN64 LS_ATOMIC(uint64_t) order_head; /* daemon: records published */
  LS_ALIGN64 LS_ATOMIC(uint64_t) order_tail; /* shim: records taken */

  LS_ALIGN64 LS_ATOMIC(uint64_t) replay_port_bits[65536 / 64];
  struct ls_replay_slot replay[LS_MAX_REPLAY];
};

static inline uint64_t ls_shim_region_bytes(void) {
  uint64_t h = (sizeof(struct ls_shim_header) + 4095) & ~(uint64_t)4095;
  return h + LS_SUB_RING_BYTES + (uint64_t)LS_DONE_RING_SLOTS * sizeof(struct ls_done_record) +
         (uint64_t)LS_ORDER_SLOTS * sizeof(struct ls_order_record);
}

#endif
