"""A network namespace for a server that will not listen on loopback (gerbera).

gerbera 1.1 (libupnp 1.8, apps/gerbera.toml) refuses a host that has only a loopback
interface and binds its HTTP port to one interface's address, never to 0.0.0.0. So its tests
(tests/test_gerbera.py) and its bench (eval/gerbera.py) make a namespace of their own with

  - lo up and one interface at ADDR/24 (a dummy, or a veth pair with both ends inside where
    the kernel has no dummy driver);
  - IPv6 off (libupnp would also bind the interface's link-local address, still tentative
    right after the interface came up: "Could not bind to socket", -203);
  - the ephemeral port range lowered to EPHEMERAL, below the servers' ports (libupnp moves
    a port below 49152 to 49152, silently, so the cluster's base port is BASE_PORT and its
    servers listen from BASE_PORT + 200);
  - a DNAT rule in its own nft table from 127.0.0.1:{server ports} to ADDR: lockstep's
    daemon checks that a server is up, and its backups replay inputs, on 127.0.0.1
    (guard/server/server.cc WaitReady, the Replayer), where gerbera does not listen;
    the cluster runs apps/gerbera.toml with `--ip ADDR` for its `--ip {host}`
    (gerbera_profile). `cluster up --hosts netns` needs none of this: each replica's
    host is an interface's address there.

Commands run inside with Netns.exec (`ip netns exec`), or the calling process enters the
namespace itself (Netns.inside: setns(2), so that everything it starts, and its own sockets,
are in the namespace). Netns.delete kills by pid whatever still runs in the namespace (the
caller's own process excepted), then deletes it, and with it the interfaces, the nft table
and any socket left in TIME_WAIT.
"""

import contextlib
import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

IP = shutil.which("ip")
NFT = shutil.which("nft")
ADDR = "10.77.0.1"
BASE_PORT = 49000
EPHEMERAL = "32768 48999"
CLONE_NEWNET = 0x40000000

_names = itertools.count()


class NotPermitted(RuntimeError):
    """`ip netns add` is not allowed here (no CAP_SYS_ADMIN, say)."""


def sh(*cmd, check=True, timeout=60, **kw):
    """Runs cmd (text mode, output captured); raises RuntimeError if check and it fails."""
    r = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}: {r.stderr}")
    return r


def gerbera_profile(into):
    """apps/gerbera.toml for a cluster on this namespace's loopback (`cluster up` without
    --hosts): its `--ip {host}` would be 127.0.0.1 there, which libupnp refuses, so this
    copy names ADDR, where the DNAT sends the daemons' connections. Written into the
    directory `into` with its config.xml beside it; returns the path for `--app`."""
    apps = Path(__file__).resolve().parent.parent / "apps"
    text = (apps / "gerbera.toml").read_text()
    assert "--ip {host}" in text, "apps/gerbera.toml no longer says --ip {host}"
    into = Path(into)
    (into / "gerbera").mkdir(parents=True, exist_ok=True)
    shutil.copy(apps / "gerbera" / "config.xml", into / "gerbera" / "config.xml")
    (into / "gerbera.toml").write_text(text.replace("--ip {host}", f"--ip {ADDR}"))
    return str(into / "gerbera.toml")


def cluster_server_ports(base=BASE_PORT, replicas=7):
    """The servers' ports of a cluster with --base-port base (base + 200 + replica id)."""
    return [base + 200 + i for i in range(replicas)]


class Netns:
    """A network namespace of our own: lo up, one interface at ADDR/24 and a DNAT from
    127.0.0.1:{server ports} to ADDR (see the module's doc)."""

    def __init__(self, prefix="lsg"):
        self.name = f"{prefix}-{os.getpid()}-{next(_names)}"
        self.made = False
        self._home = None  # our own namespace while inside this one

    def create(self, server_ports):
        r = sh(IP, "netns", "add", self.name, check=False)
        if r.returncode != 0:
            if "not permitted" in r.stderr.lower() or "permission denied" in r.stderr.lower():
                raise NotPermitted(f"ip netns is not permitted here: {r.stderr.strip()}")
            raise RuntimeError(f"ip netns add {self.name}: {r.stderr}")
        self.made = True
        n = ("-n", self.name)
        # No IPv6: libupnp would also bind the interface's link-local address,
        # which is still tentative (duplicate address detection) right after
        # the interface came up: "Could not bind to socket" (-203).
        for scope in ("all", "default"):
            self.exec("sysctl", "-q", "-w", f"net.ipv6.conf.{scope}.disable_ipv6=1")
        sh(IP, *n, "link", "set", "lo", "up")
        # A dummy interface where the kernel has the driver, else a veth pair
        # with both ends in the namespace (this kernel: "Unknown device type").
        if sh(IP, *n, "link", "add", "lsgdummy0", "type", "dummy", check=False).returncode == 0:
            dev = "lsgdummy0"
        else:
            sh(IP, *n, "link", "add", "lsgveth0", "type", "veth", "peer", "name", "lsgveth1")
            sh(IP, *n, "link", "set", "lsgveth1", "up")
            dev = "lsgveth0"
        sh(IP, *n, "addr", "add", f"{ADDR}/24", "dev", dev)
        sh(IP, *n, "link", "set", dev, "up")
        self.exec("sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={EPHEMERAL}")
        if not NFT:
            raise RuntimeError("nft (nftables) is not installed (scripts/setup)")
        lo, hi = min(server_ports), max(server_ports)
        rules = (
            "table ip lockstep_gerbera {\n"
            "  chain out {\n"
            "    type nat hook output priority -100; policy accept;\n"
            f"    ip daddr 127.0.0.1 tcp dport {lo}-{hi} dnat to {ADDR}\n"
            "  }\n"
            "}\n"
        )
        self.exec(NFT, "-f", "-", input=rules)

    def exec(self, *cmd, check=True, timeout=60, **kw):
        return sh(IP, "netns", "exec", self.name, *cmd, check=check, timeout=timeout, **kw)

    def pids(self):
        r = sh(IP, "netns", "pids", self.name, check=False)
        return [int(p) for p in r.stdout.split()]

    def enter(self):
        """Moves this process (its calling thread: call it from the main thread, before
        starting others) into the namespace; leave() moves it back."""
        libc = ctypes.CDLL(None, use_errno=True)
        home = os.open("/proc/self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {self.name}: {os.strerror(err)}")
        except BaseException:
            os.close(home)
            raise
        finally:
            os.close(there)
        self._home = home

    def leave(self):
        if self._home is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            if libc.setns(self._home, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back from {self.name}: {os.strerror(err)}")
        finally:
            os.close(self._home)
            self._home = None

    def delete(self):
        if not self.made:
            return
        self.leave()
        # Whatever still runs in it was started in it, by us: by pid.
        for pid in self.pids():
            if pid != os.getpid():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        sh(IP, "netns", "del", self.name, check=False)
        self.made = False

    @contextlib.contextmanager
    def inside(self, server_ports):
        """Creates the namespace, enters it, yields self; then leaves and deletes it (also
        on an error or Ctrl-C)."""
        try:
            self.create(server_ports)
            self.enter()
            yield self
        finally:
            self.delete()


def run_in_netns(name, fn, timeout=120):
    """fn() on a thread inside the existing namespace `name` (/run/netns/NAME), for
    clients of a `lockstep cluster up --hosts netns` cluster: setns(2) moves only the
    calling thread, and threads fn starts are in the namespace too. Returns fn's result,
    or raises its exception."""
    out = {}

    def body():
        try:
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {name}: {os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"a client in namespace {name} still runs after {timeout} s")
    if "error" in out:
        raise out["error"]
    return out["value"]
