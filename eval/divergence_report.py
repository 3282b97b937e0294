"""The report of eval/divergence.py: issue 8's targets, the table of what was
measured against them (markdown), the plot (hashing on/off per repeat;
detection and repair per trial), one line per trial for the progress log,
and the JSON. Split from the benchmark itself, which only measures; this
file only reads its results."""

import json
import random
import statistics

from apps import log

TARGET_TPUT_RATIO = 0.95  # hashing on / off, SET at 16 connections
TARGET_P50_ADD_US = 5.0  # hashing on - off, SET p50 at 1 connection
CHECK_INTERVAL_MS = 20.0  # guard/output/output_guard.h kSampleUs: a backup's periodic points
TARGET_REPAIR_MS = 100.0  # back in sync within this plus the replay of the suffix
TARGET_STATE_P99_RATIO = 1.2  # issue 29: the leader's p99, state checks on / off


def ms(x):
    return "–" if x is None else f"{x:.1f} ms"


def trial_text(t):
    rep, ls = t["report"], t["log_s"]
    s = (
        f"replica {t['replica']}, report {rep['id']} {rep['status']}/{rep['how']}; after the "
        f"reply: DIVERGENCE {ms(ls.get('divergence') and ls['divergence'] * 1000)}, file "
        f"{ms(t.get('file_seen_s', 0) * 1000)}, `divergence list` "
        f"{ms(t.get('list_seen_s') and t['list_seen_s'] * 1000)}; FAILPOINT→DIVERGENCE "
        f"{ms(t.get('flip_to_detect_ms'))}; detected {t['detect_bytes']} bytes past the first "
        f"difference; repair total {rep['total_ms']:.0f} ms, restore {rep['restore_ms']:.0f} ms"
    )
    if "right_value_s" in t:
        s += (
            f"; right value again {ms(t['right_value_s'] * 1000)} after the reply, "
            f"{ms(t.get('detect_to_sync_ms'))} after DIVERGENCE = {ms(t.get('overhead_ms'))} to "
            f"the restored checkpoint + {ms(t.get('replay_ms'))} replay of "
            f"{t['suffix_replayed']} entries; DEBUG DIGEST equal to the leader's: "
            f"{t.get('digest_equal')}"
        )
    return s


# ---------------------------------------------------------------------------
# Baseline: what redis itself takes to reload the same data
# ---------------------------------------------------------------------------


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def verdict(ok):
    return {True: "PASS", False: "SHORT", None: "n/a"}[ok]


def median_interval(xs, level=0.90, resamples=4000):
    """A bootstrap interval of the median of xs (the per-repeat on/off pairs): on this VM
    one pair differs from the next by 5-10%, as much as the cost measured, so a single
    median says little without it. Seeded: the same samples give the same interval."""
    xs = [x for x in xs if x is not None]
    if len(xs) < 3:
        return None
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    tail = (1 - level) / 2
    return meds[int(tail * resamples)], meds[min(resamples - 1, int((1 - tail) * resamples))]


def verdict_within(interval, target, higher_is_better):
    """PASS when the whole interval is on the target's good side, SHORT when all of it is
    on the other, NOISE when the target lies inside it (this run cannot tell)."""
    if interval is None:
        return "n/a"
    lo, hi = interval
    good, bad = (lo >= target, hi < target) if higher_is_better else (hi <= target, lo > target)
    return "PASS" if good else "SHORT" if bad else "NOISE"


def rows(res):
    """(target, measured, baseline, ratio, verdict) of each target, from this run only."""
    out = []
    cost = res.get("cost", {}).get("summary")
    if cost:
        r = cost["tput16_ratio"]
        ratios = cost["tput16_ratio_per_repeat"]
        per = ", ".join(f"{x:.2f}" for x in ratios if x is not None)
        ci = median_interval(ratios)
        within = (
            "" if ci is None else f"; median of the pairs, 90% interval {ci[0]:.3f}–{ci[1]:.3f}"
        )
        out.append(
            (
                f"hashing on: SET throughput, 16 conns ≥ {TARGET_TPUT_RATIO} × off",
                f"{cost['tput16_on']:.0f} ops/s (median)",
                f"hashing off: {cost['tput16_off']:.0f} ops/s",
                f"{r:.3f} (per repeat: {per}{within})",
                verdict_within(ci, TARGET_TPUT_RATIO, True)
                if ci
                else verdict(r >= TARGET_TPUT_RATIO),
            )
        )
        control = [x for x in cost.get("tput16_control_ratio_per_repeat") or [] if x is not None]
        if control:
            ci = median_interval(control)
            per = ", ".join(f"{x:.2f}" for x in control)
            what = (
                "control: hashing off against a second hashing-off cluster, 16 conns "
                "(what this method reads when nothing differs)"
            )
            spread = "" if ci is None else f"; 90% interval {ci[0]:.3f}–{ci[1]:.3f}"
            median = f"{statistics.median(control):.3f} (median of the pairs)"
            out.append((what, median, "1.000", f"per repeat: {per}{spread}", "–"))
        cpu = [x for x in cost.get("cpu_ratio_per_repeat") or [] if x is not None]
        if cpu:
            ci = median_interval(cpu)
            per = ", ".join(f"{x:.3f}" for x in cpu)
            med_ = statistics.median(cpu)
            control = [x for x in cost.get("cpu_control_ratio_per_repeat") or [] if x is not None]
            ctl = (
                f"; control off2/off: median {statistics.median(control):.3f}"
                f" ({min(control):.3f}–{max(control):.3f})"
                if control
                else ""
            )
            # Saturated throughput goes as 1 / CPU per op: the target in CPU terms.
            limit = 1 / TARGET_TPUT_RATIO
            what = (
                f"hashing on: CPU per SET at equal offered load ({cost.get('cpu_rate') or 0:g}/s"
                f" each, both clusters at once) ≤ {limit:.3f} × off (throughput ≥"
                f" {TARGET_TPUT_RATIO} ×)"
            )
            out.append(
                (
                    what,
                    f"{cost['cpu_us_per_op_on']:.1f} µs (median)",
                    f"hashing off: {cost['cpu_us_per_op_off']:.1f} µs",
                    f"{med_:.3f}, throughput ≈ {1 / med_:.3f} × (per repeat: {per}"
                    + ("" if ci is None else f"; 90% interval {ci[0]:.3f}–{ci[1]:.3f}")
                    + ctl
                    + ")",
                    verdict_within(ci, limit, False) if ci else verdict(med_ <= limit),
                )
            )
        add = cost["p50_1_added_us"]
        added = cost["p50_1_added_us_per_repeat"]
        per = ", ".join(f"{x:+.1f}" for x in added)
        ci = median_interval(added)
        within = (
            "" if ci is None else f"; median of the pairs, 90% interval {ci[0]:+.1f}–{ci[1]:+.1f}"
        )
        out.append(
            (
                f"hashing on: SET p50, 1 conn ≤ off + {TARGET_P50_ADD_US:g} µs",
                f"{cost['p50_1_on_us']:.1f} µs (median)",
                f"hashing off: {cost['p50_1_off_us']:.1f} µs",
                f"{add:+.1f} µs, ×{cost['p50_1_ratio']:.3f} (per repeat: {per}{within})",
                verdict_within(ci, TARGET_P50_ADD_US, False)
                if ci
                else verdict(add <= TARGET_P50_ADD_US),
            )
        )
    out += state_rows(res.get("state", {}))
    det = [t for t in res.get("detection", {}).get("trials", [])]
    if det:
        f2d = [t.get("flip_to_detect_ms") for t in det]
        m, worst = med(f2d), max((x for x in f2d if x is not None), default=None)
        out.append(
            (
                (
                    "detection within one check interval (backup's flipped input → leader's "
                    "DIVERGENCE, under 16-conn load)"
                ),
                (f"median {ms(m)}, max {ms(worst)} ({len(det)} trials)"),
                f"the design's check interval: {CHECK_INTERVAL_MS:g} ms",
                "–" if m is None else f"{m / CHECK_INTERVAL_MS:.2f}",
                verdict(None if m is None else m <= CHECK_INTERVAL_MS),
            )
        )
        r2d = med([t.get("reply_to_detect_ms") for t in det])
        lags = ", ".join(
            "/".join(
                f"{v}"
                for k, v in sorted((t.get("lag_entries_after_reply") or {}).items())
                if int(k) != t["leader"]
            )
            for t in det
        )
        fil = med([t.get("file_seen_s") and t["file_seen_s"] * 1000 for t in det])
        lst = med([t.get("list_seen_s") and t["list_seen_s"] * 1000 for t in det])
        out.append(
            (
                "detection: client's reply → report (under load)",
                (
                    f"DIVERGENCE logged {ms(r2d)}; report file {ms(fil)}; in `divergence list` "
                    f"{ms(lst)} (medians); backups' lag just after the reply: {lags} entries"
                ),
                f"{CHECK_INTERVAL_MS:g} ms",
                "–" if r2d is None else f"{r2d / CHECK_INTERVAL_MS:.2f}",
                "(info)",
            )
        )
        b = [t["detect_bytes"] for t in det]
        out.append(
            (
                "detection interval in output bytes (offset − first_difference)",
                f"median {med(b):g} bytes (all: {', '.join(map(str, b))}); in outputs: caught "
                f"by the point at the end of the diverging reply itself"
                if all(x <= 32 for x in b)
                else f"median {med(b):g} bytes (all: {', '.join(map(str, b))})",
                "–",
                "–",
                "(info)",
            )
        )
    rep = [t for t in res.get("repair", {}).get("trials", [])]
    base = res.get("baseline") or {}
    idle = [t.get("flip_to_detect_ms") for t in rep if t.get("flip_to_detect_ms") is not None]
    if idle:
        out.append(
            (
                "detection on an idle cluster (the repair trials): flipped input → DIVERGENCE",
                f"median {ms(med(idle))}, max {ms(max(idle))} ({len(idle)} trials)",
                f"{CHECK_INTERVAL_MS:g} ms",
                f"{med(idle) / CHECK_INTERVAL_MS:.2f}",
                "(info)",
            )
        )
    if rep:
        over = med([t.get("overhead_ms") for t in rep])
        sync = med([t.get("detect_to_sync_ms") for t in rep])
        replay = med([t.get("replay_ms") for t in rep])
        suffix = med([t.get("suffix_replayed") for t in rep])
        restore = med([t["report"]["restore_ms"] for t in rep])
        total = med([t["report"]["total_ms"] for t in rep])
        ok = None if over is None else over <= TARGET_REPAIR_MS
        ok = ok and all(t.get("digest_equal") for t in rep)
        bl = base.get("rdb_load_ms_median") or base.get("restart_ms_median")
        out.append(
            (
                (
                    f"repair, {res.get('keys', 0) // 1000}K keys: back in sync ≤ "
                    f"{TARGET_REPAIR_MS:g} ms + replay of the suffix"
                ),
                (
                    f"DIVERGENCE → right value again {ms(sync)} = {ms(over)} to the restored "
                    f"checkpoint (order + CRIU restore) + {ms(replay)} replay of {suffix} "
                    f"entries; DEBUG DIGEST equal to the leader's: "
                    f"{sum(bool(t.get('digest_equal')) for t in rep)}/{len(rep)} (medians)"
                ),
                f"{TARGET_REPAIR_MS:g} ms + replay",
                "–" if over is None else f"{over / TARGET_REPAIR_MS:.2f}",
                verdict(ok),
            )
        )
        out.append(
            (
                "repair: the report's total_ms and restore_ms (CRIU restore)",
                f"total {ms(total)}, restore {ms(restore)} (medians)",
                (
                    f"plain redis, same keys: RDB load {ms(bl)}, DEBUG RELOAD "
                    f"{ms(base.get('debug_reload_ms_median'))}"
                ),
                "–" if not (bl and restore) else f"restore ÷ RDB load = {restore / bl:.2f}",
                "(info)",
            )
        )
    for f in res.get("failed", []):
        out.append((f"phase {f['phase']}", f"FAILED: {f['reason'][:300]}", "", "", "FAILED"))
    return out


def state_rows(state):
    """The state-check phase's two targets: CPU per SET (throughput goes as its inverse)
    and the leader's p99, on against off at equal offered load."""
    s = state.get("summary")
    if not s:
        return []

    def windows(xs):
        return ", ".join("–" if x is None else f"{x:.3f}" for x in xs)

    def control(key):
        c = s.get(key)
        return f"; control off2/off: {windows(c)}" if c else ""

    every = f"every {state.get('every_s')} s, windows of {state.get('window_s', 0):g} s"
    limit = 1 / TARGET_TPUT_RATIO
    return [
        (
            (
                f"state checks on ({every}): SET throughput, 16 conns ≥ {TARGET_TPUT_RATIO} × off, "
                f"read as CPU per SET ≤ {limit:.3f} × off (probes counted)"
            ),
            f"{s['cpu_us_per_op_on']:.1f} µs per SET (median)",
            f"checks off: {s['cpu_us_per_op_off']:.1f} µs",
            (
                f"{s['cpu_ratio']:.3f} (windows: {windows(s['cpu_ratio_per_window'])}"
                f"{control('cpu_control_per_window')})"
            ),
            verdict(s["cpu_ratio"] <= limit),
        ),
        (
            (
                f"state checks on: the leader's SET p99 ≤ {TARGET_STATE_P99_RATIO} × off "
                f"(16 conns, equal offered load)"
            ),
            f"{s['p99_us_on']:.0f} µs (median)",
            f"checks off: {s['p99_us_off']:.0f} µs",
            (
                f"{s['p99_ratio']:.3f} (windows: {windows(s['p99_ratio_per_window'])}"
                f"{control('p99_control_per_window')})"
            ),
            verdict(s["p99_ratio"] <= TARGET_STATE_P99_RATIO),
        ),
    ]


def table(res):
    lines = [
        "| target | measured | baseline (this run) | ratio | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in rows(res):
        lines.append("| " + " | ".join(str(x).replace("|", "/") for x in r) + " |")
    return "\n".join(lines) + "\n"


def plot(res, path):
    samples = res.get("cost", {}).get("samples", [])
    det = res.get("detection", {}).get("trials", [])
    rep = res.get("repair", {}).get("trials", [])
    if not samples and not det and not rep:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    reps = sorted({s["repeat"] for s in samples})
    for ax, conns, key, title in (
        (axes[0], 16, "ops_per_s", "SET throughput, 16 conns (ops/s)"),
        (axes[1], 1, "p50_us", "SET p50, 1 conn (µs)"),
    ):
        shown = [
            mc
            for mc in (("off", "C0"), ("on", "C1"), ("off2", "C7"))
            if any(s["hashing"] == mc[0] for s in samples)
        ]
        width = 0.76 / len(shown)
        for j, (m, color) in enumerate(shown):
            xs, ys = [], []
            for rep_ in reps:
                v = [
                    s[key]
                    for s in samples
                    if s["repeat"] == rep_ and s["conns"] == conns and s["hashing"] == m
                ]
                if v:
                    xs.append(rep_ + (j - (len(shown) - 1) / 2) * width)
                    ys.append(v[0])
            label = "hashing off (control)" if m == "off2" else f"hashing {m}"
            ax.bar(xs, ys, width, color=color, label=label)
        ax.set_xticks(reps, [str(r + 1) for r in reps])
        ax.set_xlabel("repeat")
        ax.set_title(title)
        ax.legend(fontsize=8)
    ax = axes[2]
    labels, parts = [], []
    for kind, ts in (("detect", det), ("repair", rep)):
        for i, t in enumerate(ts):
            ls = t.get("log_s", {})
            labels.append(f"{kind} {i + 1}")
            flip = ls.get("flip")
            dv = ls.get("divergence")
            done = ls.get("repair_done")
            parts.append(
                (
                    (flip or 0) * 1000,
                    ((dv - flip) * 1000) if dv is not None and flip is not None else 0,
                    ((done - dv) * 1000) if done is not None and dv is not None else 0,
                )
            )
    cpu = res.get("cost", {}).get("cpu_samples", [])
    if not parts and cpu:  # a cost-only run: the equal-load windows instead
        for pair, color in (("on/off", "C1"), ("off2/off", "C7")):
            ys = [c["ratio"] for c in cpu if c["pair"] == pair and c.get("ratio")]
            label = "on / off" if pair == "on/off" else "control: off2 / off"
            ax.plot(range(1, len(ys) + 1), ys, "o-", color=color, label=label)
        ax.axhline(1 / TARGET_TPUT_RATIO, color="k", lw=0.8, ls="--", label="target: ≤ 1/0.95")
        ax.axhline(1.0, color="0.5", lw=0.6)
        ax.set_xlabel("equal-load window (both clusters driven at once)")
        ax.set_title("CPU per SET, ratio (equal offered load)")
        ax.legend(fontsize=7)
    if parts:
        y = range(len(parts))
        a0 = [p[0] for p in parts]
        a1 = [p[1] for p in parts]
        a2 = [p[2] for p in parts]
        ax.barh(y, [max(x, 0) for x in a0], color="0.75", label="reply → backup replays the flip")
        ax.barh(y, a1, left=a0, color="C3", label="flip → DIVERGENCE")
        left2 = [x + z for x, z in zip(a0, a1, strict=True)]
        ax.barh(y, a2, left=left2, color="C2", label="DIVERGENCE → repair done")
        ax.axvline(CHECK_INTERVAL_MS, color="k", lw=0.8, ls="--", label="20 ms check interval")
        ax.set_yticks(list(y), labels)
        ax.invert_yaxis()
        ax.set_xlabel("ms after the client's reply (daemon logs)")
        ax.set_title("detection and repair per trial")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(res, js):
    md, png = js.with_suffix(".md"), js.with_suffix(".png")
    js.write_text(json.dumps(res, indent=1, default=str) + "\n")
    m = res.get("machine", {})
    text = table(res)
    head = (
        f"# Output checking (issue 8) — {m.get('date', '')}\n\n"
        f"`{res.get('command', '')}` on {m.get('cores')} cores ({m.get('cpu')}), "
        f"{m.get('redis')}, commit {m.get('git_head', '')[:12]}"
        f"{' (dirty tree)' if m.get('git_dirty') else ''}; load average "
        f"{m.get('loadavg_start')} at start, {m.get('loadavg_end')} at the end. Every baseline "
        f"is from this run.\n\n"
    )
    drew = False
    try:
        drew = plot(res, png)
    except ImportError as e:
        log(f"no plot: {e}")
    md.write_text(head + text + (f"\n![plot]({png.name})\n" if drew else ""))
    print(text)
    print(f"wrote {js}, {md}" + (f" and {png}" if drew else ""))


# ---------------------------------------------------------------------------
