#!/usr/bin/env python3
"""check_includes.py — guard/'s layering, checked (ctest guard_include_rules).

The rules live in one place, the table "Which folder may include which" in
guard/README.md: one row per subfolder, the guard/ folders its files may
include besides their own. This script reads that table and fails when

- a file under guard/ includes a guard/ header its folder may not (or one
  by a path that is not from the source root: "wire.h", "../net/wire.h");
- a source file sits in guard/ itself or in a folder the table does not name;
- a subfolder's README.md says other than the table on its "May include:"
  and "Must not be included by:" lines (so the READMEs cannot drift);
- consensus/, checkpoint/ or preload/ include anything of guard/ (they sit
  below it).

Usage: check_includes.py [SOURCE_ROOT]   (default: the parent of guard/)
"""

import pathlib
import re
import sys

SOURCES = {".c", ".cc", ".h"}
BELOW_GUARD = ("consensus", "checkpoint", "preload")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
ROW = re.compile(r"^\|\s*`(\w+)/`\s*\|([^|]*)\|")
FOLDERS_IN = re.compile(r"`(\w+)/`")


def read_table(readme: pathlib.Path) -> dict[str, set[str]]:
    """folder -> the other guard/ folders it may include, from the README's table."""
    table: dict[str, set[str]] = {}
    in_table = False
    for line in readme.read_text().splitlines():
        if line.startswith("## "):
            in_table = line.strip() == "## Which folder may include which"
            continue
        m = ROW.match(line) if in_table else None
        if m:
            table[m.group(1)] = set(FOLDERS_IN.findall(m.group(2)))
    return table


def folder_list(folders) -> str:
    return ", ".join(f"`{f}/`" for f in sorted(folders)) or "nothing"


def check(root: pathlib.Path) -> list[str]:
    guard = root / "guard"
    table = read_table(guard / "README.md")
    if not table:
        return ["guard/README.md: no table under '## Which folder may include which'"]
    errors = []
    for folder, allowed in table.items():
        for a in allowed - table.keys():
            errors.append(f"guard/README.md: {folder}/ may include {a}/, which the table lacks")

    for path in sorted(guard.rglob("*")):
        if path.suffix not in SOURCES or not path.is_file():
            continue
        rel = path.relative_to(root)
        parts = path.relative_to(guard).parts
        if len(parts) != 2 or parts[0] not in table:
            errors.append(f"{rel}: not in one of guard/'s folders ({folder_list(table)})")
            continue
        own = parts[0]
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            if "/" not in inc or inc.startswith("."):
                errors.append(f'{rel}:{n}: #include "{inc}": name it from the source root')
                continue
            top, _, rest = inc.partition("/")
            if top != "guard":
                continue
            target = rest.split("/")[0]
            if target != own and target not in table[own]:
                errors.append(
                    f"{rel}:{n}: {own}/ may not include {inc} "
                    f"({own}/ may include {folder_list(table[own])}: guard/README.md)"
                )

    for folder, allowed in table.items():
        readme = guard / folder / "README.md"
        if not readme.exists():
            errors.append(f"guard/{folder}/README.md: missing")
            continue
        text = readme.read_text()
        includers = {f for f, a in table.items() if folder not in a and f != folder}
        for label, want in (
            ("May include:", allowed),
            ("Must not be included by:", includers),
        ):
            m = re.search(rf"^{re.escape(label)}(.*)$", text, re.MULTILINE)
            said = set(FOLDERS_IN.findall(m.group(1))) if m else None
            if said != want:
                errors.append(
                    f"guard/{folder}/README.md: '{label}' should name {folder_list(want)} "
                    f"(guard/README.md's table), says {folder_list(said or set()) if m else 'nothing'}"
                )

    for below in BELOW_GUARD:
        for path in sorted((root / below).rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1).startswith("guard/"):
                    errors.append(f"{path.relative_to(root)}:{n}: {below}/ may not include guard/")
    return errors


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[1])
    errors = check(root.resolve())
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} include rule(s) broken")
        return 1
    print("guard/ include rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
