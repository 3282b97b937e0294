"""Membership change on real processes (`lockstep member add|remove|list`):
a backup replaced under a bounded redis load (3 -> 4 -> 3) and the leader
removed, each with nothing acknowledged lost, the history linearizable,
and every member's redis identical (DEBUG DIGEST) once the new replica
votes. The rules themselves (single-server changes, learners, a removed
leader) are the core's, tested under the simulator (core_membership_test)."""

import json
import os
import signal
import urllib.request

import history  # eval/history.py
import leader_move  # eval/leader_move.py: the load and the read-back
from conftest import run
from resp import Redis  # eval/resp.py
from test_checkpoint import load
from test_redis import assert_same_data

ELECTION_MS = (400, 800)  # a VM pause of up to ~0.9 s must not elect anyone


def up_redis(cluster):
    cluster.up(app="redis", extra=("--election-timeout-ms", f"{ELECTION_MS[0]}-{ELECTION_MS[1]}"))
    st = cluster.status()
    return leader_move.LeaderAddress(cluster.dir, leader_move.parse_addr(st["client_addr"]))


def members(cluster):
    out = run("member", "list", "--json", "--dir", cluster.dir, timeout=60).stdout
    return json.loads(out)


def follow_leader(cluster, where):
    st = cluster.status()
    where.set(leader_move.parse_addr(st["client_addr"]))


def check_load(cluster, load, where, tmp_path):
    lost = leader_move.lost_writes(where, load.acked_own)
    assert load.acked_own, "no write was acknowledged"
    assert lost == [], f"{len(lost)} acknowledged SETs lost, e.g. {lost[:5]}"
    assert_same_data(cluster, timeout=30)
    tmp_path.mkdir(parents=True, exist_ok=True)
    res = history.check(load.write_history(tmp_path / "history.json"), timeout="120s")
    assert res.returncode == 0, res.stdout + res.stderr


def test_replace_a_backup_under_load(cluster, tmp_path):
    """3 -> 4 -> 3: a fourth replica joins as a learner under load, catches
    up, is promoted; then one of the first backups is removed and stopped."""
    where = up_redis(cluster)
    leader = cluster.leader()
    load = leader_move.Load(where, clients=3)
    load.start()
    try:
        out = run("member", "add", "--dir", cluster.dir, timeout=180).stdout
        print(out)
    finally:
        load.finish()
    assert "replica 3 added as a learner" in out, out
    assert "replica 3 is a voter" in out, out
    m = members(cluster)
    assert m["membership"]["voters"] == [0, 1, 2, 3], m
    assert m["membership"]["learners"] == [], m
    assert m["membership"]["committed"], m
    # Four voters, each holding the same data: the new one's redis was built
    # from the log (and a checkpoint, where the log was truncated) under load.
    check_load(cluster, load, where, tmp_path / "add")
    log = (cluster.dir / "replica-3.log").read_text()
    assert "this replica is a learner" in log and "this replica is a voter" in log, log[-3000:]
    # Every member's metrics count the configuration it holds.
    for r in cluster.status()["replicas"]:
        with urllib.request.urlopen(f"http://{r['metrics_addr']}/metrics", timeout=10) as page:
            text = page.read().decode()
        assert 'lockstep_members{kind="voter"} 4' in text, (r["id"], text[:2000])
        assert 'lockstep_members{kind="learner"} 0' in text, (r["id"], text[:2000])

    gone = next(r for r in range(3) if r != leader)
    load = leader_move.Load(where, clients=3, prefix="after:")
    load.start()
    try:
        out = run("member", "remove", "--id", gone, "--dir", cluster.dir, timeout=120).stdout
        print(out)
    finally:
        load.finish()
    assert f"replica {gone} removed" in out, out
    m = members(cluster)
    assert m["membership"]["voters"] == sorted({0, 1, 2, 3} - {gone}), m
    roles = {r["id"]: r["role"] for r in cluster.status()["replicas"]}
    assert roles[gone] == "removed", roles
    check_load(cluster, load, where, tmp_path / "remove")
    # The removed replica stays out: cluster.toml says so, and a replica
    # started under its id refuses with a reason.
    toml = (cluster.dir / "cluster.toml").read_text()
    assert "removed = true" in toml, toml
    res = run(
        "replica", "--config", cluster.dir / "cluster.toml", "--id", gone, check=False, timeout=30
    )
    assert res.returncode == 2 and "taken out of the cluster" in res.stderr, res.stderr


def test_remove_the_leader(cluster, tmp_path):
    """The leader hands over first, then its removal commits; the others
    go on serving, and the change is refused when it would leave no voter."""
    where = up_redis(cluster)
    out = run("member", "add", "--dir", cluster.dir, timeout=180).stdout
    assert "replica 3 is a voter" in out, out
    leader = cluster.leader()
    load = leader_move.Load(where, clients=2)
    load.start()
    try:
        out = run("member", "remove", "--id", leader, "--dir", cluster.dir, timeout=120).stdout
        print(out)
        assert f"leadership moved from replica {leader}" in out, out
        follow_leader(cluster, where)
        assert f"replica {leader} removed" in out, out
    finally:
        load.finish()
    m = members(cluster)
    assert leader not in m["membership"]["voters"] and len(m["membership"]["voters"]) == 3, m
    assert m["leader"] != leader
    check_load(cluster, load, where, tmp_path)
    # A bad request gets a reason, and nothing changes.
    res = run("member", "remove", "--id", 9, "--dir", cluster.dir, check=False, timeout=60)
    assert res.returncode != 0 and "no such replica" in res.stderr, res.stderr
    assert members(cluster)["membership"] == m["membership"]
    assert os.path.exists(cluster.dir / "cluster.toml")


def test_a_learner_comes_by_state_transfer_and_survives_a_kill(cluster):
    """The leader's log no longer holds the start (checkpoints every 200
    entries): the learner fetches a checkpoint, which carries the
    configuration at its index, and the log after it. Killed while it
    catches up, it comes back and catches up again; promoted, its redis
    equals the others'."""
    cluster.up(
        app="redis",
        extra=(
            "--election-timeout-ms",
            f"{ELECTION_MS[0]}-{ELECTION_MS[1]}",
            "--checkpoint-entries",
            "200",
            "--backup-grace-s",
            "1",
        ),
    )
    client = Redis(cluster.client_addr())
    load(client, 0, 6000)
    cluster.wait(lambda s: s["replicas"][s["leader"]]["first_index"] > 1, 60, "a truncated log")
    out = run("member", "add", "--learner", "--dir", cluster.dir, timeout=180).stdout
    assert "replica 3 added as a learner" in out, out
    load(client, 6000, 2000)  # more to catch up with while it fetches
    os.kill(cluster.pid(3), signal.SIGKILL)
    run("cluster", "restart", "--id", 3, "--dir", cluster.dir, timeout=120)
    load(client, 8000, 500)
    # Caught up, and its redis identical to the others' BEFORE it votes.
    digest = assert_same_data(cluster, timeout=60)
    assert digest[1] == 8500, digest
    assert members(cluster)["membership"]["learners"] == [3]
    out = run("member", "promote", "--id", 3, "--dir", cluster.dir, timeout=180).stdout
    assert "replica 3 is a voter" in out, out
    load(client, 8500, 100)
    client.close()
    log = (cluster.dir / "replica-3.log").read_text()
    assert "state transfer:" in log, log[-3000:]
    assert "this replica is a voter" in log, log[-3000:]
    assert members(cluster)["membership"]["voters"] == [0, 1, 2, 3]
    digest = assert_same_data(cluster, timeout=60)
    assert digest[1] == 8600, digest


def test_three_to_five_to_three(cluster, tmp_path):
    """Two replicas added (5 voters: a majority is 3), then two of the first
    removed, the leader among them, under load: nothing acknowledged lost."""
    where = up_redis(cluster)
    load = leader_move.Load(where, clients=2)
    load.start()
    try:
        for new in (3, 4):
            out = run("member", "add", "--dir", cluster.dir, timeout=180).stdout
            assert f"replica {new} is a voter" in out, out
        assert members(cluster)["membership"]["voters"] == [0, 1, 2, 3, 4]
        leader = cluster.leader()
        gone = [leader, next(r for r in range(3) if r != leader)]
        for r in gone:
            out = run("member", "remove", "--id", r, "--dir", cluster.dir, timeout=120).stdout
            assert f"replica {r} removed" in out, out
            follow_leader(cluster, where)
    finally:
        load.finish()
    m = members(cluster)
    assert m["membership"]["voters"] == sorted({0, 1, 2, 3, 4} - set(gone)), m
    assert m["leader"] not in gone
    check_load(cluster, load, where, tmp_path)


def test_a_replica_added_on_namespace_hosts(cluster):
    """On `--hosts netns` the new replica gets a namespace and an address of
    its own on the bridge, the others' firewalls let it in, it catches up
    and votes; `cluster down` removes its namespace with the rest."""
    import tomllib

    from netns import run_in_netns  # eval/netns.py
    from test_netns_hosts import namespaces, redis_on

    cluster.up(app="redis", transport="tcp", extra=["--hosts", "netns"])
    conf = tomllib.loads((cluster.dir / "cluster.toml").read_text())
    client_ns = conf["cluster"]["client_netns"]

    def incr(n):
        addr = cluster.client_addr()
        return [redis_on(addr, "INCR", "k") for _ in range(n)][-1]

    assert run_in_netns(client_ns, lambda: incr(20)) == 20
    out = run("member", "add", "--dir", cluster.dir, timeout=180).stdout
    assert "replica 3 is a voter" in out, out
    conf = tomllib.loads((cluster.dir / "cluster.toml").read_text())
    new = conf["replica"][3]
    assert new["netns"] in namespaces(), new
    assert new["host"] not in [r["host"] for r in conf["replica"][:3]], conf["replica"]
    assert run_in_netns(client_ns, lambda: incr(5)) == 25
    assert members(cluster)["membership"]["voters"] == [0, 1, 2, 3]
    cluster.wait(
        lambda s: all(
            r["applied_index"] >= s["replicas"][s["leader"]]["commit_index"] for r in s["replicas"]
        ),
        30,
        "every replica caught up",
    )
    addrs = [(r["host"], r["server_port"]) for r in conf["replica"]]
    values = run_in_netns(client_ns, lambda: [redis_on(a, "GET", "k", inspect=True) for a in addrs])
    assert values == [b"25"] * 4, values
    run("cluster", "down", "--dir", cluster.dir)
    assert new["netns"] not in namespaces()
