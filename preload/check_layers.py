#!/usr/bin/env python3
"""check_layers.py — the shim's files call and include only the layers below
their own (preload/README.md, "Layers"), so that no circle can form.

Two graphs are checked against the order README.md lists:
  - calls: for each object file of the shim, the undefined symbols (nm) that
    another object of the shim defines; a libc name the shim interposes
    (write, clock_gettime, ...) counts as a call into the file that wraps it;
  - includes: each preload/ source's and header's #include "preload/...".
A file may call only files of a lower layer and include only headers of its
own or a lower layer (a header belongs to the file of the same stem). Every
source and header in preload/ must be listed. Exit 1 on any violation, with
each named; the graph is printed either way.

ctest runs it as ShimLayers (CMakeLists.txt) over $<TARGET_OBJECTS:lockstep_preload>.
Usage: check_layers.py PRELOAD_DIR OBJECT...
"""

import os
import re
import subprocess
import sys


def layer_order(readme):
    """{unit: rank} from README's "## Layers" numbered list (lowest first)."""
    rank, inside = {}, False
    with open(readme, encoding="utf-8") as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("## "):
            inside = line.strip() == "## Layers"
            continue
        m = re.match(r"^(\d+)\. (.*)", line) if inside else None
        if m:
            for name in re.findall(r"`([^`]+\.[ch])`", m.group(2).split(" — ")[0]):
                rank[unit(name)] = int(m.group(1))
    return rank


def unit(path):
    """shim_rings.c, shim_rings.h, shim_rings.c.o -> shim_rings."""
    base = os.path.basename(path)
    return re.sub(r"(\.c|\.cc|\.h)(\.o)?$", "", base)


def call_edges(objects):
    defined, wanted = {}, {}
    for o in objects:
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        wanted[unit(o)] = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) == 2 and f[0] == "U":
                wanted[unit(o)].add(f[1])
            elif len(f) == 3 and f[1] in "TDBRCVW":  # defined here, global
                defined[f[2]] = unit(o)
    edges = {}
    for u, syms in wanted.items():
        for s in syms:
            if s in defined and defined[s] != u:
                edges.setdefault((u, defined[s]), set()).add(s)
    return edges


def include_edges(preload_dir):
    edges = {}
    for name in sorted(os.listdir(preload_dir)):
        if not re.search(r"\.(c|h)$", name):
            continue
        with open(os.path.join(preload_dir, name), encoding="utf-8") as f:
            lines = f.readlines()
        for line in lines:
            m = re.match(r'\s*#\s*include\s+"preload/([^"]+)"', line)
            if m and unit(m.group(1)) != unit(name):
                edges.setdefault((unit(name), unit(m.group(1))), set()).add(m.group(1))
    return edges


def violations(rank, calls, includes):
    bad = []
    for (a, b), syms in sorted(calls.items()):
        if rank[b] >= rank[a]:
            bad.append(
                f"{a} (layer {rank[a]}) calls {b} (layer {rank[b]}): {' '.join(sorted(syms))}"
            )
    for (a, b), hdrs in sorted(includes.items()):
        if rank[b] > rank[a]:
            bad.append(
                f"{a} (layer {rank[a]}) includes {b} (layer {rank[b]}): {' '.join(sorted(hdrs))}"
            )
    return bad


def main():
    preload_dir, objects = sys.argv[1], sys.argv[2:]
    rank = layer_order(os.path.join(preload_dir, "README.md"))
    if not rank:
        print('README.md has no "## Layers" list')
        return 1
    files = [n for n in os.listdir(preload_dir) if re.search(r"\.(c|h)$", n)]
    missing = sorted({unit(n) for n in files} - set(rank))
    calls, includes = call_edges(objects), include_edges(preload_dir)
    for a, b in sorted(set(calls) | set(includes), key=lambda e: (rank.get(e[0], 99), e)):
        how = "+".join(k for k, g in (("calls", calls), ("includes", includes)) if (a, b) in g)
        print(f"  {a} ({rank.get(a)}) -> {b} ({rank.get(b)}) {how}")
    bad = [f"{m} is in no layer of README.md" for m in missing]
    if not missing:
        bad += violations(rank, calls, includes)
        # The check itself must be able to fail: a call from the lowest unit
        # to the highest is named.
        low, high = min(rank, key=rank.get), max(rank, key=rank.get)
        if not violations(rank, {(low, high): {"planted"}}, {}):
            bad.append("the check did not notice a planted upward call")
    if not objects:
        bad.append("no object files given")
    for b in bad:
        print("LAYER VIOLATION:", b)
    units = len({unit(o) for o in objects})
    print(
        f"{units} objects, {len(calls)} call edges, {len(includes)} include edges: "
        + ("no circle, every edge goes down" if not bad else f"{len(bad)} violations")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
