"""Replies that differ between replicas by nature (issue 8, part 5): the redis
profile's `unchecked_replies` (INFO, CLIENT LIST, CONFIG GET, ...) are left
out of the compared output stream by each replica's shim
(preload/shim_unchecked.c), so INFO in a loop causes no divergence and no
repair, while every other reply on the same connection is still compared.
The control: the same server started without the list diverges on the
first INFO."""

import json
import time
import tomllib

from conftest import run
from resp import Redis
from test_checkpoint import backups
from test_divergence import restart_with_failpoint


def reports(cluster):
    return json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def output(cluster, r):
    return cluster.status()["replicas"][r]["output"]


def info_field(client, section, field):
    text = client.call("INFO", section).decode()
    return next(x.split(":", 1)[1] for x in text.split() if x.startswith(field + ":"))


def unchecked_workload(client, rounds):
    """INFO, CLIENT LIST and CONFIG GET between ordinary commands, one at a
    time and pipelined, and INFO inside a transaction; returns what was set."""
    for i in range(rounds):
        assert client.call("SET", f"k{i}", f"v{i}") == "OK"
        assert b"redis_version" in client.call("INFO")
        assert b"addr=" in client.call("CLIENT", "LIST")
        assert client.call("GET", f"k{i}") == f"v{i}".encode()
        replies = client.pipeline(
            [
                ("INFO", "server"),
                ("INCR", "counter"),
                ("CONFIG", "GET", "port"),
                ("client", "info"),  # any case
                ("MEMORY", "USAGE", f"k{i}"),
                ("GET", f"k{i}"),
            ]
        )
        assert isinstance(replies[1], int) and replies[5] == f"v{i}".encode(), replies
    assert client.call("MULTI") == "OK"
    client.call("INFO")
    client.call("SET", "in-multi", "yes")
    replies = client.call("EXEC")
    assert b"redis_version" in replies[0] and replies[1] == "OK", replies


def test_info_in_a_loop_causes_no_repairs(cluster):
    cluster.up(app="redis", extra=("--checkpoint-entries", "50"))
    toml = tomllib.loads((cluster.dir / "cluster.toml").read_text())
    assert "INFO" in toml["server"]["unchecked_replies"], toml["server"]
    # What is left unchecked does differ between replicas: the test can fail.
    pids = {
        info_field(Redis(cluster.server_addr(b), inspect=True), "server", "process_id")
        for b in backups(cluster)
    }
    ports = {
        info_field(Redis(cluster.server_addr(b), inspect=True), "server", "tcp_port")
        for b in backups(cluster)
    }
    assert len(ports) == 2, (pids, ports)

    def workload():
        client = Redis(cluster.client_addr())
        unchecked_workload(client, 60)
        client.close()

    # The connection's end is reported at once and compared: its whole
    # stream, INFO replies left out, must be equal on every replica. Every
    # backup's end judged first (not a second's wait: that passed unjudged
    # on a slow machine).
    before, st = cluster.judged_run(workload)
    print(
        f"INFO in a loop: {st['checks'] - before['checks']} checks, {st['divergences']} divergences"
    )
    assert st["checks"] > before["checks"] + 1, st
    assert st["divergences"] == 0 and st["repairs"] == 0 and st["suspended"] == [], st
    assert reports(cluster) == []
    for b in backups(cluster):
        assert output(cluster, b)["points_sent"] > 0


def test_a_real_divergence_beside_info_is_still_caught(cluster):
    # The same connection asks INFO all along, and one of its SETs reaches
    # one backup's redis with a flipped byte: that is reported and repaired.
    cluster.up(app="redis", extra=("--checkpoint-entries", "50"))
    client = Redis(cluster.client_addr())
    unchecked_workload(client, 10)  # past the first checkpoints
    b = backups(cluster)[0]
    restart_with_failpoint(cluster, b, "flipme-")
    client = Redis(cluster.client_addr())
    assert b"redis_version" in client.call("INFO")
    assert client.call("SET", "fk", "flipme-A") == "OK"
    assert b"redis_version" in client.call("INFO")
    assert client.call("GET", "fk") == b"flipme-A"
    end = time.monotonic() + 30
    while time.monotonic() < end and not any(r["status"] != "repairing" for r in reports(cluster)):
        time.sleep(0.1)
    rs = reports(cluster)
    assert len(rs) == 1 and rs[0]["replica"] == b and rs[0]["status"] == "repaired", rs
    # The window runs from the last agreeing check (after the SET's "+OK",
    # equal everywhere) to the GET whose reply differs; the outputs hold
    # what was compared, INFO's replies left out.
    assert any("GET" in i and "fk" in i for i in rs[0]["connection_inputs"]), rs[0]
    outs = {o["from_replica"]: o["bytes"] for o in rs[0]["outputs"]}
    # The judge's own output (a leader change since, under load, moves cluster.leader()).
    assert "flipme-A" in outs[rs[0]["leader"]] and "flipme-@" in outs[b], outs
    assert not any("redis_version" in o for o in outs.values()), outs
    # The same report as a page of its own: both outputs, the byte marked.
    page = cluster.dir / "report.html"
    run("divergence", "show", rs[0]["id"], "--html", page, "--dir", cluster.dir)
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "flipme-" in html, html[:500]
    assert "<mark>A</mark>" in html and "<mark>@</mark>" in html, html
    open_status = cluster.status()
    unchecked_workload(client, 5)
    client.close()
    assert cluster.wait_judged(open_status) is not None, "the leader changed"
    assert len(reports(cluster)) == 1, reports(cluster)


def test_without_the_list_info_diverges(cluster):
    # The control: the profile's command after `--` runs without
    # unchecked_replies (and without same_random): the first INFO's replies
    # differ (each replica's pid and port) and are judged a divergence.
    cluster.up_bare("redis")
    client = Redis(cluster.client_addr())
    assert client.call("SET", "a", "1") == "OK"
    assert b"process_id" in client.call("INFO", "server")
    end = time.monotonic() + 15
    while time.monotonic() < end and not reports(cluster):
        time.sleep(0.1)
    rs = reports(cluster)
    assert rs, "INFO's differing replies went unnoticed"
    assert any("INFO" in i for r in rs for i in r["connection_inputs"]), rs


def test_a_bad_list_is_a_clear_error(tmp_path):
    for bad in ("INFO; CLIENT LIST", "INFO,", "CLIENT LIST ALL", "CONFIG GET*"):
        (tmp_path / "cluster.toml").write_text(
            '[cluster]\nsecret = "0123456789abcdef"\n\n[server]\n'
            'command = "redis-server --port {port}"\n'
            f'unchecked_replies = "{bad}"\n\n[[replica]]\nid = 0\nhost = "127.0.0.1"\n'
            f'peer_port = 1\nclient_port = 2\nserver_port = 3\ndir = "{tmp_path}/0"\n'
        )
        r = run("cluster", "status", "--dir", tmp_path, check=False)
        assert r.returncode != 0, (bad, r)
        want = (
            "cluster.toml:6:21: field 'unchecked_replies': expected commands, each one or two words"
        )
        assert want in r.stderr, (bad, r.stderr)
