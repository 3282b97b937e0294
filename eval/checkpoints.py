#!/usr/bin/env python3
"""Checkpoint benchmark (issue 7's targets): redis with many keys under lockstep.

    scripts/bench checkpoints [--keys 1000000] [--history 10000,100000,1000000] [--quick]
                              [--build DIR] [--phases checkpoint,restart,baseline]
    .venv/bin/python eval/checkpoints.py [same options]
    .venv/bin/python eval/checkpoints.py --from-json eval/out/checkpoints.json  (redraw only)

Every figure is compared with a baseline measured in this run. Three clusters, one after the
other (`lockstep cluster up --replicas 3 --app redis`), each first filled with --keys keys of
--value-bytes bytes (key:0 .. key:N-1, pipelined through the leader's redis):

  A  --checkpoint-entries 10^9: only the checkpoints this benchmark asks for.
     1. Checkpoint of a backup's redis: `lockstep checkpoint now --id B --wait`, then
        `checkpoint list --json` (dump_us, bytes); idle and under a light load (loadgen, 4
        connections), where `cluster status --json` is polled to find how long the backup's
        applied_index stood still while the leader's commit index moved (its applying paused).
        Baseline: a plain redis-server with the same keys, its own SAVE (RDB) time and the
        fork time of a BGSAVE (latest_fork_usec): the pause redis itself would impose.
     2. The leader's SET p99 at 16 connections (build/bin/loadgen, --seconds long) while the
        backups checkpoint back to back (alternating), against the same load with no
        checkpoint, windows interleaved, --repeats times; ratio of the medians.
     5. State transfer: a backup is SIGKILLed, its directory removed (log, checkpoints,
        data) and `cluster restart`ed: it fetches its peer's checkpoint. Baseline: the same
        backup restarted from its own checkpoint just before. --transfers times.
  B  the default checkpoint policy, and  C  --no-checkpoints (the baseline: a restart replays
     the whole log). For each history length H (log entries; loadgen's single SETs with 64
     connections over the same keys, so the data stays --keys keys): stop the load, SIGKILL
     a backup's daemon (its pid from `cluster status --json`), `lockstep cluster restart`,
     and time until its applied_index reaches the leader's commit index ("applied") and
     DEBUG DIGEST of its redis equals the leader's ("in sync"). loadgen writes one value
     everywhere, so a marker key is written last (on one connection to the leader kept open)
     to make the digest cover the whole log. A restart may take --replay-cap seconds, and
     --sync-cap more from "applied" to "in sync". C gets --baseline-budget seconds for its
     histories; a history that would not fit is not run, and the report says so.
     3. restart time against history length, with and without checkpoints;
     4. log disk usage (replica-N/log/seg-*: file sizes and allocated blocks) and checkpoint
        sizes after the run, B against C.

--build DIR runs DIR/bin/lockstep and DIR/bin/loadgen instead of build/ (for a clean build
of a commit while build/ is rebuilt from sources being edited). Writes
eval/out/checkpoints.json (every measurement, the machine, the commit, the load average at
each phase), checkpoints.md (targets, measured, baseline, ratio, PASS/SHORT) and
checkpoints.png (restart time against history length; p99 with and without a checkpoint).
Progress goes to stderr; the table is printed at the end. Exit status 1 if a phase failed.
"""

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from checkpoints_report import (
    FLAT_FACTOR,
    TARGET_CHECKPOINT_MS,
    TARGET_P99_RATIO,
    TARGET_RESTART_S,
    TARGET_TRANSFER_S,
    report,
    restart_text,
)
from resp import Redis, RespError  # eval/resp.py

import apps  # eval/apps.py: cluster handling, ports, clean-up by pid, machine description
from apps import LOADGEN, lockstep_run, log, split_addr

ROOT = apps.ROOT
MARKER = "lockstep-bench:marker"  # written last before a restart (see restart_once)
HISTORY_CONNS = 64  # loadgen connections that drive the history (most entries/s here)


class Failed(Exception):
    pass


# ---------------------------------------------------------------------------
# Clusters, redis, loadgen
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def cluster(ctx, name, extra):
    """Yields the directory of a running `cluster up --app redis EXTRA`; always brings it down."""
    d = Path(tempfile.mkdtemp(prefix=f"cluster-{name}-", dir=ctx.work))
    try:
        for attempt in range(3):
            base = apps.pick_base_port()
            cmd = ["cluster", "up", "--dir", d, "--replicas", "3", "--base-port", base]
            cmd += ["--app", "redis", *extra]
            log(f"{name}: lockstep {' '.join(map(str, cmd))}")
            r = lockstep_run(cmd)
            out = (r.stdout + r.stderr).strip()
            if r.returncode == 0:
                break
            if "taken" not in out or attempt == 2:
                raise Failed(f"lockstep cluster up failed ({r.returncode}): {out[-1500:]}")
        apps.wait_ready("redis", apps.cluster_status(d)["client_addr"])
        yield d
    except BaseException:
        keep_logs(ctx, d)
        raise
    finally:
        apps.tear_down_cluster(d)


def keep_logs(ctx, d):
    dest = ctx.failed_logs / d.name
    for f in d.glob("*.log"):
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / f.name)
    for f in d.glob("replica-*/*.log"):
        (dest / f.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / f.parent.name / f.name)
    if dest.exists():
        log(f"  kept the cluster's logs in {dest}")


def status(d):
    return apps.cluster_status(d)


def leader_of(st):
    return next((r for r in st["replicas"] if r and r.get("role") == "leader"), None)


def replica(st, rid):
    return next((r for r in st["replicas"] if r and r.get("id") == rid), None)


def backups(st):
    return [r["id"] for r in st["replicas"] if r and r.get("role") == "backup"]


def wait_quiet(d, timeout=120.0):
    """Waits until every replica applied the leader's whole log and none is checkpointing."""
    end, last, stable = time.monotonic() + timeout, None, 0
    while time.monotonic() < end:
        with contextlib.suppress(RuntimeError, json.JSONDecodeError, subprocess.SubprocessError):
            st = status(d)
            ld = leader_of(st)
            reps = [r for r in st["replicas"] if r]
            if ld and len(reps) == 3 and ld["commit_index"] == ld["last_index"]:
                # Not the commit index: redis's ticks (timers_in_log) move it ten times a
                # second on an idle cluster.
                key = tuple(cp_field(r, "taken") for r in reps)
                ok = all(r["applied_index"] >= ld["commit_index"] for r in reps)
                ok = ok and not any(cp_field(r, "dumping", False) for r in reps)
                stable = stable + 1 if ok and key == last else 0
                last = key
                if stable >= 3:  # ~3 polls with nothing moving: also no commit thread starting
                    return st
        time.sleep(0.2)
    raise Failed(f"cluster in {d} not quiet after {timeout:.0f} s (last: {last})")


def wait_checkpoints_settled(d, quiet_s=3.0, timeout=90.0):
    """Waits until no checkpoint is being dumped or committed: the list of checkpoints stays
    the same for quiet_s (a commit, hashing and fsyncing the images, shows only at its end)."""
    end, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < end:
        cur = sorted((c["replica"], c["index"]) for c in checkpoint_list(d))
        if cur != last:
            last, since = cur, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return wait_quiet(d)
        time.sleep(0.5)
    return wait_quiet(d)


def redis_call(addr, *args, timeout=30.0, inspect=False):
    c = Redis(split_addr(addr), timeout=timeout, inspect=inspect)
    try:
        return c.call(*args)
    finally:
        c.close()


def load_keys(addr, keys, size, batch=2000, timeout=900.0):
    """SET key:0 .. key:<keys-1> (loadgen's value pattern), pipelined; progress on stderr."""
    val, t0 = apps.value_bytes(size), time.monotonic()
    end, step, shown = t0 + timeout, max(keys // 10, 1), 0
    with socket.create_connection(split_addr(addr), timeout=60) as s:
        for start in range(0, keys, batch):
            if time.monotonic() > end:
                raise Failed(f"loading {keys} keys into {addr}: only {start} after {timeout} s")
            idx = range(start, min(keys, start + batch))
            s.sendall(b"".join(Redis.encode("SET", f"key:{i}", val) for i in idx))
            buf, want = b"", b"+OK\r\n" * len(idx)
            while len(buf) < len(want):
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise Failed(f"{addr} closed the connection while loading keys")
                buf += chunk
            if buf != want:
                raise Failed(f"loading keys into {addr} got {buf[:80]!r}")
            if start + len(idx) >= shown + step:
                shown = start + len(idx)
                log(f"  loaded {shown}/{keys} keys ({time.monotonic() - t0:.1f} s)")
    return time.monotonic() - t0


def loadgen_cmd(addr, conns, seconds, keys, size, ops_per_conn=0):
    host, port = split_addr(addr)
    cmd = [str(LOADGEN), *f"--proto redis --host {host} --port {port} --conns {conns}".split()]
    cmd += f"--seconds {seconds:g} --op set --value-bytes {size} --keys {keys}".split()
    if ops_per_conn:
        cmd += ["--ops-per-conn", str(ops_per_conn)]
    return cmd


def start_loadgen(ctx, *args, **kw):
    p = subprocess.Popen(
        loadgen_cmd(*args, **kw),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    p.cmd_name, p.logpath = "loadgen", os.devnull
    ctx.procs.procs.append(p)  # stopped by its pid if we leave early
    return p


def finish_loadgen(ctx, p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        ctx.procs.stop(p)
    lines = out.strip().splitlines()
    if not lines:
        raise Failed(f"loadgen printed nothing (exit {p.returncode}): {err.strip()[-300:]}")
    res = json.loads(lines[-1])
    if p.returncode != 0:
        res["lost"] = err.strip()[-300:] or f"exit {p.returncode}"
    return res


def run_loadgen(ctx, addr, conns, seconds, keys, size, ops_per_conn=0):
    p = start_loadgen(ctx, addr, conns, seconds, keys, size, ops_per_conn=ops_per_conn)
    return finish_loadgen(ctx, p, seconds + 60)


def checkpoint_now(d, bid, timeout=90.0, or_another=True):
    """`checkpoint now --id B --wait`; returns {index, dump_us, bytes, wall_s, replica} or
    raises.

    `--wait` returns when the replica's count of checkpoints taken moves, which may be a
    checkpoint of its own policy that was still being committed (hashed, fsynced) when this
    one was asked for: then this waits for one at or past the index the replica had applied
    when it was asked, which is the one asked for.

    A leader never checkpoints on request, and the leadership may move to B between the
    caller's look at the status and the request (CI's loaded machine: "replica 0 is not a
    backup"): with or_another, another backup of the moment is asked instead (the result
    names it), up to three times."""
    for _ in range(3):
        try:
            return checkpoint_now_of(d, bid, timeout)
        except NotABackup:
            if not or_another:
                raise
            time.sleep(0.5)  # the election's end
            bs = backups(wait_quiet(d))
            if not bs:
                raise
            log(f"  replica {bid} leads now: checkpointing replica {bs[0]} instead")
            bid = bs[0]
    return checkpoint_now_of(d, bid, timeout)


class NotABackup(Failed):
    """`checkpoint now` refused: the replica leads."""


def checkpoint_now_of(d, bid, timeout):
    rep = replica(status(d), bid) or {}
    applied = rep.get("applied_index", 0)
    t0 = time.monotonic()
    try:
        r = lockstep_run(["checkpoint", "now", "--id", bid, "--wait", "--dir", d], timeout)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"checkpoint now --id {bid} --wait: no answer in {timeout:.0f} s") from e
    t1 = time.monotonic()
    out = (r.stdout + r.stderr).strip()
    m = re.search(r"checkpoint (\d+) taken", out)
    if r.returncode != 0 or not m:
        kind = NotABackup if "is not a backup" in out else Failed
        raise kind(f"checkpoint now --id {bid}: {out[-400:]}")
    index, early = int(m.group(1)), None
    if index < applied:
        early = index
        end = t0 + timeout
        while time.monotonic() < end:
            cps = [c for c in checkpoint_list(d) if c["replica"] == bid and c["index"] >= applied]
            if cps:
                index, t1 = min(c["index"] for c in cps), time.monotonic()
                break
            time.sleep(0.05)
        else:
            raise Failed(f"checkpoint now --id {bid}: none at or past {applied} in {timeout} s")
    cp = next((c for c in checkpoint_list(d) if c["replica"] == bid and c["index"] == index), {})
    res = {
        "replica": bid,
        "index": index,
        "applied_when_asked": applied,
        "dump_us": cp.get("dump_us"),
        "bytes": cp.get("bytes"),
        "ok": cp.get("ok"),
        "wall_s": t1 - t0,
        "t0": t0,
        "t1": t1,
    }
    if early is not None:
        res["wait_returned_older"] = early
    return res


def checkpoint_list(d):
    r = lockstep_run(["checkpoint", "list", "--json", "--dir", d], timeout=60)
    if r.returncode != 0:
        raise Failed(f"checkpoint list: {(r.stdout + r.stderr).strip()[-300:]}")
    return json.loads(r.stdout)


class Poller:
    """Samples `cluster status --json` in a thread: [(t, {id: applied}, leader commit)]."""

    def __init__(self, d):
        self.d, self.samples, self.stop_ = d, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop_.is_set():
            t0 = time.monotonic()
            with contextlib.suppress(Exception):
                st = status(self.d)
                ld = leader_of(st)
                applied = {r["id"]: r["applied_index"] for r in st["replicas"] if r}
                t = (t0 + time.monotonic()) / 2
                self.samples.append((t, applied, ld["commit_index"] if ld else None))
            self.stop_.wait(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_.set()
        self.thread.join(30)


def applying_pause(samples, bid, t_from, t_to):
    """Longest time backup bid's applied_index stood still while the leader committed more,
    between t_from and t_to: (lower bound, upper bound) in seconds from the samples' times."""
    pts = [(t, a.get(bid), c) for t, a, c in samples if a.get(bid) is not None and c is not None]
    best = (0.0, 0.0)
    i = 0
    while i < len(pts):
        j = i
        while j + 1 < len(pts) and pts[j + 1][1] == pts[i][1]:
            j += 1
        moved = pts[j][2] > pts[i][1]  # the leader had more than this backup had applied
        overlaps = pts[i][0] <= t_to and pts[j][0] >= t_from
        if moved and overlaps and j > i:
            lo = pts[j][0] - pts[i][0]
            hi = (pts[j + 1][0] if j + 1 < len(pts) else pts[j][0]) - (
                pts[i - 1][0] if i > 0 else pts[i][0]
            )
            best = max(best, (lo, hi))
        i = j + 1
    return best


# ---------------------------------------------------------------------------
# Phase A: checkpoint time and the leader's p99 while a backup checkpoints
# ---------------------------------------------------------------------------


def plain_redis_baseline(ctx, a):
    """A plain redis with the same keys: SAVE time, RDB size, BGSAVE fork time."""
    p, addr = apps.start_server(ctx, "redis", "plain-redis")
    try:
        log(f"plain redis at {addr}: loading {a.keys} keys")
        load_s = load_keys(addr, a.keys, a.value_bytes)
        used = int(re.search(rb"used_memory:(\d+)", redis_call(addr, "INFO", "memory")).group(1))
        saves = []
        for _ in range(3):
            t0 = time.monotonic()
            redis_call(addr, "SAVE", timeout=300)
            saves.append(time.monotonic() - t0)
        data_dir = Path(p.args[p.args.index("--dir") + 1])
        rdb = (data_dir / "dump.rdb").stat().st_size
        forks = []
        for _ in range(3):
            redis_call(addr, "BGSAVE")
            end = time.monotonic() + 300
            while time.monotonic() < end:
                info = redis_call(addr, "INFO", "persistence")
                if b"rdb_bgsave_in_progress:0" in info:
                    break
                time.sleep(0.05)
            stats = redis_call(addr, "INFO", "stats")
            forks.append(int(re.search(rb"latest_fork_usec:(\d+)", stats).group(1)))
        res = {
            "keys": a.keys,
            "load_s": load_s,
            "used_memory": used,
            "save_s": saves,
            "save_s_median": statistics.median(saves),
            "rdb_bytes": rdb,
            "bgsave_fork_us": forks,
            "bgsave_fork_us_median": statistics.median(forks),
        }
        log(
            f"  plain redis: {used / 1e6:.0f} MB used, SAVE {res['save_s_median'] * 1000:.0f} ms "
            f"({rdb / 1e6:.0f} MB RDB), BGSAVE fork {res['bgsave_fork_us_median'] / 1000:.1f} ms"
        )
        return res
    finally:
        ctx.procs.stop(p)


def phase_checkpoint(ctx, a, res):
    with cluster(ctx, "A", ["--checkpoint-entries", "1000000000"]) as d:
        st = status(d)
        addr = st["client_addr"]
        log(f"A: loading {a.keys} keys of {a.value_bytes} bytes into {addr}")
        res["load_s"] = load_keys(addr, a.keys, a.value_bytes)
        st = wait_quiet(d)
        bs = backups(st)
        b0 = replica(st, bs[0])
        dbsize = redis_call(b0["server_addr"], "DBSIZE", inspect=True)
        info = redis_call(b0["server_addr"], "INFO", "memory", inspect=True)
        used = int(re.search(rb"used_memory:(\d+)", info).group(1))
        res["data"] = {"keys": a.keys, "dbsize_backup": dbsize, "used_memory_backup": used}
        res["data"]["commit_index_after_load"] = leader_of(st)["commit_index"]
        log(f"A: backup {bs[0]}'s redis holds {dbsize} keys, {used / 1e6:.0f} MB")

        # 1. checkpoint time, idle, then under a light load with the pause measured
        wait_checkpoints_settled(d)  # the policy's checkpoints during the load (log bytes)
        idle = []
        for i in range(a.checkpoints):
            cp = checkpoint_now(d, bs[i % len(bs)])
            idle.append(cp)
            log(
                f"A: idle checkpoint {i + 1}/{a.checkpoints} on replica {cp['replica']}: dump "
                f"{cp['dump_us'] / 1000:.0f} ms, {cp['bytes'] / 1e6:.0f} MB, --wait "
                f"{cp['wall_s']:.2f} s"
            )
        res["idle"] = idle
        loaded = []
        for i in range(a.checkpoints):
            st = wait_quiet(d)
            bid = backups(st)[i % 2]
            lg = start_loadgen(ctx, st["client_addr"], 4, 30, a.keys, a.value_bytes)
            try:
                time.sleep(1.0)
                with Poller(d) as pol:
                    time.sleep(0.3)
                    cp = checkpoint_now(d, bid)
                    time.sleep(0.5)
            finally:
                ctx.procs.stop(lg)  # SIGTERM by pid; its numbers are not needed here
            lo, hi = applying_pause(pol.samples, cp["replica"], cp["t0"], cp["t1"])
            cp.update(pause_lo_s=lo, pause_hi_s=hi, poll_samples=len(pol.samples))
            loaded.append(cp)
            log(
                f"A: checkpoint under load {i + 1}/{a.checkpoints} on replica {bid}: dump "
                f"{cp['dump_us'] / 1000:.0f} ms, applying paused {lo * 1000:.0f}–{hi * 1000:.0f}"
                f" ms ({len(pol.samples)} status polls), --wait {cp['wall_s']:.2f} s"
            )
        res["loaded"] = loaded
        res["loaded_conns"] = 4

        # 2. the leader's SET p99 at 16 connections, with and without a backup checkpointing
        windows = []
        for rep in range(a.repeats):
            order = ("without", "with") if rep % 2 == 0 else ("with", "without")
            for kind in order:
                windows.append(p99_window(ctx, d, a, kind, rep))
        res["windows"] = windows

        # 5. state transfer: a wiped backup comes back from its peer's checkpoint; the
        # baseline is the same backup restarted from its own checkpoint right after. The
        # peer checkpoints last, so that its checkpoint is the newest one: the leader keeps
        # its log from the newest checkpoint any backup holds, and a backup whose own
        # checkpoint was the newest cannot be refilled from the other's once wiped.
        lc, transfers = LeaderConn(d), []
        res["transfers"] = transfers  # kept whatever happens below
        with contextlib.closing(lc):
            for i in range(a.transfers):
                try:
                    transfer_pair(d, a, i, lc, transfers)
                except Failed as e:
                    log(f"A: state transfer {i + 1}: FAILED: {e}")
                    transfers.append({"error": str(e)})
                    break


def transfer_pair(d, a, i, lc, transfers):
    """One state transfer (a wiped backup) and its baseline (a restart of the same backup
    from its own checkpoint), appended to transfers as they are measured."""
    st = wait_quiet(d)
    bid, other = backups(st)[i % 2], backups(st)[(i + 1) % 2]
    checkpoint_now(d, bid, or_another=False)  # these two: the test is about them
    src = checkpoint_now(d, other, or_another=False)
    t = {"replica": bid, "source": other, "source_checkpoint": src}
    transfers.append(t)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        first = leader_of(status(d))["first_index"]
        if first > 2:
            break
        time.sleep(0.2)
    t["leader_first_index"] = first
    t["wiped"] = restart_once(d, bid, a.replay_cap, a.sync_cap, lc, wipe=True)
    log(
        f"A: replica {bid} wiped and restarted: {restart_text(t['wiped'])}; "
        f"fetched {t['wiped'].get('fetched')} checkpoint(s) of "
        f"{src['bytes'] / 1e6:.0f} MB from replica {other} (leader's log starts "
        f"at {first})"
    )
    t["local"] = restart_once(d, bid, a.replay_cap, a.sync_cap, lc)
    log(f"A: restart of replica {bid} from its own checkpoint: {restart_text(t['local'])}")


def p99_window(ctx, d, a, kind, rep):
    for attempt in range(3):
        st = wait_quiet(d)
        taken0 = {r["id"]: r["checkpoint"]["taken"] for r in st["replicas"]}
        bs, cps, stop = backups(st), [], threading.Event()
        errors = []

        def checkpoints_back_to_back(bs=bs, cps=cps, stop=stop, errors=errors):
            i = 0
            while not stop.is_set() and i < 1000:
                try:
                    cps.append(checkpoint_now(d, bs[i % len(bs)]))
                except Failed as e:
                    errors.append(str(e))
                    return
                i += 1

        t0 = time.monotonic()
        lg = start_loadgen(ctx, st["client_addr"], 16, a.seconds, a.keys, a.value_bytes)
        th = None
        if kind == "with":
            th = threading.Thread(target=checkpoints_back_to_back, daemon=True)
            th.start()
        try:
            r = finish_loadgen(ctx, lg, a.seconds + 60)
        finally:
            stop.set()
            if th:
                th.join(120)
        t1 = t0 + r["seconds"]
        st = status(d)
        taken1 = {x["id"]: x["checkpoint"]["taken"] for x in st["replicas"] if x}
        stray = sum(taken1.get(k, 0) - v for k, v in taken0.items()) - len(cps)
        cover = sum(max(0.0, min(c["t1"], t1) - max(c["t0"], t0)) for c in cps)
        w = {
            "kind": kind,
            "repeat": rep,
            "conns": 16,
            "seconds": r["seconds"],
            "ops_per_s": r["ops_per_s"],
            "p50_us": r["p50_us"],
            "p99_us": r["p99_us"],
            "errors": r["errors"],
            "checkpoints": [{k: v for k, v in c.items() if k not in ("t0", "t1")} for c in cps],
            "checkpoint_cover": cover / max(r["seconds"], 1e-9),
            "stray_checkpoints": stray,
            "checkpoint_errors": errors,
        }
        if "lost" in r:
            w["lost"] = r["lost"]
        log(
            f"A: p99 window {kind} checkpoint (repeat {rep + 1}/{a.repeats}): "
            f"{r['ops_per_s']:.0f} ops/s, p50 {r['p50_us']:.0f} µs, p99 {r['p99_us']:.0f} µs; "
            f"{len(cps)} checkpoints covering {w['checkpoint_cover'] * 100:.0f}% of the window"
            + (f"; {stray} not ours" if stray else "")
            + (f"; errors: {errors}" if errors else "")
        )
        if stray <= 0 and (kind == "without" or cps):
            return w
        log("  window spoiled (a checkpoint ran when none should, or none ran); again")
    return w | {"spoiled": True}


# ---------------------------------------------------------------------------
# Phases B and C: restart time against history length, log and checkpoint sizes
# ---------------------------------------------------------------------------


def drive_to(ctx, d, a, target, deadline):
    """Single SETs from loadgen (64 connections) until the leader's commit index ≥ target."""
    t0 = time.monotonic()
    for _ in range(500):
        st = status(d)
        ld = leader_of(st)
        if ld is None:
            time.sleep(0.2)
            continue
        commit = ld["commit_index"]
        if commit >= target:
            return st
        left = deadline - time.monotonic()
        if left <= 0:
            raise Failed(f"history of {target} entries not reached in time (commit {commit})")
        chunk = min(target - commit, 200_000)
        per = math.ceil(chunk / HISTORY_CONNS)
        r = run_loadgen(
            ctx, st["client_addr"], HISTORY_CONNS, min(left, 600), a.keys, a.value_bytes, per
        )
        log(
            f"  commit {commit} → {target}: {r['ops']} SETs at {r['ops_per_s']:.0f}/s "
            f"({time.monotonic() - t0:.0f} s)" + (f"; {r['lost']}" if "lost" in r else "")
        )
        if r["ops"] == 0:
            time.sleep(1.0)  # a new leader refuses clients while it catches up
    raise Failed(f"history of {target} entries not reached (500 rounds)")


def proc_dead(pid):
    """True once every thread of pid has exited: a killed process's main thread turns zombie
    before its other threads have let go of its files (a thread in uninterruptible I/O)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for t in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{t}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            return False
    return True


def alive(d, rid):
    """Whether replica rid's daemon (its pid file in d) is running."""
    try:
        pid = int((d / f"replica-{rid}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return not proc_dead(pid)


def wait_dead(pid, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc_dead(pid):
            return True
        time.sleep(0.01)
    return False


RESTORE_RE = re.compile(r"restored checkpoint (\d+) in (\d+) ms")


def cp_field(rep, key, default=0):
    """A field of a replica's "checkpoint" status object (absent with --no-checkpoints)."""
    return (rep.get("checkpoint") or {}).get(key, default)


class LeaderConn:
    """One connection to the leader's redis, kept open across restarts of backups: each
    command on it is an input like any other, but no connection opens or closes around it
    (short-lived connections lose inputs on backups with this build; see the report)."""

    def __init__(self, d):
        self.d, self.addr, self.conn = d, None, None

    def call(self, st, *args, timeout=120.0):
        """Sends one command to the leader named in st; after a failover the old leader's
        connections are closed, so a lost connection is opened again (to the leader named by
        a fresh status) once."""
        for attempt in range(2):
            addr = st["client_addr"]
            if self.conn is None or addr != self.addr:
                self.close()
                self.addr, self.conn = addr, Redis(split_addr(addr), timeout=timeout)
            self.conn.sock.settimeout(timeout)
            try:
                return self.conn.call(*args)
            except (ConnectionError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
                time.sleep(0.5)
                st = status(self.d)
        return None

    def close(self):
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        self.conn = None


def restart_once(d, bid, cap, sync_cap, lc, wipe=False):
    """SIGKILL replica bid's daemon (with wipe, then remove its directory: log, checkpoints,
    data), `cluster restart`, time until it is in sync: its
    applied_index reaches the leader's commit index and its DEBUG DIGEST equals the leader's.
    Gives up cap s after the restart, or sync_cap s after applied_index got there.
    Also keeps a timeline of (s, applied_index, DBSIZE, marker there) of the replica."""
    st = wait_quiet(d)
    # loadgen writes one value everywhere, so a checkpoint's data already has the digest the
    # whole log gives: a fresh marker written last makes the digest cover the suffix too (the
    # server executes inputs in log order, so with the marker it has executed all before it).
    token = f"{bid}-{time.time_ns()}"
    lc.call(st, "SET", MARKER, token)
    st = wait_quiet(d)
    ld, rep = leader_of(st), replica(st, bid)
    # The reference digest comes from another backup's redis directly, not through the
    # leader: there it would be an input in the log, and every restart would replay every
    # earlier round's DEBUG DIGEST of 1M keys (seconds each) before reaching the marker.
    ref = next((r for r in st["replicas"] if r["id"] not in (bid, ld["id"])), ld)
    deadline = time.monotonic() + 60
    while redis_call(ref["server_addr"], "GET", MARKER, inspect=True) != token.encode():
        if time.monotonic() > deadline:
            raise Failed(f"replica {ref['id']} never showed the marker")
        time.sleep(0.05)
    digest = redis_call(ref["server_addr"], "DEBUG", "DIGEST", timeout=120, inspect=True)
    dbsize = redis_call(ref["server_addr"], "DBSIZE", inspect=True)
    target = ld["commit_index"]
    logf = d / f"replica-{bid}.log"
    log_from = logf.stat().st_size if logf.exists() else 0
    res = {
        "replica": bid,
        "commit_index": target,
        "first_index": rep["first_index"],
        "newest_checkpoint": cp_field(rep, "index"),
        "digest": digest.decode() if isinstance(digest, bytes) else str(digest),
        "dbsize": dbsize,
    }
    # Was this backup's redis in sync before it was killed?
    with contextlib.suppress(OSError, RespError):
        before = redis_call(rep["server_addr"], "DEBUG", "DIGEST", timeout=120, inspect=True)
        res["in_sync_before_kill"] = before == digest
        if before != digest:
            res["dbsize_before_kill"] = redis_call(rep["server_addr"], "DBSIZE", inspect=True)
    os.kill(rep["pid"], signal.SIGKILL)
    t_kill = time.monotonic()
    if not wait_dead(rep["pid"], 10):
        raise Failed(f"replica {bid}'s daemon (pid {rep['pid']}) alive 10 s after SIGKILL")
    if rep.get("server_pid") and not wait_dead(rep["server_pid"], 10):
        res["server_survived_daemon"] = True
        log(f"  replica {bid}'s redis (pid {rep['server_pid']}) outlived its daemon; killing it")
        with contextlib.suppress(OSError):
            os.kill(rep["server_pid"], signal.SIGKILL)
        wait_dead(rep["server_pid"], 10)
    res["kill_to_dead_s"] = time.monotonic() - t_kill
    if wipe:
        shutil.rmtree(d / f"replica-{bid}")
        res["wiped"] = True
    t0 = time.monotonic()
    r = lockstep_run(["cluster", "restart", "--id", bid, "--dir", d], timeout=60)
    res["restart_cmd_s"] = time.monotonic() - t0
    if r.returncode != 0:
        raise Failed(f"cluster restart --id {bid}: {(r.stdout + r.stderr).strip()[-400:]}")
    restart_failures, hangs = [], []
    end, applied_s, now, timeline, last = t0 + cap, None, None, [], None
    while time.monotonic() < min(end, t0 + (applied_s or cap) + sync_cap):
        with contextlib.suppress(Exception):
            now = replica(status(d), bid)
        if now and now.get("role") == "down" and time.monotonic() - t0 > 3 and not alive(d, bid):
            # the restarted daemon exited: say why (its log), and start it once more
            text = logf.read_text(errors="replace")[log_from:] if logf.exists() else ""
            lines = [ln for ln in text.splitlines() if "slept" not in ln and "slow " not in ln]
            restart_failures.append(
                {"after_s": round(time.monotonic() - t0, 3), "log_tail": lines[-5:]}
            )
            log(f"  replica {bid}'s daemon exited after `cluster restart`: {lines[-1:]}")
            if len(restart_failures) > 1:
                break
            lockstep_run(["cluster", "restart", "--id", bid, "--dir", d], timeout=60)
            continue
        size = mark = None
        # Its redis is asked only once the daemon has applied everything (so after any
        # restore); short timeouts, and a call that times out is recorded.
        if now and now["applied_index"] >= target:
            applied_s = applied_s or time.monotonic() - t0
            t_call = time.monotonic()
            try:
                size = redis_call(now["server_addr"], "DBSIZE", timeout=3, inspect=True)
                mark = redis_call(now["server_addr"], "GET", MARKER, timeout=3, inspect=True)
            except TimeoutError:
                hangs.append(round(t_call - t0, 3))
            except (OSError, RespError):
                pass
            if size == dbsize and mark == token.encode():
                t_ask, got = time.monotonic() - t0, None
                with contextlib.suppress(OSError, RespError):
                    got = redis_call(
                        now["server_addr"], "DEBUG", "DIGEST", timeout=120, inspect=True
                    )
                if got == digest:
                    # in sync by the time the digest was asked for; its answer came later
                    res["in_sync_s"], res["confirmed_s"] = t_ask, time.monotonic() - t0
        if now:
            point = (now["applied_index"], size, mark == token.encode(), now.get("role"))
            if point != last:
                timeline.append((round(time.monotonic() - t0, 3), *point))
                last = point
        if "in_sync_s" in res:
            break
        time.sleep(0.02)
    with contextlib.suppress(Exception):
        after = leader_of(status(d))
        res["leader_before"], res["leader_after"] = ld["id"], after and after["id"]
    res["applied_s"] = applied_s
    res["capped"] = "in_sync_s" not in res
    if restart_failures:
        res["restart_failures"] = restart_failures
    if hangs:
        res["inspection_timeouts_at_s"] = hangs
    res["cap_s"] = cap
    res["sync_cap_s"] = sync_cap
    res["timeline"] = timeline
    if now:
        res["applied_index_at_end"] = now["applied_index"]
        res["restored_from"] = cp_field(now, "restored_from")
        res["restores"] = cp_field(now, "restores")
        res["fetched"] = cp_field(now, "fetched", None)
    text = logf.read_text(errors="replace")[log_from:] if logf.exists() else ""
    m = RESTORE_RE.search(text)
    if m:
        res["restored_from"], res["restore_ms"] = int(m.group(1)), int(m.group(2))
    res["replayed"] = target - res.get("restored_from", 0)
    keys = ("restored", "recovered", "checkpoint", "replaying", "FAIL", "NOT", "DIED", "transfer")
    res["log_lines"] = [ln for ln in text.splitlines() if any(k in ln for k in keys)][:12]
    return res


def disk_usage(d):
    out = {}
    for rdir in sorted(d.glob("replica-*/")):
        segs = sorted(rdir.glob("log/seg-*"))
        sts = [s.stat() for s in segs]
        out[rdir.name] = {
            "segments": len(segs),
            "log_bytes": sum(s.st_size for s in sts),
            "log_alloc_bytes": sum(s.st_blocks * 512 for s in sts),
        }
    return out


def phase_restart(ctx, a, name, extra, res, cap, budget=None):
    with cluster(ctx, name, extra) as d, contextlib.closing(LeaderConn(d)) as lc:
        st = status(d)
        log(f"{name}: loading {a.keys} keys of {a.value_bytes} bytes into {st['client_addr']}")
        res["load_s"] = load_keys(st["client_addr"], a.keys, a.value_bytes)
        res["points"], res["not_run"] = [], []
        t_start = time.monotonic()
        try:
            restart_points(ctx, a, name, res, cap, budget, d, lc, t_start)
        except Exception:
            with contextlib.suppress(Exception):  # what the run got to, before it goes
                sizes(d, name, res, t_start)
            raise


def restart_points(ctx, a, name, res, cap, budget, d, lc, t_start):
    for h in a.history:
        if res["points"] and res["points"][-1]["restarts"][-1]["applied_s"] is None:
            why = f"the replay of a restart at a shorter history exceeded {cap:g} s"
            res["not_run"].append({"history": h, "why": why})
            log(f"{name}: history {h} not run ({why})")
            continue
        if budget is not None and res["points"]:
            last = res["points"][-1]
            rate = last["driven"] / max(last["drive_s"], 1e-3)
            est = (h - last["restarts"][-1]["commit_index"]) / max(rate, 1.0)
            spent = time.monotonic() - t_start
            if spent + est > budget:
                why = (
                    f"driving to it would take about {est:.0f} s more at {rate:.0f} "
                    f"entries/s, beyond this phase's budget of {budget:g} s "
                    f"({spent:.0f} s spent; --baseline-budget)"
                )
                res["not_run"].append({"history": h, "why": why})
                log(f"{name}: history {h} not run ({why})")
                continue
        log(f"{name}: driving the log to {h} entries")
        commit0 = leader_of(status(d))["commit_index"]
        t0 = time.monotonic()
        st = drive_to(ctx, d, a, h, t0 + a.drive_limit)
        drive_s = time.monotonic() - t0
        restarts = []
        for i in range(a.restarts):
            bid = backups(wait_quiet(d))[i % 2]
            rr = restart_once(d, bid, cap, a.sync_cap, lc)
            restarts.append(rr)
            log(
                f"{name}: history {rr['commit_index']}: replica {bid}: {restart_text(rr)} "
                f"(restored from {rr.get('restored_from', 0)}, replayed {rr['replayed']} "
                f"entries; restart command {rr['restart_cmd_s']:.2f} s"
                + ("" if rr.get("in_sync_before_kill", True) else "; NOT in sync before")
                + (
                    ""
                    if rr.get("leader_before") == rr.get("leader_after")
                    else f"; LEADER CHANGED {rr.get('leader_before')}→{rr.get('leader_after')}"
                )
                + ")"
            )
            if rr["applied_s"] is None:
                break
        driven = st and leader_of(st)["commit_index"] - commit0
        res["points"].append(
            {"history": h, "drive_s": drive_s, "driven": driven, "restarts": restarts}
        )
    sizes(d, name, res, t_start)


def sizes(d, name, res, t_start):
    """Log and checkpoint sizes of the cluster in d at the end of its phase."""
    res["elapsed_s"] = time.monotonic() - t_start
    res["disk"] = disk_usage(d)
    for k, v in res["disk"].items():
        log(
            f"{name}: {k}: log {v['segments']} segments, {v['log_bytes'] / 1e6:.0f} MB "
            f"({v['log_alloc_bytes'] / 1e6:.0f} MB allocated)"
        )
    res["checkpoints"] = checkpoint_list(d)
    st = wait_quiet(d, timeout=30)
    res["final"] = {
        "commit_index": leader_of(st)["commit_index"],
        "first_index": {r["id"]: r["first_index"] for r in st["replicas"]},
        "checkpoint": {r["id"]: r["checkpoint"] for r in st["replicas"]},
    }


def restarts_not_in_sync(res):
    """Each state transfer that failed and each restart whose backup did not hold the
    others' DEBUG DIGEST within its caps, as a failed phase: its replicas disagree at the
    end, which a missing number in the report would not say."""
    out = []
    for t in res.get("A", {}).get("transfers", []):
        if "error" in t:
            out.append({"phase": "A", "reason": f"state transfer: {t['error']}"})
        for kind in ("wiped", "local"):
            if (t.get(kind) or {}).get("capped"):
                out.append({"phase": "A", "reason": f"{kind} restart: {restart_text(t[kind])}"})
    for name in ("B", "C"):
        for p in res.get(name, {}).get("points", []):
            for r in p["restarts"]:
                if r.get("capped"):
                    out.append(
                        {
                            "phase": name,
                            "reason": f"history {p['history']}: replica {r['replica']}: "
                            f"{restart_text(r)}",
                        }
                    )
    for f in out:
        log(f"{f['phase']}: FAILED: {f['reason']}")
    return out


class Ctx:
    def __init__(self, work, failed_logs):
        self.work = work
        self.failed_logs = failed_logs
        self.procs = apps.Procs()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keys", type=int, default=1_000_000, help="redis keys (default 1000000)")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument(
        "--history",
        type=lambda s: sorted(int(x) for x in s.split(",") if x),
        help="history lengths (log entries) at which a restart is timed "
        "(default 10000,100000,1000000; --quick: 10000,100000)",
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="p99 window (default 5)")
    ap.add_argument("--repeats", type=int, default=3, help="p99 windows of each kind")
    ap.add_argument("--checkpoints", type=int, default=3, help="timed checkpoints, idle and loaded")
    ap.add_argument("--transfers", type=int, default=2, help="state transfers timed")
    ap.add_argument(
        "--restarts", type=int, default=2, help="restarts per history, with checkpoints"
    )
    ap.add_argument(
        "--replay-cap",
        type=float,
        default=150.0,
        help="seconds a --no-checkpoints restart may take",
    )
    ap.add_argument(
        "--sync-cap",
        type=float,
        default=30.0,
        help="seconds a restarted replica may take from applied_index reaching the commit "
        "index to an equal DEBUG DIGEST (default 30)",
    )
    ap.add_argument(
        "--baseline-budget",
        type=float,
        default=300.0,
        help="seconds the --no-checkpoints cluster may spend on histories; a longer history "
        "that would not fit is not run, and the report says so (default 300)",
    )
    ap.add_argument("--drive-limit", type=float, default=600.0, help="seconds to reach a history")
    ap.add_argument(
        "--phases", default="checkpoint,restart,baseline", help="checkpoint,restart,baseline"
    )
    ap.add_argument("--quick", action="store_true", help="100K keys, histories 10K and 100K")
    ap.add_argument("--json", help="output (default eval/out/checkpoints.json)")
    ap.add_argument("--tmp", help="where the clusters' directories go")
    ap.add_argument(
        "--build",
        help="build directory whose bin/lockstep and bin/loadgen to run (default build/; e.g. a "
        "clean build of HEAD while others rebuild build/ from edited sources)",
    )
    ap.add_argument("--from-json", help="only redraw the table and plot of an existing JSON")
    a = ap.parse_args()
    js = Path(a.json) if a.json else ROOT / "eval" / "out" / "checkpoints.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text()), js)
        return 0
    if a.quick:
        a.keys = 100_000 if a.keys == 1_000_000 else a.keys
        a.history = a.history or [10_000, 100_000]
        a.seconds, a.repeats, a.checkpoints, a.replay_cap = 3.0, 2, 2, min(a.replay_cap, 60.0)
        a.transfers = 1
    a.history = a.history or [10_000, 100_000, 1_000_000]
    phases = set(a.phases.split(","))
    global LOADGEN
    if a.build:
        apps.LOCKSTEP = Path(a.build).resolve() / "bin" / "lockstep"  # apps.lockstep_run's
        LOADGEN = Path(a.build).resolve() / "bin" / "loadgen"
    for exe in (apps.LOCKSTEP, LOADGEN):
        if not exe.exists():
            sys.exit(f"{exe} is not built (ninja -C build)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    work = apps.work_dir("lockstep-ckpt-bench-", a.tmp)
    ctx = Ctx(work, js.parent / "checkpoints-failed-logs")
    mach = apps.machine(work)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--short", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    mach.update(git_head=head, git_dirty=dirty, lockstep_binary=str(apps.LOCKSTEP))
    res = {
        "command": "scripts/bench checkpoints " + " ".join(sys.argv[1:]),
        "keys": a.keys,
        "value_bytes": a.value_bytes,
        "history": a.history,
        "seconds": a.seconds,
        "repeats": a.repeats,
        "replay_cap_s": a.replay_cap,
        "targets": {
            "checkpoint_ms": TARGET_CHECKPOINT_MS,
            "p99_ratio": TARGET_P99_RATIO,
            "restart_s_at_1M": TARGET_RESTART_S,
            "flat_factor": FLAT_FACTOR,
            "state_transfer_s_100MB": TARGET_TRANSFER_S,
        },
        "failed": [],
        "machine": mach,
    }
    log(
        f"checkpoints: {a.keys} keys of {a.value_bytes} bytes; histories {a.history}; "
        f"phases {','.join(sorted(phases))}; work dir {work}"
    )
    t0 = time.monotonic()
    steps = [
        ("plain_redis", "checkpoint", lambda: plain_redis_baseline(ctx, a)),
        ("A", "checkpoint", lambda: phase_checkpoint(ctx, a, res.setdefault("A", {}))),
        (
            "B",
            "restart",
            lambda: phase_restart(ctx, a, "B", [], res.setdefault("B", {}), a.replay_cap),
        ),
        (
            "C",
            "baseline",
            lambda: phase_restart(
                ctx,
                a,
                "C",
                ["--no-checkpoints"],
                res.setdefault("C", {}),
                a.replay_cap,
                a.baseline_budget,
            ),
        ),
    ]
    t_phases = [(key, fn) for key, phase, fn in steps if phase in phases]
    apps.run_phases(ctx, work, res, t_phases)
    res["failed"] += restarts_not_in_sync(res)
    res["elapsed_s"] = time.monotonic() - t0
    report(res, js)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
