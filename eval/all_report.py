#!/usr/bin/env python3
"""One report over every app's benchmark: lockstep against the same server alone.

    .venv/bin/python eval/all_report.py [--dir eval/out] [--status eval/out/all-status.jsonl]

Reads only JSON, so it can be re-run: eval/out/APP.json of redis and memcached (eval/apps.py),
mariadb (eval/mariadb.py), slapd, clamd and tarantool (eval/appbench.py), gerbera (eval/gerbera.py:
ab's requests/s and p50 of GET /cm.xml), and, when `scripts/bench all`
wrote it, all-status.jsonl (one line per app: its exit status, when it started and ended, its
log). For each app, op and connection count (1 and 16; MariaDB: sysbench threads), the
replicated modes (lockstep, durability disk and memory) against unreplicated from the same
run: throughput ratio (ops/s; MariaDB: transactions/s) and p50 ratio (MariaDB: sysbench's
latency p50). Then the overheads averaged over the apps (each app's ops averaged first, so
every app weighs the same), beside APUS's published ones. An app whose bench failed (exit
status not 0, no JSON, a JSON older than the run, a failed mode or state check) is listed as
failed with the reason; what it did measure is still shown. Writes DIR/all.md and DIR/all.png
and prints the markdown.
"""

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ["redis", "memcached", "mariadb", "slapd", "clamd", "tarantool", "gerbera"]
OPS = {  # the ops in the order shown; the others an app's JSON has follow
    "redis": ["set", "get"],
    "memcached": ["set", "get"],
    "mariadb": ["oltp_read_write", "oltp_write_only"],
    "slapd": ["modify", "search", "add"],
    "clamd": ["scan"],
    "tarantool": ["doc-replace", "doc-get", "kv-set", "kv-get"],
    "gerbera": ["GET /cm.xml"],
}
CONNS = [1, 16]
DURABILITIES = ["disk", "memory"]
# APUS (Wang et al., "APUS: Fast and Scalable Paxos on RDMA", SoCC 2017): overhead over the
# unreplicated servers, averaged over its applications, on dedicated machines with RDMA.
APUS = {"throughput": 4.2, "latency": 4.3}


def rows_of(app, res):
    """[(op, conns, durability, ops_per_s, p50_us)], durability "none" for unreplicated."""
    out = []
    for r in res.get("runs", []):
        if app == "mariadb":
            p50 = r["p50_ms"] * 1000 if r.get("p50_ms") is not None else None
            out.append((r["test"], r["threads"], r["durability"], r["tps"], p50))
        elif r["mode"] in ("unreplicated", "replicated"):
            out.append((r["op"], r["conns"], r["durability"], r["ops_per_s"], r["p50_us"]))
    return out


def failures(app, res):
    """Why the JSON says part of the bench failed: failed modes, failed state checks."""
    why = []
    for f in res.get("failed", []):
        where = f.get("phase") or f"{f.get('mode')}/{f.get('durability')}"
        why.append(f"{where}: {f.get('reason', '')}")
    for c in res.get("checks", []):
        if c.get("ok") is False or c.get("same") is False:
            why.append(
                f"state check {c.get('mode')} {c.get('session', c.get('test', ''))}: "
                f"{c.get('reason', 'replicas differ')}"
            )
    return why


def short(text, n=400):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def log_tail(path, n=3):
    try:
        lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return " / ".join(lines[-n:])


def load(out_dir, status):
    """{app: {"res": JSON or None, "status": "ok"|"failed", "why": [...], ...}}."""
    apps = {}
    for app in APPS:
        js = out_dir / f"{app}.json"
        st = status.get(app)
        a = {"res": None, "why": [], "json": str(js)}
        if js.exists():
            a["res"] = json.loads(js.read_text())
            a["mtime"] = js.stat().st_mtime
        if st is not None:
            a["rc"], a["command"] = st["rc"], st.get("command", "")
            if a["res"] is not None and a["mtime"] < st["started"]:
                when = datetime.datetime.fromtimestamp(a["mtime"]).strftime("%Y-%m-%d %H:%M")
                a["why"].append(
                    f"did not write {js.name} in this run (exit status {st['rc']}; the file "
                    f"there is from {when}, not shown); last lines of its log: "
                    f"{log_tail(st.get('log', ''))}"
                )
                a["res"] = None
            elif a["res"] is None:
                a["why"].append(
                    f"no {js.name} (exit status {st['rc']}); last lines of its log: "
                    f"{log_tail(st.get('log', ''))}"
                )
            elif st["rc"] != 0 and not failures(app, a["res"]):
                a["why"].append(f"exit status {st['rc']}: {log_tail(st.get('log', ''))}")
        elif a["res"] is None:
            a["why"].append(f"no {js.name}: not run")
        if a["res"] is not None:
            a["why"] += failures(app, a["res"])
            a["rows"] = rows_of(app, a["res"])
        a["failed"] = bool(a["why"])
        apps[app] = a
    return apps


def ratios(a):
    """[(op, conns, base (ops/s, p50), {durability: (tput ratio, p50 ratio)})]."""
    rows = a.get("rows") or []
    idx = {(op, c, d): (t, p) for op, c, d, t, p in rows}
    ops = OPS[a["res"]["app"]] if a.get("res") else []
    ops = [o for o in ops if any(r[0] == o for r in rows)]
    ops += sorted({r[0] for r in rows} - set(ops))
    out = []
    for op in ops:
        for c in CONNS:
            base = idx.get((op, c, "none"))
            got = {}
            for d in DURABILITIES:
                x = idx.get((op, c, d))
                if x and base:
                    t = x[0] / base[0] if base[0] else None
                    p = x[1] / base[1] if x[1] is not None and base[1] else None
                    got[d] = (t, p)
            if base or got:
                out.append((op, c, base, got))
    return out


def averages(apps):
    """{(durability, conns): (throughput overhead %, p50 overhead %, apps counted)}: each
    app's ratios averaged over its ops first, then over the apps."""
    out = {}
    for d in DURABILITIES:
        for c in CONNS:
            per_app_t, per_app_p = [], []
            for a in apps.values():
                rs = [got[d] for op, cc, _, got in ratios(a) if cc == c and d in got]
                ts = [t for t, _ in rs if t is not None]
                ps = [p for _, p in rs if p is not None]
                if ts:
                    per_app_t.append(statistics.mean(ts))
                if ps:
                    per_app_p.append(statistics.mean(ps))
            if per_app_t or per_app_p:
                out[(d, c)] = (
                    (1 - statistics.mean(per_app_t)) * 100 if per_app_t else None,
                    (statistics.mean(per_app_p) - 1) * 100 if per_app_p else None,
                    len(per_app_t),
                )
    return out


def fmt(x, spec="{:.2f}"):
    return spec.format(x) if x is not None else "–"


def machine_sentence(apps):
    m = next((a["res"]["machine"] for a in apps.values() if a.get("res")), {})
    cores = m.get("cores", "?")
    return (
        f"Here one {cores}-core VM ({m.get('cpu', '?')}, {m.get('mem_gib', '?')} GiB) with one "
        f"disk runs all three replicas, their servers and the load generator: lockstep's "
        f"daemons, three copies of the server and the clients share {cores} cores, and the "
        f"three replicas' durable writes (disk mode) go to the same disk. APUS ran each "
        f"replica on its own machine and sent the log over RDMA."
    )


def markdown(apps):
    out = ["# lockstep against the unreplicated servers, every app", ""]
    out.append(machine_sentence(apps))
    out.append("")
    out.append(
        "Ratios are lockstep ÷ unreplicated, measured in the same run of each app's bench "
        "(throughput: ops/s, MariaDB transactions/s, higher is better; p50: median latency, "
        "lower is better). disk: every replica writes the log to disk before it counts; "
        "memory: the log in the RAM of a majority (not durable)."
    )
    out.append("")
    out.append("## Per app")
    out.append("")
    out.append(
        "| app | op | conns | unrepl. ops/s | unrepl. p50 µs | disk: ops/s ratio "
        "| disk: p50 ratio | memory: ops/s ratio | memory: p50 ratio |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    for app, a in apps.items():
        rs = ratios(a)
        name = f"{app} (FAILED, see below)" if a["failed"] else app
        if not rs:
            out.append(f"| {name} | – | – | – | – | – | – | – | – |")
        for op, c, base, got in rs:
            cells = []
            for d in DURABILITIES:
                t, p = got.get(d, (None, None))
                cells += [fmt(t), fmt(p)]
            b_t, b_p = base if base else (None, None)
            out.append(
                f"| {name} | {op} | {c} | {fmt(b_t, '{:.0f}')} | {fmt(b_p, '{:.0f}')} | "
                + " | ".join(cells)
                + " |"
            )
    out.append("")
    out.append("## Average overhead, beside APUS")
    out.append("")
    out.append(
        "Throughput overhead = 1 − ops/s ratio; latency overhead = p50 ratio − 1; each app's "
        "ops averaged first, then the apps (failed apps count with what they measured)."
    )
    out.append("")
    out.append(
        "| system | durability | conns | apps | throughput overhead | latency (p50) overhead |"
    )
    out.append("|---|---|---|---|---|---|")
    for (d, c), (t, p, n) in averages(apps).items():
        out.append(
            f"| lockstep, this VM | {d} | {c} | {n} | {fmt(t, '{:.1f}%')} | {fmt(p, '{:.1f}%')} |"
        )
    out.append(
        f"| APUS (SoCC 2017), dedicated machines, RDMA | as published | – | its apps | "
        f"{APUS['throughput']}% | {APUS['latency']}% |"
    )
    out.append("")
    out.append("## Status of each app's bench")
    out.append("")
    for app, a in apps.items():
        res = a.get("res") or {}
        m = res.get("machine") or {}
        when = m.get("date", "")
        if m.get("loadavg_start"):
            when += f", load average {m['loadavg_start']} at start, {m.get('loadavg_end')} at end"
        cmd = res.get("command") or a.get("command", "")
        about = ", ".join(x for x in (f"`{cmd}`" if cmd else "", when) if x)
        about = f" ({about})" if about else ""
        if a["failed"]:
            out.append(f"- **{app}: FAILED**{about}:")
            out += [f"  - {short(w)}" for w in a["why"]]
        else:
            out.append(f"- {app}: ok{about}")
    out.append("")
    out.append("![plot](all.png)")
    return "\n".join(out) + "\n"


def plot(apps, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, series = [], {(d, c): ([], []) for d in DURABILITIES for c in CONNS}
    for app, a in apps.items():
        rs = ratios(a)
        for op, c0, _, _ in rs:
            if c0 != CONNS[0]:
                continue
            labels.append(f"{app}\n{op}" + ("\n(FAILED)" if a["failed"] else ""))
            for d in DURABILITIES:
                for c in CONNS:
                    got = next((g for o, cc, _, g in rs if o == op and cc == c), {})
                    t, p = got.get(d, (None, None))
                    series[(d, c)][0].append(t if t is not None else float("nan"))
                    series[(d, c)][1].append(p if p is not None else float("nan"))
        if not rs:
            labels.append(f"{app}\n(FAILED)")
            for v in series.values():
                v[0].append(float("nan"))
                v[1].append(float("nan"))
    if not labels:
        return False
    fig, (ax_t, ax_p) = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(labels) + 2), 8.5))
    w = 0.8 / len(series)
    xs = range(len(labels))
    for i, ((d, c), (t, p)) in enumerate(series.items()):
        pos = [x - 0.4 + w * (i + 0.5) for x in xs]
        color = f"C{1 + DURABILITIES.index(d)}"
        alpha = 1.0 if c == CONNS[0] else 0.55
        lab = f"lockstep {d}, {c} conn"
        ax_t.bar(pos, t, w, color=color, alpha=alpha, label=lab)
        ax_p.bar(pos, p, w, color=color, alpha=alpha, label=lab)
    ax_t.axhline(1.0, color="k", lw=0.8)
    ax_t.axhline(1 - APUS["throughput"] / 100, color="C3", ls="--", lw=1, label="APUS average")
    ax_p.axhline(1.0, color="k", lw=0.8)
    ax_p.axhline(1 + APUS["latency"] / 100, color="C3", ls="--", lw=1, label="APUS average")
    ax_p.set_yscale("log")
    for ax in (ax_t, ax_p):
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.legend(fontsize=7, ncol=3)
    ax_t.set_ylabel("throughput ÷ unreplicated")
    ax_p.set_ylabel("p50 latency ÷ unreplicated")
    m = next((a["res"]["machine"] for a in apps.values() if a.get("res")), {})
    ax_t.set_title(
        f"lockstep (3 replicas on one {m.get('cores', '?')}-core VM) against each server alone"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dir", default=str(ROOT / "eval" / "out"), help="where APP.json are")
    ap.add_argument("--status", help="scripts/bench all's all-status.jsonl (default: DIR's)")
    a = ap.parse_args()
    out_dir = Path(a.dir)
    status_file = Path(a.status) if a.status else out_dir / "all-status.jsonl"
    status = {}
    if status_file.exists():
        for ln in status_file.read_text().splitlines():
            if ln.strip():
                st = json.loads(ln)
                status[st["app"]] = st
    apps = load(out_dir, status)
    md = markdown(apps)
    (out_dir / "all.md").write_text(md)
    drew = plot(apps, out_dir / "all.png")
    print(md)
    print(f"wrote {out_dir / 'all.md'}" + (f" and {out_dir / 'all.png'}" if drew else ""))
    return 1 if any(a["failed"] for a in apps.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
