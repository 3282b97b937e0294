"""Record a concurrent redis client history and check it for linearizability.

N client threads speak RESP over plain sockets to a redis address, each doing
random GET/SET (unique values, "c3-17") on a few keys and, optionally, GET/INCR
on counter keys, for a bounded time. Every op records its call and return time
(time.monotonic_ns). An op whose outcome the client never learned (timeout,
connection lost, an unexpected error reply) is recorded as "unknown": it may or
may not have taken effect. After a connection error the client asks the
caller's find_addr() where to connect next (in lockstep: the leader's
client_addr from `lockstep cluster status --json`) and carries on under a new
client id. The history is written as JSON and checked by build/bin/lincheck
(tools/lincheck, porcupine).

    w = Workload(find_addr, clients=8)
    w.start(); ...; w.stop()
    res = check(w.write(path))           # res.returncode == 0: linearizable

From the command line (the checker must be built: scripts/setup):

    python eval/history.py --addr 127.0.0.1:6379 --seconds 5
    python eval/history.py --dir /tmp/lockstep-cluster --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from resp import Redis, RespError

LINCHECK = ROOT / "build" / "bin" / "lincheck"
# The build the tests use (LOCKSTEP_BUILD, as tests/conftest.py), else build/.
LOCKSTEP = Path(os.environ.get("LOCKSTEP_BUILD", ROOT / "build")) / "bin" / "lockstep"

# INCR error replies that are a definite answer (the value is unchanged).
_DEFINITE_ERRORS = ("ERR value is not an integer", "ERR increment or decrement would overflow")


class Conn:
    """One RESP connection with a per-request deadline (eval/resp.py underneath)."""

    def __init__(self, addr: tuple[str, int], timeout: float):
        self.timeout = timeout
        self.redis = Redis(addr, timeout=timeout)

    def close(self):
        try:
            self.redis.close()
        except OSError:
            pass

    def request(self, *args: str):
        """Sends one command, returns its reply; raises OSError/TimeoutError/RespError."""
        deadline = time.monotonic() + self.timeout
        self.redis.sock.settimeout(self.timeout)
        self.redis.sock.sendall(Redis.encode(*args))
        return _text(self.redis.reply(deadline))


def _text(reply):
    """Bulk strings as text (latin-1, byte for byte); error replies raised."""
    if isinstance(reply, RespError):
        raise reply
    if isinstance(reply, bytes):
        return reply.decode("latin-1")
    if isinstance(reply, list):
        return [_text(r) for r in reply]
    return reply


def parse_addr(addr) -> tuple[str, int]:
    """'host:port', '[v6]:port' or (host, port) -> (host, port)."""
    if isinstance(addr, (tuple, list)):
        return str(addr[0]), int(addr[1])
    host, _, port = str(addr).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r} (want host:port)")
    return host.strip("[]"), int(port)


def run_lockstep(binary, *args, check=True, timeout=60, env=None):
    """`lockstep ARGS` (binary: the lockstep executable), its CompletedProcess in
    text mode; RuntimeError with its stderr when it fails and check is set."""
    p = subprocess.run(
        [str(binary), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )
    if check and p.returncode != 0:
        raise RuntimeError(f"lockstep {' '.join(map(str, args))}: {p.stderr.strip()}")
    return p


def lockstep_find_addr(directory, lockstep=LOCKSTEP, timeout=5.0):
    """A find_addr() for a lockstep cluster: the leader's client address, or None."""

    def find():
        p = subprocess.run(
            [str(lockstep), "cluster", "status", "--json", "--dir", str(directory)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if p.returncode != 0:
            return None
        s = json.loads(p.stdout)
        if s.get("client_addr"):
            return s["client_addr"]
        leader = s.get("leader")
        for r in s.get("replicas", []):
            if leader is not None and r.get("id") == leader and r.get("client_addr"):
                return r["client_addr"]
        return None

    return find


class _Resolver:
    """Shares find_addr() among the clients: at most one call per `every` seconds."""

    def __init__(self, find_addr, every=0.1):
        self.find_addr = find_addr
        self.every = every
        self.lock = threading.Lock()
        self.addr = None
        self.at = 0.0

    def get(self, stale=None):
        with self.lock:
            now = time.monotonic()
            if self.addr is not None and self.addr != stale:
                return self.addr
            if self.addr is not None and now - self.at < self.every:
                return self.addr
            try:
                a = self.find_addr()
                self.addr = parse_addr(a) if a else None
            except Exception:  # noqa: BLE001 - a failing lookup just means "not yet"
                self.addr = None
            self.at = time.monotonic()
            return self.addr


@dataclass
class Stats:
    ok: int = 0
    unknown: int = 0
    timeouts: int = 0
    conn_errors: int = 0
    error_replies: int = 0
    reconnects: int = 0
    by_op: dict = field(default_factory=dict)
    errors_seen: dict = field(default_factory=dict)


class Workload:
    """N client threads doing random GET/SET (and GET/INCR) until stopped."""

    def __init__(
        self,
        find_addr,
        clients=8,
        keys=("k0", "k1", "k2"),
        incr_keys=("n0",),
        timeout=1.0,
        max_ops=None,
        seed=None,
        think_s=0.0,
    ):
        self.resolver = _Resolver(find_addr)
        self.clients = clients
        self.keys = list(keys)
        self.incr_keys = list(incr_keys)
        self.timeout = timeout
        self.max_ops = max_ops  # per client thread
        # A pause between a client's ops: fewer ops per second keep a long history
        # checkable (porcupine's search grows fast with concurrent unknown writes).
        self.think_s = think_s
        self.rng = random.Random(seed)
        self.ops: list[dict] = []
        self.stats = Stats()
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self._next_client = clients
        self.last_known_return_ns = 0

    # --- running ---------------------------------------------------------
    def start(self):
        seeds = [self.rng.getrandbits(64) for _ in range(self.clients)]
        for i in range(self.clients):
            t = threading.Thread(target=self._client, args=(i, seeds[i]), daemon=True)
            self.threads.append(t)
            t.start()
        return self

    def stop(self, join_timeout=None):
        self.stop_event.set()
        for t in self.threads:
            t.join(join_timeout if join_timeout is not None else self.timeout * 3 + 5)
        if any(t.is_alive() for t in self.threads):
            raise RuntimeError("a client thread did not stop")
        return self

    def run_for(self, seconds: float):
        self.start()
        self.stop_event.wait(seconds)
        return self.stop()

    def known_since(self, t_ns: int) -> int:
        """How many ops completed with a known outcome after t_ns."""
        with self.lock:
            return sum(1 for o in self.ops if not o["unknown"] and o["return_ns"] > t_ns)

    def _new_client_id(self):
        with self.lock:
            c = self._next_client
            self._next_client += 1
            return c

    def _record(self, op: dict, outcome: str):
        with self.lock:
            self.ops.append(op)
            s = self.stats
            s.by_op[op["op"]] = s.by_op.get(op["op"], 0) + 1
            if op["unknown"]:
                s.unknown += 1
            else:
                s.ok += 1
                self.last_known_return_ns = max(self.last_known_return_ns, op["return_ns"])
            if outcome == "timeout":
                s.timeouts += 1
            elif outcome == "conn":
                s.conn_errors += 1
            elif outcome == "error":
                s.error_replies += 1

    def _connect(self, rng, stale):
        """Connects to wherever find_addr() says, until stopped. Returns (conn, addr)."""
        delay = 0.02
        while not self.stop_event.is_set():
            addr = self.resolver.get(stale)
            if addr is not None:
                try:
                    return Conn(addr, self.timeout), addr
                except OSError:
                    stale = addr
            self.stop_event.wait(delay * (0.5 + rng.random()))
            delay = min(delay * 2, 0.2)
        return None, None

    def _client(self, index: int, seed: int):
        rng = random.Random(seed)
        client = index
        seq = 0
        conn, addr = None, None
        done = 0
        try:
            while not self.stop_event.is_set():
                if self.max_ops is not None and done >= self.max_ops:
                    break
                if conn is None:
                    conn, addr = self._connect(rng, addr)
                    if conn is None:
                        break
                    with self.lock:
                        self.stats.reconnects += 1
                key = rng.choice(self.keys + self.incr_keys)
                if key in self.incr_keys:
                    kind = "incr" if rng.random() < 0.5 else "get"
                else:
                    kind = "set" if rng.random() < 0.5 else "get"
                op = {"client": client, "key": key, "op": kind}
                if kind == "set":
                    seq += 1
                    op["value"] = f"c{index}-{seq}"
                    args = ("SET", key, op["value"])
                else:
                    args = (kind.upper(), key)
                outcome = "ok"
                op["call_ns"] = time.monotonic_ns()
                try:
                    reply = conn.request(*args)
                    op["return_ns"] = time.monotonic_ns()
                    op["unknown"] = False
                    op["output"] = str(reply) if isinstance(reply, int) else reply
                except RespError as e:
                    op["return_ns"] = time.monotonic_ns()
                    msg = str(e)
                    with self.lock:
                        k = msg.split(" ")[0]
                        self.stats.errors_seen[k] = self.stats.errors_seen.get(k, 0) + 1
                    if kind == "incr" and msg.startswith(_DEFINITE_ERRORS):
                        op["unknown"] = False
                        op["output"] = msg
                    else:
                        # Not an answer about the data: treat as "may or may not have happened".
                        op["unknown"] = True
                        outcome = "error"
                except TimeoutError:
                    op["return_ns"] = time.monotonic_ns()
                    op["unknown"] = True
                    outcome = "timeout"
                except (OSError, ValueError):
                    op["return_ns"] = time.monotonic_ns()
                    op["unknown"] = True
                    outcome = "conn"
                self._record(op, outcome)
                done += 1
                if self.think_s:
                    self.stop_event.wait(self.think_s * (0.5 + rng.random()))
                if op["unknown"]:
                    # The old connection may still deliver this op later: start afresh,
                    # as a new client (so each client id has one op in flight at a time).
                    conn.close()
                    conn = None
                    client = self._new_client_id()
        finally:
            if conn is not None:
                conn.close()

    # --- output ----------------------------------------------------------
    def history(self) -> dict:
        with self.lock:
            return {"ops": sorted(self.ops, key=lambda o: o["call_ns"])}

    def write(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.history()))
        return path

    def summary(self) -> str:
        s = self.stats
        return (
            f"{len(self.ops)} ops ({s.ok} known, {s.unknown} unknown: {s.timeouts} timeouts, "
            f"{s.conn_errors} connection errors, {s.error_replies} error replies), "
            f"{s.reconnects} connects, by op {s.by_op}, error replies {s.errors_seen}"
        )


def check(history_path, visualize=None, timeout="60s", lincheck=LINCHECK):
    """Runs lincheck on a history file; returns the CompletedProcess (text)."""
    if not Path(lincheck).exists():
        raise FileNotFoundError(f"{lincheck} missing: run scripts/setup")
    args = [str(lincheck), "--history", str(history_path), "--timeout", str(timeout)]
    if visualize:
        args += ["--visualize", str(visualize)]
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=600)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--addr", help="redis host:port")
    where.add_argument("--dir", help="a lockstep cluster directory (follows the leader)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1.0, help="per-op timeout (s)")
    ap.add_argument("--out", default="history.json")
    ap.add_argument("--visualize", help="write porcupine's HTML visualization here")
    ap.add_argument("--seed", type=int)
    a = ap.parse_args(argv)
    find = lockstep_find_addr(a.dir) if a.dir else (lambda: a.addr)
    w = Workload(
        find,
        clients=a.clients,
        keys=[f"k{i}" for i in range(a.keys)],
        timeout=a.timeout,
        seed=a.seed,
    )
    w.run_for(a.seconds)
    print(w.summary())
    res = check(w.write(a.out), visualize=a.visualize)
    print(res.stdout + res.stderr, end="")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
