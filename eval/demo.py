#!/usr/bin/env python3
"""The lockstep demo: an unmodified redis on 3 replicas, next to a plain redis.

    scripts/demo [--requests 10000] [--durability disk|memory] [--conns 1,16]
    .venv/bin/python eval/demo.py [same options]

1. Starts `lockstep cluster up --replicas 3 --app redis` (in a fresh directory) and, for
   comparison, one plain redis-server with the flags of lockstep's redis profile.
2. Runs `redis-benchmark -t set,get -c C -n N -r 10000 -d 64 --csv` against the leader's redis
   (client_addr of `lockstep cluster status --json`) and against the plain redis, for 1 and 16
   connections, and prints throughput, p50 and p99 side by side with the ratios.
3. Shows that every replica's redis holds the same data: DBSIZE and DEBUG DIGEST of each
   replica's own redis (its server_addr), asked with redis-cli once the backups have replayed
   everything (polled for up to --settle seconds).
4. Stops everything it started, whatever happened.

Exit status: 0 when every replica holds the same data; 1 when they differ or a step failed;
2 when lockstep cannot run redis yet (no `cluster up --app`).
"""

import argparse
import contextlib
import csv
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inspector  # eval/inspector.py: connections to a backup's own server

import apps  # eval/apps.py: the same servers, cluster handling and clean-up as scripts/bench


def benchmark(addr, conns, requests):
    """redis-benchmark's SET and GET against addr: {"SET": (ops/s, p50 µs, p99 µs), ...}."""
    host, port = apps.split_addr(addr)
    cmd = ["redis-benchmark", "-h", host, "-p", str(port), "-c", str(conns), "-n", str(requests)]
    cmd += ["-r", "10000", "-d", "64", "-t", "set,get", "--csv"]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    rows = {row["test"]: row for row in csv.DictReader(r.stdout.splitlines()) if row.get("rps")}
    if r.returncode != 0 or set(rows) != {"SET", "GET"}:
        raise RuntimeError(f"redis-benchmark against {addr} failed: {r.stderr.strip()[-400:]}")
    return {
        t: (float(v["rps"]), 1000 * float(v["p50_latency_ms"]), 1000 * float(v["p99_latency_ms"]))
        for t, v in rows.items()
    }


def redis_cli(addr, *args):
    """redis-cli against a replica's own server (through an inspector.Relay:
    a backup's server serves only its daemon's inspections)."""
    with inspector.Relay(apps.split_addr(addr)) as (host, port):
        return _redis_cli(host, port, *args)


def _redis_cli(host, port, *args):
    r = subprocess.run(
        ["redis-cli", "-h", host, "-p", str(port), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=10,
    )
    out = r.stdout.strip()
    return out if r.returncode == 0 and not out.startswith("ERR") else f"error: {out or r.stderr}"


def replica_states(st):
    """[(id, role, server_addr, DBSIZE, DEBUG DIGEST)] for every replica in the status JSON."""
    out = []
    for rep in st["replicas"]:
        addr = rep.get("server_addr")
        size = redis_cli(addr, "DBSIZE") if addr else "no server_addr"
        digest = redis_cli(addr, "DEBUG", "DIGEST") if addr else "-"
        out.append((rep["id"], rep.get("role", "?"), addr or "-", size, digest))
    return out


def print_comparison(results, durability):
    lock = f"lockstep ×3, {durability}"
    print(f"\n{'':12}| {'plain redis':^26} | {lock:^26} | lockstep / plain")
    print(
        f"{'test':5} {'conns':>5} | {'ops/s':>8} {'p50 µs':>8} {'p99 µs':>8} "
        f"| {'ops/s':>8} {'p50 µs':>8} {'p99 µs':>8} | {'ops/s':>6} {'p50':>6}"
    )
    for conns, (plain, rep) in results.items():
        for test in ("SET", "GET"):
            (pt, p50, p99), (rt, r50, r99) = plain[test], rep[test]
            print(
                f"{test:5} {conns:>5} | {pt:8.0f} {p50:8.0f} {p99:8.0f} | {rt:8.0f} {r50:8.0f} "
                f"{r99:8.0f} | {rt / pt:5.2f}x {r50 / p50:5.2f}x"
            )
    if durability == "memory":
        print("(durability memory: the log is in the RAM of a majority only, not durable)")


def settle(d, seconds):
    """Replica states once all agree (DBSIZE and digest) or after `seconds`; and whether they do."""
    end = time.monotonic() + seconds
    while True:
        states = replica_states(apps.cluster_status(d))
        readable = all(not str(x).startswith(("error", "no ")) for s in states for x in s[3:])
        same = readable and len({s[3:] for s in states}) == 1
        if same or time.monotonic() > end:
            return states, same
        time.sleep(0.5)


def run(a, ctx, stack):
    apps.log("starting a plain redis for comparison")
    _, plain = apps.start_server(ctx, "redis", "plain-redis")
    apps.log(f"starting 3 replicas of redis under lockstep (durability {a.durability})")
    try:
        d, st = stack.enter_context(apps.lockstep_cluster(ctx, "redis", a.durability))
    except apps.Skip as e:
        print(f"demo: lockstep cannot run redis yet: {e}", file=sys.stderr)
        return 2
    lead = st["client_addr"]
    apps.wait_ready("redis", lead)
    print(f"plain redis at {plain}; lockstep's leader redis at {lead}")
    results = {}
    for conns in a.conns:
        results[conns] = []
        for name, addr in (("plain redis", plain), ("lockstep", lead)):
            apps.log(f"redis-benchmark -c {conns} -n {a.requests} -t set,get against {name}")
            results[conns].append(benchmark(addr, conns, a.requests))
    print_comparison(results, a.durability)

    apps.log(f"waiting up to {a.settle:g} s for the backups to replay everything")
    states, same = settle(d, a.settle)
    print(f"\n{'replica':8} {'role':8} {'server_addr':22} {'DBSIZE':>8}  DEBUG DIGEST")
    for rid, role, addr, size, digest in states:
        print(f"{rid!s:8} {role:8} {addr:22} {size:>8}  {digest}")
    if not same:
        print(f"\nreplicas DIFFER (or could not be read) after {a.settle:g} s")
        apps.keep_logs(ctx, d)  # the directory goes with the cluster: keep what it logged
        return 1
    n, size, digest = len(states), states[0][3], states[0][4]
    print(f"\nall {n} replicas hold the same data (DBSIZE {size}, DEBUG DIGEST {digest})")
    return 0


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=10000, help="redis-benchmark -n, per test")
    ap.add_argument("--conns", type=apps.csv(int), default=[1, 16])
    ap.add_argument("--durability", choices=["disk", "memory"], default="disk")
    ap.add_argument("--settle", type=float, default=10, help="seconds to wait for the backups")
    a = ap.parse_args()
    if not shutil.which("redis-benchmark"):
        sys.exit("redis-benchmark is not installed (scripts/setup installs redis-tools)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    keep = apps.ROOT / "eval" / "out" / "demo-failed-logs"  # a failed cluster's logs
    ctx = apps.Ctx(Path(tempfile.mkdtemp(prefix="lockstep-demo-")), keep_logs=keep)
    with contextlib.ExitStack() as stack:
        # Runs last: the plain redis, anything left in the directory, the directory.
        stack.callback(shutil.rmtree, ctx.work, ignore_errors=True)
        stack.callback(apps.kill_leftovers, ctx.work)
        stack.callback(ctx.procs.stop_all)
        try:
            return run(a, ctx, stack)  # the cluster, if it started, is brought down first
        except (OSError, RuntimeError, subprocess.SubprocessError, KeyError) as e:
            print(f"demo: {e}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
