"""A server for tests/test_timers.py with a timer that its main thread
looks at whenever it wakes, the way an event loop does: the main thread
waits in epoll for connections with a 2 s timeout, and at every wake-up, a
new connection's or the timeout's, it fires its 0.2 s timer if the
monotonic clock has reached the timer's deadline (counting the firings).
Each connection has a thread of its own, which answers `fired` with the
count so far.

    python3 tests/tick_probe_server.py PORT

Under timers_in_log the 2 s timeout is a tick in the log and fires the
timer at the same input everywhere. A new connection wakes the main thread
whenever the kernel says so, which on a backup is whenever its daemon
replays the ACCEPT, at no fixed point of the other connections' inputs: a
firing there would count at another input on each replica.
"""

import select
import signal
import socket
import sys
import threading
import time

TIMER_S = 0.2
fired = 0


def serve(conn):
    with conn, conn.makefile("rb") as lines:
        for line in lines:
            conn.sendall(b"%d\n" % fired if line == b"fired\n" else b"?\n")


# It runs as pid 1 of its own pid namespace, which ignores a signal it has no
# handler for: without this, stopping it takes the daemon's 3 s and a SIGKILL.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
listener.setblocking(False)
ready = select.epoll()
ready.register(listener.fileno(), select.EPOLLIN)
deadline = time.monotonic() + TIMER_S
while True:
    events = ready.poll(2.0)
    now = time.monotonic()
    if now >= deadline:
        fired += 1
        deadline = now + TIMER_S
    if events:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            continue
        conn.setblocking(True)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
