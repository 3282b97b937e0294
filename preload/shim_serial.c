/* shim_serial.c — serial_inputs: one agreed input executes at a time in a
 * server that runs connections on several threads (the app profile's
 * `serial_inputs`, LOCKSTEP_SHIM_SERIAL=1), and the wake-ups of threads
 * waiting in poll, select or a blocking read. shim_order.c's delivery
 * order asks executing_other() whose turn it is (hooks.executing_other);
 * shim.c's reads call serial_begin(); every place a thread shows it is done
 * with an input calls serial_done(). The server's waits on condition
 * variables come through here too (the wrappers of pthread_cond_wait,
 * _timedwait, _clockwait, _signal and _broadcast below; the timed ones take
 * their deadline from shim_clock.c), so that a thread let go while it waits
 * goes on in the log's order.
 *
 * Same rules as shim.c: errno preserved, no allocation; all of it under
 * `mu` unless said otherwise (the wrappers take it themselves). */
#define _GNU_SOURCE
#include "preload/shim_serial.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "preload/shim_abi.h"
#include "preload/shim_clock.h"
#include "preload/shim_order.h"
#include "preload/shim_output.h"
#include "preload/shim_rings.h"
#include "preload/shim_state.h"

static int serial_on;          /* LOCKSTEP_SHIM_SERIAL has LS_SERIAL_ON */
static int serial_reply;       /* ... LS_SERIAL_UNTIL_REPLY: until the reply (below) */
static int serial_sleep_keeps; /* ... LS_SERIAL_SLEEP_KEEPS: asleep keeps the turn */

void serial_init(int flags) {
  serial_on = flags > 0 && (flags & LS_SERIAL_ON);
  serial_reply = serial_on && (flags & LS_SERIAL_UNTIL_REPLY);
  serial_sleep_keeps = serial_on && (flags & LS_SERIAL_SLEEP_KEEPS);
}

int serial_enabled(void) {
  return serial_on;
}

/* Serial execution (LOCKSTEP_SHIM_SERIAL=1, the app profile's
 * `serial_inputs`), for servers that run connections on several threads.
 * In-order delivery is not enough for them: once thread A has read
 * connection X's input, the head moves to Y's, and thread B executes Y's
 * while A still executes X's, so two replicas may execute them in either
 * order (memcached's CAS uniques, InnoDB's lock waits). Here the next
 * connection's input stays unreadable until the thread that read the last
 * one has finished with it: it waits again (epoll, poll, select) or reads
 * its connection dry (EAGAIN, or a blocking read that would wait), or
 * closes it. Its connection may go on reading its own run meanwhile. A
 * thread found asleep on a condition variable twice LS_SERIAL_LOOK_NS apart
 * waits on something (a row lock) that only a later input can release: the
 * next one goes in (holder_holds), and the thread, once woken, takes its
 * turn back in the log's order ("Condition variables" below); one asleep
 * anywhere else does so only after LS_SERIAL_ASLEEP_ELSEWHERE_NS. (On the
 * /proc this looks at, see self_proc_tid.) One that does none of these for
 * LS_SERIAL_EXEC_NS lets the next one in too, logged: liveness over
 * determinism.
 *
 * Until the reply (LOCKSTEP_SHIM_SERIAL=2, the profile's
 * `serial_until_reply`): a server whose listener thread reads each request
 * and hands it to a pool thread (slapd) has its listener waiting again at
 * once, while the pool thread still executes; two requests of different
 * connections would run at once, and their entryCSN and entryUUID (the
 * clock of whichever input was read last) differ between replicas. There
 * the input executes until the server has sent output on its connection
 * after reading it (serial_sent, from the send wrappers, without mu), or
 * closed it; waiting again and reading dry do not count, nor does a thread
 * asleep (the listener sleeps in epoll as a matter of course).
 *
 * Asleep keeps the turn (LS_SERIAL_SLEEP_KEEPS, the profile's
 * `serial_sleep_keeps_turn`): for a server whose requests never wait for a
 * later request, only for its own mutexes (memcached's item and LRU locks,
 * which its maintainer threads take too), a sleeping holder is not blocked
 * by anything a later input could end, and letting that input in would run
 * the two at once. */
static pid_t exec_tid;         /* the thread executing an input; 0: none */
static pid_t exec_proc_tid;    /* the same thread's number in /proc (below); 0: unknown */
static struct conn* exec_conn; /* whose input */
static uint64_t exec_since_ns;
static uint64_t exec_expired;
static uint64_t exec_blocked;      /* let go: asleep waiting (not counted as expired) */
static uint64_t exec_next_look_ns; /* when to look at its state again */
static int exec_asleep;            /* consecutive looks that found it asleep */
/* Until the reply: the executing input's connection (-1: not followed, the
 * rules above apply), its output offset when it was read, and whether the
 * server has sent past it since. Set under mu, read by senders without it. */
static _Atomic(int) exec_fd = -1;
static _Atomic(uint64_t) exec_out_at;
static _Atomic(int) exec_replied;
static __thread pid_t my_tid;

static pid_t self_tid(void) {
  if (!my_tid) my_tid = (pid_t)syscall(SYS_gettid);
  return my_tid;
}

/* This thread's number in the /proc we can read. The daemon starts the
 * server in a PID namespace of its own (so that CRIU restores it under the
 * same pids) while /proc stays the daemon's: gettid says 23 where /proc
 * knows the thread as 48213. /proc/thread-self names it as /proc sees it
 * ("PID/task/TID"); asked anew each time, since a restored server's
 * threads have new numbers there. 0: no /proc. */
static pid_t self_proc_ids(pid_t* proc_pid) {
  int saved = errno;
  char link[64];
  ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/thread-self", link, sizeof link - 1);
  const char* task = n > 0 ? (link[n] = 0, strstr(link, "/task/")) : NULL;
  errno = saved;
  if (proc_pid) *proc_pid = task ? (pid_t)strtol(link, NULL, 10) : 0;
  return task ? (pid_t)strtol(task + 6, NULL, 10) : 0;
}
static pid_t self_proc_tid(void) {
  return self_proc_ids(NULL);
}

/* The state letter of a thread of this process (its number in /proc) from
 * its stat: 'R' running or runnable, 'S' asleep, 'D' in the disk...; 'X'
 * when it is gone (no such task), 0 when its stat could not be read. */
/* Reads /proc/self/task/<tid>/<file> into buf (NUL-terminated, raw
 * syscalls, no allocation): the bytes read, 0 if none, -1 when the task is
 * gone. */
static ssize_t read_task_file_at(int task_dir, pid_t proc_tid, const char* file, char* buf,
                                 size_t size) {
  char path[64];
  if (task_dir >= 0)
    snprintf(path, sizeof path, "%d/%s", (int)proc_tid, file);
  else
    snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)proc_tid, file);
  int fd =
      (int)syscall(SYS_openat, task_dir >= 0 ? task_dir : AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = syscall(SYS_read, fd, buf, size - 1);
  real_close(fd);
  if (n < 0) n = 0;
  buf[n] = 0;
  return n;
}

static ssize_t read_task_file(pid_t proc_tid, const char* file, char* buf, size_t size) {
  return read_task_file_at(-1, proc_tid, file, buf, size);
}

/* task_dir: an open /proc/self/task (the path is then looked up from
 * there, which is most of an open's cost here), or -1. */
static char thread_state_at(int task_dir, pid_t proc_tid) {
  char buf[256];
  ssize_t n = read_task_file_at(task_dir, proc_tid, "stat", buf, sizeof buf);
  if (n < 0) return 'X';
  if (n == 0) return 0;
  const char* end = strrchr(buf, ')'); /* after the name, which may hold anything */
  return end && end[1] == ' ' ? end[2] : 0;
}

static char thread_state(pid_t proc_tid) {
  return thread_state_at(-1, proc_tid);
}

/* The thread, asleep, waits in a futex on the shim's own mutex: for the
 * thread that holds mu, which is the one looking (every look is made under
 * mu). It is as good as running: it woke from whatever it waited for (a
 * Python thread handed the interpreter's lock, back in serial_cond_leave)
 * and goes on as soon as the look ends. Taken as asleep, a holder caught
 * there at two looks was let go while it ran, and the next input executed
 * beside it (test_serial, 1 run in 3). /proc/<tid>/syscall: the number of
 * the system call it is in, then its arguments in hex. */
static int waits_for_shim(pid_t proc_tid) {
  char buf[128];
  if (read_task_file(proc_tid, "syscall", buf, sizeof buf) <= 0) return 0;
  char* args;
  if (strtol(buf, &args, 10) != SYS_futex) return 0;
  return strtoull(args, NULL, 16) == (unsigned long long)(uintptr_t)&mu;
}

/* The thread (its number in /proc) is asleep in the kernel ('S' in its
 * stat): waiting on a lock or a condition (not the shim's: waits_for_shim),
 * not running and not on the disk ('D'), or gone. Not known (no /proc):
 * taken as awake, and only the holder's LS_SERIAL_EXEC_NS lets the next
 * input in. */
static int thread_sleeps(pid_t proc_tid) {
  if (!proc_tid) return 0;
  char state = thread_state(proc_tid);
  return state == 'X' || (state == 'S' && !waits_for_shim(proc_tid));
}

static pid_t proc_pid_seen; /* the server's number in /proc at the last scan; mu */
static int in_shim_wait(pid_t proc_pid, pid_t proc_tid);

/* Another thread of the server than `holder` and the caller is running or
 * runnable ('R'), or in the disk ('D'): the holder, asleep, may be waiting
 * for it (a Python thread for the interpreter's lock, which the running
 * thread gives back within milliseconds), not for a later input, and
 * letting the next input in would run the two at once. One that waits for
 * mu (waits_for_shim) does not count: a server of many threads has one
 * there at most looks, since each look holds mu, and a holder waiting on a
 * row lock was then never let go (MariaDB's inputs held 5 s); one the
 * holder waits for is on the CPU again by the next look. Nor does one
 * registered as a waiter (waiter_enter .. waiter_leave, both under mu,
 * which the look holds): it is in the shim's poll or about to be, and runs
 * no server code until it has taken mu. Woken to look at the holder too, it
 * is runnable for a while on a busy machine, and counted as running it kept
 * a holder waiting on a row lock from being let go until the 5 s expiry,
 * after which the two inputs ran side by side (test_serial's lock-wait test,
 * 5 runs in 48 under two CPU hogs); skipped, its stat is not read either.
 * Read from /proc with raw getdents64 into the stack (no allocation). 0
 * without /proc. */
static int another_thread_runs(pid_t holder) {
  int dir =
      (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  pid_t proc_pid = 0;
  pid_t me = self_proc_ids(&proc_pid);
  proc_pid_seen = proc_pid;
  int runs = 0;
  char buf[2048];
  long n;
  while (!runs && (n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
    for (long at = 0; at < n && !runs;) {
      struct linux_dirent64 {
        uint64_t d_ino;
        int64_t d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[];
      }* d = (struct linux_dirent64*)(buf + at);
      at += d->d_reclen;
      pid_t tid = (pid_t)strtol(d->d_name, NULL, 10);
      if (tid <= 0 || tid == holder || tid == me || in_shim_wait(proc_pid, tid)) continue;
      char state = thread_state_at(dir, tid);
      runs = state == 'R' || state == 'D';
    }
  }
  real_close(dir);
  return runs;
}

static void wake_next_turn(int my_epfd);
static void wake_next_in_line(void);

static void exec_release(void) {
  exec_tid = 0;
  exec_conn = NULL;
  atomic_store(&exec_fd, -1);
}

/* Condition variables, in the mode that lets a sleeping holder go (neither
 * serial_until_reply nor serial_sleep_keeps_turn). A holder found asleep is
 * let go because it waits for what only a later input can end: an InnoDB
 * row lock, released by the COMMIT of the transaction that holds it. Woken,
 * it would go on at once, beside whatever input executes by then, and two
 * replicas could execute the two in either order. So a holder let go while
 * it waits on a condition variable is parked: back from its wait, it takes
 * the turn again before it returns to the server. Whoever signals that
 * condition variable (the COMMIT's thread, executing its input: the same
 * point on every replica) makes it owed, and owed threads get the turn first,
 * in the order they were signalled, as soon as it is free: the woken thread
 * goes on between the same two inputs on every replica. One that wakes
 * unsignalled (a timeout) takes the turn when it is next free. While it
 * waits for it, it does not hold the server's mutex (the holder may need
 * it: InnoDB's lock_sys.wait_mutex). A holder asleep elsewhere (a futex
 * of the server's own) is let go, unparked, only after
 * LS_SERIAL_ASLEEP_ELSEWHERE_NS (holder_holds). */
enum park_state {
  PARK_WAITING, /* in its wait, not let go */
  PARK_LET_GO,  /* let go while it waits; back, it needs the turn */
  PARK_OWED,    /* ... and signalled: the turn is its next */
  PARK_GRANTED, /* the turn is its (it may not be back yet) */
};
struct cond_waiter {
  pthread_cond_t* cond; /* NULL: a free slot */
  pid_t tid, proc_tid;
  struct conn* conn; /* the input it held */
  uint64_t order;    /* let go, then signalled: in what order */
  int state;         /* enum park_state */
  int long_wait;     /* untimed, or its deadline LS_SERIAL_LONG_WAIT_NS away or more */
};
static struct cond_waiter cond_waiters[256];
static int cond_waiters_n;
static _Atomic(int) parked_n;        /* let go or owed: the signal wrappers' fast path */
static uint64_t park_order;          /* the last order handed out */
static _Atomic(uint32_t) turn_futex; /* bumped when the turn is free or granted */
static int turn_waiters;             /* threads in (or about to be in) its FUTEX_WAIT; mu */
static __thread int my_cond_slot = -1;

static int parking(void) {
  return serial_on && !serial_reply && !serial_sleep_keeps;
}

/* mu held: a waiter counts itself under mu before it lets go of mu, so a
 * wake-up it needs is never skipped. */
static void turn_moved(void) {
  atomic_fetch_add(&turn_futex, 1);
  if (turn_waiters)
    syscall(SYS_futex, (uint32_t*)&turn_futex, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* The turn is free: the first owed thread gets it. 1: one did. */
static int grant_owed(void) {
  if (exec_tid || !atomic_load(&parked_n)) return 0;
  struct cond_waiter* first = NULL;
  for (int i = 0; i < cond_waiters_n; i++) {
    struct cond_waiter* w = &cond_waiters[i];
    if (w->cond && w->state == PARK_OWED && (!first || w->order < first->order)) first = w;
  }
  if (!first) return 0;
  first->state = PARK_GRANTED;
  atomic_fetch_sub(&parked_n, 1);
  exec_tid = first->tid;
  exec_proc_tid = first->proc_tid;
  exec_conn = first->conn;
  exec_since_ns = now_ns();
  /* Back from its wait it is awake; until then (the kernel's wake-up, the
   * server's mutex) it may look asleep: not looked at for a while. */
  exec_next_look_ns = exec_since_ns + 10 * LS_SERIAL_LOOK_NS;
  exec_asleep = 0;
  turn_moved();
  return 1;
}

/* The holder is done or let go: the turn goes to an owed thread, or to
 * whoever reads the next agreed input. */
static void turn_next(int my_epfd) {
  exec_release();
  if (!grant_owed()) {
    if (atomic_load(&parked_n)) turn_moved(); /* a parked thread woken unsignalled may take it */
    wake_next_turn(my_epfd);
  }
}

/* The holder (exec_tid), asleep, is let go: parked if it waits on a
 * condition variable. */
static void let_holder_go(void) {
  int parked = 0;
  for (int i = 0; i < cond_waiters_n; i++) {
    struct cond_waiter* w = &cond_waiters[i];
    if (w->cond && w->tid == exec_tid && (w->state == PARK_WAITING || w->state == PARK_GRANTED)) {
      parked = 1;
      w->state = PARK_LET_GO;
      w->conn = exec_conn;
      w->proc_tid = exec_proc_tid;
      w->order = ++park_order;
      atomic_fetch_add(&parked_n, 1);
    }
  }
  /* Said for the first few and then now and then: a server whose requests
   * wait on each other (InnoDB's row locks) is let go often, and where one
   * should not have been (an overlap a test counts) this is the evidence. */
  if (exec_blocked++ < 3 || exec_blocked % 1000 == 0)
    shim_log(
        "serial_inputs: the thread executing connection %u's input was asleep%s at %d looks "
        "%llu us apart: the next input goes in beside it (%llu times so far)",
        exec_conn ? exec_conn->no : 0u, parked ? " on a condition variable" : "", exec_asleep,
        (unsigned long long)(serial_look_ns() / 1000), (unsigned long long)exec_blocked);
  turn_next(-1);
}

/* The holder waits on a condition variable (it is registered there); for
 * long (cond_waiter.long_wait) when `long_only`. */
static int holder_in_cond_for(int long_only) {
  for (int i = 0; i < cond_waiters_n; i++)
    if (cond_waiters[i].cond && cond_waiters[i].tid == exec_tid &&
        (!long_only || cond_waiters[i].long_wait))
      return 1;
  return 0;
}
static int holder_in_cond(void) {
  return holder_in_cond_for(0);
}

/* A holder in a long wait on a condition variable is looked at more often:
 * where it waits for a row lock, every input behind it waits until it is
 * let go, and the two looks that let it go were 2 ms of a whole replica
 * standing still (MariaDB oltp_write_only at 16 threads: about one per
 * transaction). The looks ask the same (asleep, and no other thread of the
 * server running), only sooner. Not in a short timed wait: a Python thread
 * waits for the interpreter's lock 5 ms at a time, handed it by a thread
 * that may itself sleep a moment around the hand-over, and looks 100 us
 * apart let it go beside the next input (test_serial, 3 runs in 60 under a
 * CPU hog; none at 1 ms). */
uint64_t serial_look_ns(void) {
  return exec_tid && parking() && holder_in_cond_for(1) ? LS_SERIAL_COND_LOOK_NS
                                                        : LS_SERIAL_LOOK_NS;
}

/* The holder still holds the turn, after a look at it if one is due: 0 if
 * it was let go or held it too long. Let go: asleep at two looks
 * LS_SERIAL_COND_LOOK_NS apart on a condition variable, where it waits for what
 * only a later input can release (the lock holder's COMMIT; every replica
 * blocks at the same point, since each executed the same inputs in the same
 * order so far). Asleep anywhere else (with parking: a latch or a futex of
 * the server's own, which a running thread releases soon, and which may be
 * taken on one replica and not on another) only once it was for
 * LS_SERIAL_ASLEEP_ELSEWHERE_NS: letting the next input in beside it would
 * run the two at once. A look that finds another thread of the server
 * running does not count: the holder may be waiting for that thread (a
 * Python server's request thread waits for the interpreter's lock whenever
 * a thread of the server's own runs), and only where every other thread
 * waits too can a later input be what it waits for. mu held, exec_tid set. */
static int holder_holds(int until_reply) {
  uint64_t now = now_ns(), held = now - exec_since_ns, look = serial_look_ns();
  if (held < look || ((until_reply || serial_sleep_keeps) && held < LS_SERIAL_EXEC_NS)) return 1;
  if (held < LS_SERIAL_EXEC_NS) {
    if (now < exec_next_look_ns) return 1;
    exec_next_look_ns = now + look;
    int saved = errno;
    exec_asleep =
        thread_sleeps(exec_proc_tid) && !another_thread_runs(exec_proc_tid) ? exec_asleep + 1 : 0;
    errno = saved;
    int looks = !parking() || holder_in_cond()
                    ? 2
                    : (int)(LS_SERIAL_ASLEEP_ELSEWHERE_NS / LS_SERIAL_LOOK_NS);
    if (exec_asleep < looks) return 1;
    let_holder_go();
    return 0;
  }
  if (exec_expired++ % 1000 == 0)
    shim_log(
        "serial_inputs: a thread held an input for over %llu ms without waiting again; "
        "the next connection's input goes ahead (%llu times so far)",
        (unsigned long long)(LS_SERIAL_EXEC_NS / 1000000), (unsigned long long)exec_expired);
  turn_next(-1);
  return 0;
}

void serial_sent(int fd, uint64_t end) {
  if (serial_reply && atomic_load(&exec_fd) == fd && end > atomic_load(&exec_out_at) &&
      !atomic_exchange(&exec_replied, 1))
    (void)eventfd_write(wake_server_fd, 1); /* whoever waits for its turn looks again */
}

/* Another connection's input is executing (or an owed thread's turn has
 * come), so c's must wait. mu held. */
int executing_other(const struct conn* c) {
  if (!serial_on) return 0;
  grant_owed();
  if (!exec_tid || c == exec_conn) return 0;
  int until_reply = atomic_load(&exec_fd) >= 0;
  if (until_reply && atomic_load(&exec_replied)) {
    turn_next(-1);
    return exec_tid && c != exec_conn;
  }
  if (holder_holds(until_reply)) return 1;
  return exec_tid && c != exec_conn; /* let go: maybe to an owed thread */
}

/* Around a server's wait on a condition variable (shim_clock.c's timed
 * waits and pthread_cond_wait below); `m` is its mutex, held on entry and
 * on return. */
void serial_cond_enter(pthread_cond_t* c, int long_wait) {
  if (!parking()) return;
  pthread_mutex_lock(&mu);
  if (exec_tid != self_tid()) { /* only a holder is ever let go */
    mu_unlock();
    return;
  }
  int slot = -1;
  for (int i = 0; i < cond_waiters_n && slot < 0; i++)
    if (!cond_waiters[i].cond) slot = i;
  if (slot < 0 && cond_waiters_n < (int)(sizeof cond_waiters / sizeof *cond_waiters))
    slot = cond_waiters_n++;
  if (slot >= 0) { /* else unregistered: never parked */
    cond_waiters[slot] = (struct cond_waiter){c, self_tid(), 0, NULL, 0, PARK_WAITING, long_wait};
    my_cond_slot = slot;
    if (long_wait) {
      /* Looked at from LS_SERIAL_COND_LOOK_NS on, by the thread next in
       * line, which slept expecting LS_SERIAL_LOOK_NS: woken to look sooner. */
      uint64_t soon = now_ns() + LS_SERIAL_COND_LOOK_NS;
      if (exec_next_look_ns > soon) exec_next_look_ns = soon;
      wake_next_in_line();
    }
  }
  mu_unlock();
}

void serial_cond_leave(pthread_mutex_t* m) {
  if (my_cond_slot < 0) return;
  int saved = errno;
  pthread_mutex_lock(&mu);
  struct cond_waiter* w = &cond_waiters[my_cond_slot];
  pid_t me = self_tid();
  int unlocked = 0;
  while (w->state != PARK_WAITING) { /* let go meanwhile: the turn first */
    grant_owed();
    if (w->state == PARK_GRANTED && exec_tid == me) break;
    if (w->state == PARK_GRANTED) { /* granted, and its time ran out before it came back */
      w->state = PARK_LET_GO;
      atomic_fetch_add(&parked_n, 1);
    }
    if (!exec_tid && w->state == PARK_LET_GO) { /* woken unsignalled: the free turn */
      atomic_fetch_sub(&parked_n, 1);
      exec_tid = me;
      exec_conn = w->conn;
      break;
    }
    if (exec_tid) holder_holds(0); /* a holder asleep on what we hold is let go too */
    if (exec_tid == me || !exec_tid) continue;
    if (!unlocked) {
      unlocked = 1;
      pthread_mutex_unlock(m); /* the holder may need it */
    }
    uint32_t seen = atomic_load(&turn_futex);
    turn_waiters++;
    mu_unlock();
    struct timespec look = {0, (long)LS_SERIAL_LOOK_NS};
    syscall(SYS_futex, (uint32_t*)&turn_futex, FUTEX_WAIT_PRIVATE, seen, &look, NULL, 0);
    pthread_mutex_lock(&mu);
    turn_waiters--;
  }
  if (w->state != PARK_WAITING) { /* it holds the turn again, from now */
    exec_proc_tid = self_proc_tid();
    exec_since_ns = now_ns();
    exec_next_look_ns = 0;
    exec_asleep = 0;
  }
  w->cond = NULL;
  while (cond_waiters_n && !cond_waiters[cond_waiters_n - 1].cond) cond_waiters_n--;
  my_cond_slot = -1;
  mu_unlock();
  if (unlocked) pthread_mutex_lock(m);
  errno = saved;
}

/* c was signalled (all = 0) or broadcast: the parked threads waiting on it
 * are owed the turn, in the order they were let go; for a signal, the one
 * let go first. (InnoDB's lock waits have a condition variable each. Where
 * several threads wait on one, a signal may wake another than the one made
 * owed; that one, granted the turn and still asleep, is let go again at
 * the next looks.) */
static void cond_signalled(pthread_cond_t* c, int all) {
  int saved = errno;
  pthread_mutex_lock(&mu);
  for (;;) {
    struct cond_waiter* first = NULL;
    for (int i = 0; i < cond_waiters_n; i++) {
      struct cond_waiter* w = &cond_waiters[i];
      if (w->cond == c && w->state == PARK_LET_GO && (!first || w->order < first->order)) first = w;
    }
    if (!first) break;
    first->state = PARK_OWED;
    first->order = ++park_order;
    if (!all) break;
  }
  mu_unlock();
  errno = saved;
}

int pthread_cond_signal(pthread_cond_t* c) {
  static int (*real)(pthread_cond_t*);
  if (!real)
    real = (int (*)(pthread_cond_t*))dlvsym(RTLD_NEXT, "pthread_cond_signal", "GLIBC_2.3.2");
  if (atomic_load_explicit(&parked_n, memory_order_relaxed)) cond_signalled(c, 0);
  return real(c);
}

int pthread_cond_broadcast(pthread_cond_t* c) {
  static int (*real)(pthread_cond_t*);
  if (!real)
    real = (int (*)(pthread_cond_t*))dlvsym(RTLD_NEXT, "pthread_cond_broadcast", "GLIBC_2.3.2");
  if (atomic_load_explicit(&parked_n, memory_order_relaxed)) cond_signalled(c, 1);
  return real(c);
}

int pthread_cond_wait(pthread_cond_t* c, pthread_mutex_t* m) {
  static int (*real)(pthread_cond_t*, pthread_mutex_t*);
  if (!real)
    real = (int (*)(pthread_cond_t*, pthread_mutex_t*))dlvsym(RTLD_NEXT, "pthread_cond_wait",
                                                              "GLIBC_2.3.2");
  serial_cond_enter(c, 1);
  int r = real(c, m);
  serial_cond_leave(m);
  return r;
}

/* A timed wait's real deadline (on clock id) lies LS_SERIAL_LONG_WAIT_NS
 * or more away. */
static int waits_long(clockid_t id, const struct timespec* deadline) {
  if (!deadline || (id != CLOCK_MONOTONIC && id != CLOCK_REALTIME) || deadline->tv_sec < 0)
    return 0; /* no deadline: the call fails (EINVAL), no wait */
  uint64_t at = (uint64_t)deadline->tv_sec * 1000000000ull + (uint64_t)deadline->tv_nsec;
  uint64_t now = id == CLOCK_MONOTONIC ? now_ns() : real_wall_ns();
  return at > now && at - now >= LS_SERIAL_LONG_WAIT_NS;
}

/* The timed waits: their deadline as shim_clock.c reads it (clk_deadline). */
static int (*real_pthread_cond_timedwait)(pthread_cond_t*, pthread_mutex_t*,
                                          const struct timespec*);
static int (*real_pthread_cond_clockwait)(pthread_cond_t*, pthread_mutex_t*, clockid_t,
                                          const struct timespec*);

int pthread_cond_timedwait(pthread_cond_t* restrict c, pthread_mutex_t* restrict m,
                           const struct timespec* restrict abs) {
  /* The current version: the real one under the same name is glibc's old
   * (2.2.5) condition variable, which would misread ours. */
  if (!real_pthread_cond_timedwait)
    real_pthread_cond_timedwait = dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
  struct timespec d;
  clockid_t id = cond_is_monotonic(c) ? CLOCK_MONOTONIC : CLOCK_REALTIME;
  const struct timespec* deadline = clk_deadline(id, abs, &d);
  serial_cond_enter(c, waits_long(id, deadline));
  int r = real_pthread_cond_timedwait(c, m, deadline);
  serial_cond_leave(m);
  return r;
}

int pthread_cond_clockwait(pthread_cond_t* c, pthread_mutex_t* m, clockid_t id,
                           const struct timespec* abs) {
  LS_REAL(pthread_cond_clockwait);
  struct timespec d;
  const struct timespec* deadline = clk_deadline(id, abs, &d);
  serial_cond_enter(c, waits_long(id, deadline));
  int r = real_pthread_cond_clockwait(c, m, id, deadline);
  serial_cond_leave(m);
  return r;
}

void serial_begin(struct conn* c) {
  if (!serial_on) return;
  exec_tid = self_tid();
  /* With serial_sleep_keeps the holder is never looked at. */
  exec_proc_tid = serial_sleep_keeps ? 0 : self_proc_tid();
  exec_conn = c;
  exec_since_ns = now_ns();
  exec_next_look_ns = 0;
  exec_asleep = 0;
  uint64_t at = serial_reply && c->fd >= 0 ? out_offset(c->fd) : UINT64_MAX;
  atomic_store(&exec_fd, -1);
  if (at == UINT64_MAX) return; /* outputs not hashed: the thread's rules */
  atomic_store(&exec_replied, 0);
  atomic_store(&exec_out_at, at);
  atomic_store(&exec_fd, c->fd);
  if (out_offset(c->fd) > at) atomic_store(&exec_replied, 1); /* it replied meanwhile */
}

/* Threads waiting in poll, ppoll, select or a blocking read. They all
 * watch the daemon's eventfd, which is level-triggered for them and read by
 * the first that wakes: a thread that came later to it would find it empty
 * and sleep on. So each also watches an eventfd of its own, registered here
 * with the connection it waits for while it sleeps; whoever took the
 * daemon's wake-up passes it on to the waiters whose connection became
 * readable (waiters_relay), and serial_done wakes just the thread whose turn
 * it is. The eventfd goes back to a pool when its thread exits (below). */
struct waiter {
  struct conn* c;     /* what it waits for (NULL: several, or none) */
  int efd;            /* -1: a free slot */
  int wake_when_next; /* woken once c's input is next in line (waiter_enter) */
  pid_t tid;
  pid_t proc_pid, proc_tid; /* its numbers in /proc when it registered (0: unknown) */
};
static struct waiter waiters[256];
static int waiters_n;
static __thread int my_efd = -1;
static __thread int my_waiter = -1;
/* This thread's numbers in /proc, asked once (a readlink) and again when
 * the server's number there changed: a restored server's threads have new
 * ones (self_proc_tid). */
static __thread pid_t my_proc_pid, my_proc_tid;
static pthread_key_t efd_key;
static pthread_once_t efd_once = PTHREAD_ONCE_INIT;
/* A thread's eventfd outlives it: it goes back to this pool when the thread
 * exits and to the next thread that waits, never closed. Its wake-ups are
 * written after mu is let go (wake_after_unlock), so one may land after its
 * thread left: on an eventfd, a stray wake-up (the next owner looks again),
 * where on a closed fd number it could have been 8 bytes written into a file
 * the server opened meanwhile. At most LS_EFDS_MAX are made: a thread that finds
 * none is an unregistered waiter (woken by the watcher and its timeouts). */
#define LS_EFDS_MAX 1024
static int efds_free[LS_EFDS_MAX];
static int efds_free_n, efds_made;

static void efd_at_thread_exit(void* arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  waiter_leave();
  if (my_efd >= 0) {
    eventfd_t stale;
    (void)eventfd_read(my_efd, &stale); /* its next owner starts quiet */
    efds_free[efds_free_n++] = my_efd;  /* room: at most efds_made are out */
  }
  my_efd = -1;
  mu_unlock();
}
static void efd_key_init(void) {
  (void)pthread_key_create(&efd_key, efd_at_thread_exit);
}

int waiter_enter(struct conn* c, int wake_when_next) {
  if (my_efd < 0) {
    pthread_once(&efd_once, efd_key_init);
    if (efds_free_n) {
      my_efd = efds_free[--efds_free_n];
    } else {
      if (efds_made == LS_EFDS_MAX) return -1;
      my_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (my_efd < 0) return -1;
      efds_made++;
    }
    (void)pthread_setspecific(efd_key, (void*)1);
  }
  int slot = -1;
  for (int i = 0; i < waiters_n && slot < 0; i++)
    if (waiters[i].efd < 0) slot = i;
  if (slot < 0) {
    if (waiters_n == (int)(sizeof waiters / sizeof *waiters)) return my_efd; /* unregistered */
    slot = waiters_n++;
  }
  if (!my_proc_tid || (proc_pid_seen && my_proc_pid != proc_pid_seen))
    my_proc_tid = self_proc_ids(&my_proc_pid);
  waiters[slot] = (struct waiter){c, my_efd, wake_when_next, self_tid(), my_proc_pid, my_proc_tid};
  my_waiter = slot;
  return my_efd;
}

/* The thread (its numbers in /proc) is a registered waiter. mu held. */
static int in_shim_wait(pid_t proc_pid, pid_t proc_tid) {
  if (!proc_pid) return 0;
  for (int i = 0; i < waiters_n; i++)
    if (waiters[i].efd >= 0 && waiters[i].proc_tid == proc_tid && waiters[i].proc_pid == proc_pid)
      return 1;
  return 0;
}

/* The daemon's eventfd is level-triggered: every thread that polls it
 * wakes at each write, and all but the one that reads it go back to sleep
 * (16 MariaDB threads: five sleeps per statement, most of them this herd,
 * each a context switch). So one sleeping waiter at a time, the watcher,
 * polls it; the others poll their own eventfd and their connection, and
 * the watcher, having read a wake-up, relays it (waiters_relay) as any
 * thread that read it did. A watcher going back to the server makes
 * another waiter the watcher and wakes it (its eventfd): woken, that one
 * either sleeps again, now polling the daemon's eventfd (whose count waits
 * for it, level-triggered), or goes back to the server and hands the watch
 * on in turn. So while a waiter sleeps, one watches or is about to. */
static int watcher = -1;           /* waiters[] slot of the watcher; -1: none */
static __thread int watch_handoff; /* this thread watched, and left without a successor */

int wake_watch_claim(void) {
  if (my_waiter < 0) return 1; /* unregistered: nobody could hand it the watch */
  if (watcher >= 0) return watcher == my_waiter;
  watcher = my_waiter;
  watch_handoff = 0;
  return 1;
}

void wake_watch_leave(void) {
  if (!watch_handoff) return;
  watch_handoff = 0;
  if (watcher >= 0) return; /* another took it meanwhile */
  for (int i = 0; i < waiters_n; i++)
    if (waiters[i].efd >= 0 && i != my_waiter) {
      watcher = i;
      wake_after_unlock(waiters[i].efd);
      return;
    }
}

void waiter_leave(void) {
  if (my_waiter < 0) return;
  if (watcher == my_waiter) {
    watcher = -1;
    watch_handoff = 1;
  }
  waiters[my_waiter].efd = -1;
  waiters[my_waiter].c = NULL;
  while (waiters_n && waiters[waiters_n - 1].efd < 0) waiters_n--;
  my_waiter = -1;
}

void waiter_took_wake(void) {
  if (my_efd >= 0) {
    eventfd_t v;
    (void)eventfd_read(my_efd, &v);
  }
}

void waiters_relay(void) {
  for (int i = 0; i < waiters_n; i++) {
    struct waiter* w = &waiters[i];
    if (w->efd < 0 || i == my_waiter) continue;
    /* The next in line too, once, while another holds the turn: it slept
     * as one whose input was not yet agreed, and looks at the holder
     * (serial_holding 2) from now on. Only once: a thread woken at every
     * relay shows as running to every look at the holder, which then never
     * counts the holder asleep (another_thread_runs), and blocking reads
     * (wake_when_next 0) look at each of their own wake-ups. */
    int next = w->wake_when_next && w->c && serial_holding(w->c, -1) == 2;
    if (next) w->wake_when_next = 0;
    /* A replay connection whose ordered bytes are still on their way: its
     * wait left the kernel's input out (replay_owes_nothing when it went to
     * sleep) and would not hear them arrive; woken, it waits for them. */
    int bytes_due = w->c && w->c->epfd < 0 && replay_bytes_due(w->c);
    if (!w->c || next || bytes_due || ready(w->c)) wake_after_unlock(w->efd);
  }
}

static int wake_waiter_of(const struct conn* c) {
  for (int i = 0; i < waiters_n; i++)
    if (waiters[i].efd >= 0 && waiters[i].c == c) {
      wake_after_unlock(waiters[i].efd);
      return 1;
    }
  return 0;
}

int serial_holding(const struct conn* c, int epfd) {
  if (!serial_on || !exec_tid) return 0;
  for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count; s++) {
    struct chunk* ch = fifo_at(s);
    if (chunk_finished(ch) || ch->kind == LS_SUB_ACCEPT) continue;
    if (ch->state != CH_COMMITTED || ch->c == exec_conn) return 1;
    return (c ? ch->c == c : epfd >= 0 && ch->c->epfd == epfd) ? 2 : 1;
  }
  return 1;
}

/* The next agreed input may be another thread's to read: wake the one
 * waiting for it (in its connection's epoll set, or in poll or read), not
 * every thread; for a connection in no set and no waiter, everyone through
 * the daemon's eventfd. mu held. */
static void wake_next_turn(int my_epfd) {
  for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count; s++) {
    struct chunk* ch = fifo_at(s);
    if (chunk_finished(ch) || ch->kind == LS_SUB_ACCEPT) continue;
    if (ch->state != CH_COMMITTED) return; /* its completion wakes the server */
    int epfd = ch->c->epfd;
    if (epfd == my_epfd && epfd >= 0) return; /* this thread looks itself */
    if (wake_waiter_of(ch->c)) return;        /* a thread in poll or read */
    int fd = epfd >= 0 && epfd < LS_MAX_FD ? set_wake_fd[epfd] - 1 : -1;
    (void)eventfd_write(fd >= 0 ? fd : wake_server_fd, 1);
    return;
  }
}

/* The thread whose connection's input is next after the holder's, if it
 * waits in poll or read (a thread in epoll looks every LS_SERIAL_LOOK_NS).
 * mu held. */
static void wake_next_in_line(void) {
  for (uint64_t s = fifo_head_seq; s < fifo_head_seq + fifo_count; s++) {
    struct chunk* ch = fifo_at(s);
    if (chunk_finished(ch) || ch->kind == LS_SUB_ACCEPT || ch->c == exec_conn) continue;
    if (ch->state == CH_COMMITTED) (void)wake_waiter_of(ch->c);
    return;
  }
}

void serial_done(int my_epfd) {
  if (!serial_on || !exec_tid) return;
  if (atomic_load(&exec_fd) >= 0) { /* until the reply: whoever waits, when it came */
    if (!atomic_load(&exec_replied)) return;
  } else if (exec_tid != self_tid()) {
    return;
  }
  turn_next(my_epfd);
}

void serial_closed(const struct conn* c) {
  if (serial_on && c == exec_conn) turn_next(-1);
}
