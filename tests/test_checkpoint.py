"""Checkpoints (checkpoint/, guard/server/server_guard.cc): backups take real CRIU
checkpoints of their real redis at log indices; a backup whose redis is
SIGKILLed gets it back from its newest checkpoint plus the log's suffix
without stopping the replica; a whole replica killed and restarted does the
same; a corrupted checkpoint is refused and an older one used; a server CRIU
cannot dump keeps serving without checkpoints; an input that kills the
server on every replica stops the restores instead of looping; the log on
disk stays bounded. Every test that serves ends with the same data on every
replica."""

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import test_memcached as mc
from conftest import run
from resp import Redis, RespError
from test_redis import assert_same_data


def checkpoints(cluster, some_down=False):
    """`lockstep checkpoint list --json`; with some_down, replicas that are
    down are left out (the command then says so and exits 1)."""
    r = run("checkpoint", "list", "--json", "--dir", cluster.dir, check=not some_down)
    if some_down:
        assert r.returncode == 1 and "did not answer" in r.stderr, r.stderr
    return json.loads(r.stdout)


def ck(status, replica):
    """The replica's checkpoint status object ({} while it is down)."""
    return status["replicas"][replica].get("checkpoint") or {}


def wait_checkpoint(cluster, replica, above=0, timeout=30.0):
    """Waits until `replica` has a good checkpoint with index > above."""
    s = cluster.wait(
        lambda s: ck(s, replica).get("index", 0) > above,
        timeout,
        f"a checkpoint of replica {replica} above {above}",
    )
    return ck(s, replica)["index"]


def backups(cluster):
    leader = cluster.leader()
    return [r for r in range(len(cluster.status()["replicas"])) if r != leader]


def load(client, start, count, prefix="k"):
    """SETs keys start..start+count-1 in pipelined batches of 10 (about one
    log entry each)."""
    for b in range(start, start + count, 10):
        n = min(10, start + count - b)
        assert (
            client.pipeline([("SET", f"{prefix}{i}", f"v{i}") for i in range(b, b + n)])
            == ["OK"] * n
        )


def load_following(cluster, start, count, prefix="k"):
    """load() through the leader of the moment: a leader change closes the
    client's connection, as it must (a loaded machine, under ASan, elects
    another leader at times), and the batch goes again to the new leader
    (a SET of the same value twice is the same)."""
    client = None
    for b in range(start, start + count, 10):
        for attempt in range(5):
            try:
                client = client or Redis(cluster.client_addr())
                load(client, b, min(10, start + count - b), prefix)
                break
            except OSError as e:
                client = None
                if attempt == 4:
                    raise
                print(f"batch {b}: {e!r}; again through the leader of the moment")
                time.sleep(0.2)


def kill_server_and_await_restore(cluster, r):
    """SIGKILLs replica r's server and waits until its guard restored it
    (one restore more: a cloned start's server was restored once already);
    returns the status then."""
    s = cluster.status()
    old, before = s["replicas"][r]["server_pid"], ck(s, r).get("restores", 0)
    os.kill(old, signal.SIGKILL)
    return cluster.wait(
        lambda s: (
            s["replicas"][r]["server_pid"] not in (0, old)
            and ck(s, r).get("restores") == before + 1
        ),
        20,
        f"replica {r}'s server restored",
    )


def thread_policies(pid):
    """The scheduling policies of process pid's threads (os.SCHED_*)."""
    return {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def replica_log(cluster, r):
    return (cluster.dir / f"replica-{r}.log").read_text()


@pytest.fixture
def redis_cluster(cluster):
    cluster.up(app="redis", extra=("--checkpoint-entries", "50"))
    return cluster


def test_backup_server_crash_is_restored_from_its_checkpoint(redis_cluster):
    c = redis_cluster
    client = Redis(c.client_addr())
    # State held by an open connection, which the backups' replay connections
    # hold too: SELECT 1 must survive the restore of a backup's redis.
    assert client.call("SELECT", "1") == "OK"
    load(client, 0, 1500)
    b = backups(c)[0]
    k = wait_checkpoint(c, b)
    listed = [cp for cp in checkpoints(c) if cp["replica"] == b]
    assert listed and listed[0]["index"] >= k and listed[0]["ok"], listed
    assert listed[0]["bytes"] > 0 and listed[0]["dump_us"] > 0, listed
    load(client, 1500, 500)
    # Servers run under SCHED_BATCH (guard/server/server.cc), every thread, and
    # a restored one too (CRIU restores each thread's policy).
    assert thread_policies(c.status()["replicas"][b]["server_pid"]) == {os.SCHED_BATCH}
    daemon = c.pid(b)
    s = kill_server_and_await_restore(c, b)
    assert s["replicas"][b]["pid"] == daemon  # the replica itself never stopped
    assert ck(s, b)["server_state"] == "running"
    assert thread_policies(s["replicas"][b]["server_pid"]) == {os.SCHED_BATCH}
    load(client, 2000, 300)  # the same connection, still in db 1
    assert client.call("DBSIZE") == 2300
    _digest, size = assert_same_data(c)
    assert size == 0  # db 0 is empty on every replica: the SELECT held everywhere
    log = replica_log(c, b)
    assert "SERVER DIED" in log and "restored checkpoint" in log, log[-3000:]


def criu_nft_tables():
    """The nftables tables CRIU made for its network locks (CRIU-*)."""
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if "CRIU" in line}


def test_restores_leave_no_network_lock_behind(redis_cluster):
    # A network lock that outlived a restore dropped every packet of the
    # dumped connections' address and port pairs: a later replay connection
    # that drew one of those local ports never connected, and the backup's
    # replay (and, once it led, the whole cluster) stalled behind it. Many
    # connections, a checkpoint, a replica killed mid-dump, a restore; then
    # fresh connections, which must all be replayed; and no CRIU-* table may
    # be left.
    c = redis_cluster
    before = criu_nft_tables()
    clients = [Redis(c.client_addr()) for _ in range(20)]
    for i, cl in enumerate(clients):
        load(cl, i * 100, 100, prefix=f"a{i}-")
    b = backups(c)[0]
    wait_checkpoint(c, b, above=100)
    # The replica killed while CRIU dumps its server: a lock taken for that
    # dump would never be released.
    # A dump of a few MB takes ~100 ms, about two looks at the status: one
    # that ended unseen (its `taken` counted) is asked for again.
    # The leadership can move meanwhile (under ASan a dump once stalled the
    # leader past its lease): a replica that leads now is not asked; another
    # backup is.
    for attempt in range(10):
        if b not in backups(c):
            b = backups(c)[0]
            print(f"attempt {attempt + 1}: replica {b} is a backup now; it dumps instead")
        taken = ck(c.status(), b).get("taken", 0)
        p = run("checkpoint", "now", "--id", b, "--dir", c.dir, check=False)
        if p.returncode != 0:
            assert "is not a backup" in p.stderr, p.stderr
            print(f"attempt {attempt + 1}: replica {b} came to lead before the request")
            continue
        s = c.wait(
            lambda s, taken=taken, b=b: ck(s, b).get("dumping") or ck(s, b).get("taken", 0) > taken,
            20,
            f"replica {b} dumping",
        )
        if ck(s, b).get("dumping"):
            break
        print(f"attempt {attempt + 1}: the dump ended before it was seen; once more")
    else:
        raise AssertionError(f"never saw replica {b} dumping in 10 checkpoints")
    os.kill(c.pid(b), signal.SIGKILL)
    c.wait(lambda s: s["replicas"][b]["role"] == "down", 10, "the backup down")
    run("cluster", "restart", "--id", b, "--dir", c.dir)
    old = c.wait(lambda s: s["replicas"][b]["server_pid"], 20, "the server back")
    old = old["replicas"][b]["server_pid"]
    os.kill(old, signal.SIGKILL)  # and a restore with the replica running
    c.wait(
        lambda s: (
            s["replicas"][b]["server_pid"] not in (0, old)
            and ck(s, b).get("server_state") == "running"
        ),
        20,
        f"replica {b}'s server restored",
    )
    for cl in clients:
        cl.close()
    fresh = [Redis(c.client_addr()) for _ in range(40)]
    for i, cl in enumerate(fresh):
        load(cl, i * 20, 20, prefix=f"b{i}-")
    commit = c.status()["replicas"][c.leader()]["commit_index"]
    c.wait(lambda s: s["replicas"][b]["applied_index"] >= commit, 20, "the restored backup")
    _digest, size = assert_same_data(c)
    assert size == 2000 + 800
    assert criu_nft_tables() <= before, criu_nft_tables() - before
    # Neither the dumps nor the restores lock the network at all (a lock
    # left behind by a CRIU that died with its replica is never released).
    logs = list(c.dir.glob("replica-*/checkpoints/*/img/*.log"))
    assert any(p.name == "dump.log" for p in logs), logs
    for p in logs:
        try:
            text = p.read_text(errors="replace")
        except FileNotFoundError:  # its checkpoint was pruned since the glob
            continue
        assert "Running nftables" not in text, p


def test_restarted_replica_restores_checkpoint_and_replays_only_the_suffix(redis_cluster):
    c = redis_cluster
    load_following(c, 0, 2000)
    # A backup with a checkpoint; the one picked may come to lead meanwhile.
    for _ in range(5):
        b = backups(c)[0]
        k = wait_checkpoint(c, b, above=100)
        if b in backups(c):
            break
    os.kill(c.pid(b), signal.SIGKILL)  # the daemon; its redis dies with it
    load_following(c, 2000, 1000)
    # The leader drops what the dead backup received (it keeps a live
    # backup's suffix, and this one may have received more than it knew
    # committed): the replica comes back below the leader's log.
    c.wait(lambda s: s["replicas"][c.leader()]["first_index"] > k, 30, "the leader's truncation")
    run("cluster", "restart", "--id", b, "--dir", c.dir)
    commit = c.status()["replicas"][c.leader()]["commit_index"]
    c.wait(lambda s: s["replicas"][b]["applied_index"] >= commit, 30, "the restart")
    assert_same_data(c)
    log = replica_log(c, b)
    tail = log[log.rfind("recovered log") :]
    restored = [int(w.split()[0]) for w in tail.split("restored checkpoint ")[1:]]
    assert restored and restored[0] >= k, tail[-3000:]
    assert f"replaying the log from entry {restored[0] + 1}" in tail


def test_corrupted_checkpoint_is_refused_and_an_older_one_used(redis_cluster):
    c = redis_cluster
    client = Redis(c.client_addr())
    load(client, 0, 800)
    b = backups(c)[0]
    first = wait_checkpoint(c, b)
    load(client, 800, 800)
    wait_checkpoint(c, b, above=first)
    # Once the backup is at rest (no more checkpoints coming), flip one byte
    # of its newest checkpoint's largest image file.
    commit = c.status()["replicas"][c.leader()]["commit_index"]
    c.wait(
        lambda s: s["replicas"][b]["applied_index"] >= commit and not ck(s, b)["dumping"],
        10,
        "the backup at rest",
    )
    time.sleep(0.5)  # a commit in flight lands
    cp = next(x for x in checkpoints(c) if x["replica"] == b)
    second = cp["index"]
    files = sorted(Path(cp["path"], "img").glob("pages-*.img"), key=lambda p: p.stat().st_size)
    victim = files[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    s = kill_server_and_await_restore(c, b)
    assert ck(s, b)["restored_from"] < second
    load(client, 1600, 200)
    assert_same_data(c)
    log = replica_log(c, b)
    assert "refused checkpoint" in log and victim.name in log, log[-3000:]
    # Removed, never used again (a fresh one at the same index may follow:
    # the restore from the older one counts as the last checkpoint taken).
    assert f"removed the refused checkpoint {second}" in log, log[-3000:]


def test_checkpoint_now_and_list(redis_cluster):
    c = redis_cluster
    client = Redis(c.client_addr())
    client.pipeline([("SET", f"k{i}", "v") for i in range(100)])  # one entry: below the policy
    b = backups(c)[0]
    commit = c.status()["replicas"][c.leader()]["commit_index"]
    c.wait(lambda s: s["replicas"][b]["applied_index"] >= commit, 10, "the backup applied")
    out = run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir).stdout
    assert "taken" in out, out
    listed = [x for x in checkpoints(c) if x["replica"] == b]
    assert listed and listed[0]["index"] >= commit and listed[0]["ok"], listed
    table = run("checkpoint", "list", "--dir", c.dir).stdout
    assert str(listed[0]["index"]) in table and "ok" in table, table
    # The leader never pauses its server for one: a clear refusal.
    r = run("checkpoint", "now", "--id", c.leader(), "--dir", c.dir, check=False)
    assert r.returncode != 0 and "leader never pauses" in r.stderr, r.stderr
    r = run("checkpoint", "now", "--id", 7, "--dir", c.dir, check=False)
    assert r.returncode != 0 and "0..2" in r.stderr, r.stderr
    status = run("cluster", "status", "--dir", c.dir).stdout
    assert "checkpoint" in status and "s ago" in status, status


def test_log_on_disk_stays_bounded(redis_cluster):
    c = redis_cluster
    value = "x" * 1000

    def backups_checkpointed_past(above):
        # Whoever is a backup now: a leader takes no checkpoints, and a loaded
        # (ASan) run may move leadership mid-test.
        return lambda s: (
            s["leader"] is not None
            and all(ck(s, r).get("index", 0) > above for r in range(3) if r != s["leader"])
        )

    # At least 6 rounds of 100 entries of ~1 KB; more (at most 14) while the
    # backups of the moment have no checkpoint of the last round: a replica
    # that just stopped leading checkpoints only after further entries.
    for round_ in range(14):
        client = Redis(c.client_addr())
        try:
            for i in range(100):
                assert client.call("SET", f"k{round_}-{i}", value) == "OK"
        except OSError:  # a leader change closed it (reset, or closed): this round again
            continue
        finally:
            client.close()
        commit = c.status()["replicas"][c.leader()]["commit_index"]
        try:
            c.wait(backups_checkpointed_past(commit - 60), 30, "the backups' checkpoints")
        except AssertionError:
            if round_ == 13:
                raise
            continue
        if round_ >= 5:
            break
    else:
        raise AssertionError(f"14 rounds and the backups never all checkpointed: {c.status()}")
    # Each backup keeps the log from its oldest kept checkpoint (keep = 2,
    # one every 50 entries), and the leader from the newest checkpoint a
    # backup holds: not the 600 entries that went through.
    s = c.wait(
        lambda s: all(r["last_index"] - r["first_index"] < 4 * 50 for r in s["replicas"]),
        20,
        "every replica's log truncated",
    )
    for r in range(3):
        assert s["replicas"][r]["first_index"] > 300, s
        assert "log truncated" in replica_log(c, r)
    assert_same_data(c)


def bus_ports_free(cluster):
    """redis in cluster mode also listens on its port + 10000."""
    for r in range(3):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", cluster.base_port + 200 + r + 10000))
            except OSError:
                return False
    return True


def test_server_criu_cannot_dump_keeps_serving_without_checkpoints(cluster):
    # redis in cluster mode holds a lock on nodes.conf, which CRIU refuses to
    # dump; its cluster bus ports must be free too.
    while not bus_ports_free(cluster):
        cluster.base_port += 3
    cluster.up(
        extra=(
            "--checkpoint-entries",
            "50",
            "--",
            (
                "redis-server --port {port} --bind 127.0.0.1 --dir {dir} --save '' "
                "--cluster-enabled yes --cluster-config-file nodes.conf --protected-mode no"
            ),
        )
    )
    client = Redis(cluster.client_addr())
    for i in range(300):
        assert client.call("PING") == "PONG"
    bs = backups(cluster)
    s = cluster.wait(
        lambda s: all(ck(s, b).get("failed", 0) >= 1 for b in bs), 20, "the dumps refused"
    )
    for b in bs:
        assert ck(s, b)["enabled"] is False, ck(s, b)
        assert "file locks" in ck(s, b)["error"], ck(s, b)
        assert (cluster.dir / f"replica-{b}" / "criu-dump-failed.log").exists()
        assert "CHECKPOINT FAILED" in replica_log(cluster, b)
    for i in range(100):
        assert client.call("PING") == "PONG"
    s = cluster.status()
    assert all(r["role"] in ("leader", "backup") for r in s["replicas"]), s
    assert all(ck(s, b)["failed"] == 1 for b in bs), s  # tried once, not in a loop
    for b in bs:  # nothing half-made counts
        assert not list((cluster.dir / f"replica-{b}" / "checkpoints").glob("0*"))


def test_input_that_kills_the_server_stops_the_restores(redis_cluster):
    c = redis_cluster
    client = Redis(c.client_addr())
    load(client, 0, 700)
    for b in backups(c):
        wait_checkpoint(c, b)
    # DEBUG SEGFAULT kills redis wherever it executes, on every replica: no reply comes.
    with pytest.raises((OSError, RespError)):
        client.call("DEBUG", "SEGFAULT")
    s = c.wait(
        lambda s: all("died" in ck(s, r).get("server_state", "running") for r in range(3)),
        30,
        "every replica to give up on its server",
    )
    entries = set()
    for r in range(3):
        state = ck(s, r)["server_state"]
        assert "died twice at log entry" in state, state
        entries.add(int(state.split("log entry ")[1].split()[0]))
        assert s["replicas"][r]["role"] in ("leader", "backup"), s  # the daemon lives on
    assert len(entries) == 1, s  # every replica names the same entry
    (entry,) = entries
    # The last input of the load ended around entry 70: DEBUG SEGFAULT is after it.
    assert 70 < entry <= s["replicas"][c.leader()]["commit_index"], s


def test_backup_server_killed_under_load(redis_cluster):
    c = redis_cluster
    addr = c.client_addr()
    b = backups(c)[0]
    stop = threading.Event()
    errors = []
    done = [0] * 4

    def writer(t):
        try:
            client = Redis(addr)
            end = time.monotonic() + 30
            while not stop.is_set() and done[t] < 5000 and time.monotonic() < end:
                assert client.call("SET", f"w{t}:{done[t]}", "x") == "OK"
                done[t] += 1
        except (OSError, AssertionError) as e:
            errors.append(f"writer {t}: {e!r}")

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    try:
        wait_checkpoint(c, b, above=100)
        kill_server_and_await_restore(c, b)
        time.sleep(0.5)  # the restored server takes load again
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    _digest, size = assert_same_data(c, timeout=30)
    assert size == sum(done)


def test_memcached_backup_server_restored(cluster):
    cluster.up(app="memcached", extra=("--checkpoint-entries", "50"))

    def run_workers():
        # Through whoever leads (the workers ask the cluster): under ASan the
        # leadership moves at times while two backups dump (a backup that
        # heard nothing for an election timeout).
        errors = []
        threads = [
            threading.Thread(target=mc.worker, args=(None, t, errors, cluster))
            for t in range(mc.THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]

    run_workers()
    b = backups(cluster)[0]
    wait_checkpoint(cluster, b, above=50)
    kill_server_and_await_restore(cluster, b)
    run_workers()  # the same keys again: set, incr and cas on the restored state
    leader_view = mc.snapshot(cluster.client_addr())
    end = time.monotonic() + 15
    while True:
        views = [mc.snapshot(cluster.server_addr(r)) for r in range(3)]
        if all(v == leader_view for v in views):
            break
        assert time.monotonic() < end, [
            {k: (v[k], leader_view[k]) for k in v if v[k] != leader_view[k]} for v in views
        ]
        time.sleep(0.2)


@pytest.fixture
def transfer_cluster(cluster):
    # A backup silent for 2 s no longer holds the leader's log.
    cluster.up(app="redis", extra=("--checkpoint-entries", "50", "--backup-grace-s", "2"))
    return cluster


def leader_truncated_past(cluster, index, timeout=30.0):
    cluster.wait(
        lambda s: s["leader"] is not None and s["replicas"][s["leader"]]["first_index"] > index + 1,
        timeout,
        f"the leader's log truncated past entry {index}",
    )


def wait_back_by_transfer(cluster, r, timeout, what):
    """Waits until replica r fetched a peer's checkpoint and caught up with
    the leader's commit index; returns the status then."""
    return cluster.wait(
        lambda s: (
            s["leader"] is not None
            and ck(s, r).get("fetched", 0) >= 1
            and s["replicas"][r]["applied_index"] >= s["replicas"][s["leader"]]["commit_index"]
        ),
        timeout,
        what,
    )


def test_lagging_backup_comes_back_by_state_transfer(transfer_cluster):
    c = transfer_cluster
    client = Redis(c.client_addr())
    load(client, 0, 1000)  # about 100 entries: past every backup's first checkpoint
    b = backups(c)[0]
    wait_checkpoint(c, b)
    last_seen = c.status()["replicas"][b]["last_index"]
    os.kill(c.pid(b), signal.SIGKILL)
    load(client, 1000, 1000)  # the other backup checkpoints; the leader truncates
    leader_truncated_past(c, last_seen)
    run("cluster", "restart", "--id", b, "--dir", c.dir)
    s = wait_back_by_transfer(c, b, 30, f"replica {b} back by state transfer")
    assert s["replicas"][b]["first_index"] > last_seen + 1, s
    load(client, 2000, 100)
    _digest, size = assert_same_data(c)
    assert size == 2100
    log = replica_log(c, b)
    assert "lacks entries the leader truncated" in log and "state transfer:" in log, log[-3000:]


def test_wiped_backup_comes_back_by_state_transfer(transfer_cluster):
    c = transfer_cluster
    client = Redis(c.client_addr())
    load(client, 0, 1500)
    b = backups(c)[0]
    other = next(r for r in backups(c) if r != b)
    wait_checkpoint(c, other, above=50)
    leader_truncated_past(c, 1)
    os.kill(c.pid(b), signal.SIGKILL)
    c.wait(lambda s: s["replicas"][b]["role"] == "down", 10, "the backup down")
    shutil.rmtree(c.dir / f"replica-{b}")  # its disk is gone: log, checkpoints, data
    run("cluster", "restart", "--id", b, "--dir", c.dir)
    wait_back_by_transfer(c, b, 30, f"the wiped replica {b} back by state transfer")
    load(client, 1500, 100)
    _digest, size = assert_same_data(c)
    assert size == 1600


def test_damaged_transfer_is_refused_and_retried(transfer_cluster):
    c = transfer_cluster
    client = Redis(c.client_addr())
    load(client, 0, 1000)
    b = backups(c)[0]
    other = next(r for r in backups(c) if r != b)
    wait_checkpoint(c, b)
    last_seen = c.status()["replicas"][b]["last_index"]
    os.kill(c.pid(b), signal.SIGKILL)
    load(client, 1000, 1000)
    leader_truncated_past(c, last_seen)
    # Every checkpoint the other backup holds now is damaged on its disk: the
    # fetched copy fails its MANIFEST, is removed, and the fetch is retried.
    commit = c.status()["replicas"][c.leader()]["commit_index"]
    c.wait(lambda s: s["replicas"][other]["applied_index"] >= commit, 10, "the other backup")
    time.sleep(0.5)  # a commit in flight lands
    for cp in checkpoints(c, some_down=True):
        if cp["replica"] == other:
            pages = max(Path(cp["path"], "img").glob("pages-*.img"), key=lambda p: p.stat().st_size)
            data = bytearray(pages.read_bytes())
            data[len(data) // 3] ^= 0x01
            pages.write_bytes(bytes(data))
    run("cluster", "restart", "--id", b, "--dir", c.dir)
    c.wait(
        lambda s: "is damaged" in replica_log(c, b),
        20,
        "a damaged transfer refused",
    )
    assert ck(c.status(), b).get("fetched", 0) == 0
    load(client, 2000, 1000)  # the other backup checkpoints again, undamaged
    wait_back_by_transfer(c, b, 40, "the retried transfer")
    _digest, size = assert_same_data(c)
    assert size == 3000
    assert not list((c.dir / f"replica-{b}" / "checkpoints").glob("tmp-fetch-*"))


def test_former_leader_with_a_truncated_log_rebuilds_from_a_peer_checkpoint(transfer_cluster):
    # The leader takes no checkpoints and truncates its log below its
    # backups' ones: restarted, it has nothing of its own to rebuild its
    # server from, and replaying the truncated log would leave it without the
    # first keys. It fetches a peer's checkpoint instead. It is restarted the
    # moment it is SIGKILLed (the restart waits for the old process).
    c = transfer_cluster
    load(Redis(c.client_addr()), 0, 1500)
    old = c.leader()
    for b in backups(c):
        wait_checkpoint(c, b, above=50)
    leader_truncated_past(c, 50)
    assert checkpoints(c) and all(cp["replica"] != old for cp in checkpoints(c))
    os.kill(c.pid(old), signal.SIGKILL)
    r = run("cluster", "restart", "--id", old, "--dir", c.dir)
    assert f"replica {old} running" in r.stdout, r.stdout
    wait_back_by_transfer(c, old, 30, f"the former leader {old} rebuilt from a peer's checkpoint")
    load(Redis(c.client_addr()), 1500, 100)
    _digest, size = assert_same_data(c)
    assert size == 1600
    log = replica_log(c, old)
    assert "fetching one from a peer" in log and "state transfer:" in log, log[-3000:]


def test_idle_peer_checkpoints_on_demand_for_a_wiped_replica(cluster):
    # No checkpoint is due by policy: one backup takes one by hand, and the
    # leader truncates below it. That backup's disk is then wiped while the
    # cluster is idle. The other backup holds no checkpoint recent enough;
    # asked for one, it takes it, and the wiped replica comes back from it.
    c = cluster
    c.up(app="redis", extra=("--checkpoint-entries", "1000000", "--backup-grace-s", "2"))
    load(Redis(c.client_addr()), 0, 500)
    b, other = backups(c)
    run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir)
    index = ck(c.status(), b)["index"]
    leader_truncated_past(c, index - 1)
    assert ck(c.status(), other).get("index", 0) == 0
    os.kill(c.pid(b), signal.SIGKILL)
    c.wait(lambda s: s["replicas"][b]["role"] == "down", 10, "the backup down")
    shutil.rmtree(c.dir / f"replica-{b}")
    run("cluster", "restart", "--id", b, "--dir", c.dir)
    wait_back_by_transfer(
        c, b, 40, f"the wiped replica {b} back from the other backup's checkpoint"
    )
    assert ck(c.status(), other)["index"] >= index
    assert "a peer needs a checkpoint" in replica_log(c, other)
    load(Redis(c.client_addr()), 500, 50)
    _digest, size = assert_same_data(c)
    assert size == 550
