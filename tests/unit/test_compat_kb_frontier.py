"""The newest facts in the real knowledge base, as check / resolve / matrix use them.

- torch 2.14.0 and 2.14.1 have CPU builds on download.pytorch.org (torch.toml, evidence "index-pin").
- A driver of a branch newer than any in drivers.toml (R620: 620.70.06, NVIDIA's redistrib_620.70.06.json,
  released 2026-11-04) still runs every listed CUDA 13.x build natively and still drops Pascal after R580.
- CUDA 13.3's floor (610.43.02, Table 3 of its release notes) is the newest floor torchrig knows: a driver just
  below it is not native for 13.3.
"""

from __future__ import annotations

import pytest

from torchrig.compat import Verdict, check, load_kb, resolve
from torchrig.compat.rules import DriverSupportKind, driver_cuda_support


@pytest.fixture(scope="module")
def kb():
    return load_kb()


@pytest.mark.parametrize("version", ["2.14.0", "2.14.1"])
def test_cpu_build_of_2_14_fails_on_a_gpu_and_names_the_pypi_cuda_build(kb, version):
    build = kb.find_build(f"{version}+cpu")
    assert build.variant.name == "cpu" and build.cuda is None
    r = check(kb, [kb.find_gpu("RTX 4090")], "580.65.06", build)
    assert r.verdict is Verdict.FAILS and "cpu_only_build" in r.codes
    assert r.fixes and r.fixes[0].summary.startswith(f"torch {version}+cu130 works")


def test_check_cli_accepts_2_14_1_cpu(cli):
    r = cli("check", "--gpu", "RTX 4090", "--driver", "580.65.06", "--torch", "2.14.1+cpu", "--json")
    assert r.code == 1, r.err
    data = r.json()
    assert data["build"]["label"] == "2.14.1+cpu"
    assert data["build"]["pip_command"].endswith("--index-url https://download.pytorch.org/whl/cpu")
    assert [x["code"] for x in data["reasons"]] == ["cpu_only_build"]


def test_matrix_of_2_14_0_has_a_cpu_column(cli):
    data = cli("matrix", "--torch", "2.14.0", "--json").json()
    labels = [c["label"] for c in data["columns"]]
    assert labels[-1] == "2.14.0+cpu", labels
    cpu = labels.index("2.14.0+cpu")
    assert {row["cells"][cpu]["verdict"] for row in data["rows"]} == {"fails"}


def test_a_branch_newer_than_the_file_runs_cuda_13_natively_and_drops_pascal(kb):
    build = kb.find_build("2.15.0")  # the PyPI build, cu132
    r = check(kb, [kb.find_gpu("H100")], "620.70.06", build)
    assert r.verdict is Verdict.WORKS and "driver_native" in r.codes
    old = check(kb, [kb.find_gpu("GTX 1080 Ti")], "620.70.06", kb.find_build("2.14.1+cu126"))
    assert old.verdict is Verdict.FAILS and "driver_branch_drops_arch" in old.codes
    assert "R580" in " ".join(x.message for x in old.reasons)


def test_resolve_with_a_newer_branch_picks_the_newest_release(kb):
    res = resolve(kb, [kb.find_gpu("H100")], "620.70.06")
    assert res.build.label == "2.15.0+cu132"


@pytest.mark.parametrize(
    ("driver", "kind"),
    [("610.43.02", DriverSupportKind.NATIVE), ("610.43.01", DriverSupportKind.MINOR_COMPAT)],
)
def test_cuda_13_3_floor_is_the_newest_known(kb, driver, kind):
    assert max(kb.toolkits, key=lambda t: tuple(int(p) for p in t.version.split("."))).version == "13.3"
    assert driver_cuda_support(kb, driver, "13.3").kind is kind
