#!/usr/bin/env python3
"""Runs the replicated-log benchmark and draws it.

    .venv/bin/python eval/consensus.py [--out eval/out] [--seconds 3] [extra bench args]

Runs `lockstep bench consensus` over shm and tcp, disk and memory
durability, 1 and 16 clients, 3/5/7 replicas; writes the JSON, a markdown
table and a PNG plot (commit latency against the durable-write floor
measured in the same run, and throughput) into --out.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKSTEP = ROOT / "build" / "bin" / "lockstep"


def table(runs):
    head = (
        "| transport | durability | replicas | clients | floor p50 µs | floor(N) p50 µs "
        "| commit p50 µs | commit p99 µs | durable µs | quorum µs | ops/s |"
    )
    rows = [head, "|" + "---|" * 11]
    for r in runs:
        dur = r["durability"] + (" (RAM only)" if r["durability"] == "memory" else "")
        rows.append(
            f"| {r['transport']} | {dur} | {r['replicas']} | {r['clients']} "
            f"| {r['floor_p50_us']:.1f} | {r.get('shared_floor_p50_us', 0):.1f} "
            f"| {r['commit_p50_us']:.1f} | {r['commit_p99_us']:.1f} "
            f"| {r['durable_write_us']:.1f} | {r['quorum_wait_us']:.1f} | {r['throughput_ops']:.0f} |"
        )
    return "\n".join(rows) + "\n"


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [
        f"{r['transport']}/{r['durability'][:3]}/{r['replicas']}r/{r['clients']}c" for r in runs
    ]
    x = range(len(runs))
    w = 0.27
    ax1.bar([i - w for i in x], [r["commit_p50_us"] for r in runs], w, label="commit p50")
    ax1.bar(list(x), [r["floor_p50_us"] for r in runs], w, label="disk floor p50, one writer")
    ax1.bar(
        [i + w for i in x],
        [r.get("shared_floor_p50_us", 0) for r in runs],
        w,
        label="disk floor p50, one writer per replica",
    )
    ax1.set_ylabel("µs")
    ax1.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=8)
    ax1.legend()
    ax1.set_title("commit latency vs. durable-write floor")
    ax2.bar(list(x), [r["throughput_ops"] for r in runs])
    ax2.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=8)
    ax2.set_ylabel("commits/s")
    ax2.set_title("throughput (mem = RAM of a majority, not durable)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=str(ROOT / "eval" / "out"))
    ap.add_argument("--seconds", default="3")
    ap.add_argument("--from-json", help="only draw an existing bench JSON")
    args, extra = ap.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    js = Path(args.from_json) if args.from_json else out / "consensus.json"
    if not args.from_json:
        cmd = [
            str(LOCKSTEP),
            "bench",
            "consensus",
            "--transport",
            "shm,tcp",
            "--durability",
            "disk,memory",
            "--replicas",
            "3,5,7",
            "--clients",
            "1,16",
            "--seconds",
            args.seconds,
            "--json",
            str(js),
            *extra,
        ]
        print("running:", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    runs = json.loads(js.read_text())["runs"]
    (out / "consensus.md").write_text(table(runs))
    plot(runs, out / "consensus.png")
    print(table(runs))
    print(f"wrote {out / 'consensus.md'} and {out / 'consensus.png'}")


if __name__ == "__main__":
    main()
