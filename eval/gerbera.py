#!/usr/bin/env python3
"""Benchmarks gerbera (apps/gerbera.toml) under lockstep against gerbera alone, with ab.

    scripts/bench gerbera [--seconds 3] [--repeats 3] [--conns 1,16] [--requests 50000]
                          [--modes unreplicated,replicated-disk,replicated-memory]
                          [--quick] [--json FILE]
    .venv/bin/python eval/gerbera.py --from-json eval/out/gerbera.json   (redraw only)

Each mode runs in a network namespace made for it and deleted after it (eval/netns.py, the
one tests/test_gerbera.py uses: an interface at 10.77.0.1/24, IPv6 off, ephemeral ports
32768-48999, a DNAT of 127.0.0.1:49200-49206 to 10.77.0.1 for the daemons' readiness checks
and replays). This process enters it (setns), so the servers, the cluster, ab and the checks
all run inside; deleting it kills by pid whatever still runs there. Modes, all in one run:

  unreplicated       gerbera alone, without the shim, started as `cluster up --app gerbera`
                     starts a replica's (eval/appbench.py start_profile_server: a fresh
                     directory, apps/gerbera/config.xml rendered into it, the profile's
                     command) on port 49500; durability "none" (one process)
  replicated-disk    `lockstep cluster up --replicas 3 --app gerbera --durability disk|memory
  replicated-memory  --base-port 49000 --transport shm`; ab talks to the leader's server, the
                     port of "client_addr" (`cluster status --json`); memory: the log in the
                     RAM of a majority, not durable. The profile is a copy whose `--ip {host}`
                     names 10.77.0.1 (eval/netns.py gerbera_profile: {host} is 127.0.0.1 here)

In every mode ab connects to 10.77.0.1:PORT itself: gerbera listens there only, and
client_addr's 127.0.0.1:PORT would reach the same server through the DNAT, which the
unreplicated server does not have; so no NAT is on the measured path in any mode.

What is measured, per mode, connection count and repeat: one

    ab -r -t SECONDS -n REQUESTS -c CONNS -e CSV http://10.77.0.1:PORT/cm.xml

(ApacheBench 2.3, apache2-utils): CONNS (1 and 16) connections in a closed loop, one request
per connection (no -k: ab's HTTP/1.0 requests without keep-alive; gerbera closes after each
reply anyway), until SECONDS have passed or REQUESTS (default 50000) are done, whichever
comes first (-t comes before -n: ab's -t resets the count to 50000). /cm.xml is the
ConnectionManager service description, a static page every replica answers alike
(apps/gerbera.toml); it is fetched once per mode before measuring and must be a 200 that
holds GetProtocolInfo. Recorded: requests/s (ab's "Requests per second"), mean latency (ab's
"Time per request (mean)", i.e. CONNS x elapsed / complete requests), p50 and p99 (ab's
percentile table of the whole request time, read from -e's CSV for its µs resolution instead
of the whole ms ab prints), failed requests (ab's "Failed requests": connect, receive, length
and exceptions; plus "Non-2xx responses"), and the CPU time per request of each class of
process: daemons and servers from /proc (every thread) over ab's run, ab from its rusage.
A failed request fails the mode (what it measured before is kept). Repeats are spread over
the mode's run (repeat 1 at every connection count, then repeat 2, ...); the JSON keeps the
median over repeats, min and max, and every sample; ratios lockstep / unreplicated of
requests/s and of p50.

State check at the end of each cluster's life (also after a failed load): wait (60 s at
most) until every replica's applied_index equals the leader's commit_index, 3 s more (a
backup's output points wait up to 2 s for the leader's), then `lockstep divergence list
--json` must be empty (the reports are printed and kept otherwise). A failed check keeps the
cluster's logs in eval/out/gerbera-failed-logs/ and makes the exit status 1, as does a
failed mode.

Writes eval/out/gerbera.json (eval/appbench.py's shape, read by eval/all_report.py: {"app",
"runs": [{"mode", "durability", "conns", "op": "GET /cm.xml", "ops_per_s", "p50_us",
"p99_us", "mean_us", "min_ops_per_s", "max_ops_per_s", "failed", "per_op", "samples", ...}],
"checks", "failed", "machine"}), gerbera.md (table, ratios, CPU per request, state checks,
machine) and gerbera.png (requests/s and p50/p99 per mode and connection count); prints the
table. --quick: 1 repeat of 2 s, about 25 s here (default 3 repeats of 3 s, about 1.5
minutes). Progress goes to stderr.
"""

import argparse
import contextlib
import json
import re
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import appbench  # eval/appbench.py: a profile's server alone, state check pieces
import netns  # eval/netns.py: the namespace (shared with tests/test_gerbera.py)
import proc_usage  # eval/proc_usage.py: CPU and context switches of processes over a run

import apps  # eval/apps.py: processes, clusters, plots, machine facts
from apps import log

APP = "gerbera"
PATH = "/cm.xml"
OP = f"GET {PATH}"
HOLDS = b"<name>GetProtocolInfo</name>"  # what the page must hold
UNREPLICATED_PORT = 49500  # above libupnp's 49152, away from the cluster's ports
CLASSES = ("daemons", "servers", "ab")
AB = shutil.which("ab") or "/usr/bin/ab"


# ---------------------------------------------------------------------------
# Modes: each a context manager yielding (address ab uses, {class: [pid]}, cluster dir)
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def mode_unreplicated(ctx):
    with appbench.profile_server(ctx, APP, port=UNREPLICATED_PORT, host=netns.ADDR) as (p, a, _):
        yield a, {"servers": [p.pid]}, None


def mode_replicated(durability):
    @contextlib.contextmanager
    def mode(ctx):
        profile = netns.gerbera_profile(ctx.work)  # --ip 10.77.0.1 for its {host}
        with apps.lockstep_cluster(ctx, profile, durability, base_port=netns.BASE_PORT) as (d, st):
            port = apps.split_addr(st["client_addr"])[1]
            addr = f"{netns.ADDR}:{port}"
            apps.wait_ready(APP, addr)
            with appbench.naming_leader_change(d, st):
                yield addr, appbench.cluster_pids(st), d

    return mode


# name -> (JSON mode, durability, context manager)
MODES = {
    "unreplicated": ("unreplicated", "none", mode_unreplicated),
    "replicated-disk": ("replicated", "disk", mode_replicated("disk")),
    "replicated-memory": ("replicated", "memory", mode_replicated("memory")),
}


# ---------------------------------------------------------------------------
# ab
# ---------------------------------------------------------------------------


def fetch_page(addr):
    """GETs PATH once (HTTP/1.0, as ab); the body's length, or RuntimeError unless it is a
    200 holding HOLDS."""
    host, port = apps.split_addr(addr)
    buf = b""
    with socket.create_connection((host, port), timeout=15) as s:
        s.sendall(f"GET {PATH} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
        while len(buf) < 1 << 20 and (chunk := s.recv(65536)):
            buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200 " not in status + " " or HOLDS not in body:
        raise RuntimeError(f"GET {PATH} at {addr}: {buf[:300]!r}")
    return len(body)


def parse_ab(text):
    """The numbers of ab's report (stdout)."""

    def num(label):
        m = re.search(rf"^{re.escape(label)}:\s+([\d.]+)", text, re.MULTILINE)
        return float(m.group(1)) if m else None

    failed = re.search(r"^Failed requests:\s+\d+\s*\n\s*\((.*?)\)", text, re.MULTILINE)
    return {
        "ops": int(num("Complete requests") or 0),
        "failed": int(num("Failed requests") or 0),
        "failed_detail": failed.group(1) if failed else "",
        "non_2xx": int(num("Non-2xx responses") or 0),
        "ops_per_s": num("Requests per second"),
        "mean_us": (num("Time per request") or 0) * 1000,  # the first: "(mean)"
        "elapsed_s": num("Time taken for tests"),
        "doc_bytes": int(num("Document Length") or 0),
        "table_ms": {
            int(p): int(ms) for p, ms in re.findall(r"^\s+(\d+)%\s+(\d+)", text, re.MULTILINE)
        },
    }


def run_ab(addr, conns, seconds, requests, pids):
    """One ab run (see the docstring); its numbers, with per_op CPU of every class."""
    with tempfile.NamedTemporaryFile("w+", suffix=".csv") as csv:
        cmd = [AB, "-r", "-t", str(seconds), "-n", str(requests), "-c", str(conns)]
        cmd += ["-e", csv.name, f"http://{addr}{PATH}"]
        rc, out, err, spent, ru = proc_usage.run_counted(cmd, pids, seconds + 60)
        rows = (ln.split(",") for ln in csv.read().splitlines()[1:] if "," in ln)
        perc = {int(a): float(b) for a, b in rows}
    res = parse_ab(out)
    if rc != 0 or not res["ops"] or res["ops_per_s"] is None or 99 not in perc:
        raise RuntimeError(f"ab failed ({rc}): {err.strip()[-500:]} {out.strip()[-800:]}")
    res.update(
        cmd=" ".join(cmd[1:-3] + cmd[-1:]),
        p50_us=perc[50] * 1000,
        p99_us=perc[99] * 1000,
        errors=res["failed"] + res["non_2xx"],
        per_op=proc_usage.per_op(spent, ru, res["ops"], own="ab"),
    )
    return res


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def measure_mode(name, a, res, ctx):
    mode, durability, cm = MODES[name]
    samples = {}
    try:
        with netns.Netns("lsgb").inside(netns.cluster_server_ports()) as ns:
            log(f"{name}: namespace {ns.name}")
            with cm(ctx) as (addr, pids, d):
                try:
                    doc = fetch_page(addr)
                    log(f"  {name} at http://{addr}{PATH} ({doc} bytes)")
                    measure(name, a, addr, pids, doc, samples)
                except Exception:  # a cluster is checked also when its load failed
                    if d is not None:
                        check_cluster(ctx, res, name, d, after_failure=True)
                    raise
                if d is not None:
                    check_cluster(ctx, res, name, d)
    finally:  # what was measured before a failure is kept (the failure is listed too)
        for conns, rs in samples.items():
            run = apps.summarise(mode, durability, conns, OP, "ab", rs)
            run["mean_us"] = statistics.median(r["mean_us"] for r in rs)
            run["failed"] = sum(r["failed"] for r in rs)
            run["non_2xx"] = sum(r["non_2xx"] for r in rs)
            res["runs"].append(run)


def measure(name, a, addr, pids, doc, samples):
    for rep in range(a.repeats):
        for conns in a.conns:
            r = run_ab(addr, conns, a.seconds, a.requests, pids)
            samples.setdefault(conns, []).append(r)
            log(
                f"  {name} conns={conns} repeat {rep + 1}/{a.repeats}: {r['ops']} requests, "
                f"{r['ops_per_s']:.0f}/s, mean {r['mean_us']:.0f} µs, p50 {r['p50_us']:.0f} "
                f"µs, p99 {r['p99_us']:.0f} µs, failed {r['failed']}, non-2xx {r['non_2xx']}"
            )
            if r["errors"] or r["doc_bytes"] != doc:
                raise RuntimeError(
                    f"{name} conns={conns}: {r['failed']} failed requests "
                    f"({r['failed_detail']}), {r['non_2xx']} non-2xx, document "
                    f"{r['doc_bytes']} bytes (expected {doc}), {r['ops']} complete"
                )


def check_cluster(ctx, res, name, d, after_failure=False):
    """The end-of-run check of the cluster in d (see the docstring), into res["checks"]."""
    c = {"app": APP, "mode": name, "session": "all"}
    if after_failure:
        c["after_failed_load"] = True
    try:
        ok, applied, commit, waited = apps.wait_applied(d)
        c.update(applied_index=applied, commit_index=commit, applied_wait_s=round(waited, 2))
        if not ok:
            c["reason"] = f"replicas' applied_index {applied} not the commit_index {commit} in 60 s"
        time.sleep(3)  # a backup's output points wait up to 2 s for the leader's
        apps.divergence_check(d, c)
    except Exception as e:  # noqa: BLE001 (a load's own error, if any, goes on)
        c["reason"] = f"the check itself failed: {e}"
    c["ok"] = "reason" not in c
    if not c["ok"]:
        apps.keep_logs(ctx, d)
    res["checks"].append(c)
    log("  state check: " + check_text(c))


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def check_text(c):
    verdict = "PASS" if c["ok"] else f"FAIL: {' '.join(c.get('reason', '').split())}"
    after = ", after its load failed" if c.get("after_failed_load") else ""
    applied = ", ".join(f"r{i}: {v}" for i, v in sorted((c.get("applied_index") or {}).items()))
    div = c.get("divergences")
    return (
        f"- {c['mode']}{after}: {verdict}. applied_index {applied or '?'} (leader's "
        f"commit_index {c.get('commit_index')}) after {c.get('applied_wait_s')} s; divergence "
        f"reports: {len(div) if div is not None else '?'}"
    )


def table(res):
    runs, fmt, ratio = res["runs"], appbench.fmt, appbench.ratio
    rows = [
        "| mode | conns | requests/s (median) | min–max | mean µs | p50 µs | p99 µs | failed "
        "| req/s ÷ unrepl. | p50 ÷ unrepl. "
        + "".join(f"| {c} CPU µs/req " for c in CLASSES)
        + "| all CPU µs/req |",
        "|" + "---|" * (10 + len(CLASSES) + 1),
    ]
    key = {lab: i for i, lab in enumerate(apps.ORDER)}
    for r in sorted(runs, key=lambda r: (r["conns"], key[apps.label(r)])):
        base = apps.find(runs, "unreplicated", "none", r["conns"], OP)
        per = r.get("per_op", {})
        cpu = "".join(f"| {fmt(per[c]['cpu_us'], '{:.0f}') if c in per else '–'} " for c in CLASSES)
        total = apps.all_cpu_us(per) if per else None
        rows.append(
            f"| {apps.label(r)} | {r['conns']} | {r['ops_per_s']:.0f} "
            f"| {r['min_ops_per_s']:.0f}–{r['max_ops_per_s']:.0f} | {r['mean_us']:.0f} "
            f"| {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['failed'] + r['non_2xx']} "
            f"| {fmt(ratio(r['ops_per_s'], base and base['ops_per_s']))} "
            f"| {fmt(ratio(r['p50_us'], base and base['p50_us']))} {cpu}"
            f"| {fmt(total, '{:.0f}')} |"
        )
    text = "\n".join(rows) + "\n"
    return text + appbench.checks_and_failures(res, check_text)


def report(res, js):
    m = res["machine"]
    head = (
        f"# gerbera under lockstep — {m.get('date', '')}\n\n"
        f"`{res.get('command', '')}` on {m.get('cores')} cores ({m.get('cpu')}), "
        f"{m.get('gerbera')}, {m.get('ab')}, git {m.get('git')}; `{res.get('ab')}` against "
        f"each mode's server at 10.77.0.1 in a network namespace of its own, "
        f"{res.get('seconds')} s per measurement, median of {res.get('repeats')} repeats; load "
        f"average {m.get('loadavg_start')} at start, {m.get('loadavg_end')} at the end. Mean: "
        f"ab's Time per request (conns × elapsed ÷ requests); p50, p99: ab's percentile table "
        f"(-e). Ratios are against unreplicated in this run. CPU per request: daemons and "
        f"servers from /proc (every thread), ab from its rusage; medians over repeats.\n\n"
    )
    appbench.write_report(res, js, head, table(res), [OP])


def versions():
    out = appbench.command_output
    ab = re.search(r"Version ([\d.]+)", out(AB, "-V"))
    return {
        "gerbera": " ".join(out("gerbera", "--version").split()[:5]),
        "ab": f"ApacheBench {ab.group(1)}" if ab else "ab",
    }


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=int, default=3, help="ab -t, whole s (default 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conns", type=apps.csv(int), default=[1, 16])
    ap.add_argument("--requests", type=int, default=50000, help="ab -n (default 50000)")
    ap.add_argument("--modes", type=apps.csv(str), default=list(MODES))
    ap.add_argument("--quick", action="store_true", help="1 repeat of 2 s")
    apps.add_output_args(ap, APP)
    a = ap.parse_args()
    js = apps.output_json(a, APP)
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text()), js)
        return 0
    if a.quick:
        a.repeats, a.seconds = 1, 2
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}: choose from {list(MODES)}")
    missing = [x for x in ("gerbera", "ab", "ip", "nft") if not shutil.which(x)]
    if missing:
        sys.exit(f"not installed: {', '.join(missing)} (scripts/setup)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    work = apps.work_dir("lockstep-gerberabench-", a.tmp)
    ctx = apps.Ctx(work, keep_logs=js.parent / f"{APP}-failed-logs")
    res = {
        "app": APP,
        "command": f"scripts/bench gerbera {' '.join(sys.argv[1:])}".strip(),
        "seconds": a.seconds,
        "repeats": a.repeats,
        "conns": a.conns,
        "requests": a.requests,
        "ab": f"ab -r -t {a.seconds} -n {a.requests} -c CONNS http://10.77.0.1:PORT{PATH}",
        "runs": [],
        "checks": [],
        "skipped": [],
        "failed": [],
        "machine": {**apps.machine(work), **versions()},
    }
    log(f"gerbera: modes {', '.join(a.modes)}; conns {a.conns}, {a.repeats} x {a.seconds} s")
    steps = [(m, lambda m=m: measure_mode(m, a, res, ctx)) for m in a.modes]
    return appbench.run_and_report(ctx, work, res, js, steps, MODES, report)


if __name__ == "__main__":
    sys.exit(main())
