"""The declared-skips rule, shared by pytest (tests/conftest.py) and ctest
(scripts/ctest_skips): a skipped test fails the run unless
tests/declared_skips.txt names it (a pytest node id or a ctest test name such
as `DiskLog.FullDisk...`, or the start of one) with why. Every skip is
printed, declared or not; LOCKSTEP_ALLOW_SKIPS=1 lets undeclared ones pass
on a machine without what scripts/setup installs."""

import os
from pathlib import Path

FILE = Path(__file__).resolve().parent / "declared_skips.txt"


def declared():
    """[(test name prefix, why)] from tests/declared_skips.txt."""
    out = []
    for line in FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, why = line.partition(" ")
            out.append((name, why.strip()))
    return out


def is_declared(name):
    return any(name.startswith(prefix) for prefix, _ in declared())


def allowed():
    """Undeclared skips pass too (LOCKSTEP_ALLOW_SKIPS=1)."""
    return os.environ.get("LOCKSTEP_ALLOW_SKIPS") == "1"
