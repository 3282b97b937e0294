"""A stopped cluster's data is never thrown away unasked: `cluster up` on a
directory that holds a cluster's log refuses, naming what it holds, and
`cluster start` brings that cluster back (each replica from its own log and
checkpoints), after a `cluster down` and after a power cut (every daemon,
keeper and server SIGKILLed at once under load) with every acknowledged
write."""

import os
import signal
import threading
import time
from pathlib import Path

from conftest import run
from resp import Redis
from test_redis import assert_same_data


def write_keys(cluster, prefix, n):
    c = Redis(cluster.client_addr())
    try:
        for i in range(n):
            assert c.call("SET", f"{prefix}{i}", f"v{i}") == "OK"
    finally:
        c.close()


def missing_keys(cluster, keys, timeout=120):
    """The keys (name -> value) that the leader's redis does not hold as
    written. Reads again through the new leader when leadership moves (a
    just-started cluster may hand it to the replica furthest along), as any
    client of lockstep must."""
    todo, missing = list(keys.items()), []
    end = time.monotonic() + timeout
    while todo:
        try:
            c = Redis(cluster.client_addr(timeout=60))
        except OSError:
            assert time.monotonic() < end, "no leader's server answers"
            time.sleep(0.1)
            continue
        try:
            while todo:
                k, v = todo[-1]
                if c.call("GET", k) != v.encode():
                    missing.append(k)
                todo.pop()
        except (OSError, TimeoutError):
            assert time.monotonic() < end, f"reads kept failing; {len(todo)} keys unread"
            time.sleep(0.1)
        finally:
            c.close()
    return missing


def test_up_refuses_a_stopped_clusters_data_and_start_brings_it_back(cluster):
    cluster.up(app="redis")
    write_keys(cluster, "k", 300)
    run("cluster", "down", "--dir", cluster.dir)

    p = cluster.up(app="redis", check=False)
    assert p.returncode != 0, p.stdout
    assert "holds the data of a stopped cluster" in p.stderr, p.stderr
    assert "replica 0: log entries 1.." in p.stderr, p.stderr
    assert "lockstep cluster start --dir" in p.stderr and "--wipe" in p.stderr, p.stderr
    assert not list(cluster.dir.glob("replica-*.pid")), "a refused `up` started replicas"

    p = run("cluster", "start", "--dir", cluster.dir)
    assert "started again" in p.stdout, p.stdout
    assert missing_keys(cluster, {f"k{i}": f"v{i}" for i in range(300)}) == []
    _, dbsize = assert_same_data(cluster, timeout=60)
    assert dbsize == 300

    # Started twice: refused, the running cluster untouched.
    p = run("cluster", "start", "--dir", cluster.dir, check=False)
    assert p.returncode != 0 and "is running" in p.stderr, p.stderr

    run("cluster", "down", "--dir", cluster.dir)
    cluster.up(app="redis", extra=("--wipe",))
    c = Redis(cluster.client_addr())
    assert c.call("DBSIZE") == 0
    c.close()


def test_start_without_a_cluster_is_a_clear_error(tmp_path):
    p = run("cluster", "start", "--dir", tmp_path, check=False)
    assert p.returncode != 0 and "no cluster in" in p.stderr, p.stderr


def process_tree(root):
    """root and every process below it (by /proc's parent links)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def parent_of(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_power_cut_under_load_then_start_keeps_every_acknowledged_write(cluster):
    # Checkpoints every 150 entries: the replicas come back from a checkpoint
    # and the log after it, not from the log alone.
    cluster.up(app="redis", extra=("--checkpoint-entries", "150"))
    addr = cluster.client_addr()
    acknowledged = {}
    lock = threading.Lock()
    cut = threading.Event()

    def writer(w):
        c = Redis(addr, timeout=5)
        i = 0
        try:
            while not cut.is_set() and i < 100000:
                key, value = f"w{w}-{i}", f"{w}.{i}"
                if c.call("SET", key, value) == "OK":
                    with lock:
                        acknowledged[key] = value
                i += 1
        except (OSError, ConnectionError, EOFError):
            pass  # the power cut ends the connection; what was acknowledged is counted
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    # Under load until a checkpoint exists and more was written after it.
    cluster.wait(
        lambda s: (
            any((r.get("checkpoint") or {}).get("index", 0) > 0 for r in s["replicas"])
            and len(acknowledged) > 600
        ),
        timeout=120,
        what="a checkpoint and 600 acknowledged writes",
    )
    # The power cut: every keeper, daemon, server (and any criu) of the cluster at once.
    status = cluster.status()
    victims = []
    for r in status["replicas"]:
        keeper = parent_of(r["pid"])
        victims += process_tree(keeper if keeper > 1 else r["pid"])
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cut.set()
    for t in threads:
        t.join(timeout=30)
    assert all(not t.is_alive() for t in threads)
    for pid in victims:  # each gone before the start (a zombie is gone)
        end = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.02)
    assert len(acknowledged) > 600
    print(
        f"power cut after {len(acknowledged)} acknowledged writes; killed {len(victims)} processes"
    )

    p = run("cluster", "start", "--dir", cluster.dir, timeout=240)
    assert "started again" in p.stdout, p.stdout
    assert missing_keys(cluster, acknowledged) == []
    _, dbsize = assert_same_data(cluster, timeout=120)
    assert dbsize >= len(acknowledged)


def test_start_makes_a_netns_clusters_namespaces_again(cluster):
    from netns import run_in_netns  # eval/netns.py
    from test_netns_hosts import config, namespaces, redis_on

    cluster.up(app="redis", transport="tcp", extra=["--hosts", "netns"])
    client_ns = config(cluster)["cluster"]["client_netns"]
    mine = {r["netns"] for r in config(cluster)["replica"]} | {client_ns}
    assert run_in_netns(client_ns, lambda: redis_on(cluster.client_addr(), "SET", "a", "1")) == "OK"
    run("cluster", "down", "--dir", cluster.dir)
    assert not mine & namespaces(), "down left namespaces"

    run("cluster", "start", "--dir", cluster.dir)
    assert mine <= namespaces()
    got = run_in_netns(client_ns, lambda: missing_keys(cluster, {"a": "1"}))
    assert got == []
