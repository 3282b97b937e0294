#!/usr/bin/env python3
"""Benchmarks slapd, clamd or tarantool under lockstep against the same server alone.

    scripts/bench slapd|clamd|tarantool [--seconds 3] [--repeats 3] [--conns 1,16] [--keys 2000]
                              [--modes unreplicated,replicated-disk,replicated-memory]
                              [--quick] [--json FILE]
    .venv/bin/python eval/appbench.py slapd --from-json eval/out/slapd.json   (redraw only)

Every measurement is build/bin/loadgen (tools/loadgen.c): N connections, one thread each,
closed loop, --seconds long. Modes, all in one run:

  unreplicated       the server of apps/APP.toml alone, without the shim, started as
                     `cluster up --app` starts each replica's (profile_server below: a fresh
                     directory, the profile's `prepare`, its `files` rendered into it, its
                     `command`); durability "none" (one process)
  replicated-disk    `lockstep cluster up --replicas 3 --app APP --durability disk|memory`
  replicated-memory  (memory: RAM of a majority, not durable); clients talk to "client_addr"
                     of `lockstep cluster status --json`

What is measured:

  slapd  `loadgen --proto ldap` (simple bind as the rootdn before the clock starts):
         modify (replace the 64-byte description of cn=key<n>), search (base-scope search of
         cn=key<n>) and add (a new entry cn=k<conn>-<i>, 64-byte description), n uniform over
         --keys entries. Add's names depend only on the connection and its op count, so a
         database takes one add run: every server (or cluster) serves one (repeat, conns)
         pair and is then stopped: it starts empty, gets `--op prefill` (the base entries and
         cn=key0..key<keys-1>, 8 connections, not timed), then modify, search and add, in
         that order, at that connection count. So modify and search run on --keys entries,
         add on --keys plus what it adds itself.
  clamd  `loadgen --proto clamd --op scan --value-bytes 16384 --infected-every 10`: each
         connection is an IDSESSION; each op a zINSTREAM of 16 KiB, every tenth carrying the
         test signature of apps/clamd/lockstep.ndb (must be answered FOUND, the others OK).
         One server (or cluster) per mode serves every repeat and connection count.
  tarantool  `loadgen --proto tarantool` (iproto, the guest user), the stand-in for MongoDB
         and SSDB: after `--op prefill` (documents 0..keys-1 and key-value pairs key:0..,
         8 connections, not timed), doc-replace and doc-get (space docs, memtx: documents of
         a 64-byte body), kv-set and kv-get (space kv, vinyl: an LSM tree on disk), one
         request outstanding per connection. One server (or cluster) per mode.

Repeats are spread over time (repeat 1 of every measurement of a mode, then repeat 2, ...);
the JSON keeps the median over repeats, min and max, and every sample. For each (mode, op,
conns): ops/s, p50 and p99 (loadgen's histogram), CPU time per op of each class of process
(daemons, servers: /proc, every thread; loadgen: its rusage) and the ratios lockstep /
unreplicated (throughput and p50). A client error (a leader change cuts the connections)
or a modify/search that finds no entry fails the mode; what it measured before is kept.

State check, at the end of every cluster's life (replicated modes): wait (60 s at most) until
every replica's applied_index equals the leader's commit_index (`cluster status --json`), then
  slapd  `slapcat -f DIR/replica-N/server/slapd.conf` of every replica must be byte-identical
         (mdb readers do not block the running slapd; retried for up to 20 s)
  clamd  the number of "FOUND" lines in every replica's DIR/replica-N/server/clamd.log must be
         equal (retried for up to 20 s; the loadgen's own FOUND count is shown beside it)
  tarantool  spaces docs and kv read through every replica's own server must be identical
  all    `lockstep divergence list --json --dir DIR` must be empty (the list and the first
         reports' `divergence show` are printed and kept in the JSON).
A cluster whose load failed is checked too.
A failed check keeps the cluster's logs in eval/out/APP-failed-logs/ and makes the exit
status 1, as does a failed mode.

Writes eval/out/APP.json (apps.py's shape: {"app", "runs": [{"mode", "durability", "conns",
"op", "ops_per_s", "p50_us", "p99_us", "min_ops_per_s", "max_ops_per_s", "per_op", "samples",
...}], "checks", "prefills", "failed", "machine"}), APP.md (table, ratios, CPU per op, state
checks, machine) and APP.png (throughput and p50/p99 per mode and connection count, a row per
op); prints the table. --quick: 1 repeat of 2 s, 1 and 16 connections. Progress goes to
stderr.
"""

import argparse
import contextlib
import hashlib
import itertools
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inspector  # eval/inspector.py: connections to a backup's own server
import profiles  # eval/profiles.py: apps/APP.toml loaded, its {port}, {dir}, {host} filled in

import apps  # eval/apps.py: processes, clusters, loadgen, plots, machine facts
from apps import HOST, log

APPS_DIR = profiles.APPS_DIR
SLAPCAT = shutil.which("slapcat") or "/usr/sbin/slapcat"

# What each app's measurements are: loadgen's protocol, the ops measured in order, the
# value size, more loadgen arguments, and whether a server serves one (repeat, conns) only.
SPECS = {
    "slapd": {
        "proto": "ldap",
        "ops": ["modify", "search", "add"],
        "value_bytes": 64,
        "extra": [],
        "server_per_measurement": True,  # add's entry names repeat in each run
        "prefill": True,
    },
    "clamd": {
        "proto": "clamd",
        "ops": ["scan"],
        "value_bytes": 16384,
        "extra": ["--infected-every", "10"],
        "server_per_measurement": False,
        "prefill": False,
    },
    "tarantool": {
        "proto": "tarantool",
        # documents (memtx: MongoDB's kind) and key-value pairs (vinyl: SSDB's kind)
        "ops": ["doc-replace", "doc-get", "kv-set", "kv-get"],
        "value_bytes": 64,
        "extra": [],
        "server_per_measurement": False,
        "prefill": True,
        "prefill_ops_per_key": 2,  # a document and a key-value pair
    },
}
PREFILL_CONNS = 8


# ---------------------------------------------------------------------------
# A profile's server alone (what `cluster up --app` runs on each replica)
# ---------------------------------------------------------------------------


def prepare_profile_dir(profile, d, port, host=HOST):
    """Fills the fresh directory d as `cluster up --app` fills a replica's: the profile's
    `prepare` with {dir} = d, then each of its `files` (relative to apps/) copied in by base
    name with {port}, {dir} and {host} replaced."""
    if profile.get("prepare"):
        argv = [profiles.render(x, port, d, host) for x in shlex.split(profile["prepare"])]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"prepare {argv} failed: {(r.stdout + r.stderr)[-500:]}")
    for f in (x.strip() for x in profile.get("files", "").split(",")):
        if f:
            src = APPS_DIR / f
            (d / src.name).write_bytes(profiles.render(src.read_bytes(), port, d, host))


def wait_log(proc, text, timeout):
    """Waits until proc's log holds text (the profile's ready_log: a server that
    listens before it serves says when it serves); nothing to wait for without it."""
    end = time.monotonic() + timeout
    while text and text not in Path(proc.logpath).read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"{proc.cmd_name}'s log never said {text!r}")
        time.sleep(0.05)


def start_profile_server(ctx, app, name="unreplicated", port=None, host=HOST):
    """Starts apps/APP.toml's server alone (no shim) in a fresh directory under ctx.work,
    on port (default: a free loopback port), cwd that directory, and waits until it accepts
    connections at host:port (the profile's ready_timeout_ms). Returns (proc, addr, dir);
    stop it with ctx.procs.stop(proc) and remove dir."""
    profile = profiles.load(app)
    timeout = profile.get("ready_timeout_ms", 10000) / 1000
    for attempt in range(3):
        d = Path(tempfile.mkdtemp(prefix=f"{app}-{name}-", dir=ctx.work))
        srv_port = port or apps.free_port()
        prepare_profile_dir(profile, d, srv_port, host)
        argv = [profiles.render(x, srv_port, d, host) for x in shlex.split(profile["command"])]
        p = ctx.procs.start(argv, d / "server.log", cwd=d)
        addr = f"{host}:{srv_port}"
        try:
            apps.wait_ready(app, addr, p, timeout=timeout)
            wait_log(p, profile.get("ready_log"), timeout)
            return p, addr, d
        except RuntimeError:
            ctx.procs.stop(p)
            shutil.rmtree(d, ignore_errors=True)
            if attempt == 2:
                raise
    raise AssertionError("not reached")


@contextlib.contextmanager
def profile_server(ctx, app, name="unreplicated", port=None, host=HOST):
    """start_profile_server as a context: yields (proc, addr, dir), then stops and removes."""
    p, addr, d = start_profile_server(ctx, app, name, port, host)
    try:
        yield p, addr, d
    finally:
        ctx.procs.stop(p, grace=10)
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------
# Modes: each a context manager yielding (client address, {class: [pid]}, cluster dir)
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def mode_unreplicated(ctx, app):
    with profile_server(ctx, app) as (p, addr, _):
        yield addr, {"servers": [p.pid]}, None


def cluster_pids(st):
    """{process class: [pid]} of a cluster's status, for the CPU accounting."""
    reps = st["replicas"]
    return {"daemons": [r["pid"] for r in reps], "servers": [r["server_pid"] for r in reps]}


@contextlib.contextmanager
def naming_leader_change(d, st):
    """Re-raises a RuntimeError of its body saying whether the cluster in d changed
    leaders since status st (its clients lose their connections then)."""
    try:
        yield
    except RuntimeError as e:
        moved = apps.leader_change(d, st)
        if not moved:
            raise
        raise RuntimeError(f"{e} [{moved}]") from e


def mode_replicated(durability):
    @contextlib.contextmanager
    def mode(ctx, app):
        with apps.lockstep_cluster(ctx, app, durability) as (d, st):
            addr = st["client_addr"]
            apps.wait_ready(app, addr)
            with naming_leader_change(d, st):
                yield addr, cluster_pids(st), d

    return mode


# name -> (JSON mode, durability, context manager)
MODES = {
    "unreplicated": ("unreplicated", "none", mode_unreplicated),
    "replicated-disk": ("replicated", "disk", mode_replicated("disk")),
    "replicated-memory": ("replicated", "memory", mode_replicated("memory")),
}


# ---------------------------------------------------------------------------
# State check of a cluster
# ---------------------------------------------------------------------------


def slapcat(conf):
    r = subprocess.run([SLAPCAT, "-f", str(conf)], capture_output=True, timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"slapcat -f {conf}: {r.stderr.decode(errors='replace')[-300:]}")
    return r.stdout


def compare_replicas(app, d, ids, leader):
    """(same, {id: summary}, detail) of the replicas' server state (see the docstring)."""
    if app == "slapd":
        dumps = {i: slapcat(d / f"replica-{i}" / "server" / "slapd.conf") for i in ids}
        summary = {
            i: {
                "entries": x.count(b"\ndn: ") + x.startswith(b"dn: "),
                "bytes": len(x),
                "sha256": hashlib.sha256(x).hexdigest()[:16],
            }
            for i, x in dumps.items()
        }
        same = len(set(dumps.values())) == 1
        detail = ""
        if not same:
            lead = set(dumps[leader].splitlines())
            for i, x in dumps.items():
                diff = [ln.decode(errors="replace") for ln in x.splitlines() if ln not in lead]
                detail += f"replica {i}: lines not in the leader's: {diff[:8]}; "
        return same, summary, detail
    if app == "tarantool":
        return compare_tarantool(d, ids, leader)
    counts = {}
    for i in ids:
        f = d / f"replica-{i}" / "server" / "clamd.log"
        text = f.read_text(errors="replace") if f.exists() else ""
        counts[i] = {"found_lines": sum("FOUND" in ln for ln in text.splitlines())}
    return len({c["found_lines"] for c in counts.values()}) == 1, counts, ""


def compare_tarantool(d, ids, leader):
    """Every replica's spaces `docs` and `kv`, read through its own server (an inspection
    connection: reads only), against the leader's."""
    import tarantool  # requirements.txt

    st = apps.cluster_status(d)
    addrs = {r["id"]: apps.split_addr(r["server_addr"]) for r in st["replicas"]}
    seen = {}
    for i in ids:
        with inspector.Relay(addrs[i]) as local:  # a backup's server: inspections only
            c = tarantool.Connection(*local, connection_timeout=10, reconnect_max_attempts=0)
            try:
                rows = repr([list(map(list, c.select(sp))) for sp in ("docs", "kv")]).encode()
            finally:
                c.close()
        seen[i] = rows
    summary = {
        i: {"bytes": len(x), "sha256": hashlib.sha256(x).hexdigest()[:16]} for i, x in seen.items()
    }
    same = len(set(seen.values())) == 1
    detail = "" if same else f"replicas {[i for i in ids if seen[i] != seen[leader]]} differ"
    return same, summary, detail


def state_check(ctx, app, d, extra):
    """The end-of-run check of the cluster in d (see the docstring); a dict with "ok"."""
    out = {**extra, "ok": False}
    ok, applied, commit, waited = apps.wait_applied(d)
    out.update(applied_index=applied, commit_index=commit, applied_wait_s=round(waited, 2))
    if not ok:
        out["reason"] = f"replicas' applied_index {applied} not the commit_index {commit} in 60 s"
    else:
        st = apps.cluster_status(d)
        ids = [r["id"] for r in st["replicas"]]
        end = time.monotonic() + 20
        while True:
            same, summary, detail = compare_replicas(app, d, ids, st["leader"])
            if same or time.monotonic() > end:
                break
            time.sleep(0.5)
        out.update(same_state=same, replicas=summary)
        if not same:
            out["reason"] = "replicas' state differs: " + (detail or json.dumps(summary))
    apps.divergence_check(d, out)
    out["ok"] = "reason" not in out
    if not out["ok"]:
        apps.keep_logs(ctx, d)
    return out


def check_text(c):
    what = {
        "slapd": "slapcat dumps",
        "clamd": "FOUND lines in clamd.log",
        "tarantool": "spaces docs and kv",
    }.get(c.get("app"), "state")
    reps = c.get("replicas") or {}
    if c.get("app") == "slapd":
        state = ", ".join(
            f"r{i}: {v['entries']} entries {v['sha256']}" for i, v in sorted(reps.items())
        )
    elif c.get("app") == "tarantool":
        state = ", ".join(
            f"r{i}: {v['bytes']} bytes {v['sha256']}" for i, v in sorted(reps.items())
        )
    else:
        state = ", ".join(f"r{i}: {v['found_lines']}" for i, v in sorted(reps.items()))
        if "loadgen_found" in c:
            state += f" (loadgen counted {c['loadgen_found']} FOUND replies)"
    verdict = "PASS" if c["ok"] else f"FAIL: {' '.join(c.get('reason', '').split())}"
    after = ", after its load failed" if c.get("after_failed_load") else ""
    applied = ", ".join(f"r{i}: {v}" for i, v in sorted((c.get("applied_index") or {}).items()))
    return (
        f"- {c['mode']} ({c['session']}{after}): {verdict}. applied_index {applied} "
        f"(commit_index {c.get('commit_index')}) after {c.get('applied_wait_s')} s; {what} "
        f"{'identical' if c.get('same_state') else 'NOT identical'} ({state}); divergence "
        f"reports: {len(c['divergences']) if c.get('divergences') is not None else '?'}"
    )


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def plan(app, a):
    """The servers' (or clusters') lifetimes of one mode, in order: each a list of
    (repeat, conns, op) measured in it."""
    ops = SPECS[app]["ops"]
    if SPECS[app]["server_per_measurement"]:
        return [[(rep, c, op) for op in ops] for rep in range(a.repeats) for c in a.conns]
    return [[(rep, c, op) for rep in range(a.repeats) for c in a.conns for op in ops]]


def measure_mode(ctx, app, name, a, res):
    mode, durability, _ = MODES[name]
    samples = {}
    try:
        measure_sessions(ctx, app, name, a, res, samples)
    finally:  # what was measured before a failure is kept (the failure is listed too)
        for (conns, op), rs in samples.items():
            res["runs"].append(apps.summarise(mode, durability, conns, op, op, rs))


def measure_sessions(ctx, app, name, a, res, samples):
    cm, spec = MODES[name][2], SPECS[app]
    for session in plan(app, a):
        rep, conns = session[0][0], session[0][1]
        label = f"repeat {rep + 1}, {conns} conns" if spec["server_per_measurement"] else "all"
        with cm(ctx, app) as (addr, pids, d):
            log(f"  {name} [{label}] at {addr}")
            found = [0]
            try:
                measure_session(app, name, a, res, samples, session, label, addr, pids, found, d)
            except Exception:  # a cluster is checked also when its load failed
                if d is not None:
                    check_cluster(ctx, res, app, name, label, d, found[0], after_failure=True)
                raise
            if d is not None:
                check_cluster(ctx, res, app, name, label, d, found[0])


def check_cluster(ctx, res, app, name, label, d, found, after_failure=False):
    extra = {"app": app, "mode": name, "session": label}
    if app == "clamd":
        extra["loadgen_found"] = found
    if after_failure:
        extra["after_failed_load"] = True
    try:
        c = state_check(ctx, app, d, extra)
    except Exception as e:  # noqa: BLE001 (a load's own error, if any, goes on)
        c = {**extra, "ok": False, "reason": f"the check itself failed: {e}"}
    res["checks"].append(c)
    log("  state check: " + check_text(c))


def add_from(op, attempt):
    """loadgen's arguments for the attempt-th run (from 0) of op in a cluster's life: an
    add after the first numbers its entries from where no earlier run's reach."""
    return ["--add-from", str(attempt * ADD_RANGE)] if op == "add" and attempt else []


# Entry numbers one add run may use (per connection; a run adds some thousands).
ADD_RANGE = 1_000_000_000


def measure_session(app, name, a, res, samples, session, label, addr, pids, found, d):
    """The measurements of one server's (or cluster's, in d) life; found[0] counts FOUND
    replies."""
    spec = SPECS[app]
    if spec["prefill"]:
        r = apps.loadgen(
            app, addr, PREFILL_CONNS, "prefill", 120, spec["value_bytes"], a.keys,
            proto=spec["proto"],
        )  # fmt: skip
        r.update(mode=name, session=label)
        res["prefills"].append(r)
        if r["errors"] or r["misses"] or r["ops"] != a.keys * spec.get("prefill_ops_per_key", 1):
            raise RuntimeError(f"prefill of {a.keys} entries: {r}")
        log(f"  prefill: {a.keys} entries at {r['ops_per_s']:.0f}/s")
    for rep, conns, op in session:
        # Again on a new leader if the leader changed; adds then number their entries
        # past the earlier tries' (whose entries would be there already).
        tries = itertools.count()
        r, addr = apps.on_leader(
            lambda at, c=conns, o=op, t=tries: apps.loadgen(
                app, at, c, o, a.seconds, spec["value_bytes"], a.keys, pids,
                proto=spec["proto"], extra=[*spec["extra"], *add_from(o, next(t))],
            ),
            addr, d, app, f"{name} {op} conns={conns}",
        )  # fmt: skip
        log(
            f"  {name} {op} conns={conns} repeat {rep + 1}/{a.repeats}: "
            f"{r['ops_per_s']:.0f} ops/s, p50 {r['p50_us']:.0f} µs, "
            f"p99 {r['p99_us']:.0f} µs, errors {r['errors']}, misses {r['misses']}"
            + (f", found {r['found']}" if app == "clamd" else "")
        )
        found[0] += r.get("found", 0)
        if r["errors"] or r["misses"]:
            raise RuntimeError(
                f"{name} {op} conns={conns}: {r['errors']} client errors, "
                f"{r['misses']} entries not found ({r['ops']} ops done)"
            )
        samples.setdefault((conns, op), []).append(r)


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def ratio(x, y):
    return x / y if x is not None and y else None


def fmt(x, spec="{:.2f}"):
    return spec.format(x) if x is not None else "–"


def table(res):
    runs, ops = res["runs"], SPECS[res["app"]]["ops"]
    rows = [
        "| mode | op | conns | ops/s (median) | min–max ops/s | p50 µs | p99 µs "
        "| ops/s ÷ unrepl. | p50 ÷ unrepl. "
        + "".join(f"| {c} CPU µs/op " for c in apps.CLASSES)
        + "| all CPU µs/op |",
        "|" + "---|" * (9 + len(apps.CLASSES) + 1),
    ]
    key = {lab: i for i, lab in enumerate(apps.ORDER)}
    for r in sorted(runs, key=lambda r: (ops.index(r["op"]), r["conns"], key[apps.label(r)])):
        base = apps.find(runs, "unreplicated", "none", r["conns"], r["op"])
        per = r.get("per_op", {})
        cpu = "".join(
            f"| {fmt(per[c]['cpu_us'], '{:.0f}') if c in per else '–'} " for c in apps.CLASSES
        )
        total = apps.all_cpu_us(per) if per else None
        rows.append(
            f"| {apps.label(r)} | {r['op']} | {r['conns']} | {r['ops_per_s']:.0f} "
            f"| {r['min_ops_per_s']:.0f}–{r['max_ops_per_s']:.0f} | {r['p50_us']:.0f} "
            f"| {r['p99_us']:.0f} | {fmt(ratio(r['ops_per_s'], base and base['ops_per_s']))} "
            f"| {fmt(ratio(r['p50_us'], base and base['p50_us']))} {cpu}"
            f"| {fmt(total, '{:.0f}')} |"
        )
    text = "\n".join(rows) + "\n"
    if res.get("prefills"):
        rates = [f"{p['ops_per_s']:.0f}" for p in res["prefills"]]
        text += (
            f"\nPrefill ({res['keys']} entries, {PREFILL_CONNS} connections, not timed "
            f"above), entries/s per server or cluster in order: {', '.join(rates)}\n"
        )
    return text + checks_and_failures(res)


def checks_and_failures(res, describe=None):
    """The end of a bench's table: its state checks (each a line by describe, check_text
    by default), then its failed phases."""
    describe = describe or check_text
    text = "\n## State checks (replicated modes, end of every cluster's life)\n\n"
    text += "\n".join(describe(c) for c in res["checks"]) or "none ran"
    text += "\n"
    for f in res["failed"]:
        text += f"\nFAILED: {f['phase']}: {f['reason']}"
    return text + "\n"


def write_report(res, js, head, text, ops):
    """Writes the JSON at js, and beside it the .md (head, text and the plot of ops) and
    the .png; prints the text."""
    md, png = js.with_suffix(".md"), js.with_suffix(".png")
    js.write_text(json.dumps(res, indent=1) + "\n")
    drew = apps.plot(res, png, ops=ops)
    md.write_text(head + text + (f"\n![plot]({png.name})\n" if drew else ""))
    print(text)
    print(f"wrote {js}, {md}" + (f" and {png}" if drew else ""))


def report(res, js):
    m = res["machine"]
    head = (
        f"# {res['app']} under lockstep — {m.get('date', '')}\n\n"
        f"`{res.get('command', '')}` on {m.get('cores')} cores ({m.get('cpu')}), "
        f"{m.get(res['app'])}, git {m.get('git')}; {res.get('seconds')} s per measurement, "
        f"median of {res.get('repeats')} repeats; loadgen {res.get('loadgen')}; load average "
        f"{m.get('loadavg_start')} at start, {m.get('loadavg_end')} at the end. Ratios are "
        f"against unreplicated in this run. CPU per op: daemons and servers from /proc (every "
        f"thread), loadgen from its rusage; medians over repeats.\n\n"
    )
    write_report(res, js, head, table(res), SPECS[res["app"]]["ops"])


def command_output(*cmd):
    """What cmd prints (stdout and stderr, stripped), or "" if it cannot run: version lines."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def versions():
    out = command_output
    slapd = out("slapd", "-VV").splitlines()
    slapd = slapd[0].split("$OpenLDAP:")[-1].split("(")[0].strip() if slapd else ""
    return {
        "slapd": slapd,
        "clamd": out("clamd", "--version"),
        "tarantool": out("tarantool", "--version").split("\n")[0],
    }


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("app", choices=list(SPECS))
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement (default 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--conns", type=apps.csv(int), default=[1, 16])
    ap.add_argument("--keys", type=int, default=2000, help="slapd: entries modify/search use")
    ap.add_argument("--modes", type=apps.csv(str), default=list(MODES))
    ap.add_argument("--quick", action="store_true", help="1 and 16 conns, 1 repeat of 2 s")
    apps.add_output_args(ap, "APP")
    a = ap.parse_args()
    js = apps.output_json(a, a.app)
    if a.from_json:
        report(json.loads(Path(a.from_json).read_text()), js)
        return 0
    if a.quick:
        a.conns, a.repeats, a.seconds = [1, 16], 1, 2.0
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}: choose from {list(MODES)}")
    if not apps.LOADGEN.exists():
        sys.exit(f"{apps.LOADGEN} is not built")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally blocks run

    spec = SPECS[a.app]
    work = apps.work_dir(f"lockstep-{a.app}bench-", a.tmp)
    ctx = apps.Ctx(work, keep_logs=js.parent / f"{a.app}-failed-logs")
    res = {
        "app": a.app,
        "command": f"scripts/bench {' '.join(sys.argv[1:])}",
        "seconds": a.seconds,
        "repeats": a.repeats,
        "conns": a.conns,
        "keys": a.keys,
        "value_bytes": spec["value_bytes"],
        "loadgen": f"--proto {spec['proto']} --value-bytes {spec['value_bytes']} "
        + " ".join([*spec["extra"], *(["--keys", str(a.keys)] if spec["prefill"] else [])]),
        "runs": [],
        "prefills": [],
        "checks": [],
        "skipped": [],
        "failed": [],
        "machine": {**apps.machine(work), **versions()},
    }
    log(f"{a.app}: modes {', '.join(a.modes)}; conns {a.conns}, {a.repeats} x {a.seconds:g} s")
    steps = [(m, lambda m=m: measure_mode(ctx, a.app, m, a, res)) for m in a.modes]
    return run_and_report(ctx, work, res, js, steps, MODES, report)


def run_and_report(ctx, work, res, js, steps, modes, report_fn):
    """Runs the (mode, measure) steps (apps.run_phases), names each failed mode's mode and
    durability from modes, writes the report with report_fn(res, js); returns the exit code:
    1 if a mode failed or a state check did not pass."""
    apps.run_phases(ctx, work, res, steps)
    for f in res["failed"]:
        if f["phase"] in modes:
            f["mode"], f["durability"] = modes[f["phase"]][:2]
    report_fn(res, js)
    return 1 if res["failed"] or not all(c["ok"] for c in res["checks"]) else 0


if __name__ == "__main__":
    sys.exit(main())
