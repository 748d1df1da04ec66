"""The docs' ``<!-- doctest: gpu -->`` blocks, as the pages write them, on the GPU machine (skipped without
CUDA): each ``$ `` line through bash, in one scratch folder per page, in order, with the exit status the page
promises (``# exit N``, else 0) and no traceback. ``torchrig`` on PATH is this checkout's (a shim runs
``python -m torchrig`` with this interpreter). tests/docblocks.py parses the blocks.

    python3 -m pytest -n 0 -p no:randomly tests/gpu/test_docs_gpu.py     # from the repository root
"""

from __future__ import annotations

import os
import sys

import pytest

import docblocks  # tests/docblocks.py

ROOT = docblocks.ROOT
PAGES = [d for d in docblocks.documents() if any(b.mark == "doctest: gpu" for b in docblocks.shell_blocks(d))]


def test_some_page_has_gpu_doctests():
    assert PAGES


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: str(p.relative_to(ROOT)).removesuffix(".md"))
def test_gpu_doctests_run_as_written(doc, tmp_path):
    shim = tmp_path / "bin" / "torchrig"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m torchrig "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env["PATH"] = f"{shim.parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    work = tmp_path / "work"
    work.mkdir()
    (work / "tests").symlink_to(ROOT / "tests")
    for block in docblocks.shell_blocks(doc):
        if block.mark != "doctest: gpu":
            continue
        for line, shown in block.steps():
            cmd, _, note = line.partition("  # exit ")
            want = int(note) if note.strip().isdigit() else 0
            r = docblocks.run(cmd.strip(), work, env=env, timeout=900)
            said = r.stdout + r.stderr
            assert r.returncode == want, f"{block.where}: `{cmd}` exited {r.returncode}:\n{said[-3000:]}"
            assert "Traceback" not in said and "internal error" not in said, f"{block.where}:\n{said[-3000:]}"
            missing = docblocks.missing(said, shown)
            assert not missing, f"{block.where}: `{cmd}` did not print {missing}:\n{said[-3000:]}"
