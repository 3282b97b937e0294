"""eval/faults.py — randomized fault runs against redis under lockstep (issue 11), the
way Jepsen and etcd's robustness tests go about it: `scripts/faults --runs N --seed S`.

Each run starts a fresh cluster on namespace hosts (`lockstep cluster up --hosts
netns --app redis`: a network namespace per replica, UCX over tcp), runs client
threads in the client namespace doing GET, SET and INCR on a few keys (eval/history.py:
every op's call and return time, and whether its outcome is known), and lets a
nemesis inject one kind of fault again and again at random moments, on the leader or
on a backup as the run's seed says, each held for a random while and then healed:

  kill-daemon   SIGKILL of a replica's daemon; healed by `cluster restart`
  stop-daemon   SIGSTOP of a daemon (a hung process, a VM paused); SIGCONT
  kill-server   SIGKILL of a replica's redis (its guard restores it by itself)
  stop-server   SIGSTOP of a redis; SIGCONT
  partition     the replica's link taken down in the hub namespace (both ways)
  one-way       nftables in the replica's namespace drops what its peers send it, while
                what it sends still goes out
  msg-loss      the replica's messages to its peers (elections, heartbeats) lost with
                probability 0.2-0.5 and late by 10-100 ms (`lockstep failpoint`: this
                kernel has no netem); healed by `failpoint off`
  slow-disk     each of the replica's durable writes waits 20-150 ms first
  torn-write    the replica's next log append stops before the sector holding its last
                record's canary and the replica exits, as a crash would; healed by
                `cluster restart` (its recovery must drop the torn tail)
  clock-jump    the replica's clock jumps 0.5-3 s ahead (as if it alone had paused)
  attacker      a hostile process in the client namespace (eval/attacker.py): SETs of its
                own to the backups' server ports from privileged and ordinary source ports,
                and recorded TLS bytes replayed to the daemons' client ports; any reply a
                backup's server gives it is a problem of the run, and its keys must be on
                no replica (the replicas must still hold the same)

The failpoint kinds need a cluster made with `cluster up --failpoints`, as the runner's
are; their random draws are seeded from the run's seed too.

Kinds take turns over the runs (run i has kind i mod K), so each row of the summary
counts runs of one kind. At the end of a run every fault is healed and the replicas
catch up; then

  - porcupine (build/bin/lincheck) checks the history for linearizability;
  - no acknowledged write is lost: the value each key ends with was not overwritten,
    in real time, by a SET acknowledged after its own returned, and no counter ends
    below an INCR's acknowledged result;
  - every replica's redis holds the same keys and values (read from the client
    namespace: DBSIZE and each key);
  - unavailability: for each fault, the time from its injection to the next op that
    any client completed with a known outcome (clients give up on an op after
    --op-timeout, then connect again: to the address that follows the leader, or with
    --connect status to the leader `cluster status` names); and, for new clients, the
    time until a fresh connection was answered again (a probe in the client namespace
    every 10 ms: connect and PING, 50 ms each).

A run that fails any check keeps its directory in eval/out/faults/: the history, the
porcupine visualization (HTML), every replica's log, and what went wrong. The summary
(eval/out/faults/summary.json and .md) is a table: fault kind x runs x linearizable x
lost acknowledged x unavailability p50/p99. The exit status is 1 when any run failed.
A run's seed replays its fault schedule (kinds, targets, timings): `--seed S --runs 1
--kinds K`; what the machine does meanwhile is not replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import history  # eval/history.py: the client workload and the lincheck call
from attacker import Attacker
from netns import run_in_netns
from resp import Redis

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("LOCKSTEP_BUILD", ROOT / "build"))
LOCKSTEP = BUILD / "bin" / "lockstep"
LINCHECK = next(
    (p for p in (BUILD / "bin" / "lincheck", ROOT / "build" / "bin" / "lincheck") if p.exists()),
    ROOT / "build" / "bin" / "lincheck",
)
OUT = ROOT / "eval" / "out" / "faults"
KINDS = [
    "kill-daemon",
    "stop-daemon",
    "kill-server",
    "stop-server",
    "partition",
    "one-way",
    "msg-loss",
    "slow-disk",
    "torn-write",
    "clock-jump",
    "attacker",
]
# Porcupine checks each key's history on its own, and its search grows fast with the
# writes of unknown outcome a key collects (a leader's server killed mid-op leaves
# dozens): more keys, shorter histories each. With 6 keys one run in 20 outran the
# checker's 2 minutes.
KEYS = tuple(f"k{i}" for i in range(12))
COUNTERS = ("n0", "n1")


def log(msg):
    print(msg, flush=True)


def lockstep(*args, check=True, timeout=60, env=None):
    return history.run_lockstep(LOCKSTEP, *args, check=check, timeout=timeout, env=env)


def sh(*cmd, check=True):
    p = subprocess.run(
        [str(c) for c in cmd], check=False, capture_output=True, text=True, timeout=30
    )
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: {p.stderr.strip()}")
    return p


class Probe:
    """A new client every 10 ms: a fresh connection to where clients connect, one PING,
    50 ms allowed for each step. When the first one started after a fault was answered
    says how long lockstep left new clients unserved, whatever the workload's own
    timeouts (its clients first wait out an op stuck on the old leader). Runs in the
    client namespace (started by run_in_netns)."""

    def __init__(self, find_addr):
        self.find_addr = find_addr
        self.tries: list[tuple[int, int, bool]] = []  # (start ns, end ns, answered)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=5)

    def loop(self):
        while not self.stopping.is_set():
            t0 = time.monotonic_ns()
            ok = False
            try:
                host, port = history.parse_addr(self.find_addr())
                with socket.create_connection((host, port), timeout=0.05) as s:
                    s.settimeout(0.05)
                    s.sendall(b"*1\r\n$4\r\nPING\r\n")
                    ok = s.recv(64).startswith(b"+PONG")
            except (OSError, ValueError, TypeError):
                pass
            self.tries.append((t0, time.monotonic_ns(), ok))
            time.sleep(0.01)

    def unserved_ms(self, injected_ns):
        """From injected_ns to the answer of the first probe started after it; None: never."""
        ends = [e for s, e, ok in self.tries if ok and s >= injected_ns]
        return (min(ends) - injected_ns) / 1e6 if ends else None


class Run:
    """One cluster, one workload, one kind of fault; its checks."""

    def __init__(
        self,
        index,
        seed,
        kind,
        seconds,
        op_timeout,
        clients,
        think_s=0.004,
        connect="leader",
        lease_us=0,
    ):
        self.index, self.seed, self.kind = index, seed, kind
        self.lease_us = lease_us
        # Lease reads seen, by (replica, its server's pid): a server that
        # restarts counts from 0 again, and a dead one's count is kept.
        self.lease_reads: dict = {}
        self.connect = connect
        self.seconds, self.op_timeout, self.clients = seconds, op_timeout, clients
        self.think_s = think_s
        self.rng = random.Random(seed)
        self.dir = Path(tempfile.mkdtemp(prefix=f"lockstep-faults-{index}-"))
        self.events: list[dict] = []
        self.heals: list = []  # what is still to be undone, in order
        self.problems: list[str] = []
        self.attacks: dict = {"privileged": 0, "scan": 0, "replay": 0, "served": 0}

    # ------------------------------------------------------------- cluster
    def status(self):
        return json.loads(lockstep("cluster", "status", "--json", "--dir", self.dir).stdout)

    def up(self):
        lockstep(
            "cluster",
            "up",
            "--dir",
            self.dir,
            "--hosts",
            "netns",
            "--app",
            "redis",
            "--no-checkpoints",
            "--failpoints",  # the failpoint kinds (kept by replicas started again)
            *(("--lease-us", str(self.lease_us)) if self.lease_us else ()),
            timeout=120,
        )
        conf = tomllib.loads((self.dir / "cluster.toml").read_text())
        self.leader_address = conf["cluster"].get("leader_address")
        self.replicas = conf["replica"]
        self.client_ns = conf["cluster"]["client_netns"]
        self.hub = self.client_ns.rsplit("-", 1)[0] + "-hub"

    def down(self):
        lockstep("cluster", "down", "--dir", self.dir, "--quiet", check=False)

    def wait(self, predicate, seconds, what):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                s = self.status()
                if predicate(s):
                    return s
            except (RuntimeError, ValueError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {seconds} s waiting for {what}")

    # ------------------------------------------------------------- nemesis
    def target(self, role):
        s = self.status()
        ids = [r["id"] for r in s["replicas"] if r["role"] not in ("down", "")]
        if role == "leader" and s["leader"] is not None:
            return s["leader"], s
        backups = [i for i in ids if i != s["leader"]]
        return (self.rng.choice(backups) if backups else self.rng.choice(ids)), s

    def inject(self, role):
        """Injects one fault of the run's kind; returns (replica, heal)."""
        r, s = self.target(role)
        info = s["replicas"][r]
        kind = self.kind
        if kind in ("kill-daemon", "stop-daemon"):
            pid = info["pid"]
            if kind == "kill-daemon":
                os.kill(pid, signal.SIGKILL)
                return r, lambda: lockstep("cluster", "restart", "--dir", self.dir, "--id", r)
            os.kill(pid, signal.SIGSTOP)
            return r, lambda: os.kill(pid, signal.SIGCONT)
        if kind in ("kill-server", "stop-server"):
            pid = info["server_pid"]
            if kind == "kill-server":
                os.kill(pid, signal.SIGKILL)
                return r, lambda: None  # its guard restores it
            os.kill(pid, signal.SIGSTOP)
            return r, lambda: os.kill(pid, signal.SIGCONT)
        if kind == "partition":
            sh("ip", "-n", self.hub, "link", "set", f"r{r}", "down")
            return r, lambda: sh("ip", "-n", self.hub, "link", "set", f"r{r}", "up")
        if kind == "one-way":
            ns = self.replicas[r]["netns"]
            peers = ", ".join(p["host"] for p in self.replicas if p["id"] != r)
            rules = (
                "table ip lockstep_faults {\n  chain input {\n"
                "    type filter hook input priority 0; policy accept;\n"
                f"    ip saddr {{ {peers} }} drop\n  }}\n}}\n"
            )
            p = subprocess.run(
                ["ip", "netns", "exec", ns, "nft", "-f", "-"],
                input=rules,
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
            )
            if p.returncode != 0:
                raise RuntimeError(f"nft in {ns}: {p.stderr.strip()}")
            return r, lambda: sh(
                "ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "lockstep_faults"
            )
        if kind == "attacker":
            return self.attack(s)
        if kind in ("msg-loss", "slow-disk", "torn-write", "clock-jump"):
            seed = self.rng.randrange(1 << 32)
            spec = {
                "msg-loss": [
                    f"drop={self.rng.uniform(0.2, 0.5):.2f}",
                    "delay_ms=10",
                    "jitter_ms=90",
                ],
                "slow-disk": [f"disk_delay_ms={self.rng.randint(20, 150)}"],
                "torn-write": ["torn_write=1"],
                "clock-jump": [f"clock_jump_ms={self.rng.randint(500, 3000)}"],
            }[kind]
            self.failpoint(r, *spec, f"seed={seed}")
            if kind != "torn-write":
                return r, lambda: self.failpoint(r, "off")
            return r, lambda: self.heal_torn(r)
        raise ValueError(f"unknown fault kind {kind}")

    def attack(self, s):
        """Starts an attacker against the backups of now (eval/attacker.py); its heal stops
        it and counts what it tried and what a backup's server answered it."""
        lead = s["leader"]
        backups = [(p["id"], p["host"], p["server_port"]) for p in self.replicas if p["id"] != lead]
        daemons = [(p["host"], p["client_port"]) for p in self.replicas]
        a = Attacker(backups, daemons, self.rng.getrandbits(32))
        run_in_netns(self.client_ns, a.start)

        def heal():
            a.stop()
            for kind, n in a.tries.items():
                self.attacks[kind] += n
            # A backup that came to lead meanwhile serves clients, the attacker among them,
            # through the log: that is no hole.
            led = {lead, self.status()["leader"]}
            served = [what for replica, what in a.served if replica not in led]
            self.attacks["served"] += len(served)
            self.problems += served

        return (lead if lead is not None else 0), heal

    def failpoint(self, r, *spec):
        lockstep("failpoint", "--dir", self.dir, "--id", r, *spec)

    def heal_torn(self, r):
        """Clears an unspent torn write; restarts the replica if it spent it (exited)."""
        try:
            self.failpoint(r, "off")
        except RuntimeError:
            pass  # it has exited
        if self.status()["replicas"][r]["role"] == "down":
            lockstep("cluster", "restart", "--dir", self.dir, "--id", r)

    def nemesis(self, until):
        time.sleep(0.5 + self.rng.random())  # the clients get going first
        while time.monotonic() + 1.5 < until:
            self.note_lease_reads()
            role = self.rng.choice(["leader", "backup"])
            hold = self.rng.uniform(0.3, 1.2)
            replica, heal = self.inject(role)
            t0 = time.monotonic_ns()  # the fault is in place from here
            self.heals.append(heal)
            time.sleep(hold)
            heal()
            self.heals.remove(heal)
            self.events.append(
                {
                    "kind": self.kind,
                    "role": role,
                    "replica": replica,
                    "injected_ns": t0,
                    "healed_ns": time.monotonic_ns(),
                }
            )
            time.sleep(self.rng.uniform(0.5, 1.5))

    def note_lease_reads(self, s=None):
        try:
            s = s or self.status()
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            return
        for r in s["replicas"]:
            key = (r["id"], r.get("server_pid"))
            self.lease_reads[key] = max(self.lease_reads.get(key, 0), r.get("lease_reads", 0))

    # ------------------------------------------------------------- checks
    def caught_up(self, s):
        lead = s["leader"]
        if lead is None:
            return False
        commit = s["replicas"][lead]["commit_index"]
        return all(
            r["applied_index"] >= commit and r.get("server_read_all", True) and r["role"] != "down"
            for r in s["replicas"]
        )

    def final_state(self):
        """Each replica's redis, read from the client namespace: {replica: (dbsize, values)}."""

        def read():
            out = {}
            for rep in self.replicas:
                c = Redis((rep["host"], rep["server_port"]), timeout=5, inspect=True)
                try:
                    size = c.call("DBSIZE")
                    values = {k: c.call("GET", k) for k in KEYS + COUNTERS}
                finally:
                    c.close()
                out[rep["id"]] = (size, {k: v.decode() if v else None for k, v in values.items()})
            return out

        deadline = time.monotonic() + 20
        while True:  # a server being restored answers a moment later
            try:
                return run_in_netns(self.client_ns, read)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def settled_state(self, tries=10):
        """final_state() read while every replica stays caught up and no daemon restarts,
        read again (0.3 s apart) while the replicas differ. A replica its keeper restarted
        meanwhile refills its server from the log, and a server that has read its last
        inputs (server_read_all) may still be executing them. A difference that outlasts
        the retries (3 s) is reported; the last read if it never settles."""

        def pids(s):
            return [r["pid"] for r in s["replicas"]]

        for _ in range(tries):
            try:
                before = self.wait(self.caught_up, 60, "every replica to catch up")
            except RuntimeError:  # run() noted it: what each replica holds says the rest
                return self.final_state()
            states = self.final_state()
            after = self.status()
            same = len({json.dumps(v, sort_keys=True) for v in states.values()}) == 1
            if same and pids(before) == pids(after) and self.caught_up(after):
                return states
            time.sleep(0.3)
        return states

    def daemon_crashes(self):
        """Crashes the replicas' keepers restarted (replica-N.log): {replica: [signal, ...]}."""
        out = {}
        for log_file in sorted(self.dir.glob("replica-*.log")):
            said = log_file.read_text(errors="replace")
            hits = re.findall(r"replica (\d+) \(pid \d+\) crashed with ([^(,]+)", said)
            for replica, sig in hits:
                out.setdefault(int(replica), []).append(sig.strip())
        return out

    def lost_acknowledged(self, ops, final):
        lost = []
        for key in KEYS:
            sets = [o for o in ops if o["key"] == key and o["op"] == "set"]
            value = final.get(key)
            src = next((o for o in sets if o["value"] == value), None)
            # The surviving write's effect ends at its return (never, if its outcome is unknown).
            ended = (
                -1
                if value is None
                else (src["return_ns"] if src and not src["unknown"] else float("inf"))
            )
            if value is not None and src is None:
                lost.append(f"{key} holds {value!r}, which no client wrote")
            for o in sets:
                if not o["unknown"] and o["call_ns"] > ended:
                    lost.append(f"SET {key} {o['value']} (acknowledged) is gone: {key}={value!r}")
        for key in COUNTERS:
            acked = [
                int(o["output"])
                for o in ops
                if o["key"] == key
                and o["op"] == "incr"
                and not o["unknown"]
                and str(o.get("output", "")).lstrip("-").isdigit()
            ]
            value = int(final.get(key) or 0)
            if acked and value < max(acked):
                lost.append(f"INCR {key} acknowledged {max(acked)}, but {key}={value}")
        return lost

    def unavailability(self, ops):
        """Per fault: from its injection until an op a client began after it completed with
        a known outcome (ops already under way may finish on a leader about to go)."""
        done = sorted((o["call_ns"], o["return_ns"]) for o in ops if not o["unknown"])
        out = []
        for e in self.events:
            ends = [r for c, r in done if c >= e["injected_ns"]]
            e["unavailable_ms"] = (min(ends) - e["injected_ns"]) / 1e6 if ends else None
            out.append(e["unavailable_ms"])
        return out

    # ------------------------------------------------------------- the run
    def run(self):
        t_start = time.monotonic()
        self.up()
        if self.connect == "leader-address" and self.leader_address:
            find_addr = lambda: self.leader_address  # it follows the leader
        else:
            find_addr = history.lockstep_find_addr(self.dir, lockstep=LOCKSTEP)
        workload = history.Workload(
            find_addr,
            clients=self.clients,
            keys=KEYS,
            incr_keys=COUNTERS,
            timeout=self.op_timeout,
            seed=self.rng.getrandbits(32),
            think_s=self.think_s,
        )
        run_in_netns(self.client_ns, workload.start)  # its threads live in the namespace
        probe = Probe(find_addr)
        run_in_netns(self.client_ns, probe.start)
        try:
            self.nemesis(time.monotonic() + self.seconds)
        finally:
            probe.stop()
            for heal in reversed(self.heals):
                try:
                    heal()
                except Exception as e:  # noqa: BLE001 - the others are healed still
                    self.problems.append(f"healing failed: {e}")
            workload.stop()
        try:
            self.wait(self.caught_up, 60, "every replica to catch up after the faults")
        except RuntimeError as e:
            self.problems.append(str(e))
        ops = workload.history()["ops"]
        hist = self.dir / "history.json"
        hist.write_text(json.dumps({"ops": ops}))
        lin = history.check(hist, lincheck=LINCHECK, timeout="120s")
        linearizable = lin.returncode == 0
        if "UNKNOWN" in lin.stdout:  # not a violation found, but not a proof either
            self.problems.append(f"not checked: {lin.stdout.strip()[-300:]}")
        elif not linearizable:
            self.problems.append(f"lincheck exited {lin.returncode}: {lin.stdout.strip()[-300:]}")
            history.check(hist, visualize=self.dir / "porcupine.html", lincheck=LINCHECK)
        states = self.settled_state()
        if len({json.dumps(v, sort_keys=True) for v in states.values()}) != 1:
            self.problems.append(f"replicas differ: {states}")
        crashes = self.daemon_crashes()
        final = self.status()
        self.note_lease_reads(final)
        lead = final["leader"]
        lost = self.lost_acknowledged(ops, states[lead if lead is not None else 0][1])
        self.problems += lost
        unavailable = self.unavailability(ops)
        for e in self.events:
            e["new_client_unserved_ms"] = probe.unserved_ms(e["injected_ns"])
        known = sum(1 for o in ops if not o["unknown"])
        return {
            "run": self.index,
            "seed": self.seed,
            "kind": self.kind,
            "faults": len(self.events),
            "ops": len(ops),
            "known_ops": known,
            "linearizable": linearizable,
            "lost_acknowledged": len(lost),
            "replicas_identical": not any(p.startswith("replicas differ") for p in self.problems),
            "unavailable_ms": unavailable,
            "daemon_crashes": crashes,
            "events": self.events,
            "problems": self.problems,
            "attacks": self.attacks if self.kind == "attacker" else None,
            "lease_reads": sum(self.lease_reads.values()),
            "seconds": round(time.monotonic() - t_start, 1),
        }

    def keep(self, dest: Path, result):
        """A failed run's evidence: the history, porcupine's view, the logs."""
        dest.mkdir(parents=True, exist_ok=True)
        for f in ["history.json", "porcupine.html", "cluster.toml", "netns"] + [
            p.name for p in self.dir.glob("replica-*.log")
        ]:
            if (self.dir / f).exists():
                shutil.copy(self.dir / f, dest / f)
        for r in self.dir.glob("replica-*/server.log"):
            shutil.copy(r, dest / f"{r.parent.name}-server.log")
        (dest / "result.json").write_text(json.dumps(result, indent=1))


def percentile(values, q):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


def summarize(results):
    """One row per fault kind and target (leader, backup): the runs that had such faults."""
    rows = []
    for kind in KINDS:
        for role in ("leader", "backup"):
            rs = [
                r
                for r in results
                if r["kind"] == kind and any(e["role"] == role for e in r["events"])
            ]
            if not rs:
                continue
            events = [e for r in rs for e in r["events"] if e["role"] == role]
            un = [e.get("unavailable_ms") for e in events]
            unserved = [e.get("new_client_unserved_ms") for e in events]
            rows.append(
                {
                    "kind": kind,
                    "target": role,
                    "runs": len(rs),
                    "faults": len(events),
                    "linearizable": sum(r["linearizable"] for r in rs),
                    "lost_acknowledged": sum(r["lost_acknowledged"] for r in rs),
                    "identical": sum(r["replicas_identical"] for r in rs),
                    "failed": sum(bool(r["problems"]) for r in rs),
                    "daemon_crashes": sum(
                        len(v) for r in rs for v in r.get("daemon_crashes", {}).values()
                    ),
                    "unavailable_p50_ms": percentile(un, 0.5),
                    "unavailable_p99_ms": percentile(un, 0.99),
                    "new_client_unserved_p50_ms": percentile(unserved, 0.5),
                    "new_client_unserved_p99_ms": percentile(unserved, 0.99),
                    "never_available_again": sum(u is None for u in un),
                }
            )
    broke = [r for r in results if not r["events"]]
    if broke:
        rows.append(
            {
                "kind": "(no fault injected)",
                "target": "-",
                "runs": len(broke),
                "faults": 0,
                "linearizable": sum(r["linearizable"] for r in broke),
                "lost_acknowledged": 0,
                "identical": sum(r["replicas_identical"] for r in broke),
                "failed": sum(bool(r["problems"]) for r in broke),
                "unavailable_p50_ms": None,
                "unavailable_p99_ms": None,
                "never_available_again": 0,
            }
        )
    return rows


def table(rows):
    def ms(v):
        return "-" if v is None else f"{v:.0f}"

    lines = [
        (
            "| fault | target | runs | faults | linearizable | lost acknowledged "
            "| replicas identical | daemon crashes | unavailable p50 ms | p99 ms "
            "| new client unserved p50 ms | p99 ms |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['target']} | {r['runs']} | {r['faults']} "
            f"| {r['linearizable']}/{r['runs']} "
            f"| {r['lost_acknowledged']} | {r['identical']}/{r['runs']} "
            f"| {r.get('daemon_crashes', 0)} | {ms(r['unavailable_p50_ms'])} | {ms(r['unavailable_p99_ms'])} "
            f"| {ms(r.get('new_client_unserved_p50_ms'))} "
            f"| {ms(r.get('new_client_unserved_p99_ms'))} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Randomized fault runs against redis under lockstep on namespace hosts.",
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--runs", type=int, default=12, help="how many runs (default 12)")
    ap.add_argument(
        "--seed", type=int, default=None, help="seed of the first run (default: random)"
    )
    ap.add_argument("--seconds", type=float, default=8.0, help="load and faults per run (8)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated")
    ap.add_argument("--clients", type=int, default=4, help="client threads (4)")
    ap.add_argument("--op-timeout", type=float, default=0.3, help="a client gives up after (s)")
    ap.add_argument(
        "--connect",
        choices=["leader-address", "status"],
        default="leader-address",
        help="where clients connect: the address that follows the leader (cluster.toml's "
        "leader_address), or the leader `cluster status` names after each failure",
    )
    ap.add_argument(
        "--lease-us",
        type=int,
        default=0,
        help="the leader's lease (cluster up --lease-us): the clients' GETs are then served "
        "without the log while it holds; 0 (default): none",
    )
    ap.add_argument("--out", default=str(OUT), help="where the summary and failed runs go")
    ap.add_argument(
        "--keep-all", action="store_true", help="keep every run's evidence, not only failed ones'"
    )
    a = ap.parse_args(argv)
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        ap.error(f"unknown fault kinds {bad}; known: {', '.join(KINDS)}")
    if a.runs < 1 or a.seconds < 3:
        ap.error("--runs must be at least 1 and --seconds at least 3")
    if os.geteuid() != 0:
        ap.error("fault runs make network namespaces and signal processes: run as root")
    for tool in (LOCKSTEP, LINCHECK):
        if not tool.exists():
            ap.error(f"{tool} missing: run scripts/setup")
    first = a.seed if a.seed is not None else random.randrange(1 << 31)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"{a.runs} runs from seed {first}, kinds {','.join(kinds)}, {a.seconds} s each")
    results = []
    for i in range(a.runs):
        seed = first + i
        kind = kinds[i % len(kinds)]
        run = Run(
            i,
            seed,
            kind,
            a.seconds,
            a.op_timeout,
            a.clients,
            connect=a.connect,
            lease_us=a.lease_us,
        )
        try:
            result = run.run()
        except Exception as e:  # noqa: BLE001 - a run that could not even finish is a failure
            result = {
                "run": i,
                "seed": seed,
                "kind": kind,
                "faults": len(run.events),
                "ops": 0,
                "known_ops": 0,
                "linearizable": False,
                "lost_acknowledged": 0,
                "replicas_identical": False,
                "unavailable_ms": [],
                "events": run.events,
                "problems": [f"the run broke off: {type(e).__name__}: {e}"],
            }
        finally:
            run.down()
        results.append(result)
        verdict = "ok" if not result["problems"] else "FAILED: " + "; ".join(result["problems"])
        un = [u for u in result["unavailable_ms"] if u is not None]
        log(
            f"run {i + 1}/{a.runs} seed {seed} {kind}: {result['faults']} faults, "
            f"{result['known_ops']}/{result['ops']} ops known, unavailable "
            f"{'/'.join(f'{u:.0f}' for u in un) or '-'} ms"
            f"{', daemon crashes ' + str(result['daemon_crashes']) if result.get('daemon_crashes') else ''}"
            f"{', lease reads ' + str(result['lease_reads']) if result.get('lease_reads') else ''}"
            f": {verdict}"
        )
        if result["problems"] or a.keep_all:
            dest = out / f"run-{seed}"
            run.keep(dest, result)
            log(f"  kept in {dest} (history.json, porcupine.html, replicas' logs)")
        shutil.rmtree(run.dir, ignore_errors=True)
    rows = summarize(results)
    all_un = [u for r in results for u in r["unavailable_ms"] if u is not None]
    summary = {
        "first_seed": first,
        "runs": a.runs,
        "seconds": a.seconds,
        "op_timeout_s": a.op_timeout,
        "connect": a.connect,
        "failed_runs": sum(bool(r["problems"]) for r in results),
        "rows": rows,
        "unavailable_p50_ms": percentile(all_un, 0.5),
        "results": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    md = (
        f"# Fault runs: {a.runs} from seed {first}, {a.seconds} s each\n\n"
        f"redis under lockstep on namespace hosts (UCX over tcp), {a.clients} clients "
        f"(op timeout {a.op_timeout} s, connecting to "
        f"{'the leader address' if a.connect == 'leader-address' else 'the leader status names'}"
        f"). Unavailable: from a fault's injection to the next op "
        f"any client completed with a known outcome (bounded below by how long a client "
        f"waits for an op stuck on a leader that is gone). New client unserved: from the "
        f"injection to the answer of the first fresh connection (a probe every 10 ms, 50 ms "
        f"to connect and 50 ms for a PING) started after it. Daemon crashes: replicas that "
        f"died by a signal of their own (an abort) and were started again by their keeper "
        f"(`replica --keep`); not a failed run by themselves.\n\n{table(rows)}\n"
    )
    (out / "summary.md").write_text(md)
    log("\n" + table(rows))
    log(f"\n{summary['failed_runs']} of {a.runs} runs failed; summary in {out}/summary.md")
    return 1 if summary["failed_runs"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
