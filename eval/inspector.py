"""Connections that inspect a backup's own server (DEBUG DIGEST, DBSIZE,
CHECKSUM TABLE), shared by the harness (eval/) and the tests (tests/).

A replica that does not lead closes every client connection its server
accepts unless the peer's source port is at most LS_INSPECT_PORT_MAX (1023,
preload/shim_abi.h): served, a client holding a stale leader address would
have its writes acknowledged and never agreed. So an inspector connects from
a privileged port (binding one takes root, which the harness runs as):
`connect()` for our own clients (resp.py's Redis and Memcached take
`inspect=True`), `Relay` for a program that cannot choose its source port
(the mariadb and ldapsearch clients, redis-cli): it listens on a local port
and carries each connection to the server from a privileged one.

Closing sends a reset (SO_LINGER 0): a normal close would leave the port in
TIME_WAIT for a minute, and a polling check would soon run out of the few
hundred privileged ports.
"""

import errno
import random
import selectors
import socket
import struct
import threading

INSPECT_PORT_MAX = 1023  # preload/shim_abi.h LS_INSPECT_PORT_MAX
_FIRST_PORT = 512  # below: ports system services may bind


def connect(addr, timeout=10.0):
    """A TCP socket connected to addr=(host, port) from a source port in
    512..1023. Raises OSError as socket.create_connection would, or when no
    such port is free."""
    host, port = addr
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, sockaddr = infos[0]
    ports = list(range(_FIRST_PORT, INSPECT_PORT_MAX + 1))
    random.shuffle(ports)
    last = None
    for source in ports[:200]:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.settimeout(timeout)
        try:
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", source))
            s.connect(sockaddr)
            return s
        except OSError as e:
            s.close()
            if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise
            last = e
    raise OSError(f"no privileged source port free to inspect {host}:{port} ({last})")


class Relay:
    """A local listener whose connections reach addr from a privileged source
    port, for a client program that cannot choose its own:

        with Relay(addr) as local:
            subprocess.run(["mariadb", "-h", local[0], "-P", str(local[1]), ...])

    Bytes pass unchanged both ways; either side closing closes the pair. The
    listener lives in the caller's network namespace, on 127.0.0.1."""

    def __init__(self, addr, timeout=30.0):
        self.target = addr
        self.timeout = timeout
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.addr = self.listener.getsockname()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.addr

    def __exit__(self, *exc):
        self.stopping.set()
        self.listener.close()
        self.thread.join(timeout=5)

    def _serve(self):
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        peer_of = {}
        try:
            while not self.stopping.is_set():
                for key, _ in sel.select(timeout=0.2):
                    if key.fileobj is self.listener:
                        try:
                            local, _ = self.listener.accept()
                        except OSError:
                            continue
                        try:
                            remote = connect(self.target, timeout=self.timeout)
                        except OSError:
                            local.close()  # the program sees the server refuse
                            continue
                        for a, b in ((local, remote), (remote, local)):
                            peer_of[a] = b
                            sel.register(a, selectors.EVENT_READ)
                        continue
                    a = key.fileobj
                    b = peer_of.get(a)
                    try:
                        data = a.recv(1 << 16)
                        if data:
                            b.sendall(data)
                            continue
                    except OSError:
                        pass
                    for s in (a, b):  # either side closed: close the pair
                        if s in peer_of:
                            sel.unregister(s)
                            del peer_of[s]
                            s.close()
        except (OSError, ValueError):
            pass  # the listener closed under select: stopping
        finally:
            for s in list(peer_of):
                s.close()
            sel.close()
