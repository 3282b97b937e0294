"""eval/attacker.py — a hostile process on the clients' network, for the fault runs
(eval/faults.py, kind `attacker`; issue 27). For as long as it runs, over and over:

  privileged   from a source port below 1024 (once the rule for "inspectors"), a SET of a
               key of its own to each backup's server port
  scan         the same from ordinary ports (a replay connection's slot was once taken by
               whoever came first from a port the daemon had marked)
  replay       the bytes a TLS client sent to a daemon's client port (its ClientHello and
               a record after the handshake), sent again on fresh connections

A backup's server must answer none of it: the shim admits only the daemon's replay and
inspection sockets there, and a daemon only a TLS session it made itself. Every reply
a backup's server gives is counted as served (the run's problem); the keys it writes
are ATTACK_PREFIX* and must be on no replica at the end (the run checks that its
replicas hold the same keys; final_state counts them). Bounded: it stops when told,
and sends at most MAX_TRIES attempts of each kind a second.
"""

from __future__ import annotations

import random
import socket
import ssl
import threading

ATTACK_PREFIX = "attack-"
MAX_TRIES = 20  # of each kind, per round; a round every 0.1 s at most
REPLY_WAIT_S = 0.2


def resp_set(key: str, value: str) -> bytes:
    parts = [b"SET", key.encode(), value.encode()]
    return b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class Attacker:
    """Runs in the client namespace (start() on a thread that is in it: run_in_netns)."""

    def __init__(self, backups, daemons, seed):
        # backups: [(replica, host, server_port)] of the replicas that did not lead when
        # it started; daemons: [(host, client_port)] whose TLS it records and replays.
        self.backups, self.daemons = backups, daemons
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.thread = None
        self.tries = {"privileged": 0, "scan": 0, "replay": 0}
        # (replica, what) a backup's server answered: the run's problems
        self.served: list[tuple[int, str]] = []
        self.records: list[bytes] = []

    def start(self):
        self.records = [self.record_tls(h, p) for h, p in self.daemons]
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def stop(self):
        self.stop_event.set()
        if self.thread:
            self.thread.join(10)

    # ------------------------------------------------------------- the attacks
    def loop(self):
        n = 0
        while not self.stop_event.is_set():
            for _ in range(MAX_TRIES // 4):
                replica, host, port = self.rng.choice(self.backups)
                key = f"{ATTACK_PREFIX}{n}"
                n += 1
                self.attempt("privileged", replica, host, port, key, self.rng.randint(600, 1023))
                self.attempt("scan", replica, host, port, key, 0)
                self.replay()
            self.stop_event.wait(0.1)

    def attempt(self, kind, replica, host, port, key, source_port):
        self.tries[kind] += 1
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.settimeout(REPLY_WAIT_S)
        try:
            if source_port:
                s.bind(("", source_port))
            s.connect((host, port))
            s.sendall(resp_set(key, "pwned"))
            got = s.recv(64)
            if got:
                what = f"replica {replica}'s server at {host}:{port} answered a {kind} SET {key}"
                self.served.append((replica, f"{what}: {got[:40]!r}"))
        except OSError:
            pass  # refused, reset, closed or silent: as it must be
        finally:
            s.close()

    def record_tls(self, host, port):
        """The bytes a TLS client sends to (host, port) in a handshake and one record after
        it (no certificate checked: an attacker has none of the cluster's)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(incoming, outgoing)
        sent = b""
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                for _ in range(20):
                    try:
                        tls.do_handshake()
                        break
                    except ssl.SSLWantReadError:
                        out = outgoing.read()
                        sent += out
                        s.sendall(out)
                        got = s.recv(65536)
                        if not got:
                            break
                        incoming.write(got)
                tls.write(b"\x08\x00\x00\x00\x01client\x00\x00")  # a HELLO-shaped frame
                out = outgoing.read()
                sent += out
                s.sendall(out)
        except (OSError, ssl.SSLError):
            pass
        return sent

    def replay(self):
        if not self.records:
            return
        i = self.rng.randrange(len(self.records))
        host, port = self.daemons[i]
        self.tries["replay"] += 1
        try:
            with socket.create_connection((host, port), timeout=REPLY_WAIT_S) as s:
                s.sendall(self.records[i])
                s.recv(4096)  # the daemon's ServerHello, an alert, or nothing: never a WELCOME
        except OSError:
            pass
