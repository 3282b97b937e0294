"""Fixtures for the integration tests: the lockstep binary and local clusters.

Every cluster gets its own directory and port range, and is torn down (each
replica stopped by its pid) even when the test fails.
"""

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import declared_skips  # tests/declared_skips.py: the rule, shared with scripts/ctest_skips
import pytest

ROOT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT_DIR / "eval"))  # eval/resp.py: the redis and memcached clients

ROOT = Path(__file__).resolve().parent.parent
# $LOCKSTEP_BUILD names another build directory (e.g. one engineer's own,
# so as not to share build/ with another's); build/ by default.
BUILD_DIR = Path(os.environ.get("LOCKSTEP_BUILD") or ROOT / "build")
LOCKSTEP = BUILD_DIR / "bin" / "lockstep"
_ports = itertools.count(0)


def run(*args, check=True, timeout=120, **kw):
    """Runs `lockstep ARGS`, returning the CompletedProcess (text mode)."""
    p = subprocess.run(
        [str(LOCKSTEP), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
    if check and p.returncode != 0:
        raise AssertionError(
            f"lockstep {' '.join(map(str, args))} exited {p.returncode}\n"
            f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return p


def leader_of(s):
    """The leader's entry of a cluster status, or {} while there is none (an
    election, a leader's checkpoint for a repair): a wait's predicate reads
    the leader through this, so a status between leaders is just "not yet"."""
    return s["replicas"][s["leader"]] if s.get("leader") is not None else {}


def app_profile(tmp_path, app, drop=(), **fields):
    """apps/<app>.toml written into tmp_path with the top-level fields in
    `drop` removed (each must be there once) and `fields` added (a field
    the profile names already is replaced); the path, for cluster.up(app=)."""
    import re

    text = (ROOT / "apps" / f"{app}.toml").read_text()
    # Its configuration files (`files`, relative to the profile) go beside it.
    files = re.search(r'(?m)^files = "(.*)"$', text)
    for f in files.group(1).split(",") if files else ():
        (tmp_path / f.strip()).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "apps" / f.strip(), tmp_path / f.strip())
    for name in (*drop, *fields):
        text, n = re.subn(rf"(?m)^{name} = .*$", "", text)
        assert n == 1 or name in fields, f"apps/{app}.toml sets {name} once"
    head, sep, tables = text.partition("\n[")  # top-level fields go before any table
    added = "".join(
        f"{k} = {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in fields.items()
    )
    path = tmp_path / f"{app}.toml"
    path.write_text(head.rstrip("\n") + "\n" + added + sep + tables)
    return str(path)


def on_threads(client, count, timeout=300):
    """Runs client(k) for k in 0..count-1, each on a thread of its own, and
    fails with what every client that raised said (all clients end first)."""
    errors = []

    def one(k):
        try:
            client(k)
        except BaseException as e:  # noqa: BLE001 - every client's failure is reported
            errors.append(f"client {k}: {e!r}")

    threads = [threading.Thread(target=one, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), f"clients still running after {timeout} s"
    assert not errors, errors


def kill_leader_during(cluster, load, started, timeout=300):
    """Runs load() on a thread; once started() is true, SIGKILLs the leader's
    daemon and waits for another leader; then waits for load to end (it must
    go on through the new leader, and fails the test if it raised). Returns
    the killed replica's id."""
    old = cluster.leader()
    failure = []

    def run_load():
        try:
            load()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            failure.append(e)

    worker = threading.Thread(target=run_load)
    worker.start()
    end = time.monotonic() + 60
    while not started() and worker.is_alive():
        assert time.monotonic() < end, "the load did not get going within 60 s"
        time.sleep(0.02)
    os.kill(cluster.pid(old), signal.SIGKILL)
    cluster.wait(lambda s: s["leader"] not in (None, old), 30, "a new leader")
    worker.join(timeout)
    assert not worker.is_alive(), f"the load still runs {timeout} s after the failover"
    assert not failure, repr(failure[0])
    return old


def writable_redis_profile(tmp_path):
    """apps/redis.toml without its inspect_commands, in tmp_path: `lockstep
    inspect` then passes every byte, so that a test can change a backup's
    data behind the log's back (a divergence to find and repair)."""
    text = (ROOT / "apps" / "redis.toml").read_text()
    start = text.index("inspect_commands = [")
    end = text.index("]\n", start) + 2
    shutil.copytree(ROOT / "apps" / "redis", tmp_path / "redis")
    profile = tmp_path / "redis.toml"
    profile.write_text(text[:start] + text[end:])
    return str(profile)


class Cluster:
    def __init__(self, directory: Path, base_port: int):
        self.dir = directory
        self.base_port = base_port

    def up(
        self,
        replicas=3,
        transport="shm",
        durability="disk",
        extra=(),
        app=None,
        check=True,
        env=None,
    ):
        """`cluster up`; env: variables added to the replicas' environment."""
        if app:
            extra = ("--app", app, *extra)
        return run(
            "cluster",
            "up",
            "--dir",
            self.dir,
            "--replicas",
            replicas,
            "--transport",
            transport,
            "--durability",
            durability,
            "--base-port",
            self.base_port,
            *extra,
            check=check,
            env={**os.environ, **env} if env else None,
        )

    def up_bare(self, app, extra=(), env=None):
        """The app profile's command alone, after `--`: none of the profile's
        prevention (same_random, same_clock) or unchecked replies. The
        control of tests that show what those do."""
        command = tomllib.loads((ROOT / "apps" / f"{app}.toml").read_text())["command"]
        run(
            *("cluster", "up", "--dir", self.dir, "--base-port", self.base_port),
            *extra,
            *("--", command),
            env=env,
        )
        server = tomllib.loads((self.dir / "cluster.toml").read_text())["server"]
        for field in ("same_random", "same_clock", "unchecked_replies"):
            assert field not in server, server

    def status(self):
        return json.loads(run("cluster", "status", "--json", "--dir", self.dir).stdout)

    def leader(self, timeout=10.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s = self.status()
            if s["leader"] is not None:
                return s["leader"]
            time.sleep(0.02)
        raise AssertionError(f"no leader within {timeout}s: {self.status()}")

    def client_addr(self, timeout=10.0):
        """(host, port) of the leader's server, where clients connect."""
        return self.client_addr_and_ballot(timeout)[0]

    def client_addr_and_ballot(self, timeout=10.0):
        """The leader's client address and the ballot it leads under, from one
        status: read apart, a change of leader between the two readings gives
        the new ballot with the old address."""
        s = self.wait(
            lambda s: s.get("leader") is not None and s.get("client_addr"),
            timeout,
            "a leader's server",
        )
        host, port = s["client_addr"].rsplit(":", 1)
        return (host, int(port)), leader_of(s)["ballot"]

    def client_addr_after_leader_change(self, ballot, timeout=30.0):
        """For a client the leader cut: the client address of a leader under a
        ballot other than `ballot`, and that ballot. A leader cuts its clients
        when it steps down; a cut while the same ballot still leads is a
        defect, so that fails here."""
        addr, now = self.client_addr_and_ballot(timeout)
        if now == ballot:
            time.sleep(2)  # the stepped-down leader may still show until it hears
            addr, now = self.client_addr_and_ballot(timeout)
        assert now != ballot, (
            f"the leader closed a client's connection but still leads: {self.status()}"
        )
        return addr, now

    def server_addr(self, replica):
        host, port = self.status()["replicas"][replica]["server_addr"].rsplit(":", 1)
        return host, int(port)

    def each_server(self, timeout=20.0):
        """(replica, a redis client of its own server) for every replica in
        turn, waiting while a server is being restored; each client is
        closed once the caller moves on."""
        from resp import Redis  # eval/resp.py, on sys.path above

        end = time.monotonic() + timeout
        for r in range(len(self.status()["replicas"])):
            while True:
                try:
                    c = Redis(self.server_addr(r), inspect=True)
                    break
                except OSError:  # a server being restored
                    assert time.monotonic() < end, f"replica {r}'s redis does not answer"
                    time.sleep(0.1)
            try:
                yield r, c
            finally:
                c.close()

    def pid(self, replica):
        return self.status()["replicas"][replica]["pid"]

    def propose(self, *values, replica=None, check=True):
        args = ["propose", "--dir", self.dir]
        if replica is not None:
            args += ["--replica", replica]
        return run(*args, *values, check=check)

    def log(self, replica):
        out = run("log", "--dir", self.dir, "--replica", replica).stdout
        rows = [line.split("\t") for line in out.splitlines() if line]
        return [(int(r[0]), r[2], r[3] if len(r) > 3 else "") for r in rows]

    def wait(self, predicate, timeout=10.0, what="condition"):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s = self.status()
            if predicate(s):
                return s
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {self.status()}")

    def state_checks(self):
        """The leader's state checks so far ({} without a state_probe)."""
        return leader_of(self.status()).get("state_checks") or {}

    def wait_state_checks(self, more_than, timeout=60.0):
        """Waits until the leader ran more than `more_than` state checks; returns
        its state_checks status then."""
        s = self.wait(
            lambda s: (leader_of(s).get("state_checks") or {}).get("checks", 0) > more_than,
            timeout,
            f"state check number {more_than + 1}",
        )
        return leader_of(s)["state_checks"]

    def wait_judged(self, before, ends=1, timeout=60.0):
        """Waits until the leader (the one in `before`, a status taken before
        the connections ended) has settled `ends` more ends of streams of
        every backup, with no question open: any divergence on those
        connections has been judged by then. Returns the leader's output
        status, or None if the leader changed (another leader judges only
        what came after it took over). A negative check (no divergence)
        waits for this first."""
        leader = before["leader"]
        start = before["replicas"][leader]["output"]

        def judged(s):
            if s["leader"] != leader:
                return True
            out = s["replicas"][leader]["output"]
            if out["divergences"] > start["divergences"]:
                return True  # judged already (a diverged backup's later points are not)
            return out["open"] == 0 and all(
                out["ends_settled"][r] >= start["ends_settled"][r] + ends
                for r in range(len(start["ends_settled"]))
                if r != leader
            )

        s = self.wait(judged, timeout, f"{ends} more connection end(s) judged on every backup")
        return s["replicas"][leader]["output"] if s["leader"] == leader else None

    def judged_run(self, body, ends=1, attempts=3):
        """Runs body() (whose connections all end in it) and waits until the
        leader judged their ends (wait_judged); returns (the leader's output
        status before, after). A leader change (a connection closed under
        body, or a new judge) runs it again: on a loaded machine, an ASan
        build above all, a leader may lose its lead to a short stall."""
        for attempt in range(attempts):
            before = self.status()
            try:
                body()
            except ConnectionError as e:  # closed by a leader change
                print(f"attempt {attempt + 1}: {e!r}; again under the new leader")
                continue
            after = self.wait_judged(before, ends)
            if after is not None:
                return before["replicas"][before["leader"]]["output"], after
            print(f"attempt {attempt + 1}: the leader changed; again under the new one")
        raise AssertionError(f"the leader changed in each of {attempts} attempts")

    def down(self):
        if (self.dir / "cluster.toml").exists():
            run("cluster", "down", "--dir", self.dir, "--quiet", check=False)
        # Belt and braces: anything still running from this directory, by pid.
        for pidfile in self.dir.glob("replica-*.pid"):
            try:
                pid = int(pidfile.read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if str(self.dir).encode() in cmdline:
                    os.kill(pid, signal.SIGKILL)
            except (ValueError, OSError):
                pass


def _port_free(port):
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def new_cluster(directory: Path) -> Cluster:
    """A Cluster in `directory` (created) with a port range of its own."""
    # Each cluster takes base .. base+299 (peer, client, server and metrics ports),
    # below the ephemeral range. A range where something already listens (a
    # cluster started by hand, another pytest session's) is passed over: such
    # a collision failed whole test runs with "port ... is taken".
    for _ in range(40):
        base = 20000 + ((os.getpid() % 16) * 4 + next(_ports)) % 40 * 300
        if all(_port_free(base + off + i) for off in (0, 100, 200, 250) for i in range(8)):
            break
    c = Cluster(directory, base)
    c.dir.mkdir()
    return c


@pytest.fixture
def cluster(tmp_path, request):
    c = new_cluster(tmp_path / "cluster")
    yield c
    c.down()
    # A passed test's cluster goes (each holds ~200 MB of preallocated log
    # segments, and a full run would fill a small disk); a failed one's stays,
    # and so does every one under LOCKSTEP_KEEP_CLUSTERS=1 (to read its logs).
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.passed and not os.environ.get("LOCKSTEP_KEEP_CLUSTERS"):
        shutil.rmtree(c.dir, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def built():
    assert LOCKSTEP.exists(), f"{LOCKSTEP} missing: run scripts/setup"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A failure's report carries the end of every replica's log: on CI that is
    # all anyone gets to see of a run that went wrong.
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)  # the cluster fixture's teardown reads rep_call
    tmp = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if not report.failed or tmp is None:
        return
    for log in sorted(Path(tmp).glob("*/replica-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        noise = (" slow ", " slept ", "not scheduled for")
        shown = [line for line in lines if not any(n in line for n in noise)][-40:]
        report.sections.append((f"end of {log.parent.name}/{log.name}", "\n".join(shown)))
    # And of every server's own log: a server's assertion or crash says why there.
    for log in sorted(Path(tmp).glob("*/replica-*/server.log")):
        lines = log.read_text(errors="replace").splitlines()[-15:]
        if lines:
            name = f"{log.parent.parent.name}/{log.parent.name}/{log.name}"
            report.sections.append((f"end of {name}", "\n".join(lines)))


# ---------------------------------------------------------------- skips
#
# A skipped test proves nothing, so a skip fails the run unless it is
# declared in tests/declared_skips.txt (a node id, or the start of one, and
# why); every skip is printed at the end either way. On a machine that lacks
# what scripts/setup installs, LOCKSTEP_ALLOW_SKIPS=1 lets undeclared skips
# pass (they are still printed and counted). The same rule covers ctest's
# skipped gtests (scripts/ctest_skips); both read tests/declared_skips.py.

_skips = []  # (node id, reason)


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def undeclared_skips():
    return [(n, r) for n, r in _skips if not declared_skips.is_declared(n)]


def pytest_terminal_summary(terminalreporter):
    if not _skips:
        return
    undeclared = undeclared_skips()
    tr = terminalreporter
    tr.section(f"{len(_skips)} skipped ({len(undeclared)} not declared)")
    for nodeid, reason in _skips:
        mark = "UNDECLARED" if (nodeid, reason) in undeclared else "declared"
        tr.line(f"{mark:10} {nodeid}: {reason}")
    if undeclared and not declared_skips.allowed():
        tr.line(
            f"{len(undeclared)} undeclared skip(s) fail this run: declare them in "
            f"{declared_skips.FILE.relative_to(ROOT)} with a reason, or give the machine "
            "what they need (scripts/setup); LOCKSTEP_ALLOW_SKIPS=1 lets them pass"
        )


def pytest_sessionfinish(session, exitstatus):
    if (
        undeclared_skips()
        and not declared_skips.allowed()
        and session.exitstatus == pytest.ExitCode.OK
    ):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
