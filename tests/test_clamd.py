"""ClamAV clamd (apps/clamd.toml) on three replicas: a poll() loop that hands
each command to a pool thread.

Tried before the reply gate (issue 10): four clients scanning in sessions
(IDSESSION) through the leader got the right answers, but both backups were
reported diverged within a few hundred scans. A backup's server had the
replayed requests of a session in its socket at once, read ahead, and its
pool threads answered two of them in the other order ('11: ... FOUND' before
'10: stream: OK'); the leader's had read each only after answering the one
before. Each input now carries the leader's output offset of its connection
(log_input.h, out_before), and a backup's server reads it only once it has
answered as much (preload/shim_rings.c, the reply gate).

The signatures are lockstep's own (apps/clamd/lockstep.ndb): no database is
downloaded, so every replica scans with the same one.
"""

import json
import shutil
import time

import pytest
from clamd_client import Clamd, clean, infected
from conftest import kill_leader_during, on_threads, run

pytestmark = pytest.mark.skipif(
    not shutil.which("clamd"), reason="clamav-daemon is not installed (setup)"
)


def scan_load(addr, clients, scans, size=16384, every=5, on_error=None):
    """`clients` sessions scanning `scans` buffers each, one in `every`
    infected; returns {client: (clean verdicts OK, infected ones FOUND)}.
    Every verdict is checked; a connection lost while `on_error` is given is
    handed to it (a failover) and its client reconnects."""
    results = {}

    def client(k):
        ok = found = 0
        c = Clamd(addr())
        try:
            for i in range(scans):
                bad = i % every == every - 1
                data = infected(size, k * 100000 + i) if bad else clean(size, k * 100000 + i)
                try:
                    verdict = c.scan(data)
                except (ConnectionError, OSError) as e:
                    if not on_error:
                        raise
                    on_error(e)
                    c.close()
                    c = Clamd(addr())
                    continue
                if bad:
                    assert verdict.endswith("Lockstep.Test.Signature-1.UNOFFICIAL FOUND"), verdict
                    found += 1
                else:
                    assert verdict == "stream: OK", verdict
                    ok += 1
        finally:
            c.close()
        results[k] = (ok, found)

    on_threads(client, clients)
    return results


def divergences(cluster):
    return json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def found_counts(cluster):
    """How many infected streams each replica's clamd logged: its scans
    (LogClean is off, so only detections are logged)."""
    counts = {}
    for r in range(len(cluster.status()["replicas"])):
        log = cluster.dir / f"replica-{r}" / "server" / "clamd.log"
        counts[r] = log.read_text(errors="replace").count("FOUND") if log.exists() else -1
    return counts


def all_applied(cluster):
    def done(s):
        lead = s["replicas"][s["leader"]]["commit_index"] if s["leader"] is not None else -1
        return all(r["applied_index"] == lead for r in s["replicas"])

    return cluster.wait(done, 60, "every replica applied the whole log")


def test_sessions_of_four_clients_leave_no_divergence(cluster):
    cluster.up(app="clamd")
    leader = cluster.leader()
    before = cluster.status()
    res = scan_load(cluster.client_addr, clients=4, scans=150)
    assert res == {k: (120, 30) for k in range(4)}, res
    all_applied(cluster)
    # The four sessions' ends judged on every backup (not a second's wait);
    # a leader elected meanwhile judges only what came after.
    if cluster.wait_judged(before, ends=4) is None:
        print("the leader changed: the sessions' ends were judged by the old one")
    assert divergences(cluster) == []

    # A backup's last scans may still run after their inputs were handed over.
    # A backup elected meanwhile (a stalled VM) closes the old leader's
    # connections as it takes over, scans still queued in its clamd included:
    # only its count may then be lower.
    def short(counts):
        new = cluster.status()["leader"]
        return {r for r, n in counts.items() if n != 4 * 30 and not (r == new != leader)}

    end = time.monotonic() + 30
    while short(counts := found_counts(cluster)) and time.monotonic() < end:
        time.sleep(0.2)
    assert not short(counts), (counts, leader, cluster.status()["leader"])


def test_leader_killed_mid_load_clients_go_on_through_the_new_leader(cluster):
    cluster.up(app="clamd")
    done = []

    def load():
        done.append(scan_load(cluster.client_addr, 2, 400, on_error=lambda e: time.sleep(0.2)))

    started = time.monotonic()
    old = kill_leader_during(cluster, load, lambda: time.monotonic() > started + 1.0)
    print("scans per client (clean, infected):", done)
    assert done and all(ok + found > 100 for ok, found in done[0].values()), done
    # Scans through the new leader after the failover are answered as well.
    c = Clamd(cluster.client_addr())
    assert c.scan(infected(1000, 7)).endswith("FOUND")
    assert c.scan(clean(1000, 7)) == "stream: OK"
    c.close()
    assert cluster.status()["leader"] not in (None, old)


def test_bad_input_is_refused_and_the_replicas_stay_alike(cluster):
    cluster.up(app="clamd")
    addr = cluster.client_addr()
    before = cluster.status()
    # An unknown command.
    c = Clamd(addr, session=False)
    c.sock.sendall(b"zNO-SUCH-COMMAND\0")
    assert "UNKNOWN COMMAND" in c.reply()
    c.close()
    # A stream over StreamMaxLength (25M in apps/clamd/clamd.conf): refused.
    c = Clamd(addr, session=False, timeout=120)
    try:
        verdict = c.scan(clean(26 * 1024 * 1024, 3))
    except (ConnectionError, OSError) as e:  # it may close before reading it all
        verdict = repr(e)
    assert "size limit exceeded" in verdict or "reset" in verdict.lower(), verdict
    c.close()
    # A client gone in the middle of a stream.
    c = Clamd(addr, session=False)
    c.sock.sendall(b"zINSTREAM\0\0\0\x10\0" + b"x" * 1000)
    c.sock.close()
    # The server still answers, and every replica said the same throughout.
    c = Clamd(addr)
    assert c.scan(infected(5000, 1)).endswith("FOUND")
    assert c.command("PING") == "PONG"
    c.close()
    all_applied(cluster)
    # The four connections' ends judged on every backup (not a second's wait).
    if cluster.wait_judged(before, ends=4) is None:
        print("the leader changed: the connections' ends were judged by the old one")
    assert divergences(cluster) == []
