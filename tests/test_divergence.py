"""Output checking, divergence reports and repair (guard/output/output_guard.h), with
real redis servers, real CRIU checkpoints and a real fault: a failpoint in
one backup's daemon flips one byte of one input as it is replayed to that
backup's server (LOCKSTEP_FAILPOINT=flip-input:MARKER), or a leader proposes
one with a byte flipped while its own server executes it as sent
(flip-proposal:MARKER)."""

import json
import os
import re
import signal
import threading
import time

import pytest
from conftest import run, writable_redis_profile
from resp import Memcached, Redis
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


def one_repaired_report(cluster, b):
    """Waits for the first report that is no longer repairing; it must be the
    only one, of backup b, repaired. Returns it."""
    rs = wait_reports(
        cluster, lambda rs: any(r["status"] != "repairing" for r in rs), 30, "a repaired divergence"
    )
    assert len(rs) == 1, rs
    r = rs[0]
    assert r["replica"] == b and not r["leader_diverged"] and r["status"] == "repaired", r
    return r


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
    assert r["status"] == "repaired" and r["how"] == "rollback" and r["kind"] == "output", r
    assert "rolled back to its checkpoint" in r["action"], r
    assert 0 < r["restored_index"] <= r["log_window"]["to"], r
    assert r["total_ms"] > 0 and r["restore_ms"] > 0, r
    # The connection's inputs in the window, and both replicas' outputs
    # around the first differing byte.
    # (The flipped SET answers "+OK" on both, so the last agreeing check may
    # come after it; the GET whose reply differs is in the window.)
    assert any("GET" in i and "fk" in i for i in r["connection_inputs"]), r["connection_inputs"]
    outs = {o["from_replica"]: o for o in r["outputs"]}
    assert set(outs) == {c.leader(), b}, outs
    assert "flipme-A" in outs[c.leader()]["bytes"] and "flipme-@" in outs[b]["bytes"], outs
    assert r["first_difference"] >= r["agreed_offset"], r
    leader_bytes = outs[c.leader()]["bytes"]
    at = r["first_difference"] - outs[c.leader()]["start"]
    assert leader_bytes[at] == "A", (leader_bytes, at)
    # The divergent server's stack at the send of that byte, named.
    # (Debian's redis-server is a link to redis-check-rdb: the file mapped.)
    assert r["stack"].startswith(f"replica {b}'s server, at the send of bytes"), r["stack"]
    # (Under ASan an unnamed frame may come between its write interceptor and
    # _writeToClient: seen once in a sanitized run.)
    assert re.search(r"\n#[12] _writeToClient\+0x", r["stack"]), r["stack"]
    assert "aeMain+0x" in r["stack"], r["stack"]
    # Repaired: every replica holds the same data, the backup's fk is right.
    assert_same_data(c)
    assert Redis(c.server_addr(b), inspect=True).call("GET", "fk") == b"flipme-A"
    # People read it too.
    shown = run("divergence", "show", r["id"], "--dir", c.dir).stdout
    assert f"replica {b} diverged" in shown and "rollback" in shown and ">>" in shown, shown
    assert "\n                #1 _writeToClient+0x" in shown, shown
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
    # After the fact: with the cluster stopped, the reports are read from
    # each replica's directory (a post-mortem is when people read them).
    run("cluster", "down", "--dir", c.dir, "--quiet")
    p = run("divergence", "list", "--json", "--dir", c.dir)
    assert [x["id"] for x in json.loads(p.stdout)] == [r["id"]], p.stdout
    assert "did not answer" in p.stderr and "read its reports in" in p.stderr, p.stderr
    shown = run("divergence", "show", r["id"], "--dir", c.dir).stdout
    assert f"replica {b} diverged" in shown and "rollback" in shown, shown


def test_a_backup_that_closes_a_connection_the_leader_keeps_is_detected(redis_cluster):
    # One backup's redis gets `ECHO "closeme#` (the failpoint flips the
    # closing quote): unbalanced quotes, a protocol error, and redis closes
    # the connection, where the leader's echoes and goes on serving it. The
    # backup's stream ends at another length, before it was handed the
    # client's later commands: a backup behind may yet catch up, one whose
    # stream ended never will, so this is judged a divergence all the same.
    import socket

    c = redis_cluster
    client = Redis(c.client_addr())
    load(client, 0, 1000)
    b = backups(c)[0]
    wait_checkpoint(c, b, above=50)
    restart_with_failpoint(c, b, 'ECHO "closeme')
    assert reports(c) == []
    s = socket.create_connection(c.client_addr(), timeout=10)
    got = b""

    def ask(request, want):
        nonlocal got
        s.sendall(request)
        while not got.endswith(want):
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk

    ask(b'ECHO "closeme"\r\n', b"$7\r\ncloseme\r\n")  # the leader's reply
    for i in range(12):  # the leader's stream grows past the backup's end
        ask(f"SET after-close{i} x\r\n".encode(), b"+OK\r\n" * (i + 1))
    r = one_repaired_report(c, b)
    assert r["how"] == "rollback", r
    outs = {o["from_replica"]: o for o in r["outputs"]}
    assert "Protocol error" in outs[b]["bytes"] and "closeme" in outs[c.leader()]["bytes"], outs
    s.close()
    assert_same_data(c)


@pytest.mark.parametrize("checkpoints", ["none taken yet", "off"])
def test_a_divergent_backup_without_a_checkpoint_replays_the_whole_log(
    cluster, checkpoints, tmp_path
):
    # Before: a divergence found before any checkpoint was taken (or with
    # checkpoints off) could not be repaired ("no good checkpoint"), though
    # the backup held the whole log: the empty server it started as is the
    # oldest checkpoint of all.
    extra = ["--no-checkpoints"] if checkpoints == "off" else []
    cluster.up(app=writable_redis_profile(tmp_path), extra=extra)
    client = Redis(cluster.client_addr())
    for i in range(20):
        assert client.call("INCR", "n") == i + 1
    b = backups(cluster)[0]
    cluster.wait(lambda s: s["replicas"][b]["applied_index"] >= 20, 10, "the backup applied")
    # An inspection connection changes the backup's copy behind the log's back.
    assert Redis(cluster.server_addr(b), inspect=True).call("INCR", "n") == 21
    assert client.call("INCR", "n") == 21  # the leader's reply; the backup's says 22
    rs = wait_reports(
        cluster, lambda rs: any(r["status"] != "repairing" for r in rs), 30, "a repair"
    )
    assert len(rs) == 1 and rs[0]["replica"] == b, rs
    r = rs[0]
    assert r["status"] == "repaired" and r["how"] == "rollback", r
    assert "started its server afresh" in r["action"] and r["restored_index"] == 0, r
    assert_same_data(cluster)
    assert Redis(cluster.server_addr(b), inspect=True).call("GET", "n") == b"21"


def test_identical_replicas_report_nothing_and_are_checked(redis_cluster):
    c = redis_cluster

    def connections():
        clients = [Redis(c.client_addr()) for _ in range(4)]
        for i, cl in enumerate(clients):
            load(cl, i * 100, 100, prefix=f"c{i}-")
            assert cl.call("GET", f"c{i}-{i * 100 + 5}") == b"v%d" % (i * 100 + 5)
        big = b"x" * 200_000  # past the 64 KiB marks of a stream
        for _ in range(3):
            assert clients[0].call("SET", "big", big) == "OK"
            assert clients[0].call("GET", "big") == big
        for cl in clients:
            cl.close()

    _, st = c.judged_run(connections, ends=4)  # every connection's end judged on every backup
    assert_same_data(c)
    assert st["checks"] >= 4, st  # a quiet connection is checked too
    assert st["divergences"] == 0 and reports(c) == [], (st, reports(c))
    for b in backups(c):
        assert output_status(c, b)["points_sent"] > 0


def test_replies_larger_than_a_socket_buffer_reach_the_backups_checks(redis_cluster):
    # A backup's daemon reads its server's replies (to discard them) only
    # once a replay socket holds kReplyBatchBytes or the server closes it: a
    # reply far larger than any socket buffer must still flow, or the
    # backup's output would stop short and be judged a length divergence.
    c = redis_cluster
    huge = os.urandom(8 << 20)

    def replies():
        cl = Redis(c.client_addr(), timeout=60)
        assert cl.call("SET", "huge", huge) == "OK"
        for _ in range(2):
            assert cl.call("GET", "huge") == huge
        assert cl.call("SET", "after", "1") == "OK"
        cl.close()

    # Its end judged on every backup (a length divergence included: a
    # backup's end that the leader's never meets is settled after 2 s).
    _, st = c.judged_run(replies)
    assert_same_data(c)
    assert st["divergences"] == 0 and reports(c) == [], (st, reports(c))


def cut_reply(cluster, key, first=1000):
    """GETs `key` on a connection of its own and resets it (SO_LINGER 0)
    after the reply's first bytes: a client that leaves mid-reply (as ab -t
    does at its end). The leader's server's sends fail (or it reads the
    reset) and its stream stops there; the backups', fed by replay
    connections their daemons read, send the whole reply. Returns what the
    client got."""
    import socket
    import struct

    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the reply waits in the server
    s.settimeout(30)
    s.connect(cluster.client_addr())
    s.sendall(b"GET %s\r\n" % key.encode())
    got = b""
    while len(got) < first:
        chunk = s.recv(first - len(got))
        assert chunk, got
        got += chunk
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # a reset: the rest of the reply reaches no one
    return got


def test_a_client_that_leaves_mid_reply_is_no_divergence(redis_cluster):
    # Before: the leader's stream stopped where its client reset the
    # connection, the backups' went on to the reply's end, and the backups,
    # ending alike, outvoted the leader: a false divergence report (the
    # pattern of gerbera under ab -t, whose clients leave mid-reply at the
    # end of the run). The leader's shim marks the stream cut (LS_OUT_CUT):
    # the backups' bytes before the cut are compared, the ones past it are
    # output no client could receive.
    c = redis_cluster
    value = os.urandom(16 << 20)
    keep = Redis(c.client_addr(), timeout=60)
    assert keep.call("SET", "huge", value) == "OK"
    got = []
    _, st = c.judged_run(lambda: got.append(cut_reply(c, "huge")))
    assert got[-1].startswith(b"$%d\r\n" % len(value)) and value[:100] in got[-1]
    assert st["divergences"] == 0 and reports(c) == [], (st, reports(c))
    # The rest of the reply, past the failed send (redis writes at most 64 KiB a
    # call) or past the reset: not compared. Usually a backup's points land
    # there (past_cut). A fresh-clone run under load once judged every end
    # with past_cut 0 and no divergence (why no backup point fell past the
    # cut there is not established): what this test is for is the latter,
    # so the count is shown, not required.
    print(f"points past the cut: {st['past_cut']}")
    assert st["suspended"] == [], st
    # Served and checked on as before, and the replicas hold the same data.
    assert keep.call("GET", "huge") == value
    keep.close()
    assert_same_data(c)
    assert reports(c) == []


def test_a_backup_whose_reply_differs_before_the_cut_is_still_detected(cluster):
    # The cut leaves out only what no client could receive: a backup whose
    # bytes before it differ (its redis stored "flipme-@", the leader's
    # "flipme-A", near the reply's start) is reported and rolled back.
    # Checkpoints by hand only: the 16 MiB SET is 64 entries, and one taken
    # among them, after the flipped one and before the difference is seen,
    # would hold the divergence (the rollback to it then diverges again and
    # a transfer follows: another report, and more time for a leader change
    # to interrupt the repair under ASan).
    cluster.up(app="redis", extra=("--checkpoint-entries", "1000000"))
    c = cluster
    client = Redis(c.client_addr(), timeout=60)
    load(client, 0, 1000)
    b = backups(c)[0]
    out = run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir).stdout
    assert "taken" in out, out
    restart_with_failpoint(c, b, "flipme-")
    assert reports(c) == []
    value = b"flipme-A" + os.urandom(16 << 20)
    assert client.call("SET", "huge", value) == "OK"
    got = cut_reply(c, "huge")
    assert b"flipme-A" in got
    rs = wait_reports(
        c,
        lambda rs: rs and all(r["status"] != "repairing" for r in rs),
        60,
        "every report repaired or closed",
    )
    for r in rs:
        print({k: r.get(k) for k in ("id", "replica", "leader_diverged", "status", "error")})
    # Found in the bytes both sent, by the leader, about replica b.
    first = min(rs, key=lambda r: r["found_unix_ms"])
    assert first["replica"] == b and not first["leader_diverged"], first
    assert first["first_difference"] < 100, first
    # A leadership move mid-repair (seen under ASan) closes the first leader's
    # report as interrupted. The next leader checks afresh: if b's repair had
    # not ended, it reports b again (outvoted when b itself leads, plainly when
    # the third replica does). Whichever way it went, every report is about b,
    # each before the last was interrupted, none failed, and the replicas end
    # with the same data.
    assert all(r["replica"] == b for r in rs), rs
    rs = sorted(rs, key=lambda r: r["found_unix_ms"])
    assert all(r["status"] == "interrupted" for r in rs[:-1]), rs
    assert rs[-1]["status"] in ("repaired", "interrupted"), rs
    client.close()
    # An interrupted repair goes on at b (a 16 MiB state transfer, slow under
    # ASan) while nothing waits for a report.
    assert_same_data(c, timeout=120)


def test_unknown_report_id_is_a_clear_error(redis_cluster):
    r = run("divergence", "show", "7-123", "--dir", redis_cluster.dir, check=False)
    assert r.returncode != 0 and "no divergence report 7-123" in r.stderr, r
    r = run("divergence", "bogus", "--dir", redis_cluster.dir, check=False)
    assert r.returncode == 2 and "unknown command 'bogus'" in r.stderr, r


def test_a_divergent_leader_steps_down_is_repaired_and_clients_move(cluster, monkeypatch):
    """The leader in the minority. Every daemon has flip-proposal:MARKER armed,
    which only a leader acts on (guard/server/server_output.cc): it proposes the
    client's input with one byte flipped while its own redis executes it as
    sent. The log is the reference: the backups replay it, agree with each
    other and not with the leader. The leader hands over to one of them,
    takes a checkpoint from a replica that agreed, replays, and is checked
    again; its clients are cut off and reconnect to the new leader."""
    monkeypatch.setenv("LOCKSTEP_FAILPOINT", "flip-proposal:leadflip-")
    cluster.up(app="redis", extra=("--checkpoint-entries", "50"))
    monkeypatch.delenv("LOCKSTEP_FAILPOINT")
    c = cluster
    client = Redis(c.client_addr())
    load(client, 0, 1000)  # 100 entries: every backup takes its turns (each 50)
    client.close()
    for b in backups(c):
        wait_checkpoint(c, b, above=50)
    assert reports(c) == []
    old = c.leader()

    # Writers keep going through the change: every OK is a write to keep.
    acked, stop = [], threading.Event()

    def writer():
        conn, n = None, 0
        while not stop.is_set():
            try:
                if conn is None:
                    conn = Redis(c.client_addr(timeout=30), timeout=5)
                key = f"w{n}"
                n += 1
                if conn.call("SET", key, "x") == "OK":
                    acked.append(key)
            except (OSError, TimeoutError, AssertionError):
                if conn:
                    conn.close()
                conn = None
            time.sleep(0.005)
        if conn:
            conn.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        victim = Redis(c.client_addr())  # a client of the old leader
        t0 = time.monotonic()
        assert victim.call("SET", "fk", "leadflip-A") == "OK"  # the log says "leadflip-@"
        assert victim.call("GET", "fk") == b"leadflip-A"  # the leader's redis; the backups' differ
        rs = wait_reports(
            c,
            lambda rs: any(r["status"] != "repairing" and len(r["outputs"]) == 2 for r in rs),
            60,
            "a finished repair, and the repaired server's output",
        )
        took = time.monotonic() - t0
        time.sleep(0.5)  # writes at the new leader
    finally:
        stop.set()
        t.join()
    assert len(rs) == 1, rs
    r = rs[0]
    agreeing = sorted(set(range(3)) - {old})
    assert r["leader_diverged"] and r["replica"] == old and r["leader"] == old, r
    assert r["agreeing"] == agreeing, r
    assert r["status"] == "repaired" and r["how"] == "step down", r
    assert f"handed leadership over to replica {r['new_leader']}" in r["action"], r
    assert "took checkpoint" in r["action"] and "from a peer" in r["action"], r
    assert r["new_leader"] in agreeing and r["new_leader_ms"] > 0 and r["total_ms"] > 0, r
    assert 0 < r["restored_index"] and r["restore_ms"] > 0, r
    assert not any("leadflip-A" in i for i in r["connection_inputs"]), r  # the log's bytes
    assert any("leadflip-@" in i for i in r["connection_inputs"]), r["connection_inputs"]
    # What the leader's client got, then what the repaired server sends
    # there (as the backups did), and the first byte that differs.
    got, right = r["outputs"]
    assert got["from_replica"] == right["from_replica"] == old, r["outputs"]
    assert "leadflip-A" in got["bytes"] and "leadflip-@" in right["bytes"], r["outputs"]
    assert r["first_difference"] >= 0, r
    assert got["bytes"][r["first_difference"] - got["start"]] == "A", r
    assert right["bytes"][r["first_difference"] - right["start"]] == "@", r
    print(
        f"\nnew leader {r['new_leader_ms']:.1f} ms after the verdict, repaired in "
        f"{r['total_ms']:.1f} ms (restore {r['restore_ms']:.1f} ms); "
        f"{took:.2f} s from the GET to the finished report"
    )

    # The new leader is the successor; clients of the old one were cut off.
    s = c.wait(lambda s: s["leader"] == r["new_leader"], 10, "the new leader")
    assert s["replicas"][old]["role"] == "backup", s
    assert s["client_addr"] == s["replicas"][r["new_leader"]]["server_addr"], s
    with pytest.raises(OSError) as cut:
        victim.call("GET", "fk")
    assert not isinstance(cut.value, TimeoutError), "the old leader's connection is still open"
    victim.close()

    # A client reconnecting to client_addr reads everything acknowledged.
    new = Redis(c.client_addr())
    assert acked, "no write was acknowledged during the change"
    for at in range(0, 1000, 100):
        got = new.pipeline([("GET", f"k{i}") for i in range(at, at + 100)])
        assert got == [b"v%d" % i for i in range(at, at + 100)], at
    for at in range(0, len(acked), 100):
        keys = acked[at : at + 100]
        assert new.pipeline([("GET", k) for k in keys]) == [b"x"] * len(keys), keys
    assert new.call("GET", "fk") == b"leadflip-@"  # as the log has it, everywhere now
    assert new.call("SET", "after", "moved") == "OK" and new.call("GET", "after") == b"moved"
    # The old leader is repaired: same data everywhere, its fk as the log says.
    assert_same_data(c, timeout=30)
    assert Redis(c.server_addr(old), inspect=True).call("GET", "fk") == b"leadflip-@"

    # Checked again: the old leader reports to the new one, which agrees.
    sent = output_status(c, old)["points_sent"]
    checks = output_status(c, r["new_leader"])["checks"]
    before = c.status()
    for i in range(20):
        new.call("SET", f"again{i}", "y")
        assert new.call("GET", f"again{i}") == b"y"
    new.close()
    # The connection's end judged on every backup, the old leader's included.
    st = c.wait_judged(before)
    assert st is not None, "the leader changed again"
    assert len(reports(c)) == 1, reports(c)
    assert st["checks"] > checks and st["suspended"] == [] and st["divergences"] == 0, st
    assert output_status(c, old)["points_sent"] > sent
    shown = run("divergence", "show", r["id"], "--dir", c.dir).stdout
    assert "divergent replica" in shown and "step down" in shown, shown


def test_a_divergent_memcached_backup_is_detected_reported_and_rolled_back(cluster):
    # Output checking is the same for any server: one backup's memcached
    # gets one stored value with a byte flipped (the failpoint, as in
    # tests/test_divergence.py); the next get's reply differs, the leader
    # reports it and the backup rolls back to its CRIU checkpoint.
    cluster.up(app="memcached", extra=("--checkpoint-entries", "20"))
    client = Memcached(cluster.client_addr())
    for i in range(60):
        assert client.store("set", f"k{i}", f"v{i}") == "STORED"
    b = backups(cluster)[0]
    wait_checkpoint(cluster, b, above=0)
    restart_with_failpoint(cluster, b, "flipme-")
    client = Memcached(cluster.client_addr())
    assert client.store("set", "fk", "flipme-A") == "STORED"
    assert client.get("fk") == b"flipme-A"
    end = time.monotonic() + 30
    rs = []
    while time.monotonic() < end:
        rs = json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)
        if rs and all(r["status"] != "repairing" for r in rs):
            break
        time.sleep(0.1)
    assert len(rs) == 1 and rs[0]["replica"] == b, rs
    r = rs[0]
    assert r["status"] == "repaired" and r["how"] == "rollback", r
    outs = {o["from_replica"]: o["bytes"] for o in r["outputs"]}
    assert "flipme-A" in outs[cluster.leader()] and "flipme-@" in outs[b], outs
    assert "memcached" in r["stack"], r["stack"]
    # Repaired: the backup's memcached holds what the leader's does.
    assert Memcached(cluster.server_addr(b), inspect=True).get("fk") == b"flipme-A"
    for r in range(3):
        m = Memcached(cluster.server_addr(r), inspect=True)
        assert [m.get(f"k{i}") for i in range(60)] == [b"v%d" % i for i in range(60)], r
