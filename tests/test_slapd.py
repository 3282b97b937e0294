"""OpenLDAP slapd (apps/slapd.toml) on three replicas: a listener thread in
epoll and a pool of worker threads.

Tried before issue 10's shim work: the leader's slapd died with SIGSEGV on
the first client connection in 5 runs of 6 (its listener, already blocked in
epoll, got the shim's tag back as its own event data: the regression test is
tests/test_mt_epoll.py, with a server made to wait that way). With the
profile (serial_inputs for the pool, same_clock and same_random for
entryCSN and entryUUID), clients adding and modifying entries on four
connections at once leave every replica with the same directory, operational
attributes included, compared entry by entry with slapcat.
"""

import json
import os
import shutil
import subprocess
import time

import pytest
from conftest import app_profile, kill_leader_during, on_threads, run

LDAPMODIFY = shutil.which("ldapmodify")
SLAPCAT = shutil.which("slapcat") or "/usr/sbin/slapcat"

pytestmark = pytest.mark.skipif(
    not (LDAPMODIFY and os.path.exists(SLAPCAT) and shutil.which("slapd")),
    reason="slapd and ldap-utils are not installed (setup)",
)

BASE = "dc=lockstep,dc=test"
ADMIN = ["-x", "-D", f"cn=admin,{BASE}", "-w", "secret"]


def ldap(tool, addr, ldif="", *args, check=True, timeout=60):
    host, port = addr
    cmd = [shutil.which(tool), "-H", f"ldap://{host}:{port}/", *ADMIN, *args]
    r = subprocess.run(
        cmd, input=ldif, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert r.returncode == 0, f"{tool} {args} on {addr}: {r.stderr.strip()} {r.stdout[-500:]}"
    return r


def base_ldif():
    return (
        f"dn: {BASE}\nchangetype: add\nobjectClass: dcObject\nobjectClass: organization\n"
        "o: lockstep\ndc: lockstep\n\n"
        f"dn: ou=people,{BASE}\nchangetype: add\nobjectClass: organizationalUnit\nou: people\n\n"
    )


def people_ldif(client, n):
    """n adds, each followed by a modify of an entry added before."""
    out = []
    for i in range(n):
        out.append(
            f"dn: cn=c{client}-{i},ou=people,{BASE}\nchangetype: add\n"
            f"objectClass: inetOrgPerson\ncn: c{client}-{i}\nsn: s{i}\n"
            f"description: added by client {client}\n\n"
        )
        j = i // 2
        out.append(
            f"dn: cn=c{client}-{j},ou=people,{BASE}\nchangetype: modify\n"
            f"replace: description\ndescription: changed {i} by client {client}\n-\n"
            f"add: telephoneNumber\ntelephoneNumber: +1 555 {client}{i:04d}\n\n"
        )
    return "".join(out)


def load(addr, clients, n):
    on_threads(lambda k: ldap("ldapmodify", addr(), people_ldif(k, n), "-c"), clients)


def slapcat(cluster, replica):
    """Replica `replica`'s whole directory, operational attributes included
    (read from its mdb files while its slapd runs: mdb readers never block)."""
    conf = cluster.dir / f"replica-{replica}" / "server" / "slapd.conf"
    r = subprocess.run(
        [SLAPCAT, "-f", str(conf)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, f"slapcat of replica {replica}: {r.stderr}"
    return r.stdout


def assert_same_directory(cluster, entries):
    def applied(s):
        lead = s["replicas"][s["leader"]]["commit_index"] if s["leader"] is not None else -1
        return all(r["applied_index"] == lead for r in s["replicas"])

    st = cluster.wait(applied, 60, "every replica applied the whole log")
    n = len(st["replicas"])
    dumps = {}

    def same(_):
        dumps.update({r: slapcat(cluster, r) for r in range(n)})
        return len(set(dumps.values())) == 1

    try:
        cluster.wait(same, 20, "the same directory on every replica")
    except AssertionError:
        reports = run("divergence", "list", "--dir", cluster.dir).stdout
        entries_of = {r: _entries(d) for r, d in dumps.items()}
        lead = entries_of[st["leader"]]
        for r, es in entries_of.items():
            differ = [dn for dn, e in es.items() if lead.get(dn) != e][:3]
            print(f"replica {r}: {len(es)} entries; differing from the leader's: {differ}")
            for dn in differ:
                print(f"  replica {r}:\n{es[dn]}\n  leader:\n{lead.get(dn)}")
            log = cluster.dir / f"replica-{r}" / "server.log"
            if log.exists():
                print(f"  replica {r} server.log tail:\n{log.read_text()[-1500:]}")
        raise AssertionError(f"replicas' directories differ; divergence reports: {reports}")
    dump = dumps[0]
    assert dump.count("\ndn: ") + dump.startswith("dn: ") == entries, dump[-2000:]
    assert "entryCSN: " in dump and "entryUUID: " in dump
    return dump


def _entries(dump):
    """slapcat output as {dn: the entry's lines}."""
    out = {}
    for block in dump.strip().split("\n\n"):
        first = block.split("\n", 1)[0]
        out[first] = block
    return out


def divergences(cluster):
    return json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def test_four_clients_leave_identical_directories(cluster):
    cluster.up(app="slapd")
    addr = cluster.client_addr()
    ldap("ldapmodify", addr, base_ldif())
    load(cluster.client_addr, clients=4, n=60)
    assert_same_directory(cluster, 2 + 4 * 60)
    assert divergences(cluster) == []
    # Searches see it all through the leader.
    r = ldap("ldapsearch", addr, "", "-b", f"ou=people,{BASE}", "-LLL", "(sn=s7)", "cn")
    assert r.stdout.count("dn: ") == 4, r.stdout


def test_a_backup_behind_executes_one_connections_requests_one_at_a_time(cluster):
    """A backup that is behind finds a connection's next requests already
    there when it reads one, where the leader's slapd got each only after it
    had replied to the one before. Were the backup's listener to hand the
    next one to another pool thread at once, two adds would run together and
    the first could take the second's clock (entryCSN, entryUUID). The reply
    gate (guard/server/log_input.h out_before) keeps each request unread until the
    backup's server has replied as far as the leader's had."""
    import signal

    cluster.up(app="slapd")
    addr = cluster.client_addr()
    ldap("ldapmodify", addr, base_ldif())
    st = cluster.status()
    backup = next(r for r in st["replicas"] if r["id"] != st["leader"])
    os.kill(backup["server_pid"], signal.SIGSTOP)
    try:
        ldap("ldapmodify", addr, people_ldif(0, 150))
    finally:
        os.kill(backup["server_pid"], signal.SIGCONT)
    assert_same_directory(cluster, 2 + 150)
    assert divergences(cluster) == []


def test_leader_killed_mid_load_clients_go_on_through_the_new_leader(cluster):
    cluster.up(app="slapd")
    ldap("ldapmodify", cluster.client_addr(), base_ldif())
    added = []

    def adder():
        # One entry per ldapmodify: one that fails (the leader gone) is tried
        # again through whoever leads then; 68 (already there) means that an
        # earlier try was done before the connection broke.
        for i in range(60):
            for _ in range(40):
                try:
                    r = ldap(
                        "ldapmodify",
                        cluster.client_addr(timeout=20),
                        f"dn: cn=k{i},ou=people,{BASE}\nchangetype: add\n"
                        f"objectClass: person\ncn: k{i}\nsn: k\n",
                        check=False,
                        timeout=20,
                    )
                except (AssertionError, subprocess.TimeoutExpired):
                    r = None
                if r is not None and r.returncode in (0, 68):
                    added.append(i)
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"entry k{i} never added: {r and r.stderr}")

    kill_leader_during(cluster, adder, lambda: len(added) >= 15)
    assert sorted(added) == list(range(60))
    # Every entry is there (those acknowledged before the kill included).
    r = ldap("ldapsearch", cluster.client_addr(), "", "-b", f"ou=people,{BASE}", "-LLL", "cn")
    assert r.stdout.count("dn: ") == 61, r.stdout[-1000:]


def test_bad_input_is_refused_and_the_replicas_stay_alike(cluster):
    import socket

    cluster.up(app="slapd")
    addr = cluster.client_addr()
    ldap("ldapmodify", addr, base_ldif())
    # Garbage that is no BER: slapd drops the connection.
    s = socket.create_connection(addr)
    s.sendall(b"\x30\x84\xff\xff\xff\xffnot an ldap message at all")
    s.settimeout(10)
    try:
        assert s.recv(100) == b""
    except ConnectionResetError:
        pass
    s.close()
    # A request far over slapd's limit for anonymous clients
    # (sockbuf_max_incoming, 256 KiB): refused, connection closed.
    s = socket.create_connection(addr)
    huge = 4 * 1024 * 1024
    try:
        s.sendall(b"\x30\x84" + huge.to_bytes(4, "big") + b"\x02\x01\x01" + b"x" * huge)
    except (BrokenPipeError, ConnectionResetError):
        pass
    s.close()
    # A client gone in the middle of a request.
    s = socket.create_connection(addr)
    s.sendall(b"\x30\x20\x02\x01\x01\x68")
    s.close()
    # A malformed add (no such attribute): an error reply, nothing changed.
    r = ldap(
        "ldapmodify",
        addr,
        f"dn: cn=x,ou=people,{BASE}\nchangetype: add\nobjectClass: person\ncn: x\nnoSuch: 1\n",
        check=False,
    )
    assert r.returncode != 0 and "noSuch" in r.stderr, r.stderr
    load(cluster.client_addr, clients=2, n=10)
    assert_same_directory(cluster, 2 + 2 * 10)
    assert divergences(cluster) == []


def test_a_loaded_directory_passes_its_state_checks(cluster, tmp_path):
    # The profile's state probe reads the whole directory, entryCSN and the
    # timestamps included, through the log: every replica answers it at the
    # same point, so a replica whose directory differs is reported (kind
    # state). A quiet, agreeing cluster reports nothing.
    cluster.up(app=app_profile(tmp_path, "slapd", state_check_every_s=1))
    addr = cluster.client_addr()
    ldap("ldapmodify", addr, base_ldif())
    load(cluster.client_addr, clients=4, n=40)
    # A check after the one the load's first input started, begun once
    # the count was read (the load's end may be covered by then already).
    st = cluster.wait_state_checks(max(cluster.state_checks().get("checks", 0), 1))
    print(f"state checks: {st}")
    assert st["failed"] == 0 and len(st["digest"].split()[0]) == 40, st
    assert_same_directory(cluster, 2 + 4 * 40)
    assert divergences(cluster) == []
