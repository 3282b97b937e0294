#!/usr/bin/env python3
"""Benchmarks redis or memcached under lockstep against what a user would run instead.

    scripts/bench redis|memcached [--seconds 3] [--repeats 3] [--conns 1,4,16]
                                  [--modes unreplicated,replicated,aof-always,redis-wait]
                                  [--ops set,get] [--quick] [--json FILE]
    .venv/bin/python eval/apps.py redis --from-json eval/out/redis.json   (redraw only)

Every measurement is build/bin/loadgen (tools/loadgen.c): N connections, closed loop,
SET (or GET) of a 64-byte value on one of 10000 keys, --seconds long. Modes, all in one run:

  unreplicated       the server alone, with the flags of lockstep's profiles
                     (redis: --save "" --appendonly no --protected-mode no;
                     memcached: -U 0 -t 4 -u root, four workers like the profile's);
                     durability "none" (one process's RAM)
  replicated         `lockstep cluster up --replicas 3 --app APP --durability disk|memory`;
                     clients talk to "client_addr" from `lockstep cluster status --json`
  replicated-1worker memcached only: replicated/disk with the profile's -t 4 made -t 1, the
                     one worker thread the profile ran before issue 26 (its throughput
                     against the four workers' is reported)
  aof-always         redis only: one redis with --appendonly yes --appendfsync always, its
                     files on the same file system as the lockstep cluster; durability "disk"
  redis-wait         redis only: a master and two replicas (--replicaof); every SET is
                     followed by WAIT 2 0 and the pair is one op; durability "memory"

Repeats are spread over time (repeat 1 of every measurement of a mode, then repeat 2, ...);
the JSON keeps the median over repeats with min and max. GET is measured where reads take a
different path than the baseline's (unreplicated and replicated; aof-always and redis-wait
serve a GET exactly as the unreplicated server does). Before measuring, every key is written
once, so GETs hit. Writes eval/out/APP.json (or --json), and APP.md and APP.png next to it;
prints the table, ratios against unreplicated, the CPU time and context switches per op of
each class of process (daemons, servers: from /proc, every thread; loadgen: its rusage) and
the targets of issues 3 and 9 (redis: replicated/memory at 16 conns >= 1.3 x redis-wait
replaces 0.7 x unreplicated) and, for redis, issue 26's (CPU per op of all processes, of the
daemons, of the servers and of the leader's host against redis-wait and the unreplicated
server; the 1-connection daemons' CPU and context switches and SET p50 against the disk
bound; GET against unreplicated), all computed from this run. A target this machine cannot reach
whatever lockstep's daemons do is marked "out of reach", with the bound from this run: for
throughput, cores / (servers' + loadgen's CPU per op in that mode), i.e. daemons costing
nothing; for the 1-conn disk p50, unreplicated p50 + one durable write while every replica
writes to the shared disk at once (`lockstep bench consensus`'s floor(N)). Modes that cannot run yet (no `cluster up --app`) are listed as skipped, with the
reason. Progress goes to stderr. Exit status 1 if a mode failed.

State check, at the end of every replicated mode's load: every replica's applied_index
reaches the leader's commit_index, every replica's server holds the same (redis: DEBUG
DIGEST; memcached: value and CAS unique of each of the --keys keys, through `gets`),
and `lockstep divergence list` is empty; otherwise the mode failed (exit status 1).
"""

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inspector  # eval/inspector.py: connections to a backup's own server
import proc_usage  # eval/proc_usage.py: CPU and context switches of processes over a run
import profiles  # eval/profiles.py: apps/APP.toml variants
from resp import Redis, RespError  # eval/resp.py

ROOT = Path(__file__).resolve().parent.parent
LOCKSTEP = ROOT / "build" / "bin" / "lockstep"
LOADGEN = ROOT / "build" / "bin" / "loadgen"
REDIS_FLAGS = shlex.split('--save "" --appendonly no --protected-mode no')  # as apps/ profiles
MEMCACHED_FLAGS = shlex.split("-U 0 -t 4 -u root")  # as apps/memcached.toml
HOST = "127.0.0.1"
T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:5.0f}s] {msg}", file=sys.stderr, flush=True)


class Skip(Exception):
    """A mode that cannot run here yet; the message says why."""


# ---------------------------------------------------------------------------
# Processes, ports, tiny clients
# ---------------------------------------------------------------------------


class Procs:
    """Every process started here; each is stopped by its pid."""

    def __init__(self):
        self.procs = []

    def start(self, cmd, logpath, cwd=None):
        with open(logpath, "ab") as out:
            p = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd
            )
        p.cmd_name, p.logpath = Path(cmd[0]).name, logpath
        self.procs.append(p)
        return p

    def stop(self, p, grace=5.0):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in list(reversed(self.procs)):
            self.stop(p)


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
            return True
        except OSError:
            return False


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def split_addr(addr):
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or HOST, int(port)


def redis_call(addr, *args, timeout=5.0, inspect=False):
    """Sends one command on a fresh connection; returns the reply (raises on an error reply).
    inspect=True: through `lockstep inspect`, as a backup's own server requires (inspector.py)."""
    c = Redis(split_addr(addr), timeout=timeout, inspect=inspect)
    try:
        return c.call(*args)
    finally:
        c.close()


def server_ready(app, addr):
    try:
        if app == "redis":
            return redis_call(addr, "PING", timeout=1.0) == "PONG"
        if app != "memcached":  # any other server (eval/appbench.py): it accepts connections
            with socket.create_connection(split_addr(addr), timeout=1.0):
                return True
        with socket.create_connection(split_addr(addr), timeout=1.0) as s:
            s.sendall(b"version\r\n")
            return s.recv(100).startswith(b"VERSION")
    except (OSError, RespError):
        return False


def wait_ready(app, addr, proc=None, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            tail = Path(proc.logpath).read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{proc.cmd_name} exited with {proc.returncode}:\n{tail}")
        if server_ready(app, addr):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{app} at {addr} not ready after {timeout:.0f} s")


def value_bytes(n):
    return bytes(ord("a") + i % 26 for i in range(n))  # loadgen's value


def prefill(app, addr, keys, size, batch=500):
    """Writes key:0 .. key:<keys-1> once (pipelined), so that GETs hit."""
    val = value_bytes(size)
    with socket.create_connection(split_addr(addr), timeout=30) as s:
        for start in range(0, keys, batch):
            idx = range(start, min(keys, start + batch))
            if app == "redis":
                req, ok = b"".join(Redis.encode("SET", f"key:{i}", val) for i in idx), b"+OK\r\n"
            else:
                req = b"".join(b"set key:%d 0 0 %d\r\n%s\r\n" % (i, size, val) for i in idx)
                ok = b"STORED\r\n"
            s.sendall(req)
            buf = b""
            while buf.count(b"\r\n") < len(idx):
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError(f"{addr} closed the connection during prefill")
                buf += chunk
            if buf != ok * len(idx):
                raise RuntimeError(f"prefill of {addr} got {buf[:80]!r}")


# ---------------------------------------------------------------------------
# Modes: each is a context manager that yields the address clients use
# ---------------------------------------------------------------------------


def server_cmd(app, port, data_dir, redis_flags=REDIS_FLAGS, extra=()):
    if app == "redis":
        cmd = ["redis-server", *f"--port {port} --bind {HOST} --dir".split(), str(data_dir)]
        return cmd + redis_flags + list(extra)
    return ["memcached", "-p", str(port), "-l", HOST, *MEMCACHED_FLAGS, *extra]


def start_server(ctx, app, name, redis_flags=REDIS_FLAGS, extra=()):
    """Starts one server on a free loopback port in its own directory; returns (proc, addr)."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=ctx.work))
    for attempt in range(3):
        port = free_port()
        p = ctx.procs.start(server_cmd(app, port, data_dir, redis_flags, extra), data_dir / "log")
        addr = f"{HOST}:{port}"
        try:
            wait_ready(app, addr, p)
            return p, addr
        except RuntimeError:
            ctx.procs.stop(p)
            if attempt == 2:
                raise


@contextlib.contextmanager
def mode_unreplicated(ctx, app):
    p, addr = start_server(ctx, app, "unreplicated")
    try:
        yield addr, "set", {"servers": [p.pid]}
    finally:
        ctx.procs.stop(p)


@contextlib.contextmanager
def mode_aof_always(ctx, app):
    flags = shlex.split('--save "" --appendonly yes --appendfsync always --protected-mode no')
    p, addr = start_server(ctx, app, "aof-always", redis_flags=flags)
    try:
        yield addr, "set", {"servers": [p.pid]}
    finally:
        ctx.procs.stop(p)


@contextlib.contextmanager
def mode_redis_wait(ctx, app):
    started = []
    try:
        master, addr = start_server(ctx, app, "wait-master")
        started.append(master)
        _, port = split_addr(addr)
        for i in range(2):
            p, _ = start_server(
                ctx, app, f"wait-replica{i}", extra=["--replicaof", HOST, str(port)]
            )
            started.append(p)
        end = time.monotonic() + 30
        while True:
            info = redis_call(addr, "INFO", "replication").decode()
            online = info.count("state=online")
            if online >= 2:
                break
            if time.monotonic() > end:
                raise RuntimeError(f"only {online} of 2 replicas online after 30 s:\n{info}")
            time.sleep(0.1)
        log(f"  master {addr}: 2 replicas online")
        yield addr, "set-wait", {"servers": [p.pid for p in started]}
    finally:
        for p in reversed(started):
            ctx.procs.stop(p)


def lockstep_run(args, timeout=180):
    return subprocess.run(
        [str(LOCKSTEP), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def lockstep_has_app():
    """Why `lockstep cluster up --app` cannot be used here, or None when it can."""
    if not LOCKSTEP.exists():
        return f"{LOCKSTEP} is not built"
    r = lockstep_run(["cluster", "up", "--help"], timeout=20)
    if "--app" not in r.stdout + r.stderr:
        return "`lockstep cluster up` has no --app option yet (not in `cluster up --help`)"
    return None


def pick_base_port():
    """A base port P with P+0..9, P+100..109, P+200..209, P+250..259 (metrics) and
    P+300..309 free on loopback."""
    for _ in range(200):
        base = random.randrange(20000, 40000, 10)
        if all(port_free(base + off + i) for off in (0, 100, 200, 250, 300) for i in range(10)):
            return base
    raise RuntimeError("no free base port found")


def cluster_status(d):
    r = lockstep_run(["cluster", "status", "--json", "--dir", d], timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"cluster status failed: {r.stderr.strip() or r.stdout.strip()}")
    return json.loads(r.stdout)


def procs_naming(d):
    """Pids of processes whose command line names directory d, and their descendants.

    Everything a cluster in d runs (daemons: --config d/cluster.toml; their servers) and
    nothing else, since d is a fresh temporary directory."""
    key, parent, found = str(d).encode(), {}, set()
    for e in os.scandir("/proc"):
        if not e.name.isdigit() or int(e.name) == os.getpid():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(e.path, "stat").read_text()
            parent[int(e.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            if key in Path(e.path, "cmdline").read_bytes():
                found.add(int(e.name))
    while grown := {p for p, pp in parent.items() if pp in found and p not in found}:
        found |= grown
    return found


def tear_down_cluster(d):
    """`lockstep cluster down`, then by pid whatever it did not stop, then the directory."""
    try:
        r = lockstep_run(["cluster", "down", "--dir", d], timeout=60)
        if r.returncode != 0:
            log(f"  cluster down: {(r.stdout + r.stderr).strip()[-300:]}")
    except (OSError, subprocess.SubprocessError) as e:
        log(f"  cluster down: {e}")
    kill_leftovers(d)
    shutil.rmtree(d, ignore_errors=True)


def kill_leftovers(d):
    for pid in procs_naming(d):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            log(f"  killed leftover pid {pid}")


def run_phases(ctx, work, res, steps):
    """Runs a benchmark's phases, `steps` as (key, fn): each one's load average
    at its start goes into res, its result (unless None) into res[key]; a phase
    that raises is listed in res["failed"] and the others still run. Then every
    process the context started is stopped, leftovers naming `work` are killed
    by pid, and `work` is removed."""
    try:
        for key, fn in steps:
            res.setdefault("loadavg_at_phase_start", {})[key] = [
                round(x, 2) for x in os.getloadavg()
            ]
            try:
                out = fn()
                if out is not None:
                    res[key] = out
            except Exception as e:  # noqa: BLE001 (one phase failing must not lose the others)
                log(f"{key}: FAILED: {e}")
                res["failed"].append({"phase": key, "reason": str(e)})
    finally:
        ctx.procs.stop_all()
        kill_leftovers(work)
        shutil.rmtree(work, ignore_errors=True)
    res["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]


# Replica log lines that say why a leader changed: an election and what started it
# (the old leader's server died, it handed leadership over, a peer heard nothing for
# an election timeout or saw its connection close), and each loop's own gaps.
WHY_LEADER_CHANGED = re.compile(
    r"candidate for ballot|leader of ballot|handed its leadership over|SERVER DIED|"
    r"SERVER NOT|connection to leader|own gap of|LEADER CHECKPOINT FAILED|leader move|"
    r"REPAIR|diverge",
    re.IGNORECASE,
)


def why_leader_changed(d, limit=12):
    """The last `limit` lines of the replica logs in d that say why a leader changed
    (WHY_LEADER_CHANGED), oldest first, as one string."""
    why = []
    for f in sorted(Path(d).glob("replica-*.log")):
        with contextlib.suppress(OSError):
            text = f.read_text(errors="replace")
            why += [ln.strip() for ln in text.splitlines() if WHY_LEADER_CHANGED.search(ln)]
    why.sort()  # each line opens with its time of day
    return "; ".join(why[-limit:]) or "no replica logged why"


def leader_change(d, st):
    """None if the cluster in d still has the leader of status st; else a note naming the
    old and new leader and the replica log lines that say why (its clients were cut)."""
    now = {}
    with contextlib.suppress(Exception):
        now = cluster_status(d)
    was = (st.get("leader"), st.get("client_addr"))
    if not now or (now.get("leader"), now.get("client_addr")) == was:
        return None
    return (
        f"the leader changed during the run: replica {was[0]} at {was[1]} -> replica "
        f"{now.get('leader')} at {now.get('client_addr')}; the replica logs: "
        f"{why_leader_changed(d)}"
    )


def keep_logs(ctx, d):
    """Copies the cluster's logs (daemons', servers') out of d, which is about to go."""
    if not ctx.keep_logs:
        return
    dest = ctx.keep_logs / d.name
    for f in d.rglob("*.log"):
        (dest / f.relative_to(d)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / f.relative_to(d))
    log(f"  kept the cluster's logs in {dest}")


@contextlib.contextmanager
def lockstep_cluster(ctx, app, durability, replicas=3, extra=(), base_port=None, profile=None):
    """Yields (dir, status JSON) of a running `cluster up --app APP [EXTRA]` (--base-port
    base_port, or a free one; --app profile, a profile file, in place of APP's own);
    always brings it down."""
    why = lockstep_has_app()
    if why:
        raise Skip(why)
    d = Path(tempfile.mkdtemp(prefix=f"lockstep-{durability}-", dir=ctx.work))
    try:
        for attempt in range(3):
            base = base_port or pick_base_port()
            cmd = ["cluster", "up", "--dir", d]
            cmd += f"--replicas {replicas} --base-port {base} --app {profile or app}".split()
            cmd += f"--durability {durability} --transport shm".split() + list(extra)
            log(f"  lockstep {' '.join(map(str, cmd))}")
            r = lockstep_run(cmd)
            out = (r.stdout + r.stderr).strip()
            if r.returncode == 0:
                break
            if "--app" in out or "unknown" in out.lower():
                raise Skip(f"`lockstep cluster up --app {app}` refused: {out[-300:]}")
            if "taken" not in out or attempt == 2:
                raise RuntimeError(f"lockstep cluster up failed ({r.returncode}): {out[-1500:]}")
        st = cluster_status(d)
        if not st.get("client_addr"):
            raise Skip("`lockstep cluster status --json` has no client_addr (is --app ignored?)")
        yield d, st
    except BaseException:
        keep_logs(ctx, d)
        raise
    finally:
        tear_down_cluster(d)


def wait_applied(d, timeout=60.0):
    """Waits until every replica's applied_index is the leader's commit_index; returns
    (ok, {id: applied_index}, leader's commit_index, seconds waited)."""
    t0 = time.monotonic()
    while True:
        st = cluster_status(d)
        lead = st.get("leader")
        commit = st["replicas"][lead]["commit_index"] if lead is not None else None
        applied = {r["id"]: r["applied_index"] for r in st["replicas"]}
        # >=: the leader's commit index read first, a tick (timers_in_log) may commit before
        # a backup is asked.
        if commit is not None and all(v >= commit for v in applied.values()):
            return True, applied, commit, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return False, applied, commit, time.monotonic() - t0
        time.sleep(0.2)


def divergence_check(d, out):
    """`lockstep divergence list --json --dir D` into out["divergences"] (None if it failed);
    any report: the list, the first reports' `divergence show`, and out["reason"] unless
    one is there already."""
    r = lockstep_run(["divergence", "list", "--json", "--dir", d], timeout=60)
    try:
        div = json.loads(r.stdout) if r.returncode == 0 else None
    except json.JSONDecodeError:
        div = None
    out["divergences"] = div
    if div is None:
        out.setdefault("reason", f"divergence list failed: {(r.stdout + r.stderr)[-300:]}")
    elif div:
        text = lockstep_run(["divergence", "list", "--dir", d], timeout=60).stdout
        out["divergence_report"] = text
        log(f"  divergence reports:\n{text}")
        shows = {}  # the first reports in full: inputs, both outputs, the repair
        for rep in div[:3]:
            rid = str(rep.get("id", ""))
            r = lockstep_run(["divergence", "show", rid, "--dir", d], timeout=60)
            shows[rid] = (r.stdout + r.stderr)[:8000]
        out["divergence_shows"] = shows
        if shows:
            first = next(iter(shows.items()))
            log(f"  divergence show {first[0]}:\n{first[1][:3000]}")
        out.setdefault("reason", f"{len(div)} divergence report(s)")


def server_state(app, addr, keys):
    """What a replica's server holds, read through an inspection connection (a backup's
    own server answers only those; the leader's logs it like any input, so what is asked
    must answer the same everywhere): redis's DEBUG DIGEST (every key, value and expiry);
    memcached's `gets` of key:0 .. key:<keys-1> (value and CAS unique of each), hashed."""
    if app == "redis":
        digest = redis_call(addr, "DEBUG", "DIGEST", timeout=60, inspect=True)
        return digest.decode() if isinstance(digest, bytes) else str(digest)
    h, found = hashlib.sha256(), 0
    with inspector.connect(split_addr(addr), timeout=60) as s:
        for start in range(0, keys, 500):
            names = b" ".join(b"key:%d" % i for i in range(start, min(keys, start + 500)))
            s.sendall(b"gets " + names + b"\r\n")
            buf = b""
            while not (buf == b"END\r\n" or buf.endswith(b"\r\nEND\r\n")):
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise RuntimeError(f"{addr} closed the connection during gets")
                buf += chunk
            h.update(buf)
            found += buf.count(b"VALUE ")
    return f"{found} of {keys} keys, sha256 {h.hexdigest()[:16]}"


def replicas_agree(app, d, keys, reports_expected=False):
    """After a cluster's load: every replica applied the whole log, every replica's server
    holds the same (server_state), and (unless reports_expected: a benchmark that makes
    replicas diverge on purpose) no divergence was reported. Raises RuntimeError naming
    what differs."""
    ok, applied, commit, _ = wait_applied(d)
    if not ok:
        raise RuntimeError(f"state check: applied_index {applied}, commit_index {commit} in 60 s")
    if not reports_expected:
        out = {}
        divergence_check(d, out)  # first: a replica being repaired does not answer meanwhile
        if "reason" in out:
            raise RuntimeError(f"state check: {out['reason']}: {out.get('divergence_report')}")
    st = cluster_status(d)
    states = {r["id"]: server_state(app, r["server_addr"], keys) for r in st["replicas"]}
    log(f"  state check: {states}" + ("" if reports_expected else "; no divergence reported"))
    if len(set(states.values())) != 1:
        raise RuntimeError(f"state check: the replicas' {app} state differs: {states}")


def new_leader_addr(d, addr, app=None, timeout=30.0):
    """After a client error on the cluster in d: the client address of its leader now, if
    that is not addr (the leader changed, as it may on a loaded machine, and its clients
    lost their connections: they reconnect to the new leader, as any client must), once
    its server answers (wait_ready, for app); None if the leader is still at addr (the
    error is the run's own)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(Exception):
            now = cluster_status(d).get("client_addr")
            if now and now != addr:
                if app:
                    wait_ready(app, now, timeout=max(1.0, end - time.monotonic()))
                return now
            if now == addr:
                return None
        time.sleep(0.2)
    return None


def on_leader(run, addr, d, app, what, tries=3):
    """run(addr), run again at the new leader's address when it failed (a RuntimeError, or
    a result with "errors") because the cluster in d changed leaders (new_leader_addr); at
    most `tries` runs. d None (no cluster): once. Returns (its result, the address used)."""
    for i in range(tries):
        try:
            res, err = run(addr), None
        except RuntimeError as e:
            res, err = None, e
        failed = err is not None or (isinstance(res, dict) and res.get("errors"))
        new = failed and d is not None and i + 1 < tries and new_leader_addr(d, addr, app)
        if not new:
            if err is not None:
                raise err
            return res, addr
        log(f"  {what}: the leader moved from {addr} to {new}; measured again there")
        log(f"    why, from the replica logs: {why_leader_changed(d)}")
        addr = new
    raise AssertionError("not reached")


# The leader's lease the replicated modes run with (cluster up --lease-us): reads
# (a profile's lease_reads: redis GET) are then answered without the log while it
# holds, which issue 26's GET targets measure. 35 ms: within the default 50 ms
# election timeout with the backups' guard (consensus/core.h LeaseGuardUs).
BENCH_LEASE_US = 35000


def one_worker_profile(ctx):
    """apps/memcached.toml with its -t 4 made -t 1, written into ctx.work with its `files`
    (profiles.variant); the path."""

    def one_worker(text):
        one, n = re.subn(r"(?m)^(command = .*) -t 4 ", r"\1 -t 1 ", text)
        if n != 1:
            raise RuntimeError("apps/memcached.toml: no `command = ... -t 4 ...` line to make -t 1")
        return one

    return profiles.variant("memcached", ctx.work, one_worker, "memcached-1worker")


def mode_replicated(durability, lease_on=True, one_worker=False):
    @contextlib.contextmanager
    def mode(ctx, app):
        lease = ("--lease-us", str(BENCH_LEASE_US)) if lease_on else ()
        profile = one_worker_profile(ctx) if one_worker else None
        with lockstep_cluster(ctx, app, durability, extra=lease, profile=profile) as (d, st):
            addr = st["client_addr"]
            wait_ready(app, addr)
            reps = st["replicas"]
            pids = {"daemons": [r["pid"] for r in reps], "servers": [r["server_pid"] for r in reps]}
            # Per host (issue 26, target 3): each replica's daemon and server, the leader's
            # apart (the leader at the start; a move is logged and measured again).
            lead = [r for r in reps if r["id"] == st.get("leader")]
            rest = [r for r in reps if r["id"] != st.get("leader")]
            if lead:
                pids[HOST_CLASSES[0]] = [lead[0]["pid"], lead[0]["server_pid"]]
                pids[HOST_CLASSES[1]] = [x for r in rest for x in (r["pid"], r["server_pid"])]
            try:
                yield addr, "set", pids, d
                replicas_agree(app, d, ctx.state_keys)
                reps = cluster_status(d).get("replicas", [])
                served = sum(r.get("lease_reads", 0) for r in reps)
                missed = sum(r.get("lease_misses", 0) for r in reps)
                log(f"  reads under the lease: {served}, through the log for want of one: {missed}")
            except RuntimeError as e:  # say whether the leader moved (clients lose it then)
                moved = leader_change(d, st)
                if not moved:
                    raise
                raise RuntimeError(f"{e} [{moved}]") from e

    return mode


# name -> (JSON mode, durability, apps, reads measured, context manager)
BOTH = ("redis", "memcached")
MODES = {
    "unreplicated": ("unreplicated", "none", BOTH, True, mode_unreplicated),
    "replicated-disk": ("replicated", "disk", BOTH, True, mode_replicated("disk")),
    "replicated-memory": ("replicated", "memory", BOTH, True, mode_replicated("memory")),
    # The same without a lease: every read through the log (what lease reads gain, same run).
    "replicated-memory-nolease": (
        "replicated-nolease",
        "memory",
        BOTH,
        True,
        mode_replicated("memory", lease_on=False),
    ),
    # memcached's four worker threads (the profile's -t 4) against the one it ran before.
    "replicated-disk-1worker": (
        "replicated-1worker",
        "disk",
        ("memcached",),
        False,
        mode_replicated("disk", one_worker=True),
    ),
    "aof-always": ("aof-always", "disk", ("redis",), False, mode_aof_always),
    "redis-wait": ("redis-wait", "memory", ("redis",), False, mode_redis_wait),
}
MODES_REPLICATED = ("replicated-disk", "replicated-memory")  # what --modes replicated means


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def loadgen(app, addr, conns, op, seconds, value_size, keys, pids=None, proto=None, extra=()):
    """One loadgen run; with pids ({class: [pid]}), also the CPU time and context switches
    per op of each class of process and of loadgen itself (its rusage), as
    res["per_op"][class] = {"cpu_us", "switches"}. proto is loadgen's --proto (default:
    app); extra, more loadgen arguments (--infected-every 10)."""
    host, port = split_addr(addr)
    proto = proto or app
    cmd = [str(LOADGEN), *f"--proto {proto} --host {host} --port {port} --conns {conns}".split()]
    cmd += f"--seconds {seconds} --op {op} --value-bytes {value_size} --keys {keys}".split()
    cmd += ["--wait-replicas", "2", *map(str, extra)]
    pids = pids or {}
    rc, stdout, stderr, spent, ru = proc_usage.run_counted(cmd, pids, seconds + 60)
    if rc != 0:
        raise RuntimeError(f"loadgen failed ({rc}): {stderr.strip()} {stdout.strip()}")
    res = json.loads(stdout.strip().splitlines()[-1])
    if pids and res["ops"]:
        res["per_op"] = proc_usage.per_op(spent, ru, res["ops"])
    return res


def run_mode(ctx, app, name, a):
    mode, durability, _, reads, cm = MODES[name]
    ops = [op for op in a.ops if op == "set" or reads]
    samples = {}
    with cm(ctx, app) as (addr, set_op, pids, *cluster):
        log(f"  {addr}: writing {a.keys} keys")
        prefill(app, addr, a.keys, a.value_bytes)
        for rep in range(a.repeats):
            for conns in a.conns:
                for op in ops:
                    lg_op = set_op if op == "set" else op
                    res, addr = on_leader(
                        lambda at, c=conns, o=lg_op: loadgen(
                            app, at, c, o, a.seconds, a.value_bytes, a.keys, pids
                        ),
                        addr, cluster[0] if cluster else None, app, f"{name} {op} conns={conns}",
                    )  # fmt: skip
                    if res["errors"]:
                        # A connection cut off or an error reply (a leader change
                        # mid-run, say): this mode failed; its logs are kept.
                        raise RuntimeError(
                            f"{name} {op} conns={conns}: {res['errors']} client errors "
                            f"({res['ops']} ops done)"
                        )
                    samples.setdefault((conns, op, lg_op), []).append(res)
                    log(
                        f"  {name} {op} conns={conns} repeat {rep + 1}/{a.repeats}: "
                        f"{res['ops_per_s']:.0f} ops/s, p50 {res['p50_us']:.0f} µs, "
                        f"p99 {res['p99_us']:.0f} µs, errors {res['errors']}"
                    )
    return [
        summarise(mode, durability, conns, op, lg_op, rs)
        for (conns, op, lg_op), rs in samples.items()
    ]


def summarise(mode, durability, conns, op, lg_op, rs):
    """One row of the JSON's "runs" from the loadgen results rs of its repeats: medians,
    min and max, every sample kept."""
    tput = [r["ops_per_s"] for r in rs]
    run = {
        "mode": mode,
        "durability": durability,
        "conns": conns,
        "op": op,
        "ops_per_s": statistics.median(tput),
        "p50_us": statistics.median(r["p50_us"] for r in rs),
        "p99_us": statistics.median(r["p99_us"] for r in rs),
        "min_ops_per_s": min(tput),
        "max_ops_per_s": max(tput),
        "repeats": len(rs),
        "loadgen_op": lg_op,
        "errors": sum(r["errors"] for r in rs),
        "misses": sum(r.get("misses", 0) for r in rs),
        "samples": rs,
    }
    if all("per_op" in r for r in rs):
        run["per_op"] = {
            k: {m: statistics.median(r["per_op"][k][m] for r in rs) for m in ("cpu_us", "switches")}
            for k in rs[0]["per_op"]
        }
    return run


CLASSES = ("daemons", "servers", "loadgen")
# The same processes again, by host: the leader's daemon and server; both backups' (summed).
HOST_CLASSES = ("leader host", "backup hosts")


def all_cpu_us(per):
    """CPU µs per op of every process of a run's per_op (each counted once: not by host)."""
    return sum(x["cpu_us"] for k, x in per.items() if k not in HOST_CLASSES)


def cost_table(res):
    """CPU time and context switches per op, by class of process (issue 9)."""
    runs = [r for r in res["runs"] if r.get("per_op") and r["op"] == "set"]
    if not runs:
        return ""
    rows = [
        "| mode | conns | "
        + " | ".join(f"{c} CPU µs/op | {c} switches/op" for c in CLASSES)
        + " | all CPU µs/op |",
        "|---|---|" + "---|---|" * len(CLASSES) + "---|",
    ]
    for r in sorted(runs, key=lambda r: (r["conns"], ORDER.index(label(r)))):
        cells = []
        for c in CLASSES:
            x = r["per_op"].get(c)
            cells += [f"{x['cpu_us']:.1f}", f"{x['switches']:.2f}"] if x else ["–", "–"]
        total = all_cpu_us(r["per_op"])
        rows.append(f"| {label(r)} | {r['conns']} | " + " | ".join(cells) + f" | {total:.1f} |")
    return (
        "\n## CPU time and context switches per op, by class of process\n\n"
        "From /proc (daemons and servers: every thread) and loadgen's rusage, over each "
        "measurement; medians over repeats.\n\n" + "\n".join(rows) + "\n"
    )


def consensus_reference(ctx, seconds):
    """The replicated log's own commit p50 (shm, disk, 3 replicas, 1 client), this run."""
    d = Path(tempfile.mkdtemp(prefix="consensus-", dir=ctx.work))
    out = d / "c.json"
    cmd = shlex.split("bench consensus --transport shm --durability disk --replicas 3 --clients 1")
    cmd += f"--payload 100 --seconds {seconds:g} --base-port {pick_base_port()}".split()
    r = lockstep_run([*cmd, "--dir", d / "cluster", "--json", out], timeout=300 + 10 * seconds)
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"lockstep bench consensus failed: {r.stderr.strip()[-500:]}")
    run = json.loads(out.read_text())["runs"][0]
    return {
        "cmd": "lockstep " + " ".join(cmd),
        "commit_p50_us": run["commit_p50_us"],
        # One durable write with every replica writing at once: what an entry
        # costs at least when the replicas share this machine's disk.
        "shared_floor_p50_us": run["shared_floor_p50_us"],
        "replicas": run["replicas"],
    }


def machine(work):
    def cmd_out(*cmd):
        try:
            return subprocess.run(
                cmd, check=False, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.machine(),
    )
    mem = Path("/proc/meminfo").read_text().split()[1]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": round(int(mem) / 2**20, 1),
        "kernel": platform.release(),
        "redis": cmd_out("redis-server", "--version").replace("Redis server v=", "redis ")[:12],
        "memcached": cmd_out("memcached", "-V"),
        "work_dir_fs": (cmd_out("df", "--output=fstype", str(work)).splitlines() or ["?"])[-1],
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "git": cmd_out("git", "-C", str(ROOT), "describe", "--always", "--dirty"),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def find(runs, mode, durability, conns, op="set"):
    for r in runs:
        if (r["mode"], r["durability"], r["conns"], r["op"]) == (mode, durability, conns, op):
            return r
    return None


def label(r):
    return r["mode"] if r["mode"] != "replicated" else f"replicated/{r['durability']}"


ORDER = [
    "unreplicated",
    "replicated/disk",
    "replicated/memory",
    "replicated-nolease",
    "replicated-1worker",
    "aof-always",
    "redis-wait",
]


def table(res):
    runs = res["runs"]
    head = (
        "| mode | durability | op | conns | ops/s (median) | min–max ops/s | p50 µs | p99 µs "
        "| ops/s ÷ unrepl. | p50 − unrepl. µs |"
    )
    rows = [head, "|" + "---|" * 10]
    for r in sorted(runs, key=lambda r: (r["op"] != "set", r["conns"], ORDER.index(label(r)))):
        base = find(runs, "unreplicated", "none", r["conns"], r["op"])
        ratio = f"{r['ops_per_s'] / base['ops_per_s']:.2f}" if base and base["ops_per_s"] else "–"
        delta = f"{r['p50_us'] - base['p50_us']:+.0f}" if base else "–"
        dur = {"memory": "memory (RAM only)", "none": "none (1 process)"}.get(r["durability"])
        op = r["op"] + (" + WAIT 2 0" if r.get("loadgen_op") == "set-wait" else "")
        err = f" ({r['errors']} errors)" if r.get("errors") else ""
        rows.append(
            f"| {label(r)} | {dur or r['durability']} | {op} | {r['conns']} "
            f"| {r['ops_per_s']:.0f}{err} | {r['min_ops_per_s']:.0f}–{r['max_ops_per_s']:.0f} "
            f"| {r['p50_us']:.0f} | {r['p99_us']:.0f} | {ratio} | {delta} |"
        )
    out = "\n".join(rows) + "\n"
    for s in res.get("skipped", []):
        out += f"\nskipped: {s['mode']}/{s['durability']}: {s['reason']}"
    for s in res.get("failed", []):
        out += f"\nFAILED: {s['mode']}/{s['durability']}: {s['reason']}"
    return out + "\n"


def plot(res, path, ops=("set", "get")):
    """Throughput and latency per mode and connection count, a row of panels per op in ops
    that res["runs"] has."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = res["runs"]
    ops = [op for op in ops if any(r["op"] == op for r in runs)]
    if not ops:
        return False
    fig, axes = plt.subplots(len(ops), 2, figsize=(13, 4.2 * len(ops)), squeeze=False)
    for row, op in enumerate(ops):
        rs = [r for r in runs if r["op"] == op]
        labels = [lab for lab in ORDER if any(label(r) == lab for r in rs)]
        conns = sorted({r["conns"] for r in rs})
        w = 0.8 / len(labels)
        ax_t, ax_l = axes[row]
        for i, lab in enumerate(labels):
            xs, t, lo, hi, p50, p99 = [], [], [], [], [], []
            for j, c in enumerate(conns):
                r = next((r for r in rs if label(r) == lab and r["conns"] == c), None)
                if r:
                    xs.append(j - 0.4 + w * (i + 0.5))
                    t.append(r["ops_per_s"])
                    lo.append(r["ops_per_s"] - r["min_ops_per_s"])
                    hi.append(r["max_ops_per_s"] - r["ops_per_s"])
                    p50.append(r["p50_us"])
                    p99.append(r["p99_us"])
            color = f"C{ORDER.index(lab)}"  # the same colour for a mode in every panel
            ax_t.bar(xs, t, w, yerr=[lo, hi], capsize=2, label=lab, color=color)
            ax_l.bar(xs, p50, w, label=lab, color=color)
            ax_l.scatter(xs, p99, marker="_", s=120, color=color)
        for ax in (ax_t, ax_l):
            ax.set_xticks(range(len(conns)), [f"{c} conn" for c in conns])
        ax_t.set_ylabel("ops/s (median; bars: min–max)")
        ax_t.set_title(f"{res['app']} {op.upper()} throughput")
        ax_l.set_yscale("log")
        ax_l.set_ylabel("µs (bar: p50, dash: p99)")
        ax_l.set_title(f"{res['app']} {op.upper()} latency")
        ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(res, js):
    md, png = js.with_suffix(".md"), js.with_suffix(".png")
    from app_targets import speed_targets, targets, targets_text  # they import this module

    ts, speed = targets(res), speed_targets(res)
    res["targets"], res["speed_targets"] = ts, speed
    js.write_text(json.dumps(res, indent=1) + "\n")
    m = res["machine"]
    head = (
        f"# {res['app']} under lockstep — {m.get('date', '')}\n\n"
        f"`{res.get('command', '')}` on {m.get('cores')} cores ({m.get('cpu')}), "
        f"{m.get('redis') if res['app'] == 'redis' else m.get('memcached')}; "
        f"{res.get('seconds')} s per measurement, median of {res.get('repeats')} repeats; "
        f"load average {m.get('loadavg_start')} at start, {m.get('loadavg_end')} at the end. "
        f"Ratios are against unreplicated in this run.\n\n"
    )
    text = table(res) + cost_table(res)
    text += "\n## Targets (issues 3 and 9), from this run\n\n" + targets_text(ts)
    if speed:
        text += "\n## Targets (issue 26: CPU per op, reads), from this run\n\n"
        text += targets_text(speed)
    drew = plot(res, png)
    md.write_text(head + text + (f"\n![plot]({png.name})\n" if drew else ""))
    print(text)
    print(f"wrote {js}, {md}" + (f" and {png}" if drew else ""))


# ---------------------------------------------------------------------------


class Ctx:
    def __init__(self, work, keep_logs=None):
        self.work = work  # every directory of this run goes in here
        self.keep_logs = keep_logs  # where a failed cluster's logs are copied, if anywhere
        self.procs = Procs()
        self.state_keys = 10000  # the keys a replicated mode's state check reads (--keys)


def csv(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def work_dir(prefix, tmp=None):
    """A fresh directory for a bench's servers and clusters, under --tmp (made, with its
    parents, when it does not exist yet) or the system's temporary directory."""
    if tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=tmp))


def add_output_args(ap, name):
    """--json, --tmp and --from-json, as every app bench takes them; `name` is the JSON's
    default base name ("APP" for the app's own)."""
    ap.add_argument("--json", help=f"output (default eval/out/{name}.json); .md, .png beside it")
    ap.add_argument("--tmp", help="where the servers' and clusters' directories go")
    ap.add_argument("--from-json", help="only redraw the table and plot of an existing JSON")


def output_json(a, name):
    """Where a bench writes its JSON (--json, or eval/out/NAME.json), its folder made."""
    js = Path(a.json) if a.json else ROOT / "eval" / "out" / f"{name}.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    return js


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("app", choices=["redis", "memcached"])
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conns", type=csv(int), default=[1, 4, 16])
    ap.add_argument(
        "--modes",
        type=csv(str),
        help="unreplicated, replicated (both durabilities), replicated-disk, "
        "replicated-memory, replicated-memory-nolease, replicated-disk-1worker (memcached), "
        "aof-always, redis-wait (default: all "
        "that apply to APP but replicated-memory-nolease)",
    )
    ap.add_argument("--ops", type=csv(str), default=["set", "get"], help="set,get")
    ap.add_argument("--quick", action="store_true", help="1 and 16 conns, 1 repeat, 1 s")
    ap.add_argument("--value-bytes", type=int, default=64)
    ap.add_argument("--keys", type=int, default=10000)
    add_output_args(ap, "APP")
    a = ap.parse_args()
    js = output_json(a, a.app)
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text()), js)
        return 0
    if a.quick:
        a.conns, a.repeats, a.seconds = [1, 16], 1, 1.0
    names = [n for n, m in MODES.items() if a.app in m[2]]
    if not a.modes:
        names = [n for n in names if n != "replicated-memory-nolease"]
    if a.modes:
        want = [x for m in a.modes for x in ((m,) if m != "replicated" else MODES_REPLICATED)]
        bad = [m for m in want if m not in MODES or a.app not in MODES[m][2]]
        if bad:
            ap.error(
                f"--modes: {', '.join(bad)} not available for {a.app} (have {', '.join(names)})"
            )
        names = [n for n in names if n in want]
    if any(op not in ("set", "get") for op in a.ops) or "set" not in a.ops:
        ap.error("--ops takes set or set,get")
    if not LOADGEN.exists():
        sys.exit(f"{LOADGEN} is not built (cmake --build build)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    work = work_dir("lockstep-bench-", a.tmp)
    ctx = Ctx(work, keep_logs=js.parent / f"{a.app}-failed-logs")
    ctx.state_keys = a.keys
    res = {
        "app": a.app,
        "command": "scripts/bench " + " ".join(sys.argv[1:]),
        "seconds": a.seconds,
        "repeats": a.repeats,
        "runs": [],
        "skipped": [],
        "failed": [],
        "machine": machine(work),
    }
    n_meas = len(a.conns) * a.repeats
    log(f"{a.app}: modes {', '.join(names)}; {n_meas} measurements of {a.seconds:g} s per op")
    try:
        for name in names:
            mode, durability = MODES[name][0], MODES[name][1]
            log(f"{name}:")
            try:
                res["runs"] += run_mode(ctx, a.app, name, a)
            except Skip as e:
                log(f"  skipped: {e}")
                res["skipped"].append({"mode": mode, "durability": durability, "reason": str(e)})
            except Exception as e:  # noqa: BLE001 (one mode failing must not lose the others)
                log(f"  FAILED: {e}")
                res["failed"].append({"mode": mode, "durability": durability, "reason": str(e)})
        if find(res["runs"], "replicated", "disk", 1):
            log("lockstep bench consensus (the log's own commit p50, for the added-latency target)")
            try:
                res["reference"] = consensus_reference(ctx, a.seconds)
            except Exception as e:  # noqa: BLE001
                log(f"  failed: {e}")
    finally:
        ctx.procs.stop_all()
        kill_leftovers(work)
        shutil.rmtree(work, ignore_errors=True)
    res["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report(res, js)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
