#!/usr/bin/env python3
"""What a cloned start costs (issue 29; the profile's `cloned_start`), against the same profile
without it, measured in the same run.

    scripts/bench cloned-start [--apps memcached,mariadb] [--repeats 3] [--build DIR]
    .venv/bin/python eval/cloned_start.py [same options]

For each app, the profile as it is and a copy with `cloned_start` flipped (on where the profile
has it off and the other way round), in turn, --repeats times each:

  up       `lockstep cluster up --app ... --wipe`, then until every replica's server runs
           (status: a server pid and server_state "running" on all three). With a cloned
           start that includes replica 0's dump at index 0 and every other replica's fetch
           and restore of it.
  restart  a backup's daemon SIGKILLed (its server dies with it), `cluster restart --id`, until
           its server runs again: a restore of its own copy of the image (or a newer
           checkpoint) with a cloned start, a fresh start without.

Prints a table of medians (seconds) and the ratio cloned / own; writes eval/out/cloned_start.json.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import profiles  # eval/profiles.py: apps/APP.toml variants

ROOT = Path(__file__).resolve().parent.parent


def lockstep(build, *args, check=True):
    r = subprocess.run(
        [str(build / "bin" / "lockstep"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check and r.returncode != 0:
        sys.exit(f"lockstep {' '.join(map(str, args))}: {r.stderr.strip()}")
    return r


def status(build, d):
    r = lockstep(build, "cluster", "status", "--dir", d, "--json", check=False)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return None


def all_running(s):
    return bool(s) and all(
        r.get("server_pid") and (r.get("checkpoint") or {}).get("server_state") == "running"
        for r in s["replicas"]
    )


def wait(build, d, pred, what, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = status(build, d)
        if s and pred(s):
            return s
        time.sleep(0.05)
    sys.exit(f"{d}: timed out waiting for {what}")


def flipped(app, work):
    """apps/<app>.toml with cloned_start flipped; (path, whether the copy clones)."""
    dropped = 0

    def flip(text):
        nonlocal dropped
        text, dropped = re.subn(r"(?m)^cloned_start = true$", "", text)
        return text if dropped else text.rstrip("\n") + "\ncloned_start = true\n"

    return profiles.variant(app, work, flip), dropped == 0


def one(build, app, d, port):
    t0 = time.monotonic()
    lockstep(build, "cluster", "up", "--app", app, "--dir", d, "--base-port", port, "--wipe")
    wait(build, d, all_running, "every replica's server")
    up = time.monotonic() - t0
    s = status(build, d)
    b = next(r["id"] for r in s["replicas"] if r["role"] == "backup")
    os.kill(s["replicas"][b]["pid"], signal.SIGKILL)
    wait(build, d, lambda s: s["replicas"][b]["role"] == "down", "the backup down")
    t1 = time.monotonic()
    lockstep(build, "cluster", "restart", "--id", b, "--dir", d)
    wait(build, d, all_running, "the restarted backup's server")
    restart = time.monotonic() - t1
    lockstep(build, "cluster", "down", "--dir", d, check=False)
    return up, restart


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--apps", default="memcached,mariadb")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base-port", type=int, default=17000)  # below the ephemeral ports
    ap.add_argument("--build", default=str(ROOT / "build"))
    a = ap.parse_args()
    build = Path(a.build).resolve()
    work = Path(tempfile.mkdtemp(prefix="lockstep-cloned-start-"))
    rows, res = [], {"command": "scripts/bench cloned-start " + " ".join(sys.argv[1:])}
    for app in a.apps.split(","):
        copy, copy_clones = flipped(app, work)
        variants = {"cloned": copy if copy_clones else app, "own": app if copy_clones else copy}
        times = {v: [] for v in variants}
        for i in range(a.repeats):
            for v, profile in variants.items():
                up, restart = one(build, profile, str(work / "cluster"), a.base_port)
                times[v].append((up, restart))
                print(
                    f"{app} {v} #{i + 1}: up {up:.2f} s, restart {restart:.2f} s", file=sys.stderr
                )
        med = {v: [statistics.median(t[k] for t in times[v]) for k in (0, 1)] for v in variants}
        res[app] = {"samples": times, "median": med}
        for k, what in enumerate(("cluster up until every server runs", "a backup's restart")):
            c, o = med["cloned"][k], med["own"][k]
            rows.append(f"| {app} | {what} | {c:.2f} | {o:.2f} | {c / o:.2f} |")
    out = ROOT / "eval" / "out" / "cloned_start.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print("| app | what | cloned start, s | own start, s | ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
