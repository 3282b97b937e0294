"""Output checking, divergence reports and repair (guard/output_guard.h), with
real redis servers, real CRIU checkpoints and a real fault: a failpoint in
one backup's daemon flips one byte of one input as it is replayed to that
backup's server (LOCKSTEP_FAILPOINT=flip-input:MARKER)."""

import json
import os
import signal
import time

import pytest
from conftest import run
from resp import Redis
from test_checkpoint import backups, load, wait_checkpoint
from test_redis import assert_same_data


@pytest.fixture
def redis_cluster(cluster):
    cluster.up(app="redis", extra=("--checkpoint-entries", "50"))
    return cluster


def reports(cluster):
    return json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def wait_reports(cluster, predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rs = reports(cluster)
        if predicate(rs):
            return rs
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {reports(cluster)}")


def output_status(cluster, r):
    return cluster.status()["replicas"][r]["output"]


def restart_with_failpoint(cluster, b, marker):
    """Restarts backup b's daemon with the failpoint armed (only its env has it)."""
    os.kill(cluster.pid(b), signal.SIGKILL)
    env = dict(os.environ, LOCKSTEP_FAILPOINT=f"flip-input:{marker}")
    run("cluster", "restart", "--id", b, "--dir", cluster.dir, env=env)
    commit = cluster.status()["replicas"][cluster.leader()]["commit_index"]
    cluster.wait(lambda s: s["replicas"][b]["applied_index"] >= commit, 30, "the restart")


def test_a_flipped_input_is_detected_reported_and_rolled_back(redis_cluster):
    c = redis_cluster
    client = Redis(c.client_addr())
    load(client, 0, 1000)  # 100 entries: every backup takes its turns (each 50)
    b = backups(c)[0]
    wait_checkpoint(c, b, above=50)
    restart_with_failpoint(c, b, "flipme-")
    assert reports(c) == []  # nothing diverged so far

    other = Redis(c.client_addr())  # a connection of its own: the report names it
    assert other.call("SET", "fk", "flipme-A") == "OK"
    assert (
        other.call("GET", "fk") == b"flipme-A"
    )  # the leader's reply; the backup's says "flipme-@"
    rs = wait_reports(
        c, lambda rs: any(r["status"] != "repairing" for r in rs), 30, "a repaired divergence"
    )
    assert len(rs) == 1, rs
    r = rs[0]
    assert r["replica"] == b and r["leader"] == c.leader() and not r["leader_diverged"], r
    assert r["status"] == "repaired" and r["how"] == "rollback", r
    assert "rolled back to its checkpoint" in r["action"], r
    assert 0 < r["restored_index"] <= r["log_window"]["to"], r
    assert r["total_ms"] > 0 and r["restore_ms"] > 0, r
    # The connection's inputs in the window, and both replicas' outputs
    # around the first differing byte.
    assert any("flipme-A" in i for i in r["connection_inputs"]), r["connection_inputs"]
    outs = {o["from_replica"]: o for o in r["outputs"]}
    assert set(outs) == {c.leader(), b}, outs
    assert "flipme-A" in outs[c.leader()]["bytes"] and "flipme-@" in outs[b]["bytes"], outs
    assert r["first_difference"] >= r["agreed_offset"], r
    leader_bytes = outs[c.leader()]["bytes"]
    at = r["first_difference"] - outs[c.leader()]["start"]
    assert leader_bytes[at] == "A", (leader_bytes, at)
    # Repaired: every replica holds the same data, the backup's fk is right.
    assert_same_data(c)
    assert Redis(c.server_addr(b)).call("GET", "fk") == b"flipme-A"
    # People read it too.
    shown = run("divergence", "show", r["id"], "--dir", c.dir).stdout
    assert f"replica {b} diverged" in shown and "rollback" in shown and ">>" in shown, shown
    listed = run("divergence", "list", "--dir", c.dir).stdout
    assert r["id"] in listed and "repaired" in listed, listed
    assert "1 divergence report" in run("cluster", "status", "--dir", c.dir).stdout
    st = output_status(c, c.leader())
    assert st["checks"] > 0 and st["repairs"] == 1 and st["suspended"] == [], st
    # Checked again afterwards, and nothing more diverges.
    for i in range(20):
        other.call("SET", f"after{i}", "x")
    time.sleep(1)
    assert len(reports(c)) == 1
    assert output_status(c, c.leader())["checks"] > st["checks"]


def test_identical_replicas_report_nothing_and_are_checked(redis_cluster):
    c = redis_cluster
    clients = [Redis(c.client_addr()) for _ in range(4)]
    for i, cl in enumerate(clients):
        load(cl, i * 100, 100, prefix=f"c{i}-")
        assert cl.call("GET", f"c{i}-{i * 100 + 5}") == b"v%d" % (i * 100 + 5)
    big = b"x" * 200_000  # past the 64 KiB marks of a stream
    for _ in range(3):
        assert clients[0].call("SET", "big", big) == "OK"
        assert clients[0].call("GET", "big") == big
    assert_same_data(c)
    time.sleep(1)
    st = output_status(c, c.leader())
    assert st["checks"] >= 4, st  # a quiet connection is checked too
    assert st["divergences"] == 0 and reports(c) == [], (st, reports(c))
    for b in backups(c):
        assert output_status(c, b)["points_sent"] > 0


def test_unknown_report_id_is_a_clear_error(redis_cluster):
    r = run("divergence", "show", "7-123", "--dir", redis_cluster.dir, check=False)
    assert r.returncode != 0 and "no divergence report 7-123" in r.stderr, r
    r = run("divergence", "bogus", "--dir", redis_cluster.dir, check=False)
    assert r.returncode == 2 and "usage" in r.stdout, r
