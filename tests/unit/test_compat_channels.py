"""NGC containers and conda-forge as sources of torch (wheel_sources.toml's [[container]] and [[conda_forge]]
rows): named with --index or, for an NGC build's nvYY.MM tag off a Jetson, inferred; judged by their CUDA."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import tomllib

from torchrig.cli import main
from torchrig.compat import load_kb
from torchrig.compat.channels import by_name, load_conda_forge, load_containers

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "src" / "torchrig" / "data" / "wheel_sources.toml"


def test_every_container_and_conda_forge_row_is_sourced_and_names_known_cuda():
    doc = tomllib.loads(DATA.read_text())
    kb = load_kb()
    toolkits = {t.version for t in kb.toolkits}
    for row in [*doc["container"], *doc["conda_forge"]]:
        assert row["source"].startswith("https://") and re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["verified"])
    for c in load_containers():
        assert re.fullmatch(r"\d{2}\.\d{2}", c.release) and re.fullmatch(
            r"2\.\d+\.0a0\+[0-9a-f]{7,10}", c.torch
        )
        assert c.cuda is None or c.cuda in toolkits, c
        assert c.cuda_source is None or (c.cuda and c.cuda_source.startswith("https://")), c
    assert len({c.release for c in load_containers()}) == len(doc["container"])
    for r in load_conda_forge():
        for plat, cudas in r.cuda_by_platform.items():
            assert set(cudas) <= toolkits, r
            assert set(r.arch_by_platform.get(plat, {})) <= set(cudas), r  # kernels only of builds listed
        if any(r.arch_by_platform.values()):
            assert r.arch_source and r.arch_source.startswith("https://github.com/conda-forge/"), r


def _check(capsys, *argv):
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _codes(out):
    return [r["code"] for r in out["reasons"]]


def test_an_nv_tag_off_a_jetson_is_the_ngc_container_judged_by_its_cuda(capsys):
    # NGC 25.12: torch 2.10.0a0+b4e4ee81d3, CUDA 13.1 (its release notes); driver R535 is an LTS branch
    code, out = _check(
        capsys, "--gpu", "H100", "--driver", "535.104.05", "--torch", "2.10.0a0+b4e4ee81d3.nv25.12"
    )
    assert code == 0 and out["verdict"] == "works_with_caveats", out
    assert out["build"]["variant"] == "ngc25.12" and out["build"]["cuda"] == "13.1"
    assert "driver_forward_compat" in _codes(out)  # data center GPU: the cuda-compat package
    assert any("nv25.12" in n and "inferred" in n for n in out["notes"])
    # a GeForce on the same driver: no forward compatibility, CUDA 13.1's floor stands
    code, out = _check(
        capsys, "--gpu", "RTX 4090", "--driver", "535.104.05", "--torch", "2.10.0a0+b4e4ee81d3.nv25.12"
    )
    assert code == 1 and "driver_too_old" in _codes(out)


def test_a_container_whose_cuda_the_data_lacks_is_a_caveat_not_a_guess(capsys):
    # 24.12: no page found that gives its CUDA
    code, out = _check(
        capsys, "--gpu", "A100", "--driver", "550.54.15", "--torch", "2.6.0a0+df5bbc09d1.nv24.12"
    )
    assert code == 0 and out["verdict"] == "works_with_caveats"
    assert "channel_cuda_unknown" in _codes(out) and out["build"]["cuda"] is None
    # a tag torchrig has no row for: named, not refused
    code, out = _check(capsys, "--gpu", "A100", "--torch", "2.99.0a0+abcdef1.nv29.01")
    assert code == 0 and "channel_cuda_unknown" in _codes(out)


@pytest.mark.parametrize(
    ("release", "torch", "cuda"),
    [
        # PaddlePaddle's 23.11 notes, tied to PyTorch's 23.11 container by a second source
        ("23.11", "2.2.0a0+6a974bec", "12.3"),
        # the container-versions table of the PyTorch 24.10 notes
        ("24.02", "2.3.0a0+ebedce2", "12.3"),
        ("24.05", "2.4.0a0+07cecf4168", "12.4"),
        ("24.06", "2.4.0a0+f70bd71a48", "12.5"),  # MXNet's 24.06 was 12.4.1: not PyTorch's
        ("24.09", "2.5.0a0+b465a5843b", "12.6"),
        # Triton's matrix: the nvYY.MM build each TRT-LLM container carries, and its CUDA
        ("24.11", "2.6.0a0+df5bbc0", "12.6"),
        ("25.01", "2.6.0a0+ecf3bae40a", "12.8"),
        ("25.06", "2.8.0a0+5228986c39", "12.9"),
        ("25.10", "2.9.0a0+145a3a7bda", "13.0"),
    ],
)
def test_each_container_with_a_sourced_cuda_is_judged_by_it(capsys, release, torch, cuda):
    row = next(c for c in load_containers() if c.release == release)
    assert row.torch == torch and row.cuda == cuda and (row.cuda_source or row.source).startswith("https://")
    tag = f"{torch}.nv{release}"
    # a data center GPU on R535 (an LTS branch): minor-version compatibility for CUDA 12.x, the cuda-compat
    # package for 13.x; either way it works with caveats, never "unknown CUDA"
    code, out = _check(capsys, "--gpu", "NVIDIA A100-SXM4-80GB", "--driver", "535.104.05", "--torch", tag)
    assert code == 0 and out["verdict"] == "works_with_caveats", out
    assert out["build"]["cuda"] == cuda and "channel_cuda_unknown" not in _codes(out)
    assert {"driver_minor_compat", "driver_forward_compat"} & set(_codes(out))
    assert f"CUDA {cuda} per {row.cuda_source}" in out["reasons"][0]["message"] or row.cuda_source is None
    # a GeForce on R470, below every CUDA 12 floor: no forward compatibility off data center GPUs
    code, out = _check(capsys, "--gpu", "RTX 3090", "--driver", "470.57.02", "--torch", tag)
    assert code == 1 and "driver_too_old" in _codes(out), out


@pytest.mark.parametrize(
    ("release", "torch"),
    [("25.08", "2.8.0a0+34c6371d24"), ("25.09", "2.9.0a0+50eac811a6"), ("25.11", "2.10.0a0+b558c986e8")],
)
def test_releases_whose_torch_is_known_but_not_their_cuda_are_named_with_a_caveat(capsys, release, torch):
    # NVIDIA's Jetson table gives their torch strings; no page found gives their CUDA
    code, out = _check(capsys, "--gpu", "H100", "--driver", "580.65.06", "--torch", f"{torch}.nv{release}")
    assert code == 0 and out["build"]["variant"] == f"ngc{release}" and out["build"]["cuda"] is None
    assert "channel_cuda_unknown" in _codes(out)
    assert f"pytorch:{release}-py3 (torch {torch};" in out["reasons"][0]["message"]
    # --index ngc finds the release from the torch string alone
    code, out = _check(capsys, "--gpu", "H100", "--torch", torch, "--index", "ngc")
    assert out["build"]["variant"] == f"ngc{release}"


def test_the_container_cuda_agrees_with_a_public_collect_env_of_its_torch():
    # vllm-project/vllm#6776: torch 2.3.0a0+ebedce2 (24.02's) reports the CUDA it was built with
    text = (
        DATA.parents[3] / "tests" / "fixtures" / "collect_env" / "ngc-24.02-4xa100-2.3.0a0-ebedce2.txt"
    ).read_text()
    built = re.search(r"^CUDA used to build PyTorch: (\d+\.\d+)", text, re.M)
    row = next(c for c in load_containers() if c.torch == "2.3.0a0+ebedce2")
    assert built and row.release == "24.02" and row.cuda == built.group(1)


def test_ngc_24_05_on_an_a100_with_r535_works_and_a_geforce_on_r470_fails(capsys):
    argv = ["--torch", "2.4.0a0+07cecf4168.nv24.05"]
    code, out = _check(capsys, "--gpu", "NVIDIA A100-SXM4-80GB", "--driver", "535.104.05", *argv)
    assert code == 0 and "driver_minor_compat" in _codes(out)  # R535 >= CUDA 12's 525.60.13
    code, out = _check(capsys, "--gpu", "NVIDIA A100-SXM4-80GB", "--driver", "470.57.02", *argv)
    assert code == 0 and "driver_forward_compat" in _codes(out)  # R470 LTS + cuda-compat-12-4
    assert any("cuda-compat-12-4" in r["message"] for r in out["reasons"])
    code, out = _check(capsys, "--gpu", "RTX 4090", "--driver", "470.57.02", *argv)
    assert code == 1 and "driver_too_old" in _codes(out)


def test_index_ngc_matches_the_version_string_and_says_when_it_differs(capsys):
    code, out = _check(capsys, "--gpu", "H100", "--torch", "2.10.0a0+b4e4ee81d3", "--index", "ngc")
    assert code == 0 and out["build"]["cuda"] == "13.1"
    code, out = _check(
        capsys,
        "--gpu",
        "H100",
        "--torch",
        "2.10.0a0+0000000.nv25.12",
        "--index",
        "nvcr.io/nvidia/pytorch:25.12-py3",
    )
    assert "source_version_not_confirmed" in _codes(out)


def test_the_same_tag_on_a_jetson_is_the_jetpack_wheel_of_its_jetpack(capsys):
    # the Jetson release notes: nv24.03 wheels are JetPack 6.0 DP's (with a build number after the tag)
    code, out = _check(
        capsys,
        "--gpu",
        "Jetson AGX Orin",
        "--torch",
        "2.3.0a0+40ec155e58.nv24.03.13384722",
        "--platform",
        "jetson6",
    )
    assert code == 0 and out["build"]["variant"] == "nvidia-jetpack6", out
    code, out = _check(
        capsys, "--gpu", "Jetson AGX Orin", "--torch", "2.0.0+nv23.05", "--platform", "jetson5"
    )
    assert code == 0 and out["build"]["variant"] == "nvidia-jetpack5"


def test_conda_forge_picks_the_newest_variant_the_driver_runs_natively(capsys):
    # the feedstock built 2.4.1 with CUDA 11.8 and 12.0 on linux-64: driver R535 runs 12.0 natively
    code, out = _check(
        capsys, "--gpu", "RTX 4090", "--driver", "535.104.05", "--torch", "2.4.1", "--index", "conda-forge"
    )
    assert code == 0 and out["build"]["cuda"] == "12.0", out
    assert "driver_native" in _codes(out)
    # R470 runs neither natively: the oldest, 11.8, under minor-version compatibility
    code, out = _check(
        capsys, "--gpu", "A100", "--driver", "470.82.01", "--torch", "2.4.1", "--index", "conda-forge"
    )
    assert out["build"]["cuda"] == "11.8"


def test_conda_forge_variants_named_and_unlisted(capsys):
    code, out = _check(capsys, "--gpu", "RTX 4090", "--torch", "2.5.1+cu118", "--index", "conda-forge")
    assert code == 0 and "source_version_not_confirmed" in _codes(out)  # 2.5.1 was built with CUDA 12.6
    code, out = _check(capsys, "--gpu", "GTX 780", "--torch", "2.5.1", "--index", "conda-forge")
    assert code == 1 and "arch_not_covered" in _codes(out)  # CUDA 12.6 cannot build for 3.5


def test_conda_forge_version_without_data_and_bad_variant_are_one_line_exit_2(capsys):
    assert main(["check", "--gpu", "RTX 4090", "--torch", "1.7.0", "--index", "conda-forge"]) == 2
    err = capsys.readouterr().err
    assert "not in torchrig's data" in err and err.strip().count("\n") == 0
    assert main(["check", "--gpu", "RTX 4090", "--torch", "2.5.1+rocm6.2", "--index", "conda-forge"]) == 2
    assert "not a CUDA variant" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        ("ngc", "ngc"),
        ("NGC", "ngc"),
        ("nvcr.io/nvidia/pytorch:24.10-py3", "ngc"),
        ("conda-forge", "conda-forge"),
        ("https://conda.anaconda.org/conda-forge/", "conda-forge"),
        ("pypi", None),
        ("jetson-ai-lab-jp6", None),
    ],
)
def test_by_name(index, expected):
    assert by_name(index) == expected


_INDEX = st.one_of(
    st.sampled_from(["ngc", "conda-forge", "pypi", "pytorch", "nvidia-jetpack6", "nvcr.io/x", ""]),
    st.text(max_size=40),
)
_TORCH = st.one_of(
    st.sampled_from(
        ["2.5.1", "2.5.1+cu126", "2.10.0a0+b4e4ee81d3.nv25.12", "2.5.0a0+e000cf0ad9.nv24.10", "2.8.0"]
    ),
    st.from_regex(r"2\.\d{1,2}\.\d(a0)?(\+[0-9a-z.]{0,20})?", fullmatch=True),
    st.text(max_size=30),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(index=_INDEX, torch=_TORCH, gpu=st.sampled_from(["H100", "RTX 4090", "Jetson AGX Orin", "GTX 780"]))
def test_index_and_torch_fuzz_exit_0_1_or_2_with_one_line_errors(index, torch, gpu):
    outcome = fuzzkit.call(["check", "--gpu", gpu, "--torch", torch, "--index", index])
    fuzzkit.check(outcome)
    if outcome.code == 2:
        assert outcome.err.strip() and outcome.err.strip().count("\n") == 0, outcome.err


def test_conda_forge_kernels_come_from_the_feedstocks_arch_list(capsys):
    # 2.5.1's CUDA 12.6 build: TORCH_CUDA_ARCH_LIST 5.0;6.0;6.1;7.0;7.5;8.0;8.6;8.9;9.0+PTX (recipe/build.sh)
    code, out = _check(
        capsys, "--gpu", "RTX 4090", "--driver", "560.35.03", "--torch", "2.5.1", "--index", "conda-forge"
    )
    assert code == 0 and out["verdict"] == "works", out
    assert out["build"]["arch_confirmed"] and "compute_90" in out["build"]["ptx"]
    # 2.6.0 was built with CUDA 12.6 only: no kernels for a Blackwell GeForce
    code, out = _check(
        capsys, "--gpu", "RTX 5090", "--driver", "570.86.10", "--torch", "2.6.0", "--index", "conda-forge"
    )
    assert code == 1 and "toolkit_predates_gpu" in _codes(out)  # PTX 9.0 JIT, but CUDA 12.6 predates 12.0


@pytest.mark.parametrize(("index", "torch"), [("ngc", "2.10.0a0+b4e4ee81d3"), ("conda-forge", "2.5.1")])
def test_on_a_jetson_the_data_has_neither_and_says_so(capsys, index, torch):
    code, out = _check(
        capsys, "--gpu", "Jetson AGX Orin", "--torch", torch, "--index", index, "--platform", "jetson6"
    )
    assert code == 0 and "channel_platform_unknown" in _codes(out), out


def test_a_torch_string_two_containers_share_names_neither(capsys):
    # 25.05 and 25.06 both give 2.8.0a0+5228986c39 (NVIDIA's table)
    code, out = _check(capsys, "--gpu", "H100", "--torch", "2.8.0a0+5228986c39", "--index", "ngc")
    assert code == 0 and "channel_cuda_unknown" in _codes(out)
    assert "25.05" not in json.dumps(out["reasons"]) and "25.06" not in json.dumps(out["reasons"])
