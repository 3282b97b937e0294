/* mt_epoll_server.c — a small multi-threaded TCP server with slapd's way of
 * waiting, to test the preload shim against it (tests/test_mt_epoll.py).
 *
 * The worker threads block in epoll_wait on one shared epoll set before any
 * connection exists; a separate listener thread accepts and adds each
 * connection to that set with a pointer in its event data. That is the
 * pattern that made slapd crash under the shim: a wait already in progress
 * must never be handed an event the server did not register. Every event's
 * data is checked here (a magic word behind the pointer), and in EPOLLONESHOT
 * mode no connection may be reported to two threads before it is re-armed;
 * a violation prints what was seen and aborts, which the test notices.
 *
 * Protocol, one command per line: "ADD n" adds n to the connection's own
 * total and replies "total <t>"; "SUM" replies "sum <s>", the sum of the
 * totals of every connection closed so far plus the open ones; "OUTS"
 * replies "outs <n>", the EPOLLOUT events the workers got so far (--mode
 * et-out registers EPOLLIN | EPOLLOUT | EPOLLET, as many event loops do: an
 * edge-triggered EPOLLOUT comes once per time the socket turns writable,
 * a handful per connection, never once per wait). One client
 * per connection sends, waits for the reply, sends again, so replies are
 * deterministic whatever thread runs them.
 *
 *   mt_epoll_server --port P [--workers N] [--mode lt|et|et-out|oneshot]
 *                   [--wait epoll|poll|ppoll|select|pselect]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAGIC 0x6c6f636b73746570ull
#define MAX_CONNS 1024

struct conn {
  uint64_t magic;
  int fd;
  atomic_int busy;   /* a thread is serving it (EPOLLONESHOT: nobody else may) */
  atomic_int closed; /* never freed: another thread may still hold an event for it */
  atomic_int again;  /* EPOLLET: an edge came while another thread served it */
  long long total;
  char line[256];
  size_t used;
};

static int epfd, listen_fd;
static uint32_t mode_flags; /* 0, EPOLLET or EPOLLONESHOT */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_long out_events;
static long long closed_sum;
static struct conn* open_conns[MAX_CONNS];

static void die(const char* what) {
  fprintf(stderr, "mt_epoll_server: %s\n", what);
  fflush(stderr);
  abort();
}

static long long sum_all(void) {
  long long s = closed_sum;
  for (int i = 0; i < MAX_CONNS; i++)
    if (open_conns[i]) s += open_conns[i]->total;
  return s;
}

static void reply(int fd, const char* text) {
  size_t len = strlen(text), off = 0;
  while (off < len) {
    ssize_t n = write(fd, text + off, len - off);
    if (n > 0) {
      off += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, 1000);
    } else {
      return; /* the client went away */
    }
  }
}

static void run_line(struct conn* c, const char* line) {
  char out[64];
  pthread_mutex_lock(&mu);
  if (strncmp(line, "ADD ", 4) == 0) {
    c->total += atoll(line + 4);
    snprintf(out, sizeof out, "total %lld\n", c->total);
  } else if (strcmp(line, "SUM") == 0) {
    snprintf(out, sizeof out, "sum %lld\n", sum_all());
  } else if (strcmp(line, "OUTS") == 0) {
    snprintf(out, sizeof out, "outs %ld\n", atomic_load(&out_events));
  } else {
    snprintf(out, sizeof out, "error unknown command\n");
  }
  pthread_mutex_unlock(&mu);
  reply(c->fd, out);
}

static void close_conn(struct conn* c) {
  pthread_mutex_lock(&mu);
  closed_sum += c->total;
  if (c->fd >= 0 && c->fd < MAX_CONNS) open_conns[c->fd] = NULL;
  pthread_mutex_unlock(&mu);
  atomic_store(&c->closed, 1);
  epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
}

/* Reads what the connection has; returns 0 once it is closed. */
static int serve(struct conn* c) {
  for (;;) {
    char buf[512];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      close_conn(c);
      return 0;
    }
    if (n < 0) return 1;
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == '\n') {
        c->line[c->used] = 0;
        run_line(c, c->line);
        c->used = 0;
      } else if (c->used + 1 < sizeof c->line) {
        c->line[c->used++] = buf[i];
      }
    }
    if (!(mode_flags & EPOLLET)) return 1; /* level-triggered: one read per event */
  }
}

static struct conn* checked(uint64_t data) {
  struct conn* c = (struct conn*)(uintptr_t)data;
  if (!c || ((uintptr_t)c & 7)) {
    fprintf(stderr, "mt_epoll_server: foreign epoll event data %#llx\n", (unsigned long long)data);
    die("an event this server never registered");
  }
  if (c->magic != MAGIC) {
    fprintf(stderr, "mt_epoll_server: event data %#llx does not point to a connection\n",
            (unsigned long long)data);
    die("an event this server never registered");
  }
  return c;
}

static void* epoll_worker(void* arg) {
  (void)arg;
  for (;;) {
    struct epoll_event ev[8];
    int n = epoll_wait(epfd, ev, 8, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("epoll_wait failed");
    }
    for (int i = 0; i < n; i++) {
      struct conn* c = checked(ev[i].data.u64);
      if (ev[i].events & EPOLLOUT) atomic_fetch_add(&out_events, 1);
      if (!(ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
      if (atomic_load(&c->closed)) continue;
      if (atomic_exchange(&c->busy, 1)) {
        if (mode_flags & EPOLLONESHOT) die("EPOLLONESHOT connection reported to a second thread");
        /* Another thread serves it. Level-triggered, the event comes back;
         * an edge does not: that thread must look again. */
        atomic_store(&c->again, 1);
        continue;
      }
      int open = 1;
      for (;;) {
        if (!(open = serve(c))) break;
        atomic_store(&c->busy, 0);
        if (!atomic_exchange(&c->again, 0) || atomic_exchange(&c->busy, 1)) break;
      }
      if (!open) continue;
      if (mode_flags & EPOLLONESHOT) {
        struct epoll_event re = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
        if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &re) != 0) {
          fprintf(stderr, "mt_epoll_server: epoll_ctl MOD of fd %d: %s\n", c->fd, strerror(errno));
          die("epoll_ctl MOD failed");
        }
      }
    }
  }
  return NULL;
}

/* --wait poll|ppoll|select|pselect: one thread waits on every open
 * connection at once, through the call named (each is its own libc entry). */
enum scan { SCAN_POLL = 1, SCAN_PPOLL, SCAN_SELECT, SCAN_PSELECT };
static void* scan_worker(void* arg) {
  enum scan how = (enum scan)(uintptr_t)arg;
  int use_select = how == SCAN_SELECT || how == SCAN_PSELECT;
  for (;;) {
    struct pollfd p[MAX_CONNS];
    struct conn* cs[MAX_CONNS];
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_CONNS && n < FD_SETSIZE; i++)
      if (open_conns[i]) {
        cs[n] = open_conns[i];
        p[n].fd = i;
        p[n].events = POLLIN;
        p[n].revents = 0;
        n++;
      }
    pthread_mutex_unlock(&mu);
    int ready;
    if (use_select) {
      fd_set rd;
      FD_ZERO(&rd);
      int top = -1;
      for (int i = 0; i < n; i++) {
        FD_SET(p[i].fd, &rd);
        if (p[i].fd > top) top = p[i].fd;
      }
      /* New connections join on the next round. */
      struct timeval tv = {0, 20000};
      struct timespec ts = {0, 20000000};
      ready = how == SCAN_SELECT ? select(top + 1, &rd, NULL, NULL, &tv)
                                 : pselect(top + 1, &rd, NULL, NULL, &ts, NULL);
      for (int i = 0; i < n && ready > 0; i++)
        if (FD_ISSET(p[i].fd, &rd)) p[i].revents = POLLIN;
    } else if (how == SCAN_PPOLL) {
      struct timespec ts = {0, 20000000};
      ready = ppoll(p, (nfds_t)n, &ts, NULL);
    } else {
      ready = poll(p, (nfds_t)n, 20);
    }
    if (ready < 0 && errno != EINTR) die("poll/select failed");
    for (int i = 0; i < n && ready > 0; i++)
      if (p[i].revents) serve(cs[i]);
  }
  return NULL;
}

int main(int argc, char** argv) {
  int port = 0, workers = 3;
  const char* wait = "epoll";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--port")) {
      port = atoi(argv[i + 1]);
    } else if (!strcmp(argv[i], "--workers")) {
      workers = atoi(argv[i + 1]);
    } else if (!strcmp(argv[i], "--mode")) {
      const char* m = argv[i + 1];
      mode_flags = !strcmp(m, "et")        ? EPOLLET
                   : !strcmp(m, "et-out")  ? EPOLLET | EPOLLOUT
                   : !strcmp(m, "oneshot") ? EPOLLONESHOT
                                           : 0;
      if (strcmp(m, "lt") && !mode_flags) die("--mode is lt, et, et-out or oneshot");
    } else if (!strcmp(argv[i], "--wait")) {
      wait = argv[i + 1];
    } else {
      die("usage: mt_epoll_server --port P [--workers N] [--mode lt|et|et-out|oneshot] "
          "[--wait epoll|poll|ppoll|select|pselect]");
    }
  }
  if (port <= 0 || workers <= 0 || workers > 64) die("--port P (> 0) and --workers 1..64 needed");
  if (strcmp(wait, "epoll")) workers = 1; /* a scan serves every connection from one thread */
  listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listen_fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(listen_fd, 128) != 0)
    die("cannot listen on the port");
  epfd = epoll_create1(EPOLL_CLOEXEC);
  pthread_t t;
  /* The waiters first: they must already be blocked when connections arrive. */
  for (int i = 0; i < workers; i++) {
    enum scan how = !strcmp(wait, "poll")      ? SCAN_POLL
                    : !strcmp(wait, "ppoll")   ? SCAN_PPOLL
                    : !strcmp(wait, "select")  ? SCAN_SELECT
                    : !strcmp(wait, "pselect") ? SCAN_PSELECT
                                               : 0;
    if (!how && strcmp(wait, "epoll")) die("--wait is epoll, poll, ppoll, select or pselect");
    if (how)
      pthread_create(&t, NULL, scan_worker, (void*)(uintptr_t)how);
    else
      pthread_create(&t, NULL, epoll_worker, NULL);
  }
  usleep(20000);
  fprintf(stderr, "mt_epoll_server: port %d, %d workers, %s\n", port, workers, wait);
  for (;;) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      die("accept failed");
    }
    if (fd >= MAX_CONNS) {
      close(fd);
      continue;
    }
    struct conn* c = calloc(1, sizeof *c);
    c->magic = MAGIC;
    c->fd = fd;
    pthread_mutex_lock(&mu);
    open_conns[fd] = c;
    pthread_mutex_unlock(&mu);
    if (!strcmp(wait, "epoll")) {
      struct epoll_event ev = {.events = EPOLLIN | mode_flags, .data.ptr = c};
      if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl ADD failed");
    }
  }
}
