"""The targets `scripts/bench redis|memcached` (eval/apps.py) prints with their verdicts,
each computed from the run's own numbers: issues 3 and 9's throughput and latency against
what a user would run instead (targets), issue 26's CPU per op and reads (speed_targets),
and their text (targets_text). Reads the run's JSON only; measures nothing."""

from apps import HOST_CLASSES, all_cpu_us, find


def throughput_ceiling(res, r):
    """The most ops/s run r's mode could reach on this machine even if lockstep's
    daemons cost no CPU at all: every core busy with only the servers' and the load
    generator's own CPU per op, as measured in r. None when r has no CPU figures."""
    per = (r or {}).get("per_op", {})
    if "servers" not in per or "loadgen" not in per:
        return None
    others = per["servers"]["cpu_us"] + per["loadgen"]["cpu_us"]
    return res["machine"]["cores"] * 1e6 / others, others


def targets(res):
    """Issues 3 and 9's targets, each from this run's numbers; met is None when a side is
    missing. A target that this machine cannot reach whatever the daemons do says so
    (`reachable` False, with the bound measured in this run): the servers and the load
    generator share the cores with the daemons, and the replicas share one disk."""
    runs, out = res["runs"], []

    def add(name, met, detail, reachable=None):
        out.append({"target": name, "met": met, "detail": detail, "reachable": reachable})

    def ceiling(r, need):
        """(reachable, words) for a throughput target of `need` ops/s."""
        c = throughput_ceiling(res, r)
        if c is None or met_already(r, need):
            return None, ""
        top, others = c
        return top >= need, (
            f"; ceiling here {top:.0f}/s: servers + loadgen alone cost {others:.1f} µs CPU "
            f"per op on {res['machine']['cores']} cores, with daemons at 0"
        )

    def met_already(r, need):
        return r is not None and r["ops_per_s"] >= need

    def p50(r):
        return f"{r['p50_us']:.0f} µs" if r else "not measured"

    def tput(r):
        return f"{r['ops_per_s']:.0f}/s" if r else "not measured"

    rep1, un1 = find(runs, "replicated", "disk", 1), find(runs, "unreplicated", "none", 1)
    aof1, wait1 = find(runs, "aof-always", "disk", 1), find(runs, "redis-wait", "memory", 1)
    if res["app"] == "redis":
        ok, reach, why = None, None, ""
        if rep1 and aof1 and wait1:
            ok = rep1["p50_us"] < aof1["p50_us"] and rep1["p50_us"] < wait1["p50_us"]
        floor = res.get("reference", {}).get("shared_floor_p50_us")
        if not ok and un1 and aof1 and wait1 and floor:
            # An input is acknowledged after the replicas' durable writes at least;
            # here all of them write to the one disk at once.
            low = un1["p50_us"] + floor
            reach = low < min(aof1["p50_us"], wait1["p50_us"])
            why = (
                f"; floor here {low:.0f} µs: unreplicated {un1['p50_us']:.0f} µs + one "
                f"durable write while {res['reference']['replicas']} replicas write to "
                f"this one disk at once ({floor:.0f} µs p50)"
            )
        add(
            "1 conn, disk: SET p50 below aof-always and redis-wait",
            ok,
            f"replicated {p50(rep1)}, aof-always {p50(aof1)}, redis-wait {p50(wait1)}{why}",
            reach,
        )
        rep16, aof16 = find(runs, "replicated", "disk", 16), find(runs, "aof-always", "disk", 16)
        wait16 = find(runs, "redis-wait", "memory", 16)
        ok, reach, why = None, None, ""
        if rep16 and aof16 and wait16:
            need = max(aof16["ops_per_s"], wait16["ops_per_s"])
            ok = rep16["ops_per_s"] > need
            reach, why = ceiling(rep16, need)
        add(
            "16 conns, disk: SET throughput above aof-always and redis-wait",
            ok,
            f"replicated {tput(rep16)}, aof-always {tput(aof16)}, redis-wait {tput(wait16)}" + why,
            reach,
        )
    mem16, un16 = find(runs, "replicated", "memory", 16), find(runs, "unreplicated", "none", 16)
    # Redis (issue 9): against redis-wait, which keeps three copies in RAM as
    # memory mode does (and waits a round trip per write); memcached, which
    # has no such mode: against itself unreplicated (issue 3).
    if res["app"] == "redis":
        base, factor, name = find(runs, "redis-wait", "memory", 16), 1.3, "redis-wait"
    else:
        base, factor, name = un16, 0.7, "unreplicated"
    ok, ratio, reach, why = None, "", None, ""
    if mem16 and base:
        ratio = f" = {mem16['ops_per_s'] / base['ops_per_s']:.2f}×"
        ok = mem16["ops_per_s"] >= factor * base["ops_per_s"]
        reach, why = ceiling(mem16, factor * base["ops_per_s"])
    add(
        f"16 conns, memory: SET throughput ≥ {factor} × {name}",
        ok,
        f"replicated {tput(mem16)} / {name} {tput(base)}{ratio}{why}",
        reach,
    )
    ref = res.get("reference", {}).get("commit_p50_us")
    ok, detail = None, "replicated/disk or the log's commit p50 not measured"
    if rep1 and un1 and ref is not None:
        added = rep1["p50_us"] - un1["p50_us"]
        ok = added <= ref + 20
        detail = f"added {added:.0f} µs; log commit p50 {ref:.0f} µs + 20 = {ref + 20:.0f} µs"
    add("1 conn, disk: added SET p50 ≤ replicated log's commit p50 + 20 µs", ok, detail)
    return out


def speed_targets(res):
    """Issue 26's targets for redis (CPU per op, the leader's host, reads), each from this
    run's numbers, in the form targets() returns; for memcached, its four worker threads'
    throughput against one's. CPU counts every thread of the daemons
    and servers (/proc) and loadgen's rusage; "all" is their sum."""
    runs, out = res["runs"], []

    def add(name, met, detail):
        out.append({"target": name, "met": met, "detail": detail, "reachable": None})

    if res["app"] == "memcached":
        # Target 5's second half asks for the figure, not a bound: memcached's four worker
        # threads under serial_inputs against the one worker the profile ran before.
        four, one = (
            find(runs, "replicated", "disk", 16),
            find(runs, "replicated-1worker", "disk", 16),
        )
        ok = None if not (four and one) else four["ops_per_s"] >= one["ops_per_s"]
        add(
            "16 conns, disk: SET throughput at -t 4 (the profile's) against -t 1 (reported)",
            ok,
            "not measured"
            if ok is None
            else f"-t 4 {four['ops_per_s']:.0f}/s, -t 1 {one['ops_per_s']:.0f}/s: "
            f"{four['ops_per_s'] / one['ops_per_s']:.2f}×",
        )
        return out
    if res["app"] != "redis":
        return out

    def cpu(r, cls):
        x = (r or {}).get("per_op", {}).get(cls)
        return x["cpu_us"] if x else None

    def all_of(r):
        return all_cpu_us(r["per_op"]) if r and r.get("per_op") else None

    def num(x, unit=" µs"):
        return "not measured" if x is None else f"{x:.1f}{unit}"

    wait16 = find(runs, "redis-wait", "memory", 16)
    un16 = find(runs, "unreplicated", "none", 16)
    for durability, factor, daemons_max, host_max in (
        ("memory", 1.0, 12.0, 4.2 / 2),
        ("disk", 1.15, 18.0, 5.9 / 2),
    ):
        rep = find(runs, "replicated", durability, 16)
        mine, theirs = all_of(rep), all_of(wait16)
        ok = None if mine is None or theirs is None else mine <= factor * theirs
        ratio = f" = {mine / theirs:.2f}×" if ok is not None else ""
        add(
            f"16 conns, {durability}: all processes' CPU per SET ≤ {factor:g} × redis-wait's",
            ok,
            f"lockstep {num(mine)}, redis-wait {num(theirs)}{ratio}",
        )
        d = cpu(rep, "daemons")
        add(
            f"16 conns, {durability}: the three daemons' CPU per SET ≤ {daemons_max:g} µs",
            None if d is None else d <= daemons_max,
            f"{num(d)}",
        )
        srv, one = cpu(rep, "servers"), cpu(un16, "servers")
        ok = None if srv is None or one is None else srv <= 1.15 * 3 * one
        add(
            f"16 conns, {durability}: servers' CPU per SET ≤ 1.15 × 3 × the unreplicated one's",
            ok,
            f"three under lockstep {num(srv)}, one unreplicated {num(one)}"
            + (f": {srv / (3 * one):.2f} × three" if ok is not None else ""),
        )
        host = cpu(rep, HOST_CLASSES[0])
        backups = cpu(rep, HOST_CLASSES[1])
        ok = None if host is None or one is None else host <= host_max * one
        add(
            f"16 conns, {durability}: the leader's host (daemon + server) ≤ {host_max:.2f} × "
            "the unreplicated server's CPU per SET (half the ratio of 6a64cbd)",
            ok,
            f"leader host {num(host)}, each backup host {num(backups and backups / 2)}, "
            f"unreplicated server {num(one)}"
            + (f": leader host {host / one:.2f}×" if ok is not None else ""),
        )
    rep1 = find(runs, "replicated", "disk", 1)
    d = (rep1 or {}).get("per_op", {}).get("daemons")
    ok = None if d is None else d["cpu_us"] <= 40 and d["switches"] <= 3
    add(
        "1 conn, disk: the daemons' CPU ≤ 40 µs and ≤ 3 context switches per SET",
        ok,
        "not measured" if d is None else f"{d['cpu_us']:.1f} µs, {d['switches']:.2f} switches",
    )
    un1 = find(runs, "unreplicated", "none", 1)
    floor = res.get("reference", {}).get("shared_floor_p50_us")
    ok, detail = None, "replicated/disk, unreplicated or the shared disk floor not measured"
    if rep1 and un1 and floor:
        bound = un1["p50_us"] + floor
        ok = rep1["p50_us"] <= 1.15 * bound
        detail = (
            f"p50 {rep1['p50_us']:.0f} µs; bound {bound:.0f} µs = unreplicated "
            f"{un1['p50_us']:.0f} + one durable write beside the others {floor:.0f}; "
            f"{rep1['p50_us'] / bound:.2f}× the bound"
        )
    add("1 conn, disk: SET p50 ≤ 1.15 × (unreplicated p50 + one shared durable write)", ok, detail)
    for durability in ("disk", "memory"):
        g16 = find(runs, "replicated", durability, 16, "get")
        u16 = find(runs, "unreplicated", "none", 16, "get")
        ok = None if not (g16 and u16) else g16["ops_per_s"] >= 0.8 * u16["ops_per_s"]
        add(
            f"16 conns, {durability}: GET throughput ≥ 0.8 × unreplicated",
            ok,
            "not measured"
            if ok is None
            else f"{g16['ops_per_s']:.0f}/s against {u16['ops_per_s']:.0f}/s: "
            f"{g16['ops_per_s'] / u16['ops_per_s']:.2f}×",
        )
        g1 = find(runs, "replicated", durability, 1, "get")
        u1 = find(runs, "unreplicated", "none", 1, "get")
        ok = None if not (g1 and u1) else g1["p50_us"] <= u1["p50_us"] + 15
        add(
            f"1 conn, {durability}: GET p50 ≤ unreplicated + 15 µs",
            ok,
            "not measured"
            if ok is None
            else f"{g1['p50_us']:.0f} µs against {u1['p50_us']:.0f} µs",
        )
    return out


def targets_text(ts):
    word = {True: "met", False: "NOT met", None: "n/a"}

    def verdict(t):
        if t["met"] is False and t.get("reachable") is False:
            return "NOT met, out of reach on this machine"
        return word[t["met"]]

    return "\n".join(f"- {t['target']}: {verdict(t)} ({t['detail']})" for t in ts) + "\n"
