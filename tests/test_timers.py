"""Timers in the log (issue 31): with the profile's `timers_in_log` (on in
apps/redis.toml), the timeouts of the server's epoll waits are agreed in the
log as TICK entries (preload/shim_abi.h, "Ticks"), so what redis does from
its timers (its cron's active key expiry, BLPOP timeouts) happens at the same
point of the log on every replica, and time passes on a quiet cluster.

Before it: one connection setting 300 keys with PX 50..250, waiting 150 ms
and asking DBSIZE got another answer from the leader than from the backups
(each expired keys in its own cron, at its own moment); the leader was
judged divergent and the client's connection cut. And BLPOP with a timeout
never answered on an idle cluster, whose clock only moved with inputs.

The control (test_without_timers_the_ttl_scenario_diverges) runs the same
scenario under the profile without `timers_in_log` and shows it diverge,
so that the main test can fail."""

import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import LOCKSTEP, app_profile, run
from resp import Memcached, Redis, RespError
from test_checkpoint import backups
from test_prevention import output_checks, wait_applied
from test_redis import assert_same_data

TTL_KEYS = 300
TTL_ROUNDS = 20


def profile_without_timers(tmp_path):
    """apps/redis.toml without timers_in_log (same_clock alone)."""
    return app_profile(tmp_path, "redis", drop=("timers_in_log",))


def ttl_round(client, r):
    """The issue's scenario on one connection: 300 keys with PX 50..250 ms,
    150 ms later DBSIZE, SCAN and INFO keyspace. Returns what DBSIZE said."""
    batch = [("SET", f"r{r}-{i}", "v", "PX", 50 + i * 200 // TTL_KEYS) for i in range(TTL_KEYS)]
    assert client.pipeline(batch) == ["OK"] * TTL_KEYS
    time.sleep(0.15)
    size = client.call("DBSIZE")
    assert isinstance(size, int), size
    _cursor, keys = client.call("SCAN", 0, "COUNT", 10000)
    assert not isinstance(keys, RespError), keys
    info = client.call("INFO", "keyspace")
    assert not isinstance(info, RespError), info
    return size


def touch_all(client, keys):
    """EXISTS on every key (an input, on every replica): a key that expired
    is reclaimed now if the cron has not yet. redis's active expiry leaves a
    few expired keys behind in a sparse table (it stops sampling one under 1%
    full, and with --activerehashing no the table shrinks only as it is
    used), which DBSIZE still counts."""
    assert client.pipeline([("EXISTS", k) for k in keys]) == [0] * len(keys)


def expired_keys(cluster):
    """INFO stats expired_keys of every replica's own redis."""
    out = []
    for _, c in cluster.each_server():
        info = c.call("INFO", "stats").decode()
        out.append(int(re.search(r"expired_keys:(\d+)", info).group(1)))
    return out


def committed_ticks(cluster, first=1, last=None):
    """The TICK entries of the leader's log from index `first` on (up to
    `last` when given: an idle redis keeps ticking while this reads)."""
    count = 100000 if last is None else last - first + 1
    out = subprocess.run(
        [LOCKSTEP, "log", "--dir", str(cluster.dir), "--from", str(first), "--max", str(count)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "\tTICK " in line]


def no_divergence(cluster):
    out = output_checks(cluster)
    assert out is not None, "output checking is off: nothing would see a divergence"
    assert out["divergences"] == 0 and out["reports"] == 0, out
    return out


def test_ttl_keys_dbsize_scan_info_agree_on_every_replica(cluster):
    cluster.up(app="redis")
    client = Redis(cluster.client_addr())
    sizes = []
    # Only the replies are compared meanwhile (output checking): an
    # inspector's DEBUG DIGEST on a backup is not free of effects on redis
    # (its lookups move a rehashing table a step, which changes what the
    # cron's expiry samples next), so the data are compared once, at the end.
    for r in range(TTL_ROUNDS):
        sizes.append(ttl_round(client, r))  # a cut connection raises here
    print(f"DBSIZE 150 ms after 300 SET PX 50..250, {TTL_ROUNDS} rounds: {sizes}")
    assert client.call("PING") == "PONG"  # the same connection all along
    time.sleep(0.5)  # the longest PX has passed: the cron expires (most of) the rest
    assert client.call("SCAN", 0, "COUNT", 100000) == [b"0", []]
    touch_all(client, [f"r{r}-{i}" for r in range(TTL_ROUNDS) for i in range(TTL_KEYS)])
    wait_applied(cluster)
    d = assert_same_data(cluster)
    assert d[1] == 0, d
    counts = expired_keys(cluster)
    assert len(set(counts)) == 1 and counts[0] == TTL_KEYS * TTL_ROUNDS, counts
    out = no_divergence(cluster)
    print(f"output checks: {out['checks']}, divergences 0, reports 0")


def test_without_timers_the_ttl_scenario_diverges(cluster, tmp_path):
    # The control: same_clock without timers_in_log. Each replica's cron
    # expires keys at its own moment; the replicas' expired_keys (or their
    # replies, which output checking then reports) come out different.
    cluster.up(app=profile_without_timers(tmp_path))
    differed = False
    # Up to 15 rounds, ending at the first difference (usually the first or
    # second): on a loaded machine the replicas' crons once happened to
    # expire alike through 5 rounds (scripts/test, 2026-12-06).
    for r in range(15):
        client = Redis(cluster.client_addr())
        try:
            ttl_round(client, r)
        except (ConnectionError, OSError, AssertionError) as e:
            print(f"round {r}: {e!r}")  # the leader judged divergent: its clients cut
        finally:
            client.close()
        time.sleep(0.3)
        s = cluster.status()
        out = s["replicas"][s["leader"]]["output"] if s["leader"] is not None else {}
        if out.get("divergences", 0) > 0:
            differed = True
            break
        try:
            if len(set(expired_keys(cluster))) > 1:
                differed = True
                break
        except (OSError, RespError):
            pass
    assert differed, "without timers_in_log the replicas should disagree"


def test_blpop_with_a_timeout_answers_on_an_idle_cluster(cluster):
    cluster.up(app="redis")
    client = Redis(cluster.client_addr())
    assert client.call("SET", "x", "1") == "OK"
    took = []
    for _ in range(5):
        time.sleep(0.3)  # nothing else happens on the cluster
        t0 = time.monotonic()
        assert client.call("BLPOP", "nothing", 0.5) is None
        took.append(time.monotonic() - t0)
    print(
        "BLPOP nothing 0.5 on an idle cluster answered after "
        + ", ".join(f"{t:.2f}" for t in took)
        + " s"
    )
    # Each answered, after its timeout; most within a second (a VM pause
    # may stretch one; before timers_in_log none answered in 10 s).
    assert all(0.45 <= t < 5.0 for t in took), took
    assert statistics.median(took) < 1.0, took
    # The backups' redis timed out at the same point of the log: their
    # replies (and everything else) agree, and so does their data.
    wait_applied(cluster)
    assert_same_data(cluster)
    no_divergence(cluster)


def test_expire_with_hz_100(cluster):
    cluster.up(app="redis")
    client = Redis(cluster.client_addr())
    assert client.call("CONFIG", "SET", "hz", "100") == "OK"  # an input: on every replica
    first = cluster.status()["replicas"][cluster.leader()]["commit_index"] + 1
    for r in range(5):
        batch = [("SET", f"h{r}-{i}", "v") for i in range(200)]
        batch += [("PEXPIRE", f"h{r}-{i}", 20 + i) for i in range(200)]
        assert client.pipeline(batch)[:200] == ["OK"] * 200
        time.sleep(0.1)
        size = client.call("DBSIZE")
        assert 0 <= size <= 200 * (r + 1), size
    time.sleep(0.5)
    assert client.call("SCAN", 0, "COUNT", 100000) == [b"0", []]
    touch_all(client, [f"h{r}-{i}" for r in range(5) for i in range(200)])
    assert client.call("DBSIZE") == 0
    wait_applied(cluster)
    assert_same_data(cluster)
    counts = expired_keys(cluster)
    assert len(set(counts)) == 1 and counts[0] == 1000, counts
    no_divergence(cluster)
    # The cron runs 100 times a second now: its ticks are that frequent
    # while nothing else comes (fewer under load: inputs move the clock).
    time.sleep(1.0)
    ticks = committed_ticks(cluster, first)
    print(f"{len(ticks)} ticks in the log since CONFIG SET hz 100")
    assert len(ticks) > 50, len(ticks)


def test_an_idle_cluster_ticks_and_stays_identical(cluster, tmp_path):
    # Without state checks: the probe after the last writes would be logged
    # too, and this counts what an idle cluster logs of itself.
    cluster.up(app=app_profile(tmp_path, "redis", drop=("state_probe",)))
    client = Redis(cluster.client_addr())
    # Keys that expire while the cluster idles, at 1..25.5 s.
    batch = [("SET", f"idle-{i}", "v", "PX", 1000 + i * 500) for i in range(50)]
    assert client.pipeline(batch) == ["OK"] * 50
    start = cluster.status()["replicas"][cluster.leader()]["commit_index"]
    time.sleep(30)
    end = cluster.status()["replicas"][cluster.leader()]["commit_index"]
    ticks = committed_ticks(cluster, start + 1, end)
    rate = len(ticks) / 30
    print(
        f"idle for 30 s: {end - start} entries committed, {len(ticks)} of them ticks ({rate:.1f}/s)"
    )
    assert end - start == len(ticks)  # nothing else was logged
    assert 2 <= rate <= 50, rate  # redis's cron at hz 10: about 10 a second
    wait_applied(cluster)
    d = assert_same_data(cluster)
    assert d[1] == 0, d  # every key expired, on every replica, without a client
    counts = expired_keys(cluster)
    assert counts == [50, 50, 50], counts
    no_divergence(cluster)


def test_a_tick_not_agreed_fires_nowhere(cluster):
    # The leader's wait times out and its tick is submitted, but the backups
    # are stopped: it cannot commit. The leader is killed then. The new
    # leader's log decides which ticks fired, on every replica, the old
    # leader's restarted server (replaying the log) included.
    cluster.up(app="redis")
    client = Redis(cluster.client_addr())
    batch = [("SET", f"t-{i}", "v", "PX", 200 + i) for i in range(100)]
    assert client.pipeline(batch) == ["OK"] * 100
    wait_applied(cluster)
    old = cluster.leader()
    stopped = backups(cluster)
    for b in stopped:
        os.kill(cluster.pid(b), signal.SIGSTOP)
    try:
        time.sleep(0.5)  # the keys' time passes; the leader's ticks wait for a majority
    finally:
        os.kill(cluster.pid(old), signal.SIGKILL)
        for b in stopped:
            os.kill(cluster.pid(b), signal.SIGCONT)
    cluster.wait(lambda s: s["leader"] not in (None, old), timeout=30, what="a new leader")
    client = Redis(cluster.client_addr(timeout=30))
    assert client.call("SET", "after", "1") == "OK"
    run("cluster", "restart", "--dir", cluster.dir, "--id", old)
    time.sleep(0.5)
    assert client.call("DBSIZE") == 1  # the 100 expired under the new leader's ticks
    wait_applied(cluster, timeout=60)
    assert_same_data(cluster, timeout=60)
    counts = expired_keys(cluster)
    assert counts == [100, 100, 100], counts


def memcached_stats(addr):
    """`stats` of a backup's own memcached (nothing logged), as a dict."""
    m = Memcached(addr, inspect=True)
    try:
        m.sock.sendall(b"stats\r\n")
        out = {}
        while (line := m._line().decode()) != "END":
            _, k, v = line.split(" ", 2)
            out[k] = v
        return out
    finally:
        m.close()


def test_memcached_items_expire_at_the_same_input_everywhere(cluster):
    # apps/memcached.toml: its 1 s clock timer ticks in the log and every
    # replica's memcached is one image's restore (cloned_start), so
    # `current_time`, which item expiry counts in, is the same everywhere
    # at every input.
    cluster.up(app="memcached")
    m = Memcached(cluster.client_addr())
    now = int(time.time())  # an absolute expiry is taken against memcached's start-up time
    for i in range(60):
        exptime = 1 + i % 4 if i < 40 else now + 3 if i < 50 else 0
        m.sock.sendall(b"set x%d 0 %d 1\r\nv\r\n" % (i, exptime))
        assert m._line() == b"STORED"
    alive = []
    end = time.monotonic() + 7
    while time.monotonic() < end:
        # Through the log: every backup's replies are compared with these.
        alive.append(sum(m.get(f"x{i}") is not None for i in range(60)))
        time.sleep(0.3)
    print(f"items alive, read every 0.3 s: {alive}")
    assert alive[0] > 10 and alive[-1] == 10, alive
    assert len(set(alive)) >= 3, alive  # they expired in steps, while being read
    wait_applied(cluster)
    no_divergence(cluster)
    stats = [memcached_stats(cluster.server_addr(b)) for b in backups(cluster)]
    for field in ("curr_items", "total_items", "get_hits", "get_expired", "get_misses"):
        assert len({s[field] for s in stats}) == 1, (field, stats)
    assert stats[0]["curr_items"] == "10", stats[0]  # an expired item goes when a get meets it
    # The start-up time memcached counts from (time - uptime): one image's.
    started = {int(s["time"]) - int(s["uptime"]) for s in stats}
    assert len(started) == 1, stats


def test_a_timer_looked_at_on_a_new_connection_fires_at_the_same_input_everywhere(
    cluster, tmp_path
):
    # tests/tick_probe_server.py: its main thread fires a 0.2 s timer when
    # it wakes, and it wakes for its 2 s timeout (a tick) or for a new
    # connection. One connection asks how often the timer fired every 5 ms
    # while others are opened every 30 ms; every answer is compared with the
    # backups'. Before clk_hold the main thread, woken for a connection,
    # read the newest input's stamp and fired there: at another input on
    # each replica (the answer to the 2nd `fired` after it differed).
    server = Path(__file__).with_name("tick_probe_server.py")
    profile = tmp_path / "tick-probe.toml"
    profile.write_text(
        f'command = "{sys.executable} {server} {{port}}"\n'
        "serial_inputs = true\nsame_clock = true\ntimers_in_log = true\ncloned_start = true\n"
    )
    cluster.up(app=str(profile))
    addr = cluster.client_addr()
    stop = threading.Event()
    opened = []

    def churn():
        while not stop.is_set() and len(opened) < 1000:
            with socket.create_connection(addr, timeout=30):
                opened.append(1)
            time.sleep(0.03)

    t = threading.Thread(target=churn)
    t.start()
    counts = []
    try:
        with socket.create_connection(addr, timeout=30) as s, s.makefile("rb") as f:
            end = time.monotonic() + 5
            while time.monotonic() < end:
                s.sendall(b"fired\n")
                counts.append(int(f.readline()))
                time.sleep(0.005)
    finally:
        stop.set()
        t.join()
    print(f"{len(opened)} connections opened; the timer fired {counts[0]}..{counts[-1]} times")
    assert len(opened) > 30, len(opened)
    assert counts[-1] > counts[0], counts  # it fired (at ticks) while it was asked
    wait_applied(cluster)
    no_divergence(cluster)
