"""Two real Unix users (made with useradd, removed after) on one recorded 2x H200 server (NVML's answers
replayed at the pynvml boundary in every torchrig process they run): alice leases GPU 0 with ``up``; bob's
``launch`` and ``train`` refuse that GPU before any rank starts, naming alice and since when, and take the
free one; alice's own ``launch`` may use the GPU leased to her."""

from __future__ import annotations

import json
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
CASE = "h200x2-driver580-cu130"  # tests/fixtures/doctor: GPU 0 and GPU 1, one NVLink domain


def _run_as(
    user: str, argv: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _python_for(user: str, scratch: Path) -> tuple[str, str]:
    """(python, PYTHONPATH) ``user`` can run torchrig, the Docker SDK and nvidia-ml-py with: this interpreter
    when they may, else the system python3 with copies of the pure-Python packages (tests/userpython.py)."""
    path, probe = f"{ROOT / 'src'}:{ROOT / 'tests'}", userpython.probe_code(("docker", "pynvml"))
    if (
        _run_as(user, [sys.executable, "-c", probe], {"PYTHONPATH": path, "HOME": str(scratch)}).returncode
        == 0
    ):
        return sys.executable, path
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no python the test users can run")
    deps = scratch / "deps"
    userpython.copy_packages([*userpython.DOCKER_SDK, "pynvml", *userpython.runtime_modules()], deps)
    subprocess.run(["chmod", "a+rX", str(scratch)], check=True)
    path = f"{path}:{deps}"
    if _run_as(user, [system, "-c", probe], {"PYTHONPATH": path}).returncode != 0:
        pytest.skip("the system python cannot import the copied packages")
    return system, path


@pytest.fixture(scope="module")
def pair(engine):
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser")
    pytest.importorskip("pynvml")
    tag = secrets.token_hex(3)
    names = {"alice": f"trg-a-{tag}", "bob": f"trg-b-{tag}"}
    scratch = Path(tempfile.mkdtemp(prefix="trg-users-"))
    os.chmod(scratch, 0o755)
    made = []
    try:
        for who, name in names.items():
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", "-G", "docker", name], check=True)
            made.append(name)
            (scratch / who).mkdir()
            shutil.chown(scratch / who, name)
        from torchrig.runtime.ledger import Ledger

        Ledger.open(scratch / "state").close()  # as root: the shared ledger directory, as on a server
        (scratch / "job.py").write_text("print('never started')\n")
        (scratch / "tr.py").write_text(  # torchrig, with this process's NVML answering as the recorded H200s
            f"import sys, nvmlreplay\nnvmlreplay.install({CASE!r})\n"
            "from torchrig.cli import main\nsys.exit(main(sys.argv[1:]))\n"
        )
        python, pypath = _python_for(names["alice"], scratch)
        subprocess.run(["chmod", "-R", "a+rX", str(scratch / "job.py"), str(scratch / "tr.py")], check=True)
        yield {"names": names, "scratch": scratch, "python": python, "pythonpath": pypath, "tag": tag}
    finally:
        for c in engine.containers.list(all=True, filters={"name": f"trg-{tag}"}, ignore_removed=True):
            c.remove(force=True)
        for v in engine.volumes.list(filters={"name": f"trg-{tag}"}):  # each environment's /workspace
            v.remove(force=True)
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def torchrig_as(pair, who: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    s = pair["scratch"]
    env = {
        "HOME": str(s / who),
        "PATH": "/usr/bin:/bin",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": pair["pythonpath"],
        "TORCHRIG_STATE_DIR": str(s / "state"),
        "TORCHRIG_CACHE_DIR": str(s / who / "cache"),
        "TORCHRIG_LABELS": os.environ.get("TORCHRIG_LABELS", ""),
    }
    return _run_as(pair["names"][who], [pair["python"], str(s / "tr.py"), *args], env, timeout)


def test_launch_and_train_refuse_the_gpu_another_user_leased_and_take_free_ones(pair, engine):
    alice, s = pair["names"]["alice"], pair["scratch"]
    env_a = f"trg-{pair['tag']}-a"
    up = torchrig_as(
        pair, "alice", "--json", "up", "--image", BASE, "--no-jupyter", "--no-ssh", "--create-only",
        "--gpus", "device=0", "--name", env_a,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert [g["gpu_index"] for g in json.loads(up.stdout)["plan"]["gpus"]] == [0]

    job = str(s / "job.py")
    for argv in (
        ["launch", "--dry-run", "--gpus", "device=0", job],
        ["launch", "--dry-run", "--gpus", "0,1", job],
        ["train", "--gpus", "device=0", "--out", str(s / "bob" / "run0")],
        ["train", "--gpus", "2", "--out", str(s / "bob" / "run2")],
    ):
        r = torchrig_as(pair, "bob", *argv)
        if argv[2] == "2":  # a count: valid, but only one of the two is bob's to take (exit 1)
            assert r.returncode == 1 and "1 of 2 yours to take" in r.stderr, r.stderr
        else:
            assert r.returncode == 2, (argv, r.stderr)
        assert r.stderr.count("\n") == 1 and f"GPU 0 held by {alice}/{env_a} since " in r.stderr, r.stderr
        assert not (s / "bob" / "run0" / "logs").exists()  # no rank started

    # the free one is bob's to take: 'all' means every GPU that is his
    for gpus in ("all", "1", "device=1"):
        r = torchrig_as(pair, "bob", "--json", "launch", "--dry-run", "--gpus", gpus, job)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    # train takes it too: its ranks start on GPU 1 (and then find this host's torch cannot use it)
    r = torchrig_as(
        pair, "bob", "--json", "train", "--gpus", "1", "--model", "gpt", "--size", "tiny", "--steps", "1",
        "--out", str(s / "bob" / "run1"), timeout=300,
    )  # fmt: skip
    assert "held by" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["launch"]["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "1", r.stderr[-2000:]

    # the GPU leased to alice is hers to take; bob takes it only with --force, out loud
    r = torchrig_as(pair, "alice", "--json", "launch", "--dry-run", "--gpus", "device=0", job)
    assert r.returncode == 0 and json.loads(r.stdout)["plan"]["forced_gpus"] == [], r.stderr
    r = torchrig_as(pair, "bob", "--json", "launch", "--dry-run", "--force", "--gpus", "device=0", job)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan"]["forced_gpus"][0].startswith(f"GPU 0 held by {alice}/{env_a}")
    assert f"warning: --force: taking GPU 0 held by {alice}" in r.stderr

    assert torchrig_as(pair, "alice", "down", "--volumes", env_a).returncode == 0
    r = torchrig_as(pair, "bob", "--json", "launch", "--dry-run", "--gpus", "all", job)
    assert json.loads(r.stdout)["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1", r.stderr
