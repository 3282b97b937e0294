"""The shim under multi-threaded event loops and every way of waiting.

tools/mt_epoll_server.c waits the way slapd does: worker threads block in
epoll_wait on a shared set before any connection exists, and a listener
thread adds each accepted connection to that set with a pointer in its
event data. slapd died with SIGSEGV on its first client under the shim (5
runs of 6): a wait already in progress was handed the shim's own wake tag
and connection tags. The server checks every event it gets and aborts on a
foreign one, or on an EPOLLONESHOT connection reported to a second thread
before it was re-armed; poll, ppoll, select and pselect each get the
same load through a single waiting thread.

Each case: concurrent clients through the leader get the right replies, no
replica's server ever died, and every replica ends with the same sum.
"""

import socket
import threading
import time

import inspector
import pytest
from conftest import BUILD_DIR

SERVER = BUILD_DIR / "bin" / "mt_epoll_server"
CLIENTS, ADDS = 8, 30


def ask(addr, line):
    """One line's reply, from any replica's server (an inspection connection)."""
    with inspector.connect(addr, timeout=10) as s:
        s.sendall(line)
        return s.makefile("rb").readline()


def run_clients(addr):
    """CLIENTS connections at once, each adding k+1 ADDS times; returns errors."""
    errors = []

    def client(k):
        try:
            with socket.create_connection(addr, timeout=20) as s:
                f = s.makefile("rwb")
                for i in range(ADDS):
                    f.write(b"ADD %d\n" % (k + 1))
                    f.flush()
                    want = b"total %d\n" % ((k + 1) * (i + 1))
                    got = f.readline()
                    if got != want:
                        errors.append(f"client {k} add {i}: {got!r}, expected {want!r}")
                        return
        except OSError as e:
            errors.append(f"client {k}: {e!r}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.mark.parametrize(
    "wait,mode",
    [
        ("epoll", "lt"),
        ("epoll", "et"),
        ("epoll", "oneshot"),
        ("poll", "lt"),
        ("ppoll", "lt"),
        ("select", "lt"),
        ("pselect", "lt"),
    ],
)
def test_threads_waiting_in_epoll_while_another_accepts(cluster, wait, mode):
    cmd = f"{SERVER} --port {{port}} --workers 3 --mode {mode} --wait {wait}"
    cluster.up(extra=("--no-checkpoints", "--", cmd))
    addr = cluster.client_addr()
    assert run_clients(addr) == []
    total = sum((k + 1) * ADDS for k in range(CLIENTS))
    # Every replica executed the same inputs: the sum of every connection's
    # total (closed ones included, once their close was replayed).
    n = len(cluster.status()["replicas"])
    sums = {}

    def same(_status):
        for r in range(n):
            sums[r] = ask(cluster.server_addr(r), b"SUM\n")
        return all(v == b"sum %d\n" % total for v in sums.values())

    try:
        cluster.wait(same, 20, f"every replica's sum at {total}")
    except AssertionError as e:
        raise AssertionError(f"{e}; the replicas' sums: {sums}") from None
    for r in cluster.status()["replicas"]:
        assert r["checkpoint"]["crashes"] == 0, r
        assert r["checkpoint"]["server_state"] == "running", r


def test_edge_triggered_writable_comes_on_edges_not_on_every_wait(cluster):
    # EPOLLIN | EPOLLOUT | EPOLLET, as many event loops register a socket:
    # the shim's kernel registration is level-triggered (it must hear every
    # client byte), so without care a writable socket would be reported on
    # every wait and the server's loop would spin while idle.
    cmd = f"{SERVER} --port {{port}} --workers 3 --mode et-out"
    cluster.up(extra=("--no-checkpoints", "--", cmd))
    addr = cluster.client_addr()
    assert run_clients(addr) == []
    time.sleep(0.5)  # idle: a level-triggered EPOLLOUT would come thousands of times
    outs = int(ask(addr, b"OUTS\n").split()[1])
    # The kernel itself reports an edge-triggered EPOLLOUT again with each
    # input that arrives, so allow one per request and connection.
    assert 0 < outs <= (CLIENTS + 1) * (ADDS + 2), f"{outs} EPOLLOUT events"
