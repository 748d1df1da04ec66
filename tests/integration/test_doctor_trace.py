"""A failed torch probe traced for real on the CPU build: a variable that breaks ``import torch`` (an invalid
TORCH_LOGS: torch raises while importing) and a library that aborts when it loads (LD_PRELOAD of a .so whose
constructor calls abort(): a real SIGABRT). Doctor names the variable, not "reinstall torch"."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from torchrig.doctor.facts import ProbeStatus
from torchrig.doctor.probes.pytorch import probe_torch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
        reason="needs torch",
    ),
]

ABORT_C = "#include <stdlib.h>\n__attribute__((constructor)) static void die(void) { abort(); }\n"


def small_env(monkeypatch, **extra: str) -> None:
    """This process's environment cut to what the probe needs plus a few decoys and ``extra``: the bisection
    stays a handful of runs."""
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH") if k in os.environ}
    for k in list(os.environ):
        monkeypatch.delenv(k)
    for k, v in {**keep, "EDITOR": "vi", "OMP_NUM_THREADS": "1", "PAGER": "less", **extra}.items():
        monkeypatch.setenv(k, v)


def test_an_invalid_torch_logs_is_named(monkeypatch):
    small_env(monkeypatch, TORCH_LOGS="no_such_log_name")
    facts = probe_torch(timeout_s=120)
    assert facts.status is ProbeStatus.FAILED and "ValueError" in (facts.error or "")
    tr = facts.trace
    assert tr is not None and tr.clean_ok is True
    assert tr.culprits == ("TORCH_LOGS=no_such_log_name",)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_preloaded_library_that_aborts_is_named(monkeypatch, tmp_path):
    (tmp_path / "abort.c").write_text(ABORT_C)
    lib = tmp_path / "libabort.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "abort.c")], check=True)
    small_env(monkeypatch, LD_PRELOAD=str(lib))  # this process is loaded already: only the probe child aborts
    facts = probe_torch(timeout_s=120)
    assert facts.status is ProbeStatus.FAILED and "SIGABRT" in (facts.error or "")
    tr = facts.trace
    assert tr is not None and tr.clean_ok is True and "was killed by SIGABRT" in tr.failure
    assert tr.culprits == (f"LD_PRELOAD={lib}",)


def test_the_cli_says_which_variable_not_reinstall(tmp_path):
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH") if k in os.environ}
    env["TORCH_LOGS"] = "no_such_log_name"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", "doctor", "--only", "torch,env", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-500:]
    report = json.loads(proc.stdout)
    first = next(f for f in report["findings"] if f["severity"] == "error")
    assert first["id"] == "env.breaks_torch" and "TORCH_LOGS" in first["summary"]
    assert not any("reinstall" in s for s in first["fix"])
