"""No client is served without consensus: a write a client got "OK" for is in
the log and on every replica, around leader changes and restores too.

A backup's redis answers inspection connections (DEBUG DIGEST, DBSIZE: the
tests' own checks use them), which pass straight through its shim and are
never agreed. The bug found here: such a connection stayed open and kept
being served when its replica became the leader, so a client that had
connected to a backup (or to a leader address that went stale) had its
SETs executed and acknowledged at unreplicated speed, in no log and on no
other replica. The shim now gives such a connection EOF once its replica
leads. A client connection a backup accepts is now closed unread unless
it is its daemon's inspection (`lockstep inspect`, eval/inspector.py), so
a client holding a stale leader address is refused, not served, and so is
one from a privileged source port (issue 27, hole 1: that was the
inspectors' rule before, and anyone who could bind one wrote outside the
log).
"""

import os
import signal
import socket
import struct
import threading
import time

import pytest
from conftest import run, writable_redis_profile
from resp import Redis, RespError
from test_redis import assert_same_data, digests


def keys_everywhere(cluster, keys):
    """{replica: keys it lacks}, empty when every replica holds every key."""
    missing = {}
    for r in range(len(cluster.status()["replicas"])):
        c = Redis(cluster.server_addr(r), inspect=True)
        try:
            lack = [k for k in keys if c.call("EXISTS", k) != 1]
        finally:
            c.close()
        if lack:
            missing[r] = lack
    return missing


def on_no_replica(cluster, key):
    """True when no replica's redis holds key."""
    for r in range(len(cluster.status()["replicas"])):
        c = Redis(cluster.server_addr(r), inspect=True)
        try:
            if c.call("EXISTS", key) != 0:
                return False
        finally:
            c.close()
    return True


def tracked_client(cluster, timeout=15.0):
    """A connection to the leader's redis that the leader accepted as the
    leader: the leader and its ballot are the same before the connection
    and after a first reply on it (the reply means it was accepted and its
    input agreed). Retries (bounded) otherwise."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = cluster.status()
        if s["leader"] is None:
            time.sleep(0.05)
            continue
        leader, ballot = s["leader"], s["replicas"][s["leader"]]["ballot"]
        try:
            c = Redis(cluster.server_addr(leader), timeout=5)
            if c.call("PING") != "PONG":
                c.close()
                continue
        except (OSError, RespError):
            time.sleep(0.05)
            continue
        s = cluster.status()
        if s["leader"] == leader and s["replicas"][leader]["ballot"] == ballot:
            return c, leader
        c.close()
    raise AssertionError(f"no stable leader to connect to: {cluster.status()}")


def refused(conn, *command, wait=2.0):
    """True when `command` on conn gets no reply (EOF, reset or silence)."""
    try:
        conn.sock.sendall(Redis.encode(*command))
        r = conn.reply(deadline=time.monotonic() + wait)
    except (OSError, TimeoutError, ConnectionError):
        return True
    return r is None


def wait_serving(cluster, timeout=15.0):
    """Waits until the leader serves clients (a SET through it succeeds)."""
    c, leader = tracked_client(cluster, timeout)
    assert c.call("SET", f"serving-{time.monotonic_ns()}", "1") == "OK"
    c.close()
    return leader


def kill_daemon(cluster, replica):
    os.kill(cluster.pid(replica), signal.SIGKILL)


def new_leader(cluster, old):
    return cluster.wait(
        lambda s: s["leader"] is not None and s["leader"] != old, 15, "a new leader"
    )["leader"]


@pytest.fixture
def redis_cluster(cluster, tmp_path):
    # Inspections pass every byte (no inspect_commands): what these tests
    # show is the shim's own rule, not the relay's read-only filter.
    cluster.up(app=writable_redis_profile(tmp_path))
    return cluster


def test_connection_accepted_by_a_backup_is_not_served_once_it_leads(redis_cluster):
    c = redis_cluster
    client, leader = tracked_client(c)
    assert client.call("SET", "before", "1") == "OK"
    client.close()
    backups = [r for r in range(3) if r != leader]
    inspect = {b: Redis(c.server_addr(b), timeout=5, inspect=True) for b in backups}
    for b in backups:  # inspection still works on a backup
        assert inspect[b].call("EXISTS", "before") in (0, 1)
    kill_daemon(c, leader)
    now = new_leader(c, leader)
    wait_serving(c)
    # The connection its redis accepted as a backup must not be served now:
    # before the fix this SET answered OK in ~0.5 ms, and the key was on the
    # new leader only, never in the log.
    assert refused(inspect[now], "SET", "unagreed", "x"), "a leader served an inspection connection"
    other = next(b for b in backups if b != now)
    assert inspect[other].call("EXISTS", "before") == 1  # a backup's still is
    for conn in inspect.values():
        conn.close()
    run("cluster", "restart", "--dir", c.dir, "--id", leader)
    client, _ = tracked_client(c)
    assert client.call("SET", "after", "1") == "OK"
    assert client.call("EXISTS", "unagreed") == 0
    client.close()
    assert_same_data(c, timeout=30)
    assert not keys_everywhere(c, ["before", "after"])
    assert on_no_replica(c, "unagreed")


def test_acknowledged_writes_survive_leader_changes(redis_cluster):
    """Writers keep sending unique SETs through leader kills and restarts,
    to the leader and to the old leader's port, and open connections to
    every replica before each change; every OK must be a write that every
    replica holds at the end, and the replicas must agree."""
    c = redis_cluster
    acked, lock, stop = [], threading.Lock(), threading.Event()
    errors = []
    target = {"port_of": None}  # the old leader's server address, during a change
    # Set by the stubborn client while it holds no connection and waits: the
    # old leader is restarted (as a backup, whose redis answers inspection
    # connections unreplicated, by design) only then.
    idle = threading.Event()

    def writer(name):
        conn, n = None, 0
        end = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < end:
            try:
                if conn is None:
                    conn, _ = tracked_client(c, timeout=10)
                key = f"{name}-{n}"
                n += 1
                conn.sock.sendall(Redis.encode("SET", key, "v"))
                if conn.reply(deadline=time.monotonic() + 5) == "OK":
                    with lock:
                        acked.append(key)
            except (OSError, TimeoutError, ConnectionError, RespError, AssertionError) as e:
                if isinstance(e, AssertionError):
                    errors.append(str(e))
                if conn:
                    conn.close()
                conn = None
                time.sleep(0.01)
        if conn:
            conn.close()

    def stubborn():
        """Connects to the old leader's port while it is down, keeps sending."""
        n = 0
        end = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < end:
            addr = target["port_of"]
            if addr is None:
                idle.set()
                time.sleep(0.005)
                continue
            idle.clear()
            try:
                conn = Redis(addr, timeout=1)
                for _ in range(50):
                    if target["port_of"] is None:
                        break
                    key = f"stubborn-{n}"
                    n += 1
                    conn.sock.sendall(Redis.encode("SET", key, "v"))
                    if conn.reply(deadline=time.monotonic() + 1) == "OK":
                        with lock:
                            acked.append(f"{key} (port {addr[1]})")
                conn.close()
            except (OSError, TimeoutError, ConnectionError, RespError):
                time.sleep(0.005)

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(2)]
    threads.append(threading.Thread(target=stubborn))
    for t in threads:
        t.start()
    try:
        for _round in range(3):
            time.sleep(0.7)
            leader = c.leader()
            backups = [r for r in range(3) if r != leader]
            inspect = {b: Redis(c.server_addr(b), timeout=5, inspect=True) for b in backups}
            addr = c.server_addr(leader)
            kill_daemon(c, leader)
            target["port_of"] = addr  # its redis dies with its daemon: nothing may answer
            now = new_leader(c, leader)
            wait_serving(c)
            assert refused(inspect[now], "SET", f"unagreed-{_round}", "x")
            for conn in inspect.values():
                conn.close()
            target["port_of"] = None  # the old leader comes back as a backup
            idle.clear()
            assert idle.wait(10), "the stubborn client did not let go"
            run("cluster", "restart", "--dir", c.dir, "--id", leader)
        time.sleep(0.7)
    finally:
        stop.set()
        target["port_of"] = None
        for t in threads:
            t.join(90)
    assert not errors, errors[:3]
    assert len(acked) > 50, len(acked)
    assert_same_data(c, timeout=30)
    stubborn_acks = [k for k in acked if k.startswith("stubborn")]
    assert not stubborn_acks, f"the dead old leader's port answered: {stubborn_acks[:5]}"
    missing = keys_everywhere(c, acked)
    assert not missing, (
        {r: (len(k), k[:5]) for r, k in missing.items()},
        digests(c),
        c.status(),
    )
    # Backups get inputs only from the log: a key on every replica is in it.
    assert all(on_no_replica(c, f"unagreed-{i}") for i in range(3))


@pytest.fixture
def checkpoint_cluster(cluster, tmp_path):
    # Inspections pass every byte, as redis_cluster's.
    cluster.up(app=writable_redis_profile(tmp_path), extra=("--checkpoint-entries", "50"))
    return cluster


def test_backup_restored_from_a_checkpoint_then_leading(checkpoint_cluster):
    c = checkpoint_cluster
    client, leader = tracked_client(c)
    for b in range(0, 300, 10):
        assert client.pipeline([("SET", f"k{i}", i) for i in range(b, b + 10)]) == ["OK"] * 10
    client.close()
    b = next(r for r in range(3) if r != leader)
    run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir)
    old = c.status()["replicas"][b]["server_pid"]
    os.kill(old, signal.SIGKILL)
    c.wait(
        lambda s: (
            s["replicas"][b]["server_pid"] not in (0, old)
            and (s["replicas"][b].get("checkpoint") or {}).get("restores") == 1
        ),
        20,
        f"replica {b}'s server restored",
    )
    # Make b the leader: kill whoever leads until b does (bounded).
    inspect = None
    for _ in range(10):
        leader = c.leader()
        if leader == b:
            break
        if inspect:
            inspect.close()
        inspect = Redis(c.server_addr(b), timeout=5, inspect=True)  # accepted while b is a backup
        assert inspect.call("DBSIZE") >= 300
        kill_daemon(c, leader)
        new_leader(c, leader)
        run("cluster", "restart", "--dir", c.dir, "--id", leader)
    assert c.leader() == b, "replica b never led in 10 leader changes"
    wait_serving(c)
    assert refused(inspect, "SET", "unagreed", "x")
    inspect.close()
    before = c.status()["replicas"][b]["commit_index"]
    client, now = tracked_client(c)
    assert now == b
    assert client.call("SET", "restored-leader", "yes") == "OK"
    client.close()
    assert c.status()["replicas"][b]["commit_index"] > before
    assert_same_data(c, timeout=30)
    assert not keys_everywhere(c, ["restored-leader", "k0", "k299"])
    assert on_no_replica(c, "unagreed")


def test_a_client_of_a_backup_or_a_stale_leader_address_is_refused(redis_cluster):
    """A client (an ordinary source port) that reaches a replica's server
    while that replica does not lead is closed unread, whether it picked a
    backup or holds the address of a leader that has since lost its place;
    the write lands nowhere, and the server's log says why. An inspection
    (`lockstep inspect`) is still answered."""
    c = redis_cluster
    leader = wait_serving(c)
    b = next(r for r in range(3) if r != leader)
    assert refused(Redis(c.server_addr(b), timeout=3), "SET", "sent-to-a-backup", "1")
    inspect = Redis(c.server_addr(b), timeout=3, inspect=True)
    assert inspect.call("EXISTS", "sent-to-a-backup") == 0
    inspect.close()

    # The old leader's address goes stale: it dies, another leads, and it
    # comes back as a backup on the same address.
    stale = c.server_addr(leader)
    kill_daemon(c, leader)
    new_leader(c, leader)
    run("cluster", "restart", "--dir", c.dir, "--id", leader)
    c.wait(lambda s: s["replicas"][leader]["role"] == "backup", 30, f"replica {leader} back")
    assert c.server_addr(leader) == stale
    end = time.monotonic() + 20
    while True:  # its server is being started again: refused means it answered the accept
        try:
            conn = Redis(stale, timeout=3)
            break
        except OSError:
            assert time.monotonic() < end, "the old leader's server never listened again"
            time.sleep(0.1)
    assert refused(conn, "SET", "sent-to-a-stale-leader", "1")
    conn.close()
    wait_serving(c)
    assert on_no_replica(c, "sent-to-a-backup")
    assert on_no_replica(c, "sent-to-a-stale-leader")
    for r in (b, leader):
        log = (c.dir / f"replica-{r}" / "server.log").read_text(errors="replace")
        assert "this replica does not lead" in log, f"replica {r}'s server.log:\n{log[-2000:]}"
    assert_same_data(c, timeout=30)


def test_a_replay_connection_is_taken_only_from_its_daemon(redis_cluster):
    # A backup's daemon replays each client connection of the leader over a
    # connection of its own to its server, from a port it bound and marked
    # for the shim (issue 27, hole 2). The shim took any connection from a
    # marked port number as that replay connection, whatever its address,
    # and a second one replaced the first: a process elsewhere that picked
    # the same port numbers (here 127.0.0.2, another loopback address) fed
    # the backup's redis its own SET as the log's. Now it is refused, and
    # the replay goes on.
    import socket
    import subprocess

    from test_checkpoint import backups
    from test_divergence import reports
    from test_prevention import wait_applied

    c = redis_cluster
    client = Redis(c.client_addr())
    assert client.call("SET", "k0", "v0") == "OK"
    wait_applied(c)
    b = backups(c)[0]
    host, port = c.server_addr(b)
    ss = subprocess.run(
        ["ss", "-Htn", "state", "established", "dst", f"{host}:{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ports = [int(line.split()[2].rsplit(":", 1)[1]) for line in ss.splitlines()]
    assert ports, f"no replay connection to replica {b}'s server: {ss}"
    attackers = []
    for p in ports:
        s = socket.socket()
        s.bind(("127.0.0.2", p))
        s.settimeout(5)
        try:
            s.connect((host, port))
            s.sendall(b"*3\r\n$3\r\nSET\r\n$2\r\nk0\r\n$6\r\nforged\r\n")
        except OSError:
            pass  # refused at once: as good
        attackers.append(s)
    for i in range(1, 21):
        assert client.call("SET", f"k{i}", "v") == "OK"
    wait_applied(c)
    for s in attackers:
        s.close()
    assert Redis(c.server_addr(b), inspect=True).call("GET", "k0") == b"v0"
    assert_same_data(c)
    assert reports(c) == []
    log = (c.dir / f"replica-{b}" / "server.log").read_text()
    assert "refused a connection from 127.0.0.2" in log, log[-2000:]


def privileged_connection(addr):
    """A connection to addr from a source port below 1024 (the harness runs
    as root), or None when the server refused it at once."""
    for port in range(600, 1024):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.settimeout(3)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            s.close()
            continue
        try:
            s.connect(addr)
        except OSError:
            s.close()
            return None
        conn = Redis.__new__(Redis)
        conn.sock, conn.buf = s, b""
        return conn
    raise AssertionError("no privileged port free")


def test_a_privileged_source_port_is_no_inspector(cluster):
    """Issue 27, hole 1: a backup's server used to serve, unreplicated, any
    connection from a source port below 1024, so that whoever could bind one
    wrote outside the log (SET pwn 1 to every replica's server_addr, then
    GET pwn through client_addr said 1). Now only its daemon's inspections
    are served there: such a connection is closed unread, before and after
    a failover, and the server's log says so."""
    c = cluster
    c.up(app="redis")
    leader = wait_serving(c)

    def attack_backups(leader):
        for r in range(3):
            if r == leader:
                continue  # its server_addr is client_addr: a client, through the log
            conn = privileged_connection(c.server_addr(r))
            assert conn is None or refused(conn, "SET", "pwn", "1"), f"replica {r} served it"
            if conn:
                conn.close()

    attack_backups(leader)
    client = Redis(c.client_addr())
    assert client.call("GET", "pwn") is None
    client.close()
    kill_daemon(c, leader)
    now = new_leader(c, leader)
    wait_serving(c)
    client = Redis(c.client_addr())
    assert client.call("GET", "pwn") is None  # the new leader was a backup attacked above
    client.close()
    run("cluster", "restart", "--dir", c.dir, "--id", leader)
    c.wait(lambda s: s["replicas"][leader]["role"] == "backup", 30, f"replica {leader} back")
    wait_serving(c)
    attack_backups(now)
    client = Redis(c.client_addr())
    assert client.call("GET", "pwn") is None
    client.close()
    assert on_no_replica(c, "pwn")
    for r in range(3):
        if r != now:
            log = (c.dir / f"replica-{r}" / "server.log").read_text(errors="replace")
            assert "this replica does not lead" in log, f"replica {r}'s server.log:\n{log[-2000:]}"
    assert_same_data(c, timeout=30)


def inspect(c, r, *args, config=None, input=None):
    ref = ("--config", config) if config else ("--dir", c.dir)
    return run("inspect", *ref, "--id", r, *args, check=False, input=input)


def test_lockstep_inspect_reads_a_backup_read_only_and_logs_it(cluster, tmp_path):
    c = cluster
    c.up(app="redis")
    client = Redis(c.client_addr())
    assert client.pipeline([("SET", f"k{i}", i) for i in range(7)]) == ["OK"] * 7
    client.close()
    leader = c.leader()
    b = next(r for r in range(3) if r != leader)
    c.wait(lambda s: s["replicas"][b]["applied_index"] >= 7, 10, "the backup applied")
    p = inspect(c, b, "--", "redis-cli", "-p", "{port}", "DBSIZE")
    assert p.returncode == 0 and p.stdout.strip() == "7", (p.stdout, p.stderr)
    # stdin/stdout, like nc: a write is answered with an error, not executed
    p = inspect(c, b, input="GET k3\r\nSET pwn 1\r\nDBSIZE\r\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[:4] == [
        "$1",
        "3",
        (
            "-ERR lockstep inspect: 'SET' is not among this profile's inspect_commands "
            "(inspection is read-only)"
        ),
        ":7",
    ], p.stdout
    p = inspect(c, b, "--", "redis-cli", "-p", "{port}", "SET", "pwn", "1")
    assert "not among this profile's inspect_commands" in p.stdout, (p.stdout, p.stderr)
    assert on_no_replica(c, "pwn")
    # The leader: a client of its server, through the log.
    p = inspect(c, leader, "--", "redis-cli", "-p", "{port}", "GET", "k6")
    assert p.returncode == 0 and p.stdout.strip() == "6", (p.stdout, p.stderr)
    # Without the admin credential: a client's copy of cluster.toml, or a
    # wrong admin secret, is refused.
    blog = c.dir / f"replica-{b}.log"
    opened_before = blog.read_text(errors="replace").count(": opened, ")
    text = (c.dir / "cluster.toml").read_text()
    client_copy = c.dir / "client.toml"  # beside keys/, as a client machine has it
    client_copy.write_text(
        "\n".join(line for line in text.splitlines() if "admin_secret" not in line)
    )
    p = inspect(c, b, "--", "redis-cli", "-p", "{port}", "DBSIZE", config=client_copy)
    assert p.returncode != 0, (p.stdout, p.stderr)
    assert "admin credential" in p.stderr or "wrong admin secret" in p.stderr, p.stderr
    wrong = c.dir / "wrong.toml"
    wrong.write_text(
        "\n".join(
            'admin_secret = "00000000000000000000000000000000"' if "admin_secret" in line else line
            for line in text.splitlines()
        )
    )
    p = inspect(c, b, "--", "redis-cli", "-p", "{port}", "DBSIZE", config=wrong)
    assert p.returncode != 0 and "wrong admin secret" in p.stderr, (p.stdout, p.stderr)
    # Logged: who, what it ran, the commands and the refusals.
    log = blog.read_text(errors="replace")
    assert "running 'redis-cli -p {port} DBSIZE'" in log, log[-3000:]
    assert "commands: DBSIZE x1" in log, log[-3000:]
    assert "refused: SET x1" in log, log[-3000:]
    assert "by admin from 127.0.0.1" in log, log[-3000:]
    assert "refused an unauthenticated admin connection" in log, log[-3000:]
    assert log.count(": opened, ") == opened_before, log[-3000:]  # none without the credential
    assert_same_data(c, timeout=30)
