"""serial_inputs (preload/shim_serial.c) with servers of the tests' own:
one agreed input executes at a time, also while its thread runs on the
CPU, or sleeps elsewhere than on a condition variable, for longer than the
shim's looks at it; a request woken from a lock wait goes on before the
next input on every replica; and a profile of one's own is given to
`cluster up --app` as a path.

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
import time
from pathlib import Path

import inspector
from conftest import BUILD_DIR, on_threads, run

SERVER = Path(__file__).with_name("serial_probe_server.py")
LOCK_WAIT_SERVER = BUILD_DIR / "bin" / "lock_wait_server"  # tools/lock_wait_server.c


def ask(addr, line, inspect=False, timeout=30):
    s = (
        inspector.connect(addr, timeout=timeout)
        if inspect
        else socket.create_connection(addr, timeout)
    )
    with s, s.makefile("rb") as f:
        s.sendall(line)
        return f.readline()


def each_server_says(cluster, request):
    """Each replica's server's answer to `request`, asked directly once it
    read the whole log; and no divergence was found meanwhile."""
    commit = cluster.status()["replicas"][cluster.leader()]["commit_index"]
    cluster.wait(
        lambda s: all(r["applied_index"] >= commit and r["server_read_all"] for r in s["replicas"]),
        30,
        "every replica's server to read the whole log",
    )
    answers = [ask(cluster.server_addr(r), request, inspect=True) for r in range(3)]
    assert "(no divergence found)" in run("divergence", "list", "--dir", cluster.dir).stdout
    return answers


def test_an_input_on_the_cpu_or_briefly_asleep_is_not_overtaken(cluster, tmp_path):
    profile = tmp_path / "probe.toml"
    profile.write_text(f'command = "{sys.executable} {SERVER} {{port}}"\nserial_inputs = true\n')
    cluster.up(app=str(profile))
    assert 'app = "probe"' in (cluster.dir / "cluster.toml").read_text()
    addr = cluster.client_addr()

    def client(_):
        with socket.create_connection(addr, timeout=60) as s, s.makefile("rb") as f:
            for _ in range(5):
                # 40 ms on the CPU, 20 ms asleep in the kernel: many looks'
                # worth, shorter than a sleep elsewhere than on a condition
                # variable that lets the next input in
                for request in (b"spin 40\n", b"sleep 20\n"):
                    s.sendall(request)
                    assert f.readline() == b"done\n"

    on_threads(client, 4)
    # Every replica executed the 40 requests one at a time: none began while
    # another ran.
    assert each_server_says(cluster, b"overlaps\n") == [b"0\n"] * 3


def test_a_request_waiting_for_a_running_thread_is_not_overtaken(cluster, tmp_path):
    # A Python server: a request's thread on the CPU gives the interpreter's
    # lock up every few ms to the server's own busy thread and waits for it
    # back on a condition variable, asleep. Only the running thread ends that
    # wait, not a later input, so the next input must not go in meanwhile. It
    # did where the wait lasted two looks, and the servers counted overlaps
    # on some replicas and not on others: a divergence in 2 runs of 3 (once
    # on CI without the busy thread, whose part thread starts played there).
    profile = tmp_path / "probe.toml"
    profile.write_text(
        f'command = "{sys.executable} {SERVER} {{port}} busy"\nserial_inputs = true\n'
    )
    # A generous election timeout: the busy Python servers keep both cores
    # full, and under ASan a backup once went 69 ms without hearing the
    # leader and was elected, which reset these clients (sanitize, CI run of
    # 2026-12-07). The order of inputs is what this test is about.
    cluster.up(app=str(profile), extra=("--election-timeout-ms", "400-800"))
    addr = cluster.client_addr()

    def client(_):
        with socket.create_connection(addr, timeout=60) as s, s.makefile("rb") as f:
            for _ in range(8):
                s.sendall(b"spin 40\n")
                assert f.readline() == b"done\n"

    on_threads(client, 4)
    assert each_server_says(cluster, b"overlaps\n") == [b"0\n"] * 3


def test_a_request_woken_from_its_lock_wait_goes_on_before_the_next_input(cluster, tmp_path):
    # The way InnoDB's row locks work: B's request waits on its own condition
    # variable for the lock A holds; the shim finds B asleep and lets A's
    # next input (its unlock, the COMMIT) in, which hands B the lock and
    # signals it. B then stays on the CPU for 30 ms before it notes "b",
    # and C's "note c" comes right after A's unlock was answered. Taken in
    # the log's order, B goes on before C on every replica: a,b,c. Without
    # it, B would run beside C, and C would note first wherever B was slower.
    profile = tmp_path / "lockwait.toml"
    profile.write_text(f'command = "{LOCK_WAIT_SERVER} {{port}}"\nserial_inputs = true\n')
    cluster.up(app=str(profile))
    addr = cluster.client_addr()

    def conn():
        s = socket.create_connection(addr, timeout=30)
        return s, s.makefile("rb")

    (a, a_in), (b, b_in), (c, c_in) = conn(), conn(), conn()
    expected = []
    for k in range(3):
        a.sendall(b"lock %d 0 a%d\n" % (k, k))
        assert a_in.readline() == b"ok\n"
        b.sendall(b"lock %d 30 b%d\n" % (k, k))  # waits for a's lock
        time.sleep(0.1)
        a.sendall(b"unlock\n")
        assert a_in.readline() == b"ok\n"
        c.sendall(b"note c%d\n" % k)
        assert c_in.readline() == b"ok\n"
        assert b_in.readline() == b"ok\n"
        expected += [f"a{k}", f"b{k}", f"c{k}"]
    for s in (a, b, c):
        s.close()
    want = (",".join(expected) + "\n").encode()
    assert each_server_says(cluster, b"history\n") == [want] * 3


def test_a_profile_path_that_is_not_a_file_is_refused(cluster, tmp_path):
    r = cluster.up(app=str(tmp_path / "none.toml"), check=False)
    assert r.returncode != 0
    assert "no app profile" in r.stderr and "none.toml" in r.stderr, r.stderr
