"""The state phase of eval/divergence.py (issue 29): what state checks cost. apps/redis.toml
as it is against the same profile without its state_probe, at equal offered load; see
divergence.py's docstring ("state") for the method and the targets, divergence_report.py
for the table."""

import argparse
import contextlib
import statistics

import divergence  # eval/divergence.py: clusters, equal_load_cpu, same_data
from checkpoints import Failed, status

import apps  # eval/apps.py
from apps import log


def state_checks_of(d):
    """The cluster's state checks: the leader's `state_checks` status ({} when it has none:
    no probe), with `checks` and `failed` summed over every replica. A replica counts the
    checks it ran while it led, so after a leader change the leader's own count alone can
    go down (CI saw "-1 checks" once); every replica must answer, or the sum could too."""
    s = status(d)
    if s.get("leader") is None:
        raise Failed(f"{d}: no leader")
    shown = s["replicas"][s["leader"]].get("state_checks") or {}
    if not shown:
        return {}
    total = dict(shown, checks=0, failed=0, failures=[])
    for i, r in enumerate(s["replicas"]):
        if not r or "state_checks" not in r:
            raise Failed(f"{d}: replica {i} did not answer the status request")
        mine = r.get("state_checks") or {}
        total["checks"] += mine.get("checks", 0)
        total["failed"] += mine.get("failed", 0)
        if mine.get("last_failure"):
            total["failures"].append(f"replica {i}: {mine['last_failure']}")
    return total


def leader_ballot(d):
    """The ballot the cluster's leader leads under (None without a leader)."""
    s = status(d)
    return None if s.get("leader") is None else s["replicas"][s["leader"]].get("ballot")


def phase_state_checks(ctx, a, res):
    """apps/redis.toml as it is ("on": its state_probe runs every state_check_every_s, the
    default) against the same profile without the probe ("off", and the control "off2"),
    driven two at a time at the same offered load (equal_load_cpu) in windows long enough
    to hold at least one check each: the leader's p99 and CPU per SET, the daemons' ended
    children (the probes) counted too."""
    without = divergence.profile_without(ctx.work, "state_probe")
    apps_of = {"on": "redis", "off": without, "off2": without}
    modes = ["on", "off"] + (["off2"] if a.control else [])
    with contextlib.ExitStack() as stack:
        dirs = {
            m: stack.enter_context(
                divergence.cluster(ctx, f"state-{m}", divergence.clean_env(), apps_of[m])
            )
            for m in modes
        }
        addrs = {m: status(d)["client_addr"] for m, d in dirs.items()}
        for m, addr in addrs.items():
            apps.prefill("redis", addr, divergence.COST_KEYS, divergence.COST_VALUE)
        every = state_checks_of(dirs["on"]).get("every_s")
        if not every:
            raise Failed(f"the cluster with apps/redis.toml shows no state checks: {dirs['on']}")
        window = argparse.Namespace(**vars(a))
        window.cpu_seconds = max(a.cpu_seconds, 1.5 * every)
        window.cpu_repeats = a.state_repeats
        before = {m: state_checks_of(d) for m, d in dirs.items()}
        ballot_before = leader_ballot(dirs["on"])
        log(
            f"state checks: every {every} s; {window.cpu_repeats} windows of "
            f"{window.cpu_seconds:g} s per pair"
        )
        divergence.equal_load_cpu(ctx, window, dirs, addrs, res, children=True)
        after = {m: state_checks_of(d) for m, d in dirs.items()}
        res.update(every_s=every, window_s=window.cpu_seconds, before=before, after=after)
        ran = after["on"].get("checks", 0) - before["on"].get("checks", 0)
        log(f"state checks: the on cluster ran {ran} checks under load, {after['on']}")
        if ran < window.cpu_repeats:
            raise Failed(f"the on cluster ran {ran} state checks in {window.cpu_repeats} windows")
        failed = after["on"].get("failed", 0) - before["on"].get("failed", 0)
        if failed:
            # A leader that loses its leadership cuts its connections, the probe's too (CI
            # saw "exit status 1: Error: Server closed the connection" after an election on
            # the loaded machine): the check is retried by the next leader and nothing goes
            # unchecked. Any other failure is the probe's or the checker's defect.
            if leader_ballot(dirs["on"]) == ballot_before:
                raise Failed(f"{failed} state checks failed, the leader unchanged: {after['on']}")
            log(
                f"state checks: {failed} failed while the leadership moved (its connections "
                f"cut, the probe's too): {after['on'].get('failures')}"
            )
        reports = divergence.report_files(dirs["on"])
        if reports:
            raise Failed(f"divergence reports in a healthy cluster: {sorted(reports)}")
        for m in modes[1:]:
            if after[m]:
                raise Failed(f"cluster {m} (no state_probe) shows state checks: {after[m]}")
        for m, d in dirs.items():
            divergence.same_data(m, d)
    samples = [c for c in res["cpu_samples"] if c["pair"] == "on/off" and c["ratio"]]
    if not samples:
        raise Failed("no equal-load window measured")
    control = [c for c in res["cpu_samples"] if c["pair"] == "off2/off" and c["ratio"]]

    def p99_ratio(c, x="on", y="off"):
        return c[x]["p99_us"] / c[y]["p99_us"] if c[y]["p99_us"] else None

    res["summary"] = {
        "cpu_ratio_per_window": [c["ratio"] for c in samples],
        "cpu_ratio": statistics.median(c["ratio"] for c in samples),
        "cpu_us_per_op_on": statistics.median(c["on"]["cpu_us_per_op"] for c in samples),
        "cpu_us_per_op_off": statistics.median(c["off"]["cpu_us_per_op"] for c in samples),
        "p99_ratio_per_window": [p99_ratio(c) for c in samples],
        "p99_ratio": statistics.median(p99_ratio(c) for c in samples if p99_ratio(c)),
        "p99_us_on": statistics.median(c["on"]["p99_us"] for c in samples),
        "p99_us_off": statistics.median(c["off"]["p99_us"] for c in samples),
    }
    if control:
        res["summary"]["cpu_control_per_window"] = [c["ratio"] for c in control]
        res["summary"]["p99_control_per_window"] = [p99_ratio(c, "off2") for c in control]
    s = res["summary"]
    log(
        f"state checks: CPU per SET on/off {s['cpu_us_per_op_on']:.1f}/"
        f"{s['cpu_us_per_op_off']:.1f} µs = {s['cpu_ratio']:.3f}; leader's p99 on/off "
        f"{s['p99_us_on']:.0f}/{s['p99_us_off']:.0f} µs = {s['p99_ratio']:.2f}"
    )
