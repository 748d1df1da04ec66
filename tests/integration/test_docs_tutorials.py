"""The tutorials' CPU-path commands run exactly as written, so the docs cannot drift from the tool.

A fenced ``console`` block right after a ``<!-- doctest -->`` line is run: each ``$ `` line through bash, in
one scratch folder per tutorial (``tests`` there links to this checkout's tests, for recorded fixtures), in
order. A trailing ``# exit N`` says the exit status the tutorial promises; otherwise it is 0. No command may
print a traceback or torchrig's "internal error".

A block after ``<!-- doctest: slurm-login -->`` runs on the login node of the real Slurm cluster that
``tools/ci/slurm-cluster.sh up`` starts (CI does, in ``.ci/run``): each line through ``ip netns exec LOGIN_NS``,
as a user types it on a cluster's login node. Without that cluster those lines are not run and the test is
reported as skipped after the others have passed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
BLOCK = re.compile(r"<!-- doctest(?:: ([a-z-]+))? -->\s*\n```console\n(.*?)```", re.S)
PLACES = ("", "slurm-login")  # here, or the CI Slurm cluster's login node
CLUSTER_ENV = Path("/run/torchrig-slurm/cluster.env")  # written by tools/ci/slurm-cluster.sh up


def commands(doc: Path) -> list[tuple[str, int, str]]:
    """``(command, exit status it promises, where it runs)`` of every doctest block, in order."""
    out = []
    for where, block in BLOCK.findall(doc.read_text()):
        assert where in PLACES, f"{doc.name}: unknown doctest place {where!r}"
        for line in block.splitlines():
            if not line.startswith("$ "):
                continue
            cmd, _, note = line[2:].partition("  # exit ")
            out.append((cmd.strip(), int(note) if note.strip().isdigit() else 0, where))
    return out


def slurm_login_ns() -> str | None:
    """The CI Slurm cluster's login namespace, or None when it is not running here."""
    if os.geteuid() != 0 or not CLUSTER_ENV.is_file():
        return None
    info = dict(line.split("=", 1) for line in CLUSTER_ENV.read_text().split())
    ns = info.get("LOGIN_NS")
    if not ns:
        return None
    probe = subprocess.run(["ip", "netns", "exec", ns, "sinfo", "-h"], capture_output=True, timeout=30)
    return ns if probe.returncode == 0 else None


def test_every_tutorial_has_commands_that_run_here():
    assert TUTORIALS and all(commands(t) for t in TUTORIALS)


def _on_the_cluster(doc: Path):
    """A tutorial with commands on the Slurm login node shares the one cluster with test_cluster_slurm."""
    uses = any(where == "slurm-login" for _, _, where in commands(doc))
    return pytest.param(doc, marks=[pytest.mark.xdist_group("slurm-cluster")] if uses else [], id=doc.stem)


@pytest.mark.integration
@pytest.mark.parametrize("doc", [_on_the_cluster(t) for t in TUTORIALS])
def test_tutorial_commands_run_as_written(doc, tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    bindir = Path(sys.executable).parent
    torchrig = shutil.which("torchrig", path=str(bindir)) or shutil.which("torchrig")
    assert torchrig, "torchrig is not installed on PATH"
    env = dict(os.environ, PATH=f"{Path(torchrig).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("TORCHRIG_GPU_INVENTORY", None)
    login_ns, not_run = None, []
    if any(where == "slurm-login" for _, _, where in commands(doc)):
        login_ns = slurm_login_ns()
    for cmd, want, where in commands(doc):
        argv = ["bash", "-c", cmd]
        if where == "slurm-login":
            if login_ns is None:
                not_run.append(cmd)
                continue
            argv = ["ip", "netns", "exec", login_ns, *argv]
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        said = r.stdout + r.stderr
        assert r.returncode == want, (
            f"{doc.name}: `{cmd}` exited {r.returncode}, want {want}:\n{said[-2000:]}"
        )
        assert "Traceback" not in said and "internal error" not in said, (
            f"{doc.name}: `{cmd}`:\n{said[-2000:]}"
        )
    if not_run:
        pytest.skip(
            f"{len(not_run)} command(s) need the CI Slurm cluster (tools/ci/slurm-cluster.sh up, as root); "
            "the others passed"
        )
