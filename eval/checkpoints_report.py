"""The report of eval/checkpoints.py: issue 7's targets, the table of what
was measured against them (markdown), the plot of restart time against
history length, and the JSON. Split from the benchmark itself, which only
measures; this file only reads its results."""

import json
import statistics

from apps import log

TARGET_CHECKPOINT_MS = 300
TARGET_P99_RATIO = 1.5
TARGET_RESTART_S = 2.0
TARGET_RESTART_AT = 1_000_000
TARGET_TRANSFER_S = 3.0
FLAT_FACTOR = 1.5  # "flat": restart at the longest history ≤ this × at the shortest


def restart_text(r):
    """What one restart reached: in sync after X s / applied after Y s, digest never equal."""
    if r["applied_s"] is None:
        return f"applied_index not at the commit index after {r['cap_s']:g} s (capped)"
    if r["capped"]:
        return (
            f"applied_index there after {r['applied_s']:.2f} s, but DEBUG DIGEST not equal "
            f"{r['sync_cap_s']:g} s later (capped)"
        )
    return (
        f"in sync after {r['in_sync_s']:.2f} s (applied_index there after {r['applied_s']:.2f} s)"
    )


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def verdict(ok):
    return {True: "PASS", False: "SHORT", None: "n/a"}[ok]


def worst_restart(point, key="in_sync_s"):
    """The slowest restart of a history point by key (in_sync_s or applied_s); None when one
    of them did not get there within its cap."""
    rs = point["restarts"]
    if any(r.get(key) is None for r in rs):
        return None, rs
    return max(r[key] for r in rs), rs


def secs(t, rs, key):
    if t is not None:
        return f"{t:.2f} s"
    cap = rs[-1]["cap_s"] if key == "applied_s" or rs[-1]["applied_s"] is None else None
    return f"> {cap:g} s" if cap else f"never (> {rs[-1].get('sync_cap_s', 0):g} s after applied)"


def restart_summary(p):
    t, rs = worst_restart(p)
    ta, _ = worst_restart(p, "applied_s")
    return t, ta, rs, f"in sync {secs(t, rs, 'in_sync_s')}, applied {secs(ta, rs, 'applied_s')}"


def rows(res):
    """[(target, measured, baseline, ratio, result)] from this run's numbers."""
    out = []
    a, plain = res.get("A", {}), res.get("plain_redis", {})
    keys = f"{res['keys'] / 1e6:g}M" if res["keys"] >= 1e6 else f"{res['keys'] / 1e3:g}K"
    base = "not measured"
    if plain:
        base = (
            f"plain redis SAVE {plain['save_s_median'] * 1000:.0f} ms "
            f"({plain['rdb_bytes'] / 1e6:.0f} MB RDB); BGSAVE fork "
            f"{plain['bgsave_fork_us_median'] / 1000:.1f} ms"
        )
    for kind, label in (
        ("idle", "idle"),
        ("loaded", f"under load ({a.get('loaded_conns')} conns)"),
    ):
        cps = a.get(kind) or []
        dump = med(c["dump_us"] for c in cps)
        if dump is None:
            out.append(
                (f"checkpoint of a backup, {keys} keys, {label}", "not measured", base, "–", "n/a")
            )
            continue
        dump_ms = dump / 1000
        meas = (
            f"dump {dump_ms:.0f} ms median ({min(c['dump_us'] for c in cps) / 1000:.0f}–"
            f"{max(c['dump_us'] for c in cps) / 1000:.0f}, n={len(cps)}), "
            f"{med(c['bytes'] for c in cps) / 1e6:.0f} MB"
        )
        if kind == "loaded":
            lo, hi = med(c["pause_lo_s"] for c in cps), med(c["pause_hi_s"] for c in cps)
            meas += f"; applying paused {lo * 1000:.0f}–{hi * 1000:.0f} ms"
        meas += f"; `--wait` {med(c['wall_s'] for c in cps):.2f} s"
        ratio = f"{dump_ms / (plain['save_s_median'] * 1000):.2f}× SAVE" if plain else "–"
        out.append(
            (
                f"checkpoint of a backup, {keys} keys, {label}: dump ≤ {TARGET_CHECKPOINT_MS} ms",
                meas,
                base,
                ratio,
                verdict(dump_ms <= TARGET_CHECKPOINT_MS),
            )
        )
    ws = [w for w in a.get("windows", []) if not w.get("spoiled")]
    with_ = med(w["p99_us"] for w in ws if w["kind"] == "with")
    without = med(w["p99_us"] for w in ws if w["kind"] == "without")
    name = f"leader SET p99, 16 conns, while a backup checkpoints ≤ {TARGET_P99_RATIO} × without"
    if with_ and without:
        cover = med(w["checkpoint_cover"] for w in ws if w["kind"] == "with")
        n = sum(1 for w in ws if w["kind"] == "with")
        out.append(
            (
                name,
                (
                    f"p99 {with_ / 1000:.1f} ms (median of {n} windows of {res['seconds']:g} s, "
                    f"checkpoints covering {cover * 100:.0f}% of each)"
                ),
                f"p99 {without / 1000:.1f} ms without",
                f"{with_ / without:.2f}",
                verdict(with_ / without <= TARGET_P99_RATIO),
            )
        )
    else:
        out.append((name, "not measured", "not measured", "–", "n/a"))

    b, c = res.get("B", {}), res.get("C", {})
    cpts = {p["history"]: p for p in c.get("points", [])}
    cnot = {p["history"]: p["why"] for p in c.get("not_run", [])}
    times = []
    for p in b.get("points", []):
        t, ta, rs, text = restart_summary(p)
        suffix = ", ".join(f"{r['replayed']}" for r in rs)
        meas = (
            f"{text} (worst of {len(rs)}; commit {rs[0]['commit_index']}; entries replayed "
            f"after the checkpoint restored: {suffix})"
        )
        notes = [
            f"replica {r['replica']} was not in sync before the kill"
            for r in rs
            if r.get("in_sync_before_kill") is False
        ] + [
            f"the leader changed during the restart of replica {r['replica']}"
            for r in rs
            if r.get("leader_before") != r.get("leader_after")
        ]
        if notes:
            meas += "; " + "; ".join(notes)
        cp = cpts.get(p["history"])
        cbase, ratio = "--no-checkpoints: " + cnot.get(p["history"], "not run"), "–"
        if cp:
            ct, cta, crs, ctext = restart_summary(cp)
            cbase = f"--no-checkpoints: {ctext} (replayed {crs[0]['replayed']})"
            if ct is not None and t is not None:
                ratio = f"{t / ct:.2f}"
            elif cta is not None and ta is not None:
                ratio = f"applied: {ta / cta:.2f}"
            elif ta is not None and cta is None:
                ratio = f"applied: < {ta / crs[-1]['cap_s']:.2f}"
        times.append((p["history"], t, ta))
        ok = None if ta is None and t is None else (t is not None and t <= TARGET_RESTART_S)
        out.append(
            (
                f"restart of a backup after {p['history']:,} inputs: in sync ≤ {TARGET_RESTART_S:g} s"
                + (" (the target)" if p["history"] >= TARGET_RESTART_AT else ""),
                meas,
                cbase,
                ratio,
                verdict(ok),
            )
        )
    if len(times) >= 2:
        (h0, t0, ta0), (h1, t1, ta1) = times[0], times[-1]
        ok = None if t0 is None or t1 is None else t1 <= FLAT_FACTOR * t0
        meas = f"in sync {t1:.2f} s / {t0:.2f} s" if t0 and t1 else "in sync: not measured"
        if ta0 and ta1:
            meas += f"; applied {ta1:.2f} s / {ta0:.2f} s = {ta1 / ta0:.2f}"
        cb = "–"
        c0, c1 = cpts.get(h0), cpts.get(h1)
        if c0 and c1 and worst_restart(c0, "applied_s")[0] and worst_restart(c1, "applied_s")[0]:
            r = worst_restart(c1, "applied_s")[0] / worst_restart(c0, "applied_s")[0]
            cb = f"--no-checkpoints, applied: {r:.1f}×"
        elif c0 and worst_restart(c0, "applied_s")[0]:
            cb = (
                f"--no-checkpoints, applied: {worst_restart(c0, 'applied_s')[0]:.2f} s at "
                f"{h0:,}; longer ones capped or not run"
            )
        out.append(
            (
                f"restart flat in history length: in sync at {h1:,} ≤ {FLAT_FACTOR} × at {h0:,}",
                meas,
                cb,
                f"{t1 / t0:.2f}" if t0 and t1 else "–",
                verdict(ok),
            )
        )
    if not any(p["history"] >= TARGET_RESTART_AT for p in b.get("points", [])):
        out.append(
            (
                f"restart after {TARGET_RESTART_AT:,} inputs ≤ {TARGET_RESTART_S:g} s",
                "not measured (histories reached: "
                + (", ".join(f"{p['history']:,}" for p in b.get("points", [])) or "none")
                + ")",
                "–",
                "–",
                "n/a",
            )
        )
    if b.get("disk") or c.get("disk"):

        def mb_each(x):
            return ", ".join(f"{v['log_alloc_bytes'] / 1e6:.0f}" for v in x["disk"].values())

        def after(x):
            n = x.get("final", {}).get("commit_index")
            return f"{n:,}" if n is not None else "the last history reached"

        bl = sum(v["log_alloc_bytes"] for v in b.get("disk", {}).values())
        cl = sum(v["log_alloc_bytes"] for v in c.get("disk", {}).values())
        out.append(
            (
                f"log on disk, default policy (report only): after {after(b)} inputs"
                if b.get("disk")
                else "log on disk, default policy (report only)",
                f"{mb_each(b)} MB per replica (allocated; segments are preallocated)"
                if b.get("disk")
                else "not measured (the phase with checkpoints failed first)",
                f"--no-checkpoints after {after(c)}: {mb_each(c)} MB" if cl else "not measured",
                f"{bl / cl:.2f}" if bl and cl else "–",
                "info",
            )
        )
        cps = [x for x in b.get("checkpoints", []) if x.get("ok")]
        if cps:
            by = {}
            for x in cps:
                by.setdefault(x["replica"], []).append(x["bytes"])
            txt = "; ".join(
                f"replica {k}: {len(v)} × {statistics.median(v) / 1e6:.0f} MB"
                for k, v in sorted(by.items())
            )
            out.append(
                (
                    "checkpoints kept at the end, default policy (report only)",
                    txt,
                    f"plain redis RDB {plain['rdb_bytes'] / 1e6:.0f} MB" if plain else "–",
                    f"{statistics.median(x['bytes'] for x in cps) / plain['rdb_bytes']:.2f}× RDB"
                    if plain
                    else "–",
                    "info",
                )
            )
    trs = [t for t in a.get("transfers") or [] if "wiped" in t]
    errs = [t["error"] for t in a.get("transfers") or [] if "error" in t]
    name = f"state transfer of a 100 MB checkpoint to an empty replica ≤ {TARGET_TRANSFER_S:g} s"
    if not trs:
        out.append((name, "not measured" + "".join(f"; {e}" for e in errs), "–", "–", "n/a"))
    else:
        ws = [t["wiped"] for t in trs]
        ls = [t["local"] for t in trs if "local" in t]
        mb = med(t["source_checkpoint"]["bytes"] for t in trs) / 1e6
        tw = (
            None if any(r.get("in_sync_s") is None for r in ws) else max(r["in_sync_s"] for r in ws)
        )
        tl = None
        if ls and all(r.get("in_sync_s") is not None for r in ls):
            tl = max(r["in_sync_s"] for r in ls)
        meas = (
            "; ".join(
                f"{restart_text(r)}, fetched {r.get('fetched')} (leader's log from {t.get('leader_first_index')}, "
                f"{t['source']}'s checkpoint {t['source_checkpoint']['index']})"
                for t, r in zip(trs, ws, strict=True)
            )
            + f" (checkpoint of {mb:.0f} MB; worst of {len(ws)})"
        )
        if errs:
            meas += "; then: " + "; ".join(errs)
        base = "restart from its own checkpoint: " + (
            "; ".join(restart_text(r) for r in ls) if ls else "not measured"
        )
        ratio = f"{tw / tl:.2f}" if tw and tl else "–"
        out.append(
            (
                name.replace("100 MB", f"{mb:.0f} MB (target: 100 MB)"),
                meas,
                base,
                ratio,
                verdict(tw is not None and tw <= TARGET_TRANSFER_S),
            )
        )
    return out


def table(res):
    lines = [
        "| target | measured | baseline (same run) | ratio | result |",
        "|---|---|---|---|---|",
    ]
    for r in rows(res):
        lines.append("| " + " | ".join(str(x).replace("|", "/") for x in r) + " |")
    text = "\n".join(lines) + "\n"
    for f in res.get("failed", []):
        text += f"\nFAILED: {f['phase']}: {f['reason']}"
    for p in res.get("C", {}).get("not_run", []):
        text += f"\n--no-checkpoints at {p['history']:,} inputs not run: {p['why']}"
    return text + "\n"


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.6))
    series = (
        ("B", "with checkpoints (default policy)", "C0"),
        ("C", "--no-checkpoints (replay the whole log)", "C3"),
    )
    for name, label, color in series:
        for key, style, what in (("in_sync_s", "o-", "in sync"), ("applied_s", "s--", "applied")):
            xs, ys, cx, cy = [], [], [], []
            for p in res.get(name, {}).get("points", []):
                t, rs = worst_restart(p, key)
                if t is not None:
                    xs.append(rs[0]["commit_index"])
                    ys.append(t)
                else:
                    r = rs[-1]
                    cx.append(r["commit_index"])
                    late = r["applied_s"] is None or key == "applied_s"
                    cy.append(r["cap_s"] if late else r["applied_s"] + r.get("sync_cap_s", 0))
            if xs:
                ax.plot(xs, ys, style, color=color, label=f"{label}: {what}", alpha=0.9)
            if cx:
                ax.plot(
                    cx,
                    cy,
                    "^",
                    color=color,
                    markersize=10,
                    mfc="none",
                    label=f"{label}: {what} not reached by then",
                )
    ax.axhline(
        TARGET_RESTART_S, color="gray", ls="--", lw=1, label=f"target {TARGET_RESTART_S:g} s"
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator([0.5, 1, 2, 5, 10, 20, 50, 100]))
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("history length (commit index = log entries)")
    ax.set_ylabel("s from `cluster restart` (worst of the restarts)")
    ax.set_title(f"restart of a backup, redis with {res['keys']:,} keys")
    ax.legend(fontsize=8)
    ws = [w for w in res.get("A", {}).get("windows", []) if not w.get("spoiled")]
    for kind, color, off in (("without", "C2", -0.2), ("with", "C1", 0.2)):
        sel = [w for w in ws if w["kind"] == kind]
        ax2.bar(
            [w["repeat"] + off for w in sel],
            [w["p99_us"] / 1000 for w in sel],
            0.4,
            color=color,
            label=f"{kind} a backup checkpointing",
        )
        ax2.scatter(
            [w["repeat"] + off for w in sel],
            [w["p50_us"] / 1000 for w in sel],
            marker="_",
            s=150,
            color="k",
        )
    reps = sorted({w["repeat"] for w in ws})
    ax2.set_xticks(reps, [f"repeat {r + 1}" for r in reps])
    ax2.set_ylabel("leader SET latency, ms (bar: p99, dash: p50)")
    ax2.set_title("16 connections, same run")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(res, js):
    md, png = js.with_suffix(".md"), js.with_suffix(".png")
    js.write_text(json.dumps(res, indent=1, default=str) + "\n")
    m = res["machine"]
    text = table(res)
    head = (
        f"# Checkpoints (issue 7 targets) — {m.get('date', '')}\n\n"
        f"`{res.get('command', '')}` on {m.get('cores')} cores ({m.get('cpu')}), {m.get('redis')}, "
        f"git {m.get('git')}, binaries {m.get('lockstep_binary', 'build/bin')}; redis with {res['keys']:,} keys of {res['value_bytes']} bytes; "
        f"load average {m.get('loadavg_start')} at start, {m.get('loadavg_end')} at the end; "
        f"{res.get('elapsed_s', 0):.0f} s in all. Every baseline was measured in this run.\n\n"
    )
    notes = (
        "\nNotes: a checkpoint's dump time is CRIU's (`dump_us` of `checkpoint list`); "
        '"applying paused" is how long the backup\'s applied_index stood still under load '
        "(from `cluster status` polls: lower–upper bound). Restart time runs from "
        "`cluster restart` (the daemon SIGKILLed before, the load stopped) until the backup's "
        "applied_index reaches the leader's commit index and its DEBUG DIGEST equals the "
        "leader's, with a marker key written last so that the digest covers the whole log "
        "(counted to when the matching digest was asked for, not to its answer). "
        f"\"Flat\" means the longest history's restart ≤ {FLAT_FACTOR} × the shortest's.\n"
    )
    png_ok = True
    try:
        plot(res, png)
    except Exception as e:  # noqa: BLE001 (a plot must not lose the numbers)
        png_ok = False
        log(f"plot failed: {e}")
    md.write_text(head + text + notes + (f"\n![plot]({png.name})\n" if png_ok else ""))
    print(text)
    print(f"wrote {js}, {md}" + (f" and {png}" if png_ok else ""))


# ---------------------------------------------------------------------------
