"""State checks (issue 29; the profile's `state_probe`, guard/server/state_check.h):
the leader runs the probe against its own server every `state_check_every_s`
seconds in which clients sent something; its request goes through the log,
every backup's server answers it at the same position, and the answers are
compared like any output. A replica whose state drifted while every reply
it gave stayed the same is found by the next check and repaired.

The fault: a failpoint flips one byte of a SET's value as one backup's
server receives it (LOCKSTEP_FAILPOINT=flip-input:MARKER); the SET answers
+OK everywhere and nothing reads the key, so only the state check (redis's
probe, apps/redis/state_probe.sh) can find it: the report's window holds the probe's command."""

import re
import socket
import sys
import time
from pathlib import Path

from conftest import app_profile, leader_of, run
from resp import Redis
from test_checkpoint import backups, load, wait_checkpoint
from test_divergence import one_repaired_report, reports, restart_with_failpoint, wait_reports
from test_prevention import output_checks, wait_applied
from test_redis import assert_same_data


def redis_profile(tmp_path):
    """apps/redis.toml with its state checks every second."""
    return app_profile(tmp_path, "redis", state_check_every_s=1)


def checks_once_quiet(c, timeout):
    """The leader's state-check status once it stopped changing for 3.5 s
    (checks every second: the checks ended)."""
    end, last, still_since = time.monotonic() + timeout, None, time.monotonic()
    while (st := c.state_checks()) != last or time.monotonic() - still_since < 3.5:
        assert time.monotonic() < end, f"the checks never stopped: {st}"
        if st != last:
            last, still_since = st, time.monotonic()
        time.sleep(0.2)
    return st


def test_a_flipped_value_no_reply_shows_is_found_by_the_state_check(cluster, tmp_path):
    c = cluster
    c.up(app=redis_profile(tmp_path), extra=("--checkpoint-entries", "50"))
    client = Redis(c.client_addr())
    load(client, 0, 1000)  # 100 entries: every backup takes its turns (each 50)
    b = backups(c)[0]
    wait_checkpoint(c, b, above=50)
    restart_with_failpoint(c, b, "flipme-")
    # A check that the restarted backup answered like the leader, to the end
    # of the probe's answer: its state agreed up to that entry.
    agreed = c.wait(
        lambda s: ((leader_of(s).get("output") or {}).get("state_agreed") or [0] * 3)[b] > 0,
        30,
        f"a state check replica {b} answered alike",
    )["replicas"][c.leader()]["output"]["state_agreed"][b]
    assert reports(c) == []  # nothing diverged so far, state checks included

    assert client.call("SET", "fk", "flipme-A") == "OK"  # "+OK" on the backup too
    r = one_repaired_report(c, b)
    assert r["kind"] == "state", r
    # The window runs from the last check it answered alike: the SET is in it.
    assert r["state_agreed_index"] >= agreed, (r, agreed)
    assert r["log_window"]["from"] == r["state_agreed_index"] < r["log_window"]["to"], r
    shown = run("divergence", "show", r["id"], "--dir", c.dir).stdout
    assert f"last agreed with the reference's at entry {r['state_agreed_index']}" in shown, shown
    # Found by the probe: nothing else read the key.
    assert any("EVAL" in i and "DBSIZE" in i for i in r["connection_inputs"]), r[
        "connection_inputs"
    ]
    assert Redis(c.server_addr(b), inspect=True).call("GET", "fk") == b"flipme-A"
    assert_same_data(c)
    # Checked again afterwards: the repaired backup answers the next probe
    # like the others.
    before = c.state_checks()["checks"]
    load(client, 1000, 100)
    c.wait_state_checks(before, 30)
    wait_applied(c)
    assert len(reports(c)) == 1, reports(c)


def test_a_busy_cluster_with_checks_reports_nothing(cluster, tmp_path):
    # The probe through the log is answered alike by every replica that
    # holds the same data: no divergence from the checks themselves, and the
    # digest each one reports is the leader's.
    c = cluster
    c.up(app=redis_profile(tmp_path))
    client = Redis(c.client_addr())
    end = time.monotonic() + 4
    i = 0
    while time.monotonic() < end:
        load(client, i, 100)
        client.call("EXPIRE", f"k{i}", 1)
        i += 100
    c.wait_state_checks(2, 30)
    wait_applied(c)
    st = c.state_checks()
    assert st["failed"] == 0 and re.fullmatch(
        r"[0-9a-f]{40} \d+ keys, \d+ from cursor \d+", st["digest"]
    ), st
    out = output_checks(c)
    assert out["divergences"] == 0 and out["reports"] == 0, out
    shown = run("cluster", "status", "--dir", c.dir).stdout
    assert "divergence report" not in shown, shown


def test_sliced_checks_go_on_after_the_last_write_until_a_whole_pass_ended(cluster, tmp_path):
    # redis's probe digests 1000 keys a check. After one burst of writes
    # into 2500 keys, the checks go on with no client writing (3 slices at
    # least, in a pass that began after the burst), then stop: a quiet
    # cluster is not probed for ever.
    c = cluster
    c.up(app=redis_profile(tmp_path))
    load(Redis(c.client_addr()), 0, 2500)
    at_last_write = c.state_checks().get("checks", 0)
    st = checks_once_quiet(c, 60)
    assert st["checks"] - at_last_write >= 3 and st["passes"] >= 1 and st["failed"] == 0, (
        at_last_write,
        st,
    )
    assert reports(c) == []


def draws_profile(tmp_path, cloned):
    """tests/start_draw_server.py, whose `store` keeps a random draw and
    answers OK, with `digest` as its state probe, checked every second."""
    server = Path(__file__).parent / "start_draw_server.py"
    path = tmp_path / ("draws-cloned.toml" if cloned else "draws.toml")
    path.write_text(
        'description = "stores random draws, answers OK (tests/start_draw_server.py)"\n'
        f'command = "{sys.executable} {server} {{host}} {{port}}"\n'
        f'state_probe = "{sys.executable} {server} --ask {{host}} {{port}} digest"\n'
        "state_check_every_s = 1\n" + ("cloned_start = true\n" if cloned else "")
    )
    return str(path)


def store(cluster, request=b"store"):
    with socket.create_connection(cluster.client_addr(), 10) as s:
        s.sendall(request + b"\n")
        assert s.recv(100) == b"OK\n"  # on every replica: output checking sees nothing


def test_random_draws_stored_behind_an_ok_get_a_state_report_within_one_interval(cluster, tmp_path):
    # Each replica's server draws from its own generator (no same_random, no
    # cloned start): the stored draws differ, every reply is "OK".
    cluster.up(app=draws_profile(tmp_path, cloned=False))
    store(cluster)
    t0 = time.monotonic()
    rs = wait_reports(cluster, lambda rs: len(rs) > 0, 30, "a state report")
    found = time.monotonic() - t0
    print(
        f"first report {found:.1f} s after the store: {[(r['replica'], r['status']) for r in rs]}"
    )
    assert found < 1 + 5, found  # one interval, and a loaded machine's slack
    r = rs[0]
    assert any("digest" in i for i in r["connection_inputs"]), r["connection_inputs"]
    assert r["leader"] == cluster.leader() and not r["leader_diverged"], r
    assert r["kind"] == "state", r
    listed = run("divergence", "list", "--dir", cluster.dir).stdout
    assert re.search(rf"{r['id']}\s.*\sstate\s", listed), listed
    shown = run("divergence", "show", r["id"], "--dir", cluster.dir).stdout
    assert "kind        state" in shown, shown


def test_the_same_draws_everywhere_pass_their_state_checks(cluster, tmp_path):
    # A cloned start: every replica's generator is the image's, and draws
    # in the log's order come out the same.
    cluster.up(app=draws_profile(tmp_path, cloned=True))
    for _ in range(5):
        store(cluster)
    cluster.wait_state_checks(0, 30)
    # Counted before the stores: a check that began after the last of them
    # may end before a count taken after them, and nothing new would make
    # another due (it failed so under the sanitizers, waiting 30 s for it).
    before = cluster.state_checks()["checks"]
    for _ in range(5):
        store(cluster)
    checks = cluster.wait_state_checks(before, 30)
    # One that began amid the stores makes another due within the 1 s
    # interval: settled once no new one began for 2.5 s.
    settled = last_change = time.monotonic()
    while time.monotonic() - last_change < 2.5 and time.monotonic() - settled < 30:
        time.sleep(0.25)
        now = cluster.state_checks()
        if now["checks"] != checks["checks"]:
            checks, last_change = now, time.monotonic()
    assert checks["failed"] == 0 and checks["passes"] == checks["checks"], checks
    wait_applied(cluster)
    out = output_checks(cluster)
    assert out["divergences"] == 0 and reports(cluster) == [], (out, reports(cluster))


def test_a_difference_every_replay_repeats_is_repaired_from_the_leaders_state(cluster, tmp_path):
    # Under a cloned start every replica keeps the image at entry 0. A value
    # no replay repeats (the monotonic clock's reading, stored behind an OK)
    # is found by the state check; the rollback replays it differently again,
    # so the backup takes the leader's checkpoint of its server as it is now:
    # one from at or after the entry where it diverged, not the image at 0
    # (which the leader keeps too, and which would only replay it again).
    cluster.up(app=draws_profile(tmp_path, cloned=True))
    store(cluster, b"store-now")
    rs = wait_reports(
        cluster,
        lambda rs: rs and all(r["status"] != "repairing" for r in rs) and len(rs) >= 2,
        90,
        "both backups' repairs",
    )
    print([(r["id"], r["replica"], r["kind"], r["how"], r["status"], r["action"][:90]) for r in rs])
    assert all(r["kind"] == "state" for r in rs), rs
    # Each backup ends repaired, its last repair a transfer of a checkpoint
    # from at or after the divergence.
    for b in backups(cluster):
        last = [r for r in rs if r["replica"] == b][-1]
        assert last["status"] == "repaired" and last["how"] == "transfer", last
        assert last["restored_index"] >= last["log_window"]["to"] > 0, last
    # Their state is the leader's now: a draw of the (shared) generator and
    # the next check find them alike.
    before = cluster.state_checks()["checks"]
    store(cluster)
    cluster.wait_state_checks(before, 30)
    wait_applied(cluster)
    assert len(reports(cluster)) == len(rs), reports(cluster)


def test_a_backup_whose_table_an_inspector_rehashed_passes_its_checks(cluster, tmp_path):
    # redis's hash table grows by an incremental rehash that every lookup
    # steps. 8200 keys just made it grow (from 8192 buckets to 16384), and an
    # inspector's 20000 EXISTS on one backup (unreplicated, by design) finish
    # its rehash there while the leader's and the other backup's go on. The
    # checks that follow must still find every replica alike: redis's probe
    # cuts its slices where the layout does not matter (apps/redis/
    # state_probe.sh). Slices cut wherever SCAN stopped differed here and the
    # leader was reported (CI: test_no_unagreed_service, found by a check
    # while the test read every key on each backup).
    c = cluster
    c.up(app=redis_profile(tmp_path))
    load(Redis(c.client_addr()), 0, 8200)
    b = backups(c)[0]
    inspector = Redis(c.server_addr(b), inspect=True)
    assert inspector.pipeline([("EXISTS", f"absent{i}") for i in range(20000)]) == [0] * 20000
    inspector.close()
    # A write after it: the checks go on until a pass that began after it ended.
    at_inspection = c.state_checks()
    assert Redis(c.client_addr()).call("SET", "k0", "v0") == "OK"
    st = checks_once_quiet(c, 90)
    # 8200 keys: a pass is 9 slices at most
    assert st["checks"] - at_inspection.get("checks", 0) >= 9, (at_inspection, st)
    assert st["failed"] == 0 and re.fullmatch(r"[0-9a-f]{40} 8200 keys, .*", st["digest"]), st
    wait_applied(c)
    assert reports(c) == []
