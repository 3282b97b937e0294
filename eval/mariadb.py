#!/usr/bin/env python3
"""Benchmarks MariaDB under lockstep (apps/mariadb.toml) against MariaDB alone.

    scripts/bench mariadb [--seconds 10] [--threads 1,4,16] [--tests oltp_read_write,oltp_write_only]
                          [--modes unreplicated,replicated-disk,replicated-memory] [--quick]
                          [--json FILE]

Every measurement is sysbench (TEST, 2 tables of 1000 rows, --threads N, --seconds long,
closed loop) through TCP. Modes, all in one run:

  unreplicated       one mariadbd with the profile's flags, started from its own
                     mariadb-install-db directory, no shim
  replicated-disk    `lockstep cluster up --replicas 3 --app mariadb --durability disk`
  replicated-memory  the same with --durability memory (not durable)

For each: transactions/s, latency p50 and p99 (from sysbench's histogram), the CPU time
and context switches per transaction of the servers and daemons (from /proc, every
thread), and, for the replicated modes, an end-of-run check that every replica's
tables have the leader's checksums (CHECKSUM TABLE through each replica's own server).
A mismatch fails the mode. Writes eval/out/mariadb.json and mariadb.md; the profile runs
with serial_inputs, so "N threads" costs what running their transactions one at a time
costs, which the table shows against the unreplicated server's own threads.

Then issue 26's targets for serial execution, each a ratio from this run with its verdict
(per test, for each replicated mode measured beside unreplicated):
  - the most threads measured ≥ 0.8 × the unreplicated server at 1 thread (tps);
  - more client threads never lower throughput (each thread count's tps against the one
    below it, which must be ≥ 1.00);
  - the servers' CPU per transaction ≤ 1.3 × three plain servers' at the same threads.
"""

import argparse
import contextlib
import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inspector  # eval/inspector.py: connections to a backup's own server
import proc_usage  # eval/proc_usage.py: CPU and context switches of processes over a run
import profiles  # eval/profiles.py: apps/APP.toml loaded, its {port}, {dir}, {host} filled in

import apps  # eval/apps.py: processes, clusters, machine facts
from apps import HOST, ROOT, log

SYSBENCH = shutil.which("sysbench")
MARIADB = shutil.which("mariadb")
PROFILE = profiles.load("mariadb")
TABLES, TABLE_SIZE = 2, 1000


def sql(addr, statement, timeout=60):
    host, port = apps.split_addr(addr)
    r = subprocess.run(
        [MARIADB, "-h", host, "-P", str(port), "-u", "root", "--batch", "--skip-column-names"]
        + ["-e", statement],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"{statement!r} on {addr}: {r.stderr.strip()[-300:]}")
    return r.stdout


def sysbench(addr, test, command, threads=1, seconds=0, timeout=600):
    host, port = apps.split_addr(addr)
    cmd = [SYSBENCH, test, f"--mysql-host={host}", f"--mysql-port={port}", "--mysql-user=root"]
    cmd += ["--mysql-db=sbtest", f"--tables={TABLES}", f"--table-size={TABLE_SIZE}"]
    if command == "run":
        cmd += [f"--threads={threads}", f"--time={seconds:g}", "--histogram=on", "--rand-seed=1"]
        cmd += ["--percentile=99"]
    r = subprocess.run(
        [*cmd, command], capture_output=True, text=True, timeout=timeout, check=False
    )
    if r.returncode != 0:
        raise RuntimeError(f"sysbench {test} {command}: {(r.stdout + r.stderr).strip()[-800:]}")
    return r.stdout


def parse_run(out):
    """tps, p50 and p99 in ms (from the histogram), errors, from sysbench's report."""
    tps = float(re.search(r"transactions:\s+\d+\s+\(([\d.]+) per sec", out).group(1))
    errors = int(re.search(r"ignored errors:\s+(\d+)", out).group(1))
    total = int(re.search(r"transactions:\s+(\d+)", out).group(1))
    hist = [
        (float(v), int(n))
        for v, n in re.findall(r"^\s+([\d.]+)\s+\|\*+\s+(\d+)\s*$", out, flags=re.MULTILINE)
    ]

    def pct(q):
        want, seen = q * sum(n for _, n in hist), 0
        for v, n in hist:
            seen += n
            if seen >= want:
                return v
        return None

    return {
        "tps": tps,
        "transactions": total,
        "errors": errors,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
    }


def server_flags(command_template, port, data_dir):
    return [profiles.render(a, port, data_dir, HOST) for a in shlex.split(command_template)]


@contextlib.contextmanager
def mode_unreplicated(ctx):
    d = Path(tempfile.mkdtemp(prefix="mariadb-", dir=ctx.work))
    prep = server_flags(PROFILE["prepare"], 0, d)
    r = subprocess.run(prep, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{prep[0]} failed: {(r.stdout + r.stderr)[-500:]}")
    port = apps.free_port()
    p = ctx.procs.start(server_flags(PROFILE["command"], port, d), d / "server.log")
    addr = f"{HOST}:{port}"
    try:
        wait_sql(addr, p)
        yield addr, {"servers": [p.pid]}, None
    finally:
        ctx.procs.stop(p, grace=20)


def mode_replicated(durability):
    @contextlib.contextmanager
    def mode(ctx):
        with apps.lockstep_cluster(ctx, "mariadb", durability) as (d, st):
            addr = st["client_addr"]
            wait_sql(addr)
            reps = st["replicas"]
            pids = {"daemons": [r["pid"] for r in reps], "servers": [r["server_pid"] for r in reps]}
            yield addr, pids, d

    return mode


MODES = {
    "unreplicated": ("unreplicated", "none", mode_unreplicated),
    "replicated-disk": ("replicated", "disk", mode_replicated("disk")),
    "replicated-memory": ("replicated", "memory", mode_replicated("memory")),
}


def wait_sql(addr, proc=None, timeout=60.0):
    end = time.monotonic() + timeout
    while True:
        try:
            sql(addr, "SELECT 1", timeout=10)
            return
        except (RuntimeError, subprocess.SubprocessError) as e:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"mariadbd exited ({proc.returncode}); see {proc.logpath}"
                ) from e
            if time.monotonic() > end:
                raise RuntimeError(f"mariadbd at {addr} does not answer: {e}") from e
            time.sleep(0.2)


def inspect_sql(addr, statement, timeout=60):
    """sql() on a replica's own server, through an inspector.Relay (a backup's
    server serves only its daemon's inspections)."""
    with inspector.Relay(apps.split_addr(addr)) as (host, port):
        return sql(f"{host}:{port}", statement, timeout)


def same_tables(cluster_dir, leader_addr):
    """Every replica's CHECKSUM TABLE equal to the leader's, once all applied the log."""
    tables = ", ".join(f"sbtest.sbtest{i + 1}" for i in range(TABLES))
    want = sql(leader_addr, f"CHECKSUM TABLE {tables}")
    end, got = time.monotonic() + 60, {}
    while time.monotonic() < end:
        st = apps.cluster_status(cluster_dir)
        commit = st["replicas"][st["leader"]]["commit_index"]
        if all(r["applied_index"] >= commit for r in st["replicas"]):
            got = {
                r["id"]: inspect_sql(r["server_addr"], f"CHECKSUM TABLE {tables}")
                for r in st["replicas"]
            }
            if all(v == want for v in got.values()):
                return {
                    "same": True,
                    "divergences": [r["output"]["divergences"] for r in st["replicas"]],
                }
        time.sleep(0.5)
    raise RuntimeError(f"replicas' tables differ from the leader's: leader {want!r}, all {got}")


def measure(ctx, name, a, res):
    mode, durability, fn = MODES[name]
    for test in a.tests:
        log(f"{name} {test}")
        with fn(ctx) as (addr, pids, cluster_dir):
            sql(addr, "CREATE DATABASE IF NOT EXISTS sbtest")
            sysbench(addr, test, "prepare")
            for threads in a.threads:
                with proc_usage.UsageSpan(pids) as span:
                    out, addr = apps.on_leader(
                        lambda at, t=threads, x=test: (wait_sql(at), sysbench(at, x, "run", t, a.seconds))[1],
                        addr, cluster_dir, None, f"{name} {test} {threads} threads",
                    )  # fmt: skip
                r = parse_run(out)
                n = max(r["transactions"], 1)
                r["per_txn"] = {
                    k: {"cpu_us": cpu * 1e6 / n, "switches": sw / n}
                    for k, (cpu, sw) in span.spent.items()
                }
                row = {"mode": mode, "durability": durability, "test": test, "threads": threads}
                res["runs"].append({**row, **r})
                log(
                    f"  {threads} threads: {r['tps']:.1f} tps, p50 {r['p50_ms']} ms, "
                    f"p99 {r['p99_ms']} ms, errors {r['errors']}"
                )
            if cluster_dir is not None:
                check = same_tables(cluster_dir, addr)
                res["checks"].append({"mode": name, "test": test, **check})
                log(f"  every replica's tables equal the leader's: {check}")


def table(res):
    rows = [
        (
            "| mode | test | threads | tps | tps ÷ unrepl. | p50 ms | p99 ms "
            "| servers CPU µs/txn | daemons CPU µs/txn | servers switches/txn "
            "| daemons switches/txn |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        base = next(
            (
                b
                for b in res["runs"]
                if b["mode"] == "unreplicated"
                and (b["test"], b["threads"]) == (r["test"], r["threads"])
            ),
            None,
        )
        ratio = f"{r['tps'] / base['tps']:.2f}" if base and base["tps"] else "–"
        cpu = {k: f"{v['cpu_us']:.0f}" for k, v in r["per_txn"].items()}
        sw = {k: f"{v['switches']:.1f}" for k, v in r["per_txn"].items()}
        label = r["mode"] if r["mode"] == "unreplicated" else f"replicated/{r['durability']}"
        rows.append(
            f"| {label} | {r['test']} | {r['threads']} | {r['tps']:.1f} | {ratio} "
            f"| {r['p50_ms']} | {r['p99_ms']} | {cpu.get('servers', '–')} | {cpu.get('daemons', '–')} "
            f"| {sw.get('servers', '–')} | {sw.get('daemons', '–')} |"
        )
    text = "\n".join(rows) + "\n"
    for c in res["checks"]:
        text += f"\n- {c['mode']} {c['test']}: every replica's tables equal the leader's; "
        text += f"divergences reported per replica {c['divergences']}"
    for f in res["failed"]:
        text += f"\nFAILED: {f['phase']}: {f['reason']}"
    lines = targets(res)
    if lines:
        text += "\n\n## Issue 26's targets for serial execution, from this run\n\n"
        text += "\n".join(f"- {x}" for x in lines)
    return text + "\n"


def targets(res):
    """Issue 26 target 5, one line each with its verdict, from this run's rows."""

    def verdict(ok):
        return "met" if ok else "NOT met"

    out = []
    runs = res["runs"]
    for test in sorted({r["test"] for r in runs}):
        plain = {r["threads"]: r for r in runs if r["test"] == test and r["mode"] == "unreplicated"}
        for dur in sorted({r["durability"] for r in runs if r["mode"] != "unreplicated"}):
            mine = sorted(
                (r for r in runs if r["test"] == test and r["mode"] != "unreplicated"
                 and r["durability"] == dur),
                key=lambda r: r["threads"],
            )  # fmt: skip
            if not mine:
                continue
            name = f"{test}, lockstep/{dur}"
            top = mine[-1]
            if 1 in plain and plain[1]["tps"]:
                x = top["tps"] / plain[1]["tps"]
                out.append(
                    f"{name}: {top['threads']} threads {top['tps']:.0f} tps ÷ unreplicated at 1 "
                    f"thread {plain[1]['tps']:.0f} = {x:.2f} (target ≥ 0.80): {verdict(x >= 0.8)}"
                )
            steps = [
                (b["threads"], b["tps"] / a["tps"]) for a, b in itertools.pairwise(mine) if a["tps"]
            ]
            if steps:
                shown = ", ".join(f"{t} threads {x:.2f}" for t, x in steps)
                ok = all(x >= 1.0 for _, x in steps)
                out.append(
                    f"{name}: tps against the thread count below ({shown}; target ≥ 1.00 each): "
                    f"{verdict(ok)}"
                )
            for r in mine:
                base = plain.get(r["threads"])
                srv, base_srv = r["per_txn"].get("servers"), base and base["per_txn"].get("servers")
                if not (srv and base_srv and base_srv["cpu_us"] > 0):
                    continue
                x = srv["cpu_us"] / (3 * base_srv["cpu_us"])
                out.append(
                    f"{name}, {r['threads']} thread{'s' if r['threads'] != 1 else ''}: servers' CPU {srv['cpu_us']:.0f} µs/txn ÷ "
                    f"3 × plain {base_srv['cpu_us']:.0f} = {x:.2f} (target ≤ 1.30): "
                    f"{verdict(x <= 1.3)}"
                )
    return out


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", type=apps.csv(int), default=[1, 4, 16])
    ap.add_argument("--tests", type=apps.csv(str), default=["oltp_read_write", "oltp_write_only"])
    ap.add_argument("--modes", type=apps.csv(str), default=list(MODES))
    ap.add_argument("--quick", action="store_true", help="1 and 16 threads, read_write, 4 s")
    ap.add_argument("--json", default=str(ROOT / "eval" / "out" / "mariadb.json"))
    a = ap.parse_args()
    if a.quick:
        a.threads, a.tests, a.seconds = [1, 16], ["oltp_read_write"], 4.0
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}: choose from {list(MODES)}")
    if not (SYSBENCH and MARIADB):
        sys.exit("sysbench and the mariadb client are needed (scripts/setup installs them)")
    work = Path(tempfile.mkdtemp(prefix="bench-mariadb-"))
    ctx = apps.Ctx(work, keep_logs=Path(a.json).parent / "mariadb-logs")
    res = {"app": "mariadb", "runs": [], "checks": [], "failed": [], "machine": apps.machine(work)}
    res["command"] = "scripts/bench mariadb " + " ".join(sys.argv[1:])
    steps = [(f"mode:{m}", lambda m=m: measure(ctx, m, a, res)) for m in a.modes]
    apps.run_phases(ctx, work, res, steps)
    for k in [k for k in res if k.startswith("mode:")]:
        del res[k]
    js = Path(a.json)
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res, indent=1) + "\n")
    text = f"# MariaDB under lockstep — {res['machine'].get('date', '')}\n\n" + table(res)
    js.with_suffix(".md").write_text(text)
    print(text)
    log(f"wrote {js} and {js.with_suffix('.md')}")
    sys.exit(1 if res["failed"] else 0)


if __name__ == "__main__":
    main()
