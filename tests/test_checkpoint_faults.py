"""Checkpoints under real faults (checkpoint/, guard/server/checkpointer.cc).

- A backup's daemon SIGKILLed while CRIU dumps its redis (200k keys), at
  one of two moments found to be the worst: criu waiting in wait4() for
  the server to run code it injected (the server dies with the daemon, by
  its PDEATHSIG, and such a criu waited for ever, holding the dead server
  as a zombie, until criu itself was given PDEATHSIG), and criu starting,
  with helper processes it forked and stopped (a criu killed then leaves
  them stopped). After `cluster restart`: no half-written checkpoint is
  left or listed, the server comes back from the newest good checkpoint
  plus the log, every replica holds the same data, and no criu, redis or
  daemon of the killed replica lives on.
- A backup's server SIGKILLed while CRIU holds it seized: the dump is
  dropped at once and the server restored (criu used to keep the dead
  server for the dump's whole timeout), and checkpoints go on.
- A backup whose checkpoint directory is a small tmpfs that a checkpoint
  does not fit in: the failure is reported (the CLI, cluster status and the
  replica's log name the lack of space), nothing half-written counts as a
  checkpoint, the earlier good one is still the one a restore uses, the
  replica keeps applying and serving the same data as the others, and
  checkpoints come back once there is space again (a full disk used to turn
  them off until a restart).

Real redis, real CRIU, real signals and a real full file system; every wait
is bounded and generous (two cores shared by three replicas, and pauses of
up to a second). Needs root (CRIU, mount).
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import LOCKSTEP, leader_of, run
from resp import Redis
from test_checkpoint import backups, checkpoints, ck, kill_server_and_await_restore, replica_log
from test_redis import assert_same_data


def load_keys(client, start, count, value, batch=1000):
    """SETs keys k<start>..k<start+count-1> to `value`, `batch` per pipeline."""
    for b in range(start, start + count, batch):
        n = min(batch, start + count - b)
        assert client.pipeline([("SET", f"k{i}", value) for i in range(b, b + n)]) == ["OK"] * n


def wait_caught_up(cluster, replica, timeout=60.0):
    """Waits until `replica` has applied everything the leader committed."""
    commit = cluster.status()["replicas"][cluster.leader()]["commit_index"]
    return cluster.wait(
        lambda s: s["replicas"][replica]["applied_index"] >= commit,
        timeout,
        f"replica {replica} to apply up to {commit}",
    )


def start_time(pid):
    """The process's start time in clock ticks (/proc/PID/stat field 22),
    which tells a pid from a later process that reuses it; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def alive(pid, started):
    """True while the process `pid` that started at `started` exists (a
    zombie included: it still holds its pid)."""
    return started is not None and start_time(pid) == started


def children(pid):
    """(pid, comm) of every process whose parent is pid."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if ppid == pid:
            out.append((int(p.name), comm))
    return out


def criu_child(daemon):
    """The pid of a criu the daemon runs, or None (reads only the daemon's
    own children lists: quick enough to poll in a tight loop)."""
    for task in Path(f"/proc/{daemon}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
            for k in kids:
                if Path(f"/proc/{k}/comm").read_text().strip() == "criu":
                    return int(k)
        except OSError:
            continue
    return None


def wait_for_criu(daemon, gone, timeout=30):
    """The pid of a criu the daemon runs, looked for without sleeping (a dump
    lasts tens of ms); None once gone() says the dump ended unseen (asked
    every 0.2 s). Fails after timeout."""
    end = time.monotonic() + timeout
    next_ask = 0.0
    while time.monotonic() < end:
        criu = criu_child(daemon)
        if criu:
            return criu
        if time.monotonic() >= next_ask:
            if gone():
                return None
            next_ask = time.monotonic() + 0.2
    raise AssertionError(f"no criu child of the daemon (pid {daemon}) within {timeout} s")


def processes_of(directory):
    """{pid: description} of every process whose cwd or command line names
    `directory` (or a path under it)."""
    d = str(directory)
    found = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmdline = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        try:
            cwd = os.readlink(p / "cwd")
        except OSError:
            cwd = ""
        if d in cmdline or cwd == d or cwd.startswith(d + "/"):
            found[int(p.name)] = f"{cmdline.strip()} (cwd {cwd})"
    return found


def wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def thread_state(pid, tid=None):
    """The state letter (R, S, D, t, Z...) of a process's main thread, or of
    its thread tid; None if gone."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2]


def criu_waits_on_running(criu, server):
    """True while criu is blocked in wait4() (syscall 61) on the server's
    main thread, that thread runs (code criu injected into it) and every
    other thread of the server is stopped by criu: killed then, the server
    used to leave criu waiting for ever."""
    try:
        call = Path(f"/proc/{criu}/syscall").read_text().split()
        tids = [int(t.name) for t in Path(f"/proc/{server}/task").iterdir()]
    except OSError:
        return False
    if call[:2] != ["61", hex(server)] or thread_state(server) not in ("R", "S", "D"):
        return False
    return all(thread_state(server, t) == "t" for t in tids if t != server)


def criu_has_helper(criu):
    """True while criu has a stopped child process: the helpers it forks
    and stops to probe the kernel when it starts."""
    try:
        helpers = Path(f"/proc/{criu}/task/{criu}/children").read_text().split()
    except OSError:
        return False
    return any(thread_state(int(h)) in ("t", "T") for h in helpers)


def pin(pid, cpus, nice=None):
    """Puts every thread of pid on `cpus` (and at `nice`); threads that are
    gone meanwhile are skipped."""
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass


def redis_with_a_checkpoint(c):
    """Starts redis on c with no checkpoint by policy (only those asked for),
    writes 1000 keys and has a backup take one checkpoint; returns (a client
    of the leader, that backup)."""
    c.up(app="redis", extra=("--checkpoint-entries", "1000000"))
    client = Redis(c.client_addr())
    load_keys(client, 0, 1000, "v")
    b = backups(c)[0]
    wait_caught_up(c, b)
    run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir)
    assert ck(c.status(), b)["index"] > 0
    return client, b


@pytest.mark.parametrize("moment", ["starting", "injecting"])
def test_daemon_killed_while_criu_dumps(cluster, moment):
    c = cluster
    client, b = redis_with_a_checkpoint(c)
    # 200k keys of 64 bytes: a dump of a few hundred ms on this machine.
    load_keys(client, 1000, 200_000, "x" * 64)
    keys = 201_000
    store = c.dir / f"replica-{b}" / "checkpoints"
    s = c.status()["replicas"][b]
    daemon, server = s["pid"], s["server_pid"]
    daemon_t0, server_t0 = start_time(daemon), start_time(server)
    assert daemon_t0 and server_t0

    # Kill the daemon at one of the two worst moments seen. "starting": as
    # soon as criu runs, while it probes the kernel with helper processes it
    # forks and stops (a criu killed then left them stopped for ever).
    # "injecting": criu waiting for the server to run code it injected (the
    # server killed then left criu waiting for ever). Each try that misses
    # that moment lets its checkpoint finish and tries again at a later
    # index; after 11 misses the daemon is killed wherever the next dump is.
    for attempt in range(12):
        load_keys(client, keys, 10, "t")  # one more entry: each try a new index
        keys += 10
        wait_caught_up(c, b, timeout=120)
        # A dump can come and go between two looks: asked again then, at a
        # new index, without counting as a try.
        for _look in range(5):
            taken = ck(c.status(), b)["taken"]
            run("checkpoint", "now", "--id", b, "--dir", c.dir)
            criu = wait_for_criu(daemon, lambda t=taken: ck(c.status(), b)["taken"] > t)
            if criu:
                break
            load_keys(client, keys, 10, "t")
            keys += 10
            wait_caught_up(c, b, timeout=120)
        assert criu, "criu was never seen running: each dump came and went between two looks"
        criu_t0 = start_time(criu)
        end = time.monotonic() + 30
        hit = attempt == 11
        # Injecting lasts microseconds: widen it. The server's threads go to
        # CPU 0 at nice 19, where this loop spins at nice 0 (criu to CPU 1),
        # so that the code criu injects runs slowly.
        cpus = os.sched_getaffinity(0)
        try:
            if len(cpus) >= 2 and not hit and moment == "injecting":
                os.sched_setaffinity(0, {0})
                pin(criu, {1})
                pin(server, {0}, nice=19)
            while not hit and alive(criu, criu_t0) and time.monotonic() < end:
                if moment == "starting":
                    hit = criu_has_helper(criu)
                else:
                    hit = criu_waits_on_running(criu, server)
        finally:
            os.sched_setaffinity(0, cpus)
        if hit:
            break
        pin(server, cpus, nice=0)  # as it was, for the next try and what follows
        c.wait(
            lambda s, taken=taken: ck(s, b)["taken"] > taken, 60, "the checkpoint of a missed try"
        )
    half_made = list(store.glob("tmp-*"))
    # The daemon and its server: the kernel kills the server when the daemon
    # dies (PR_SET_PDEATHSIG), but only once the daemon's exit is done (tens
    # of ms to unmap its log); sent here, it lands while criu still waits.
    os.kill(daemon, signal.SIGKILL)
    os.kill(server, signal.SIGKILL)
    # The kill came while the dump was under way: its half-written images exist.
    assert len(half_made) == 1, (
        f"no checkpoint was being written when the daemon was killed: {half_made}"
    )
    killed_index = int(half_made[0].name.split("-")[1])
    try:
        run("cluster", "restart", "--id", b, "--dir", c.dir)
        s = c.wait(
            lambda s: (
                ck(s, b).get("server_state") == "running"
                and s["replicas"][b]["applied_index"] >= leader_of(s).get("commit_index", 1 << 62)
            ),
            90,
            f"replica {b} back and caught up",
        )
        # Nothing half-written survives or is listed; the good ones are.
        assert not list(store.glob("tmp-*")), list(store.iterdir())
        listed = [cp for cp in checkpoints(c) if cp["replica"] == b]
        assert listed and all(cp["ok"] and "/tmp-" not in cp["path"] for cp in listed), listed
        assert killed_index not in [cp["index"] for cp in listed], (killed_index, listed)
        # The server came back from the newest of them, then the log after it.
        newest = max(cp["index"] for cp in listed)
        log = replica_log(c, b)
        tail = log[log.rfind("recovered log") :]
        assert f"restored checkpoint {newest} " in tail, tail[-3000:]
        assert f"replaying the log from entry {newest + 1}" in tail, tail[-3000:]
        assert ck(s, b)["restored_from"] == newest, ck(s, b)
        _digest, size = assert_same_data(c, timeout=60)
        assert size == keys
        # Neither the killed daemon's criu nor its redis lives on, and every
        # process that refers to the replica's dir is the new daemon's.
        new = c.status()["replicas"][b]
        ours = {new["pid"], new["server_pid"]}
        replica_dir = c.dir / f"replica-{b}"

        def strays():
            left = {
                pid: what
                for pid, what in processes_of(replica_dir).items()
                if pid not in ours and pid not in {p for o in ours for p, _ in children(o)}
            }
            for name, pid, t0 in (
                ("criu", criu, criu_t0),
                ("redis", server, server_t0),
                ("daemon", daemon, daemon_t0),
            ):
                if alive(pid, t0):
                    left[pid] = f"the killed daemon's {name} ({thread_state(pid)})"
            return left

        try:
            wait_for(lambda: not strays(), 60, "the killed daemon's processes to be gone")
        except AssertionError:
            raise AssertionError(
                f"processes of the killed replica outlive it (killed on try {attempt + 1}, "
                f"{moment} moment caught: {hit}): {strays()}"
            ) from None
    finally:
        # Whatever the outcome, the criu this test made a stray does not
        # outlive the test (by pid, only if it is still that process).
        if alive(criu, criu_t0):
            os.kill(criu, signal.SIGKILL)


def test_server_killed_while_criu_holds_it(cluster):
    # A backup's server SIGKILLed while CRIU has it seized (CI: a memcached
    # killed while criu waited in wait4() for it to run injected code). criu
    # then waits on the dead server past any bearable time, and the daemon
    # cannot reap it while criu traces it: that replica's server stayed down
    # for the whole dump timeout (60 s), and the failed dump then turned its
    # checkpoints off for good. Made certain here by stopping criu once it
    # has seized the server: the daemon must drop the dump, restore the
    # server, and keep taking checkpoints.
    c = cluster
    client, b = redis_with_a_checkpoint(c)
    load_keys(client, 1000, 50_000, "x" * 64)  # a dump long enough to catch
    wait_caught_up(c, b)
    s = c.status()["replicas"][b]
    daemon, server, failed = s["pid"], s["server_pid"], ck(c.status(), b)["failed"]
    criu = criu_t0 = None
    try:
        for attempt in range(20):
            load_keys(client, 51_000 + attempt, 1, "t")  # each try a new index
            wait_caught_up(c, b)
            taken = ck(c.status(), b)["taken"]
            asked = subprocess.Popen(
                [str(LOCKSTEP), "checkpoint", "now", "--id", str(b), "--dir", str(c.dir)],
                stdout=subprocess.DEVNULL,
            )
            criu = wait_for_criu(daemon, lambda t=taken: ck(c.status(), b)["taken"] > t)
            if not criu:  # it came and went between two looks: again
                asked.wait(30)
                continue
            criu_t0 = start_time(criu)
            # Stop criu at a moment it holds every thread of the server.
            while alive(criu, criu_t0):
                os.kill(criu, signal.SIGSTOP)
                if thread_state(server) == "t":
                    break
                os.kill(criu, signal.SIGCONT)
                time.sleep(0.002)
            asked.wait(30)
            if alive(criu, criu_t0):
                break
            # Missed (the dump ended first): again, once it is committed.
            c.wait(lambda s: not ck(s, b)["dumping"], 30, "the missed dump")
        assert thread_state(server) == "t", "criu never caught holding the server"
        os.kill(server, signal.SIGKILL)
        s = c.wait(
            lambda s: (
                s["replicas"][b]["server_pid"] not in (0, server)
                and ck(s, b).get("server_state") == "running"
            ),
            20,
            f"replica {b}'s server restored while criu is stopped",
        )
        assert s["replicas"][b]["pid"] == daemon
        assert not alive(criu, criu_t0) or thread_state(criu) == "Z", "criu was not ended"
        log = replica_log(c, b)
        assert "abandoned: the server died during the dump" in log, log[-3000:]
        assert "restored checkpoint" in log, log[-3000:]
        # Not taken for a server CRIU cannot dump: checkpoints go on.
        assert ck(s, b)["enabled"] and not ck(s, b)["error"], ck(s, b)
        load_keys(client, 60_000, 100, "y")
        wait_caught_up(c, b)
        taken = ck(c.status(), b)["taken"]
        run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir)
        after = ck(c.status(), b)
        assert after["taken"] > taken and after["failed"] == failed, after
        _digest, size = assert_same_data(c, timeout=60)
        assert size == 51_100 + attempt + 1
    finally:
        if criu and alive(criu, criu_t0):
            os.kill(criu, signal.SIGKILL)


def mounted(path):
    return any(
        line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines()
    )


@pytest.fixture
def small_disk():
    """Mounts a tmpfs of the given size on a directory; unmounted afterwards."""
    mounts = []

    def mount(path, size):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "lockstep-test", str(path)],
            check=True,
        )
        mounts.append(path)

    yield mount
    for path in mounts:
        if mounted(path) and subprocess.run(["umount", str(path)], check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], check=True)  # busy: detach it


def test_checkpoint_that_does_not_fit_on_disk(cluster, small_disk):
    c = cluster
    c.up(app="redis", extra=("--checkpoint-entries", "1000000"))
    b = backups(c)[0]
    store = c.dir / f"replica-{b}" / "checkpoints"
    assert not list(store.iterdir())  # no checkpoint yet
    # 16 MB: an idle redis's checkpoint (about 4 MB) fits; one of a redis
    # holding 15 MB more does not. (15 MB of log comes before any backup's
    # first turn of the policy's 64 MB rule, which for replica i of 3 falls
    # at i * 64 / 3 MB past the last one (1: at 21 MB; 0: at 64 MB): no
    # checkpoint but the ones asked for.)
    small_disk(store, "16m")
    try:
        client = Redis(c.client_addr())
        load_keys(client, 0, 1000, "v")
        wait_caught_up(c, b)
        run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir)
        good = ck(c.status(), b)["index"]
        assert good > 0
        assert [cp["index"] for cp in checkpoints(c) if cp["replica"] == b] == [good]

        load_keys(client, 1000, 400, "y" * 37_500, batch=20)  # 15 MB
        wait_caught_up(c, b, timeout=120)
        before = ck(c.status(), b)
        r = run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir, check=False)
        assert r.returncode != 0 and "no space left on device" in r.stderr.lower(), r
        s = c.wait(
            lambda s: ck(s, b).get("failed", 0) > before["failed"] and not ck(s, b)["dumping"],
            60,
            "the checkpoint to fail",
        )
        status = ck(s, b)
        assert "no space left on device" in status["error"].lower(), status
        assert status["index"] == good and status["taken"] == before["taken"], status
        # A full disk is no reason to stop checkpointing for good.
        assert status["enabled"] is True, status
        log = replica_log(c, b)
        failed = [line for line in log.splitlines() if "CHECKPOINT FAILED" in line]
        assert len(failed) == 1, failed
        assert "no space left on device" in failed[0].lower() and "is full" in failed[0], failed
        assert (c.dir / f"replica-{b}" / "criu-dump-failed.log").exists()
        # Nothing half-written is left or counted.
        assert not list(store.glob("tmp-*")), list(store.iterdir())
        listed = [cp for cp in checkpoints(c) if cp["replica"] == b]
        assert [cp["index"] for cp in listed] == [good] and listed[0]["ok"], listed

        # The replica keeps applying and serving.
        load_keys(client, 1400, 2000, "z")
        wait_caught_up(c, b)
        _digest, size = assert_same_data(c, timeout=60)
        assert size == 3400
        # The good checkpoint is still the one a restore uses.
        s = kill_server_and_await_restore(c, b)
        assert ck(s, b)["restored_from"] == good, ck(s, b)
        load_keys(client, 3400, 100, "w")
        wait_caught_up(c, b)
        _digest, size = assert_same_data(c, timeout=60)
        assert size == 3500
        # Space back, checkpoints are back.
        subprocess.run(["mount", "-o", "remount,size=256m", str(store)], check=True)
        out = run("checkpoint", "now", "--id", b, "--wait", "--dir", c.dir).stdout
        assert "taken" in out, out
        listed = [cp for cp in checkpoints(c) if cp["replica"] == b]
        assert [cp["index"] for cp in listed][1:] == [good] and listed[0]["ok"], listed
        assert listed[0]["index"] > good, listed
    finally:
        c.down()  # before the tmpfs goes: the daemon writes to it
