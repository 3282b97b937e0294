"""A local cluster: status, proposals, identical logs, restart and catch-up."""

import os
import signal
import time
from pathlib import Path

import inspector
from conftest import run
from resp import Redis


def process_alive(pid):
    """True while `pid` runs (a zombie, or no such process: False)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_cli_help_lists_every_command():
    out = run("--help").stdout
    for cmd in ("replica", "cluster", "propose", "log", "sim", "bench", "demo"):
        assert cmd in out
    for sub in (
        ["cluster", "--help"],
        ["bench", "--help"],
        ["sim", "--help"],
        ["replica", "--help"],
    ):
        assert "usage" in run(*sub).stdout


def test_status_json_has_one_leader_and_the_documented_fields(cluster):
    cluster.up()
    s = cluster.status()
    assert s["leader"] in (0, 1, 2)
    assert len(s["replicas"]) == 3
    roles = sorted(r["role"] for r in s["replicas"])
    assert roles == ["backup", "backup", "leader"]
    for r in s["replicas"]:
        for field in ("id", "role", "ballot", "commit_index", "pid", "lag", "server_read_all"):
            assert field in r
        assert isinstance(r["pid"], int) and r["pid"] > 0


def test_committed_entries_are_identical_on_every_replica(cluster):
    cluster.up()
    values = [f"value-{i}" for i in range(50)]
    out = cluster.propose(*values).stdout
    assert out.count("committed index") == 50
    s = cluster.wait(
        lambda s: all(r["commit_index"] >= 50 for r in s["replicas"]),
        what="all replicas to commit 50 entries",
    )
    assert all(r["lag"] == 0 for r in s["replicas"])
    logs = [cluster.log(i) for i in range(3)]
    assert [p for _, _, p in logs[0]] == values
    assert logs[0] == logs[1] == logs[2]


def test_proposal_to_a_backup_is_refused_with_the_leaders_name(cluster):
    cluster.up()
    leader = cluster.leader()
    backup = (leader + 1) % 3
    p = cluster.propose("x", replica=backup, check=False)
    assert p.returncode != 0
    assert f"not the leader (replica {leader} is)" in p.stderr


def test_killed_leader_is_replaced_and_catches_up_after_restart(cluster):
    cluster.up()
    cluster.propose(*[f"before-{i}" for i in range(20)])
    old = cluster.leader()
    os.kill(cluster.pid(old), signal.SIGKILL)
    s = cluster.wait(lambda s: s["leader"] not in (None, old), 30, "a new leader")
    new = s["leader"]
    assert s["replicas"][old]["role"] == "down"
    cluster.propose(*[f"after-{i}" for i in range(20)])
    run("cluster", "restart", "--dir", cluster.dir, "--id", old)
    s = cluster.wait(
        lambda s: (
            s["replicas"][old]["role"] in ("backup", "leader")
            and s["replicas"][old]["commit_index"] >= 40
        ),
        what="the restarted replica to catch up",
    )
    logs = [cluster.log(i) for i in range(3)]
    payloads = [p for _, t, p in logs[new] if t == "input"]
    assert payloads == [f"before-{i}" for i in range(20)] + [f"after-{i}" for i in range(20)]
    assert logs[0] == logs[1] == logs[2]


def test_a_crashed_replica_is_started_again_and_a_killed_one_is_not(cluster):
    """A daemon that crashes (here: SIGABRT, as UCX's aborts do) is started
    again by its keeper and catches up; one ended from outside (SIGKILL)
    stays down; more than 3 crashes a minute and the keeper gives up."""
    cluster.up()
    cluster.propose(*[f"a-{i}" for i in range(10)])
    b = next(r for r in range(3) if r != cluster.leader())
    crashed = cluster.pid(b)
    os.kill(crashed, signal.SIGABRT)
    s = cluster.wait(
        lambda s: (
            s["replicas"][b]["pid"] not in (0, crashed)
            and s["replicas"][b]["role"] == "backup"
            and s["replicas"][b]["commit_index"] >= 10
        ),
        20,
        f"replica {b} started again after its crash",
    )
    log = (cluster.dir / f"replica-{b}.log").read_text(errors="replace")
    assert f"replica {b} (pid {crashed}) crashed with Aborted" in log, log[-2000:]
    again = s["replicas"][b]["pid"]
    pid_file = cluster.dir / f"replica-{b}.pid"
    assert int(pid_file.read_text()) == again  # the daemon, not its keeper

    # Its keeper (the daemon's parent) either starts it again and stays, or
    # exits: once the keeper is gone, nothing will start it again.
    keeper = int(Path(f"/proc/{again}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(again, signal.SIGKILL)
    end = time.monotonic() + 30
    while process_alive(keeper):
        assert time.monotonic() < end, f"the keeper (pid {keeper}) of a killed replica stays"
        time.sleep(0.05)
    assert cluster.status()["replicas"][b]["role"] == "down"
    assert int(pid_file.read_text()) == again, "started again"

    run("cluster", "restart", "--dir", cluster.dir, "--id", b)
    for n in range(4):  # the fourth crash within a minute is the last
        pid = cluster.wait(lambda s: s["replicas"][b]["pid"], 20, f"replica {b} up")["replicas"][b][
            "pid"
        ]
        os.kill(pid, signal.SIGILL)  # (not SIGSEGV: ASan would catch that one, scripts/sanitize)
        cluster.wait(lambda s, pid=pid: s["replicas"][b]["pid"] != pid, 20, f"crash {n + 1} seen")
    time.sleep(1.0)
    assert cluster.status()["replicas"][b]["role"] == "down"
    log = (cluster.dir / f"replica-{b}.log").read_text(errors="replace")
    assert "4 times within a minute: not starting it again" in log, log[-2000:]
    cluster.propose("after")  # the other two are a majority


def test_sigkill_leader_under_16_clients_loses_nothing_acknowledged(cluster, tmp_path):
    out = tmp_path / "failover.json"
    run(
        "bench",
        "failover",
        "--kills",
        3,
        "--clients",
        16,
        "--dir",
        cluster.dir,
        "--base-port",
        cluster.base_port,
        "--json",
        out,
        timeout=300,
    )
    import json

    r = json.loads(out.read_text())
    assert r["kills"] == 3
    assert r["failed_kills"] == 0
    assert r["acknowledged"] > 100
    assert r["lost_acknowledged"] == 0


def test_cluster_down_leaves_nothing_running(cluster):
    cluster.up()
    pids = [r["pid"] for r in cluster.status()["replicas"]]
    run("cluster", "down", "--dir", cluster.dir)
    end = time.monotonic() + 10
    while left := [pid for pid in pids if process_alive(pid)]:
        assert time.monotonic() < end, f"still running after cluster down: {left}"
        time.sleep(0.05)
    assert all(r["role"] == "down" for r in cluster.status()["replicas"])


def test_a_relative_dir_is_made_absolute(cluster):
    # `cluster up --dir DIR` from DIR's parent: the servers run elsewhere
    # and are handed {dir}, so a relative DIR must not reach them as it is.
    run(
        *("cluster", "up", "--dir", cluster.dir.name, "--base-port", cluster.base_port),
        *("--app", "redis"),
        cwd=cluster.dir.parent,
    )
    toml = (cluster.dir / "cluster.toml").read_text()
    assert f'"{cluster.dir}/replica-0"' in toml, toml
    c = Redis(cluster.client_addr())
    assert c.call("SET", "k", "v") == "OK"
    c.close()


def test_five_replicas_and_memory_durability(cluster):
    cluster.up(replicas=5, durability="memory")
    cluster.propose("a", "b", "c")
    s = cluster.wait(
        lambda s: all(r["commit_index"] >= 3 for r in s["replicas"]), what="5 replicas to commit"
    )
    assert len(s["replicas"]) == 5


def test_tcp_transport(cluster):
    cluster.up(transport="tcp")
    cluster.propose(*[f"t{i}" for i in range(10)])
    cluster.wait(
        lambda s: all(r["commit_index"] >= 10 for r in s["replicas"]), what="commit over tcp"
    )
    logs = [cluster.log(i) for i in range(3)]
    assert logs[0] == logs[1] == logs[2]


def test_paused_backup_catches_up_through_a_full_ring(cluster, tmp_path):
    # A 64 KiB ring fills while the backup is stopped: the leader commits with
    # the other backup, holds back the stopped one's stream, and resumes it.
    cluster.up(extra=["--ring-bytes", 65536])
    leader = cluster.leader()
    paused = (leader + 1) % 3
    pid = cluster.pid(paused)
    os.kill(pid, signal.SIGSTOP)
    try:
        values = [f"p{i}-" + "q" * 400 for i in range(300)]  # ~140 KiB of records
        for chunk in range(0, len(values), 100):
            cluster.propose(*values[chunk : chunk + 100])
    finally:
        os.kill(pid, signal.SIGCONT)
    s = cluster.wait(
        lambda s: s["replicas"][paused]["commit_index"] >= 300,
        timeout=20,
        what="the paused backup to catch up",
    )
    assert s["leader"] == leader
    logs = [cluster.log(i) for i in range(3)]
    assert logs[0] == logs[1] == logs[2]
    assert [v for _, t, v in logs[paused] if t == "input"] == values


def test_a_server_that_closes_after_each_reply_keeps_its_backups_going(cluster):
    # HTTP/1.0: the server closes each connection once it replied, and the
    # client closes too, so a backup's order ring holds that connection's EOF
    # when its server has closed it already and the daemon released the slot.
    # Such a record once stopped the backup's shim for good (it waited for the
    # slot's connection to be accepted): backups executed nothing after it.
    import http.client
    import sys

    server = Path(__file__).with_name("close_after_reply_server.py")
    cluster.up(extra=("--", f"{sys.executable} {server} {{port}}"))
    host, port = cluster.client_addr()
    for _ in range(30):
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("POST", "/add", body=b"")
        assert c.getresponse().read() == b"added\n"
        c.close()

    def counts(_):
        got = []
        for r in range(3):
            c = http.client.HTTPConnection(*cluster.server_addr(r), timeout=5)
            c.sock = inspector.connect(cluster.server_addr(r), timeout=5)  # a backup's own
            try:
                c.request("GET", "/count")
                got.append(c.getresponse().read())
            except OSError:  # a stuck server: asked again until the wait ends
                return False
            finally:
                c.close()
        return got == [b"30\n"] * 3

    cluster.wait(counts, 30, "every replica's server to have counted 30 requests")


def leader_server_signalled(cluster, sig):
    """`sig` to the leader's redis, then a write through whoever leads once
    the old leader is a backup (its own status says so: a status is each
    replica's answer in turn, and the old leader's may predate its step
    down). Returns (old leader, its server's pid, seconds until then)."""
    cluster.up(app="redis")
    Redis(cluster.client_addr()).call("SET", "before", "1")
    old = cluster.leader()
    server = cluster.status()["replicas"][old]["server_pid"]
    os.kill(server, sig)
    try:
        t0 = time.monotonic()
        cluster.wait(
            lambda s: s["leader"] not in (None, old) and s["replicas"][old]["role"] == "backup",
            30,
            "another leader, and the old one a backup",
        )
        took = time.monotonic() - t0
        assert Redis(cluster.client_addr()).call("SET", "during", "2") == "OK"
    finally:
        if sig == signal.SIGSTOP:
            os.kill(server, signal.SIGCONT)
    return old, server, took


def assert_every_server_alike(cluster, also=lambda s: True, timeout=20):
    cluster.wait(
        lambda s: (
            also(s)
            and len({r["applied_index"] for r in s["replicas"]}) == 1
            and all(r["server_read_all"] for r in s["replicas"])
        ),
        timeout,
        "every server to have read every input",
    )
    digests = {c.call("DEBUG", "DIGEST") for _, c in cluster.each_server()}
    assert len(digests) == 1, digests


def test_a_leader_whose_server_is_stopped_hands_leadership_over(cluster):
    # The leader's redis SIGSTOPped (a debugger, a hung process): its daemon
    # is healthy and would go on leading while nobody is served. It hands
    # leadership to a backup instead, and its redis, continued, catches up
    # as a backup's.
    old, server, took = leader_server_signalled(cluster, signal.SIGSTOP)
    print(f"handed over {took:.1f} s after the SIGSTOP")
    # The hand-over's own path (after 200 ms stopped), not an election.
    log = (cluster.dir / f"replica-{old}.log").read_text()
    assert f"this leader's server (pid {server}) has been stopped for" in log, log[-2000:]
    Redis(cluster.client_addr()).call("SET", "after", "3")
    assert_every_server_alike(cluster)


def test_a_leader_whose_server_dies_hands_leadership_over(cluster):
    # The leader's redis SIGKILLed: its guard brings it back (a checkpoint or
    # a fresh start, then the log), which takes a restore and a replay while
    # nobody is served; a backup's server is up. So the leader hands
    # leadership over first, and its own server comes back as a backup's.
    old, server, _ = leader_server_signalled(cluster, signal.SIGKILL)
    log = (cluster.dir / f"replica-{old}.log").read_text()
    assert "this leader's server died: handed leadership over to replica" in log, log[-2000:]
    assert_every_server_alike(
        cluster, also=lambda s: s["replicas"][old]["server_pid"] not in (0, server), timeout=30
    )
