"""Prevention (issue 8, part 5): with the app profile's `same_clock`, every
replica's server reads the same wall clock while it processes a given input,
the leader's time when it proposed it, carried in the log entry
(preload/shim_clock.c, guard/server/log_input.h). So redis's TIME answers the same
everywhere, a key set with PX gets the same expiry time everywhere, and it
expires at the same input on a backup that replays late as on the leader.
Without it the replicas diverge (the control that shows the test can fail).
Each workload prints how much the replicas agree, off and on.

apps/redis.toml also sets `timers_in_log` (issue 31, tests/test_timers.py):
its timeouts are ticks in the log, which move the clock between inputs.
What the clock does between inputs under same_clock alone (it stands at
the last input's stamp) is checked with the profile without it
(frozen_profile)."""

import os
import signal
import time
import tomllib

from conftest import run
from resp import Redis, RespError
from test_checkpoint import backups, kill_server_and_await_restore
from test_prevention import output_checks, wait_applied
from test_redis import assert_same_data
from test_timers import profile_without_timers

# TIME inside a script (redis 7 allows it: scripts replicate their effects),
# recorded into a list so that each replica's answer stays in its data.
TIME_SCRIPT = "local t = redis.call('TIME') redis.call('RPUSH', 'times', t[1] .. ' ' .. t[2])"
# What a GET found, recorded the same way.
SEEN_SCRIPT = "redis.call('RPUSH', 'seen', redis.call('GET', KEYS[1]) or 'expired')"
EXPIRY_KEYS = 20
LAG_ROUNDS = 4


def frozen_profile(tmp_path):
    """apps/redis.toml without timers_in_log: same_clock alone, under which
    a server's clock stands still between inputs."""
    return profile_without_timers(tmp_path)


def record_times(client, n):
    """n TIME readings, one input each, kept in the list `times`."""
    for _ in range(n):
        assert not isinstance(client.call("EVAL", TIME_SCRIPT, 0), RespError)


def set_with_expiry(client):
    """Keys with a PX expiry far away: each replica stores the absolute
    expiry time it computed from its clock (PEXPIRETIME shows it)."""
    for i in range(EXPIRY_KEYS):
        assert client.call("SET", f"px-{i}", "v", "PX", 100000) == "OK"


def expire_while_a_backup_lags(cluster, client):
    """SET k v PX 200, 0.3 s later GET k (recorded into the list `seen`),
    while one backup's redis is stopped: once it runs again it replays both
    within a millisecond. The leader found the key expired; the backup finds
    it expired only if its clock is the leader's. Returns that backup."""
    b = backups(cluster)[0]
    pid = cluster.status()["replicas"][b]["server_pid"]
    assert pid
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(LAG_ROUNDS):
            assert client.call("SET", f"lag-{i}", "v", "PX", 200) == "OK"
            time.sleep(0.3)
            assert not isinstance(client.call("EVAL", SEEN_SCRIPT, 1, f"lag-{i}"), RespError)
    finally:
        os.kill(pid, signal.SIGCONT)
    return b


def micros(reading):
    """A reading of `times` (b"SECONDS MICROSECONDS") in microseconds."""
    sec, usec = reading.split()
    return int(sec) * 1000000 + int(usec)


def idle_time(cluster, r):
    """TIME on replica r's redis over a connection of its own, outside the
    log (a backup's: not an input), in microseconds."""
    c = Redis(cluster.server_addr(r), inspect=True)
    try:
        sec, usec = c.call("TIME")
    finally:
        c.close()
    return int(sec) * 1000000 + int(usec)


def backup_view(cluster, r, key):
    c = Redis(cluster.server_addr(r), inspect=True)
    try:
        return c.call("LRANGE", key, 0, -1)
    finally:
        c.close()


def wait_read(cluster, lengths, timeout=20.0):
    """Waits until every backup's redis has executed its inputs up to where
    its lists have these lengths ({key: length}): applied_index says the
    daemon handed an entry over, not that the server read it."""
    end = time.monotonic() + timeout
    for r in backups(cluster):
        while True:
            try:
                c = Redis(cluster.server_addr(r), inspect=True)
            except OSError:  # a restarted replica's redis, not up yet
                got = None
            else:
                try:
                    got = {k: c.call("LLEN", k) for k in lengths}
                finally:
                    c.close()
            if got == lengths:
                break
            assert time.monotonic() < end, f"replica {r} holds {got}, not {lengths}"
            time.sleep(0.05)


def workload(cluster, client):
    record_times(client, 50)
    set_with_expiry(client)
    lagging = expire_while_a_backup_lags(cluster, client)
    record_times(client, 10)  # after the lag too
    return lagging


def replica_views(cluster):
    """Each replica's TIME readings, GET findings, expiry times and DEBUG
    DIGEST, read from its own redis (a backup's without any input: its
    clock stays where its last input left it)."""
    return [
        {
            "times": c.call("LRANGE", "times", 0, -1),
            "seen": c.call("LRANGE", "seen", 0, -1),
            "expiry": c.pipeline([("PEXPIRETIME", f"px-{i}") for i in range(EXPIRY_KEYS)]),
            "digest": c.call("DEBUG", "DIGEST"),
        }
        for _, c in cluster.each_server()
    ]


def agreement(views, field):
    """Fraction of the positions of `field` where every replica has the same value."""
    values = [v[field] for v in views]
    n = max(map(len, values))
    same = sum(len({str(x[i]) for x in values}) == 1 for i in range(min(map(len, values))))
    return same / max(1, n)


def report(label, views, lagging):
    figures = {f: agreement(views, f) for f in ("times", "seen", "expiry")}
    print(
        f"same_clock {label}: {figures['times']:.0%} of TIME readings, "
        f"{figures['expiry']:.0%} of PX expiry times and {figures['seen']:.0%} of the "
        f"GETs 0.3 s after SET PX 200 (backup {lagging} lagging) agree on every replica; "
        f"{len({v['digest'] for v in views})} distinct DEBUG DIGEST(s)"
    )
    return figures


def test_time_and_expiry_are_the_same_on_every_replica(cluster):
    cluster.up(app="redis")
    toml = tomllib.loads((cluster.dir / "cluster.toml").read_text())
    assert toml["server"]["same_clock"] is True, "apps/redis.toml must set same_clock"
    client = Redis(cluster.client_addr())
    t0 = time.time()
    lagging = workload(cluster, client)
    wait_applied(cluster)
    wait_read(cluster, {"times": 60, "seen": LAG_ROUNDS})
    # Between inputs the ticks move a backup's clock on from its last
    # input's time (asked outside the log): never back, never past now.
    last = micros(backup_view(cluster, lagging, "times")[-1])
    for b in backups(cluster):
        assert last <= idle_time(cluster, b) <= time.time() * 1e6 + 1e6
    views = replica_views(cluster)
    figures = report("on", views, lagging)
    leader = views[cluster.leader()]
    # Real readings: the leader's time, growing, within the test's run.
    times = [micros(t) / 1e6 for t in leader["times"]]
    assert len(times) == 60 and times == sorted(times), times
    assert t0 - 1 <= times[0] and times[-1] <= time.time() + 1, (t0, times)
    assert len(set(times)) == 60  # one stamp per input: every reading its own
    expiries = leader["expiry"]
    assert all(isinstance(e, int) and e > t0 * 1000 + 99000 for e in expiries), expiries
    # The leader found every key expired; so did the backup that replayed late.
    assert leader["seen"] == [b"expired"] * LAG_ROUNDS
    assert figures == {"times": 1.0, "seen": 1.0, "expiry": 1.0}, figures
    assert len({v["digest"] for v in views}) == 1
    assert_same_data(cluster)
    # And the replies were the same: output checking found nothing.
    out = output_checks(cluster)
    assert out is None or (out["divergences"] == 0 and out["reports"] == 0), out


def test_without_same_clock_the_replicas_diverge(cluster):
    # The control: the profile's own command, started without the profile
    # (after `--`), so without same_clock (and same_random). Without output
    # digests too (LOCKSTEP_SHIM_OUTPUT_DIGESTS=0, inherited by the daemons
    # and their servers): output checking would see TIME's replies differ and
    # repair the backups (guard/output/output_guard.h); this test is about the data.
    cluster.up_bare("redis", env=dict(os.environ, LOCKSTEP_SHIM_OUTPUT_DIGESTS="0"))
    client = Redis(cluster.client_addr())
    lagging = workload(cluster, client)
    wait_applied(cluster)
    wait_read(cluster, {"times": 60, "seen": LAG_ROUNDS})
    views = replica_views(cluster)
    figures = report("off", views, lagging)
    assert len({v["digest"] for v in views}) > 1, "the data should differ without same_clock"
    # Microseconds of TIME hardly ever agree; expiry times are in ms, and a
    # backup may replay a SET within the leader's millisecond now and then.
    assert figures["times"] < 0.5 and figures["expiry"] < 1.0, figures
    # The backup that replayed late found keys the leader had found expired.
    leader = views[cluster.leader()]["seen"]
    assert views[lagging]["seen"] != leader, (leader, views[lagging]["seen"])
    assert figures["seen"] < 1.0, figures


def test_a_restored_server_keeps_the_clock_of_its_checkpoint(cluster, tmp_path):
    # The clock is in the server's memory: a backup's redis restored from its
    # CRIU checkpoint reads the time of the checkpoint's last input (not its
    # own clock) until it is given the next input, and then that input's.
    # Under same_clock alone: ticks would move it on (frozen_profile).
    cluster.up(app=frozen_profile(tmp_path))
    client = Redis(cluster.client_addr())
    set_with_expiry(client)
    record_times(client, 20)  # the last input: its time is the last reading
    wait_applied(cluster)
    wait_read(cluster, {"times": 20})
    b, other = backups(cluster)
    out = run("checkpoint", "now", "--id", b, "--wait", "--dir", cluster.dir).stdout
    assert "taken" in out, out
    last = micros(backup_view(cluster, other, "times")[-1])
    time.sleep(0.5)  # the real clock moves on meanwhile
    kill_server_and_await_restore(cluster, b)
    assert idle_time(cluster, b) == last
    record_times(client, 10)
    client.call("RPUSH", "seen", "none")
    wait_applied(cluster)
    wait_read(cluster, {"times": 30, "seen": 1})
    assert idle_time(cluster, b) == idle_time(cluster, other) > last
    views = replica_views(cluster)
    figures = {f: agreement(views, f) for f in ("times", "expiry")}
    assert figures == {"times": 1.0, "expiry": 1.0}, figures
    assert len(views[0]["times"]) == 30
    assert_same_data(cluster)


def test_the_clock_goes_on_across_a_leader_change(cluster):
    # A new leader stamps its inputs no lower than the log's newest stamp,
    # and its own redis reads them with the completions that release them;
    # the old leader, restarted with an empty redis, replays the whole log
    # (long after the fact) under the same stamps.
    cluster.up(app="redis")
    client = Redis(cluster.client_addr())
    set_with_expiry(client)
    record_times(client, 20)
    client.close()
    old = cluster.leader()
    os.kill(cluster.pid(old), signal.SIGKILL)
    cluster.wait(lambda s: s["leader"] not in (None, old), what="a new leader")
    client = Redis(cluster.client_addr())
    record_times(client, 20)
    client.call("RPUSH", "seen", "none")
    run("cluster", "restart", "--dir", cluster.dir, "--id", old)
    wait_applied(cluster)
    wait_read(cluster, {"times": 40, "seen": 1}, timeout=30.0)
    views = replica_views(cluster)
    figures = {f: agreement(views, f) for f in ("times", "expiry")}
    assert figures == {"times": 1.0, "expiry": 1.0}, figures
    times = [micros(t) for t in views[0]["times"]]
    assert len(times) == 40 and times == sorted(times) and len(set(times)) == 40, times
    assert_same_data(cluster, timeout=30.0)


def test_a_bad_same_clock_in_cluster_toml_is_an_error(tmp_path):
    (tmp_path / "cluster.toml").write_text(
        '[cluster]\nsecret = "0123456789abcdef"\n\n[server]\ncommand = "redis-server --port {port}"\n'
        'same_clock = 1\n\n[[replica]]\nid = 0\nhost = "127.0.0.1"\npeer_port = 1\n'
        f'client_port = 2\nserver_port = 3\ndir = "{tmp_path}/0"\n'
    )
    r = run("cluster", "status", "--dir", tmp_path, check=False)
    assert r.returncode != 0
    assert "cluster.toml:6:14: field 'same_clock': expected true or false" in r.stderr, r.stderr
