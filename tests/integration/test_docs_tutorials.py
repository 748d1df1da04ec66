"""The tutorials' CPU-path commands run exactly as written, so the docs cannot drift from the tool.

A fenced ``console`` block right after a ``<!-- doctest -->`` line is run: each ``$ `` line through bash, in
one scratch folder per tutorial (``tests`` there links to this checkout's tests, for recorded fixtures), in
order. A trailing ``# exit N`` says the exit status the tutorial promises; otherwise it is 0. No command may
print a traceback or torchrig's "internal error".
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
BLOCK = re.compile(r"<!-- doctest -->\s*\n```console\n(.*?)```", re.S)


def commands(doc: Path) -> list[tuple[str, int]]:
    out = []
    for block in BLOCK.findall(doc.read_text()):
        for line in block.splitlines():
            if not line.startswith("$ "):
                continue
            cmd, _, note = line[2:].partition("  # exit ")
            out.append((cmd.strip(), int(note) if note.strip().isdigit() else 0))
    return out


def test_every_tutorial_has_commands_that_run_here():
    assert TUTORIALS and all(commands(t) for t in TUTORIALS)


@pytest.mark.integration
@pytest.mark.parametrize("doc", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_commands_run_as_written(doc, tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    bindir = Path(sys.executable).parent
    torchrig = shutil.which("torchrig", path=str(bindir)) or shutil.which("torchrig")
    assert torchrig, "torchrig is not installed on PATH"
    env = dict(os.environ, PATH=f"{Path(torchrig).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("TORCHRIG_GPU_INVENTORY", None)
    for cmd, want in commands(doc):
        r = subprocess.run(
            ["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        said = r.stdout + r.stderr
        assert r.returncode == want, (
            f"{doc.name}: `{cmd}` exited {r.returncode}, want {want}:\n{said[-2000:]}"
        )
        assert "Traceback" not in said and "internal error" not in said, (
            f"{doc.name}: `{cmd}`:\n{said[-2000:]}"
        )
