"""An unmodified memcached on three replicas: clients on several threads
set, get, incr and cas through the leader, and afterwards every key reads
the same from each replica's own memcached.

The profile runs memcached's four worker threads under serial execution
(apps/memcached.toml), so clients racing on the same keys leave every
replica with the same values and CAS uniques (the racing test). A memcached backup made
to diverge is caught and rolled back in
tests/test_divergence.py."""

import json
import re
import socket
import threading
import time

import pytest
from conftest import app_profile, kill_leader_during, leader_of, run
from resp import Memcached

THREADS = 6
KEYS_PER_THREAD = 40


@pytest.fixture
def memcached_cluster(cluster):
    cluster.up(app="memcached")
    return cluster


def worker(addr, t, errors, cluster=None):
    """Thread t's keys, each set, read, counted and cas'd through the leader;
    failures go into errors. With cluster, a connection the leader closed
    because it stepped down is reopened to whoever leads next and the key in
    hand done again: each key's steps begin with its two sets, so doing them
    again ends the same. A connection closed while the same leader leads
    still fails (Cluster.client_addr_after_leader_change); addr is then
    None, and the leader's address taken with its ballot."""
    try:
        ballot = None
        if cluster:  # addr is then the leader's at the ballot read with it
            addr, ballot = cluster.client_addr_and_ballot()
        m, k = None, 0
        while k < KEYS_PER_THREAD:
            try:
                m = m or Memcached(addr)
                one_key(m, t, k)
                k += 1
            except OSError:
                if cluster is None:
                    raise
                if m:
                    m.close()
                m = None
                addr, ballot = cluster.client_addr_after_leader_change(ballot)
        m.close()
    except (OSError, AssertionError) as e:  # reported by the test
        errors.append(f"thread {t}: {e!r}")


def one_key(m, t, k):
    key = f"t{t}:k{k}"
    assert m.store("set", key, f"v{k}") == "STORED"
    assert m.get(key) == f"v{k}".encode()
    assert m.store("set", f"{key}:n", 10) == "STORED"
    assert m.incr(f"{key}:n", t + 1) == str(10 + t + 1)
    _value, cas = m.gets(key)
    assert m.store("cas", key, f"cas{k}", cas=cas) == "STORED"
    assert m.store("cas", key, "stale", cas=cas) == "EXISTS"


def snapshot(addr):
    m = Memcached(addr, inspect=True)
    out = {}
    for t in range(THREADS):
        for k in range(KEYS_PER_THREAD):
            for key in (f"t{t}:k{k}", f"t{t}:k{k}:n"):
                out[key] = m.get(key)
    m.close()
    return out


def wait_replicas_match(cluster, view, leader_view, timeout=15):
    """Polls view(addr) of every replica's own memcached until each equals
    leader_view (a dict); raises with the differing keys. Returns the number
    of replicas."""
    replicas = len(cluster.status()["replicas"])
    end = time.monotonic() + timeout
    while True:
        views = [view(cluster.server_addr(r)) for r in range(replicas)]
        if all(v == leader_view for v in views):
            return replicas
        if time.monotonic() > end:
            diff = {
                r: {k: (v[k], leader_view[k]) for k in v if v[k] != leader_view[k]}
                for r, v in enumerate(views)
            }
            raise AssertionError(f"replicas differ from the leader: {diff}")
        time.sleep(0.2)


def test_threads_of_clients_and_identical_replicas(memcached_cluster):
    # The clients follow a leader change as any client must (a busy machine
    # once stalled the first leader's daemon right after start, and its
    # backups elected another); a cut while one leader leads still fails.
    c = memcached_cluster
    errors = []
    threads = [threading.Thread(target=worker, args=(None, t, errors, c)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]

    leader_view = snapshot(c.client_addr())
    assert leader_view["t0:k0"] == b"cas0"
    assert leader_view[f"t{THREADS - 1}:k0:n"] == str(10 + THREADS).encode()
    wait_replicas_match(memcached_cluster, snapshot, leader_view)


def test_a_server_without_a_profile_runs_under_double_dash(cluster):
    # Any server command after `--`, with {port} and {dir} filled in per replica.
    cluster.up(extra=("--", "memcached -p {port} -l 127.0.0.1 -U 0 -t 1 -u root"))
    m = Memcached(cluster.client_addr())
    assert m.store("set", "plain", "value") == "STORED"
    assert m.get("plain") == b"value"
    m.close()
    replicas = len(cluster.status()["replicas"])
    end = time.monotonic() + 15
    while True:
        views = []
        for r in range(replicas):
            try:
                c = Memcached(cluster.server_addr(r), inspect=True)
                views.append(c.get("plain"))
                c.close()
            except OSError as e:
                views.append(str(e))
        if views == [b"value"] * replicas:
            break
        assert time.monotonic() < end, f"replicas hold {views}"
        time.sleep(0.1)


RACERS = 16  # connections: memcached hands them to its four worker threads in turn
SHARED_KEYS = 5


def race(addr, t, counted, errors):
    """Connection t's part of the race: on the shared keys in turn, a set, a gets, a cas
    with the unique it read, an append, an increment of the one shared counter and now
    and then a delete or an add. What a command answers depends on the commands of the
    other connections executed before it; only its kind of answer is checked here.
    Acknowledged increments go into counted."""
    ok = {
        "set": {"STORED"},
        "cas": {"STORED", "EXISTS", "NOT_FOUND"},
        "append": {"STORED", "NOT_STORED"},
        "add": {"STORED", "NOT_STORED"},
        "delete": {"DELETED", "NOT_FOUND"},
    }
    try:
        m = Memcached(addr)
        for i in range(40):
            key = f"shared{(t + i) % SHARED_KEYS}"
            said = [("set", m.store("set", key, f"{t}-{i}"))]
            _value, cas = m.gets(key)  # None: deleted since by another connection
            if cas is not None:
                said.append(("cas", m.store("cas", key, f"{t}-{i}-cas", cas=cas)))
            said.append(("append", m.store("append", key, f"+{t}")))
            n = m.incr("racing_counter")
            assert n.isdigit(), f"incr answered {n!r}"
            counted.append(1)
            if i % 7 == t % 7:
                said.append(("delete", m.delete(key)))
            elif i % 7 == (t + 3) % 7:
                said.append(("add", m.store("add", key, f"{t}-{i}-add")))
            bad = [(verb, answer) for verb, answer in said if answer not in ok[verb]]
            assert not bad, f"step {i}: {bad}"
        m.close()
    except (OSError, AssertionError) as e:
        errors.append(f"connection {t}: {e!r}")


def test_connections_racing_on_shared_keys_stay_identical(memcached_cluster):
    # Sixteen connections, spread over memcached's four worker threads, race
    # on the same five keys and one counter, so the order in which the
    # workers execute their commands decides each key's value, its CAS unique
    # (one counter across all stores) and which cas, append, add and delete
    # succeed. Serial execution (the profile's serial_inputs) runs one input
    # at a time in the log's order on every replica: each must end with the
    # leader's values and uniques, no replica's replies may differ from the
    # leader's (0 divergences), and no acknowledged increment may be lost.
    # Passed 20 runs of 20 by hand (`pytest -k racing`, in a loop) before the
    # profile went to -t 4 (issue 26).
    c = memcached_cluster
    addr = c.client_addr()
    assert Memcached(addr).store("set", "racing_counter", 0) == "STORED"
    counted, errors = [], []
    threads = [
        threading.Thread(target=race, args=(addr, t, counted, errors)) for t in range(RACERS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors[:3]
    assert len(counted) == RACERS * 40

    def view(a):
        m = Memcached(a, inspect=True)
        try:
            out = {f"shared{k}": m.gets(f"shared{k}") for k in range(SHARED_KEYS)}
            out["racing_counter"] = m.gets("racing_counter")
            return out
        finally:
            m.close()

    leader_view = view(addr)
    assert leader_view["racing_counter"][0] == str(RACERS * 40).encode(), leader_view
    replicas = wait_replicas_match(c, view, leader_view)
    s = c.wait(
        lambda s: (
            (lead := leader_of(s))
            and all(r["applied_index"] >= lead["commit_index"] for r in s["replicas"])
        ),
        30,
        "every replica applied the race",
    )
    assert [r["output"]["divergences"] for r in s["replicas"]] == [0] * replicas, s
    assert divergence_reports(c) == []


def test_leader_killed_mid_load_clients_go_on_through_the_new_leader(memcached_cluster):
    c = memcached_cluster
    stored = []

    def setter():
        m = Memcached(c.client_addr())
        for i in range(400):
            for _ in range(50):  # a set lost with its leader is sent again
                try:
                    assert m.store("set", f"k{i}", f"v{i}") == "STORED"
                    stored.append(i)
                    break
                except (OSError, ConnectionError):
                    time.sleep(0.2)
                    m.close()
                    try:
                        m = Memcached(c.client_addr(timeout=20))
                    except OSError:
                        pass
            else:
                raise AssertionError(f"k{i} never stored")
        m.close()

    kill_leader_during(c, setter, lambda: len(stored) >= 50)
    m = Memcached(c.client_addr())
    assert [m.get(f"k{i}") for i in range(400)] == [f"v{i}".encode() for i in range(400)]
    m.close()


def test_bad_input_gets_errors_and_the_replicas_stay_alike(memcached_cluster):
    c = memcached_cluster
    addr = c.client_addr()
    m = Memcached(addr)
    # An unknown command, a malformed one, a value over the 1 MiB item limit.
    m.sock.sendall(b"frobnicate key\r\n")
    assert m._line() == b"ERROR"
    m.sock.sendall(b"set k 0 0 notanumber\r\n")
    assert m._line().startswith(b"CLIENT_ERROR")
    assert m.store("set", "huge", b"x" * (2 << 20)).startswith("SERVER_ERROR")
    m.close()
    # A client gone in the middle of a value.
    s = socket.create_connection(addr)
    s.sendall(b"set half 0 0 1000\r\n" + b"y" * 10)
    s.close()
    m = Memcached(addr)
    assert m.store("set", "after", "ok") == "STORED"
    assert m.get("half") is None and m.get("huge") is None
    m.close()

    def view(a):
        v = Memcached(a, inspect=True)
        out = {k: v.get(k) for k in ("after", "half", "huge")}
        v.close()
        return out

    wait_replicas_match(c, view, {"after": b"ok", "half": None, "huge": None})


def test_a_pipelined_batch_executes_whole_before_the_next_connections_input(memcached_cluster):
    # 200 gets of one key sent at once, and a set of that key on another
    # connection right behind them. memcached by default goes back to its
    # event loop after 20 requests of a read, and serial_inputs took that for
    # the end of the input: a backup, where the set is agreed already, ran it
    # after the first 20 gets, the leader, where it was agreed later, after
    # all 200, and the gets' replies differed (the profile's -R makes the
    # batch one input). Every replica's replies must be the leader's.
    c = memcached_cluster
    addr = c.client_addr()
    before = c.status()
    batch, setter = socket.create_connection(addr, 30), socket.create_connection(addr, 30)
    with batch, setter, batch.makefile("rb") as replies, setter.makefile("rb") as stored:
        for n in range(5):
            batch.sendall(b"set k 0 0 3\r\nold\r\n")
            assert replies.readline() == b"STORED\r\n"
            batch.sendall(b"get k\r\n" * 200)
            setter.sendall(b"set k 0 0 3\r\nnew\r\n")
            for _ in range(200):
                assert replies.readline().startswith(b"VALUE k 0 3")
                assert replies.readline() in (b"old\r\n", b"new\r\n")
                assert replies.readline() == b"END\r\n"
            assert stored.readline() == b"STORED\r\n"

    def view(a):
        m = Memcached(a, inspect=True)
        try:
            return {"k": m.get("k")}
        finally:
            m.close()

    wait_replicas_match(c, view, {"k": b"new"})
    # Both connections' ends judged on every backup (a leader change: None).
    assert c.wait_judged(before, ends=2) is not None, c.status()
    assert divergence_reports(c) == []


def divergence_reports(cluster):
    return json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def test_a_loaded_cache_passes_its_state_checks(cluster, tmp_path):
    # The profile's state probe (apps/memcached/state_probe.py) lists and
    # reads every item through the log: every replica answers it at the same
    # point, so one whose items differ is reported (kind state). The clients
    # run one after the other: a quiet, agreeing cluster reports nothing.
    # (With four worker threads the probe once caught a backup whose `cas`
    # had not stored what the leader's did, every reply alike: why the
    # profile runs one.)
    cluster.up(app=app_profile(tmp_path, "memcached", state_check_every_s=1))
    errors = []
    for t in range(THREADS):
        worker(cluster.client_addr(), t, errors)
    assert errors == []
    # The checks go on while clients' inputs moved since the last pass began,
    # so one comes to cover every item the load left (a value and a counter
    # per key); a count read after the load could name a check still in
    # flight from before its end (430 items of 480 once).
    every_item = rf"[0-9a-f]{{40}} {THREADS * KEYS_PER_THREAD * 2} items"
    s = cluster.wait(
        lambda s: re.fullmatch(
            every_item, (leader_of(s).get("state_checks") or {}).get("digest", "")
        ),
        60,
        "a state check covering every item",
    )
    st = leader_of(s)["state_checks"]
    print(f"state checks: {st}")
    assert st["failed"] == 0, st
    assert divergence_reports(cluster) == []
    leader_view = snapshot(cluster.client_addr())
    wait_replicas_match(cluster, snapshot, leader_view)
