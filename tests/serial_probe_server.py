"""A thread-per-connection line server for tests/test_serial.py: each
request is executed by the thread that read it, and the server counts the
requests that began while another was still executing, which serial_inputs
must never let happen.

    python3 tests/serial_probe_server.py PORT

Requests, one per line: `spin MS` keeps its thread busy on the CPU (running,
never asleep) for MS milliseconds and answers `done`; `sleep MS` sleeps in
the kernel for MS milliseconds (not on a condition variable) and answers
`done`; `overlaps` answers how many requests began while another executed.
"""

import socket
import sys
import threading
import time

lock = threading.Lock()
executing = 0
overlaps = 0


def execute(line):
    global executing, overlaps
    with lock:
        overlaps += executing > 0
        executing += 1
    try:
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
    finally:
        with lock:
            executing -= 1


def serve(conn):
    with conn, conn.makefile("rb") as lines:
        for line in lines:
            conn.sendall(execute(line))


listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
