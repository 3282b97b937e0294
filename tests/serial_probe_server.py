"""A thread-per-connection line server for tests/test_serial.py: each
request is executed by the thread that read it, and the server counts the
requests that began while another was still executing (from its read until
its reply is sent), which serial_inputs must never let happen.

    python3 tests/serial_probe_server.py PORT [busy]

Requests, one per line: `spin MS` keeps its thread busy on the CPU (running,
never asleep) for MS milliseconds and answers `done`; `sleep MS` sleeps in
the kernel for MS milliseconds (not on a condition variable) and answers
`done`; `overlaps` answers how many requests began while another executed.

With `busy`, a thread of the server's own, while a request executes, stays
on the CPU for 8 ms every 10 ms (for the server's first 10 minutes),
touching no state: every
other thread of a Python server waits for it on the interpreter's lock (a
condition variable) meanwhile, a request's thread among them, which only
that running thread, not any later input, ends.
"""

import signal
import socket
import sys
import threading
import time

lock = threading.Lock()
executing = 0
overlaps = 0
running = {}  # thread ident -> (name, request) of the requests executing
request_executes = threading.Event()  # for busy()


def execute(line):
    word, *args = line.split()
    if word == b"spin":
        end = time.monotonic() + int(args[0]) / 1000
        while time.monotonic() < end:
            pass
        return b"done\n"
    if word == b"sleep":
        time.sleep(int(args[0]) / 1000)
        return b"done\n"
    if word == b"overlaps":
        return b"%d\n" % overlaps
    return b"unknown request\n"


def serve(conn):
    """A request executes from its read until its reply is sent: its thread
    holds the input until it reads again."""
    global executing, overlaps
    with conn, conn.makefile("rb") as lines:
        for line in lines:
            with lock:
                if executing:
                    overlaps += 1
                    # The evidence, in the replica's server.log (never in a reply:
                    # replies are compared between replicas).
                    print(
                        f"overlap {overlaps}: {line!r} on {threading.current_thread().name} "
                        f"began while {sorted(running.values())} executed",
                        file=sys.stderr,
                        flush=True,
                    )
                executing += 1
                running[threading.get_ident()] = (threading.current_thread().name, line)
                request_executes.set()
            try:
                conn.sendall(execute(line))
            finally:
                with lock:
                    executing -= 1
                    running.pop(threading.get_ident(), None)
                    if not executing:
                        request_executes.clear()


def busy():
    end = time.monotonic() + 600
    while time.monotonic() < end:
        if not request_executes.wait(1):
            continue
        time.sleep(0.01)
        until = time.monotonic() + 0.008
        while time.monotonic() < until:
            pass


if sys.argv[2:] == ["busy"]:
    threading.Thread(target=busy, daemon=True).start()
# It runs as pid 1 of its own pid namespace, which ignores a signal it has no
# handler for: without this, stopping it takes the daemon's 3 s and a SIGKILL.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
