"""The docs' ``<!-- doctest -->`` blocks run exactly as written, so the docs cannot drift from the tool.

A fenced ``console`` block right after a ``<!-- doctest -->`` line (in README.md or any page under docs/) is
run: each ``$ `` line through bash, in one scratch folder per document (``tests`` there links to this
checkout's tests, for recorded fixtures), in order. A trailing ``# exit N`` says the exit status the page
promises; otherwise it is 0. The lines the page shows after a command are its key lines: each must be in
what the command printed (whitespace folded; a line cut with ``…`` promises its start; ``...`` skips). A
``$ echo $?`` line shows the previous command's exit status. No command may print a traceback or
torchrig's "internal error". (tests/docblocks.py parses the blocks; tests/unit/test_docs_blocks_covered.py
holds every other shell block to a named test or a reason.)

A block after ``<!-- doctest: slurm-login -->`` runs on the login node of the real Slurm cluster that
``tools/ci/slurm-cluster.sh up`` starts (CI does, in ``.ci/run``): each line through ``ip netns exec LOGIN_NS``,
as a user types it on a cluster's login node. Without that cluster those lines are not run and the test is
reported as skipped after the others have passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
PLACES = ("", "slurm-login")  # here, or the CI Slurm cluster's login node
CLUSTER_ENV = Path("/run/torchrig-slurm/cluster.env")  # written by tools/ci/slurm-cluster.sh up


@dataclass(frozen=True)
class Step:
    command: str
    exit_status: int  # the one the page promises
    where: str
    shown: tuple[str, ...]  # key lines the page shows after it


def steps(doc: Path) -> list[Step]:
    """Every doctest block's commands of ``doc``, in order."""
    out = []
    for block in docblocks.shell_blocks(doc):
        if block.kind != "doctest" or block.detail == "gpu":  # tests/gpu/test_docs_gpu.py runs those
            continue
        assert block.detail in PLACES, f"{doc.name}: unknown doctest place {block.detail!r}"
        for line, shown in block.steps():
            cmd, _, note = line.partition("  # exit ")
            want = int(note) if note.strip().isdigit() else 0
            out.append(Step(cmd.strip(), want, block.detail, tuple(docblocks.shown_lines(shown))))
    return out


def commands(doc: Path) -> list[tuple[str, int, str]]:
    """``(command, exit status it promises, where it runs)`` of every doctest block, in order."""
    return [(s.command, s.exit_status, s.where) for s in steps(doc)]


DOCTESTED = [d for d in docblocks.documents() if steps(d)]


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
    assert ROOT / "README.md" in DOCTESTED


def _on_the_cluster(doc: Path):
    """A document with commands on the Slurm login node shares the one cluster with test_cluster_slurm."""
    uses = any(s.where == "slurm-login" for s in steps(doc))
    marks = [pytest.mark.xdist_group("slurm-cluster")] if uses else []
    return pytest.param(doc, marks=marks, id=str(doc.relative_to(ROOT)).removesuffix(".md"))


@pytest.mark.integration
@pytest.mark.parametrize("doc", [_on_the_cluster(d) for d in DOCTESTED])
def test_tutorial_commands_run_as_written(doc, tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    bindir = Path(sys.executable).parent
    torchrig = shutil.which("torchrig", path=str(bindir)) or shutil.which("torchrig")
    assert torchrig, "torchrig is not installed on PATH"
    env = dict(os.environ, PATH=f"{Path(torchrig).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("TORCHRIG_GPU_INVENTORY", None)
    login_ns, not_run, last_status = None, [], 0
    if any(s.where == "slurm-login" for s in steps(doc)):
        login_ns = slurm_login_ns()
    for step in steps(doc):
        cmd = step.command
        if cmd == "echo $?":  # the status of the page's previous command (each line runs in its own bash)
            said = f"{last_status}\n"
        else:
            argv = ["bash", "-c", cmd]
            if step.where == "slurm-login":
                if login_ns is None:
                    not_run.append(cmd)
                    continue
                argv = ["ip", "netns", "exec", login_ns, *argv]
            r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
            said, last_status = r.stdout + r.stderr, r.returncode
            assert r.returncode == step.exit_status, (
                f"{doc.name}: `{cmd}` exited {r.returncode}, want {step.exit_status}:\n{said[-2000:]}"
            )
            assert "Traceback" not in said and "internal error" not in said, (
                f"{doc.name}: `{cmd}`:\n{said[-2000:]}"
            )
        missing = [line for line in step.shown if not docblocks.output_has(said, line)]
        assert not missing, (
            f"{doc.name}: `{cmd}` did not print the lines the page shows: {missing}\n{said[-3000:]}"
        )
    if not_run:
        pytest.skip(
            f"{len(not_run)} command(s) need the CI Slurm cluster (tools/ci/slurm-cluster.sh up, as root); "
            "the others passed"
        )
