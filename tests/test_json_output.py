"""Every `--json` output of `lockstep` is JSON that other tools read: each
command that takes --json (cluster status, checkpoint list, divergence list,
divergence show, bench consensus and bench failover) is run against a real
cluster and its output piped through `python3 -m json.tool` and `jq`. The
divergence is a real one (a backup's daemon flips a byte of a replayed input,
as in test_divergence.py) in a reply full of bytes that are not text (a
non-ASCII byte, control bytes, a quote, a backslash, a NUL), so that the
report's escaping is what is checked; a damaged report file on disk must not
make the list unreadable either."""

import json
import subprocess
import sys

from conftest import run
from resp import Redis
from test_checkpoint import backups, load, wait_checkpoint
from test_divergence import restart_with_failpoint, wait_reports

# What the flipped GET answers: the byte after the marker (0xe9) becomes 0xe8
# on the backup.
VALUE = b'flipme-\xe9\x01"\\\x00\x7f\xc3\xa9\xff\r\n-end'


def parses_everywhere(text):
    """text through `python3 -m json.tool` and `jq`, both must succeed; the value."""
    value = json.loads(text)
    for tool in ([sys.executable, "-m", "json.tool"], ["jq", "-c", "."]):
        p = subprocess.run(
            tool, input=text, capture_output=True, text=True, timeout=60, check=False
        )
        assert p.returncode == 0, f"{tool[0]} refused it: {p.stderr}\n{text[:2000]}"
        assert json.loads(p.stdout) == value, f"{tool[0]} read it otherwise"
    return value


def lockstep_json(*args, check=True):
    return parses_everywhere(run(*args, check=check).stdout)


def test_every_json_output_parses_with_json_tool_and_jq(cluster, tmp_path):
    c = cluster
    c.up(app="redis", extra=("--checkpoint-entries", "50"))
    client = Redis(c.client_addr())
    load(client, 0, 1000)
    b = backups(c)[0]
    wait_checkpoint(c, b, above=50)
    restart_with_failpoint(c, b, "flipme-")
    other = Redis(c.client_addr())
    assert other.call("SET", "fk", VALUE) == "OK"
    assert other.call("GET", "fk") == VALUE
    wait_reports(c, lambda rs: any(r["status"] != "repairing" for r in rs), 30, "a repair")

    # cluster status --json
    s = lockstep_json("cluster", "status", "--json", "--dir", c.dir)
    assert s["leader"] == c.leader() and s["client_addr"], s
    assert [r["id"] for r in s["replicas"]] == [0, 1, 2], s
    for r in s["replicas"]:
        assert r["role"] in ("leader", "backup") and isinstance(r["commit_index"], int), r
        assert isinstance(r["checkpoint"]["index"], int) and "output" in r, r
    assert s["replicas"][c.leader()]["output"]["reports"] == 1, s

    # checkpoint list --json
    cps = lockstep_json("checkpoint", "list", "--json", "--dir", c.dir)
    assert any(x["replica"] == b and x["index"] > 50 and x["ok"] for x in cps), cps
    assert all(isinstance(x["bytes"], int) and isinstance(x["path"], str) for x in cps), cps

    # divergence list --json, divergence show ID --json
    rs = lockstep_json("divergence", "list", "--json", "--dir", c.dir)
    assert len(rs) == 1 and rs[0]["replica"] == b and rs[0]["status"] == "repaired", rs
    r = lockstep_json("divergence", "show", rs[0]["id"], "--json", "--dir", c.dir)
    assert r == rs[0]
    # The bytes come back as they were sent: one code point per byte.
    outs = {o["from_replica"]: o["bytes"].encode("latin-1") for o in r["outputs"]}
    assert VALUE in outs[c.leader()], outs
    assert VALUE.replace(b"\xe9", b"\xe8") in outs[b], outs
    assert isinstance(r["offset"], int) and isinstance(r["log_window"]["to"], int), r
    # The text view shows the same report.
    shown = run("divergence", "show", r["id"], "--dir", c.dir).stdout
    assert f"replica {b} diverged" in shown and ">>" in shown, shown

    # After the fact, from the files, with one of them damaged.
    leader = c.leader()
    run("cluster", "down", "--dir", c.dir, "--quiet")
    damaged = c.dir / f"replica-{leader}" / "divergences" / "9-9.json"
    damaged.write_bytes(b'{"id":"9-9","time_unix":1,"stack":"\xff\x00')
    rs = lockstep_json("divergence", "list", "--json", "--dir", c.dir)
    assert [x["id"] for x in rs] == ["9-9", r["id"]], rs
    assert rs[0]["status"] == "unreadable" and "damaged" in rs[0]["error"], rs[0]
    assert lockstep_json("divergence", "show", r["id"], "--json", "--dir", c.dir) == r


def test_bench_json_files_parse_with_json_tool_and_jq(cluster, tmp_path):
    out = tmp_path / "consensus.json"
    run(
        *("bench", "consensus", "--durability", "memory", "--clients", "1"),
        *("--seconds", "1", "--dir", cluster.dir / "consensus"),
        *("--base-port", cluster.base_port, "--json", out),
        timeout=300,
    )
    runs = parses_everywhere(out.read_text())["runs"]
    assert len(runs) == 1 and runs[0]["clients"] == 1 and runs[0]["durability"] == "memory", runs
    assert isinstance(runs[0]["ops"], int) and runs[0]["ops"] > 0, runs
    out = tmp_path / "failover.json"
    run(
        *("bench", "failover", "--kills", "2", "--clients", "2"),
        *("--dir", cluster.dir / "failover", "--base-port", cluster.base_port, "--json", out),
        timeout=300,
    )
    r = parses_everywhere(out.read_text())
    assert r["kills"] == 2 and len(r["failover_ms"]) == 2 and r["lost_acknowledged"] == 0, r
    assert isinstance(r["election_timeout_ms"][0], int), r
