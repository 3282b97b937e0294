/* shim_unchecked.c — leaves the replies to an app profile's unchecked
 * commands out of the output stream the shim hashes (shim_output.c), so
 * that what differs between replicas by nature (redis INFO, CLIENT LIST:
 * pids, ports, uptimes, memory) never counts as a divergence, while
 * everything else on the same connection is still compared byte for byte.
 *
 * The daemon sets LOCKSTEP_SHIM_UNCHECKED_RESP to the profile's list
 * ("INFO, CLIENT LIST"); without it nothing is left out. The scanning is
 * resp_scan.h's; here is its state per output slot and the queue from the
 * thread that reads a connection to the one that sends on it.
 *
 * Lease reads name their commands in one protocol: redis's (RESP, the
 * scanning above) or memcached's text protocol (LOCKSTEP_SHIM_LEASE_READS_
 * MEMCACHED, mc_scan.h, with state and queue of its own per slot); a
 * memcached server has no unchecked commands, only its lease reads' replies
 * are left out.
 *
 * Same rules as the rest of the shim: no allocation (the state is a static
 * table indexed by output slot, never freed), errno untouched. */
#define _GNU_SOURCE
#include "preload/shim_unchecked.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "preload/mc_scan.h"
#include "preload/resp_scan.h"
#include "preload/shim_state.h"

int unck_on;
static struct resp_list unck_list;
/* The lease list is memcached's: its scanners, not RESP's, run. */
static int mc_on;
static struct mc_list mc_lease_list;

/* One connection's scanners and queue. `in` is the reader's (under mu);
 * `out` the sender's (under the slot's output lock). The queue's entries
 * are written by the reader before it publishes tail, and read by the
 * sender after it loads tail. */
struct unck_conn {
  struct resp_in in;
  struct resp_out out;
  _Atomic(uint64_t) tail;
  _Atomic(uint64_t) head; /* the sender's out.head, published for the reader */
  struct resp_queue queue;
  /* memcached's (mc_on), the same roles; tail and head as above */
  struct mc_in mc_in;
  struct mc_out mc_out;
  struct mc_queue mc_queue;
};
static struct unck_conn unck_st[LS_OUT_SLOTS];

void unck_init(void) {
  const char* list = getenv("LOCKSTEP_SHIM_UNCHECKED_RESP");
  if (!list || !*list) return;
  const char* mc = getenv("LOCKSTEP_SHIM_LEASE_READS_MEMCACHED");
  if (mc && *mc) {
    shim_log("LOCKSTEP_SHIM_UNCHECKED_RESP names redis commands on a memcached server: ignored");
    return;
  }
  if (resp_list_parse(&unck_list, list) != 0) {
    shim_log("LOCKSTEP_SHIM_UNCHECKED_RESP is not a list of commands: every reply is checked");
    return;
  }
  unck_on = 1;
}

void unck_open(int slot) {
  struct unck_conn* u = &unck_st[slot];
  memset(&u->in, 0, sizeof u->in);
  memset(&u->out, 0, sizeof u->out);
  if (mc_on) {
    memset(&u->mc_in, 0, sizeof u->mc_in);
    memset(&u->mc_out, 0, sizeof u->mc_out);
  }
  atomic_store(&u->tail, 0);
  atomic_store(&u->head, 0);
}

static int unck_push(void* ctx, uint64_t number) {
  struct unck_conn* u = ctx;
  uint64_t tail = atomic_load_explicit(&u->tail, memory_order_relaxed);
  if (tail - atomic_load_explicit(&u->head, memory_order_acquire) >= RESP_QUEUE) return 0;
  u->queue.at[tail % RESP_QUEUE] = number;
  atomic_store_explicit(&u->tail, tail + 1, memory_order_release);
  return 1;
}

static int unck_push_mc(void* ctx, uint64_t number) {
  struct unck_conn* u = ctx;
  uint64_t tail = atomic_load_explicit(&u->tail, memory_order_relaxed);
  if (tail - atomic_load_explicit(&u->head, memory_order_acquire) >= MC_QUEUE) return 0;
  u->mc_queue.at[tail % MC_QUEUE] = number;
  atomic_store_explicit(&u->tail, tail + 1, memory_order_release);
  return 1;
}

void unck_input(int slot, const struct iovec* iov, int iovcnt, size_t n, size_t lease_n) {
  struct unck_conn* u = &unck_st[slot];
  if (mc_on) {
    for (int i = 0; i < iovcnt && n > 0; i++) {
      const unsigned char* p = iov[i].iov_base;
      size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
      size_t l = k < lease_n ? k : lease_n; /* a lease read's: their replies left out */
      n -= k;
      lease_n -= l;
      mc_scan_requests(1, &u->mc_in, p, l, unck_push_mc, u);
      mc_scan_requests(0, &u->mc_in, p + l, k - l, unck_push_mc, u);
    }
    return;
  }
  for (int i = 0; i < iovcnt && n > 0; i++) {
    const unsigned char* p = iov[i].iov_base;
    size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
    n -= k;
    if (lease_n > 0) { /* whole requests (unck_lease_requests): every reply left out */
      size_t l = k < lease_n ? k : lease_n;
      resp_scan_requests(NULL, &u->in, p, l, unck_push, u);
      lease_n -= l;
      p += l;
      k -= l;
    }
    resp_scan_requests(&unck_list, &u->in, p, k, unck_push, u);
  }
}

/* ------------------------------------------------------------ lease reads */

int lease_on;
static struct resp_list lease_list;

void lease_init(int hashed) {
  const char* mc = getenv("LOCKSTEP_SHIM_LEASE_READS_MEMCACHED");
  if (mc && *mc) {
    if (mc_list_parse(&mc_lease_list, mc) != 0 || !mc_lease_list.cmds) {
      shim_log(
          "LOCKSTEP_SHIM_LEASE_READS_MEMCACHED is not a list of get, gets, mg: every read goes "
          "through the log");
      return;
    }
    mc_on = 1;
    lease_on = 1;
    if (hashed) unck_on = 1; /* its replies must be found to be left out */
    return;
  }
  const char* list = getenv("LOCKSTEP_SHIM_LEASE_READS_RESP");
  if (!list || !*list) return;
  if (resp_list_parse(&lease_list, list) != 0) {
    shim_log(
        "LOCKSTEP_SHIM_LEASE_READS_RESP is not a list of commands: every read goes "
        "through the log");
    return;
  }
  lease_on = 1;
  if (hashed) unck_on = 1; /* its replies must be found to be left out */
}

/* unck_lease_requests for memcached's text protocol. */
static int mc_lease_requests_at(int slot, const char* p, size_t n) {
  const struct unck_conn* u = slot >= 0 && unck_on ? &unck_st[slot] : NULL;
  /* mid-request, scanning ended, or the state probe's connection */
  if (u && (u->mc_in.state != MC_IN_START || u->mc_in.no_lease)) return 0;
  int requests = mc_lease_requests(&mc_lease_list, (const unsigned char*)p, n);
  if (requests > 0 && u) {
    uint64_t queued = atomic_load_explicit(&u->tail, memory_order_relaxed) -
                      atomic_load_explicit(&u->head, memory_order_acquire);
    if (queued + (uint64_t)requests > MC_QUEUE) return 0;
  }
  return requests;
}

int unck_lease_requests(int slot, const char* p, size_t n) {
  if (mc_on) return mc_lease_requests_at(slot, p, n);
  if (slot >= 0 && unck_on) {
    const struct unck_conn* u = &unck_st[slot];
    if (u->in.state != RESP_IN_START || u->in.in_multi) return 0;
  }
  struct resp_in in;
  memset(&in, 0, sizeof in);
  const unsigned char* at = (const unsigned char*)p;
  int requests = 0;
  while (n > 0) {
    size_t whole = resp_whole_request(&in, at, n);
    if (whole == 0 || !resp_listed(&lease_list, &in)) return 0;
    at += whole;
    n -= whole;
    requests++;
  }
  if (slot >= 0 && unck_on) {
    const struct unck_conn* u = &unck_st[slot];
    uint64_t queued = atomic_load_explicit(&u->tail, memory_order_relaxed) -
                      atomic_load_explicit(&u->head, memory_order_acquire);
    if (queued + (uint64_t)requests > RESP_QUEUE) return 0;
  }
  return requests;
}

size_t unck_output(int slot, const struct iovec* iov, size_t iovcnt, size_t n, int count_only,
                   void (*feed)(void* ctx, const char* p, size_t n), void* ctx) {
  struct unck_conn* u = &unck_st[slot];
  /* The protocol's reply scanner; a count leaves the connection's own state
   * as it was (it works on a copy). */
  struct resp_out resp_copy, *ro = &u->out;
  struct mc_out mc_copy, *mo = &u->mc_out;
  if (count_only) {
    resp_copy = *ro;
    ro = &resp_copy;
    mc_copy = *mo;
    mo = &mc_copy;
  }
  uint64_t tail = atomic_load_explicit(&u->tail, memory_order_acquire);
  size_t checked = 0;
  for (size_t i = 0; i < iovcnt && n > 0; i++) {
    const unsigned char* p = iov[i].iov_base;
    size_t left = iov[i].iov_len < n ? iov[i].iov_len : n;
    n -= left;
    while (left > 0) {
      int skipped;
      const char* form = NULL;
      size_t run = mc_on ? mc_output_run(mo, &u->mc_queue, tail, p, left, &skipped, &form)
                         : resp_output_run(ro, &u->queue, tail, p, left, &skipped);
      if (!skipped) {
        checked += run;
        if (feed) feed(ctx, (const char*)p, run);
      }
      if (form) { /* a memcached stats cachedump's, in the form every replica compares */
        checked += MC_CANON_LEN;
        if (feed) feed(ctx, form, MC_CANON_LEN);
      }
      p += run;
      left -= run;
    }
  }
  if (!count_only)
    atomic_store_explicit(&u->head, mc_on ? mo->head : ro->head, memory_order_release);
  return checked;
}
