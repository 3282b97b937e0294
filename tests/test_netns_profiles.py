"""Every app profile in apps/ on hosts of their own (issue 28, item 5):
`cluster up --app NAME --hosts netns`, with no setup of the test's own, then
one write and one read through the leader with that server's own client, in
the client namespace, and the same read on every backup's own server
(through `lockstep inspect`, eval/inspector.py's Relay) once it applied the
whole log; a profile's state probe, run every second, passes.

The profiles are found in apps/ (every NAME.toml), so a new profile is run
here too, and fails until CLIENTS below knows how to write to and read from
its server. On netns hosts each replica's {host} is its own address on a
bridge, the client comes from an address of its own, and a backup's daemon
replays each connection from its replica's address: what a profile assumed of
127.0.0.1 shows here (gerbera's hard-coded --ip, MariaDB's root@127.0.0.1).

Ports: the namespaces are fresh, so every cluster takes the same base port,
48952: gerbera's libupnp moves a port below 49152 to 49152 (apps/gerbera.toml).
"""

import re
import shutil
import socket
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from clamd_client import TEST_SIGNATURE, Clamd
from conftest import ROOT, app_profile, run
from inspector import Relay  # eval/inspector.py
from netns import run_in_netns  # eval/netns.py
from resp import Memcached, Redis

APPS = sorted(p.stem for p in (ROOT / "apps").glob("*.toml"))
BASE_PORT = 48952
KEY = "lockstep-netns-key"
VALUE = "written-through-the-leader"


# ---------------------------------------------------------------- the clients
#
# write(addr) makes one change through the server at addr; read(addr) returns
# what a server at addr holds of it. Both run on a thread in the client
# namespace; read also against a backup's server, through a local relay.


def redis_write(addr):
    c = Redis(addr, timeout=15)
    try:
        assert c.call("SET", KEY, VALUE) == "OK"
    finally:
        c.close()


def redis_read(addr):
    c = Redis(addr, timeout=15)
    try:
        return c.call("GET", KEY).decode()
    finally:
        c.close()


def memcached_write(addr):
    c = Memcached(addr, timeout=15)
    try:
        assert c.store("set", KEY, VALUE) == "STORED"
    finally:
        c.close()


def memcached_read(addr):
    c = Memcached(addr, timeout=15)
    try:
        got = c.get(KEY)
        return got.decode() if got is not None else None
    finally:
        c.close()


def mariadb(addr, statement):
    host, port = addr
    cmd = ["mariadb", "--no-defaults", "-h", host, "-P", str(port), "-uroot", "-N", "-B"]
    r = subprocess.run(
        [*cmd, "-e", statement], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, f"{statement!r} on {addr}: {r.stderr.strip()}"
    return r.stdout


def mariadb_write(addr):
    mariadb(
        addr,
        "CREATE DATABASE probe; CREATE TABLE probe.kv (k VARCHAR(64) PRIMARY KEY, "
        f"v VARCHAR(64)) ENGINE=InnoDB; INSERT INTO probe.kv VALUES ('{KEY}', '{VALUE}')",
    )


def mariadb_read(addr):
    return mariadb(addr, f"SELECT v FROM probe.kv WHERE k = '{KEY}'").strip()


LDAP_BASE = "dc=lockstep,dc=test"  # apps/slapd/slapd.conf
LDAP_ADMIN = ["-x", "-D", f"cn=admin,{LDAP_BASE}", "-w", "secret"]


def ldap(tool, addr, *args, ldif=""):
    host, port = addr
    cmd = [tool, "-H", f"ldap://{host}:{port}/", *LDAP_ADMIN, *args]
    r = subprocess.run(cmd, input=ldif, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, f"{tool} on {addr}: {r.stderr.strip()} {r.stdout[-500:]}"
    return r.stdout


def slapd_write(addr):
    ldap(
        "ldapadd",
        addr,
        ldif=(
            f"dn: {LDAP_BASE}\nobjectClass: dcObject\nobjectClass: organization\n"
            "o: lockstep\ndc: lockstep\n\n"
            f"dn: cn={KEY},{LDAP_BASE}\nobjectClass: organizationalRole\ncn: {KEY}\n"
            f"description: {VALUE}\n\n"
        ),
    )


def slapd_read(addr):
    out = ldap("ldapsearch", addr, "-LLL", "-b", f"cn={KEY},{LDAP_BASE}", "description")
    found = re.search(r"(?m)^description: (.*)$", out)
    return found.group(1) if found else out


def tarantool_connect(addr):
    tarantool = pytest.importorskip("tarantool", reason="the tarantool connector (requirements)")
    return tarantool.Connection(
        addr[0], addr[1], connection_timeout=15, socket_timeout=30, reconnect_max_attempts=0
    )


def tarantool_write(addr):
    c = tarantool_connect(addr)
    try:
        c.replace("kv", (KEY, VALUE))  # the vinyl space of apps/tarantool/init.lua
    finally:
        c.close()


def tarantool_read(addr):
    c = tarantool_connect(addr)
    try:
        rows = c.select("kv", KEY)
        return rows[0][1] if rows else None
    finally:
        c.close()


def clamd_scan(addr):
    """clamd keeps nothing between requests: its write is a scan of a buffer
    carrying apps/clamd/lockstep.ndb's signature, its read the same scan,
    which every replica's server must judge alike."""
    c = Clamd(addr)
    try:
        return c.scan(b"x" * 1000 + TEST_SIGNATURE + b"y" * 1000)
    finally:
        c.sock.close()


def http(addr, request):
    """One HTTP/1.1 request on a connection of its own; the reply's body."""
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(request.encode())
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), reply[:300]
    return body.decode(errors="replace")


def gerbera_write(addr):
    """A container under the root, through the web UI (a row in each
    replica's sqlite database), in a session opened while the server idles
    (tests/test_gerbera.py new_session says why)."""
    host = f"{addr[0]}:{addr[1]}"
    get = "GET /content/interface?{} HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n"
    sid = re.search(
        r'"sid":"([0-9a-f-]{36})"', http(addr, get.format("req_type=auth&action=get_sid"))
    )
    assert sid, "gerbera gave no session id"
    add = f"req_type=add_object&parent_id=0&obj_type=container&title={KEY}&class=object.container"
    body = http(addr, get.format(f"{add}&sid={sid.group(1)}"))
    assert '"success":true' in body, body


def gerbera_read(addr):
    """The root's containers, through a UPnP Browse (no session: read only)."""
    body = (
        '<?xml version="1.0" encoding="utf-8"?><s:Envelope '
        'xmlns:s="http://schemas.xmlsoap.org/soap/envelope/" '
        's:encodingStyle="http://schemas.xmlsoap.org/soap/encoding/"><s:Body>'
        '<u:Browse xmlns:u="urn:schemas-upnp-org:service:ContentDirectory:1">'
        "<ObjectID>0</ObjectID><BrowseFlag>BrowseDirectChildren</BrowseFlag><Filter>*</Filter>"
        "<StartingIndex>0</StartingIndex><RequestedCount>0</RequestedCount>"
        "<SortCriteria></SortCriteria></u:Browse></s:Body></s:Envelope>"
    )
    didl = http(
        addr,
        f"POST /upnp/control/cds HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\nConnection: close\r\n"
        'Content-Type: text/xml; charset="utf-8"\r\n'
        'SOAPACTION: "urn:schemas-upnp-org:service:ContentDirectory:1#Browse"\r\n'
        f"Content-Length: {len(body)}\r\n\r\n{body}",
    )
    titles = re.findall(r"&lt;dc:title&gt;(.*?)&lt;/dc:title&gt;", didl)
    return KEY if KEY in titles else titles


CLAMD_VERDICT = "stream: Lockstep.Test.Signature-1.UNOFFICIAL FOUND"  # apps/clamd/lockstep.ndb

# app: (write, read, what read returns after the write)
CLIENTS = {
    "redis": (redis_write, redis_read, VALUE),
    "memcached": (memcached_write, memcached_read, VALUE),
    "mariadb": (mariadb_write, mariadb_read, VALUE),
    "slapd": (slapd_write, slapd_read, VALUE),
    "tarantool": (tarantool_write, tarantool_read, VALUE),
    "clamd": (clamd_scan, clamd_scan, CLAMD_VERDICT),
    "gerbera": (gerbera_write, gerbera_read, KEY),
}


# ---------------------------------------------------------------- the test


def retried(read, addr, expected, timeout=60):
    """read(addr) until it returns expected (a backup's server may still be
    coming up from a cloned start, or its relay refuse while it restores)."""
    end = time.monotonic() + timeout
    while True:
        try:
            got = read(addr)
        except (OSError, AssertionError) as e:
            got = repr(e)
        if got == expected or time.monotonic() > end:
            return got
        time.sleep(0.2)


@pytest.mark.parametrize("app", APPS)
def test_profile_serves_on_netns_hosts(cluster, app, tmp_path):
    assert app in CLIENTS, (
        f"apps/{app}.toml has no client in {Path(__file__).name}: add its write and read "
        "to CLIENTS, so that it is checked on netns hosts like every other profile"
    )
    write, read, expected = CLIENTS[app]
    command = (ROOT / "apps" / f"{app}.toml").read_text()
    server = re.search(r'(?m)^command = ["\'](\S+)', command).group(1)
    assert shutil.which(server), f"{server} (apps/{app}.toml) is not installed: scripts/setup"

    # A profile's state probe connects to its server at {host} too: checked
    # every second here (a copy of the profile in tmp_path), it must pass.
    probes = "\nstate_probe = " in command
    profile = app_profile(tmp_path, app, state_check_every_s=1) if probes else app

    started = time.monotonic()
    cluster.base_port = BASE_PORT
    cluster.up(app=profile, transport="tcp", extra=["--hosts", "netns"])
    up_s = time.monotonic() - started
    st = cluster.status()
    client_ns = st["client_netns"]
    config = tomllib.loads((cluster.dir / "cluster.toml").read_text())
    hosts = {r["host"] for r in config["replica"]}
    assert len(hosts) == 3 and not any(h.startswith("127.") for h in hosts), hosts

    leader = cluster.client_addr()
    run_in_netns(client_ns, lambda: write(leader))
    got = run_in_netns(client_ns, lambda: read(leader))
    assert got == expected, f"{app}: the leader's read gave {got!r}"

    def applied(s):
        lead = s["leader"]
        return lead is not None and all(
            r["applied_index"] == s["replicas"][lead]["commit_index"] for r in s["replicas"]
        )

    st = cluster.wait(applied, 60, "every replica applied the whole log")
    for r in range(3):
        if r == st["leader"]:
            continue

        def on_backup(r=r):
            with Relay(cluster.server_addr(r)) as local:  # the backup's own server
                return retried(read, local, expected)

        got = run_in_netns(client_ns, on_backup, timeout=180)
        assert got == expected, f"{app}: backup {r}'s own server gave {got!r}"
    if probes:

        def probed(s):
            checks = s["replicas"][s["leader"]]["state_checks"] if s["leader"] is not None else {}
            return checks.get("passes", 0) >= 1 or checks.get("failed", 0) >= 1

        st = cluster.wait(probed, 30, "a state check by the leader")
        checks = st["replicas"][st["leader"]]["state_checks"]
        assert checks["failed"] == 0 and not checks["error"], f"{app}'s state probe: {checks}"
    reports = run("divergence", "list", "--json", "--dir", cluster.dir).stdout.strip()
    assert reports == "[]", f"{app}: {reports}"
    down_started = time.monotonic()
    run("cluster", "down", "--dir", cluster.dir)
    print(
        f"{app}: up {up_s:.1f} s, write, read and backups {down_started - started - up_s:.1f} s, "
        f"down {time.monotonic() - down_started:.1f} s"
    )
