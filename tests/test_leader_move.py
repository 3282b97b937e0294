def test_a_target_that_does_not_catch_up_leaves_the_leader_serving(cluster):
    # The target's disk takes 2 s per write: it cannot hold the entry just
    # proposed within the move's 1 s, so the leader gives up, says why and
    # takes proposals again; nothing changed hands.
    cluster.up(extra=("--failpoints",))
    leader = cluster.leader()
    slow = (leader + 1) % 3
    run("failpoint", "--dir", cluster.dir, "--id", slow, "disk_delay_ms=2000")
    cluster.propose("before")
    t0 = time.monotonic()
    p = run("leader", "move", "--dir", cluster.dir, "--to", slow, check=False)
    took = time.monotonic() - t0
    assert p.returncode != 0, p.stdout
    assert f"replica {slow} did not catch up within 1000 ms" in p.stderr, p.stderr
    assert "this replica leads and serves again" in p.stderr, p.stderr
    assert took < 10, took
    assert cluster.leader() == leader
    cluster.propose("after")
    run("failpoint", "--dir", cluster.dir, "--id", slow, "off")
