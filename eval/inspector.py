"""Connections that inspect a replica's own server (DEBUG DIGEST, DBSIZE,
CHECKSUM TABLE), shared by the harness (eval/) and the tests (tests/).

A replica that does not lead closes every client connection its server
accepts, unless it is an inspection its daemon opened: served, a client
holding a stale leader address would have its writes acknowledged and never
agreed. So every inspection goes through `lockstep inspect` (the admin
credential, over the replica's TLS client port; guard/server/inspection.h),
which finds the replica by the server address the caller names:

- `connect(addr)`: a socket whose other end is `lockstep inspect --id N`'s
  stdin and stdout (our own clients: resp.py's Redis and Memcached take
  `inspect=True`);
- `Relay(addr)`: a local listener (`lockstep inspect --id N --listen 0`)
  whose every connection is an inspection, for a program that connects by
  itself (the mariadb and ldapsearch clients, redis-cli).

The replica is found among the running `lockstep replica` processes (their
--config and --id): the one whose server_addr is addr. An address no
replica serves is connected to directly (a plain server of a baseline).
What an inspection may send is the profile's to say (`inspect_commands`:
redis's is read-only); on a backup nothing it sends is replicated.
"""

import os
import select
import socket
import subprocess
import tomllib
from pathlib import Path


def _replicas():
    """(lockstep binary, config path, id) of every running replica daemon."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in argv if a]
        if len(argv) < 6 or not argv[0].endswith("lockstep") or argv[1] != "replica":
            continue
        try:
            config = argv[argv.index("--config") + 1]
            rid = int(argv[argv.index("--id") + 1])
        except (ValueError, IndexError):
            continue
        found.append((argv[0], config, rid))
    return found


def locate(addr):
    """(lockstep binary, config path, replica id) of the replica whose
    server is at addr=(host, port); None when no running replica's is."""
    host, port = addr[0], int(addr[1])
    for binary, config, rid in _replicas():
        try:
            replicas = tomllib.loads(Path(config).read_text()).get("replica", [])
        except (OSError, tomllib.TOMLDecodeError):
            continue
        for r in replicas:
            if r.get("id", -1) == rid and r.get("server_port") == port and r.get("host") == host:
                return binary, config, rid
    return None


def _command(where, *extra):
    binary, config, rid = where
    return [binary, "inspect", "--config", config, "--id", str(rid), *extra]


def connect(addr, timeout=10.0):
    """A socket connected to the server at addr=(host, port) through
    `lockstep inspect`. Raises ConnectionRefusedError when the inspection is
    refused (no server running there now, no admin secret), as a refused
    connect would."""
    where = locate(addr)
    if where is None:
        return socket.create_connection(addr, timeout)
    ours, theirs = socket.socketpair()
    # The child inherits `theirs` as its stdin and stdout; it exits once the
    # server's side ends (we close `ours`, it tells the daemon, the server
    # closes), and Python reaps it at a later Popen.
    proc = subprocess.Popen(
        _command(where), stdin=theirs, stdout=theirs, stderr=subprocess.PIPE, close_fds=True
    )
    theirs.close()
    # Its first line on stderr says whether the inspection is open.
    ready, _, _ = select.select([proc.stderr], [], [], timeout + 10)
    line = proc.stderr.readline().decode(errors="replace") if ready else ""
    proc.stderr.close()
    if "'s server: " not in line:
        ours.close()
        if not ready:
            proc.kill()
        proc.wait()
        raise ConnectionRefusedError(line.strip() or f"lockstep inspect of {addr}: no answer")
    ours.settimeout(timeout)
    return ours


class Relay:
    """A local listener whose connections are inspections of the server at
    addr, for a client program that connects by itself:

        with Relay(addr) as local:
            subprocess.run(["mariadb", "-h", local[0], "-P", str(local[1]), ...])

    A `lockstep inspect --listen 0` of its own, on 127.0.0.1 in the
    caller's network namespace, until the block ends. An address no replica
    serves is handed back as it is."""

    def __init__(self, addr, timeout=30.0):
        self.target = addr
        self.timeout = timeout
        self.proc = None

    def __enter__(self):
        where = locate(self.target)
        if where is None:
            return tuple(self.target)
        self.proc = subprocess.Popen(
            _command(where, "--listen", "0"), stdout=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()  # "listening on 127.0.0.1:PORT"
        if not line.startswith("listening on "):
            self.proc.kill()
            self.proc.wait()
            raise OSError(f"lockstep inspect --listen did not start: {line!r}")
        host, port = line.split()[-1].rsplit(":", 1)
        return host, int(port)

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc.stdout.close()
