"""Minimal clients for redis (RESP) and memcached (text protocol) over plain
sockets, shared by the benchmark harness (eval/) and the tests (tests/,
which put eval/ on their import path): no extra packages, and a test can
misbehave on purpose (half a command, then close)."""

import socket
import time

import inspector


class RespError(Exception):
    pass


class _Connection:
    """A TCP connection with a receive buffer. inspect=True connects through
    `lockstep inspect`, as a backup's server requires (inspector.py)."""

    def __init__(self, addr, timeout=10.0, inspect=False):
        if inspect:
            self.sock = inspector.connect(addr, timeout=timeout)
        else:
            self.sock = socket.create_connection(addr, timeout=timeout)
        if self.sock.family != socket.AF_UNIX:  # an inspection is a socket pair
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        self.sock.close()


class Redis(_Connection):
    @staticmethod
    def encode(*args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def _fill(self, deadline=None):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("reply timed out")
            self.sock.settimeout(left)
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def _line(self, deadline=None):
        while b"\r\n" not in self.buf:
            self._fill(deadline)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self, deadline=None):
        """The next reply; an error reply is returned as a RespError, not raised.
        With a deadline (time.monotonic()), TimeoutError once it passes."""
        line = self._line(deadline)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill(deadline)
            data, self.buf = self.buf[:n], self.buf[n + 2 :]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply(deadline) for _ in range(n)]
        raise RespError(f"bad reply line {line!r}")

    def call(self, *args):
        self.sock.sendall(self.encode(*args))
        r = self.reply()
        if isinstance(r, RespError):
            raise r
        return r

    def pipeline(self, commands):
        self.sock.sendall(b"".join(self.encode(*c) for c in commands))
        return [self.reply() for _ in commands]


class Memcached(_Connection):
    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def store(self, verb, key, value, cas=None):
        value = value if isinstance(value, bytes) else str(value).encode()
        extra = b" %d" % cas if cas is not None else b""
        head = b"%s %s 0 0 %d%s\r\n" % (verb.encode(), key.encode(), len(value), extra)
        self.sock.sendall(head + value + b"\r\n")
        return self._line().decode()

    def gets(self, key):
        """(value, cas) or (None, None)."""
        self.sock.sendall(b"gets %s\r\n" % key.encode())
        line = self._line()
        if line == b"END":
            return None, None
        parts = line.split()
        n, cas = int(parts[3]), int(parts[4])
        value = self._exact(n + 2)[:-2]
        assert self._line() == b"END"
        return value, cas

    def get(self, key):
        return self.gets(key)[0]

    def incr(self, key, by=1):
        self.sock.sendall(b"incr %s %d\r\n" % (key.encode(), by))
        return self._line().decode()

    def delete(self, key):
        self.sock.sendall(b"delete %s\r\n" % key.encode())
        return self._line().decode()
