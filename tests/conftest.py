"""Shared test helpers: run the real CLI in a subprocess, and skip GPU tests without CUDA."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A runner that starts pytest with SIGINT ignored (a background job of a non-interactive shell, some CI
# agents) passes the ignored disposition on through exec to every child, so a Ctrl-C a test sends would do
# nothing. A handler is reset to the default on exec: installing Python's own makes children start with
# SIGINT at its default again, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def run_cli(*args: str, env: dict | None = None, timeout: float = 120, cwd: str | None = None) -> Run:
    """Run ``python -m torchrig ARGS`` as a user would, returning exit code, stdout and stderr."""
    full_env = dict(os.environ)
    full_env.pop("TORCHRIG_DEBUG", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli


def pytest_collection_modifyitems(config, items):
    has_cuda = False
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "tests/gpu" in str(item.fspath) or item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.gpu)
            if not has_cuda:
                item.add_marker(skip_gpu)
        elif "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
