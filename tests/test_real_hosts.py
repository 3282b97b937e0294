"""README.md's "Running on real hosts", followed step by step, with network
namespaces standing in for the three machines and a client machine (issue
28, item 4): one namespace per machine, each with an eth0 on one bridge and
an address of its own, as on a LAN.

The cluster.toml and the firewall are the README's own blocks, read from
README.md, with the machines' addresses, the directories and the install
prefix put in for its 10.0.0.x, /var/lib/lockstep and /usr/local, so that
the README cannot drift from what works. Then as a person would: `cmake
--install`, `lockstep keys init`, each machine given only its own files,
`lockstep replica` started in each machine's namespace (what the systemd
unit runs; nsenter --net: the network namespace alone, as CRIU needs, not
`ip netns exec`'s mount namespace), `cluster status` and redis-cli from the
client machine with a client's copy of cluster.toml. Then the machines die:
the leader's (SIGKILL), started again; a backup's with its disk gone.
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time

import pytest
from conftest import BUILD_DIR, ROOT
from netns import run_in_netns  # eval/netns.py

README = ROOT / "README.md"
IP = shutil.which("ip")
NSENTER = shutil.which("nsenter")

pytestmark = pytest.mark.skipif(
    not (IP and NSENTER and shutil.which("redis-cli")),
    reason="iproute2, util-linux's nsenter and redis-tools (scripts/setup)",
)


def sh(*cmd, input=None, check=True, timeout=60):
    r = subprocess.run(
        [str(c) for c in cmd],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check:
        assert r.returncode == 0, (
            f"{' '.join(map(str, cmd))}: {r.stdout[-1500:]} {r.stderr[-1500:]}"
        )
    return r


def readme_blocks():
    """(cluster.toml, nft ruleset) as README.md's "Running on real hosts" gives them."""
    text = README.read_text()
    section = text[text.index("## Running on real hosts") :]
    section = section[: section.index("\n## ", 1)]
    toml = re.search(r"```toml\n(.*?)```", section, re.DOTALL).group(1)
    nft = re.search(r"nft -f - <<'END'\n(.*?)\nEND\n", section, re.DOTALL).group(1)
    return toml, nft


class Machines:
    """Namespaces `TAG-m0..` (the replicas' machines) and `TAG-cl` (a
    client's), each with an eth0 on a bridge in `TAG-hub`, at NET.1, NET.2,
    ... and NET.50."""

    def __init__(self, n):
        tag = f"lsrh{os.getpid() % 100000}"
        self.hub = f"{tag}-hub"
        self.names = [f"{tag}-m{i}" for i in range(n)]
        self.client = f"{tag}-cl"
        self.net = f"10.203.{os.getpid() % 250 + 1}"
        self.addrs = [f"{self.net}.{i + 1}" for i in range(n)]
        self.made = []

    def create(self):
        for ns in (self.hub, *self.names, self.client):
            sh(IP, "netns", "add", ns)
            self.made.append(ns)
            sh(IP, "-n", ns, "link", "set", "lo", "up")
        sh(IP, "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh(IP, "-n", self.hub, "link", "set", "br0", "up")
        for k, (ns, addr) in enumerate(
            [*zip(self.names, self.addrs, strict=True), (self.client, f"{self.net}.50")]
        ):
            sh(
                IP,
                "netns",
                "exec",
                ns,
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.default.disable_ipv6=1",
            )
            sh(
                IP,
                "-n",
                ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                f"p{k}",
                "netns",
                self.hub,
            )
            sh(IP, "-n", self.hub, "link", "set", f"p{k}", "master", "br0")
            sh(IP, "-n", self.hub, "link", "set", f"p{k}", "up")
            sh(IP, "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh(IP, "-n", ns, "link", "set", "eth0", "up")

    def delete(self):
        for ns in reversed(self.made):
            pids = sh(IP, "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            end = time.monotonic() + 10
            while (
                sh(IP, "netns", "pids", ns, check=False).stdout.split() and time.monotonic() < end
            ):
                time.sleep(0.05)
            sh(IP, "netns", "del", ns, check=False)


@pytest.fixture
def machines():
    m = Machines(3)
    try:
        m.create()
        yield m
    finally:
        m.delete()


def test_the_readme_takes_three_machines_to_a_running_cluster(tmp_path, machines):
    started = time.monotonic()
    # 1. Install (one prefix serves the three "machines": they share a disk).
    prefix = tmp_path / "usr-local"
    sh("cmake", "--install", BUILD_DIR, "--prefix", prefix, timeout=120)
    lockstep = prefix / "bin" / "lockstep"

    # 2. The README's cluster.toml, with this test's machines and paths.
    toml, nft = readme_blocks()
    for i, addr in enumerate(machines.addrs):
        toml = toml.replace(f'"10.0.0.{i + 1}"', f'"{addr}"')
        nft = nft.replace(f"10.0.0.{i + 1}", addr)
    assert "10.0.0." not in toml + nft, "the README names a machine this test does not map"
    toml = toml.replace("/usr/local/", f"{prefix}/").replace(
        "/var/lib/lockstep/", f"{tmp_path}/var/"
    )
    for name in ("secret", "client_secret", "admin_secret"):
        toml, n = re.subn(
            rf'(?m)^{name} = "[0-9a-f]+"', f'{name} = "{secrets.token_hex(16)}"', toml
        )
        assert n == 1, name
    # The state probe (the installed profile's script) checked every second, not 10.
    toml, n = re.subn(r"(?m)^(state_probe = .*)$", r"\1\nstate_check_every_s = 1", toml)
    assert n == 1, "the README's [server] has no state_probe"
    admin = tmp_path / "admin"
    admin.mkdir()
    (admin / "cluster.toml").write_text(toml)

    # 3. Keys; each machine gets cluster.toml, ca.crt and its own pair only.
    sh(lockstep, "keys", "init", "--config", admin / "cluster.toml")
    etc = []
    for n in range(3):
        d = tmp_path / f"machine-{n}" / "etc-lockstep"
        (d / "keys").mkdir(parents=True)
        shutil.copy(admin / "cluster.toml", d / "cluster.toml")
        for f in ("ca.crt", f"replica-{n}.crt", f"replica-{n}.key"):
            shutil.copy(admin / "keys" / f, d / "keys" / f)
        etc.append(d)
    client = tmp_path / "client-machine"
    (client / "keys").mkdir(parents=True)
    shutil.copy(admin / "keys" / "ca.crt", client / "keys" / "ca.crt")
    (client / "cluster.toml").write_text(re.sub(r"(?m)^(secret|admin_secret) = .*\n", "", toml))

    # 4. The firewall, on each machine.
    for ns in machines.names:
        sh(IP, "netns", "exec", ns, "nft", "-f", "-", input=nft)

    # 5. Start: what the unit runs, in each machine's network namespace
    # (its StateDirectory= makes /var/lib/lockstep; each replica its own dir in it).
    (tmp_path / "var").mkdir()
    procs = {}

    def start(n):
        log = open(tmp_path / f"replica-{n}.out", "a")  # noqa: SIM115 - the child holds it
        procs[n] = subprocess.Popen(
            [NSENTER, f"--net=/run/netns/{machines.names[n]}", lockstep, "replica"]
            + ["--config", etc[n] / "cluster.toml", "--id", str(n)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    try:
        for n in range(3):
            start(n)

        # 6. Check, from the client machine with the client's copy.
        said = []

        def status():
            r = sh(
                *(IP, "netns", "exec", machines.client, lockstep, "cluster", "status"),
                *("--json", "--dir", client),
                check=False,
            )
            if r.returncode == 0 and r.stdout.strip():
                return json.loads(r.stdout)
            said.append(r.stderr.strip())
            return None

        def wait(pred, what, timeout=60):
            end = time.monotonic() + timeout
            while True:
                s = status()
                if s and pred(s):
                    return s
                assert time.monotonic() < end, f"no {what} within {timeout} s: {s or said[-1:]}"
                time.sleep(0.2)

        def caught_up(s):
            lead = s["leader"]
            return lead is not None and all(
                r["role"] != "down" and r["applied_index"] == s["replicas"][lead]["commit_index"]
                for r in s["replicas"]
            )

        st = wait(lambda s: s["leader"] is not None and s.get("client_addr"), "leader")

        # 7. A client, on the client machine, at client_addr.
        def redis(s, *cmd):
            host, port = s["client_addr"].rsplit(":", 1)
            r = sh(IP, "netns", "exec", machines.client, "redis-cli", "-h", host, "-p", port, *cmd)
            return r.stdout.strip()

        assert redis(st, "SET", "k", "v1") == "OK"
        assert redis(st, "GET", "k") == "v1"
        # The leader's state probe runs (from the installed profile's files)
        # and digests the key.
        st = wait(
            lambda s: (
                s["leader"] is not None
                and " 1 keys" in s["replicas"][s["leader"]]["state_checks"]["digest"]
            ),
            "state check that saw the key",
            timeout=30,
        )
        checks = st["replicas"][st["leader"]]["state_checks"]
        assert checks["failed"] == 0 and not checks["error"], checks

        # ... and nothing but the client and server ports answers a stranger.
        def reaches(port):
            try:
                socket.create_connection((machines.addrs[0], port), timeout=1).close()
                return True
            except OSError:
                return False

        reached = run_in_netns(machines.client, lambda: {p: reaches(p) for p in (7400, 7500, 7600)})
        assert reached == {7400: False, 7500: True, 7600: True}, reached

        # 8. The leader's machine dies: another leads, the write is there.
        old = st["leader"]
        procs[old].send_signal(signal.SIGKILL)
        procs[old].wait(10)
        st = wait(lambda s: s["leader"] not in (None, old) and s.get("client_addr"), "new leader")
        assert redis(st, "GET", "k") == "v1"
        assert redis(st, "SET", "k", "v2") == "OK"
        # It comes back and catches up.
        start(old)
        st = wait(caught_up, "catch-up of the restarted replica")

        # A backup's disk is gone: the same files on a fresh disk, started.
        gone = next(r["id"] for r in st["replicas"] if r["id"] != st["leader"])
        procs[gone].send_signal(signal.SIGKILL)
        procs[gone].wait(10)
        shutil.rmtree(tmp_path / "var" / str(gone))
        assert redis(st, "SET", "after", "the-disk-died") == "OK"
        start(gone)
        st = wait(caught_up, "catch-up of the replica whose disk was gone", timeout=90)
        own = sh(
            *(IP, "netns", "exec", machines.client, lockstep, "inspect"),
            *("--config", etc[gone] / "cluster.toml", "--id", gone, "--"),
            *("redis-cli", "-h", "{host}", "-p", "{port}", "MGET", "k", "after"),
        )
        assert own.stdout.split() == ["v2", "the-disk-died"], own.stdout
        print(f"README walk-through: {time.monotonic() - started:.1f} s")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
