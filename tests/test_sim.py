"""The simulator through the command line: clean runs, replay, bad options."""

from conftest import run


def test_sim_reports_seeds_and_no_violations():
    out = run("sim", "--seeds", 30, "--replicas", 3, timeout=300).stdout
    assert out.strip().splitlines()[-1] == "30 seeds, 0 violations"


def test_sim_five_replicas_and_single_seed_replay_is_deterministic():
    first = run("sim", "--replicas", 5, "--seed", 7).stdout
    second = run("sim", "--replicas", 5, "--seed", 7).stdout
    assert first == second
    assert first.strip().splitlines()[-1] == "1 seeds, 0 violations"


def test_sim_rejects_bad_replica_count():
    p = run("sim", "--replicas", 4, check=False)
    assert p.returncode != 0 and "3, 5 or 7" in p.stderr
