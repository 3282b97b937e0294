/* shim_serial.h — serial_inputs and the wake-ups of waiting threads
 * (shim_serial.c). Above shim_state.h, shim_clock.h, shim_order.h and
 * shim_output.h (README.md, "Layers"). */
#ifndef LOCKSTEP_SHIM_SERIAL_H
#define LOCKSTEP_SHIM_SERIAL_H

#include <pthread.h>
#include <stdint.h>

#include "preload/shim_state.h"

/* serial_inputs (shim_serial.c); mu held, except serial_init. serial_done:
 * the calling thread has finished the input it read, if it read one. */
LS_HIDDEN void serial_init(int flags); /* LOCKSTEP_SHIM_SERIAL: ls_serial_flag */
LS_HIDDEN int serial_enabled(void);    /* serial_inputs is on */
/* Without mu, from the send wrappers (hooks.output_reached, set by shim.c):
 * the server's output on fd reached `end`. */
LS_HIDDEN void serial_sent(int fd, uint64_t end);
/* Not c's turn: another input runs (asked through hooks.executing_other). */
LS_HIDDEN int executing_other(const struct conn* c);
LS_HIDDEN void serial_begin(struct conn* c);        /* this thread read an input of c */
LS_HIDDEN void serial_closed(const struct conn* c); /* the server closed c */
LS_HIDDEN void serial_done(int my_epfd);            /* my_epfd: the set it waits in next, or -1 */
/* Around each wait of the server's on a condition variable (the
 * pthread_cond_* wrappers in shim_serial.c): a holder let go while it waits takes the turn back
 * before it returns (shim_serial.c, "Condition variables"). Not under mu. */
LS_HIDDEN void serial_cond_enter(pthread_cond_t* c, int long_wait);
LS_HIDDEN void serial_cond_leave(pthread_mutex_t* m);
/* A thread about to sleep in poll/select/read registers its own eventfd
 * (returned; -1 if none) with the connection it waits for (shim_serial.c,
 * "Threads waiting"); it takes its wake-up, leaves, and relays the daemon's
 * wake-up to the others when it was the one that read it. wake_when_next:
 * it sleeps without looking at the holder (poll_tracked, serial_holding 1),
 * so the relay wakes it once its input is next in line. mu held, except
 * waiter_took_wake. */
LS_HIDDEN int waiter_enter(struct conn* c, int wake_when_next);
LS_HIDDEN void waiter_leave(void);
LS_HIDDEN void waiter_took_wake(void);
LS_HIDDEN void waiters_relay(void);
/* After waiter_enter: 1 if this thread is to poll the daemon's eventfd (it
 * watches for everyone, shim_serial.c "The daemon's eventfd"); before a
 * waiting thread goes back to the server: hands the watch on if it held it.
 * mu held. */
LS_HIDDEN int wake_watch_claim(void);
LS_HIDDEN void wake_watch_leave(void);
/* How long one input may hold the next connection's back (shim_serial.c). */
#define LS_SERIAL_EXEC_NS 5000000000ull
/* How often (and how soon) the executing thread's state is looked at. */
#define LS_SERIAL_LOOK_NS 1000000ull
/* ... once it waits on a condition variable for long (untimed, or for
 * LS_SERIAL_LONG_WAIT_NS or more: an InnoDB row lock, whose wait times out
 * after 50 s; every input waits behind it until it is let go, 2 looks). */
#define LS_SERIAL_COND_LOOK_NS 100000ull
#define LS_SERIAL_LONG_WAIT_NS 1000000000ull
/* How soon the thread next in line looks at the holder again (serial_holding
 * 2): LS_SERIAL_COND_LOOK_NS while the holder waits on a condition
 * variable for long, else LS_SERIAL_LOOK_NS. mu held. */
LS_HIDDEN uint64_t serial_look_ns(void);
/* How long a holder asleep on anything but a condition variable (a latch,
 * a futex of the server's own) keeps the turn (shim_serial.c, holder_holds). */
#define LS_SERIAL_ASLEEP_ELSEWHERE_NS 100000000ull
/* 0: no thread holds an input (serial_inputs); 2: one does and the next
 * agreed input is c's (or, with c NULL, that of a connection in epoll set
 * epfd): the thread waiting for it looks again every LS_SERIAL_LOOK_NS, to
 * notice the holder asleep (shim_serial.c, executing_other); 1: one does,
 * and the others sleep until woken: by the turn handed to them
 * (wake_next_turn), or, when a completion makes them next in line, by the
 * relay (waiters_relay; epoll sets all hear every completion). Looking
 * every 5 ms besides cost 16 MariaDB threads a wake-up each, 3000 a second.
 * mu held. */
LS_HIDDEN int serial_holding(const struct conn* c, int epfd);

#endif
