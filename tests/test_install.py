"""`cmake --install` (issue 28, item 4): the installed layout runs on its own.

The build is installed into a temporary prefix, which is then moved (so that
nothing can come from where it was installed, nor from the build tree by a
path fixed at build time), and its bin/lockstep brings up a redis cluster
from its own share/lockstep/apps profile, its servers under its own
lib/lockstep shim, and serves a SET and a GET. The systemd unit it installs
names that binary.
"""

import json
import shutil
import subprocess
from pathlib import Path

from conftest import BUILD_DIR, ROOT
from resp import Redis

CMAKE = shutil.which("cmake")


def installed(prefix):
    r = subprocess.run(
        [CMAKE, "--install", str(BUILD_DIR), "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, f"cmake --install: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return r.stdout


def lockstep(binary, *args, check=True):
    r = subprocess.run(
        [str(binary), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert r.returncode == 0, f"{binary} {args}: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    return r


def test_an_installed_lockstep_finds_its_shim_and_profiles(tmp_path, cluster):
    out = installed(tmp_path / "first")
    for name in ("bin/lockstep", "lib/lockstep/liblockstep_preload.so", "share/lockstep/apps"):
        assert name in out, out
    prefix = tmp_path / "moved"
    (tmp_path / "first").rename(prefix)
    binary = prefix / "bin" / "lockstep"
    profiles = sorted(p.name for p in (prefix / "share/lockstep/apps").glob("*.toml"))
    assert profiles == sorted(p.name for p in (ROOT / "apps").glob("*.toml")), profiles
    assert (prefix / "share/lockstep/apps/redis/state_probe.sh").is_file()

    # The profiles it knows are the installed ones.
    r = lockstep(binary, "cluster", "up", "--app", "no-such-app", "--dir", cluster.dir, check=False)
    assert r.returncode != 0 and f"{prefix}/share/lockstep/apps" in r.stderr, r.stderr

    lockstep(
        *(binary, "cluster", "up", "--app", "redis", "--dir", cluster.dir),
        *("--base-port", cluster.base_port),
    )
    try:
        st = json.loads(
            lockstep(binary, "cluster", "status", "--json", "--dir", cluster.dir).stdout
        )
        maps = Path(f"/proc/{st['replicas'][0]['server_pid']}/maps").read_text()
        assert f"{prefix}/lib/lockstep/liblockstep_preload.so" in maps, "not the installed shim"
        assert str(BUILD_DIR) not in maps
        host, port = st["client_addr"].rsplit(":", 1)
        c = Redis((host, int(port)), timeout=10)
        try:
            assert c.call("SET", "installed", "yes") == "OK"
            assert c.call("GET", "installed") == b"yes"
        finally:
            c.close()
    finally:
        lockstep(binary, "cluster", "down", "--dir", cluster.dir, "--quiet", check=False)


def test_the_installed_systemd_unit_runs_the_installed_binary(tmp_path):
    installed(tmp_path)
    unit = tmp_path / "lib/systemd/system/lockstep-replica@.service"
    text = unit.read_text()
    assert f"ExecStart={tmp_path}/bin/lockstep replica --config " in text, text
    assert "--id %i" in text and "--keep" not in text.split("ExecStart=")[1].split("\n")[0]
    for setting in ("Restart=on-abnormal", "RestartPreventExitStatus=SIGKILL", "StartLimitBurst=3"):
        assert f"\n{setting}\n" in text, setting
    verify = shutil.which("systemd-analyze")
    assert verify, "systemd-analyze not found: install Debian's systemd (scripts/setup lists it)"
    r = subprocess.run(
        [verify, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
