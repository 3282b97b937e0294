"""Linearizability: concurrent redis clients, histories checked with porcupine.

(a) the checker itself on hand-made histories; (b) a sanity run against one
unreplicated redis-server; (c) redis under lockstep with the leader SIGKILLed
in the middle of the run.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import Cluster
from conftest import run as lockstep_run
from history import LINCHECK, Conn, RespError, Workload, check, lockstep_find_addr


@pytest.fixture(autouse=True, scope="module")
def lincheck_built():
    assert LINCHECK.exists(), f"{LINCHECK} missing: run scripts/setup"


BASE_PORT = 9400  # lockstep clusters of (c): base ports 9400..9499 (daemons add +100, +200)


def op(client, key, kind, call, ret, value=None, output=None, unknown=False):
    o = {"client": client, "key": key, "op": kind, "call_ns": call, "unknown": unknown}
    if ret is not None:
        o["return_ns"] = ret
    if value is not None:
        o["value"] = value
    if kind != "set" and not unknown:
        o["output"] = output
    return o


def lincheck(tmp_path, ops, name="h", raw=None, viz=False):
    path = tmp_path / f"{name}.json"
    path.write_text(raw if raw is not None else json.dumps({"ops": ops}))
    return check(path, visualize=tmp_path / f"{name}.html" if viz else None)


# --------------------------------------------------------------------------
# (a) the checker itself
# --------------------------------------------------------------------------


def test_checker_accepts_a_linearizable_history(tmp_path):
    ops = [
        op(0, "x", "set", 0, 10, value="a"),
        op(1, "x", "get", 5, 15, output="a"),  # overlaps the set: may see it
        op(2, "x", "get", 1, 4, output=None),  # overlaps the set: may miss it
        op(1, "y", "get", 16, 20, output=None),
        op(2, "n", "incr", 0, 30, output="1"),
        op(3, "n", "incr", 5, 35, output="2"),
        op(2, "x", "incr", 31, 40, output="ERR value is not an integer or out of range"),
        op(3, "x", "set", 41, None, value="b", unknown=True),  # took effect, we see later
        op(4, "x", "get", 100, 110, output="b"),
        op(5, "y", "set", 50, None, value="c", unknown=True),  # never seen: fine too
        op(5, "y", "get", 120, 130, output=None),
        op(6, "n", "incr", 200, None, unknown=True),
        op(6, "n", "get", 210, 220, output="3"),
    ]
    r = lincheck(tmp_path, ops, viz=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("linearizable: 13 ops, 3 keys"), r.stdout
    assert (tmp_path / "h.html").stat().st_size > 0


@pytest.mark.parametrize(
    "ops",
    [
        # a stale read: the set returned before the get began
        [op(0, "x", "set", 0, 10, value="a"), op(1, "x", "get", 20, 30, output=None)],
        # a value that was never written
        [op(0, "x", "set", 0, 10, value="a"), op(1, "x", "get", 5, 15, output="z")],
        # new value seen, then the old one again (reads going backwards)
        [
            op(0, "x", "set", 0, 10, value="a"),
            op(0, "x", "set", 20, 100, value="b"),
            op(1, "x", "get", 30, 40, output="b"),
            op(2, "x", "get", 50, 60, output="a"),
        ],
        # an unknown set seen, then unseen: it cannot be undone
        [
            op(3, "x", "set", 41, None, value="b", unknown=True),
            op(4, "x", "get", 100, 110, output="b"),
            op(4, "x", "get", 111, 120, output=None),
        ],
        # an increment applied twice (e.g. a retried command replayed)
        [op(0, "n", "incr", 0, 10, output="1"), op(0, "n", "get", 20, 30, output="2")],
        # two increments returning the same value
        [op(0, "n", "incr", 0, 10, output="1"), op(1, "n", "incr", 5, 15, output="1")],
    ],
    ids=["stale-read", "phantom", "backwards", "unknown-undone", "double-incr", "lost-incr"],
)
def test_checker_rejects_a_non_linearizable_history(tmp_path, ops):
    # a linearizable key beside it: the verdict comes from the bad key's partition
    ops = ops + [op(9, "other", "set", 0, 1, value="v"), op(9, "other", "get", 2, 3, output="v")]
    r = lincheck(tmp_path, ops, viz=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT linearizable" in r.stdout
    assert (tmp_path / "h.html").stat().st_size > 0


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{", "not a history"),
        ("{}", 'no "ops"'),
        ('{"ops": [], "x": 1}', 'unknown field "x"'),
        ('{"ops": [{"client": 0, "key": "x", "op": "put", "call_ns": 1, "return_ns": 2}]}', "put"),
        (
            '{"ops": [{"client": 0, "key": "x", "op": "set", "call_ns": 1, "return_ns": 2}]}',
            "value",
        ),
        (
            (
                '{"ops": [{"client": 0, "key": "x", "op": "get", "output": null, "call_ns": 5,'
                ' "return_ns": 2}]}'
            ),
            "before call_ns",
        ),
        (
            '{"ops": [{"client": 0, "key": "x", "op": "get", "output": null, "call_ns": 5}]}',
            "return",
        ),
        (
            '{"ops": [{"client": 0, "key": "x", "op": "get", "call_ns": 1, "return_ns": 2}]}',
            "output",
        ),
        ('{"ops": [{"client": 0, "op": "get", "call_ns": 1, "return_ns": 2}]}', "key"),
        ('{"ops": [] } trailing', "trailing"),
    ],
)
def test_checker_refuses_bad_input_with_exit_2(tmp_path, raw, message):
    r = lincheck(tmp_path, None, raw=raw)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr, r.stderr


def test_checker_usage_errors_exit_2(tmp_path):
    for args in ([], ["--history", str(tmp_path / "missing.json")], ["--bogus"]):
        r = subprocess.run([str(LINCHECK), *args], capture_output=True, text=True, check=False)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.strip(), args


# --------------------------------------------------------------------------
# (b) one unreplicated redis-server: the harness and checker agree on a real run
# --------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ping(addr, timeout=10.0):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            c = Conn(addr, 0.5)
            try:
                last = c.request("PING")
            finally:
                c.close()
            if last == "PONG":
                return
        except (OSError, RespError) as e:  # not up yet
            last = e
        time.sleep(0.05)
    raise AssertionError(f"redis at {addr} did not answer PING within {timeout}s: {last!r}")


@pytest.fixture
def redis_server(tmp_path):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed (scripts/setup installs it)")
    port = free_port()
    d = tmp_path / "redis"
    d.mkdir()
    with open(d / "redis.log", "wb") as log:
        p = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--dir", str(d), "--daemonize", "no"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_ping(("127.0.0.1", port))
            yield ("127.0.0.1", port)
        finally:
            p.kill()  # by its pid: the process we started
            p.wait(10)


def run_until_ok(w, ok, timeout=60):
    """Runs the workload until `ok` ops succeeded (not for a fixed time: a
    loaded machine does fewer a second), then stops it."""
    w.start()
    end = time.monotonic() + timeout
    try:
        while w.stats.ok < ok:
            assert time.monotonic() < end, f"{w.stats.ok} ops succeeded in {timeout} s"
            time.sleep(0.05)
    finally:
        w.stop()
    return w


def test_unreplicated_redis_history_is_linearizable(tmp_path, redis_server):
    # A generous reply timeout: an op that times out is an unknown one.
    w = run_until_ok(Workload(lambda: redis_server, clients=8, seed=1, timeout=10), 500)
    print(w.summary())
    assert w.stats.unknown == 0, w.summary()
    assert set(w.stats.by_op) == {"get", "set", "incr"}
    r = check(w.write(tmp_path / "history.json"), visualize=tmp_path / "history.html")
    assert r.returncode == 0, f"{w.summary()}\n{r.stdout}{r.stderr}\nsee {tmp_path}"
    assert r.stdout.startswith(f"linearizable: {len(w.ops)} ops, 4 keys"), r.stdout


def test_a_lying_server_is_caught(tmp_path, redis_server):
    """The harness's history of a redis whose key is reset behind the clients' back."""
    w = Workload(lambda: redis_server, clients=4, keys=("k0",), incr_keys=(), seed=2)
    w.start()
    try:
        admin = Conn(redis_server, 1.0)
        try:
            # DEL is an op the history does not know about: a SET's value vanishes.
            for _ in range(50):
                time.sleep(0.01)
                admin.request("DEL", "k0")
        finally:
            admin.close()
        time.sleep(0.2)
    finally:
        w.stop()
    r = check(w.write(tmp_path / "history.json"))
    assert r.returncode == 1, f"{w.summary()}\n{r.stdout}{r.stderr}"


# --------------------------------------------------------------------------
# (c) redis under lockstep, leader SIGKILLed mid-run
# --------------------------------------------------------------------------


def children(pid):
    """The child pids of pid (e.g. a replica daemon's redis-server)."""
    out = []
    # The process may exit while it is looked at: its /proc directory goes
    # (glob then raises FileNotFoundError, seen once in a run).
    with contextlib.suppress(OSError):
        for f in Path(f"/proc/{pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                out += [int(c) for c in f.read_text().split()]
    return out


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


class RedisCluster(Cluster):
    """A lockstep cluster running redis in its own directory; every process it was
    seen to run (daemons and their children) is remembered so that teardown can
    end them by pid even when `cluster down` cannot."""

    def __init__(self, directory: Path):
        super().__init__(directory, BASE_PORT)
        self.seen = {}  # pid -> cmdline when first seen

    def up(self, replicas=3, tries=5):
        # A base port in 9400..9499 (the daemons also use +100 and +200): varied by
        # pid and retried when taken, since several test sessions share this machine.
        for attempt in range(tries):
            base = BASE_PORT + 4 * ((os.getpid() + attempt) % 25)
            p = lockstep_run(
                *("cluster", "up", "--dir", self.dir, "--replicas", replicas),
                *("--base-port", base, "--app", "redis"),
                check=False,
            )
            self.note()
            out = p.stdout + p.stderr
            if p.returncode == 0 or "is taken" not in out:
                return p
        return p

    def status(self):
        s = super().status()
        for r in s.get("replicas", []):
            if isinstance(r.get("pid"), int) and r["pid"] > 0:
                self.remember(r["pid"])
        return s

    def remember(self, pid):
        c = cmdline(pid)
        if c is not None:
            self.seen.setdefault(pid, c)
            for k in children(pid):
                self.remember(k)

    def note(self):
        for pidfile in self.dir.glob("replica-*.pid"):
            with contextlib.suppress(ValueError, OSError):
                self.remember(int(pidfile.read_text().strip()))

    def down(self):
        with contextlib.suppress(Exception):
            self.note()
        if (self.dir / "cluster.toml").exists():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                lockstep_run("cluster", "down", "--dir", self.dir, check=False)
        # Belt and braces: whatever we saw running and still runs, by pid.
        left = [p for p, c in self.seen.items() if cmdline(p) == c]
        for p in left:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        return left


def has_client_addr(s):
    return "client_addr" in s or any("client_addr" in r for r in s.get("replicas", []))


def keep_evidence(tmp_path, cluster_dir, events):
    """Copies a failed run's history, visualization, events and replica logs out of tmp."""
    out = LINCHECK.parent.parent / "lincheck-failures" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    for f in ("history.json", "history.html"):
        if (tmp_path / f).exists():
            shutil.copy(tmp_path / f, out / f)
    for f in cluster_dir.glob("*.log"):
        shutil.copy(f, out / f.name)
    (out / "events.json").write_text(json.dumps(events, indent=1))
    return out


def test_redis_under_lockstep_is_linearizable_across_a_leader_kill(tmp_path):
    c = RedisCluster(tmp_path / "cluster")
    c.dir.mkdir()
    try:
        up = c.up()
        out = up.stdout + up.stderr
        assert up.returncode == 0, f"cluster up --app redis exited {up.returncode}\n{out}"
        s = c.wait(lambda s: s.get("leader") is not None, timeout=30.0, what="a leader")
        assert has_client_addr(s), f"status --json has no client_addr: {s}"

        find = lockstep_find_addr(c.dir)
        end = time.monotonic() + 20
        while not find() and time.monotonic() < end:
            time.sleep(0.1)
        addr = find()
        assert addr, f"no client_addr within 20s: {c.status()}"
        host, _, port = addr.rpartition(":")
        wait_ping((host.strip("[]"), int(port)), timeout=20)

        events = []  # what happened when (monotonic ns), to read beside a failed history

        def event(what, **kw):
            events.append({"ns": time.monotonic_ns(), "what": what, **kw})

        event("up", status=c.status())
        # Nine keys and three counters: the checker splits the history by key,
        # and on a quiet machine four keys made partitions of 10000 ops that
        # porcupine could not finish in its minute (a run reported UNKNOWN).
        keys = tuple(f"k{i}" for i in range(9))
        w = Workload(find, clients=8, seed=3, keys=keys, incr_keys=("n0", "n1", "n2")).start()
        try:
            time.sleep(2.0)
            s = c.status()
            old = s["leader"]
            pid = next(r["pid"] for r in s["replicas"] if r["id"] == old)
            event("kill", replica=old, pid=pid, children=children(pid), status=s)
            killed_ns = events[-1]["ns"]
            os.kill(pid, signal.SIGKILL)
            s = c.wait(lambda s: s["leader"] not in (None, old), timeout=30.0, what="a new leader")
            event("new leader", status=s)
            lockstep_run("cluster", "restart", "--dir", c.dir, "--id", old)
            event("restarted", replica=old, status=c.status())
            # The new leader must serve: wait for ops completed after the kill, then a bit more.
            end = time.monotonic() + 60
            while w.known_since(killed_ns) < 50 and time.monotonic() < end:
                time.sleep(0.1)
            time.sleep(max(0.0, 3.0 - (time.monotonic_ns() - killed_ns) / 1e9))
        finally:
            w.stop()
        event("stopped", status=c.status())
        print(w.summary())
        after = w.known_since(killed_ns)
        r = check(w.write(tmp_path / "history.json"), visualize=tmp_path / "history.html")
        if r.returncode != 0 or after < 50:
            kept = keep_evidence(tmp_path, c.dir, events)
            assert r.returncode == 0, f"{w.summary()}\n{r.stdout}{r.stderr}\nevidence in {kept}"
            raise AssertionError(
                f"only {after} ops completed after the leader was killed: {w.summary()}\n"
                f"evidence in {kept}"
            )
    finally:
        left = c.down()
    states = {p: Path(f"/proc/{p}/stat").read_text().split(")")[-1][:3] for p in left}
    assert not left, f"still running after cluster down (killed now; pid: state): {states}"


def test_workload_threads_follow_find_addr(tmp_path, redis_server):
    """After the address it had stops answering, a client asks find_addr() again."""
    where = {"addr": ("127.0.0.1", free_port())}  # nothing listens there at first
    threading.Timer(0.3, lambda: where.update(addr=redis_server)).start()
    w = run_until_ok(Workload(lambda: where["addr"], clients=2, seed=4), 10)
    r = check(w.write(tmp_path / "history.json"))
    assert r.returncode == 0, r.stdout + r.stderr
