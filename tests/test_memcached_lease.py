"""Lease reads for memcached (issue 26 item 4; preload/mc_scan.h, preload/shim_rings.c
lease_serve): with `cluster up --lease-us`, the leader's memcached answers a client's
bytes made only of get, gets and mg lines (apps/memcached.toml lease_reads,
lease_protocol = "memcached") without the log while the leader holds its lease. What
must hold, as for redis (test_lease.py): the reads see every acknowledged write, they
never reach a backup and their replies are left out of the hashed output (no
divergence), what is not a plain read still goes through the log, the replicas stay
identical, and a leader that lost its majority answers no read from its own state once
another replica can lead."""

import os
import re
import signal
import time
import urllib.request

from resp import Memcached
from test_memcached import wait_replicas_match

LEASE = ("--lease-us", "35000")


def counts(cluster, r):
    s = cluster.status()["replicas"][r]
    return s["lease_reads"], s["lease_misses"], s["last_index"]


def mg(m, key):
    """`mg KEY v`: the value, or None on a miss."""
    m.sock.sendall(b"mg %s v\r\n" % key.encode())
    head = m._line()
    if head == b"EN":
        return None
    assert head.startswith(b"VA "), head
    return m._exact(int(head.split()[1]) + 2)[:-2]


def raw_get(m, key):
    """`get KEY` (Memcached.get sends gets): the value, or None on a miss."""
    m.sock.sendall(b"get %s\r\n" % key.encode())
    line = m._line()
    if line == b"END":
        return None
    value = m._exact(int(line.split()[3]) + 2)[:-2]
    assert m._line() == b"END"
    return value


def view(keys):
    def read(addr):
        m = Memcached(addr, inspect=True)
        try:
            return {k: m.get(k) for k in keys}
        finally:
            m.close()

    return read


def test_gets_under_the_lease_skip_the_log_and_see_every_write(cluster):
    c = cluster
    c.up(app="memcached", extra=LEASE)
    leader = c.leader()
    s = c.wait(lambda s: s["replicas"][leader]["lease_left_us"] > 0, 10, "the leader's lease")
    for b in (r for r in range(3) if r != leader):
        assert s["replicas"][b]["lease_left_us"] == 0, s["replicas"][b]
    m = Memcached(c.client_addr())
    assert m.store("set", "k", "v0") == "STORED"
    reads_before, misses_before, log_before = counts(c, leader)
    # Each read sees the write acknowledged just before it: get, gets, mg.
    for i in range(200):
        assert m.store("set", "k", f"v{i}") == "STORED"
        assert raw_get(m, "k") == f"v{i}".encode()
        assert m.gets("k")[0] == f"v{i}".encode()
        assert mg(m, "k") == f"v{i}".encode()
    reads, misses, log_after = counts(c, leader)
    served, missed = reads - reads_before, misses - misses_before
    # A lease may lapse for a moment (the VM stops now and then): those reads
    # go through the log, and say so.
    assert served + missed == 600, (served, missed)
    assert served >= 450, f"only {served} of 600 reads under the lease"
    logged = log_after - log_before
    assert logged < 200 + missed + 150, (logged, missed)
    # A multi-key get, and a pipelined batch of reads, are lease reads too.
    assert m.store("set", "k2", "two") == "STORED"
    m.sock.sendall(b"get k k2 nothing\r\nmg k2 v f t\r\n")
    assert m._line() == b"VALUE k 0 4"
    assert m._exact(6) == b"v199\r\n"
    assert m._line() == b"VALUE k2 0 3"
    assert m._exact(5) == b"two\r\n"
    assert m._line() == b"END"
    assert m._line() == b"VA 3 f0 t-1"
    assert m._exact(5) == b"two\r\n"
    # Not a plain read: a set and a get in one batch, gat (it touches), a
    # quiet mg (it may answer nothing), an mg that touches: all through the
    # log, and answered right.
    before = counts(c, leader)[0]
    m.sock.sendall(b"set p 0 0 1\r\n1\r\nget p\r\n")
    assert m._line() == b"STORED"
    assert m._line() == b"VALUE p 0 1"
    assert m._exact(3) == b"1\r\n"
    assert m._line() == b"END"
    m.sock.sendall(b"gat 0 p\r\n")
    assert m._line() == b"VALUE p 0 1"
    assert m._exact(3) == b"1\r\n"
    assert m._line() == b"END"
    m.sock.sendall(b"mg p v T0\r\n")
    assert m._line() == b"VA 1"
    assert m._exact(3) == b"1\r\n"
    assert counts(c, leader)[0] == before
    # A connection that used noreply: its replies can no longer be paired with
    # its requests, so its reads go through the log from then on.
    quiet = Memcached(c.client_addr())
    quiet.sock.sendall(b"set q 0 0 1 noreply\r\nx\r\n")
    assert raw_get(quiet, "q") == b"x"
    assert raw_get(quiet, "q") == b"x"
    assert counts(c, leader)[0] == before
    quiet.close()
    # ... while a fresh connection's are lease reads again.
    assert raw_get(m, "q") == b"x"
    assert counts(c, leader)[0] + counts(c, leader)[1] > before
    m.close()
    # Nothing reported, lease reads on the leader only, and every replica's
    # memcached holds the same items.
    keys = ["k", "k2", "p", "q", "nothing"]
    leader_view = view(keys)(c.server_addr(leader))
    assert leader_view["k"] == b"v199" and leader_view["q"] == b"x"
    wait_replicas_match(c, view(keys), leader_view)
    status = c.status()
    for r in status["replicas"]:
        assert r["output"]["divergences"] == 0, r
        assert r["lease_reads"] == 0 or r["id"] == leader, r
    # The metrics count them too.
    addr = status["replicas"][leader]["metrics_addr"]
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as got:
        text = got.read().decode()
    total = re.search(r"^lockstep_lease_reads_total(?:\{[^}]*\})? (\d+)", text, re.MULTILINE)
    assert total, text
    assert int(total.group(1)) >= served, (total.group(0), served)


def test_no_memcached_lease_without_lease_us(cluster):
    c = cluster
    c.up(app="memcached")
    leader = c.leader()
    m = Memcached(c.client_addr())
    assert m.store("set", "k", "v") == "STORED"
    for _ in range(20):
        assert raw_get(m, "k") == b"v"
    m.close()
    s = c.status()["replicas"][leader]
    assert s["lease_left_us"] == 0 and s["lease_reads"] == 0 and s["lease_misses"] == 0, s


def test_a_memcached_leader_cut_off_answers_no_stale_read(cluster):
    """As test_lease.py's for redis: the leader's daemon stopped (SIGSTOP), its
    memcached goes on running and its shim on reading the lease the daemon last
    published. Once another replica leads and has taken a new write, a get sent
    to the old leader's memcached must not return the old value."""
    c = cluster
    c.up(app="memcached", extra=LEASE)
    old = c.leader()
    c.wait(lambda s: s["replicas"][old]["lease_left_us"] > 0, 10, "the leader's lease")
    stale = Memcached(c.client_addr(), timeout=30)
    assert stale.store("set", "k", "old") == "STORED"
    assert raw_get(stale, "k") == b"old"
    assert counts(c, old)[0] > 0
    pid = c.pid(old)
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        c.wait(
            lambda s: s["leader"] is not None and s["leader"] != old,
            30,
            "a new leader while the old one's daemon is stopped",
        )
        elected_after = time.monotonic() - stopped
        fresh = Memcached(c.client_addr(), timeout=30)
        assert fresh.store("set", "k", "new") == "STORED"
        assert raw_get(fresh, "k") == b"new"
        fresh.close()
        # The old leader's memcached still runs; its lease is long over.
        stale.sock.settimeout(1.0)
        stale.sock.sendall(b"get k\r\n")
        try:
            got = stale._line()
        except TimeoutError:
            got = None  # waiting for the log: right
        assert got is None, f"the cut-off leader answered {got!r} ({elected_after:.3f} s)"
    finally:
        os.kill(pid, signal.SIGCONT)
    # Resumed, it learns of the new ballot: the read it held is never answered
    # from its old state (its connection is closed, or the read is answered
    # with the new value through the log).
    stale.sock.settimeout(20)
    try:
        got = stale._line()
        if got.startswith(b"VALUE"):
            got = stale._exact(int(got.split()[3]) + 2)[:-2]
    except (ConnectionError, OSError):
        got = None
    assert got in (None, b"new"), got
    stale.close()
    leader_view = view(["k"])(c.server_addr(c.leader()))
    assert leader_view == {"k": b"new"}
    wait_replicas_match(c, view(["k"]), leader_view, timeout=30)


def test_a_lease_read_of_an_idle_item_leaves_the_state_checks_alike(cluster):
    """A get of an item untouched for 60 s moves it to the head of its LRU
    (memcached's classic LRU: lru_segmented is off without the maintainer
    thread); under the lease only the leader's memcached does. The state
    probe's `stats cachedump` lists items in LRU order: before its answers were
    compared in an order-free form, the leader's differed from the backups' and
    the state check handed its leadership over (DIVERGENCE 0-1 at byte 372 of
    the probe's connection)."""
    c = cluster
    c.up(app="memcached", extra=LEASE)
    leader = c.leader()
    c.wait(lambda s: s["replicas"][leader]["lease_left_us"] > 0, 10, "the leader's lease")
    m = Memcached(c.client_addr())
    assert m.store("set", "a", "1") == "STORED"
    assert m.store("set", "b", "2") == "STORED"
    time.sleep(63)  # memcached's clock moves with the 1 s ticks in the log
    reads = counts(c, leader)[0]
    assert raw_get(m, "a") == b"1"
    assert counts(c, leader)[0] == reads + 1, "the get was not a lease read"
    checks = c.state_checks().get("checks", 0)
    assert m.store("set", "c", "3") == "STORED"  # a client input: a state check is due
    c.wait_state_checks(checks, timeout=60)
    m.close()
    s = c.status()
    assert s["leader"] == leader, "the leader was handed over"
    for r in s["replicas"]:
        assert r["output"]["divergences"] == 0, r
