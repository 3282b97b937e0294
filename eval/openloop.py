#!/usr/bin/env python3
"""memcached under an open-loop load: p99 latency and achieved rate against a target rate.

    .venv/bin/python eval/openloop.py memcached [--quick] [--repeats 3] [--seconds 3]
        [--ratios 3,5,10,50] [--rates 1000,2000,...,64000] [--conns 4] [--max-outstanding 64]
        [--modes unreplicated,replicated-disk,replicated-memory] [--loadgen build/bin/loadgen]
        [--json FILE] [--tmp DIR]
    .venv/bin/python eval/openloop.py memcached --from-json eval/out/memcached-openloop.json

A closed loop (eval/apps.py) measures how fast the clients get answers when each waits for
its reply; it cannot show what a client sees when requests come faster than the server
answers, because its clients slow down with the server. Here the load generator sends on
a schedule instead (tools/loadgen.c --rate, open loop): --conns connections (default 4)
together send TARGET requests per second, each connection on its own Poisson schedule
(exponential inter-arrival times) whether or not replies have come, pipelining up to
--max-outstanding (64) unanswered requests per connection. Each request's latency runs from
its scheduled send time, so the time a request waits because the server (or a full
pipeline, counted as "late") holds it back is in the latency. Requests due while the
pipeline is full at the end of the window are not sent ("unsent").

Workload: memcached text protocol on 10000 keys (key:0 .. key:9999, uniform), 64-byte
values; each op is a `set` with probability SET% (--ratios: 3, 5, 10 and 50 %), else a
`get`. Every key is written once per mode before measuring, so gets hit. Modes, one after
the other in the same run:

  unreplicated       one memcached with the command of apps/memcached.toml (`memcached -p
                     PORT -l 127.0.0.1 -U 0 -t 1 -m 256 -c 4096 -u root`); durability none
  replicated-disk    `lockstep cluster up --replicas 3 --app memcached --durability disk`
  replicated-memory  the same with --durability memory (the RAM of a majority: not durable)

(clients on "client_addr" of `lockstep cluster status --json`, the leader's memcached).

For each mode, SET% and target rate (--rates, default 1K, 2K, 4K, ... 64K ops/s) one loadgen
run of --seconds (3) records the achieved rate (ops completed per second) and the p99 (and
p50) latency. A mode's series for one SET% stops at the second target whose achieved rate
is below 0.8 x the target (the server is saturated: higher targets only add queueing). The
series is repeated --repeats (3) times, repeat-major (repeat 1 of every point of the mode,
then repeat 2, ...: the same targets as repeat 1), so that a slow minute of the machine does
not land on one point; each point keeps the median and min-max over its repeats.
Takes up to about 15 minutes (fewer when series stop early). --quick: 1 repeat of 2 s,
SET% 5 and 50, targets 1K, 4K, 16K, 64K (about 1 minute).

All of it runs on one machine (here one 2-core VM): the three replicas (daemons and their
memcached) and the load generator share its cores, and the two other replicas are a local
shared-memory hop away, so the absolute rates are this machine's; what compares is the
modes against each other in the same run. The JSON keeps the load average at every sample.

Writes eval/out/memcached-openloop.json (every sample and the points), .md (the table) and
.png (one panel per SET%: p99 against target, log scales, one line per mode with min-max
bars; below it achieved against target). Every process started here is stopped by its pid,
clusters by `lockstep cluster down` and then by pid; directories are removed. Exit status 1
if a mode failed (its points so far are kept), 2 for a bad command line.
"""

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import profiles  # eval/profiles.py: apps/APP.toml loaded, its {port}, {dir}, {host} filled in

import apps  # eval/apps.py: processes, clusters, prefill, the machine
from apps import HOST, log

MODES = {  # name -> durability
    "unreplicated": "none",
    "replicated-disk": "disk",
    "replicated-memory": "memory",
}
RATES = [1000, 2000, 4000, 8000, 16000, 32000, 64000]
QUICK_RATES = [1000, 4000, 16000, 64000]
RATIOS = [3, 5, 10, 50]
SATURATED = 0.8  # achieved below this fraction of the target: the server did not keep up
GRACE_S = 5  # loadgen waits this long past --seconds for replies still due
COLORS = {name: f"C{i}" for i, name in enumerate(MODES)}


# ---------------------------------------------------------------------------
# Modes: each yields the address clients use
# ---------------------------------------------------------------------------


def profile_command(app):
    """The server command of apps/APP.toml (its {port}, {dir} and {host} still to fill in)."""
    return profiles.load(app)["command"]


def pick_port():
    for _ in range(200):
        port = random.randrange(20000, 40000)
        if apps.port_free(port):
            return port
    raise RuntimeError("no free port in 20000-40000")


@contextlib.contextmanager
def mode_unreplicated(ctx, app):
    d = Path(tempfile.mkdtemp(prefix="unreplicated-", dir=ctx.work))
    for attempt in range(3):
        port = pick_port()
        cmd = [profiles.render(x, port, d, HOST) for x in shlex.split(profile_command(app))]
        p = ctx.procs.start(cmd, d / "log")
        addr = f"{HOST}:{port}"
        try:
            apps.wait_ready(app, addr, p)
            break
        except RuntimeError:
            ctx.procs.stop(p)
            if attempt == 2:
                raise
    log(f"  {' '.join(cmd)} (pid {p.pid})")
    try:
        yield addr, lambda e: e
    finally:
        ctx.procs.stop(p)


def mode_replicated(durability):
    @contextlib.contextmanager
    def mode(ctx, app):
        with apps.lockstep_cluster(ctx, app, durability) as (d, st):
            addr = st["client_addr"]
            apps.wait_ready(app, addr)

            def explain(e):  # say whether the leader moved (its clients lose it then)
                moved = apps.leader_change(d, st)
                return RuntimeError(f"{e} [{moved}]") if moved else e

            yield addr, explain

    return mode


MODE_CMS = {
    "unreplicated": mode_unreplicated,
    "replicated-disk": mode_replicated("disk"),
    "replicated-memory": mode_replicated("memory"),
}


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def loadgen_open(a, app, addr, rate, ratio):
    """One open-loop run; loadgen's JSON line. Raises RuntimeError (with the JSON, if any,
    as .sample) when loadgen fails or a reply was an error."""
    host, port = apps.split_addr(addr)
    cmd = [str(a.loadgen), *f"--proto {app} --host {host} --port {port}".split()]
    cmd += f"--conns {a.conns} --seconds {a.seconds:g} --rate {rate:g}".split()
    cmd += f"--set-ratio {ratio:g} --max-outstanding {a.max_outstanding}".split()
    cmd += f"--value-bytes {a.value_bytes} --keys {a.keys}".split()
    try:
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=a.seconds + GRACE_S + 30,  # loadgen ends by itself by seconds + 5
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"loadgen did not end: {shlex.join(cmd)}") from e
    lines = r.stdout.strip().splitlines()
    res = json.loads(lines[-1]) if lines else None
    if r.returncode != 0 or res is None or res["errors"]:
        err = RuntimeError(
            f"loadgen at {rate} ops/s, {ratio}% sets: exit {r.returncode}, "
            f"{res['errors'] if res else '?'} errors: {r.stderr.strip()[-400:]}"
        )
        err.sample = res
        raise err
    return res


def sample_entry(name, ratio, rate, rep, res):
    keep = ("achieved_rate", "p50_us", "p99_us", "late", "unsent", "errors", "misses")
    e = {"mode": name, "durability": MODES[name], "set_pct": ratio, "target_rate": rate}
    e |= {"repeat": rep + 1, **{k: res[k] for k in keep}}
    e |= {"ops": res["ops"], "sets": res.get("sets"), "seconds": res["seconds"]}
    e["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return e


def run_mode(ctx, a, name, res):
    """Every point of mode `name`; samples go into res["samples"] as they come, so that a
    mode that breaks half-way keeps what it measured."""
    with MODE_CMS[name](ctx, a.app) as (addr, explain):
        log(f"  {addr}: writing {a.keys} keys")
        apps.prefill(a.app, addr, a.keys, a.value_bytes)
        series = {ratio: list(a.rates) for ratio in a.ratios}  # repeat 1 may cut these
        for rep in range(a.repeats):
            for ratio in a.ratios:
                saturated = 0
                for rate in list(series[ratio]):
                    try:
                        r = loadgen_open(a, a.app, addr, rate, ratio)
                    except RuntimeError as e:
                        if getattr(e, "sample", None):
                            res["samples"].append(sample_entry(name, ratio, rate, rep, e.sample))
                        raise explain(e) from e
                    res["samples"].append(sample_entry(name, ratio, rate, rep, r))
                    log(
                        f"  {name} {ratio}% sets, {rate} ops/s, repeat {rep + 1}/{a.repeats}: "
                        f"achieved {r['achieved_rate']:.0f}/s, p50 {r['p50_us']:.0f} µs, "
                        f"p99 {r['p99_us']:.0f} µs, late {r['late']}, unsent {r['unsent']}"
                    )
                    if rep == 0 and r["achieved_rate"] < SATURATED * rate:
                        saturated += 1
                        if saturated == 2:  # later repeats stop here too
                            series[ratio] = [x for x in a.rates if x <= rate]
                            log(f"  {name} {ratio}% sets: saturated twice, series ends here")
                            break


def mode_step(ctx, a, name, res):
    def step():
        log(f"{name}:")
        try:
            run_mode(ctx, a, name, res)
        except apps.Skip as e:
            log(f"  skipped: {e}")
            res["skipped"].append({"mode": name, "reason": str(e)})

    return step


def points(samples):
    """Median and min-max over the repeats of each (mode, SET%, target)."""
    groups = {}
    for s in samples:
        groups.setdefault((s["mode"], s["set_pct"], s["target_rate"]), []).append(s)
    out = []
    for (mode, ratio, rate), ss in groups.items():
        ach, p99 = [s["achieved_rate"] for s in ss], [s["p99_us"] for s in ss]
        out.append(
            {
                "mode": mode,
                "durability": MODES.get(mode, "?"),
                "set_pct": ratio,
                "target_rate": rate,
                "repeats": len(ss),
                "achieved_rate": statistics.median(ach),
                "achieved_min": min(ach),
                "achieved_max": max(ach),
                "p99_us": statistics.median(p99),
                "p99_min_us": min(p99),
                "p99_max_us": max(p99),
                "p50_us": statistics.median(s["p50_us"] for s in ss),
                "late": statistics.median(s["late"] for s in ss),
                "unsent": statistics.median(s["unsent"] for s in ss),
                "saturated": statistics.median(ach) < SATURATED * rate,
            }
        )
    order = list(MODES)
    out.sort(key=lambda p: (p["set_pct"], order.index(p["mode"]), p["target_rate"]))
    return out


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def label(mode):
    return {"replicated-disk": "replicated/disk", "replicated-memory": "replicated/memory"}.get(
        mode, mode
    )


def fmt_us(x):
    return f"{x / 1000:.1f} ms" if x >= 10000 else f"{x:.0f}"


def fmt_range(lo, hi):  # µs, or ms for both ends when the top is 10 ms or more
    return f"{lo / 1000:.1f}–{hi / 1000:.1f} ms" if hi >= 10000 else f"{lo:.0f}–{hi:.0f}"


def table(res):
    pts = res["points"]
    rows = [
        (
            "| set % | mode | target ops/s | achieved ops/s (median) | min–max "
            "| p99 µs (median) | min–max | p50 µs | late | unsent |"
        ),
        "|" + "---|" * 10,
    ]
    for p in pts:
        mark = " (sat.)" if p["saturated"] else ""
        rows.append(
            f"| {p['set_pct']:g} | {label(p['mode'])} | {p['target_rate']} "
            f"| {p['achieved_rate']:.0f}{mark} | {p['achieved_min']:.0f}–{p['achieved_max']:.0f} "
            f"| {fmt_us(p['p99_us'])} | {fmt_range(p['p99_min_us'], p['p99_max_us'])} "
            f"| {fmt_us(p['p50_us'])} | {p['late']:.0f} | {p['unsent']:.0f} |"
        )
    out = "\n".join(rows) + "\n"
    # The knee of each series: the highest target still met (median achieved >= 0.95 x)
    # and its p99, next to unreplicated's p99 at that target.
    knee = [
        (
            "| set % | mode | highest target met (achieved ≥ 0.95 ×) | its p99 µs "
            "| unreplicated p99 at that target µs |"
        ),
        "|---|---|---|---|---|",
    ]
    for ratio in sorted({p["set_pct"] for p in pts}):
        for mode in MODES:
            met = [
                p
                for p in pts
                if p["mode"] == mode
                and p["set_pct"] == ratio
                and p["achieved_rate"] >= 0.95 * p["target_rate"]
            ]
            if not any(p["mode"] == mode and p["set_pct"] == ratio for p in pts):
                continue
            if not met:
                knee.append(f"| {ratio:g} | {label(mode)} | none | – | – |")
                continue
            top = max(met, key=lambda p: p["target_rate"])
            base = next(
                (
                    p
                    for p in pts
                    if p["mode"] == "unreplicated"
                    and p["set_pct"] == ratio
                    and p["target_rate"] == top["target_rate"]
                ),
                None,
            )
            knee.append(
                f"| {ratio:g} | {label(mode)} | {top['target_rate']} | {fmt_us(top['p99_us'])} "
                f"| {fmt_us(base['p99_us']) if base else '–'} |"
            )
    out += "\n" + "\n".join(knee) + "\n"
    for s in res.get("skipped", []):
        out += f"\nskipped: {s['mode']}: {s['reason']}"
    for s in res.get("failed", []):
        out += f"\nFAILED: {s['phase']}: {s['reason']}"
    return out + "\n"


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = res["points"]
    ratios = sorted({p["set_pct"] for p in pts})
    if not ratios:
        return False
    fig, axes = plt.subplots(
        2, len(ratios), figsize=(4.6 * len(ratios), 8), squeeze=False, sharex=True
    )
    all_rates = sorted({p["target_rate"] for p in pts})
    for col, ratio in enumerate(ratios):
        ax_l, ax_a = axes[0][col], axes[1][col]
        for mode in MODES:
            ps = [p for p in pts if p["mode"] == mode and p["set_pct"] == ratio]
            if not ps:
                continue
            x = [p["target_rate"] for p in ps]
            kw = {"color": COLORS[mode], "marker": "o", "ms": 4, "capsize": 3, "label": label(mode)}
            p99 = [p["p99_us"] for p in ps]
            ax_l.errorbar(
                x,
                p99,
                yerr=[
                    [v - p["p99_min_us"] for v, p in zip(p99, ps, strict=True)],
                    [p["p99_max_us"] - v for v, p in zip(p99, ps, strict=True)],
                ],
                **kw,
            )
            ach = [p["achieved_rate"] for p in ps]
            ax_a.errorbar(
                x,
                ach,
                yerr=[
                    [v - p["achieved_min"] for v, p in zip(ach, ps, strict=True)],
                    [p["achieved_max"] - v for v, p in zip(ach, ps, strict=True)],
                ],
                **kw,
            )
        ax_a.plot(all_rates, all_rates, "k:", lw=1, label="achieved = target")
        for ax in (ax_l, ax_a):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.25)
        ax_l.set_title(f"memcached, {ratio:g}% sets, {100 - ratio:g}% gets")
        ax_a.set_xlabel("target ops/s (open loop, Poisson)")
        if col == 0:
            ax_l.set_ylabel("p99 latency µs (from scheduled send; bars: min–max)")
            ax_a.set_ylabel("achieved ops/s (bars: min–max)")
        ax_l.legend(fontsize=8)
        ax_a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(res, js):
    res["points"] = points(res["samples"])
    js.write_text(json.dumps(res, indent=1) + "\n")
    md, png = js.with_suffix(".md"), js.with_suffix(".png")
    m = res["machine"]
    head = (
        f"# {res['app']} under an open-loop load — {m.get('date', '')}\n\n"
        f"`{res.get('command', '')}` on {m.get('cores')} cores ({m.get('cpu')}), "
        f"{m.get('memcached')}, git {m.get('git')}; {res['conns']} connections, Poisson "
        f"arrivals, at most {res['max_outstanding']} outstanding per connection, "
        f"{res['seconds']:g} s per sample, median and min–max of {res['repeats']} repeat(s); "
        f"latency from each request's scheduled send time. The replicas and the load generator "
        f"share this machine's cores. Load average {m.get('loadavg_start')} at start, "
        f"{m.get('loadavg_end')} at the end. (sat.): median achieved < {SATURATED} × target; "
        f"a series stops at its second such target.\n\n"
    )
    text = table(res)
    drew = plot(res, png)
    md.write_text(head + text + (f"\n![plot]({png.name})\n" if drew else ""))
    print(text)
    log(f"wrote {js}, {md}" + (f" and {png}" if drew else ""))


# ---------------------------------------------------------------------------


def check_loadgen(path):
    """Why loadgen at path cannot run an open loop, or None."""
    if not Path(path).exists():
        return f"{path} does not exist (cmake --build build, or --loadgen PATH)"
    r = subprocess.run(
        [str(path), "--help"], check=False, capture_output=True, text=True, timeout=10
    )
    if "--rate" not in r.stdout + r.stderr:
        return f"{path} has no --rate (open loop): rebuild it from tools/loadgen.c"
    return None


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("app", choices=["memcached"])
    ap.add_argument("--seconds", type=float, default=3.0, help="per sample (default 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ratios", type=apps.csv(float), default=RATIOS, help="percent of sets")
    ap.add_argument("--rates", type=apps.csv(int), default=RATES, help="target ops/s")
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--max-outstanding", type=int, default=64, help="per connection")
    ap.add_argument("--modes", type=apps.csv(str), default=list(MODES))
    ap.add_argument("--quick", action="store_true", help="1 repeat of 2 s, 5 and 50 %% sets")
    ap.add_argument("--value-bytes", type=int, default=64)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--loadgen", default=str(apps.LOADGEN), help="default build/bin/loadgen")
    apps.add_output_args(ap, "APP-openloop")
    a = ap.parse_args()
    js = apps.output_json(a, f"{a.app}-openloop")
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text()), js)
        return 0
    if a.quick:
        a.repeats, a.seconds, a.ratios, a.rates = 1, 2.0, [5, 50], QUICK_RATES
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {', '.join(bad)} (have {', '.join(MODES)})")
    if any(not 0 <= r <= 100 for r in a.ratios) or any(r <= 0 for r in a.rates):
        ap.error("--ratios take 0..100, --rates positive numbers")
    if a.repeats < 1 or a.seconds <= 0 or a.conns < 1 or a.max_outstanding < 1:
        ap.error("--repeats, --seconds, --conns and --max-outstanding must be positive")
    a.rates = sorted(set(a.rates))
    a.loadgen = Path(a.loadgen).resolve()
    why = check_loadgen(a.loadgen)
    if why:
        sys.exit(f"openloop: {why}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    work = apps.work_dir("lockstep-openloop-", a.tmp)
    ctx = apps.Ctx(work, keep_logs=js.parent / f"{a.app}-openloop-failed-logs")
    res = {
        "app": a.app,
        "command": "eval/openloop.py " + " ".join(sys.argv[1:]),
        "loadgen": str(a.loadgen),
        "seconds": a.seconds,
        "repeats": a.repeats,
        "conns": a.conns,
        "max_outstanding": a.max_outstanding,
        "interarrival": "exponential (Poisson), per connection target/conns",
        "keys": a.keys,
        "value_bytes": a.value_bytes,
        "ratios": a.ratios,
        "rates": a.rates,
        "samples": [],
        "skipped": [],
        "failed": [],
        "machine": apps.machine(work),
    }
    n = len(a.ratios) * len(a.rates) * a.repeats
    log(f"{a.app}: modes {', '.join(a.modes)}; up to {n} samples of {a.seconds:g} s each")
    steps = [(name, mode_step(ctx, a, name, res)) for name in a.modes]
    apps.run_phases(ctx, work, res, steps)  # a failed mode is in res["failed"]; cleans up
    report(res, js)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
