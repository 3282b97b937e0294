#!/usr/bin/env python3
"""Timers in the log (issue 31): what the ticks cost, idle and under load, each against a
baseline measured in the same run.

    scripts/bench timers [--idle-seconds 20] [--cpu-repeats 6] [--cpu-seconds 8]
                         [--cpu-rate 5000] [--quick] [--no-control] [--build DIR]
    .venv/bin/python eval/timers.py [same options]

Two redis clusters side by side (`lockstep cluster up --replicas 3`, durability disk): "on"
with apps/redis.toml as it is (timers_in_log = true), "off" with the same profile without
that line (same_clock alone; checked: its log holds no TICK entry). With --control (the
default) a third, "off2", like "off": its ratio to "off" is what the method reads when
nothing differs.

  idle   Nothing but the clusters runs for --idle-seconds: log entries committed per second
         (from the leaders' commit_index; `lockstep log` counts the TICK entries among them)
         and the CPU of each cluster's three daemons and of its three servers (utime +
         stime, in % of one core). Issue 31 expects about 10 small entries a second from an
         idle redis at hz 10.
  load   Two clusters driven at the same time at the same offered load (open loop, 16
         connections, --cpu-rate SET/s each, 64-byte values on 10000 keys), --cpu-repeats
         windows of --cpu-seconds: "on" with "off", then (control) "off2" with "off". CPU per
         SET of the daemons and servers of each (eval/divergence.py equal_load_cpu). Target:
         the median ratio on/off <= 1.02. Then every cluster's replicas must hold the same
         data (DEBUG DIGEST through inspector connections).

--quick: 8 s idle, 3 windows of 4 s: about 2 minutes. Writes eval/out/timers.json (every
sample, the machine, the commit) and timers.md (the table); prints the table at the end. Exit
status 1 if a phase failed or a check found the replicas different; a ratio above the target
is printed as SHORT (or NOISE when the control's own spread reaches past it), not an error.
"""

import argparse
import contextlib
import datetime
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import checkpoints  # eval/checkpoints.py: status, loadgen
import divergence  # eval/divergence.py: cluster(), equal_load_cpu(), cluster_pids()
import proc_usage  # eval/proc_usage.py: CPU and context switches of processes over a run
from checkpoints import Failed, status

import apps  # eval/apps.py
from apps import log

ROOT = apps.ROOT
TARGET_CPU_RATIO = 1.02  # issue 31: CPU per op with ticks on <= 1.02 x off


def leader_commit(d):
    s = status(d)
    if s.get("leader") is None:
        raise Failed(f"{d}: no leader")
    return s["replicas"][s["leader"]]["commit_index"]


def ticks_between(d, first, last):
    """TICK entries among the leader's committed entries first..last."""
    if last < first:
        return 0
    r = subprocess.run(
        [
            str(apps.LOCKSTEP),
            "log",
            "--dir",
            str(d),
            "--from",
            str(first),
            "--max",
            str(last - first + 1),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if r.returncode != 0:
        raise Failed(f"lockstep log failed: {r.stderr.strip()[-500:]}")
    return sum("\tTICK " in line for line in r.stdout.splitlines())


def pids_by_kind(d):
    daemons, servers = [], []
    for r in status(d)["replicas"]:
        if r:
            daemons += [r["pid"]] if r.get("pid") else []
            servers += [r["server_pid"]] if r.get("server_pid") else []
    return daemons, servers


def phase_idle(dirs, seconds, res):
    """Entries/s, ticks/s and CPU of every cluster over the same idle window."""
    before = {}
    for m, d in dirs.items():
        daemons, servers = pids_by_kind(d)
        before[m] = (
            leader_commit(d),
            proc_usage.cpu_of(daemons),
            proc_usage.cpu_of(servers),
            daemons,
            servers,
        )
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    res["idle"] = {"seconds": wall}
    for m, d in dirs.items():
        c0, dcpu0, scpu0, daemons, servers = before[m]
        c1 = leader_commit(d)
        dcpu1, scpu1 = proc_usage.cpu_of(daemons), proc_usage.cpu_of(servers)
        ticks = ticks_between(d, c0 + 1, c1)
        row = {
            "entries_per_s": (c1 - c0) / wall,
            "ticks_per_s": ticks / wall,
            "daemons_cpu_pct": (dcpu1 - dcpu0) / wall * 100,
            "servers_cpu_pct": (scpu1 - scpu0) / wall * 100,
        }
        res["idle"][m] = row
        log(
            f"idle {wall:.1f} s, {m}: {row['entries_per_s']:.1f} entries/s "
            f"({row['ticks_per_s']:.1f} ticks/s), daemons {row['daemons_cpu_pct']:.1f}% of a core, "
            f"servers {row['servers_cpu_pct']:.1f}%"
        )
    for m in dirs:
        if m != "on" and res["idle"][m]["ticks_per_s"] > 0:
            raise Failed(f"cluster {m} (no timers_in_log) logged ticks")
    if res["idle"]["on"]["ticks_per_s"] == 0:
        raise Failed("the cluster with timers_in_log logged no tick while idle")


def verdict(ratio, control):
    if ratio is None:
        return "not measured"
    if ratio <= TARGET_CPU_RATIO:
        return "PASS"
    spread = max((abs(c - 1) for c in control), default=0)
    return "NOISE" if ratio - 1 <= spread else "SHORT"


def report(res, js):
    js.write_text(json.dumps(res, indent=1, default=str))
    lines = [
        "# Timers in the log: the cost of ticks",
        "",
        f"`{res['command']}` on {res['machine'].get('git_head', '')[:10]}",
        "",
    ]
    idle = res.get("idle")
    if idle:
        lines += [
            f"Idle for {idle['seconds']:.1f} s:",
            "",
            "| cluster | entries/s | ticks/s | daemons, % of a core | servers, % of a core |",
            "|---|---|---|---|---|",
        ]
        for m in ("on", "off", "off2"):
            if m in idle:
                r = idle[m]
                lines.append(
                    f"| {m} | {r['entries_per_s']:.1f} | {r['ticks_per_s']:.1f} | "
                    f"{r['daemons_cpu_pct']:.1f} | {r['servers_cpu_pct']:.1f} |"
                )
        lines.append("")
    cpu = divergence.measured_cpu_windows(res, require=False)  # none at all: main raised
    on = [c["ratio"] for c in cpu if c["pair"] == "on/off"]
    control = [c["ratio"] for c in cpu if c["pair"] == "off2/off"]
    if on:
        med = statistics.median(on)
        on_us = statistics.median(c["on"]["cpu_us_per_op"] for c in cpu if c["pair"] == "on/off")
        off_us = statistics.median(c["off"]["cpu_us_per_op"] for c in cpu if c["pair"] == "on/off")
        res["load"] = {
            "ratio_median": med,
            "on_us": on_us,
            "off_us": off_us,
            "verdict": verdict(med, control),
        }
        lines += [
            f"Under load ({res['cpu_rate']:g} SET/s offered to each of two clusters at once, 16 connections):",
            "",
            "| target | measured | baseline | ratio | verdict |",
            "|---|---|---|---|---|",
            (
                f"| CPU per SET, ticks on <= {TARGET_CPU_RATIO} x off (daemons + servers) | "
                f"{on_us:.1f} µs | {off_us:.1f} µs | {med:.3f} (windows: "
                f"{', '.join(f'{r:.3f}' for r in on)}) | {res['load']['verdict']} |"
            ),
        ]
        if control:
            lines.append(
                f"| control: off2 / off, nothing differs | | | {statistics.median(control):.3f} "
                f"(windows: {', '.join(f'{r:.3f}' for r in control)}) | the method's spread |"
            )
        lines.append("")
    if res["failed"]:
        lines += ["FAILED: " + "; ".join(res["failed"]), ""]
    text = "\n".join(lines)
    js.with_suffix(".md").write_text(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--idle-seconds", type=float, default=20.0, help="idle window (default 20)")
    ap.add_argument(
        "--cpu-repeats", type=int, default=6, help="equal-load windows per pair (default 6)"
    )
    ap.add_argument("--cpu-seconds", type=float, default=8.0, help="equal-load window (default 8)")
    ap.add_argument(
        "--cpu-rate", type=float, default=5000, help="SET/s offered to each cluster (default 5000)"
    )
    ap.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a second cluster without ticks: the method's own spread (default on)",
    )
    ap.add_argument("--quick", action="store_true", help="8 s idle, 3 windows of 4 s")
    ap.add_argument("--json", help="output (default eval/out/timers.json)")
    ap.add_argument("--tmp", help="where the clusters' directories go")
    ap.add_argument("--build", default=str(ROOT / "build"), help="build directory (default build/)")
    a = ap.parse_args()
    if a.quick:
        a.idle_seconds = min(a.idle_seconds, 8.0)
        a.cpu_repeats, a.cpu_seconds = min(a.cpu_repeats, 3), min(a.cpu_seconds, 4.0)
    js = Path(a.json) if a.json else ROOT / "eval" / "out" / "timers.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    build = Path(a.build).resolve()
    apps.LOCKSTEP = build / "bin" / "lockstep"
    checkpoints.LOADGEN = build / "bin" / "loadgen"
    for exe in (apps.LOCKSTEP, checkpoints.LOADGEN):
        if not exe.exists():
            sys.exit(f"{exe} is not built")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = apps.work_dir("lockstep-timers-bench-", a.tmp)
    ctx = checkpoints.Ctx(work, js.parent / "timers-failed-logs")
    mach = apps.machine(work)
    mach.update(
        git_head=divergence.git("rev-parse", "HEAD").strip(),
        git_dirty=divergence.git("status", "--short", "--untracked-files=no").splitlines(),
        when=datetime.datetime.now().isoformat(timespec="seconds"),
    )
    res = {
        "command": "scripts/bench timers " + " ".join(sys.argv[1:]),
        "target_cpu_ratio": TARGET_CPU_RATIO,
        "failed": [],
        "machine": mach,
    }
    without = divergence.profile_without(work, "timers_in_log")
    apps_of = {"on": "redis", "off": without, "off2": without}
    modes = ["on", "off"] + (["off2"] if a.control else [])
    t0 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            dirs = {
                m: stack.enter_context(
                    divergence.cluster(ctx, m, divergence.clean_env(), apps_of[m])
                )
                for m in modes
            }
            phase_idle(dirs, a.idle_seconds, res)
            addrs = {m: status(d)["client_addr"] for m, d in dirs.items()}
            for m, addr in addrs.items():
                apps.prefill("redis", addr, divergence.COST_KEYS, divergence.COST_VALUE)
            if a.cpu_repeats:
                divergence.equal_load_cpu(ctx, a, dirs, addrs, res)
                divergence.measured_cpu_windows(res)
            for m, d in dirs.items():
                divergence.same_data(m, d)
    except (Failed, subprocess.SubprocessError, OSError) as e:
        log(f"FAILED: {e}")
        res["failed"].append(str(e))
    finally:
        ctx.procs.stop_all()  # a loadgen left by a failure
        apps.kill_leftovers(work)
        shutil.rmtree(work, ignore_errors=True)  # a failure's logs went to ctx's folder
    res["elapsed_s"] = time.monotonic() - t0
    report(res, js)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
