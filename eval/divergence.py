#!/usr/bin/env python3
"""Output-checking benchmark (issue 8's targets): redis under lockstep, each target against a
baseline measured in the same run.

    scripts/bench divergence [--repeats 15] [--seconds 3] [--keys 100000] [--trials 5]
                             [--suffix 1000] [--quick] [--build DIR] [--no-control]
                             [--cpu-repeats 8] [--cpu-seconds 8] [--cpu-rate 5000]
                             [--state-repeats 4] [--phases cost,state,detection,repair]
    .venv/bin/python eval/divergence.py [same options]
    .venv/bin/python eval/divergence.py --from-json eval/out/divergence.json  (redraw only)

  cost       Two clusters side by side (`lockstep cluster up --replicas 3 --app redis`, the
             default durability: disk), one with output hashing on (the default) and one with
             LOCKSTEP_SHIM_OUTPUT_DIGESTS=0 in the environment of `cluster up` (inherited by
             the daemons and their servers; checked: the daemons' environment holds it, and
             the "off" cluster's `output` status counts no checks and no points after load
             while the "on" one counts them). build/bin/loadgen (64-byte values on 10000 keys,
             every key written once first): SET throughput at 16 connections and SET p50 at 1
             connection, --seconds windows, --repeats times, on and off interleaved
             (each first in turn). Targets: throughput on >= 0.95 x off; p50 on <= off + 5
             us, judged on the median of the per-repeat pairs with its bootstrap interval.
             With --control (the default) a third cluster, hashing off too, takes its turn
             in each repeat: its ratio to "off" is what the method reads when nothing
             differs. On this 2-core VM that is itself several % either way (the machine's
             speed drifts by 10-20 % within a minute, and two clusters started alike need
             not run alike), which is why the windows are many and short. Then, what the
             machine's drift cannot touch: two clusters driven at the same time, each at
             --cpu-rate SET/s (open loop, 16 connections), --cpu-repeats windows (--cpu-seconds) of on with
             off and (control) off2 with off: the CPU per SET of each cluster's daemons and
             servers. Saturated throughput goes as 1 / CPU per op, so the throughput target
             reads there as CPU on <= 1/0.95 = 1.053 x off.
  state      State checks (issue 29): apps/redis.toml as it is (its state_probe,
             apps/redis/state_probe.sh: a slice of 1000 keys digested in one EVAL, run every
             state_check_every_s, the default 10 s) against the same
             profile without the probe (and a control without it too), driven two at a time at
             --cpu-rate SET/s each (16 connections, open loop) for --state-repeats windows per
             pair, each 1.5 check intervals long or longer (checked: the "on" cluster ran at
             least one check a window, none failed, the others ran none). Targets: CPU per
             SET on <= 1/0.95 x off (the throughput target, read as for hashing; the probes'
             CPU is counted: the daemons' ended children), and the leader's SET p99 on <= 1.2
             x off, medians of the windows. Then every cluster's replicas hold the same data.
  detection  A cluster with --keys keys of 100 bytes (pipelined through the leader), a
             checkpoint of each backup. Per trial, under load (loadgen, 16 connections, the
             same keys): a backup's daemon is SIGKILLed and `cluster restart`ed with
             LOCKSTEP_FAILPOINT=flip-input:MARKER (a fresh marker per trial; it fires once per
             daemon start), then one client connection sends SET k MARKER-x and GET k. Timed
             from the client's reply to GET: the report's file appearing in the leader's
             replica-N/divergences (scanned every 2 ms, and the file's mtime), `lockstep
             divergence list --json` showing it (polled every ~10 ms in a thread; each poll's
             duration is kept), and the daemons' log lines (µs timestamps): the backup's
             FAILPOINT (its server got the flipped input) and the leader's DIVERGENCE. The
             detection interval in output bytes is the report's offset - first_difference.
             Target: within one check interval (a backup sends each moved connection's newest
             point every 20 ms, guard/output/output_guard.h kSampleUs): FAILPOINT -> DIVERGENCE.
  repair     The same cluster, idle. Per trial: a checkpoint of the backup, the restart with
             the failpoint, --suffix SETs (a log suffix after the checkpoint), then the marker.
             The report's total_ms, restore_ms and restored_index; the time until the
             backup's redis holds the right value again (GET, every 5 ms, on its own
             server_addr) and its DEBUG DIGEST equals the other backup's and the leader's.
             Target: back in sync <= 100 ms plus the replay of the suffix, i.e. (in sync -
             DIVERGENCE) - (total_ms - restore_ms) <= 100 ms. Baseline: a plain redis-server
             with the same keys: DEBUG RELOAD, and a restart loading its RDB.

--quick: 4 repeats of 2 s, 2 state windows per pair, 20K keys, 3 trials of each, a 500-entry
suffix: 3-5 minutes.
Writes eval/out/divergence.json (every sample, the machine, the commit), divergence.md (target,
measured, baseline, ratio, PASS/SHORT, or NOISE for a cost target whose bootstrap 90%
interval of the per-repeat median holds the target) and divergence.png (throughput and p50 on vs off per
repeat; detection and repair times per trial). Progress goes to stderr; the table is printed
at the end. Exit status 1 if a phase failed.
"""

import argparse
import contextlib
import datetime
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import checkpoints  # eval/checkpoints.py: cluster status helpers, loadgen, checkpoints
import proc_usage  # eval/proc_usage.py: CPU and context switches of processes over a run
import profiles  # eval/profiles.py: apps/APP.toml variants
import state_cost  # eval/state_cost.py: the state phase
from checkpoints import Failed, backups, leader_of, replica, status, wait_quiet
from divergence_report import (
    CHECK_INTERVAL_MS,
    TARGET_P50_ADD_US,
    TARGET_REPAIR_MS,
    TARGET_STATE_P99_RATIO,
    TARGET_TPUT_RATIO,
    report,
    trial_text,
)
from resp import Redis, RespError  # eval/resp.py

import apps  # eval/apps.py: ports, servers, teardown by pid, machine description
from apps import log, split_addr

ROOT = apps.ROOT
COST_KEYS, COST_VALUE = 10000, 64  # apps.py's loadgen workload
SETTLE_S = 1.0  # after a backup's restart, before the marker (detection trials)
VALUE_BYTES = 100
DEBUG_ON = ["--enable-debug-command", "yes"]  # the baseline's DEBUG RELOAD
KEY_PREFIX = "lockstep-bench:dv:"
DIGESTS_ENV = "LOCKSTEP_SHIM_OUTPUT_DIGESTS"
LOG_RE = re.compile(r"^(\d\d):(\d\d):(\d\d(?:\.\d+)?) replica (\d+): (.*)$")


# ---------------------------------------------------------------------------
# Clusters
# ---------------------------------------------------------------------------


def clean_env(**extra):
    """The environment for a `lockstep` command: ours without the knobs measured here."""
    env = {k: v for k, v in os.environ.items() if k not in (DIGESTS_ENV, "LOCKSTEP_FAILPOINT")}
    env.update(extra)
    return env


def ls_run(args, timeout=180, env=None):
    return subprocess.run(
        [str(apps.LOCKSTEP), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env if env is not None else clean_env(),
    )


def pick_base_port():
    """A base port in 12000..18690 with P+0..9, P+100..109, P+200..209, P+250..259
    (metrics) and P+300..309 free."""
    for _ in range(300):
        base = random.randrange(12000, 18700, 10)
        if all(
            apps.port_free(base + off + i) for off in (0, 100, 200, 250, 300) for i in range(10)
        ):
            return base
    raise Failed("no free base port between 12000 and 19000")


@contextlib.contextmanager
def cluster(ctx, name, env, app="redis"):
    """Yields the directory of a running `cluster up --replicas 3 --app APP` (redis, or a
    profile's path), started with env (the daemons and their servers inherit it); always
    brings it down, by pid if need be."""
    d = Path(tempfile.mkdtemp(prefix=f"cluster-{name}-", dir=ctx.work))
    try:
        for attempt in range(3):
            cmd = ["cluster", "up", "--dir", d, "--replicas", "3"]
            cmd += ["--base-port", pick_base_port(), "--app", app]
            shown = " ".join(f"{k}={v}" for k, v in env.items() if os.environ.get(k) != v)
            log(f"{name}: {shown + ' ' if shown else ''}lockstep {' '.join(map(str, cmd))}")
            r = ls_run(cmd, env=env)
            out = (r.stdout + r.stderr).strip()
            if r.returncode == 0:
                break
            if "taken" not in out or attempt == 2:
                raise Failed(f"lockstep cluster up failed ({r.returncode}): {out[-1500:]}")
        apps.wait_ready("redis", status(d)["client_addr"], timeout=60)
        yield d
    except BaseException:
        checkpoints.keep_logs(ctx, d)
        raise
    finally:
        apps.tear_down_cluster(d)


def daemon_env(pid, name):
    """The value of name in process pid's environment (None if absent or unreadable)."""
    with contextlib.suppress(OSError):
        for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            k, _, v = kv.partition(b"=")
            if k.decode(errors="replace") == name:
                return v.decode(errors="replace")
    return None


def output_counts(d):
    """Each replica's `output` status: checks (the leader's), points_sent (backups')."""
    out = {}
    for r in status(d)["replicas"]:
        if r:
            o = r.get("output") or {}
            out[r["id"]] = {
                "role": r.get("role"),
                "checks": o.get("checks", 0),
                "points_sent": o.get("points_sent", 0),
                "divergences": o.get("divergences", 0),
                DIGESTS_ENV: daemon_env(r["pid"], DIGESTS_ENV),
            }
    return out


def hashing_state(counts):
    """(checks, points) summed over the replicas."""
    return (
        sum(c["checks"] for c in counts.values()),
        sum(c["points_sent"] for c in counts.values()),
    )


def run_loadgen(ctx, addr, conns, seconds, keys, size):
    return checkpoints.run_loadgen(ctx, addr, conns, seconds, keys, size)


# ---------------------------------------------------------------------------
# 1. The cost of hashing: on and off, windows interleaved
# ---------------------------------------------------------------------------


def phase_cost(ctx, a, res):
    """Hashing on against off, windows interleaved; with --control a second "off" cluster
    ("off2") in the same rotation, whose ratio to "off" is what this method reads when
    nothing differs (two clusters of this machine differ by several % on their own)."""
    envs = {"on": clean_env(), "off": clean_env(**{DIGESTS_ENV: "0"})}
    if a.control:
        envs["off2"] = clean_env(**{DIGESTS_ENV: "0"})
    modes = list(envs)
    res["samples"], res["check"] = [], {}
    # Started in a random order (logged): in every earlier run "on" came up first, and
    # it read lower in most of them while the control did not.
    start = random.sample(list(envs), len(envs))
    res["start_order"] = start
    log(f"cost: clusters started in the order {', '.join(start)}")
    with contextlib.ExitStack() as stack:
        dirs = {m: stack.enter_context(cluster(ctx, m, envs[m])) for m in start}
        addrs = {m: status(d)["client_addr"] for m, d in dirs.items()}
        for m, addr in addrs.items():
            log(f"cost: {m}: writing {COST_KEYS} keys of {COST_VALUE} bytes at {addr}")
            apps.prefill("redis", addr, COST_KEYS, COST_VALUE)
            run_loadgen(ctx, addr, 16, 1.0, COST_KEYS, COST_VALUE)  # warm-up, not kept
        verify_hashing(dirs, res, "before")
        for rep in range(a.repeats):
            # Each mode first, middle and last in turn: the machine's speed drifts.
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for m in order:
                for conns in (16, 1):
                    r = run_loadgen(ctx, addrs[m], conns, a.seconds, COST_KEYS, COST_VALUE)
                    s = {
                        "hashing": m,
                        "conns": conns,
                        "repeat": rep,
                        "ops_per_s": r["ops_per_s"],
                        "p50_us": r["p50_us"],
                        "p99_us": r["p99_us"],
                        "errors": r["errors"],
                        "seconds": r["seconds"],
                        "loadavg": round(os.getloadavg()[0], 2),
                    }
                    if "lost" in r:
                        s["lost"] = r["lost"]
                    res["samples"].append(s)
                    log(
                        f"cost: repeat {rep + 1}/{a.repeats}, hashing {m:4}, {conns:2} conns: "
                        f"{r['ops_per_s']:.0f} ops/s, p50 {r['p50_us']:.1f} µs, p99 "
                        f"{r['p99_us']:.0f} µs, errors {r['errors']}"
                    )
        if a.cpu_repeats:
            equal_load_cpu(ctx, a, dirs, addrs, res)
        verify_hashing(dirs, res, "after")
    summarize_cost(res)


def cluster_pids(d):
    """Every replica's daemon and server (status' pid and server_pid)."""
    pids = []
    for r in status(d)["replicas"]:
        if r:
            pids += [p for p in (r.get("pid"), r.get("server_pid")) if p]
    return pids


def equal_load_cpu(ctx, a, dirs, addrs, res, children=False):
    """CPU per SET of two clusters driven at the same time at the same offered load (open
    loop, --cpu-rate each): whatever the machine's speed does in a window, it does to both,
    which alternating windows cannot give. "on" against "off", and with the control "off2"
    against "off", in turn. The daemons' and servers' CPU (utime + stime), not loadgen's;
    with children, that of the daemons' ended children too (proc_usage.cpu_of)."""
    pairs = [("on", "off")] + ([("off2", "off")] if "off2" in dirs else [])
    res["cpu_samples"], res["cpu_rate"] = [], a.cpu_rate
    for rep in range(a.cpu_repeats):
        for x, y in pairs:
            pids = {m: cluster_pids(dirs[m]) for m in (x, y)}
            before = {m: proc_usage.cpu_of(p, children) for m, p in pids.items()}
            procs = {}
            for m in (x, y):
                cmd = checkpoints.loadgen_cmd(addrs[m], 16, a.cpu_seconds, COST_KEYS, COST_VALUE)
                procs[m] = subprocess.Popen(
                    [*cmd, "--rate", f"{a.cpu_rate:g}"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
                procs[m].cmd_name, procs[m].logpath = "loadgen", os.devnull
                ctx.procs.procs.append(procs[m])
            out = {
                m: checkpoints.finish_loadgen(ctx, p, a.cpu_seconds + 60) for m, p in procs.items()
            }
            after = {m: proc_usage.cpu_of(p, children) for m, p in pids.items()}
            s = {"repeat": rep, "pair": f"{x}/{y}"}
            for m in (x, y):
                ops = out[m]["ops"]
                s[m] = {
                    "ops": ops,
                    "achieved_rate": out[m].get("achieved_rate"),
                    "p99_us": out[m]["p99_us"],
                    "cpu_s": after[m] - before[m],
                    "cpu_us_per_op": (after[m] - before[m]) / ops * 1e6 if ops else None,
                }
            cx, cy = s[x]["cpu_us_per_op"], s[y]["cpu_us_per_op"]
            s["ratio"] = cx / cy if cx and cy else None
            res["cpu_samples"].append(s)
            if s["ratio"] is None:  # a loadgen that did nothing (its output is in the JSON)
                log(
                    f"cost: equal load {rep + 1}/{a.cpu_repeats}, {x} and {y}: not measured "
                    f"({out[x]['ops']} and {out[y]['ops']} ops)"
                )
                continue
            log(
                f"cost: equal load {rep + 1}/{a.cpu_repeats}, {x} and {y} at once, "
                f"{a.cpu_rate:g} SET/s each: CPU per op {cx:.1f} / {cy:.1f} µs = "
                f"{s['ratio']:.3f} (achieved {s[x]['achieved_rate'] or 0:.0f}, "
                f"{s[y]['achieved_rate'] or 0:.0f}/s)"
            )


def measured_cpu_windows(res, require=True):
    """equal_load_cpu's windows that have a ratio: one whose loadgen did nothing has none
    (equal_load_cpu logged it), and the rest are the measurement. With require, none at all
    among on/off, where windows were taken, is a failure, not a median of nothing."""
    cpu = [c for c in res.get("cpu_samples") or [] if c["ratio"] is not None]
    if require and res.get("cpu_samples") and not any(c["pair"] == "on/off" for c in cpu):
        raise Failed(f"no equal-load window measured: {res['cpu_samples']}")
    return cpu


def profile_without(work, field, app="redis"):
    """apps/APP.toml without its line `field = ...` (once, or Failed), written into work/:
    the same profile with one feature off."""

    def drop(text):
        text, n = re.subn(rf"(?m)^{re.escape(field)} = .*$", "", text)
        if n != 1:
            raise Failed(f"apps/{app}.toml does not set {field} (once)")
        return text

    return profiles.variant(app, work, drop, f"{app}-without-{field}")


def same_data(m, d):
    """Every replica's DEBUG DIGEST (inspector connections); equal, or Failed."""
    end = time.monotonic() + 30
    while True:
        seen = []
        for r in status(d)["replicas"]:
            with contextlib.suppress(OSError):
                c = Redis(split_addr(r["server_addr"]), inspect=True, timeout=10)
                try:
                    seen.append(c.call("DEBUG", "DIGEST"))
                finally:
                    c.close()
        if len(seen) == 3 and len(set(seen)) == 1:
            log(f"{m}: the three replicas hold the same data ({str(seen[0])[:12]}...)")
            return
        if time.monotonic() > end:
            raise Failed(f"cluster {m}: replicas differ: {seen}")
        time.sleep(0.5)


def verify_hashing(dirs, res, when):
    """Hashing must be on in one cluster and off in the other, or the comparison means nothing."""
    for m, d in dirs.items():
        counts = output_counts(d)
        res["check"].setdefault(m, {})[when] = counts
        checks, points = hashing_state(counts)
        envs = {c[DIGESTS_ENV] for c in counts.values()}
        log(
            f"cost: hashing {m}: {checks} checks, {points} points sent; daemons' {DIGESTS_ENV}: "
            f"{', '.join(sorted(str(e) for e in envs))}"
        )
        if m != "on" and (checks or points or envs != {"0"}):
            raise Failed(
                f"{DIGESTS_ENV}=0 did not turn hashing off ({checks} checks, {points} points, "
                f"daemons' environment {envs}): {counts}"
            )
        if m == "on" and (not checks or not points):
            raise Failed(f"the cluster with hashing on counts no checks or points: {counts}")


def summarize_cost(res):
    def pick(m, conns, key):
        return [s[key] for s in res["samples"] if s["hashing"] == m and s["conns"] == conns]

    tput = {m: statistics.median(pick(m, 16, "ops_per_s")) for m in ("on", "off")}
    p50 = {m: statistics.median(pick(m, 1, "p50_us")) for m in ("on", "off")}
    reps = sorted({s["repeat"] for s in res["samples"]})

    def paired(conns, key, f, a="on", b="off"):
        out = []
        for rep in reps:
            v = {
                s["hashing"]: s[key]
                for s in res["samples"]
                if s["repeat"] == rep and s["conns"] == conns
            }
            if a in v and b in v:
                out.append(f(v[a], v[b]))
        return out

    def ratio(x, y):
        return x / y if y else None

    res["summary"] = {
        "tput16_on": tput["on"],
        "tput16_off": tput["off"],
        "tput16_ratio": tput["on"] / tput["off"] if tput["off"] else None,
        "tput16_ratio_per_repeat": paired(16, "ops_per_s", ratio),
        "p50_1_on_us": p50["on"],
        "p50_1_off_us": p50["off"],
        "p50_1_added_us": p50["on"] - p50["off"],
        "p50_1_added_us_per_repeat": paired(1, "p50_us", lambda x, y: x - y),
        "p50_1_ratio": p50["on"] / p50["off"] if p50["off"] else None,
    }
    s = res["summary"]
    if pick("off2", 16, "ops_per_s"):
        s["tput16_control_ratio_per_repeat"] = paired(16, "ops_per_s", ratio, "off2", "off")
        s["p50_1_control_added_us_per_repeat"] = paired(
            1, "p50_us", lambda x, y: x - y, "off2", "off"
        )
    log(
        f"cost: throughput at 16 conns on/off = {s['tput16_on']:.0f}/{s['tput16_off']:.0f} = "
        f"{s['tput16_ratio']:.3f} (target >= {TARGET_TPUT_RATIO}); p50 at 1 conn on - off = "
        f"{s['p50_1_on_us']:.1f} - {s['p50_1_off_us']:.1f} = {s['p50_1_added_us']:+.1f} µs "
        f"(target <= +{TARGET_P50_ADD_US:g} µs)"
    )
    cpu = measured_cpu_windows(res)
    if cpu:
        s["cpu_rate"] = res.get("cpu_rate")
        s["cpu_ratio_per_repeat"] = [c["ratio"] for c in cpu if c["pair"] == "on/off"]
        s["cpu_us_per_op_on"] = statistics.median(
            c["on"]["cpu_us_per_op"] for c in cpu if c["pair"] == "on/off"
        )
        s["cpu_us_per_op_off"] = statistics.median(
            c["off"]["cpu_us_per_op"] for c in cpu if c["pair"] == "on/off"
        )
        control = [c["ratio"] for c in cpu if c["pair"] == "off2/off"]
        if control:
            s["cpu_control_ratio_per_repeat"] = control
        log(
            f"cost: CPU per op at equal load, on/off: paired median "
            f"{statistics.median(s['cpu_ratio_per_repeat']):.3f}"
            + (f"; control off2/off {statistics.median(control):.3f}" if control else "")
        )
    if "tput16_control_ratio_per_repeat" in s:
        c = [x for x in s["tput16_control_ratio_per_repeat"] if x is not None]
        log(
            f"cost: control, hashing off against hashing off: paired median "
            f"{statistics.median(c):.3f} (per repeat {min(c):.2f}..{max(c):.2f})"
        )


# ---------------------------------------------------------------------------
# The failpoint, the marker, and watching for the report
# ---------------------------------------------------------------------------


def restart_with_failpoint(ctx, d, bid, marker, timeout):
    """SIGKILLs backup bid's daemon and `cluster restart`s it with the flip failpoint armed
    (only its environment has it); waits until it applied what the leader had committed then.
    Returns timings and the offset in its log file where this start begins."""
    st = status(d)
    rep = replica(st, bid)
    logf = d / f"replica-{bid}.log"
    log_from = logf.stat().st_size if logf.exists() else 0
    os.kill(rep["pid"], signal.SIGKILL)
    if not checkpoints.wait_dead(rep["pid"], 10):
        raise Failed(f"replica {bid}'s daemon (pid {rep['pid']}) alive 10 s after SIGKILL")
    out = {"replica": bid, "log_from": log_from}
    if rep.get("server_pid") and not checkpoints.wait_dead(rep["server_pid"], 10):
        out["server_survived_daemon"] = True
        log(f"  replica {bid}'s redis (pid {rep['server_pid']}) outlived its daemon; killing it")
        with contextlib.suppress(OSError):
            os.kill(rep["server_pid"], signal.SIGKILL)
        checkpoints.wait_dead(rep["server_pid"], 10)
    t0 = time.monotonic()
    env = clean_env(LOCKSTEP_FAILPOINT=f"flip-input:{marker}")
    r = ls_run(["cluster", "restart", "--id", bid, "--dir", d], timeout=120, env=env)
    out["restart_cmd_s"] = time.monotonic() - t0
    if r.returncode != 0:
        raise Failed(f"cluster restart --id {bid}: {(r.stdout + r.stderr).strip()[-400:]}")
    end, target = t0 + timeout, None
    while time.monotonic() < end:
        with contextlib.suppress(Exception):
            st = status(d)
            ld, me = leader_of(st), replica(st, bid)
            if ld and target is None:
                target = ld["commit_index"]
            if me and target is not None and me["applied_index"] >= target:
                out["caught_up_s"] = time.monotonic() - t0
                out["applied_index"] = me["applied_index"]
                return out
        time.sleep(0.05)
    raise Failed(f"restarted replica {bid} did not reach commit index {target} in {timeout:g} s")


def report_files(d):
    """{report id: path} of every report file in the cluster's replica directories."""
    out = {}
    for p in d.glob("replica-*/divergences/*.json"):
        out[p.stem] = p
    return out


def divergence_list(d):
    r = ls_run(["divergence", "list", "--json", "--dir", d], timeout=60)
    if r.returncode != 0:
        raise Failed(f"divergence list: {(r.stdout + r.stderr).strip()[-300:]}")
    return json.loads(r.stdout)


def divergence_show(d, rid):
    r = ls_run(["divergence", "show", rid, "--json", "--dir", d], timeout=60)
    if r.returncode != 0:
        raise Failed(f"divergence show {rid}: {(r.stdout + r.stderr).strip()[-300:]}")
    return json.loads(r.stdout)


class ListPoller:
    """Polls `lockstep divergence list --json` every ~10 ms in a thread until stopped (or
    --watch-cap s): each poll's start and end (monotonic) and the report ids it showed."""

    def __init__(self, d, cap_s):
        self.d, self.cap_s, self.polls, self.errors, self.lag = d, cap_s, [], [], None
        self.stop_ = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        end = time.monotonic() + self.cap_s
        with contextlib.suppress(Exception):  # how far each replica's applying was behind
            st = status(self.d)
            ld = leader_of(st)
            self.lag = {r["id"]: ld["commit_index"] - r["applied_index"] for r in st["replicas"]}
        for _ in range(100_000):
            if self.stop_.is_set() or time.monotonic() > end:
                return
            t0 = time.monotonic()
            try:
                ids = [(r["id"], r["status"]) for r in divergence_list(self.d)]
            except Exception as e:  # noqa: BLE001 (kept; the poll goes on)
                self.errors.append(str(e)[:200])
                ids = None
            self.polls.append((t0, time.monotonic(), ids))
            self.stop_.wait(0.01)

    def first_seen(self, rid):
        """(start of the last poll that did not show rid, end of the first that did)."""
        before = None
        for t0, t1, ids in self.polls:
            if ids is None:
                continue
            if any(i == rid for i, _ in ids):
                return before, t1
            before = t0
        return before, None

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_.set()
        self.thread.join(90)


def log_events(path, start, wall0, t_mono0, patterns):
    """Lines of a daemon's log from byte start on that match patterns {name: regex}: {name:
    (s relative to the instant t_mono0 whose wall clock was wall0, line)}, the first of each."""
    if not path.exists():
        return {}
    midnight = datetime.datetime.fromtimestamp(wall0).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    out = {}
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    for ln in text.splitlines():
        m = LOG_RE.match(ln)
        if not m:
            continue
        for name, rx in patterns.items():
            if name not in out and re.search(rx, m.group(5)):
                sod = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
                wall = midnight.timestamp() + sod
                if wall < wall0 - 43200:
                    wall += 86400  # the line is past midnight
                out[name] = (round(wall - wall0, 6), ln[:300])
    return out


def marker_trial(ctx, d, a, bid, marker, trial, watch_sync):
    """One client connection writes SET k MARKER-x and GET k through the leader; then watches
    for the divergence report (the leader's report directory every 2 ms, `divergence list` in
    a thread) and, with watch_sync, for backup bid's redis holding the right value again and
    its DEBUG DIGEST equal to the other backup's. Every time is in s after the reply to GET."""
    st = status(d)
    key, value = f"{KEY_PREFIX}{trial}", f"{marker}x"
    known = set(report_files(d))
    bad_value = (marker + chr(ord("x") ^ 1)).encode()  # what the failpoint makes of it
    me = replica(st, bid)
    others = [r for r in st["replicas"] if r and r["id"] not in (bid, st["leader"])]
    t = {"replica": bid, "marker": marker, "key": key, "leader": st["leader"]}
    logs_from = {
        r["id"]: (d / f"replica-{r['id']}.log").stat().st_size
        for r in st["replicas"]
        if r and (d / f"replica-{r['id']}.log").exists()
    }
    conn = Redis(split_addr(st["client_addr"]), timeout=30)
    try:
        if conn.call("SET", key, value) != "OK":
            raise Failed(f"SET {key} {value} through the leader did not answer OK")
        got = conn.call("GET", key)
        t_reply, wall_reply = time.monotonic(), time.time()
        if got != value.encode():
            raise Failed(f"GET {key} through the leader answered {got!r}")
        with ListPoller(d, a.watch_cap) as lp:
            seen = watch(
                d, a, t, known, t_reply, wall_reply, bid, me, key, value, bad_value, watch_sync
            )
        t["list_polls"] = len(lp.polls)
        t["lag_entries_after_reply"] = lp.lag  # commit - applied, first status after the reply
        t["list_poll_ms"] = [round((p[1] - p[0]) * 1000, 1) for p in lp.polls]
        if lp.errors:
            t["list_errors"] = lp.errors[:5]
        if seen:
            before, after = lp.first_seen(seen)
            t["list_seen_s"] = None if after is None else after - t_reply
            t["list_not_yet_s"] = None if before is None else before - t_reply
    finally:
        conn.close()
    if not seen:
        raise Failed(f"no divergence report for marker {marker} within {a.watch_cap:g} s")
    # The finished report, the daemons' own timestamps, the digests.
    rep = t["report"] = divergence_show(d, seen)
    ld_id = rep["leader"]
    ev = log_events(
        d / f"replica-{ld_id}.log",
        logs_from.get(ld_id, 0),
        wall_reply,
        t_reply,
        {
            "divergence": rf"DIVERGENCE {re.escape(seen)}:",
            "repair_done": rf"REPAIR {re.escape(seen)} of replica \d+ (done|FAILED)",
        },
    )
    ev |= log_events(
        d / f"replica-{bid}.log",
        logs_from.get(bid, 0),
        wall_reply,
        t_reply,
        {
            "flip": r"FAILPOINT: flipped a byte",
            "order": rf"REPAIR {re.escape(seen)}: the leader found",
            "restored": r"restored checkpoint \d+ in \d+ ms",
            "backup_done": rf"REPAIR {re.escape(seen)} (done|FAILED)",
        },
    )
    t["log"] = {k: v[1] for k, v in ev.items()}
    t["log_s"] = {k: v[0] for k, v in ev.items()}
    ls = t["log_s"]
    if "flip" in ls and "divergence" in ls:
        t["flip_to_detect_ms"] = (ls["divergence"] - ls["flip"]) * 1000
    if "divergence" in ls:
        t["reply_to_detect_ms"] = ls["divergence"] * 1000
    t["detect_bytes"] = rep["offset"] - rep["first_difference"]
    t["past_agreed_bytes"] = rep["offset"] - rep["agreed_offset"]
    if watch_sync and rep["status"] == "repaired":
        digests(d, t, me, others, key, value)
    return t


def watch(d, a, t, known, t_reply, wall_reply, bid, me, key, value, bad_value, watch_sync):
    """The loop of marker_trial: returns the id of the report about our marker (or None)."""
    end, seen, unexpected = t_reply + a.watch_cap, None, {}
    conn, last_get, values = None, 0.0, []
    for _ in range(1_000_000):
        now = time.monotonic()
        if now > end:
            break
        for rid, path in report_files(d).items():
            if rid in known or rid in unexpected or rid == seen:
                continue
            try:
                r = json.loads(path.read_text())
                mtime = path.stat().st_mtime_ns / 1e9
            except (OSError, ValueError):
                continue  # half written (renamed in place, but be safe): next scan
            if about_marker(r, t["marker"], bid):
                seen = rid
                t["report_id"] = rid
                t["file_seen_s"] = time.monotonic() - t_reply
                t["file_first_status"] = r.get("status")
                if r.get("status") == "repairing":  # the first write: its mtime is detection
                    t["file_mtime_s"] = mtime - wall_reply
            else:
                unexpected[rid] = {k: r.get(k) for k in ("status", "replica", "connection")}
        if seen and not watch_sync:
            t_status = read_status(report_files(d).get(seen))
            if t_status not in (None, "repairing"):
                break
        if watch_sync and now - last_get >= 0.005:
            last_get = now
            try:
                if conn is None:
                    conn = Redis(split_addr(me["server_addr"]), timeout=2, inspect=True)
                got = conn.call("GET", key)
                if not values or values[-1][1] != got:
                    values.append((round(time.monotonic() - t_reply, 4), got))
                if got == bad_value and "wrong_value_s" not in t:
                    t["wrong_value_s"] = time.monotonic() - t_reply
                if got == value.encode() and ("wrong_value_s" in t or seen):
                    t.setdefault("right_value_s", now - t_reply)  # asked at now; had it then
                    if seen and read_status(report_files(d).get(seen)) != "repairing":
                        break
            except (OSError, RespError, TimeoutError, ConnectionError):
                if conn is not None:
                    with contextlib.suppress(OSError):
                        conn.close()
                conn = None
        time.sleep(0.002)
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.close()
    if watch_sync:
        t["backup_values"] = [(s, v.decode(errors="replace") if v else v) for s, v in values]
    if unexpected:
        t["unexpected_reports"] = unexpected
        log(f"  reports not about the marker appeared meanwhile: {unexpected}")
    return seen


def about_marker(r, marker, bid):
    """Whether report r is about the marker's divergence: the marker in the connection's
    inputs it lists, or in the outputs around the first difference (under load the log window,
    from the last agreeing check's applied index, may begin after the SET that carried it)."""
    if r.get("replica") != bid:
        return False
    texts = list(r.get("connection_inputs", [])) + [
        o.get("bytes", "") for o in r.get("outputs", [])
    ]
    return any(marker in x for x in texts)


def read_status(path):
    if path is None:
        return None
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None


def digests(d, t, me, others, key, value):
    """DEBUG DIGEST of the repaired backup's redis (on its own server_addr) against the
    leader's (through the log: an input like any other, asked once the backup is repaired)
    and the other backup's (on its own server_addr). Short timeouts; every attempt's error is
    kept (a replica whose redis does not answer is worth knowing about)."""
    t0, errors = time.monotonic(), []
    for _ in range(100):
        try:
            mine = checkpoints.redis_call(
                me["server_addr"], "DEBUG", "DIGEST", timeout=10, inspect=True
            )
            lead = checkpoints.redis_call(status(d)["client_addr"], "DEBUG", "DIGEST", timeout=10)
            t["digest_backup"], t["digest_leader"] = mine, lead
            if mine == lead:
                t["digest_equal"] = True
                t["digest_checked_s"] = time.monotonic() - t0
                break
        except (OSError, RespError, TimeoutError, RuntimeError) as e:
            errors.append(f"{time.monotonic() - t0:.2f} s: {type(e).__name__}: {e}"[:200])
        if time.monotonic() - t0 > 30:
            break
        time.sleep(0.1)
    t.setdefault("digest_equal", False)
    for o in others:  # the other backup, for the record
        got = {"replica": o["id"]}
        t1 = time.monotonic()
        try:
            got["value"] = checkpoints.redis_call(
                o["server_addr"], "GET", key, timeout=10, inspect=True
            )
            got["digest"] = checkpoints.redis_call(
                o["server_addr"], "DEBUG", "DIGEST", timeout=10, inspect=True
            )
            got["equal"] = got["digest"] == t.get("digest_backup")
        except (OSError, RespError, TimeoutError) as e:
            got["error"] = f"{type(e).__name__}: {e}"[:200]
        got["took_s"] = round(time.monotonic() - t1, 3)
        if isinstance(got.get("value"), bytes):
            got["value"] = got["value"].decode(errors="replace")
        t.setdefault("other_backups", []).append(got)
        if not got.get("equal"):
            log(f"  the other backup's redis: {got} (not equal to the repaired one's)")
    if errors:
        t["digest_errors"] = errors[:10]


def new_marker(trial):
    return f"dvflip{trial}{random.randrange(16**6):06x}-"


# ---------------------------------------------------------------------------
# 2. Detection under load, 3. repair of a backup with --keys keys
# ---------------------------------------------------------------------------


def phase_divergence(ctx, a, phases, res):
    with cluster(ctx, "R", clean_env()) as d:
        st = status(d)
        addr = st["client_addr"]
        log(f"R: loading {a.keys} keys of {VALUE_BYTES} bytes into {addr}")
        res["load_s"] = checkpoints.load_keys(addr, a.keys, VALUE_BYTES)
        st = wait_quiet(d)
        res["dbsize_backup"] = checkpoints.redis_call(
            replica(st, backups(st)[0])["server_addr"], "DBSIZE", inspect=True
        )
        for b in backups(st):
            cp = checkpoints.checkpoint_now(d, b)
            log(f"R: replica {b}: checkpoint {cp['index']} ({(cp['bytes'] or 0) / 1e6:.0f} MB)")
        failed = []
        if "detection" in phases:
            try:
                detection_trials(ctx, a, d, res.setdefault("detection", {}))
            except Exception as e:  # noqa: BLE001 (the repair phase can still run)
                log(f"detection: FAILED: {e}")
                failed.append({"phase": "detection", "reason": str(e)})
        if "repair" in phases:
            try:
                repair_trials(ctx, a, d, res.setdefault("repair", {}))
            except Exception as e:  # noqa: BLE001
                log(f"repair: FAILED: {e}")
                failed.append({"phase": "repair", "reason": str(e)})
        if (
            failed
            or res.get("repair", {}).get("anomalies")
            or any(
                t.get("unexpected_reports") or t.get("other_backups", [{}])[0].get("equal") is False
                for ph in ("detection", "repair")
                for t in res.get(ph, {}).get("trials", [])
            )
        ):
            checkpoints.keep_logs(ctx, d)
        # The replicas agree at the end, whatever the trials made them go through.
        try:
            apps.replicas_agree("redis", d, a.keys, reports_expected=True)
        except Exception as e:  # noqa: BLE001
            log(f"state check: FAILED: {e}")
            failed.append({"phase": "state check", "reason": str(e)})
            checkpoints.keep_logs(ctx, d)
        res["final_status"] = {
            r["id"]: {"role": r["role"], "output": r.get("output")}
            for r in status(d)["replicas"]
            if r
        }
        return failed


def detection_trials(ctx, a, d, res):
    res["trials"], res["load_conns"] = [], 16
    for i in range(a.trials):
        st = wait_quiet(d)
        bid = backups(st)[i % 2]
        marker = new_marker(i)
        lg = checkpoints.start_loadgen(
            ctx, st["client_addr"], 16, a.watch_cap + 120, a.keys, VALUE_BYTES
        )
        try:
            time.sleep(1.0)  # the load is on
            if lg.poll() is not None:
                raise Failed(f"loadgen exited early: {lg.stderr.read()[-300:]}")
            rs = restart_with_failpoint(ctx, d, bid, marker, a.watch_cap)
            # "Applied" is handed to its redis: under load the restored redis is
            # still working through the replayed backlog, and a marker written
            # now times that backlog, not the check. Let it settle first.
            time.sleep(SETTLE_S)
            t = marker_trial(ctx, d, a, bid, marker, f"d{i}", watch_sync=False)
            t["restart"] = rs
            t["settle_s"] = SETTLE_S
            t["load_running"] = lg.poll() is None
        except Failed as e:  # kept; the next trial may still work
            log(f"detection {i + 1}/{a.trials}: FAILED: {e}")
            res.setdefault("failed_trials", []).append(
                {"trial": i, "replica": bid, "error": str(e)}
            )
            continue
        finally:
            ctx.procs.stop(lg)
        res["trials"].append(t)
        log(f"detection {i + 1}/{a.trials}: {trial_text(t)}")
    if res.get("failed_trials"):
        raise Failed(f"{len(res['failed_trials'])} of {a.trials} detection trials failed")


def repair_trials(ctx, a, d, res):
    res["trials"], res["suffix"] = [], a.suffix
    for i in range(a.repair_trials):
        try:
            repair_one(ctx, a, d, res, i)
        except Failed as e:  # kept; the next trial may still work
            log(f"repair {i + 1}/{a.repair_trials}: FAILED: {e}")
            res.setdefault("failed_trials", []).append({"trial": i, "error": str(e)})
    if res.get("failed_trials"):
        raise Failed(f"{len(res['failed_trials'])} of {a.repair_trials} repair trials failed")


def repair_one(ctx, a, d, res, i):
    """One repair trial (see the module's docstring), appended to res["trials"]."""
    st = wait_quiet(d)
    bid = backups(st)[i % 2]
    marker = new_marker(i + 100)
    try:
        cp = checkpoints.checkpoint_now(d, bid)
        bid = cp["replica"]  # another backup, if bid came to lead meanwhile
    except Failed as e:  # a finding, not the end of the phase: it has older checkpoints
        log(f"repair {i + 1}: {e}")
        res.setdefault("anomalies", []).append(f"trial {i + 1}: {e}")
        cp = {"error": str(e)}
    rs = restart_with_failpoint(ctx, d, bid, marker, a.watch_cap)
    st = wait_quiet(d)
    c0 = leader_of(st)["commit_index"]
    per = max(1, a.suffix // 4)
    checkpoints.run_loadgen(ctx, st["client_addr"], 4, 120, a.keys, VALUE_BYTES, per)
    st = wait_quiet(d)
    c1 = leader_of(st)["commit_index"]
    t = marker_trial(ctx, d, a, bid, marker, f"r{i}", watch_sync=True)
    t["checkpoint"] = {k: v for k, v in cp.items() if k not in ("t0", "t1")}
    t["restart"] = rs
    t["suffix_written"] = c1 - c0
    st = wait_quiet(d)
    t["commit_index_after"] = leader_of(st)["commit_index"]
    rep = t["report"]
    t["suffix_replayed"] = t["commit_index_after"] - rep["restored_index"]
    t["report_replay_ms"] = rep["total_ms"] - rep["restore_ms"]
    ls = t["log_s"]
    # From the backup's own log line "restored checkpoint ... replaying the log" to its
    # redis answering GET with the right value: the replay of the suffix, as seen from
    # outside (the report's total_ms ends when the entries are handed to the server).
    if t.get("right_value_s") is not None and "divergence" in ls:
        t["detect_to_sync_ms"] = (t["right_value_s"] - ls["divergence"]) * 1000
        if "restored" in ls:
            t["replay_ms"] = (t["right_value_s"] - ls["restored"]) * 1000
            t["overhead_ms"] = (ls["restored"] - ls["divergence"]) * 1000
    res["trials"].append(t)
    log(f"repair {i + 1}/{a.repair_trials}: {trial_text(t)}")
    if not t.get("digest_equal"):  # not repaired, or repaired to another state
        raise Failed(
            f"the repaired backup's DEBUG DIGEST is not the leader's: {t.get('digest_errors')}"
        )


def redis_reload_baseline(ctx, a):
    p, addr = apps.start_server(ctx, "redis", "plain-redis", extra=DEBUG_ON)
    data_dir = Path(p.args[p.args.index("--dir") + 1])
    res = {"keys": a.keys}
    try:
        log(f"baseline: plain redis at {addr}: loading {a.keys} keys")
        res["load_s"] = checkpoints.load_keys(addr, a.keys, VALUE_BYTES)
        res["dbsize"] = checkpoints.redis_call(addr, "DBSIZE")
        reloads = []
        for _ in range(3):
            t0 = time.monotonic()
            checkpoints.redis_call(addr, "DEBUG", "RELOAD", timeout=300)
            reloads.append(time.monotonic() - t0)
        res["debug_reload_s"] = reloads
        t0 = time.monotonic()
        checkpoints.redis_call(addr, "SAVE", timeout=300)
        res["save_s"] = time.monotonic() - t0
        res["rdb_bytes"] = (data_dir / "dump.rdb").stat().st_size
        port = split_addr(addr)[1]
    finally:
        ctx.procs.stop(p)
    restarts = []
    for _ in range(3):
        cmd = apps.server_cmd("redis", port, data_dir, extra=DEBUG_ON)
        logf = data_dir / "restart.log"
        logf.write_text("")
        t0 = time.monotonic()
        p = ctx.procs.start(cmd, logf)
        try:
            apps.wait_ready("redis", addr, p, timeout=120)  # PONG once the RDB is loaded
            wall = time.monotonic() - t0
            dbsize = checkpoints.redis_call(addr, "DBSIZE")
        finally:
            ctx.procs.stop(p)
        m = re.search(r"DB loaded from disk: ([\d.]+) seconds", logf.read_text(errors="replace"))
        restarts.append(
            {"wall_s": wall, "loaded_s": float(m.group(1)) if m else None, "dbsize": dbsize}
        )
    res["restart"] = restarts
    res["debug_reload_ms_median"] = statistics.median(reloads) * 1000
    res["rdb_load_ms_median"] = med_ms([r["loaded_s"] for r in restarts])
    res["restart_ms_median"] = med_ms([r["wall_s"] for r in restarts])
    log(
        f"baseline: {a.keys} keys, RDB {res['rdb_bytes'] / 1e6:.1f} MB: DEBUG RELOAD "
        f"{res['debug_reload_ms_median']:.0f} ms; restart loading the RDB "
        f"{res['restart_ms_median']:.0f} ms to PONG (its log: DB loaded in "
        f"{res['rdb_load_ms_median']} ms)"
    )
    return res


def med_ms(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs) * 1000, 1) if xs else None


class Ctx:
    def __init__(self, work, failed_logs):
        self.work = work
        self.failed_logs = failed_logs  # checkpoints.keep_logs copies a failed cluster's logs
        self.procs = apps.Procs()


def git(*args):
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    ).stdout


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=15, help="on/off window pairs (default 15)")
    ap.add_argument("--seconds", type=float, default=3.0, help="loadgen window (default 3)")
    ap.add_argument(
        "--cpu-repeats",
        type=int,
        default=8,
        help="equal-load windows (two clusters driven at once) per pair (default 8; 0: none)",
    )
    ap.add_argument(
        "--cpu-seconds",
        type=float,
        default=8.0,
        help="length of an equal-load window (default 8: CPU time is counted in 10 ms ticks)",
    )
    ap.add_argument(
        "--cpu-rate",
        type=float,
        default=5000,
        help="SET/s offered to each of the two clusters at once (default 5000)",
    )
    ap.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a second hashing-off cluster in the cost phase: the method's own spread (default on)",
    )
    ap.add_argument("--keys", type=int, help="redis keys of the repair phase (default 100000)")
    ap.add_argument("--trials", type=int, default=5, help="detection trials (default 5)")
    ap.add_argument("--repair-trials", type=int, default=5, help="repair trials (default 5)")
    ap.add_argument(
        "--suffix", type=int, default=1000, help="SETs written after the checkpoint (default 1000)"
    )
    ap.add_argument(
        "--watch-cap", type=float, default=60.0, help="s to wait for a report or a repair"
    )
    ap.add_argument(
        "--state-repeats",
        type=int,
        default=4,
        help="state-check phase: equal-load windows per pair, each long enough for a check "
        "(default 4)",
    )
    ap.add_argument(
        "--phases", default="cost,state,detection,repair", help="cost,state,detection,repair"
    )
    ap.add_argument("--quick", action="store_true", help="4 repeats of 2 s, 20K keys, 3 trials")
    ap.add_argument("--json", help="output (default eval/out/divergence.json)")
    ap.add_argument("--tmp", help="where the clusters' directories go")
    ap.add_argument(
        "--build",
        default=str(ROOT / "build"),
        help="build directory whose bin/lockstep and bin/loadgen to run (default build/)",
    )
    ap.add_argument("--from-json", help="only redraw the table and plot of an existing JSON")
    a = ap.parse_args()
    js = Path(a.json) if a.json else ROOT / "eval" / "out" / "divergence.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text()), js)
        return 0
    if a.quick:
        a.repeats, a.seconds = min(a.repeats, 4), min(a.seconds, 2.0)
        a.cpu_repeats, a.cpu_seconds = min(a.cpu_repeats, 3), min(a.cpu_seconds, 4.0)
        a.state_repeats = min(a.state_repeats, 2)
        a.keys = a.keys or 20_000
        a.trials, a.repair_trials, a.suffix = min(a.trials, 3), min(a.repair_trials, 3), 500
    a.keys = a.keys or 100_000
    phases = set(a.phases.split(","))
    unknown = phases - {"cost", "state", "detection", "repair"}
    if unknown:
        ap.error(f"--phases: unknown {', '.join(sorted(unknown))}")
    build = Path(a.build).resolve()
    apps.LOCKSTEP = build / "bin" / "lockstep"  # apps.lockstep_run's, and ls_run's
    checkpoints.LOADGEN = build / "bin" / "loadgen"  # checkpoints.loadgen_cmd's
    for exe in (apps.LOCKSTEP, checkpoints.LOADGEN):
        if not exe.exists():
            sys.exit(f"{exe} is not built")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    work = apps.work_dir("lockstep-dv-bench-", a.tmp)
    ctx = Ctx(work, js.parent / "divergence-failed-logs")
    mach = apps.machine(work)
    mach.update(
        git_head=git("rev-parse", "HEAD").strip(),
        git_dirty=git("status", "--short", "--untracked-files=no").splitlines(),
        lockstep_binary=str(apps.LOCKSTEP),
        lockstep_binary_mtime=datetime.datetime.fromtimestamp(
            apps.LOCKSTEP.stat().st_mtime
        ).isoformat(timespec="seconds"),
    )
    res = {
        "command": "scripts/bench divergence " + " ".join(sys.argv[1:]),
        "repeats": a.repeats,
        "seconds": a.seconds,
        "keys": a.keys,
        "value_bytes": VALUE_BYTES,
        "trials": a.trials,
        "repair_trials": a.repair_trials,
        "suffix": a.suffix,
        "targets": {
            "tput16_ratio_min": TARGET_TPUT_RATIO,
            "p50_1_added_us_max": TARGET_P50_ADD_US,
            "check_interval_ms": CHECK_INTERVAL_MS,
            "repair_overhead_ms_max": TARGET_REPAIR_MS,
            "state_p99_ratio_max": TARGET_STATE_P99_RATIO,
            "state_tput_ratio_min": TARGET_TPUT_RATIO,
        },
        "failed": [],
        "machine": mach,
    }
    log(
        f"divergence: phases {','.join(sorted(phases))}; {a.repeats} repeats of {a.seconds:g} s; "
        f"{a.keys} keys; {a.trials} detection and {a.repair_trials} repair trials; work dir {work}"
    )
    t0 = time.monotonic()
    steps = [("cost", lambda: phase_cost(ctx, a, res.setdefault("cost", {})))]
    if "state" in phases:
        steps.append(
            ("state", lambda: state_cost.phase_state_checks(ctx, a, res.setdefault("state", {})))
        )
    if "repair" in phases:
        steps.append(
            ("baseline", lambda: res.__setitem__("baseline", redis_reload_baseline(ctx, a)))
        )
    if phases & {"detection", "repair"}:
        steps.append(
            ("divergence", lambda: res["failed"].extend(phase_divergence(ctx, a, phases, res)))
        )
    apps.run_phases(ctx, work, res, [(k, fn) for k, fn in steps if k != "cost" or "cost" in phases])
    res["elapsed_s"] = time.monotonic() - t0
    report(res, js)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
