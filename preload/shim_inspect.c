/* shim_inspect.c — inspection connections: the client connections a
 * replica's server accepts while the replica does not lead. Only the
 * daemon's own are served (`lockstep inspect`: it claimed the connection's
 * address and port in an inspection slot before connecting, shim_abi.h
 * ls_inspect_slot), once per claim and only until the replica leads; any
 * other is refused (shim.c closes it) and logged, since a backup's server
 * would acknowledge writes that are never agreed. */
#include "preload/shim_inspect.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>

#include "preload/shim_clock.h"
#include "preload/shim_state.h"

/* Inspection connections: client connections the server accepted while this
 * replica was not the leader. They pass straight through (a backup's server
 * answers them: DEBUG DIGEST, DBSIZE), so nothing they send is ever agreed.
 * Such a connection must never be served by a leader: a replica that became
 * the leader while one was open used to go on executing what its client sent
 * (SETs acknowledged at unreplicated speed, absent from the log and from
 * every other replica). So once the shim sees this replica lead, the
 * connection is dead for good: its reads return EOF (the server closes it,
 * the client reconnects). inspect_ino holds the socket's inode + 1 (0: not
 * an inspection connection), so that a stale entry (an fd the server closed
 * without our close(), a restored image's closed socket) never touches
 * another file under the same number. */
static _Atomic(uint64_t) inspect_ino[LS_MAX_FD];
static _Atomic(uint8_t) inspect_dead[LS_MAX_FD];

/* 1 when fd is an inspection connection this replica has led since it was
 * accepted: the server must read EOF from it, never its client's bytes. */
int inspection_closed(int fd) {
  if (!active || fd < 0 || fd >= LS_MAX_FD) return 0;
  uint64_t ino = atomic_load_explicit(&inspect_ino[fd], memory_order_acquire);
  if (!ino) return 0;
  if (!atomic_load(&inspect_dead[fd]) && atomic_load(&hdr->mode) != LS_MODE_LEADER) return 0;
  int saved = errno;
  struct stat st;
  int same = fstat(fd, &st) == 0 && (uint64_t)st.st_ino + 1 == ino;
  errno = saved;
  if (!same) { /* not the socket we saw accepted any more */
    atomic_store(&inspect_ino[fd], 0);
    atomic_store(&inspect_dead[fd], 0);
    return 0;
  }
  atomic_store(&inspect_dead[fd], 1);
  return 1;
}

void inspect_forget(int fd) {
  if (fd < 0 || fd >= LS_MAX_FD) return;
  atomic_store(&inspect_ino[fd], 0);
  atomic_store(&inspect_dead[fd], 0);
}

/* Says (at most once a second, with a count) that client connections were
 * closed because this replica does not lead: the server's log then explains
 * a client's resets. */
static void refused_on_backup(const char* peer) {
  static _Atomic(uint64_t) refused, last_said_ns, said_count;
  uint64_t n = atomic_fetch_add(&refused, 1) + 1;
  uint64_t now = now_ns(), last = atomic_load(&last_said_ns);
  if (last && now - last < 1000000000ull) return;
  if (!atomic_compare_exchange_strong(&last_said_ns, &last, now)) return;
  uint64_t before = atomic_exchange(&said_count, n);
  shim_log(
      "closed %llu client connection(s) (latest from %s): this replica does not lead; "
      "clients must connect to the leader (cluster status), inspectors use `lockstep "
      "inspect`",
      (unsigned long long)(n - before), peer);
}

/* 1 when the connection from peer_ip:port is the one the daemon claimed an
 * inspection slot for, and the first from there (the slot is used up). */
static int claimed_by_daemon(int port, uint32_t peer_ip) {
  uint32_t source = atomic_load(&hdr->inspect_source);
  if (!source || peer_ip != source || port <= 0) return 0;
  for (uint32_t i = 0; i < LS_MAX_INSPECT; i++) {
    struct ls_inspect_slot* s = &hdr->inspect[i];
    if (atomic_load(&s->port) != (uint32_t)port) continue;
    uint32_t fresh = 0;
    if (atomic_compare_exchange_strong(&s->accepted, &fresh, 1)) return 1;
  }
  return 0;
}

int inspect_admit(int fd, int port, uint32_t peer_ip, const char* peer) {
  if (!claimed_by_daemon(port, peer_ip)) {
    refused_on_backup(peer);
    return 0;
  }
  /* Inspection only, and only while this replica does not lead (see
   * inspect_ino). Should it lead already, the first read says EOF. */
  struct stat st;
  if (fstat(fd, &st) == 0) atomic_store(&inspect_ino[fd], (uint64_t)st.st_ino + 1);
  return 1;
}
