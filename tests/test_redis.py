"""An unmodified redis on three replicas: clients talk to the leader's copy,
every backup's copy ends up with the same data (DEBUG DIGEST), and nothing
reaches the leader's redis before a majority has it."""

import os
import signal
import socket
import threading
import time

import pytest
from resp import Redis, RespError


def digests(cluster, timeout=10.0):
    """DEBUG DIGEST and DBSIZE of every replica's own redis; a replica whose
    redis does not answer within `timeout` gives what went wrong instead."""
    out = []
    for r, st in enumerate(cluster.status()["replicas"]):
        if st["role"] == "removed":  # taken out of the cluster (lockstep member remove)
            continue
        try:
            c = Redis(cluster.server_addr(r), inspect=True, timeout=timeout)
        except OSError as e:  # a restarted replica's redis may not be up yet
            out.append((f"replica {r}: {e!r}", None))
            continue
        try:
            out.append((c.call("DEBUG", "DIGEST"), c.call("DBSIZE")))
        except (OSError, RespError) as e:
            # Busy or going away, not an answer: a lagging replica's redis
            # between two parts of a large replayed input, one frozen for a
            # checkpoint, a deposed leader whose connection stays open until
            # it applies the new leader's CLOSE (its input of the old ballot
            # is never agreed), a leader that stepped down and closed it.
            out.append((f"replica {r}: {e!r}", None))
        finally:
            c.close()
    return out


def assert_same_data(cluster, timeout=15.0):
    """Backups replay asynchronously: wait until every redis holds the same
    data (each asked again while it does not answer, until the deadline)."""
    end = time.monotonic() + timeout
    while True:
        d = digests(cluster, timeout=max(1.0, min(10.0, end - time.monotonic())))
        if len(set(d)) == 1 and d[0][1] is not None:
            return d[0]
        if time.monotonic() > end:
            raise AssertionError(f"replicas differ: {d}\n{cluster.status()}")
        time.sleep(0.1)


def call_through_leader(cluster, *args, attempts=10, timeout=120):
    """One idempotent command through whoever leads, sent again on a new
    connection when a leader change closes it (as any client under
    lockstep must); returns the reply."""
    for attempt in range(attempts):
        c = None
        try:
            c = Redis(cluster.client_addr(timeout=30), timeout=timeout)
            return c.call(*args)
        except ConnectionError as e:  # reset or closed: a leader change
            print(f"{args[0]}: attempt {attempt + 1}: {e!r} (a leader change); sending again")
            time.sleep(0.5)
        finally:
            if c is not None:
                c.close()
    raise AssertionError(f"{args[0]} failed {attempts} times")


@pytest.fixture
def redis_cluster(cluster):
    cluster.up(app="redis")
    return cluster


def test_commands_pipelines_and_large_values(redis_cluster):
    c = Redis(redis_cluster.client_addr())
    assert c.call("SET", "greeting", "hello") == "OK"
    assert c.call("GET", "greeting") == b"hello"
    assert [c.call("INCR", "n") for _ in range(5)] == [1, 2, 3, 4, 5]
    assert c.call("MULTI") == "OK"
    assert c.call("INCR", "n") == "QUEUED"
    assert c.call("SET", "in-tx", "yes") == "QUEUED"
    assert c.call("EXEC") == [6, "OK"]
    replies = c.pipeline([("RPUSH", "list", i) for i in range(1000)])
    assert replies == list(range(1, 1001))
    big = os.urandom(1 << 20)
    for i in range(4):
        assert c.call("SET", f"big{i}", big) == "OK"
    assert c.call("GET", "big3") == big
    c.close()
    assert assert_same_data(redis_cluster)[1] == 8


def test_200_concurrent_clients(redis_cluster):
    addr = redis_cluster.client_addr()
    errors = []
    reconnects = []

    def client(i):
        # SET is idempotent, so a client whose connection a leader change
        # closed (2 cores shared by 3 replicas and 200 clients) may retry it.
        c = None
        for j in range(10):
            for attempt in range(5):
                try:
                    if c is None:
                        c = Redis(addr if attempt == 0 else redis_cluster.client_addr(), timeout=30)
                    c.call("SET", f"client:{i}", j)
                    break
                except (OSError, RespError) as e:
                    reconnects.append(f"client {i}: {e!r}")
                    c = None
            else:
                errors.append(f"client {i}: gave up after 5 attempts")
                return
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    c = Redis(redis_cluster.client_addr())
    assert [c.call("GET", f"client:{i}") for i in range(200)] == [b"9"] * 200
    c.close()
    assert assert_same_data(redis_cluster)[1] == 200


def test_client_disconnecting_mid_command(redis_cluster):
    addr = redis_cluster.client_addr()
    for i in range(20):
        s = socket.create_connection(addr)
        whole = Redis.encode("SET", f"half{i}", "x" * 1000)
        s.sendall(whole[: len(whole) // 2])
        s.close()
    # Connections that open and close at once, in a loop.
    for _ in range(300):
        socket.create_connection(addr).close()
    c = Redis(addr)
    assert c.call("SET", "after", "ok") == "OK"
    assert c.call("EXISTS", "half0") == 0
    c.close()
    assert assert_same_data(redis_cluster)[1] == 1


def test_64mib_in_one_go(redis_cluster):
    value = os.urandom(64 << 20)
    # 192 MiB through three daemons and servers on 2 cores may starve a
    # leader past the election timeout (it did under ASan, on a loaded CI
    # machine): its clients' connections are then closed, and a client
    # sends again to the new leader, as any client under lockstep must.
    # Every command here is idempotent; the leader may change between them.
    assert call_through_leader(redis_cluster, "SET", "huge", value) == "OK"
    assert call_through_leader(redis_cluster, "STRLEN", "huge") == 64 << 20
    assert call_through_leader(redis_cluster, "SET", "small", "1") == "OK"
    # A replica that lost the lead replays 64 MiB before it answers again.
    assert assert_same_data(redis_cluster, timeout=120)[1] == 2


def test_leader_sees_nothing_without_a_majority(redis_cluster):
    s = redis_cluster.status()
    leader = s["leader"]
    backups = [r["pid"] for r in s["replicas"] if r["id"] != leader]
    c = Redis(redis_cluster.client_addr(), timeout=10)
    assert c.call("SET", "before", "1") == "OK"
    for pid in backups:
        os.kill(pid, signal.SIGSTOP)
    try:
        c.sock.sendall(Redis.encode("SET", "during", "1"))
        c.sock.settimeout(1.5)
        # redis answers a SET at once: no answer means it never saw the SET.
        with pytest.raises(socket.timeout):
            c.reply()
    finally:
        for pid in backups:
            os.kill(pid, signal.SIGCONT)
    c.sock.settimeout(10)
    assert c.reply() == "OK"
    c.close()
    # Cut off from a majority, the leader stepped down; whoever leads now
    # closed the connections accepted under the old ballot. Reconnect.
    c = Redis(redis_cluster.client_addr())
    assert c.call("GET", "during") == b"1"
    c.close()
    assert_same_data(redis_cluster)


@pytest.mark.parametrize("which", [0, 1])
def test_one_backup_stopped_does_not_stop_clients(redis_cluster, which):
    # Each backup in turn, stopped in the middle of one client's stream: the
    # leader rings only the backup its commits wait for (peer_link.cc,
    # thrifty doorbells), so one of the two runs stops that backup.
    s = redis_cluster.status()
    backup = [r for r in s["replicas"] if r["id"] != s["leader"]][which]
    c = Redis(redis_cluster.client_addr(), timeout=5)
    for i in range(50):
        assert c.call("SET", f"k{i}", i) == "OK"
    os.kill(backup["pid"], signal.SIGSTOP)
    try:
        for i in range(50, 150):
            assert c.call("SET", f"k{i}", i) == "OK"
        c.close()
    finally:
        os.kill(backup["pid"], signal.SIGCONT)
    assert assert_same_data(redis_cluster)[1] == 150


def test_leader_killed_clients_move_to_the_new_leader(redis_cluster):
    c = Redis(redis_cluster.client_addr())
    for i in range(100):
        c.call("SET", f"k{i}", i)
    c.close()
    old = redis_cluster.status()["leader"]
    os.kill(redis_cluster.pid(old), signal.SIGKILL)
    s = redis_cluster.wait(
        lambda s: s["leader"] is not None and s["leader"] != old, what="a new leader"
    )
    c = Redis(redis_cluster.client_addr())
    assert c.call("GET", "k99") == b"99"
    assert c.call("SET", "after-failover", "yes") == "OK"
    c.close()
    # The killed replica comes back with an empty redis and replays the log.
    from conftest import run

    run("cluster", "restart", "--dir", redis_cluster.dir, "--id", old)
    assert assert_same_data(redis_cluster, timeout=30)[1] == 101
    assert s["leader"] != old


def test_inspection_connections_to_a_backup_are_not_replicated(redis_cluster):
    s = redis_cluster.status()
    backup = next(r for r in s["replicas"] if r["id"] != s["leader"])
    c = Redis(redis_cluster.server_addr(backup["id"]), inspect=True)
    assert c.call("DBSIZE") == 0
    with pytest.raises(RespError):
        c.call("NOSUCHCOMMAND")
    c.close()


def test_server_started_through_a_wrapper_that_execs_it(cluster):
    # The shim first attaches in `sh`, which then execs redis under the same
    # pid: the shim in redis must attach again, or redis would serve
    # unreplicated while the daemon saw the wrapper attach.
    cluster.up(
        extra=(
            "--",
            "sh -c 'exec redis-server --port {port} --bind 127.0.0.1 --dir {dir} --save \"\" --protected-mode no --enable-debug-command local'",
        )
    )
    c = Redis(cluster.client_addr())
    assert c.pipeline([("SET", f"k{i}", i) for i in range(100)]) == ["OK"] * 100
    s = cluster.status()
    assert s["replicas"][s["leader"]]["commit_index"] > 0, s
    _digest, size = assert_same_data(cluster)
    assert size == 100


def test_a_forked_child_that_serves_no_client_runs_on(redis_cluster):
    # BGSAVE forks a child that writes the data to disk and touches no
    # client: the shim lets it be (only a forked process that serves a
    # client is refused, tests/test_bad_input.py), and every replica goes on.
    c = Redis(redis_cluster.client_addr())
    assert c.pipeline([("SET", f"k{i}", i) for i in range(100)]) == ["OK"] * 100
    assert c.call("BGSAVE") in ("Background saving started", "OK")
    end = time.monotonic() + 20
    while b"rdb_bgsave_in_progress:0" not in c.call("INFO", "persistence"):
        assert time.monotonic() < end, "BGSAVE did not finish"
        time.sleep(0.1)
    assert b"rdb_last_bgsave_status:ok" in c.call("INFO", "persistence")
    assert c.call("SET", "after", "bgsave") == "OK"
    c.close()
    assert all(r["role"] != "down" for r in redis_cluster.status()["replicas"])
    assert assert_same_data(redis_cluster)[1] == 101
