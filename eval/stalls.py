#!/usr/bin/env python3
"""Issue 9's calm-under-stalls targets: no leader change without a failure, and failover
when the leader is frozen or killed.

    scripts/bench stalls [--quick] [--timeouts 100-200,50-100] [--seconds 60] [--failovers 10]

For each election timeout (`cluster up --election-timeout-ms MIN-MAX`):

  hog        redis under lockstep (disk), loadgen SET at 16 connections for --seconds while
             2 x cores busy loops (bounded, each ends by itself) take the CPU beside it;
             counts leader changes (new "leader of ballot" lines in the replica logs),
             client errors (a connection cut off counts) and the replicas' own gaps (time a
             daemon did not run: credited to its peers, not counted as their silence).
             Baseline: the same load for a third as long without the hog, same run.
  failover   `lockstep bench failover --fault freeze` (SIGSTOP: nothing closes, only the
             election timeout notices) and `--fault kill` (SIGKILL: the sockets close),
             --failovers times each under 4 following clients; p50 and p99 until a new
             leader commits; every acknowledged entry checked on every replica.

Targets: 0 leader changes with the hog; frozen p50 <= the timeout's MAX + 30 ms; killed
p50 <= 15 ms. Writes eval/out/stalls.json, stalls.md and stalls.png, prints the table.
A failed phase keeps the cluster's logs in eval/out/stalls-failed-logs/; exit status 1 if
a phase failed or a target's count (leader changes, lost entries) is not zero.
"""

import argparse
import json
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import apps  # eval/apps.py: processes, clusters, loadgen, the machine
from apps import ROOT, log

LEADER_LINE = re.compile(r"replica (\d+): leader of ballot (\S+)")
GAPS = re.compile(r"own gap of (\d+) us: .*\((\d+) such gaps so far\)")


def leader_lines(d):
    return {
        m.group(0)
        for f in Path(d).glob("replica-*.log")
        for m in LEADER_LINE.finditer(f.read_text())
    }


def own_gaps(d):
    """(gaps credited, summed over replicas; longest one logged, ms)."""
    count, longest = 0, 0
    for f in Path(d).glob("replica-*.log"):
        found = GAPS.findall(f.read_text())
        if found:
            count += int(found[-1][1])
            longest = max(longest, max(int(g) for g, _ in found))
    return count, longest / 1000


def hog_procs(ctx, seconds):
    spin = (
        f"import time\nend = time.monotonic() + {seconds + 5}\nwhile time.monotonic() < end: pass"
    )
    n = 2 * (os.cpu_count() or 2)
    return [ctx.procs.start([sys.executable, "-c", spin], ctx.work / "hog.log") for _ in range(n)]


def phase_hog(ctx, timeout, seconds):
    extra = ["--election-timeout-ms", timeout]
    out = {"election_timeout_ms": timeout, "seconds": seconds}
    with apps.lockstep_cluster(ctx, "redis", "disk", extra=extra) as (d, st):
        addr = st["client_addr"]
        apps.wait_ready("redis", addr)
        base_s = max(5, round(seconds / 3))
        before = leader_lines(d)
        log(f"  {timeout} ms: baseline, 16 connections for {base_s} s without a hog")
        out["baseline"] = apps.loadgen("redis", addr, 16, "set", base_s, 64, 10000)
        out["baseline"]["leader_changes"] = len(leader_lines(d) - before)
        gaps0 = own_gaps(d)
        hogs = hog_procs(ctx, seconds)
        log(f"  {timeout} ms: 16 connections for {seconds} s beside {len(hogs)} busy loops")
        try:
            before = leader_lines(d)
            out["hog"] = apps.loadgen("redis", addr, 16, "set", seconds, 64, 10000)
            out["hog"]["busy_loops"] = len(hogs)
            changes = sorted(leader_lines(d) - before)
            out["hog"]["leader_changes"] = len(changes)
            out["hog"]["new_leader_lines"] = changes
        finally:
            for h in hogs:
                ctx.procs.stop(h)
        gaps = own_gaps(d)
        out["hog"]["own_gaps"], out["hog"]["longest_logged_gap_ms"] = gaps[0] - gaps0[0], gaps[1]
        h = out["hog"]
        log(
            f"  {timeout} ms with the hog: {h['leader_changes']} leader changes, "
            f"{h['errors']} client errors, {h['ops_per_s']:.0f} ops/s "
            f"(without: {out['baseline']['ops_per_s']:.0f}), {h['own_gaps']} own gaps credited"
        )
        if h["leader_changes"] or h["errors"] or out["baseline"]["leader_changes"]:
            apps.keep_logs(ctx, d)
    return out


def phase_failover(ctx, timeout, fault, count):
    d = Path(tempfile.mkdtemp(prefix=f"failover-{fault}-", dir=ctx.work))
    js = d / "f.json"
    cmd = ["bench", "failover", "--fault", fault, "--kills", str(count), "--clients", "4"]
    cmd += ["--election-timeout-ms", timeout, "--base-port", str(apps.pick_base_port())]
    cmd += ["--dir", str(d / "cluster"), "--json", str(js)]
    log(f"  lockstep {' '.join(cmd)}")
    r = apps.lockstep_run(cmd, timeout=120 + 20 * count)
    if not js.exists():
        apps.keep_logs(ctx, d)
        raise RuntimeError(
            f"bench failover --fault {fault}: {(r.stdout + r.stderr).strip()[-800:]}"
        )
    out = json.loads(js.read_text())
    out["cmd"] = "lockstep " + " ".join(cmd[:-4])
    out["exit_status"] = r.returncode
    log(
        f"  {fault} at {timeout} ms: p50 {out['failover_p50_ms']:.1f} ms, p99 "
        f"{out['failover_p99_ms']:.1f} ms, lost {out['lost_acknowledged']}, "
        f"failed {out['failed_kills']}"
    )
    if r.returncode != 0:
        apps.keep_logs(ctx, d)
    return out


def phase_step(ctx, entry, phase, a):
    t = entry["election_timeout_ms"]

    def step():
        log(f"election timeout {t} ms: {phase}")
        if phase == "hog":
            entry.update(phase_hog(ctx, t, a.seconds))
        else:
            entry[phase] = phase_failover(ctx, t, phase, a.failovers)

    return step


def verdict(ok):
    return "PASS" if ok else "SHORT"


def table(res):
    rows = [
        "| election timeout | what | measured | target | verdict |",
        "|---|---|---|---|---|",
    ]
    for t in res["timeouts"]:
        name = t["election_timeout_ms"]
        if "hog" in t:
            h, b = t["hog"], t["baseline"]
            rows.append(
                f"| {name} ms | leader changes, 16 conns beside {h['busy_loops']} busy loops "
                f"for {t['seconds']} s | {h['leader_changes']} ({h['errors']} client errors; "
                f"{h['ops_per_s']:.0f} ops/s vs {b['ops_per_s']:.0f} without, "
                f"{b['leader_changes']} changes then; {h['own_gaps']} own gaps credited, "
                f"longest logged {h['longest_logged_gap_ms']:.0f} ms) | 0 | "
                f"{verdict(h['leader_changes'] == 0 and h['errors'] == 0)} |"
            )
        for fault in ("freeze", "kill"):
            f = t.get(fault)
            if not f:
                continue
            rows.append(
                f"| {name} ms | failover, leader {'frozen' if fault == 'freeze' else 'killed'} "
                f"(x{f['kills']}) | p50 {f['failover_p50_ms']:.1f} ms, p99 "
                f"{f['failover_p99_ms']:.1f} ms; lost {f['lost_acknowledged']} of "
                f"{f['acknowledged']} acknowledged | p50 <= {f['target_p50_ms']:.0f} ms, lost 0 | "
                f"{verdict(f['failover_p50_ms'] <= f['target_p50_ms'] and f['lost_acknowledged'] == 0 and f['failed_kills'] == 0)} |"
            )
    for fl in res["failed"]:
        rows.append(f"| | {fl['phase']} | FAILED: {fl['reason'][:200]} | | |")
    return "\n".join(rows) + "\n"


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels, data = [], []
    for t in res["timeouts"]:
        for fault in ("kill", "freeze"):
            if t.get(fault) and t[fault].get("failover_ms"):
                labels.append(f"{fault}\n{t['election_timeout_ms']} ms")
                data.append(t[fault]["failover_ms"])
    if not data:
        return
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels)
    for i, t in enumerate(res["timeouts"]):
        lo, hi = (int(x) for x in t["election_timeout_ms"].split("-"))
        ax.axhspan(lo, hi, color=f"C{i}", alpha=0.08, label=f"election timeout {lo}-{hi} ms")
    ax.set_ylabel("ms until a new leader commits")
    ax.set_title("Failover: leader SIGKILLed (sockets close) or SIGSTOPped (only the timeout)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(res, js):
    md = table(res)
    js.write_text(json.dumps(res, indent=1))
    js.with_suffix(".md").write_text(
        f"# Calm under stalls ({res['machine']['date']}, {res['machine']['git']})\n\n"
        f"`{res['command']}`\n\n{md}"
    )
    plot(res, js.with_suffix(".png"))
    print(md, end="")
    log(f"wrote {js}, {js.with_suffix('.md')}, {js.with_suffix('.png')}")


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--timeouts", type=apps.csv(str), default=None, help="MIN-MAX,... in ms")
    ap.add_argument("--seconds", type=int, default=60, help="of the run beside the hog")
    ap.add_argument("--failovers", type=int, default=10, help="leaders frozen, and killed")
    ap.add_argument("--phases", type=apps.csv(str), default=["hog", "freeze", "kill"])
    ap.add_argument("--quick", action="store_true", help="20 s beside the hog, 5 failovers")
    ap.add_argument("--json", help="output (default eval/out/stalls.json)")
    ap.add_argument("--from-json", help="only redraw the table and plot of an existing JSON")
    a = ap.parse_args()
    js = Path(a.json) if a.json else ROOT / "eval" / "out" / "stalls.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text()), js)
        return 0
    if a.quick:
        a.seconds, a.failovers = 20, 5
    if not a.timeouts:
        a.timeouts = [default_timeout()]
    bad = [p for p in a.phases if p not in ("hog", "freeze", "kill")]
    if bad:
        ap.error(f"--phases: unknown {', '.join(bad)} (hog, freeze, kill)")
    for t in a.timeouts:
        if not re.fullmatch(r"\d+-\d+", t):
            ap.error(f"--timeouts: '{t}' is not MIN-MAX in ms")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    work = Path(tempfile.mkdtemp(prefix="lockstep-stalls-"))
    ctx = apps.Ctx(work, keep_logs=js.parent / "stalls-failed-logs")
    res = {
        "command": "scripts/bench stalls " + " ".join(sys.argv[1:]),
        "timeouts": [],
        "failed": [],
        "machine": apps.machine(work),
    }
    # One phase per (timeout, hog|freeze|kill), each filling its timeout's entry
    # (so each returns None); apps.run_phases lists a failed one and cleans up.
    steps = []
    for t in a.timeouts:
        entry = {"election_timeout_ms": t, "seconds": a.seconds}
        res["timeouts"].append(entry)
        for phase in a.phases:
            steps.append((f"{t} ms {phase}", phase_step(ctx, entry, phase, a)))
    apps.run_phases(ctx, work, res, steps)
    report(res, js)
    bad = bool(res["failed"])
    for t in res["timeouts"]:
        bad |= bool(t.get("hog", {}).get("leader_changes") or t.get("hog", {}).get("errors"))
        for fault in ("freeze", "kill"):
            f = t.get(fault)
            bad |= bool(f and (f["lost_acknowledged"] or f["failed_kills"]))
    return 1 if bad else 0


def default_timeout():
    """The default election timeout, as `cluster up --help` states it."""
    r = apps.lockstep_run(["cluster", "up", "--help"], timeout=20)
    m = re.search(r"\(default (\d+)-(\d+)\)", r.stdout + r.stderr)
    if not m:
        raise SystemExit("cannot read the default election timeout from `cluster up --help`")
    return f"{m.group(1)}-{m.group(2)}"


if __name__ == "__main__":
    sys.exit(main())
