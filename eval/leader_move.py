#!/usr/bin/env python3
"""Issue 28, item 2: leadership moved on purpose (`lockstep leader move`) under load.

    scripts/bench leader-move [--quick] [--moves 20] [--clients 4] [--base-port 18600]
                              [--rolling]

Starts a redis cluster (3 replicas, disk), runs a bounded load from --clients
connections (each: a SET of a key of its own, a SET and a GET of a shared key, in
turn), and moves leadership --moves times (--quick: 5), every other move to a
named replica (--to) and the others to the leader's pick, one every
--interval seconds. Clients follow the leader as a client of a leader_address
would: the benchmark hands them the new leader's address as soon as
`lockstep leader move` returns (it returns once the new leader serves); a
client whose connection broke earlier keeps asking until then.

Per move it reports the unavailability each client saw (the longest gap
between two acknowledged ops of that client that overlaps the move; p50 and
max over clients and moves), the reconnects per client, and the command's own
times (hand-over, serving). At the end: every acknowledged SET of a key of a
client's own is read back from the leader, every replica's redis has the
same DEBUG DIGEST (backups read through `lockstep inspect`), and the history
passes the linearizability checker (build/bin/lincheck, eval/history.py).

--rolling then runs `lockstep cluster restart --rolling` under the same load (the
clients learn the new leader from the command's line saying it serves, or from
`cluster status` every 20 ms) and reports the longest gap a client saw against the
election timeout.

Target: unavailability p50 <= 50 ms, at most one reconnect per client per move.
Writes eval/out/leader_move.json; exit status 1 when a check fails (lost
writes, replicas differ, not linearizable, a move failed) or the target is missed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import history
from resp import Redis, RespError

ROOT = Path(__file__).resolve().parent.parent
LOCKSTEP = Path(os.environ.get("LOCKSTEP_BUILD", ROOT / "build")) / "bin" / "lockstep"
TARGET_P50_MS = 50.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def lockstep(*args, check=True, timeout=120):
    return history.run_lockstep(LOCKSTEP, *args, check=check, timeout=timeout)


def status(d):
    return json.loads(lockstep("cluster", "status", "--json", "--dir", d).stdout)


def parse_addr(a):
    host, _, port = a.rpartition(":")
    return host, int(port)


class LeaderAddress:
    """Where the clients connect: set by whoever learns of a new leader (the mover),
    else found through `cluster status` (a leader that serves; every 0.2 s)."""

    def __init__(self, d, addr):
        self.d = d
        self.lock = threading.Condition()
        self.addr = addr
        self.at = time.monotonic()

    def set(self, addr):
        with self.lock:
            self.addr = addr
            self.at = time.monotonic()
            self.lock.notify_all()

    def get(self, stale, stop):
        """An address other than stale: the mover's, or that of a leader `cluster status`
        shows serving (looked up every 0.2 s); stale again after 5 s."""
        end = time.monotonic() + 5.0
        while not stop.is_set() and time.monotonic() < end:
            with self.lock:
                look_at = time.monotonic() + 0.2
                while self.addr == stale and not stop.is_set() and time.monotonic() < look_at:
                    self.lock.wait(0.05)
                if self.addr != stale:
                    return self.addr
            found = self.serving_leader()
            if found:
                with self.lock:
                    self.addr = found
        return self.addr

    def serving_leader(self):
        """The address of the leader `cluster status` shows serving, or None."""
        try:
            st = status(self.d)
        except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as e:
            log(f"cluster status: {e!r} (looking again)")
            return None
        leader = st.get("leader")
        rep = st["replicas"][leader] if leader is not None else {}
        return parse_addr(rep["server_addr"]) if rep.get("serving") else None


class Load:
    """--clients threads, each: SET u:T:N (its own key), SET s:K, GET s:K, in turn,
    for at most max_ops ops or until stopped; every key starts with `prefix` (a
    second load on the same data checks a history of its own keys). Records ops in eval/history.py's format
    (a new client id after an op whose outcome is unknown) and each thread's connects."""

    def __init__(
        self, where: LeaderAddress, clients=4, shared_keys=3, timeout=2.0, max_ops=200000, prefix=""
    ):
        self.where = where
        self.clients = clients
        self.prefix = prefix
        self.shared = [f"{prefix}s:{i}" for i in range(shared_keys)]
        self.timeout = timeout
        self.max_ops = max_ops
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ops = []  # history ops, plus "thread"
        self.connects = []  # (thread, monotonic_ns)
        self.acked_own = {}  # key -> value, acknowledged SETs of own keys
        self.next_client = clients
        self.threads = []

    def start(self):
        for t in range(self.clients):
            th = threading.Thread(target=self._run, args=(t,), daemon=True)
            th.start()
            self.threads.append(th)

    def finish(self):
        self.stop.set()
        for th in self.threads:
            th.join(self.timeout * 3 + 5)
        if any(th.is_alive() for th in self.threads):
            raise RuntimeError("a client thread did not stop")

    def _new_id(self):
        with self.lock:
            self.next_client += 1
            return self.next_client - 1

    def _run(self, t):
        rng = random.Random(t)
        client, seq, conn, addr = t, 0, None, None
        for n in range(self.max_ops):
            if self.stop.is_set():
                break
            if conn is None:
                addr = self.where.get(addr, self.stop)
                try:
                    conn = history.Conn(addr, self.timeout)
                except OSError:
                    self.stop.wait(0.002)
                    continue
                with self.lock:
                    self.connects.append((t, time.monotonic_ns()))
            step = n % 3
            if step == 0:
                seq += 1
                op = {"key": f"{self.prefix}u:{t}:{seq}", "op": "set", "value": f"c{t}-{seq}"}
                args = ("SET", op["key"], op["value"])
            elif step == 1:
                key = rng.choice(self.shared)
                op = {"key": key, "op": "set", "value": f"c{t}-s{n}"}
                args = ("SET", key, op["value"])
            else:
                op = {"key": rng.choice(self.shared), "op": "get"}
                args = ("GET", op["key"])
            op["client"] = client
            op["thread"] = t
            op["call_ns"] = time.monotonic_ns()
            try:
                reply = conn.request(*args)
                op["unknown"] = False
                op["output"] = reply
            except (OSError, ValueError, TimeoutError, RespError):
                op["unknown"] = True
            op["return_ns"] = time.monotonic_ns()
            with self.lock:
                self.ops.append(op)
                if step == 0 and not op["unknown"]:
                    self.acked_own[op["key"]] = op["value"]
            if op["unknown"]:
                conn.close()
                conn = None
                client = self._new_id()
        if conn is not None:
            conn.close()

    def write_history(self, path):
        with self.lock:
            ops = [{k: v for k, v in o.items() if k != "thread"} for o in self.ops]
        ops.sort(key=lambda o: o["call_ns"])
        Path(path).write_text(json.dumps({"ops": ops}))
        return path


def move_gaps(ops, clients, t0_ns, t1_ns):
    """Per client thread: the longest gap (ms) between two consecutive acknowledged ops
    (return times) that overlaps [t0_ns, t1_ns]; None for a thread with no ack after."""
    out = []
    for t in range(clients):
        acks = sorted(o["return_ns"] for o in ops if o["thread"] == t and not o["unknown"])
        gap = None
        for a, b in itertools.pairwise(acks):
            if b >= t0_ns and a <= t1_ns:
                gap = max(gap or 0, (b - a) / 1e6)
        out.append(gap)
    return out


def percentile(values, q):
    v = sorted(values)
    if not v:
        return None
    return v[min(len(v) - 1, round(q / 100 * (len(v) - 1)))]


def same_digests(d, n, timeout=30.0):
    """Every replica's DEBUG DIGEST (backups through `lockstep inspect`), equal in time."""
    end = time.monotonic() + timeout
    st = status(d)
    addrs = [parse_addr(r["server_addr"]) for r in st["replicas"]]
    got = []
    while time.monotonic() < end:
        got = []
        for a in addrs[:n]:
            try:
                c = Redis(a, inspect=True, timeout=10)
                try:
                    got.append(c.call("DEBUG", "DIGEST"))
                finally:
                    c.close()
            except (OSError, RespError) as e:
                got.append(f"error: {e!r}")
        if len(set(got)) == 1 and not got[0].startswith("error"):
            return True, got
        time.sleep(0.2)
    return False, got


def lost_writes(where: LeaderAddress, acked: dict):
    """Acknowledged SETs of own keys whose value the leader does not hold now."""
    keys = sorted(acked)
    lost = []
    for attempt in range(10):
        try:
            c = Redis(where.get(None, threading.Event()), timeout=10)
            try:
                for i in range(0, len(keys), 500):
                    part = keys[i : i + 500]
                    vals = c.call("MGET", *part)
                    for k, v in zip(part, vals):
                        if (v.decode() if isinstance(v, bytes) else v) != acked[k]:
                            lost.append(k)
                return lost
            finally:
                c.close()
        except (OSError, RespError) as e:
            log(f"reading back (attempt {attempt + 1}): {e!r}")
            lost = []
            time.sleep(0.5)
    raise RuntimeError("could not read the acknowledged writes back")


MOVED = re.compile(r"leadership moved from replica (\d+) to replica (\d+)")


def rolling_restart(d, where: LeaderAddress, server_addrs):
    """`cluster restart --rolling` under the load. The clients learn the new leader
    as in the moves: from the command's progress line that says it serves (read as
    it comes); `cluster status` every 20 ms is the fallback."""
    timeout_ms = None
    for line in (Path(d) / "cluster.toml").read_text().splitlines():
        if line.startswith("election_timeout_max_us"):
            timeout_ms = int(line.split("=")[1]) / 1000
    stop = threading.Event()

    def follow():
        while not stop.wait(0.02):
            found = where.serving_leader()
            if found:
                where.set(found)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    log("rolling restart")
    t0 = time.monotonic_ns()
    p = subprocess.Popen(
        [str(LOCKSTEP), "cluster", "restart", "--rolling", "--dir", str(d)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            m = MOVED.search(line)
            if m:
                where.set(server_addrs[int(m.group(2))])
        rc = p.wait(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    t1 = time.monotonic_ns()
    stop.set()
    follower.join(5)
    return {
        "ok": rc == 0,
        "output": "\n".join(lines),
        "seconds": (t1 - t0) / 1e9,
        "election_timeout_max_ms": timeout_ms,
        "t0_ns": t0,
        "t1_ns": t1,
    }


def run(a) -> dict:
    d = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="leader-move-"))
    log(f"cluster up in {d} (base port {a.base_port})")
    lockstep(
        "cluster", "up", "--app", "redis", "--dir", d, "--base-port", a.base_port,
        "--wipe", timeout=180,
    )  # fmt: skip
    result = {"moves": [], "clients": a.clients, "dir": str(d)}
    try:
        st = status(d)
        n = len(st["replicas"])
        where = LeaderAddress(d, parse_addr(st["client_addr"]))
        server_addrs = [parse_addr(r["server_addr"]) for r in st["replicas"]]
        load = Load(where, clients=a.clients)
        load.start()
        time.sleep(a.warmup)
        for i in range(a.moves):
            leader = status(d)["leader"]
            to = (leader + 1 + (i // 2) % (n - 1)) % n if i % 2 == 0 else None
            args = ["leader", "move", "--json", "--dir", d] + (
                ["--to", to] if to is not None else []
            )
            t0 = time.monotonic_ns()
            p = lockstep(*args, check=False, timeout=60)
            t1 = time.monotonic_ns()
            m = {"move": i + 1, "from": leader, "asked_to": to, "ok": p.returncode == 0}
            if p.returncode == 0:
                out = json.loads(p.stdout)
                m.update(out)
                where.set(server_addrs[out["to"]])
            else:
                m["error"] = p.stderr.strip()
                log(f"move {i + 1}: FAILED: {m['error']}")
            m["t0_ns"], m["t1_ns"] = t0, t1
            result["moves"].append(m)
            time.sleep(a.interval)
        if a.rolling:
            result["rolling"] = rolling_restart(d, where, server_addrs)
            time.sleep(a.interval)
        load.finish()
        ops = load.ops
        per_gap, per_reconnect = [], []
        for m in result["moves"]:
            gaps = move_gaps(ops, a.clients, m["t0_ns"], m["t1_ns"])
            m["gaps_ms"] = gaps
            # Connects of each thread from the move's start until the next move (or 1 s).
            until = m["t1_ns"] + int(min(a.interval, 1.0) * 1e9)
            m["reconnects"] = [
                sum(1 for t, at in load.connects if t == c and m["t0_ns"] <= at <= until)
                for c in range(a.clients)
            ]
            per_gap += [g for g in gaps if g is not None]
            per_reconnect += m["reconnects"]
        acked = [o for o in ops if not o["unknown"]]
        if a.rolling:
            r = result["rolling"]
            r["gaps_ms"] = move_gaps(ops, a.clients, r.pop("t0_ns"), r.pop("t1_ns"))
            r["max_gap_ms"] = max((g for g in r["gaps_ms"] if g is not None), default=None)
        result["ops"] = len(ops)
        result["acknowledged"] = len(acked)
        result["unknown"] = len(ops) - len(acked)
        result["unavailability_p50_ms"] = percentile(per_gap, 50)
        result["unavailability_max_ms"] = max(per_gap) if per_gap else None
        result["reconnects_max"] = max(per_reconnect) if per_reconnect else 0
        result["moves_failed"] = sum(1 for m in result["moves"] if not m["ok"])
        result["serving_ms_p50"] = percentile(
            [m["serving_ms"] for m in result["moves"] if m["ok"]], 50
        )
        log("checking: acknowledged writes, replicas' digests, linearizability")
        lost = lost_writes(where, load.acked_own)
        result["own_writes_acknowledged"] = len(load.acked_own)
        result["lost"] = len(lost)
        result["lost_keys"] = lost[:20]
        same, digests = same_digests(d, n)
        result["replicas_same"] = same
        result["digests"] = digests
        hist = load.write_history(d / "history.json")
        res = history.check(hist, timeout="120s")
        result["linearizable"] = res.returncode == 0
        result["lincheck"] = (res.stdout + res.stderr).strip()[-2000:]
    finally:
        if not a.keep:
            lockstep("cluster", "down", "--dir", d, "--quiet", check=False)
    return result


def report(r):
    lines = []
    for m in r["moves"]:
        if not m["ok"]:
            lines.append(f"move {m['move']:2d}: {m['from']} -> ?  FAILED: {m['error']}")
            continue
        gaps = [g for g in m["gaps_ms"] if g is not None]
        lines.append(
            f"move {m['move']:2d}: {m['from']} -> {m['to']}"
            f"{' (--to)' if m['asked_to'] is not None else '       '}  "
            f"hand-over {m['handover_ms']:6.1f} ms, serving {m['serving_ms']:6.1f} ms; "
            f"clients' gaps p50 {percentile(gaps, 50) or 0:6.1f} max {max(gaps or [0]):6.1f} ms; "
            f"reconnects {m['reconnects']}"
        )
    p50 = r["unavailability_p50_ms"]
    ok_target = p50 is not None and p50 <= TARGET_P50_MS
    lines += [
        (
            f"{len(r['moves'])} moves ({r['moves_failed']} failed), {r['clients']} clients, "
            f"{r['ops']} ops ({r['acknowledged']} acknowledged, {r['unknown']} unknown)"
        ),
        (
            f"unavailability per client per move: p50 {p50 or 0:.1f} ms, "
            f"max {r['unavailability_max_ms'] or 0:.1f} ms "
            f"(target p50 <= {TARGET_P50_MS:.0f} ms: {'MET' if ok_target else 'MISSED'})"
        ),
        f"`leader move` until the new leader serves: p50 {r['serving_ms_p50'] or 0:.1f} ms",
        (
            f"reconnects per client per move: max {r['reconnects_max']} (target <= 1: "
            f"{'MET' if r['reconnects_max'] <= 1 else 'MISSED'})"
        ),
        f"acknowledged SETs of own keys: {r['own_writes_acknowledged']}, lost {r['lost']}",
        f"replicas' DEBUG DIGEST equal: {r['replicas_same']}",
        f"linearizable (lincheck): {r['linearizable']}",
    ]
    if "rolling" in r:
        ro = r["rolling"]
        bound = ro["election_timeout_max_ms"]
        lines.append(
            f"rolling restart: {'done' if ro['ok'] else 'FAILED'} in {ro['seconds']:.1f} s; "
            f"longest client gap {ro['max_gap_ms'] or 0:.1f} ms (election timeout {bound:.0f} ms: "
            f"{'within' if ro['max_gap_ms'] is not None and ro['max_gap_ms'] <= bound else 'OVER'})"
        )
    return "\n".join(lines), ok_target


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 moves")
    ap.add_argument("--moves", type=int, default=None, help="moves (default 20; --quick 5)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--interval", type=float, default=0.7, help="seconds between moves")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--base-port", type=int, default=18600)
    ap.add_argument("--dir", help="cluster directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up")
    ap.add_argument(
        "--rolling",
        action="store_true",
        help="then a rolling restart (cluster restart --rolling) under the same load",
    )
    ap.add_argument("--out", default=str(ROOT / "eval" / "out" / "leader_move.json"))
    a = ap.parse_args(argv)
    if a.moves is None:
        a.moves = 5 if a.quick else 20
    if a.moves < 1 or a.clients < 1:
        ap.error("--moves and --clients must be at least 1")
    r = run(a)
    text, ok_target = report(r)
    print(text)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    for m in r["moves"]:
        m.pop("t0_ns", None)
        m.pop("t1_ns", None)
    Path(a.out).write_text(json.dumps(r, indent=1))
    good = (
        r["moves_failed"] == 0
        and r["lost"] == 0
        and r["replicas_same"]
        and r["linearizable"]
        and r["reconnects_max"] <= 1
        and r.get("rolling", {}).get("ok", True)
    )
    if not good:
        print("FAILED: a check did not hold (see above)")
    return 0 if good and ok_target else 1


if __name__ == "__main__":
    sys.exit(main())
