/* lock_wait_server.c — a thread-per-connection TCP server whose requests
 * wait for row locks the way InnoDB's do, to test serial_inputs against it
 * (tests/test_serial.py).
 *
 * A request that finds its lock taken waits on its connection's own
 * condition variable (pthread_cond_timedwait, InnoDB's lock_wait), and the
 * holder's `unlock` hands the lock to the first waiter and signals that
 * waiter's condition variable (InnoDB's lock_grant). What the woken request
 * then does races with whatever request executes next unless the shim puts
 * it between the same two inputs on every replica; the history of notes,
 * which every request may append to, shows the order.
 *
 * Protocol, one request per line, one reply line each:
 *   lock K MS NOTE   take lock K (0..63), waiting while another connection
 *                    holds it; then stay on the CPU for MS ms and append
 *                    NOTE to the history; "ok"
 *   unlock           release every lock of this connection; "ok"
 *   note NOTE        append NOTE to the history; "ok"
 *   history          the notes so far, comma-separated
 *
 *   lock_wait_server PORT
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define LOCKS 64

struct client {
  int fd;
  pthread_cond_t granted; /* signalled when a lock it waits for is handed to it */
};

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER; /* everything below */
static struct client* owner[LOCKS];
static struct client* waiting[LOCKS][16]; /* FIFO per lock */
static int waiting_n[LOCKS];
static char history[65536];

static void spin_ms(long ms) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

static void note(const char* what) {
  if (strlen(history) + strlen(what) + 2 >= sizeof history) return;
  if (history[0]) strcat(history, ",");
  strcat(history, what);
}

static void take_lock(struct client* c, int k) {
  pthread_mutex_lock(&m);
  if (owner[k] && owner[k] != c && waiting_n[k] < 16) {
    waiting[k][waiting_n[k]++] = c;
    while (owner[k] != c) {
      struct timespec deadline;
      clock_gettime(CLOCK_REALTIME, &deadline);
      deadline.tv_sec += 60;
      pthread_cond_timedwait(&c->granted, &m, &deadline);
    }
  }
  owner[k] = c;
  pthread_mutex_unlock(&m);
}

static void release_locks(struct client* c) {
  pthread_mutex_lock(&m);
  for (int k = 0; k < LOCKS; k++) {
    if (owner[k] != c) continue;
    owner[k] = NULL;
    if (waiting_n[k] > 0) { /* the first waiter gets it */
      struct client* next = waiting[k][0];
      memmove(&waiting[k][0], &waiting[k][1], (size_t)--waiting_n[k] * sizeof next);
      owner[k] = next;
      pthread_cond_signal(&next->granted);
    }
  }
  pthread_mutex_unlock(&m);
}

static const char* execute(struct client* c, char* line, char* out, size_t cap) {
  int k;
  long ms;
  char what[128];
  if (sscanf(line, "lock %d %ld %127s", &k, &ms, what) == 3 && k >= 0 && k < LOCKS) {
    take_lock(c, k);
    spin_ms(ms);
    pthread_mutex_lock(&m);
    note(what);
    pthread_mutex_unlock(&m);
    return "ok\n";
  }
  if (strncmp(line, "unlock", 6) == 0) {
    release_locks(c);
    return "ok\n";
  }
  if (sscanf(line, "note %127s", what) == 1) {
    pthread_mutex_lock(&m);
    note(what);
    pthread_mutex_unlock(&m);
    return "ok\n";
  }
  if (strncmp(line, "history", 7) == 0) {
    pthread_mutex_lock(&m);
    snprintf(out, cap, "%s\n", history);
    pthread_mutex_unlock(&m);
    return out;
  }
  return "unknown request\n";
}

static void* serve(void* arg) {
  struct client* c = arg;
  char buf[4096], out[65600];
  size_t have = 0;
  for (;;) {
    ssize_t n = read(c->fd, buf + have, sizeof buf - 1 - have);
    if (n <= 0) break;
    have += (size_t)n;
    buf[have] = 0;
    char* nl;
    while ((nl = strchr(buf, '\n')) != NULL) {
      *nl = 0;
      const char* reply = execute(c, buf, out, sizeof out);
      if (write(c->fd, reply, strlen(reply)) < 0) break;
      have -= (size_t)(nl + 1 - buf);
      memmove(buf, nl + 1, have + 1);
    }
    if (have == sizeof buf - 1) break; /* a line too long */
  }
  release_locks(c);
  close(c->fd);
  pthread_cond_destroy(&c->granted);
  free(c);
  return NULL;
}

/* It runs as pid 1 of its own pid namespace, which ignores a signal it has
 * no handler for: without this, stopping it took the daemon's 3 s and a
 * SIGKILL. */
static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

int main(int argc, char** argv) {
  signal(SIGTERM, on_term);
  if (argc != 2) {
    fprintf(stderr, "usage: lock_wait_server PORT\n");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr*)&a, sizeof a) != 0 || listen(ls, 64) != 0) {
    perror("lock_wait_server: bind/listen");
    return 1;
  }
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) continue;
    struct client* c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->fd = fd;
    pthread_cond_init(&c->granted, NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, serve, c) != 0) {
      close(fd);
      free(c);
      continue;
    }
    pthread_detach(t);
  }
}
