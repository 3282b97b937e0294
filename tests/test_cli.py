"""The `lockstep` command line (CLI11, guard/cli/options.h): every command's
help lists every option with its default, a bad or unknown option is refused
naming the option and the command, the exit codes are those of before, and
what follows `--` reaches the server untouched. Nothing here starts a
cluster: each refused line is refused before anything runs."""

import re

import pytest
from conftest import run

# Every option each command takes, and the default its help must state
# (None: an option with no default, a flag or a file to name). The help
# must list exactly these: an option added to the code joins this table.
DIR_DEFAULT = "$LOCKSTEP_DIR or /tmp/lockstep-cluster"
REF = {"--dir": DIR_DEFAULT, "--config": None}
OPTIONS = {
    ("replica",): {"--config": None, "--id": None, "--verbose": None, "--keep": None},
    ("cluster", "up"): {
        "--replicas": "3",
        "--transport": "shm; tcp with --hosts netns",
        "--durability": "disk",
        "--dir": DIR_DEFAULT,
        "--base-port": "7400",
        "--ring-bytes": "1048576",
        "--segment-bytes": "67108864",
        "--app": "none",
        "--ready-timeout-ms": "the profile's, else 10000",
        "--checkpoint-entries": "25000",
        "--no-checkpoints": None,
        "--backup-grace-s": "60",
        "--election-timeout-ms": "50-100",
        "--hosts": "loopback",
        "--failpoints": None,
        "--wipe": None,
        "--lease-us": "0: none",
    },
    ("cluster", "start"): {"--dir": DIR_DEFAULT},
    ("cluster", "status"): {"--dir": DIR_DEFAULT, "--json": None},
    ("cluster", "restart"): {
        "--dir": DIR_DEFAULT,
        "--id": "none",
        "--rolling": None,
        "--catch-up-ms": "60000",
    },
    ("leader", "move"): {
        **REF,
        "--to": "the backup furthest along",
        "--wait-ms": "5000",
        "--json": None,
    },
    ("cluster", "down"): {"--dir": DIR_DEFAULT, "--quiet": None},
    ("propose",): {**REF, "--replica": "the leader"},
    ("log",): {**REF, "--replica": "the leader", "--from": "1", "--max": "1000000"},
    ("truncate",): {**REF, "--replica": "the leader", "--below": None},
    ("failpoint",): {**REF, "--id": None},
    ("inspect",): {**REF, "--id": None, "--listen": "none"},
    ("checkpoint", "now"): {**REF, "--id": None, "--wait": None},
    ("checkpoint", "list"): {**REF, "--json": None},
    ("divergence", "list"): {**REF, "--json": None},
    ("divergence", "show"): {**REF, "--json": None, "--html": None},
    ("keys", "init"): {**REF, "--replicas": "cluster.toml's"},
    ("sim",): {
        "--seeds": "100",
        "--first-seed": "1",
        "--replicas": "3",
        "--seed": "none",
        "--duration-ms": "2000",
        "--verbose": None,
        "--digest": None,
        "--lease-us": "7500, the simulator's own",
        "--lease-overrun-us": "0",
        "--membership": None,
        "--membership-bug": None,
    },
    ("bench", "consensus"): {
        "--transport": "shm",
        "--durability": "disk",
        "--replicas": "3",
        "--clients": "1,16",
        "--seconds": "3",
        "--payload": "64",
        "--dir": "/tmp/lockstep-bench",
        "--json": None,
        "--base-port": "7600",
        "--spin-us": "cluster.toml's",
        "--segment-bytes": "67108864",
    },
    ("bench", "failover"): {
        "--kills": "20",
        "--clients": "4",
        "--fault": "kill",
        "--transport": "shm; tcp with --hosts netns",
        "--durability": "disk",
        "--replicas": "3",
        "--hosts": "loopback",
        "--election-timeout-ms": "50-100",
        "--dir": "/tmp/lockstep-failover",
        "--json": None,
        "--base-port": "7700",
    },
    ("demo",): {"--dir": "/tmp/lockstep-demo", "--base-port": "7800"},
}
FAMILIES = {
    "cluster": ["up", "start", "status", "restart", "down"],
    "checkpoint": ["now", "list"],
    "divergence": ["list", "show"],
    "keys": ["init"],
    "leader": ["move"],
    "bench": ["consensus", "failover"],
}
COMMANDS = [
    "replica",
    "cluster",
    "propose",
    "log",
    "truncate",
    "failpoint",
    "leader",
    "inspect",
    "checkpoint",
    "divergence",
    "keys",
    "sim",
    "bench",
    "demo",
]


def option_blocks(help_text):
    """{--option: its help text (name line and the description lines under it)}."""
    blocks, current = {}, None
    for line in help_text.splitlines():
        m = re.match(r"  (?:-h,)?(--[a-z][a-z-]*)\b", line)
        if m:
            current = m.group(1)
            blocks[current] = line
        elif current and line.startswith(" " * 20):
            blocks[current] += " " + line.strip()
        else:
            current = None
    blocks.pop("--help", None)
    return blocks


def test_help_lists_every_command():
    p = run("--help")
    assert p.returncode == 0
    for cmd in COMMANDS:
        assert re.search(rf"^  {cmd}\b", p.stdout, re.MULTILINE), (cmd, p.stdout)
    assert run("help").stdout == p.stdout
    assert run("-h").stdout == p.stdout


@pytest.mark.parametrize("path", sorted(OPTIONS), ids=" ".join)
def test_command_help_lists_every_option_with_its_default(path):
    p = run(*path, "--help")
    assert p.returncode == 0, p.stderr
    assert f"usage: lockstep {' '.join(path)} [options]" in p.stdout, p.stdout
    blocks = option_blocks(p.stdout)
    assert sorted(blocks) == sorted(OPTIONS[path]), p.stdout
    for option, default in OPTIONS[path].items():
        if default is not None:
            assert f"(default {default}" in blocks[option], (option, blocks[option])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_help_shows_each_subcommand_in_full(family):
    p = run(family, "--help")
    assert p.returncode == 0, p.stderr
    for sub in FAMILIES[family]:
        assert f"usage: lockstep {family} {sub} [options]" in p.stdout, (sub, p.stdout)
        for option in OPTIONS[(family, sub)]:
            assert option in p.stdout, (sub, option)


def test_cluster_up_help_keeps_the_prose():
    out = run("cluster", "up", "--help").stdout
    for said in (
        "{port} and {dir}",
        "--no-checkpoints turns that off",
        "--hosts netns runs each replica",
        "`up --wipe` throws it away",
        "[-- SERVER COMMAND...]",
    ):
        assert said in out, said
    # eval/stalls.py reads the default election timeout there.
    assert re.search(r"\(default (\d+)-(\d+)\)", out)


@pytest.mark.parametrize(
    "args",
    [
        ["cluster", "up", "--bogus"],
        ["cluster", "status", "--bogus"],
        ["cluster", "down", "--json"],
        ["propose", "--bogus", "x"],
        ["log", "--bogus"],
        ["truncate", "--below", "3", "--bogus"],
        ["checkpoint", "list", "--bogus"],
        ["divergence", "list", "--bogus"],
        ["keys", "init", "--bogus"],
        ["sim", "--bogus"],
        ["bench", "consensus", "--bogus"],
        ["bench", "failover", "--seconds", "3"],
        ["demo", "--bogus"],
    ],
    ids=" ".join,
)
def test_unknown_option_is_refused_naming_it_and_the_command(args):
    p = run(*args, check=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    option = next(a for a in args if a.startswith("--") and a not in ("--below",))
    command = "lockstep " + " ".join(a for a in args[:2] if not a.startswith("-"))
    assert option in p.stderr and p.stderr.startswith(command), p.stderr
    assert "--help" in p.stderr, p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize(
    "args, code, says",
    [
        (["cluster", "up", "--base-port", "74x0"], 1, "--base-port: '74x0' is not a whole number"),
        (["cluster", "up", "--base-port", "70000"], 1, "--base-port: 70000 is not in 1..65535"),
        (["cluster", "up", "--ring-bytes", "1k"], 1, "--ring-bytes: '1k' is not a whole number"),
        (["cluster", "up", "--replicas", "4"], 1, "3, 5 or 7"),
        (["cluster", "up", "--transport", "smoke"], 1, "shm, tcp or auto"),
        (["cluster", "up", "--durability", "paper"], 1, "disk or memory"),
        (["cluster", "up", "--hosts", "vm"], 1, "loopback or netns"),
        (["cluster", "up", "--ready-timeout-ms", "5"], 1, "--ready-timeout-ms"),
        (["cluster", "restart", "--id", "one"], 1, "--id: 'one' is not a whole number"),
        (["log", "--replica", "1.5"], 1, "--replica: '1.5' is not a whole number"),
        (["truncate", "--below", "0"], 1, "--below: 0 is less than 1"),
        (["replica", "--config", "x.toml", "--id", "x"], 1, "--id: 'x' is not a whole number"),
        (["sim", "--seeds", "ten"], 1, "--seeds: 'ten' is not a whole number"),
        (["sim", "--replicas", "4"], 1, "3, 5 or 7"),
        (["bench", "failover", "--kills", "0"], 2, "--kills: 0 is not in 1..1000"),
        (["bench", "consensus", "--clients", "1,x"], 2, "--clients: 'x' is not a whole number"),
        (["bench", "consensus", "--seconds", "soon"], 2, "--seconds"),
        (["demo", "--base-port", "x"], 2, "--base-port: 'x' is not a whole number"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_bad_value_is_refused_naming_the_option(args, code, says):
    p = run(*args, check=False)
    assert p.returncode == code, (p.returncode, p.stderr)
    assert says in p.stderr, p.stderr


@pytest.mark.parametrize(
    "args, code, says",
    [
        ([], 2, "usage: lockstep COMMAND"),
        (["nosuch"], 2, "unknown command 'nosuch'"),
        (["cluster"], 2, "which command? (up, start, status, restart, down)"),
        (["cluster", "bogus"], 2, "unknown command 'bogus'"),
        (["divergence", "bogus"], 2, "unknown command 'bogus'"),
        (["divergence", "show"], 2, "ID is required"),
        (["keys"], 2, "which command? (init)"),
        (["leader"], 2, "which command? (move)"),
        (["cluster", "restart", "--id", "0", "--rolling"], 1, "--id and --rolling exclude"),
        (["bench"], 2, "which command? (consensus, failover)"),
        (["propose"], 2, "no VALUE"),
        (["truncate"], 2, "--below is required"),
        (["failpoint", "off"], 2, "--id is required"),
        (["replica", "--id", "0"], 1, "--config is required"),
        (["checkpoint", "now"], 1, "--id is required"),
        (["cluster", "restart"], 1, "--id is required"),
        (["log", "--dir", "a", "--config", "b"], 2, "--dir excludes --config"),
        (["log", "--", "x"], 2, "unexpected argument 'x' after --"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_wrong_shape_exit_codes(args, code, says):
    p = run(*args, check=False)
    assert p.returncode == code, (p.returncode, p.stderr)
    assert says in p.stderr, p.stderr


def test_arguments_after_dashdash_reach_the_server_untouched(tmp_path):
    # Lockstep options after -- belong to the server's command line: the
    # command is checked (and refused, so nothing starts) with them in it.
    p = run(
        "cluster",
        "up",
        "--dir",
        tmp_path / "c",
        "--",
        "/no/such/binary",
        "--replicas",
        "4",
        "--bogus",
        "{port}",
        check=False,
    )
    assert p.returncode == 1, p.stderr
    assert "server command '/no/such/binary' does not exist" in p.stderr, p.stderr
    assert not (tmp_path / "c" / "cluster.toml").exists()
    # A lockstep argument before -- that is no option: said so, with the fix.
    p = run("cluster", "up", "--dir", tmp_path / "c", "redis-server", check=False)
    assert p.returncode == 1 and "goes after --" in p.stderr, p.stderr
