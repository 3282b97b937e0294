"""A line server that answers with what it drew at its start-up, for
tests/test_cloned_start.py: values no libc call of the shim's agrees (the
monotonic clock read before any input, Python's own generator seeded then,
where its allocator put an object), so two servers started apart answer
differently, and two restores of one image answer alike.

    python3 tests/start_draw_server.py HOST PORT
    python3 tests/start_draw_server.py --ask HOST PORT REQUEST   (a client: prints the answer)

Requests, one per line: `start` answers the start-up draws; `next` the
generator's next number (its state moves with each, in the log's order);
`store` draws one and keeps it, answering only `OK` (a difference no reply
shows); `store-now` keeps the monotonic clock's reading of now instead
(different on every replica and in every replay, clone or not); `digest`
answers a digest of what was stored (the state probe of
tests/test_state_check.py); anything else answers `?`.
"""

import hashlib
import random
import selectors
import socket
import sys
import time

START = f"{time.monotonic_ns()} {random.getrandbits(64)} {id(object()):x}".encode()
stored = []


def answer(line):
    if line == b"start":
        return START + b"\n"
    if line == b"next":
        return b"%d\n" % random.getrandbits(64)
    if line == b"store":
        stored.append(random.getrandbits(64))
        return b"OK\n"
    if line == b"store-now":
        stored.append(time.monotonic_ns())
        return b"OK\n"
    if line == b"digest":
        return hashlib.sha1(repr(stored).encode()).hexdigest().encode() + b"\n"
    return b"?\n"


def ask(host, port, request):
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request.encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                sys.exit(f"{host}:{port} closed the connection")
            buf += chunk
    print(buf.decode().strip())


def main():
    if sys.argv[1] == "--ask":
        return ask(*sys.argv[2:5])
    host, port = sys.argv[1], int(sys.argv[2])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(64)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()  # epoll, which the shim follows
    sel.register(listener, selectors.EVENT_READ)
    pending = {}
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(True)
                pending[conn] = b""
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(conn)
                del pending[conn]
                conn.close()
                continue
            buf = pending[conn] + data
            *lines, pending[conn] = buf.split(b"\n")
            for line in lines:
                conn.sendall(answer(line.strip()))


if __name__ == "__main__":
    main()
