"""A client of ClamAV clamd's INSTREAM command, for tests and benchmarks.

clamd speaks a line protocol over TCP: a command prefixed by 'z' ends in a
NUL and so does its reply. INSTREAM sends the bytes to scan as chunks, each a
4-byte big-endian length and the data, ended by a chunk of length 0; clamd
answers 'stream: OK' or 'stream: NAME FOUND'. In a session (IDSESSION) the
connection stays open for many commands, and each reply starts with the
command's number in the session ('3: stream: OK').
"""

import socket
import struct

# apps/clamd/lockstep.ndb's one signature: a buffer holding this is "infected".
TEST_SIGNATURE = b"LOCKSTEP-TEST-SIGNATURE-7f3a9c"
CHUNK = 64 * 1024


class Clamd:
    def __init__(self, addr, session=True, timeout=30.0):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.session = session
        self.buf = b""
        self.count = 0
        if session:
            self.sock.sendall(b"zIDSESSION\0")

    def reply(self):
        while b"\0" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"clamd closed the connection (had {self.buf!r})")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\0")
        return line.decode(errors="replace")

    def command(self, name):
        """Sends a command such as PING or VERSION; returns its reply."""
        self.sock.sendall(b"z" + name.encode() + b"\0")
        return self.strip(self.reply())

    def scan(self, data):
        """INSTREAM: returns clamd's verdict without the session number."""
        parts = [b"zINSTREAM\0"]
        for i in range(0, len(data), CHUNK):
            piece = data[i : i + CHUNK]
            parts += [struct.pack(">I", len(piece)), piece]
        parts.append(struct.pack(">I", 0))
        self.sock.sendall(b"".join(parts))
        return self.strip(self.reply())

    def strip(self, line):
        if not self.session:
            return line
        self.count += 1
        number, sep, rest = line.partition(": ")
        assert sep and number == str(self.count), f"reply {line!r} to command {self.count}"
        return rest

    def close(self):
        try:
            if self.session:
                self.sock.sendall(b"zEND\0")
        except OSError:
            pass
        self.sock.close()


def infected(size, seed):
    """A buffer of `size` bytes with the test signature in its middle."""
    data = bytearray(clean(size, seed))
    mid = max(0, size // 2 - len(TEST_SIGNATURE) // 2)
    data[mid : mid + len(TEST_SIGNATURE)] = TEST_SIGNATURE
    return bytes(data)


def clean(size, seed):
    """`size` bytes that vary with seed and carry no signature."""
    block = struct.pack(">Q", seed * 2654435761 % (1 << 64)) * 8
    return (block * (size // len(block) + 1))[:size]
