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
 * Same rules as the rest of the shim: no allocation (the state is a static
 * table indexed by output slot, never freed), errno untouched. */
#define _GNU_SOURCE
#include "preload/shim_unchecked.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "preload/resp_scan.h"
#include "preload/shim_state.h"

int unck_on;
static struct resp_list unck_list;

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
};
static struct unck_conn unck_st[LS_OUT_SLOTS];

void unck_init(void) {
  const char* list = getenv("LOCKSTEP_SHIM_UNCHECKED_RESP");
  if (!list || !*list) return;
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

void unck_input(int slot, const struct iovec* iov, int iovcnt, size_t n, size_t lease_n) {
  struct unck_conn* u = &unck_st[slot];
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

int unck_lease_requests(int slot, const char* p, size_t n) {
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
  struct resp_out copy, *o = &u->out;
  if (count_only) {
    copy = *o;
    o = &copy;
  }
  uint64_t tail = atomic_load_explicit(&u->tail, memory_order_acquire);
  size_t checked = 0;
  for (size_t i = 0; i < iovcnt && n > 0; i++) {
    const unsigned char* p = iov[i].iov_base;
    size_t left = iov[i].iov_len < n ? iov[i].iov_len : n;
    n -= left;
    while (left > 0) {
      int skipped;
      size_t run = resp_output_run(o, &u->queue, tail, p, left, &skipped);
      if (!skipped) {
        checked += run;
        if (feed) feed(ctx, (const char*)p, run);
      }
      p += run;
      left -= run;
    }
  }
  if (!count_only) atomic_store_explicit(&u->head, o->head, memory_order_release);
  return checked;
}
