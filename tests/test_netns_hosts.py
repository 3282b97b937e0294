"""`lockstep cluster up --hosts netns` (issue 11): each replica, its daemon and
its redis, in a network namespace of its own with its own address, bridged to
the others and to a client namespace; UCX over tcp between them.

Clients run in the client namespace: here, on a thread that entered it
(setns(2) moves only the calling thread), so that nothing of the test ever
sends to these addresses from the machine's own namespace, where they do not
exist. The lockstep commands enter it themselves (client_netns in
cluster.toml). Killing a leader is a real SIGKILL; cutting one off is its
link taken down in the hub namespace, as a pulled cable would.
"""

import os
import signal
import subprocess
import time
import tomllib

from conftest import run
from netns import run_in_netns  # eval/netns.py (conftest puts eval/ on sys.path)
from resp import Redis


def namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in r.stdout.splitlines() if line.strip()}


def config(cluster):
    return tomllib.loads((cluster.dir / "cluster.toml").read_text())


def redis_on(addr, *cmd, inspect=False):
    """One command on a fresh connection to addr, from the current thread
    (inspect=True: a backup's own server, through `lockstep inspect`)."""
    c = Redis(addr, timeout=5, inspect=inspect)
    try:
        return c.call(*cmd)
    finally:
        c.close()


def test_replicas_on_namespace_hosts_fail_over_and_heal(cluster):
    cluster.up(app="redis", transport="tcp", extra=["--hosts", "netns"])
    conf = config(cluster)
    client_ns = conf["cluster"]["client_netns"]
    mine = {r["netns"] for r in conf["replica"]} | {client_ns}
    assert mine <= namespaces() and len(mine) == 4, (mine, namespaces())
    hosts = [r["host"] for r in conf["replica"]]
    assert len(set(hosts)) == 3 and not any(h.startswith("127.") for h in hosts), hosts
    log = (cluster.dir / "replica-0.log").read_text()
    assert f"transport tcp, durability disk, peers on {hosts[0]}:" in log, log[-2000:]
    # Status names the client namespace, and says how to run a client there.
    assert cluster.status()["client_netns"] == client_ns
    shown = run("cluster", "status", "--dir", cluster.dir).stdout
    assert f"ip netns exec {client_ns} CLIENT ARGS" in shown, shown

    # Writes through the leader's address, from the client namespace.
    def incr_n(n):
        addr = cluster.client_addr()
        return [redis_on(addr, "INCR", "k") for _ in range(n)][-1]

    assert run_in_netns(client_ns, lambda: incr_n(20)) == 20
    # ... and through the address that follows the leader, without status.
    host, port = conf["cluster"]["leader_address"].rsplit(":", 1)
    follows = (host, int(port))
    assert cluster.status()["leader_address"] == conf["cluster"]["leader_address"]
    assert run_in_netns(client_ns, lambda: redis_on(follows, "INCR", "k")) == 21

    # The leader's daemon SIGKILLed: another leads, nothing acknowledged lost,
    # and the leader address moved with it.
    old = cluster.leader()
    os.kill(cluster.pid(old), signal.SIGKILL)
    new = cluster.wait(lambda s: s["leader"] not in (None, old), 30, "a new leader")["leader"]
    assert run_in_netns(client_ns, lambda: incr_n(4)) == 25

    def through_follows():
        end = time.monotonic() + 10
        while True:  # the new leader takes the address once it serves
            try:
                return redis_on(follows, "INCR", "k")
            except OSError:
                assert time.monotonic() < end, "the leader address never reached the new leader"
                time.sleep(0.05)

    assert run_in_netns(client_ns, through_follows) == 26
    took = f"took the leader address {conf['cluster']['leader_address']}"
    said = lambda: (cluster.dir / f"replica-{new}.log").read_text()
    end = time.monotonic() + 5  # logged once its gratuitous ARPs are out
    while took not in said() and time.monotonic() < end:
        time.sleep(0.05)
    assert took in said(), said()[-2000:]
    run("cluster", "restart", "--dir", cluster.dir, "--id", old)
    assert run_in_netns(client_ns, lambda: redis_on(follows, "INCR", "k")) == 27

    # The leader cut off by its link: the other two elect one and serve on;
    # once the link is back, the old leader follows and catches up.
    cluster.wait(lambda s: all(r["role"] != "down" for r in s["replicas"]), 30, "every replica")
    cut = cluster.leader()
    hub = next(ns for ns in namespaces() if ns.endswith("-hub") and ns.startswith(client_ns[:8]))
    subprocess.run(["ip", "-n", hub, "link", "set", f"r{cut}", "down"], check=True)
    try:
        cluster.wait(lambda s: s["leader"] not in (None, cut), 30, "a leader on the other side")
        assert run_in_netns(client_ns, lambda: incr_n(2)) == 29
        assert run_in_netns(client_ns, through_follows) == 30
    finally:
        subprocess.run(["ip", "-n", hub, "link", "set", f"r{cut}", "up"], check=True)

    def caught_up(s):
        lead = s["leader"]
        return lead is not None and all(
            r["applied_index"] == s["replicas"][lead]["commit_index"] for r in s["replicas"]
        )

    st = cluster.wait(caught_up, 60, "every replica caught up after the partition healed")
    assert st["replicas"][cut]["role"] == "backup", st
    addrs = [(r["host"], r["server_port"]) for r in conf["replica"]]
    # (DEBUG DIGEST is for local connections only, and these are not.)
    sizes = run_in_netns(client_ns, lambda: [redis_on(a, "DBSIZE", inspect=True) for a in addrs])
    values = run_in_netns(client_ns, lambda: [redis_on(a, "GET", "k", inspect=True) for a in addrs])
    assert sizes == [1] * 3 and values == [b"30"] * 3, (sizes, values)

    run("cluster", "down", "--dir", cluster.dir)
    assert not (mine | {hub}) & namespaces(), namespaces()


def test_down_removes_the_namespaces_of_a_crashed_tool(cluster):
    # Everything of the cluster killed as a crash would leave it, and its
    # cluster.toml gone too (an `up` that died half-way): down still finds
    # the namespaces it made (DIR/netns) and removes them.
    cluster.up(app="redis", transport="tcp", extra=["--hosts", "netns"])
    made = set((cluster.dir / "netns").read_text().split())
    assert len(made) == 5 and made <= namespaces()
    st = cluster.status()
    for r in st["replicas"]:
        for pid in (r["pid"], r["server_pid"]):
            if pid:
                os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    (cluster.dir / "cluster.toml").unlink()
    p = run("cluster", "down", "--dir", cluster.dir)
    assert "removed 5 network namespaces" in p.stdout, p.stdout
    assert not made & namespaces()
    assert not (cluster.dir / "netns").exists()
    # And with nothing left, down says there is no cluster.
    assert run("cluster", "down", "--dir", cluster.dir, check=False).returncode != 0


def test_netns_hosts_refuse_shm(cluster):
    p = cluster.up(transport="shm", extra=["--hosts", "netns"], check=False)
    assert p.returncode != 0 and "shm does not cross namespaces" in p.stderr, p.stderr
    p = cluster.up(extra=["--hosts", "vlan"], check=False)
    assert p.returncode != 0 and "--hosts: 'vlan' is not loopback or netns" in p.stderr, p.stderr


def _listening_ports(netns, pid, host):
    """The TCP ports process pid listens on at host inside netns."""
    r = subprocess.run(
        ["ip", "netns", "exec", netns, "ss", "-Hltnp"], capture_output=True, text=True, check=True
    )
    ports = set()
    for line in r.stdout.splitlines():
        addr, port = line.split()[3].rsplit(":", 1)
        if f"pid={pid}," in line and addr in (host, "0.0.0.0", "*"):
            ports.add(int(port))
    return ports


def _reaches(addr, timeout=0.5):
    """True when a TCP connection to addr opens from the current thread."""
    import socket

    try:
        socket.create_connection(addr, timeout=timeout).close()
        return True
    except OSError:
        return False


def test_only_replicas_reach_a_replicas_peer_and_ucx_ports(cluster):
    # UCX's tcp transport checks no key at the target: whoever reaches the
    # port it listens on can write into the replica's log region. On
    # namespace hosts each replica's firewall lets only the other replicas
    # reach anything but its client, server and metrics ports.
    cluster.up(app="redis", transport="tcp", extra=["--hosts", "netns"])
    conf = config(cluster)
    client_ns = conf["cluster"]["client_netns"]
    rep = conf["replica"][0]
    pid = cluster.pid(0)
    ports = _listening_ports(rep["netns"], pid, rep["host"])
    ucx = ports - {rep["peer_port"], rep["client_port"], rep["metrics_port"]}
    assert rep["peer_port"] in ports and ucx, ports  # UCX listens on ports of its own
    closed = [rep["peer_port"], *sorted(ucx)]
    reached = run_in_netns(
        client_ns,
        lambda: {
            p: _reaches((rep["host"], p))
            for p in closed + [rep["client_port"], rep["metrics_port"]]
        },
    )
    assert reached == {
        **{p: False for p in closed},
        rep["client_port"]: True,
        rep["metrics_port"]: True,
    }, reached
    # The replicas themselves still agree (over those very ports), and clients are served.
    assert run_in_netns(client_ns, lambda: redis_on(cluster.client_addr(), "SET", "k", "v")) == "OK"
    assert (
        run_in_netns(
            client_ns, lambda: redis_on(cluster.client_addr(), "SET", "after-the-firewall", "1")
        )
        == "OK"
    )
    # Agreed over those very ports: replica 0's log holds the write (a raw
    # proposal is refused where a server runs).
    cluster.wait(
        lambda _: any("after-the-firewall" in v for _, _, v in cluster.log(0)),
        10,
        "the write in replica 0's log",
    )
