"""Tarantool (apps/tarantool.toml) on three replicas: the stand-in for MongoDB
(space `docs`, documents in memory) and SSDB (space `kv`, an LSM tree on
disk). Its network thread reads requests and its transaction thread executes
them: serial_inputs with serial_until_reply keeps them in the log's order on
every replica; the greeting (instance UUID, random salt) is not compared.

The replicas' spaces are read through each replica's own server (an
inspection connection: reads only) once every replica applied the log.
"""

import json
import shutil
import socket
import time

import inspector
import pytest
from conftest import app_profile, kill_leader_during, on_threads, run

tarantool = pytest.importorskip("tarantool", reason="the tarantool connector (requirements.txt)")

pytestmark = pytest.mark.skipif(
    not shutil.which("tarantool"), reason="tarantool is not installed (setup)"
)


def connect(addr):
    host, port = addr
    # Reconnecting is ours to do (to whoever leads), not the connector's.
    return tarantool.Connection(
        host, port, connection_timeout=10, socket_timeout=20, reconnect_max_attempts=0
    )


def load(addr_of, clients, n, retry=False):
    """`clients` connections each inserting n documents, replacing a key and
    selecting by owner per step; with `retry`, a request that fails (its
    leader gone) is sent again through whoever leads then."""

    def client(k):
        c = connect(addr_of())
        try:
            for i in range(n):
                for attempt in range(50):
                    try:
                        c.replace("docs", (k * 100000 + i, f"owner{i % 7}", {"n": i, "k": k}))
                        c.replace("kv", (f"key{i % 50}", f"v{k}-{i}"))
                        got = c.select("docs", f"owner{i % 7}", index="owner", limit=3)
                        assert len(got) >= 1, got
                        break
                    except (tarantool.error.NetworkError, OSError):
                        if not retry or attempt == 49:
                            raise
                        time.sleep(0.2)
                        c.close()
                        c = connect(addr_of())
        finally:
            c.close()

    on_threads(client, clients)


def spaces(addr):
    """Spaces docs and kv of one replica's own server (an inspection
    connection: the connector cannot pick its source port, so a Relay)."""
    with inspector.Relay(addr) as local:
        c = connect(local)
        try:
            return [list(map(list, c.select("docs"))), list(map(list, c.select("kv")))]
        finally:
            c.close()


def assert_same_spaces(cluster, docs, keys=50):
    def applied(s):
        lead = s["replicas"][s["leader"]]["commit_index"] if s["leader"] is not None else -1
        return all(r["applied_index"] == lead for r in s["replicas"] if r["role"] != "down")

    st = cluster.wait(applied, 60, "every replica applied the whole log")
    seen = {
        r["id"]: spaces(cluster.server_addr(r["id"])) for r in st["replicas"] if r["role"] != "down"
    }
    lead = seen[st["leader"]]
    assert len(lead[0]) == docs and len(lead[1]) == keys, (len(lead[0]), len(lead[1]))
    differ = [r for r, v in seen.items() if v != lead]
    assert not differ, f"replicas {differ} differ from the leader {st['leader']}"
    if len(seen) == len(st["replicas"]):  # `divergence list` asks every replica
        reports = json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)
        assert reports == []


def test_four_clients_leave_identical_spaces(cluster):
    cluster.up(app="tarantool")
    load(cluster.client_addr, clients=4, n=150)
    assert_same_spaces(cluster, 4 * 150)


def test_leader_killed_mid_load_clients_go_on_through_the_new_leader(cluster):
    cluster.up(app="tarantool")
    started = time.monotonic()
    kill_leader_during(
        cluster,
        lambda: load(lambda: cluster.client_addr(timeout=20), 2, 300, retry=True),
        lambda: time.monotonic() > started + 1.0,
    )
    assert_same_spaces(cluster, 2 * 300)


def test_bad_input_is_refused_and_the_replicas_stay_alike(cluster):
    cluster.up(app="tarantool")
    host, port = cluster.client_addr()
    # Not MessagePack at all: tarantool drops the connection.
    s = socket.create_connection((host, port))
    s.recv(128)  # the greeting
    s.sendall(b"\xceGARBAGE that is no iproto packet" * 4)
    s.settimeout(10)
    try:
        while s.recv(4096):
            pass
    except (ConnectionResetError, TimeoutError):
        pass
    s.close()
    # A client gone in the middle of a request (its length says 1 MiB more).
    s = socket.create_connection((host, port))
    s.recv(128)
    s.sendall(b"\xce\x00\x10\x00\x00" + b"\x82" + b"x" * 100)
    s.close()
    # Error replies: no such space; a document of 8 MiB, over memtx's
    # largest tuple (1 MiB by default): refused, saying so. One of 512 KiB is taken.
    c = connect((host, port))
    with pytest.raises(tarantool.error.DatabaseError):
        c.insert("no_such_space", (1,))
    with pytest.raises(tarantool.error.DatabaseError, match="tuple is too large"):
        c.replace("docs", (10**9, "big", "x" * (8 << 20)))
    c.replace("docs", (10**9, "big", "x" * (512 << 10)))
    c.close()
    load(cluster.client_addr, clients=2, n=20)
    assert_same_spaces(cluster, 2 * 20 + 1, keys=20)


def test_a_loaded_store_passes_its_state_checks(cluster, tmp_path):
    # The profile's state probe digests every tuple of every user space,
    # through the log: every replica answers it at the same point, so a
    # replica whose spaces differ is reported (kind state). Agreeing
    # replicas report nothing.
    cluster.up(app=app_profile(tmp_path, "tarantool", state_check_every_s=1))
    load(cluster.client_addr, clients=4, n=60)
    # The first check comes with the first input, the next ones once a
    # second while inputs come (one may already cover the load's last).
    st = cluster.wait_state_checks(1)
    print(f"state checks: {st}")
    assert st["failed"] == 0 and len(st["digest"]) == 40, st
    assert st["digest"] != "da39a3ee5e6b4b0d3255bfef95601890afd80709", st  # not of nothing
    assert_same_spaces(cluster, 4 * 60)
