"""Wheel sources beyond PyPI and download.pytorch.org: NVIDIA's JetPack wheels and the Jetson AI Lab indexes,
named with --index or inferred where the version string or the platform makes it certain."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib

from torchrig.cli import main
from torchrig.compat import load_kb
from torchrig.compat.sources import load_sources

DATA = Path(__file__).resolve().parents[2] / "src" / "torchrig" / "data" / "wheel_sources.toml"


def test_every_source_row_is_sourced_and_names_known_jetson_gpus():
    doc = tomllib.loads(DATA.read_text())
    assert doc["schema_version"] == 1
    kb = load_kb()
    jetson_ccs = {g.compute_capability for g in kb.gpus if g.segment == "embedded"}
    for row in doc["source"]:
        assert row["source"].startswith("https://") and re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["verified"])
        assert set(row["compute_capabilities"]) <= jetson_ccs, row["id"]
        assert row["platform"] == "jetson" and row["jetpack"] in {"5", "6", "7"}
        assert all(u.startswith("https://") for u in row["index_urls"])
    assert len({s.id for s in load_sources()}) == len(doc["source"])


def _check(capsys, *argv):
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_an_nv_suffix_on_a_jetson_is_nvidias_jetpack_wheel(capsys):
    code, out = _check(
        capsys, "--gpu", "Jetson AGX Orin", "--torch", "2.0.0+nv23.05", "--platform", "jetson5"
    )
    assert code == 0 and out["verdict"] == "works"
    assert out["build"]["variant"] == "nvidia-jetpack5"
    assert any("inferred" in n for n in out["notes"])
    # the same wheel on JetPack 6 (its driver number says so): built for another JetPack
    code, out = _check(
        capsys, "--gpu", "Jetson AGX Orin", "--driver", "540.4.0", "--torch", "2.1.0a0+41361538.nv23.06"
    )
    assert code == 1 and "wheel_source_jetpack" in [r["code"] for r in out["reasons"]]


def test_a_bare_version_on_jetpack_6_is_the_jetson_ai_lab_index(capsys):
    code, out = _check(capsys, "--gpu", "Jetson Orin Nano", "--torch", "2.5.0", "--platform", "jetson6")
    assert code == 0, out
    assert out["build"]["index_url"] == "https://pypi.jetson-ai-lab.io/jp6/cu126"
    code, out = _check(capsys, "--gpu", "Jetson AGX Orin", "--torch", "2.7.0", "--platform", "jetson6")
    assert out["verdict"] == "works_with_caveats"  # a version the cited page does not list
    assert "source_version_not_confirmed" in [r["code"] for r in out["reasons"]]


def test_index_names_the_source_and_a_wrong_gpu_fails(capsys):
    code, out = _check(
        capsys,
        "--gpu",
        "NVIDIA Thor",
        "--torch",
        "2.9.1",
        "--index",
        "https://pypi.jetson-ai-lab.io/sbsa/cu130",
    )
    assert code == 0 and out["verdict"] == "works_with_caveats"  # NVPL/cuDSS must be installed beside it
    code, out = _check(
        capsys,
        "--gpu",
        "Jetson AGX Orin",
        "--torch",
        "2.9.1",
        "--index",
        "jetson-ai-lab-sbsa",
        "--platform",
        "jetson6",
    )
    assert code == 1 and "arch_not_in_source" in [r["code"] for r in out["reasons"]]


def test_a_standard_index_keeps_the_standard_answer_and_an_unknown_one_is_exit_2(capsys):
    code, out = _check(capsys, "--gpu", "RTX 4090", "--torch", "2.8.0", "--index", "pypi")
    assert code == 0 and out["build"]["label"] == "2.8.0+cu128"
    assert main(["check", "--gpu", "RTX 4090", "--torch", "2.8.0", "--index", "conda-whatever"]) == 2
    assert "unknown --index" in capsys.readouterr().err


@pytest.mark.parametrize("version", ["2.4.0", "2.6.0", "2.8.0"])
def test_the_lab_index_versions_are_known(capsys, version):
    code, out = _check(capsys, "--gpu", "Jetson AGX Orin", "--torch", version, "--platform", "jetson6")
    assert code == 0 and out["verdict"] == "works", out


@pytest.mark.parametrize("index", ["", "  ", "h", "https://", "https://pypi.jetson-ai-lab"])
def test_an_empty_or_too_short_index_names_nothing(capsys, index):
    argv = [
        "check",
        "--gpu",
        "Jetson AGX Orin",
        "--torch",
        "2.5.0",
        "--platform",
        "jetson6",
        "--index",
        index,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--index" in err


def test_a_shorter_path_of_an_index_url_names_its_source(capsys):
    code, out = _check(
        capsys,
        "--gpu",
        "Jetson AGX Orin",
        "--torch",
        "2.5.0",
        "--platform",
        "jetson6",
        "--index",
        "https://pypi.jetson-ai-lab.io/jp6",
    )
    assert code == 0 and out["build"]["variant"] == "jetson-ai-lab-jp6"
