"""Two real Unix users of one server (made with useradd, removed after): one shared ledger, concurrent
``up``s without double booking, ownership by the real UID whatever USER says, and a clear refusal for a
user who may not write the ledger."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import userpython  # tests/userpython.py

ROOT = Path(__file__).resolve().parents[2]
BASE = "torchrig-test/debian:bookworm"
INVENTORY = ROOT / "tests/fixtures/runtime/driver-535-2xa100-pcie.json"


def _run_as(user: str, argv: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True,
        text=True,
        timeout=kw.pop("timeout", 180),
        **kw,
    )


def _python_for(user: str, scratch: Path) -> tuple[str, str]:
    """(python, PYTHONPATH) that ``user`` can run with torchrig and the Docker SDK: this interpreter when
    they may (CI), else the system python3 with copies of the pure-Python packages (tests/userpython.py)."""
    path, probe = str(ROOT / "src"), userpython.probe_code()
    if (
        _run_as(user, [sys.executable, "-c", probe], {"PYTHONPATH": path, "HOME": str(scratch)}).returncode
        == 0
    ):
        return sys.executable, path
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no python the test users can run")
    deps = scratch / "deps"
    userpython.copy_packages([*userpython.DOCKER_SDK, *userpython.runtime_modules()], deps)
    subprocess.run(["chmod", "a+rX", str(scratch)], check=True)
    path = f"{path}:{deps}"
    r = _run_as(user, [system, "-c", probe], {"PYTHONPATH": path})
    if r.returncode != 0:
        pytest.skip(f"the system python cannot import the copied packages: {r.stderr.strip()[-200:]}")
    return system, path


@pytest.fixture(scope="module")
def team(engine):
    """Users alice and bob (group docker) and carol (no group), a shared ledger root made, and a python."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser")
    tag = secrets.token_hex(2)
    names = {"alice": f"trt-alice-{tag}", "bob": f"trt-bob-{tag}", "carol": f"trt-carol-{tag}"}
    scratch = Path(tempfile.mkdtemp(prefix="trt-users-"))
    os.chmod(scratch, 0o755)
    made = []
    try:
        for who, name in names.items():
            groups = ["-G", "docker"] if who != "carol" else []
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", *groups, name], check=True)
            made.append(name)
            home = scratch / who
            home.mkdir()
            shutil.chown(home, name)
        from torchrig.runtime.ledger import Ledger

        state = scratch / "state"
        Ledger.open(state).close()  # as root: the shared directory, as on a real server
        python, pypath = _python_for(names["alice"], scratch)
        yield {"names": names, "scratch": scratch, "state": state, "python": python, "pythonpath": pypath}
    finally:
        for c in engine.containers.list(all=True, filters={"name": f"trt-u{tag}"}, ignore_removed=True):
            c.remove(force=True)
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def torchrig_as(team, who: str, *args: str, extra_env: dict[str, str] | None = None, popen: bool = False):
    env = {
        "HOME": str(team["scratch"] / who),
        "PATH": "/usr/bin:/bin",
        "PYTHONWARNINGS": "ignore",  # the copied SDK may warn about its optional charset detector
        "PYTHONPATH": team["pythonpath"],
        "TORCHRIG_STATE_DIR": str(team["state"]),
        "TORCHRIG_LABELS": os.environ.get("TORCHRIG_LABELS", ""),
        **(extra_env or {}),
    }
    argv = ["runuser", "-u", team["names"][who], "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    argv += [team["python"], "-m", "torchrig", *args]
    if popen:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def test_two_users_share_one_ledger_and_own_their_environments(team, engine):
    tag = team["names"]["alice"].rsplit("-", 1)[1]
    env_a, env_b, env_a2 = f"trt-u{tag}-a", f"trt-u{tag}-b", f"trt-u{tag}-a2"
    common = ["--image", BASE, "--no-jupyter", "--no-ssh", "--create-only", "--inventory", str(INVENTORY)]
    procs = {
        who: torchrig_as(team, who, "up", *common, "--name", name, "--gpus", "1", "--json", popen=True)
        for who, name in (("alice", env_a), ("bob", env_b))
    }
    results = {who: (p.wait(timeout=300), *p.communicate()) for who, p in procs.items()}
    for who, (code, _out, err) in results.items():
        assert code == 0, (who, err)
    import json

    gpus = {
        who: [g["uuid"] for g in json.loads(out)["plan"]["gpus"]] for who, (_c, out, _e) in results.items()
    }
    assert len({*gpus["alice"], *gpus["bob"]}) == 2  # no double booking

    # one ledger, in the shared directory, holding both users' leases
    assert sorted(p.name for p in team["state"].iterdir() if p.suffix == ".sqlite3") == ["leases.sqlite3"]
    from torchrig.runtime.ledger import Ledger

    held = {(x.user, x.container) for x in Ledger.open(team["state"]).leases()}
    assert held == {(team["names"]["alice"], env_a), (team["names"]["bob"], env_b)}
    busy = torchrig_as(team, "alice", "up", *common, "--name", env_a2, "--gpus", "1")
    assert busy.returncode == 1 and "no free GPU" in busy.stderr and team["names"]["bob"] in busy.stderr

    # ownership is the UID: bob may not take alice's down, whatever USER/LOGNAME/SUDO_USER say
    lie = {k: team["names"]["alice"] for k in ("USER", "LOGNAME", "SUDO_USER")}
    for extra in ([], ["--force"]):
        r = torchrig_as(team, "bob", "down", "--volumes", env_a, *extra, extra_env=lie)
        assert r.returncode == 2 and "belongs to" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert engine.containers.get(env_a).status == "created"
    labels = engine.api.inspect_container(env_a)["Config"]["Labels"]
    import pwd

    assert labels["torchrig.uid"] == str(pwd.getpwnam(team["names"]["alice"]).pw_uid)
    for who, name in (("alice", env_a), ("bob", env_b)):
        r = torchrig_as(team, who, "down", "--volumes", name)
        assert r.returncode == 0, r.stderr
    assert Ledger.open(team["state"]).leases() == []


def test_a_user_who_may_not_write_the_ledger_is_told_so(team):
    r = torchrig_as(team, "carol", "gpus", "--inventory", str(INVENTORY))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "may not write the GPU lease ledger" in r.stderr and "usermod -aG" in r.stderr
    with contextlib.suppress(FileNotFoundError):
        assert not (team["scratch"] / "carol" / ".local" / "state" / "torchrig").exists()
