"""A cloned start (issue 29; the profile's `cloned_start`): replica 0 of a new
cluster starts its server, dumps it at index 0 before its first input, and
every other server, on any replica and at any time, is a restore of that
image or of a later checkpoint (guard/server/server_guard.cc, "cloned
start"). What a server draws at its start where the shim cannot reach is
then the same everywhere.

The server here (tests/start_draw_server.py) answers with its start-up's
monotonic clock, its generator's draws and an object's address. The control
(test_without_a_cloned_start_the_draws_differ) starts the same server
without the option and shows the draws differ, so the main test can fail."""

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import inspector
from conftest import LOCKSTEP, run
from test_checkpoint import ck
from test_prevention import output_checks, wait_applied

SERVER = Path(__file__).parent / "start_draw_server.py"


def profile(tmp_path, cloned=True):
    path = tmp_path / ("draws.toml" if cloned else "draws-own.toml")
    path.write_text(
        'description = "answers what it drew at its start (tests/start_draw_server.py)"\n'
        f'command = "{sys.executable} {SERVER} {{host}} {{port}}"\n'
        + ("cloned_start = true\n" if cloned else "")
    )
    return str(path)


def ask(addr, line, inspect=False):
    """One request's answer line from the server at addr (through the log
    unless inspect: then a backup's own server, nothing logged)."""
    s = inspector.connect(addr) if inspect else socket.create_connection(addr, 10)
    try:
        s.sendall(line.encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(4096)
            assert chunk, f"{addr} closed the connection"
            buf += chunk
        return buf.decode().strip()
    finally:
        s.close()


def servers_running(cluster, timeout=60.0):
    return cluster.wait(
        lambda s: all(
            r["server_pid"] and ck(s, r["id"]).get("server_state") == "running"
            for r in s["replicas"]
        ),
        timeout,
        "every replica's server running",
    )


def own_draws(cluster):
    """Each backup's own server's start-up draws (the leader's: through the log)."""
    s = cluster.status()
    return {
        r["id"]: ask(cluster.server_addr(r["id"]), "start", inspect=r["id"] != s["leader"])
        for r in s["replicas"]
    }


def test_every_server_is_a_restore_of_one_image(cluster, tmp_path):
    cluster.up(app=profile(tmp_path))
    s = servers_running(cluster)
    assert ck(s, 0)["taken"] >= 1, ck(s, 0)  # the image, at index 0
    for r in (1, 2):
        assert ck(s, r)["fetched"] >= 1 and ck(s, r)["restores"] >= 1, ck(s, r)
    log0 = (cluster.dir / "replica-0.log").read_text()
    assert "cloned start: the server dumped at index 0" in log0, log0[-2000:]
    draws = own_draws(cluster)
    print(f"start-up draws: {draws}")
    assert len(set(draws.values())) == 1, draws
    # The generator goes on alike: its draws through the log are compared
    # with every backup's (output checking).
    addr = cluster.client_addr()
    for _ in range(20):
        ask(addr, "next")
    wait_applied(cluster)
    out = output_checks(cluster)
    assert out["divergences"] == 0 and out["reports"] == 0, out
    # A backup's server killed comes back from its own copy of the image:
    # nothing fetched again.
    b = next(r for r in (1, 2) if r != cluster.leader())
    fetched = ck(cluster.status(), b)["fetched"]
    os.kill(cluster.status()["replicas"][b]["server_pid"], signal.SIGKILL)
    s = cluster.wait(
        lambda s: ck(s, b).get("restores", 0) >= 2 and ck(s, b).get("server_state") == "running",
        30,
        f"replica {b}'s server restored",
    )
    assert ck(s, b)["fetched"] == fetched, ck(s, b)
    assert ask(cluster.server_addr(b), "start", inspect=True) == draws[0]


def test_without_a_cloned_start_the_draws_differ(cluster, tmp_path):
    cluster.up(app=profile(tmp_path, cloned=False))
    servers_running(cluster)
    draws = own_draws(cluster)
    print(f"start-up draws, each server its own: {draws}")
    assert len(set(draws.values())) == 3, draws


def test_replica_0_that_lost_its_state_joins_its_cluster(cluster, tmp_path):
    # Replica 0 with an empty log and no checkpoints would be a new cluster's
    # origin; its peers say the cluster is older, so it fetches their
    # checkpoint instead of starting a server of its own.
    cluster.up(app=profile(tmp_path))
    servers_running(cluster)
    draws = own_draws(cluster)
    addr = cluster.client_addr()
    for _ in range(5):
        ask(addr, "next")
    wait_applied(cluster)
    os.kill(cluster.pid(0), signal.SIGKILL)  # the daemon; its server dies with it
    cluster.wait(lambda s: s["replicas"][0]["role"] == "down", 10, "replica 0 down")
    for part in ("log", "checkpoints", "server"):
        shutil.rmtree(cluster.dir / "replica-0" / part, ignore_errors=True)
    run("cluster", "restart", "--id", 0, "--dir", cluster.dir)
    s = servers_running(cluster)
    log0 = (cluster.dir / "replica-0.log").read_text()
    assert "has this cluster's state" in log0, log0[-3000:]
    assert ck(s, 0)["fetched"] >= 1, ck(s, 0)
    wait_applied(cluster)
    if cluster.leader() != 0:
        assert ask(cluster.server_addr(0), "start", inspect=True) == draws[0]
    for _ in range(5):
        ask(cluster.client_addr(), "next")
    wait_applied(cluster)
    out = output_checks(cluster)
    assert out["divergences"] == 0 and out["reports"] == 0, out


def test_a_cloned_start_needs_checkpoints(cluster, tmp_path):
    r = subprocess.run(
        [
            LOCKSTEP,
            "cluster",
            "up",
            "--dir",
            str(cluster.dir),
            "--base-port",
            str(cluster.base_port),
            "--app",
            profile(tmp_path),
            "--no-checkpoints",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0, r.stdout
    assert "cloned_start" in r.stderr and "--no-checkpoints" in r.stderr, r.stderr
