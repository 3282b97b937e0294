"""A prefork echo server for tests/test_bad_input.py: it listens, forks two
worker processes that accept and answer clients, and waits. lockstep must
refuse it (its workers would serve clients unreplicated), never run it.

    python3 tests/prefork_server.py PORT
"""

import os
import socket
import sys

listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(16)
for _ in range(2):
    if os.fork() == 0:
        for _ in range(1000):  # bounded: a worker serves at most 1000 clients
            conn, _ = listener.accept()
            conn.sendall(b"echo:" + conn.recv(100))
            conn.close()
        os._exit(0)
os.wait()
