"""The checks that consult the compatibility knowledge base: which build to install instead, builds that run
only through PTX JIT or CUDA minor-version compatibility, and a newer build for a working machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from torchrig.doctor import diagnose
from torchrig.doctor.facts import Facts, load_facts

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"


def h200(**torch_changes) -> Facts:
    """The recorded H200 with another torch build; without nvcc, which would be judged against that build."""
    facts = load_facts(FIX / "h200x1-driver580-cu130.json")
    env = dataclasses.replace(facts.env, nvcc_path=None, nvcc_version=None, cuda_home=None)
    return dataclasses.replace(facts, torch=dataclasses.replace(facts.torch, **torch_changes), env=env)


def ids(facts: Facts, **kw) -> dict[str, str]:
    return {f.id: f.severity.value for f in diagnose(facts, **kw).findings}


@pytest.fixture(autouse=True)
def needs_kb():
    from torchrig.doctor import kb

    if kb.load() is None:
        pytest.skip("the compatibility knowledge base does not load")


def test_ptx_only_coverage_is_a_warning():
    facts = h200(arch_list=("sm_80", "compute_80"))
    assert ids(facts)["torch.arch_ptx_jit"] == "warning"


def test_minor_version_compatibility_is_a_note():
    facts = h200(version="2.15.0+cu132", cuda_version="13.2")
    found = ids(facts)
    assert found.get("torch.driver_minor_compat") == "info"
    assert "torch.driver_too_old" not in found


def test_driver_too_old_from_the_kb_alone():
    """No CUDA error text (e.g. the probe ran under CUDA_VISIBLE_DEVICES=''): the KB still knows the floor."""
    facts = load_facts(FIX / "driver-535-h200-cu130.json")
    facts = dataclasses.replace(facts, torch=dataclasses.replace(facts.torch, init_error=None, warnings=()))
    r = diagnose(facts)
    f = next(f for f in r.findings if f.id == "torch.driver_too_old")
    assert "needs ≥" in f.cause
    assert f.fix[0].startswith(f"{facts.torch.python_executable} -m pip install torch==")


def test_a_newer_build_is_only_a_note_and_only_when_it_runs_natively():
    older = h200(version="2.6.0+cu126", cuda_version="12.6")
    newer_driver = dataclasses.replace(
        older, nvml=dataclasses.replace(older.nvml, driver_version="595.45.04")
    )
    r = diagnose(newer_driver)
    f = next(f for f in r.findings if f.id == "torch.newer_build")
    assert f.severity.value == "info" and "(installed 2.6.0+cu126)" in f.summary
    assert r.exit_code == 0  # a suggestion is not a problem
    # On driver 580 resolve ranks the newest native build first (2.14.1+cu130, docs/knowledge-base.md), not
    # 2.15.0's CUDA 13.2 (minor-version compatibility only): the note names it.
    f = next(f for f in diagnose(older).findings if f.id == "torch.newer_build")
    assert "2.14.1+cu130 (installed 2.6.0+cu126)" in f.summary
    assert ids(h200(version="2.14.1+cu130"))["torch.ok"] == "ok"
    assert "torch.newer_build" not in ids(h200(version="2.14.1+cu130"))


def test_without_the_kb_the_fix_points_to_resolve():
    facts = load_facts(FIX / "torch-cpu-build-h200.json")
    f = next(f for f in diagnose(facts, use_kb=False).findings if f.id == "torch.cpu_build")
    assert facts.nvml.driver_version
    assert f.fix[1].startswith(f'torchrig resolve --gpu "NVIDIA H200" --driver {facts.nvml.driver_version}')


# ---- what the bridge to compat catches: the knowledge base's own errors, never a bug


def _doctor(capsys, facts: str) -> tuple[int, str, str]:
    from torchrig.cli import main

    code = main(["doctor", "--facts", str(FIX / facts)])
    out, err = capsys.readouterr()
    return code, out, err


def _bug(*args, **kwargs):
    return 1 / 0


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("torchrig.compat.rules", "driver_cuda_support"),  # the driver floor of the installed build
        ("torchrig.compat", "resolve"),  # the build to install instead
        ("torchrig.compat", "load_kb"),  # the knowledge base itself
    ],
)
def test_a_bug_in_compat_reaches_the_internal_error_handler(monkeypatch, capsys, module, name):
    """A ZeroDivisionError inside compat is no missing finding: exit 3, one line that says to report it."""
    import importlib

    monkeypatch.setattr(importlib.import_module(module), name, _bug)
    code, out, err = _doctor(capsys, "driver-535-h200-cu130.json")
    assert code == 3, (out, err)
    assert err.startswith("torchrig: internal error: ZeroDivisionError: division by zero")
    assert "report it" in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_knowledge_bases_own_errors_are_gaps_not_crashes(monkeypatch, capsys):
    """A damaged data file (InputError from compat) is the report's note; a CUDA the knowledge base does not
    list is no driver floor; a GPU name it does not know is no suggestion: the other findings stay."""
    from torchrig import compat
    from torchrig.doctor import kb
    from torchrig.errors import InputError

    facts = h200(version="2.8.0+cu999", cuda_version="99.9")
    assert kb.driver_support(kb.load(), facts.nvml.driver_version or "", "99.9") is None
    assert kb.find_gpus(kb.load(), ["NVIDIA Q9999 Imaginary"]) == []
    diagnose(facts)  # no exception: the unknown CUDA is a gap
    from torchrig.doctor.checks.pytorch import _newer

    assert _newer("2.9.0+cu128", "2.8.0") and not _newer("2.9.0+cu128", "2.1.0a0+git3f1a2b")  # no claim

    def damaged():
        raise InputError("knowledge base: cuda.toml has schema_version 9, expected 1")

    monkeypatch.setattr(compat, "load_kb", damaged)
    code, out, err = _doctor(capsys, "driver-535-h200-cu130.json")
    assert code == 1 and err == "", err  # the driver finding is still there
    assert "the compatibility knowledge base could not be loaded" in out
    assert kb.preload() is None  # the background load drops it; the main thread's load says it again
