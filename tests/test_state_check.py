"""State checks (issue 29; the profile's `state_probe`, guard/server/state_check.h):
the leader runs the probe against its own server every `state_check_every_s`
seconds in which clients sent something; its request goes through the log,
every backup's server answers it at the same position, and the answers are
compared like any output. A replica whose state drifted while every reply
it gave stayed the same is found by the next check and repaired.

The fault: a failpoint flips one byte of a SET's value as one backup's
server receives it (LOCKSTEP_FAILPOINT=flip-input:MARKER); the SET answers
+OK everywhere and nothing reads the key, so only the state check (redis's
DEBUG DIGEST) can find it: the report's window holds the probe's command."""

import re
import time
from pathlib import Path

from conftest import run
from resp import Redis
from test_checkpoint import backups, load, wait_checkpoint
from test_divergence import reports, restart_with_failpoint, wait_reports
from test_prevention import output_checks, wait_applied
from test_redis import assert_same_data

ROOT = Path(__file__).parent.parent


def redis_profile(tmp_path, every_s=1):
    """apps/redis.toml with its state checks every `every_s` seconds."""
    text = (ROOT / "apps" / "redis.toml").read_text()
    text, n = re.subn(r"(?m)^(state_probe = .*)$", rf"\1\nstate_check_every_s = {every_s}", text)
    assert n == 1, "apps/redis.toml names one state_probe"
    path = tmp_path / "redis.toml"
    path.write_text(text)
    return str(path)


def state_checks(cluster, replica):
    return cluster.status()["replicas"][replica].get("state_checks") or {}


def test_a_flipped_value_no_reply_shows_is_found_by_the_state_check(cluster, tmp_path):
    c = cluster
    c.up(app=redis_profile(tmp_path), extra=("--checkpoint-entries", "50"))
    client = Redis(c.client_addr())
    load(client, 0, 1000)  # 100 entries: every backup takes its turns (each 50)
    b = backups(c)[0]
    wait_checkpoint(c, b, above=50)
    restart_with_failpoint(c, b, "flipme-")
    assert reports(c) == []  # nothing diverged so far, state checks included
    assert state_checks(c, c.leader())["checks"] >= 1, state_checks(c, c.leader())

    assert client.call("SET", "fk", "flipme-A") == "OK"  # "+OK" on the backup too
    rs = wait_reports(
        c, lambda rs: any(r["status"] != "repairing" for r in rs), 30, "a repaired divergence"
    )
    assert len(rs) == 1, rs
    r = rs[0]
    assert r["replica"] == b and not r["leader_diverged"], r
    assert r["status"] == "repaired", r
    # Found by the probe: nothing else read the key.
    assert any("DEBUG" in i and "DIGEST" in i for i in r["connection_inputs"]), r[
        "connection_inputs"
    ]
    assert Redis(c.server_addr(b), inspect=True).call("GET", "fk") == b"flipme-A"
    assert_same_data(c)
    # Checked again afterwards: the repaired backup answers the next probe
    # like the others.
    before = state_checks(c, c.leader())["checks"]
    load(client, 1000, 100)
    c.wait(
        lambda s: (s["replicas"][s["leader"]].get("state_checks") or {}).get("checks", 0) > before,
        30,
        "another state check",
    )
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
    c.wait(
        lambda s: (s["replicas"][s["leader"]].get("state_checks") or {}).get("checks", 0) >= 3,
        30,
        "three state checks",
    )
    wait_applied(c)
    st = state_checks(c, c.leader())
    assert st["failed"] == 0 and re.fullmatch(r"[0-9a-f]{40}", st["digest"]), st
    out = output_checks(c)
    assert out["divergences"] == 0 and out["reports"] == 0, out
    shown = run("cluster", "status", "--dir", c.dir).stdout
    assert "divergence report" not in shown, shown
