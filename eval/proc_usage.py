"""proc_usage.py — the CPU time and context switches of processes, from /proc, over a
run: what every bench reports per op for each class of process (daemons, servers) and
for the load generator itself. Calls nothing of the project's; apps.py and the benches
call it."""

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path


def process_cpu(pid, children=False):
    """CPU seconds so far of process pid, every thread's, those that ended too
    (/proc/PID/stat); with children, its children's that ended and were waited for. 0 for
    a process gone."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
        if children:
            ticks += int(f[13]) + int(f[14])  # cutime, cstime (fields 16, 17)
        return ticks / os.sysconf("SC_CLK_TCK")
    return 0.0


def thread_switches(pid):
    """{thread id: context switches so far (voluntary and not)} of process pid's threads
    alive now. The kernel keeps no count of the ones that ended."""
    out = {}
    with contextlib.suppress(OSError):
        for t in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                text = (t / "status").read_text()
                out[int(t.name)] = sum(
                    int(ln.split()[1]) for ln in text.splitlines() if "ctxt_switches:" in ln
                )
    return out


def cpu_of(pids, children=False):
    """CPU seconds so far of processes pids, every thread's (process_cpu), with children
    also that of their children that have ended and been waited for (a daemon's state
    probes and CRIU dumps)."""
    return sum(process_cpu(p, children) for p in pids)


class UsageSpan:
    """The CPU time and context switches of processes over a with block, by class ({class:
    [pid]}); .spent is {class: (CPU s, switches)} once it ended. Context switches are
    counted per thread and a thread that ends takes its count along (MariaDB's connection
    threads end with their client: counted before and after a sysbench run, its servers
    showed 0.4 to 5.6 switches per transaction where perf stat counted 40), so a thread of
    ours samples every thread's count every `every` s and keeps its last; a thread born
    and gone between two samples is missed."""

    def __init__(self, pids, every=0.5):
        self.pids, self.every, self.spent = pids, every, None
        self._first, self._last = {}, {}  # (class, pid, tid) -> switches
        self._stop = threading.Event()

    def _sample(self, into):
        for k, ps in self.pids.items():
            for p in ps:
                for tid, n in thread_switches(p).items():
                    into[(k, p, tid)] = n

    def _run(self):
        while not self._stop.wait(self.every):
            self._sample(self._last)

    def __enter__(self):
        self._cpu = {k: cpu_of(ps) for k, ps in self.pids.items()}
        self._sample(self._first)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample(self._last)
        sw = dict.fromkeys(self.pids, 0)
        for key, n in self._last.items():
            sw[key[0]] += n - self._first.get(key, 0)  # a thread born in the span: from 0
        self.spent = {k: (cpu_of(ps) - self._cpu[k], sw[k]) for k, ps in self.pids.items()}
        return False


def run_counted(cmd, pids, timeout):
    """Runs cmd (a load generator) to its end, killed after timeout s (and on an error or
    Ctrl-C), counting the CPU time and context switches of the processes pids ({class:
    [pid]}) over its run. Returns (returncode, stdout, stderr, {class: (CPU s, switches)},
    cmd's own rusage)."""
    span = UsageSpan(pids)
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        span,
    ):
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout
            while (done := os.wait4(p.pid, os.WNOHANG))[0] == 0:
                if time.monotonic() > deadline:
                    p.kill()
                    done = os.wait4(p.pid, 0)
                    break
                time.sleep(0.05)
        except BaseException:
            if p.returncode is None:
                with contextlib.suppress(OSError):
                    p.kill()
                    p.wait()
            raise
        p.returncode = os.waitstatus_to_exitcode(done[1])
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return p.returncode, stdout, stderr, span.spent, done[2]


def per_op(spent, rusage, n, own="loadgen"):
    """{class: {"cpu_us", "switches"}} per op of n ops, from run_counted's spent and rusage
    (the load generator's own under the class `own`)."""
    out = {k: {"cpu_us": cpu * 1e6 / n, "switches": sw / n} for k, (cpu, sw) in spent.items()}
    out[own] = {
        "cpu_us": (rusage.ru_utime + rusage.ru_stime) * 1e6 / n,
        "switches": (rusage.ru_nvcsw + rusage.ru_nivcsw) / n,
    }
    return out
