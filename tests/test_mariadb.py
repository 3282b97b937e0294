"""MariaDB (apps/mariadb.toml) on three replicas, a thread per connection.

Tried before the profile existed (issue 10): with four sysbench threads the
backups' table checksums differed from the leader's (inputs delivered in
order but executed concurrently: InnoDB's lock waits and deadlock victims
differ). With the profile (serial_inputs, a shared data template, the
handshake's random challenge left out of the comparison) four threads of
sysbench's read-write load leave every replica with the same tables. So do
sixteen (none of six 2-minute loads diverged, once the shim looked at the
right thread and took lock waits on condition variables back in the log's
order; before, several times a minute). A holder asleep on a latch of its
own for over 100 ms may still be overtaken (preload/shim_serial.c); a
backup whose tables still differ must then have been reported diverged:
never silently different.

Logins: root without a password, and users with passwords through MariaDB's
ed25519 plugin, whose nonce comes from OpenSSL's RAND_bytes, the same on
every replica with same_random (see the profile). mysql_native_password
with a password cannot work: its challenge comes from MariaDB's own
generator, which the shim cannot make the same on every replica.

The replicas are inspected (CHECKSUM TABLE through each one's own server)
only at the end, once every replica applied the whole log.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import inspector
import pytest
from conftest import app_profile, kill_leader_during, leader_of, on_threads, run

MARIADB = shutil.which("mariadb")
SYSBENCH = shutil.which("sysbench")

pytestmark = pytest.mark.skipif(
    not (MARIADB and SYSBENCH), reason="mariadb-client and sysbench are not installed (setup)"
)


def mariadb(addr, statement, user="root", password=None, timeout=60):
    """The mariadb client's run of statement on addr, logged in as user
    (with password, if one is given)."""
    host, port = addr
    cmd = [MARIADB, "-h", host, "-P", str(port), "-u", user, "--batch", "--skip-column-names"]
    if password is not None:
        cmd.append(f"--password={password}")
    return subprocess.run(
        [*cmd, "-e", statement], capture_output=True, text=True, timeout=timeout, check=False
    )


def sql(addr, statement, timeout=60, user="root", password=None):
    r = mariadb(addr, statement, user, password, timeout)
    assert r.returncode == 0, f"{statement!r} on {addr} as {user}: {r.stderr.strip()}"
    return r.stdout


def sysbench(addr, test, *args, timeout=180):
    host, port = addr
    cmd = [
        SYSBENCH,
        test,
        f"--mysql-host={host}",
        f"--mysql-port={port}",
        "--mysql-user=root",
        "--mysql-db=sbtest",
        "--tables=2",
        "--table-size=500",
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"sysbench {test} {args}: {r.stdout[-1500:]} {r.stderr[-1500:]}"
    return r.stdout


def load(addr, seed):
    out = sysbench(
        addr,
        "oltp_read_write",
        "run",
        "--threads=4",
        "--time=20",
        "--events=400",
        f"--rand-seed={seed}",
    )
    assert "transactions:" in out, out


def assert_same_tables(cluster, tables="sbtest.sbtest1, sbtest.sbtest2"):
    """Every replica's CHECKSUM TABLE equals the leader's once it applied the
    whole log; a replica whose tables still differ after a minute must have
    been reported diverged (never silently different). Returns the status."""
    addr = cluster.client_addr()
    leader_sums = sql(addr, f"CHECKSUM TABLE {tables}")
    assert leader_sums.count("\n") == tables.count(",") + 1, leader_sums
    n = len(cluster.status()["replicas"])
    sums = {}

    def same(s):
        if not all(r["applied_index"] == leader_of(s).get("commit_index") for r in s["replicas"]):
            return False
        for r in range(n):
            try:
                with inspector.Relay(cluster.server_addr(r)) as local:  # a backup's own
                    sums[r] = sql(local, f"CHECKSUM TABLE {tables}")
            except AssertionError as e:  # a server being checkpointed or restored
                sums[r] = str(e)
        return all(v == leader_sums for v in sums.values())

    try:
        return cluster.wait(same, 60, "every replica's checksums equal to the leader's")
    except AssertionError as e:
        reports = json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)
        differ = {r for r, v in sums.items() if v != leader_sums}
        reported = {d["replica"] for d in reports}
        assert differ <= reported, f"{e}; leader {leader_sums!r}, replicas {sums}; {reports}"
        print(f"replicas {sorted(differ)} differ and were reported diverged: {reports}")
        return cluster.status()


def up_and_loaded(cluster):
    """The profile's cluster, sysbench's tables made and a first load run
    through the leader; returns the leader's address."""
    cluster.up(app="mariadb")
    addr = cluster.client_addr()
    sql(addr, "CREATE DATABASE sbtest")
    sysbench(addr, "oltp_read_write", "prepare")
    load(addr, 1)
    return addr


def test_four_threads_leave_identical_tables(cluster):
    up_and_loaded(cluster)
    assert_same_tables(cluster)


def test_a_replica_added_later_holds_the_same_tables(cluster):
    # lockstep member add: a fourth mariadbd built from the log (its server
    # from the profile's data template, then every statement replayed) votes
    # only once caught up, and its tables equal the leader's.
    addr = up_and_loaded(cluster)
    out = run("member", "add", "--dir", cluster.dir, timeout=300).stdout
    assert "replica 3 is a voter" in out, out
    load(addr, 1)
    st = assert_same_tables(cluster)
    assert len(st["replicas"]) == 4 and all(r["role"] != "down" for r in st["replicas"]), st


def test_new_connections_number_their_statements_alike_everywhere(cluster):
    # A prepared statement's id counts up in its connection's THD, which
    # MariaDB's thread cache hands, with its count, to whichever new
    # connection a cached thread picks up first: a race, run differently on
    # every replica (sysbench at 16 threads after a first run diverged at
    # its first PREPARE's reply). The profile turns the cache off.
    addr = up_and_loaded(cluster)  # 4 connections came and went, each with its prepares
    for seed in (2, 3):
        out = sysbench(
            addr,
            "oltp_write_only",
            "run",
            "--threads=8",
            "--time=20",
            "--events=200",
            f"--rand-seed={seed}",
        )
        assert "transactions:" in out, out
    assert_same_tables(cluster)
    assert json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout) == []


def test_a_backups_server_killed_comes_back_from_its_checkpoint(cluster):
    # CRIU checkpoints of mariadbd (its InnoDB file locks dumped and restored:
    # criu --file-locks), a backup's server SIGKILLed, restored from its
    # checkpoint and brought forward by replaying the log, under load.
    addr = up_and_loaded(cluster)
    st = cluster.status()
    b = next(r["id"] for r in st["replicas"] if r["role"] == "backup")
    run("checkpoint", "now", "--id", b, "--wait", "--dir", cluster.dir)
    os.kill(cluster.status()["replicas"][b]["server_pid"], signal.SIGKILL)
    load(addr, 2)
    s = assert_same_tables(cluster)
    restored = s["replicas"][b]["checkpoint"]
    assert restored["restores"] >= 1 and restored["restored_from"] > 0, restored


def test_leader_killed_mid_load_clients_go_on_through_the_new_leader(cluster):
    cluster.up(app="mariadb")
    sql(cluster.client_addr(), "CREATE DATABASE t; CREATE TABLE t.rows (n INT PRIMARY KEY)")
    done = []

    def inserter():
        # One INSERT per client: one that fails (its leader gone) is sent
        # again through whoever leads then; a duplicate key means an earlier
        # try was done before its connection broke.
        for i in range(150):
            for _ in range(50):
                try:
                    sql(cluster.client_addr(timeout=20), f"INSERT INTO t.rows VALUES ({i})", 20)
                    done.append(i)
                    break
                except AssertionError as e:
                    if "Duplicate entry" in str(e):
                        done.append(i)
                        break
                    time.sleep(0.2)
            else:
                raise AssertionError(f"row {i} never inserted")

    kill_leader_during(cluster, inserter, lambda: len(done) >= 30)
    assert sql(cluster.client_addr(), "SELECT COUNT(*), SUM(n) FROM t.rows").split() == [
        "150",
        str(sum(range(150))),
    ]


def test_bad_input_gets_errors_and_the_replicas_stay_alike(cluster):
    cluster.up(app="mariadb")
    addr = cluster.client_addr()
    sql(addr, "CREATE DATABASE t; CREATE TABLE t.kv (k INT PRIMARY KEY, v LONGTEXT)")
    host, port = addr
    cmd = [MARIADB, "-h", host, "-P", str(port), "-u", "root", "--batch"]
    # A malformed statement; a statement over max_allowed_packet (16 MiB).
    r = subprocess.run(
        [*cmd, "-e", "SELEC 1 FORM nowhere"], capture_output=True, text=True, check=False
    )
    assert r.returncode != 0 and "syntax" in r.stderr, r.stderr
    big = f"INSERT INTO t.kv VALUES (1, '{'x' * (17 << 20)}')"
    r = subprocess.run(
        [*cmd, "--max-allowed-packet=64M"], input=big, capture_output=True, text=True, check=False
    )
    assert r.returncode != 0 and ("packet" in r.stderr.lower() or "gone away" in r.stderr), r.stderr
    # A client gone in the middle of a packet (its header says 1000 bytes).
    s = socket.create_connection(addr)
    s.recv(4096)  # the handshake
    s.sendall(b"\xe8\x03\x00\x01" + b"z" * 10)
    s.close()
    sql(addr, "INSERT INTO t.kv VALUES (2, 'after')")
    assert sql(addr, "SELECT k, v FROM t.kv").split() == ["2", "after"]
    assert_same_tables(cluster, "t.kv")


def test_now_is_the_same_on_every_replica(cluster):
    # same_clock: NOW() is the leader's time of the input, on every replica,
    # also on a backup that executes it later.
    cluster.up(app="mariadb")
    addr = cluster.client_addr()
    sql(addr, "CREATE DATABASE t; CREATE TABLE t.at (n INT PRIMARY KEY, t DATETIME(6))")
    for i in range(20):
        sql(addr, f"INSERT INTO t.at VALUES ({i}, NOW(6))")
        time.sleep(0.01)
    times = sql(addr, "SELECT COUNT(DISTINCT t) FROM t.at").split()
    assert times == ["20"], times  # the clock moves from input to input
    assert_same_tables(cluster, "t.at")
    assert not json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def same_everywhere(cluster, statement):
    """statement's answer (CHECKSUM TABLE) on every replica's own server,
    once every replica applied the whole log: all equal to the leader's, no
    tolerance for a reported divergence. Returns the leader's. The leader's
    answer is read anew each time: a repair under way can move the leadership
    to a replica whose row another draw made (CI saw the first answer read
    from a leader whose row the repair then replaced everywhere)."""
    want, got = None, {}

    def same(s):
        nonlocal want
        if not all(r["applied_index"] == leader_of(s).get("commit_index") for r in s["replicas"]):
            return False
        want = sql(cluster.client_addr(), statement)
        for r in range(len(s["replicas"])):
            with inspector.Relay(cluster.server_addr(r)) as local:  # a backup's own
                got[r] = mariadb(local, statement).stdout
        return all(v == want for v in got.values())

    try:
        cluster.wait(same, 60, "every replica's answer equal to the leader's")
    except AssertionError as e:
        raise AssertionError(f"{e}; leader {want!r}, replicas {got}") from None
    return want


def up_with_writer(cluster, columns):
    """A MariaDB cluster with user writer (ed25519, password lockstep-pw),
    allowed everything on database t, which holds table w (columns); the
    client address."""
    cluster.up(app="mariadb")
    addr = cluster.client_addr()
    sql(
        addr,
        "CREATE USER 'writer'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('lockstep-pw');"
        f"CREATE DATABASE t; GRANT ALL ON t.* TO 'writer'@'%'; CREATE TABLE t.w ({columns})",
    )
    return addr


def test_ed25519_password_logins_work_on_every_replica(cluster):
    # A user with a password (ed25519: the nonce of its auth switch comes
    # from RAND_bytes, which same_random makes the same on every replica):
    # the backups replay the client's signature of the leader's nonce, and
    # it must be valid there too, or a backup refuses the login the leader
    # accepted and the writes after it (a divergence, or tables that differ).
    # Several clients log in at once: serial_inputs has their nonces taken in
    # the log's order (preload/shim_random.c says when they may not be).
    addr = up_with_writer(
        cluster,
        "client INT, n INT, who VARCHAR(80), r VARBINARY(8), PRIMARY KEY (client, n)",
    )
    clients, logins = 4, 8

    def client(k):
        # A login per statement, several clients logging in at once.
        for n in range(logins):
            got = sql(
                addr,
                f"INSERT INTO t.w VALUES ({k}, {n}, CURRENT_USER(), NULL);"
                f"SELECT who FROM t.w WHERE client = {k} AND n = {n}",
                user="writer",
                password="lockstep-pw",
            )
            assert got.split() == ["writer@%"], got

    on_threads(client, clients)
    # One login, many writes on it, held open longer than the daemon's wait
    # for a backup's reply (a login refused on a backup would be a reply of
    # another length: guard/output/output_check.h). RANDOM_BYTES() (RAND_bytes as
    # well) is the same on every replica: the checksums below cover it.
    sql(
        addr,
        "UPDATE t.w SET n = n + 100, r = RANDOM_BYTES(8) WHERE client = 0; SELECT SLEEP(3);"
        "DELETE FROM t.w WHERE client = 1 AND n < 4",
        user="writer",
        password="lockstep-pw",
    )
    rows = sql(addr, "SELECT COUNT(*), COUNT(DISTINCT who), MIN(who), COUNT(DISTINCT r) FROM t.w")
    assert rows.split() == [str(clients * logins - 4), "1", "writer@%", str(logins)], rows
    same_everywhere(cluster, "CHECKSUM TABLE t.w")
    assert not json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def test_a_wrong_password_is_refused_alike_everywhere(cluster):
    # A wrong password is refused on the leader, and on every backup alike
    # (the same nonce, the same signature that does not match): no
    # divergence, and the right password still works afterwards.
    addr = up_with_writer(cluster, "n INT PRIMARY KEY")
    for n, password in enumerate(["wrong", "lockstep-pw", "", "lockstep-pwx", "lockstep-pw"]):
        r = mariadb(addr, f"INSERT INTO t.w VALUES ({n})", "writer", password)
        if password == "lockstep-pw":
            assert r.returncode == 0, r.stderr
        else:
            assert r.returncode != 0 and "Access denied for user 'writer'" in r.stderr, r.stderr
    time.sleep(3)  # longer than the daemon waits for a backup's reply of another length
    assert sql(addr, "SELECT n FROM t.w ORDER BY n").split() == ["1", "4"]
    same_everywhere(cluster, "CHECKSUM TABLE t.w")
    assert not json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def profile_checking_every_second(tmp_path):
    """apps/mariadb.toml with its state checks every second."""
    return app_profile(tmp_path, "mariadb", state_check_every_s=1)


def test_rand_and_uuid_rows_are_found_by_the_state_check_and_repaired(cluster, tmp_path):
    # RAND() and UUID() come from MariaDB's own generator and its monotonic
    # clock, which the shim does not reach: the row differs on every replica
    # though the client was told "OK" and nothing reads it back. The
    # profile's state check (CHECKSUM TABLE of every user table, through the
    # log) finds it, and the repair leaves every replica with the leader's row.
    cluster.up(app=profile_checking_every_second(tmp_path))
    addr = cluster.client_addr()
    sql(addr, "CREATE DATABASE t; CREATE TABLE t.r (id INT PRIMARY KEY, u VARCHAR(64), x DOUBLE)")
    sql(addr, "INSERT INTO t.r VALUES (1, UUID(), RAND())")
    # Found (a report of kind state), then repaired: a rollback draws anew
    # and differs again, so a backup ends up taking the leader's checkpoint.
    end = time.monotonic() + 60
    while not (rs := json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)):
        assert time.monotonic() < end, "no state report within 60 s"
        time.sleep(0.5)
    while True:  # the repair from the leader's checkpoint closes its clients' connections
        try:
            row = same_everywhere(cluster, "SELECT * FROM t.r")
            break
        except AssertionError as e:
            assert "Lost connection" in str(e) or "Can't connect" in str(e), e
            assert time.monotonic() < end + 60, e
            time.sleep(0.5)
    assert row.startswith("1\t"), row
    rs = json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)
    print(f"{len(rs)} reports: {[(r['replica'], r['kind'], r['status'], r['how']) for r in rs]}")
    # The state check found it first; a read of the row meanwhile (ours,
    # above) may find it too, as an output divergence.
    assert rs[0]["kind"] == "state", rs[0]


def test_a_cluster_whose_tables_agree_passes_its_state_checks(cluster, tmp_path):
    cluster.up(app=profile_checking_every_second(tmp_path))
    addr = cluster.client_addr()
    sql(addr, "CREATE DATABASE t; CREATE TABLE t.a (n INT PRIMARY KEY, s VARCHAR(20), t DATETIME)")
    for i in range(30):
        sql(addr, f"INSERT INTO t.a VALUES ({i}, 'row {i}', NOW())")
    cluster.wait_state_checks(1)
    same_everywhere(cluster, "CHECKSUM TABLE t.a")
    st = cluster.state_checks()
    assert st["failed"] == 0 and "t.a" in st["digest"], st
    assert not json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)


def test_a_cloned_start_gives_every_backup_its_own_files_and_socket(cluster, tmp_path):
    # With cloned_start every backup's mariadbd is a restore of replica 0's
    # image. That image names replica 0's unix socket and, in --tmpdir,
    # InnoDB's unlinked temporary files, which criu makes again on restore:
    # the socket was re-bound at replica 0's path (its own then refused
    # connections) and, in a shared /tmp, two backups restoring at once took
    # each other's files ("Can't create ghost regfile: File exists"). Both
    # are relocated into each replica's directory now; each restore works
    # the first time and every replica's socket answers.
    cluster.up(app=app_profile(tmp_path, "mariadb", cloned_start=True))
    addr = cluster.client_addr()
    sql(addr, "CREATE DATABASE t; CREATE TABLE t.u (id INT PRIMARY KEY, s BIGINT)")
    sql(addr, "INSERT INTO t.u VALUES (1, UUID_SHORT())")
    row = same_everywhere(cluster, "SELECT * FROM t.u")  # start time and counter: the clone's
    assert row.startswith("1\t"), row
    for r in range(3):
        log = (Path(cluster.dir) / f"replica-{r}.log").read_text()
        assert "STATE TRANSFER FAILED" not in log, log[-3000:]
        sock = Path(cluster.dir) / f"replica-{r}" / "server" / "mysqld.sock"
        got = subprocess.run(
            [MARIADB, "-S", str(sock), "-u", "root", "--batch", "--skip-column-names"]
            + ["-e", "SELECT COUNT(*) FROM t.u"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert got.returncode == 0 and got.stdout.strip() == "1", (r, got.stderr)
    assert not json.loads(run("divergence", "list", "--json", "--dir", cluster.dir).stdout)
