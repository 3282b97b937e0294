"""serial_inputs (preload/shim_serial.c) with a server of the tests' own:
one agreed input executes at a time, also while its thread runs on the
CPU for longer than the shim's looks at it, and a profile of one's own is
given to `cluster up --app` as a path.

The daemon starts each server in a PID namespace of its own, where gettid
numbers a thread differently from the /proc the shim reads: the shim once
looked for the holder of an input under the namespace's number, found no
such thread, took it for gone, and let the next input in after two looks
1 ms apart, whatever the holder was doing. MariaDB under 16 sysbench
threads then diverged about once every 20 s: long statements ran
concurrently with the next ones.
"""

import socket
import sys
from pathlib import Path

import inspector
from conftest import on_threads, run

SERVER = Path(__file__).with_name("serial_probe_server.py")


def ask(addr, line, inspect=False, timeout=30):
    s = (
        inspector.connect(addr, timeout=timeout)
        if inspect
        else socket.create_connection(addr, timeout)
    )
    with s, s.makefile("rb") as f:
        s.sendall(line)
        return f.readline()


def test_an_input_on_the_cpu_is_not_overtaken(cluster, tmp_path):
    profile = tmp_path / "probe.toml"
    profile.write_text(f'command = "{sys.executable} {SERVER} {{port}}"\nserial_inputs = true\n')
    cluster.up(app=str(profile))
    assert 'app = "probe"' in (cluster.dir / "cluster.toml").read_text()
    addr = cluster.client_addr()

    def client(_):
        with socket.create_connection(addr, timeout=60) as s, s.makefile("rb") as f:
            for _ in range(5):
                s.sendall(b"spin 40\n")  # 40 ms on the CPU: 20 looks' worth
                assert f.readline() == b"done\n"

    on_threads(client, 4)
    # Every replica executed the 20 requests one at a time: none began while
    # another ran. Each server is asked directly, once its replica handed it
    # the whole log and it read it all.
    commit = cluster.status()["replicas"][cluster.leader()]["commit_index"]
    cluster.wait(
        lambda s: all(r["applied_index"] >= commit and r["server_read_all"] for r in s["replicas"]),
        30,
        "every replica's server to read the whole log",
    )
    for r in range(3):
        assert ask(cluster.server_addr(r), b"overlaps\n", inspect=True) == b"0\n", r
    assert "(no divergence found)" in run("divergence", "list", "--dir", cluster.dir).stdout


def test_a_profile_path_that_is_not_a_file_is_refused(cluster, tmp_path):
    r = cluster.up(app=str(tmp_path / "none.toml"), check=False)
    assert r.returncode != 0
    assert "no app profile" in r.stderr and "none.toml" in r.stderr, r.stderr
