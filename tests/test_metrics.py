"""Prometheus metrics (issue 28, item 3): every replica daemon serves
GET /metrics on the metrics_addr `cluster status --json` shows; promtool
accepts the exposition; the numbers move with load; the endpoint refuses
everything else and cuts off an oversized request; the Grafana dashboard and
the alert rules in ops/ name only metrics the daemons export."""

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

from conftest import ROOT, run
from resp import Redis

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
METRIC_NAME = re.compile(r"\blockstep_[a-z_]+\b")


def promtool():
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's prometheus package (scripts/setup lists it)"
    return path


def scrape(addr, path="/metrics", timeout=10):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def samples(text):
    """{(name, labels): value} of an exposition (labels as written, '' if none)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def check_with_promtool(text):
    p = subprocess.run(
        [promtool(), "check", "metrics"],
        input=text,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # promtool exits 0 when the exposition is valid; lint remarks (none
    # expected) go to its output and fail the test too.
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (
        f"promtool check metrics: rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    )


def exported_names(text):
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def scrape_all(status):
    return {r["id"]: scrape(r["metrics_addr"]) for r in status["replicas"]}


def test_every_replica_serves_metrics_that_promtool_accepts_and_that_move_with_load(
    cluster,
):
    promtool()
    cluster.up(app="redis")
    leader = cluster.leader()
    status = cluster.status()
    base = cluster.base_port
    for r in status["replicas"]:
        assert r["metrics_addr"] == f"127.0.0.1:{base + 250 + r['id']}", r

    before = {i: samples(t) for i, t in scrape_all(status).items()}
    for i, text in scrape_all(status).items():
        check_with_promtool(text)
    for i, s in before.items():
        is_leader = 1.0 if i == leader else 0.0
        assert s[("lockstep_role", '{role="leader"}')] == is_leader, (i, leader)
        assert s[("lockstep_role", '{role="backup"}')] == 1.0 - is_leader, (i, leader)
        assert s[("lockstep_replica_id", "")] == i
        assert s[("lockstep_ballot_leader", "")] == leader

    # Load: 300 SETs one after another, each its own input (and log entry).
    client = Redis(cluster.client_addr())
    end = time.monotonic() + 120
    for n in range(300):
        assert client.call("SET", f"key{n}", "v" * 100) == "OK"
        assert time.monotonic() < end, "300 SETs took over 120 s"
    client.close()

    def moved(i, name, labels=""):
        return after[i][(name, labels)] - before[i][(name, labels)]

    deadline = time.monotonic() + 30
    while True:  # the backups apply asynchronously; the gauges sample every 10 ms
        status = cluster.status()
        texts = scrape_all(status)
        after = {i: samples(t) for i, t in texts.items()}
        applied = [moved(i, "lockstep_applied_index") for i in after]
        if min(applied) >= 300 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for text in texts.values():
        check_with_promtool(text)

    assert moved(leader, "lockstep_commit_index") >= 300
    assert moved(leader, "lockstep_commit_latency_seconds_count") >= 300
    assert moved(leader, "lockstep_commit_latency_seconds_sum") > 0
    inf = after[leader][("lockstep_commit_latency_seconds_bucket", '{le="+Inf"}')]
    assert inf == after[leader][("lockstep_commit_latency_seconds_count", "")]
    for i in after:
        assert moved(i, "lockstep_commit_index") >= 300, i
        assert moved(i, "lockstep_applied_index") >= 300, i
        # Every SET's 100-byte value is in the log on every replica.
        assert moved(i, "lockstep_log_written_bytes_total") >= 300 * 100, i
        assert moved(i, "lockstep_disk_write_seconds_count") >= 1, i
        # Writes go through io_uring (consensus/disk_writer.cc); the disk
        # thread would serve them too, only dearer: the log says why not.
        assert moved(i, "lockstep_disk_ring_writes_total") >= 1, (
            f"replica {i} wrote no batch through io_uring: see its 'durable writes:' log line"
        )
        # `cluster status` asks every daemon through its client port.
        assert moved(i, "lockstep_client_port_bytes_total", '{direction="in"}') > 0, i
        assert moved(i, "lockstep_client_port_bytes_total", '{direction="out"}') > 0, i
        assert after[i][("lockstep_disk_error", "")] == 0
        assert after[i][("lockstep_replay_lag_entries", "")] >= 0
    for peer in after:
        if peer != leader:
            assert (
                "lockstep_peer_lag_entries",
                f'{{peer="{peer}"}}',
            ) in after[leader]

    # The dashboard and the alert rules name only what the daemons export.
    names = exported_names(texts[leader])
    suffixes = ("_bucket", "_sum", "_count")
    dashboard = json.loads((ROOT / "ops" / "grafana" / "lockstep.json").read_text())
    exprs = [
        t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", []) if "expr" in t
    ]
    assert len(exprs) >= 10, exprs
    rules = (ROOT / "ops" / "prometheus" / "alerts.yml").read_text()
    used = set(METRIC_NAME.findall("\n".join(exprs) + rules))
    for name in used:
        base_name = next((name[: -len(s)] for s in suffixes if name.endswith(s)), name)
        assert name in names or base_name in names, f"{name} is used in ops/ but not exported"


def http(addr, request, timeout=10):
    """Sends raw bytes to addr, returns everything read until the server closes."""
    host, port = addr.rsplit(":", 1)
    got = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(request)
            while chunk := s.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass  # the server closed with our bytes unread: a cut-off
    return got


def test_metrics_endpoint_refuses_other_requests_and_cuts_off_oversized_ones(
    cluster,
):
    cluster.up(app="redis")
    leader = cluster.leader()
    addr = cluster.status()["replicas"][leader]["metrics_addr"]
    for path in ("/", "/metrics/x", "/debug"):
        try:
            scrape(addr, path)
            raise AssertionError(f"GET {path} was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 404, (path, e.code)
    assert http(addr, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert http(addr, b"no http here\r\n\r\n").startswith(b"HTTP/1.1 400 ")

    # 1 MiB of header: cut off at 8 KiB (431, or a reset), promptly.
    t0 = time.monotonic()
    try:
        got = http(addr, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (1 << 20) + b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        got = b""
    assert time.monotonic() - t0 < 8
    assert got == b"" or got.startswith(b"HTTP/1.1 431 "), got[:100]

    # A scraper that connects and stalls holds only the metrics thread:
    # clients' writes commit meanwhile, and the next scrape is served.
    host, port = addr.rsplit(":", 1)
    stalled = socket.create_connection((host, int(port)))
    stalled.sendall(b"GET /metr")
    # Served once the stalled one times out (2 s), well within 8 s.
    t0 = time.monotonic()
    before = samples(scrape(addr))[("lockstep_commit_index", "")]
    assert time.monotonic() - t0 < 8
    client = Redis(cluster.client_addr())
    t0 = time.monotonic()
    for n in range(50):
        assert client.call("SET", f"k{n}", "v") == "OK"
    took = time.monotonic() - t0
    client.close()
    stalled.close()
    assert took < 20, f"50 SETs took {took:.1f} s beside a stalled scraper"
    after = samples(scrape(addr))[("lockstep_commit_index", "")]
    assert after >= before + 50
    assert cluster.leader() == leader


def test_alert_rules_and_the_example_config_pass_promtool():
    p = subprocess.run(
        [promtool(), "check", "rules", str(ROOT / "ops" / "prometheus" / "alerts.yml")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run(
        [promtool(), "check", "config", str(ROOT / "ops" / "prometheus" / "prometheus.yml")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    # The five alerts the issue asks for.
    rules = (ROOT / "ops" / "prometheus" / "alerts.yml").read_text()
    for alert in (
        "LockstepNoLeader",
        "LockstepReplicaLagging",
        "LockstepDivergence",
        "LockstepDiskWriteErrors",
        "LockstepCheckpointFailing",
    ):
        assert f"alert: {alert}" in rules, alert


def test_plain_status_names_each_replicas_metrics_address(cluster):
    cluster.up()
    base = cluster.base_port
    out = run("cluster", "status", "--dir", cluster.dir).stdout
    want = " ".join(f"{i}=127.0.0.1:{base + 250 + i}" for i in range(3))
    assert f"metrics (GET http://ADDR/metrics): {want}" in out, out

    # A cluster.toml without metrics_port: none, and status says so.
    toml = cluster.dir / "cluster.toml"
    text = re.sub(r"(?m)^# Prometheus metrics.*\nmetrics_port = \d+\n", "", toml.read_text())
    assert "metrics_port" not in text
    toml.write_text(text)
    s = json.loads(run("cluster", "status", "--json", "--dir", cluster.dir).stdout)
    assert [r["metrics_addr"] for r in s["replicas"]] == [None, None, None]
    out = run("cluster", "status", "--dir", cluster.dir).stdout
    assert "0=none 1=none 2=none  (none: no metrics_port" in out, out


def test_metrics_are_reached_from_the_client_namespace_of_netns_hosts(cluster):
    """With --hosts netns each daemon binds its metrics port on its namespace's
    address, and the replicas' firewall lets the client namespace (where a
    Prometheus would run) reach it, as it does the client and server ports."""
    from netns import run_in_netns  # eval/netns.py

    cluster.up(app="redis", transport="tcp", extra=["--hosts", "netns"])
    cluster.leader(timeout=30)
    status = cluster.status()
    texts = run_in_netns(status["client_netns"], lambda: scrape_all(status))
    for i, r in enumerate(status["replicas"]):
        assert not r["metrics_addr"].startswith("127."), r
        check_with_promtool(texts[i])
        assert samples(texts[i])[("lockstep_replica_id", "")] == i


def test_checkpoint_metrics_move_when_a_backup_checkpoints(cluster):
    """`checkpoint now` on a backup: its checkpoints_taken_total and the dump
    histogram's count go up by one, its last size is the checkpoint's."""
    cluster.up(app="redis")
    for _ in range(3):  # a backup that came to lead meanwhile is refused: another
        leader = cluster.leader()
        backup = next(r for r in range(3) if r != leader)
        addr = cluster.status()["replicas"][backup]["metrics_addr"]
        before = samples(scrape(addr))
        p = run("checkpoint", "now", "--id", backup, "--wait", "--dir", cluster.dir, check=False)
        if "is not a backup" not in p.stderr:
            break
    assert p.returncode == 0 and "taken" in p.stdout, p.stdout + p.stderr
    deadline = time.monotonic() + 10
    while True:  # mirrored every 10 ms from the checkpointer's own count
        after = samples(scrape(addr))
        key = ("lockstep_checkpoints_taken_total", "")
        if after[key] > before[key] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert after[key] == before[key] + 1
    count = ("lockstep_checkpoint_dump_seconds_count", "")
    assert after[count] == before[count] + 1
    assert after[("lockstep_checkpoint_dump_seconds_sum", "")] > 0
    assert after[("lockstep_checkpoint_last_size_bytes", "")] > 0
    assert after[("lockstep_checkpoints_failed_total", "")] == 0
    check_with_promtool(scrape(addr))


def test_a_divergence_and_its_repair_are_counted_on_the_leader(cluster):
    """A backup that flips an input (the failpoint of test_divergence) is
    found and rolled back: the leader's lockstep_divergences_total and
    lockstep_repairs_total{outcome="repaired"} say 1 each."""
    from test_checkpoint import backups, load, wait_checkpoint
    from test_divergence import restart_with_failpoint, wait_reports

    cluster.up(app="redis", extra=("--checkpoint-entries", "50"))
    client = Redis(cluster.client_addr())
    load(client, 0, 1000)  # 100 entries: every backup takes its checkpoint turns
    b = backups(cluster)[0]
    wait_checkpoint(cluster, b, above=50)
    restart_with_failpoint(cluster, b, "flipme-")
    leader = cluster.leader()
    addr = cluster.status()["replicas"][leader]["metrics_addr"]
    before = samples(scrape(addr))
    assert before[("lockstep_divergences_total", "")] == 0
    other = Redis(cluster.client_addr())
    assert other.call("SET", "fk", "flipme-A") == "OK"
    assert other.call("GET", "fk") == b"flipme-A"
    rs = wait_reports(
        cluster, lambda rs: any(r["status"] != "repairing" for r in rs), 30, "a repair"
    )
    assert [r["status"] for r in rs] == ["repaired"], rs
    deadline = time.monotonic() + 10
    while True:
        after = samples(scrape(addr))
        if after[("lockstep_repairs_total", '{outcome="repaired"}')] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert after[("lockstep_divergences_total", "")] == 1
    assert after[("lockstep_repairs_total", '{outcome="repaired"}')] == 1
    assert after[("lockstep_repairs_total", '{outcome="failed"}')] == 0
    check_with_promtool(scrape(addr))
