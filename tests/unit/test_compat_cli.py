"""check / resolve / matrix as a user runs them: verdicts and exit codes, JSON shape, one-line errors (exit 2),
and a light start-up (no torch, docker, pynvml or rich imported by a real `check`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = {"torch", "docker", "pynvml", "rich", "numpy", "matplotlib"}


def _one_line_error(r) -> None:
    assert r.code == 2, (r.code, r.out, r.err)
    assert r.err.startswith("torchrig: error: ")
    assert r.err.strip().count("\n") == 0, r.err
    assert "Traceback" not in r.err


def test_check_works_exit_0_and_json(cli):
    r = cli("check", "--gpu", "RTX 5090", "--driver", "570.86.10", "--torch", "2.7.0+cu128", "--json")
    assert r.code == 0, r.err
    data = r.json()
    assert data["verdict"] == "works" and data["command"] == "check" and data["schema_version"] == 1
    assert data["build"]["label"] == "2.7.0+cu128" and data["gpus"][0]["compute_capability"] == "12.0"
    assert data["fixes"] == [] and all({"code", "severity", "message"} <= set(x) for x in data["reasons"])


def test_check_fails_exit_1_with_fix(cli):
    r = cli("check", "--gpu", "RTX 5090", "--driver", "570.86.10", "--torch", "2.6.0+cu124")
    assert r.code == 1
    assert "FAILS" in r.out and "sm_120 is not compatible" in r.out and "pip install torch==" in r.out
    j = cli("check", "--gpu", "RTX 5090", "--driver", "570.86.10", "--torch", "2.6.0+cu124", "--json").json()
    assert j["verdict"] == "fails" and j["fixes"][0]["pip_command"].startswith("pip install torch==")


def test_check_caveats_exit_0(cli):
    r = cli("check", "--gpu", "A100-SXM4-80GB", "--driver", "535.104.05", "--torch", "2.8.0+cu128", "--json")
    assert r.code == 0 and r.json()["verdict"] == "works_with_caveats"


def test_check_without_driver_notes_it(cli):
    r = cli("check", "--gpu", "V100", "--torch", "2.8.0+cu126")
    assert r.code == 0 and "no --driver given" in r.out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["check", "--gpu", "RTX 5909", "--driver", "570.86", "--torch", "2.7.0"],
            "did you mean: NVIDIA GeForce RTX 5090",
        ),
        (["check", "--gpu", "RTX 5090", "--driver", "570.x", "--torch", "2.7.0"], "malformed driver version"),
        (
            ["check", "--gpu", "RTX 5090", "--driver", "570.86", "--torch", "2.7"],
            None,
        ),  # 2.7 means 2.7.0: fine
        (
            ["check", "--gpu", "RTX 5090", "--driver", "570.86", "--torch", "2.7.0+cuda128"],
            "malformed torch build",
        ),
        (["check", "--gpu", "RTX 5090", "--driver", "570.86", "--torch", "2.7.5"], "closest releases: 2.7."),
        (["check", "--gpu", "RTX 5090", "--driver", "570.86", "--torch", "2.7.0+cu121"], "known builds: cu1"),
        (["check", "--gpu", "RTX 5090", "--torch"], "expected one argument"),
        (
            ["resolve", "--gpu", "H100", "--driver", "550.54.14", "--torch", "=>2.6"],
            "malformed torch specifier",
        ),
        (["resolve", "--gpu", "H100", "--driver", "550.54.14", "--python", "3"], "malformed Python version"),
        (["resolve", "--gpu", "H100", "--driver", "550.54.14", "--python", "3.4"], "supports Python 3.4"),
        (
            ["resolve", "--gpu", "H100", "--driver", "550.54.14", "--torch", ">=9.0"],
            "no published PyTorch release",
        ),
        (["resolve", "--gpu", "Radeon 7900", "--driver", "550.54.14"], "unknown GPU"),
        (["matrix", "--torch", "2.7.9"], "closest releases"),
        (["matrix", "--torch", "2.7.0", "--format", "pdf"], "invalid choice"),
        (["matrix", "--driver", "five"], "malformed driver version"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, args, needle):
    r = cli(*args)
    if needle is None:
        assert r.code in (0, 1), r.err
        return
    _one_line_error(r)
    assert needle in r.err, r.err


def test_bad_input_json_error(cli):
    r = cli("check", "--gpu", "RTX 5909", "--torch", "2.7.0", "--json")
    assert r.code == 2 and r.json()["error"]["type"] == "InputError"


def test_resolve_found(cli):
    r = cli("resolve", "--gpu", "RTX 5090", "--driver", "570.86.10", "--torch", "<2.8", "--json")
    assert r.code == 0, r.err
    data = r.json()
    assert data["found"] is True and data["build"]["label"] == "2.7.1+cu128"
    assert (
        data["pip_command"] == "pip install torch==2.7.1 --index-url https://download.pytorch.org/whl/cu128"
    )
    assert data["torchvision"] and data["min_driver"]


def test_resolve_nothing_exit_1_with_reason_per_gpu(cli):
    # R590 dropped Pascal (https://github.com/NixOS/nixos-hardware/pull/1843): no torch helps, a driver does
    r = cli("resolve", "--gpu", "GTX 1080 Ti", "--driver", "590.48.01")
    assert r.code == 1, r.out
    assert "no build found" in r.out and "what would change it" in r.out and "R580" in r.out
    j = cli("resolve", "--gpu", "GTX 1080 Ti", "--driver", "590.48.01", "--json").json()
    assert j["found"] is False and j["blockers"][0]["code"] == "driver_branch_drops_arch"
    assert j["suggestions"] and "cu126" in j["suggestions"][0]["pip_command"]


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_matrix_formats(cli, fmt):
    r = cli("matrix", "--torch", "2.8.0", "--format", fmt)
    assert r.code == 0, r.err
    assert "2.8.0+cu126" in r.out and "2.8.0+cu128" in r.out
    if fmt == "html":
        assert r.out.startswith("<!DOCTYPE html>") and r.out.rstrip().endswith("</html>")
    else:
        assert "legend" in r.out.lower() or "- ✅" in r.out


def test_matrix_json_cells(cli):
    data = cli("matrix", "--json").json()
    assert data["rows"] and data["columns"]
    assert {c["verdict"] for row in data["rows"] for c in row["cells"]} <= {
        "works",
        "works_with_caveats",
        "fails",
    }


def _imports(args: list[str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torchrig", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--gpu", "RTX 5090", "--driver", "570.86.10", "--torch", "2.6.0+cu124"],
        ["resolve", "--gpu", "A100", "--driver", "535.104.05"],
        ["matrix", "--torch", "2.8.0"],
    ],
)
def test_real_invocations_import_nothing_heavy(args):
    mods = _imports(args)
    assert "torchrig" in mods
    assert not (mods & HEAVY), mods & HEAVY
