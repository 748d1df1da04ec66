"""The knowledge-base data files load, follow docs/knowledge-base.md and agree with each other.

Hardware checks are named test_gpus_*, test_cuda_*, test_drivers_*, test_cross_*; PyTorch build checks
are named test_torch_*.
"""

from __future__ import annotations

import datetime
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from torchrig.data import load

VERIFIED_FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}$")
VERSION_FORMAT = re.compile(r"^\d+(\.\d+)*$")
CC_FORMAT = re.compile(r"^\d+\.\d+$")
SEGMENTS = {"datacenter", "consumer", "workstation", "embedded"}
PEAK_KEYS = {
    "fp32_tflops",
    "tf32_tflops",
    "bf16_tflops",
    "fp16_tflops",
    "fp8_tflops",
    "memory_bandwidth_gbps",
    "nvlink_bandwidth_gbps",
    "pcie_gen",
    "pcie_bandwidth_gbps",
}
# docs/knowledge-base.md names NVIDIA/GeForce/Tesla; torchrig.compat.kb also drops "Quadro", so spellings must
# stay unique with it dropped too.
NAME_PREFIXES = ("nvidia ", "geforce ", "tesla ", "quadro ")


def _version(text: str) -> tuple[int, ...]:
    assert VERSION_FORMAT.match(text), f"not a dotted version: {text!r}"
    return tuple(int(part) for part in text.split("."))


def _normalise(name: str) -> str:
    """docs/knowledge-base.md: case-insensitive, spaces, '-' and '_' folded away."""
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def _spellings(name: str) -> Iterator[str]:
    """The name and the name without its leading NVIDIA / GeForce / Tesla prefixes."""
    text = " ".join(name.replace("_", " ").replace("-", " ").split())
    yield text
    while text.lower().startswith(NAME_PREFIXES):
        text = text.split(" ", 1)[1]
        yield text


def _keys(name: str) -> set[str]:
    return {_normalise(spelling) for spelling in _spellings(name)}


def _gpu_index() -> dict[str, set[str]]:
    index: dict[str, set[str]] = defaultdict(set)
    for gpu in load("gpus")["gpu"]:
        for spelling in [gpu["id"], gpu["name"], *gpu["aliases"]]:
            for key in _keys(spelling):
                index[key].add(gpu["id"])
    return index


def _resolve(query: str) -> set[str]:
    index = _gpu_index()
    found: set[str] = set()
    for key in _keys(query):
        found |= index.get(key, set())
    return found


def _check_row(row: dict[str, Any], where: str) -> None:
    source = row.get("source")
    assert isinstance(source, str) and source.startswith(("https://", "http://")), (
        f"{where}: source {source!r}"
    )
    verified = row.get("verified")
    assert isinstance(verified, str) and VERIFIED_FORMAT.match(verified), f"{where}: verified {verified!r}"
    datetime.date.fromisoformat(verified)


def _gpus() -> list[dict[str, Any]]:
    return list(load("gpus")["gpu"])


def _archs() -> dict[str, dict[str, Any]]:
    return {arch["name"]: arch for arch in load("gpus")["arch"]}


def _toolkits() -> list[dict[str, Any]]:
    return list(load("cuda")["toolkit"])


def _branches() -> list[dict[str, Any]]:
    return list(load("drivers")["branch"])


# --------------------------------------------------------------------------------------------------
# gpus.toml
# --------------------------------------------------------------------------------------------------


def test_gpus_file_loads_with_schema_version_and_sourced_rows():
    data = load("gpus")
    assert data["schema_version"] == 1
    for arch in data["arch"]:
        _check_row(arch, f"arch {arch['name']}")
    for gpu in data["gpu"]:
        _check_row(gpu, f"gpu {gpu['id']}")
        if "peaks" in gpu:
            source = gpu["peaks"].get("source")
            assert isinstance(source, str) and source.startswith("http"), f"gpu {gpu['id']}: peaks.source"


def test_gpus_rows_have_the_schema_fields():
    for gpu in _gpus():
        where = f"gpu {gpu['id']}"
        assert re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", gpu["id"]), where
        for field in ("name", "arch", "family", "memory_type"):
            assert isinstance(gpu[field], str) and gpu[field], f"{where}: {field}"
        assert CC_FORMAT.match(gpu["compute_capability"]), where
        assert gpu["segment"] in SEGMENTS, where
        memory = gpu["memory_gb"]
        assert isinstance(memory, (int, float)) and not isinstance(memory, bool) and memory > 0, where
        assert isinstance(gpu["aliases"], list) and all(isinstance(a, str) and a for a in gpu["aliases"]), (
            where
        )


def test_gpus_ids_names_and_aliases_are_unique_after_normalisation():
    owners: dict[str, set[str]] = defaultdict(set)
    for gpu in _gpus():
        for spelling in [gpu["id"], gpu["name"], *gpu["aliases"]]:
            for key in _keys(spelling):
                owners[key].add(gpu["id"])
    clashes = {key: sorted(ids) for key, ids in owners.items() if len(ids) > 1}
    assert not clashes, f"spellings shared by several GPUs: {clashes}"
    ids = [gpu["id"] for gpu in _gpus()]
    assert len(ids) == len(set(ids))


def test_gpus_arch_exists_and_lists_the_compute_capability():
    archs = _archs()
    for gpu in _gpus():
        arch = archs.get(gpu["arch"])
        assert arch is not None, f"gpu {gpu['id']}: unknown arch {gpu['arch']!r}"
        assert gpu["compute_capability"] in arch["compute_capabilities"], f"gpu {gpu['id']}"


def test_gpus_arch_compute_capabilities_belong_to_one_arch():
    seen: dict[str, str] = {}
    for arch in load("gpus")["arch"]:
        for cc in arch["compute_capabilities"]:
            assert CC_FORMAT.match(cc), arch["name"]
            assert cc not in seen, f"{cc} in both {seen.get(cc)} and {arch['name']}"
            seen[cc] = arch["name"]


def test_gpus_peaks_are_positive_numbers_with_known_keys():
    for gpu in _gpus():
        peaks = gpu.get("peaks")
        if peaks is None:
            continue
        figures = {k: v for k, v in peaks.items() if k != "source"}
        assert figures, f"gpu {gpu['id']}: empty peaks"
        assert set(figures) <= PEAK_KEYS, f"gpu {gpu['id']}: {set(figures) - PEAK_KEYS}"
        for key, value in figures.items():
            assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{gpu['id']}.{key}"
            assert value > 0, f"{gpu['id']}.{key} must be positive (leave unknown figures out)"
        if "pcie_gen" in figures:
            assert isinstance(figures["pcie_gen"], int) and 1 <= figures["pcie_gen"] <= 6


def test_gpus_tensor_peaks_are_dense():
    # A dense tensor figure is never more than 64x the non-tensor FP32 rate; datasheet sparse figures
    # copied by mistake, or TFLOPS typed as GFLOPS, would break the ordering fp8 >= fp16 >= tf32.
    for gpu in _gpus():
        peaks = gpu.get("peaks", {})
        chain = [peaks.get(k) for k in ("tf32_tflops", "fp16_tflops", "fp8_tflops")]
        present = [v for v in chain if v is not None]
        assert present == sorted(present), f"gpu {gpu['id']}: tf32 <= fp16 <= fp8 expected"
        if "bf16_tflops" in peaks and "fp16_tflops" in peaks:
            assert peaks["bf16_tflops"] == peaks["fp16_tflops"], gpu["id"]


def test_gpus_at_least_80_with_every_required_family():
    gpus = _gpus()
    assert len(gpus) >= 80
    families = {gpu["family"] for gpu in gpus}
    for family in (
        "GeForce 900",
        "GeForce 10",
        "GeForce 16",
        "GeForce RTX 20",
        "GeForce RTX 30",
        "GeForce RTX 40",
        "GeForce RTX 50",
        "Quadro RTX",
        "RTX A-series",
        "RTX Ada",
        "RTX PRO Blackwell",
        "Jetson",
    ):
        assert family in families, family
    ids = {gpu["id"] for gpu in gpus}
    for required in (
        "tesla-k80",
        "tesla-v100-sxm2-32gb",
        "tesla-t4",
        "a10",
        "a10g",
        "a30",
        "a40",
        "a100-pcie-40gb",
        "a100-pcie-80gb",
        "a100-sxm4-40gb",
        "a100-sxm4-80gb",
        "l4",
        "l40",
        "l40s",
        "h100-pcie",
        "h100-sxm",
        "h100-nvl",
        "h200-sxm",
        "h20",
        "b200",
        "gb200",
    ):
        assert required in ids, required
    segments = {gpu["segment"] for gpu in gpus}
    assert segments == SEGMENTS


@pytest.mark.parametrize(
    ("spelling", "gpu_id"),
    [
        ("NVIDIA GeForce RTX 3090", "geforce-rtx-3090"),
        ("RTX 3090", "geforce-rtx-3090"),
        ("3090", "geforce-rtx-3090"),
        ("GeForce RTX 3090", "geforce-rtx-3090"),
        ("Tesla V100-SXM2-32GB", "tesla-v100-sxm2-32gb"),
        ("Tesla V100-SXM2-16GB", "tesla-v100-sxm2-16gb"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H20", "h20"),
        ("Tesla T4", "tesla-t4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA GeForce RTX 5090", "geforce-rtx-5090"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("Quadro RTX 8000", "quadro-rtx-8000"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-blackwell-workstation"),
        ("nvidia_geforce_rtx_4090", "geforce-rtx-4090"),
        ("GTX 1080 Ti", "geforce-gtx-1080-ti"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", "geforce-rtx-4070-ti-super"),
    ],
)
def test_gpus_user_and_nvml_spellings_resolve_to_exactly_one_gpu(spelling: str, gpu_id: str):
    assert _resolve(spelling) == {gpu_id}


@pytest.mark.parametrize("spelling", ["NVIDIA H100 80GB HBM3", "3090", "Tesla V100-SXM2-32GB", "NVIDIA H200"])
def test_gpus_spellings_resolve_through_the_compat_lookup(spelling: str):
    kb = pytest.importorskip("torchrig.compat.kb")
    hardware = kb.build_kb(load("gpus"), load("cuda"), load("drivers"), {"schema_version": 1})
    assert hardware.find_gpu(spelling).id in _resolve(spelling)


def test_gpus_ambiguous_short_names_resolve_to_nothing():
    for spelling in ("A100", "H100", "V100", "Orin"):
        assert _resolve(spelling) == set(), spelling


# --------------------------------------------------------------------------------------------------
# cuda.toml
# --------------------------------------------------------------------------------------------------


def test_cuda_file_loads_with_schema_version_and_sourced_rows():
    data = load("cuda")
    assert data["schema_version"] == 1
    for toolkit in data["toolkit"]:
        _check_row(toolkit, f"toolkit {toolkit['version']}")
        if "released" in toolkit:
            datetime.date.fromisoformat(toolkit["released"])
            assert toolkit.get("released_source", "").startswith("https://"), toolkit["version"]


def test_cuda_versions_are_unique_major_minor_in_order():
    versions = [toolkit["version"] for toolkit in _toolkits()]
    assert all(re.match(r"^\d+\.\d+$", v) for v in versions)
    assert len(versions) == len(set(versions))
    assert [_version(v) for v in versions] == sorted(_version(v) for v in versions)


def test_cuda_covers_9_2_through_13_3():
    versions = {toolkit["version"] for toolkit in _toolkits()}
    expected = (
        {"9.2", "10.0", "10.1", "10.2"}
        | {f"11.{m}" for m in range(9)}
        | {f"12.{m}" for m in range(10) if m != 7}
        | {"13.0", "13.1", "13.2", "13.3"}
    )
    assert expected <= versions
    assert "12.7" not in versions  # NVIDIA never released a CUDA 12.7 toolkit


def test_cuda_driver_floors_are_monotone_with_toolkit_version():
    toolkits = sorted(_toolkits(), key=lambda t: _version(t["version"]))
    for field in ("min_driver", "min_driver_minor_compat"):
        floors = [_version(t[field]) for t in toolkits if field in t]
        assert floors == sorted(floors), field


def test_cuda_minor_version_compatibility_floor_is_per_major():
    expected = {"11": "450.80.02", "12": "525.60.13", "13": "580"}
    for toolkit in _toolkits():
        major = toolkit["version"].split(".")[0]
        if int(major) < 11:  # no minor-version compatibility before CUDA 11: a 10.x build needs its own floor
            assert "min_driver_minor_compat" not in toolkit, toolkit["version"]
            continue
        assert toolkit["min_driver_minor_compat"] == expected[major], toolkit["version"]
        if toolkit["version"] != "11.0":  # 11.0 shipped with 450.51.05, before the 450.80.02 floor existed
            assert _version(toolkit["min_driver_minor_compat"]) <= _version(toolkit["min_driver"])


def test_cuda_compute_capabilities_follow_nvidia_support_changes():
    by_version = {t["version"]: set(t["compute_capabilities"]) for t in _toolkits()}
    for toolkit in _toolkits():
        ccs = toolkit["compute_capabilities"]
        assert ccs == sorted(ccs, key=_version), toolkit["version"]
        assert all(CC_FORMAT.match(cc) for cc in ccs)
    assert {"3.5", "3.7"} <= by_version["11.8"] and not {"3.5", "3.7"} & by_version["12.0"]
    assert {"3.0", "3.2"} <= by_version["10.2"] and not {"3.0", "3.2"} & by_version["11.0"]
    assert "7.5" not in by_version["9.2"] and "7.5" in by_version["10.0"]
    assert "8.6" not in by_version["11.0"] and "8.6" in by_version["11.1"]
    assert {"8.9", "9.0"} <= by_version["11.8"] and "9.0" not in by_version["11.7"]
    assert {"10.0", "12.0"} <= by_version["12.8"] and "10.0" not in by_version["12.6"]
    assert {"10.3", "12.1"} <= by_version["12.9"]
    pre_turing = {"5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2"}
    assert pre_turing <= by_version["12.9"] and not pre_turing & by_version["13.0"]
    assert "7.5" in by_version["13.0"] and "11.0" in by_version["13.0"] and "10.1" not in by_version["13.0"]


# --------------------------------------------------------------------------------------------------
# drivers.toml
# --------------------------------------------------------------------------------------------------


def test_drivers_file_loads_with_schema_version_and_sourced_rows():
    data = load("drivers")
    assert data["schema_version"] == 1
    for branch in data["branch"]:
        _check_row(branch, f"branch {branch['branch']}")
        if "released" in branch:
            datetime.date.fromisoformat(branch["released"])
        assert isinstance(branch.get("lts", False), bool)


def test_drivers_branches_are_unique_and_first_release_is_in_the_branch():
    branches = [b["branch"] for b in _branches()]
    assert len(branches) == len(set(branches))
    assert [int(b) for b in branches] == sorted(int(b) for b in branches)
    for branch in _branches():
        assert _version(branch["first_release"])[0] == int(branch["branch"]), branch["branch"]


def test_drivers_max_cuda_grows_with_the_branch():
    maxima = [_version(b["max_cuda"]) for b in _branches()]
    assert maxima == sorted(maxima)
    for branch in _branches():
        if "reports_cuda" in branch:
            assert _version(branch["reports_cuda"]) > _version(branch["max_cuda"]), branch["branch"]
        if "released" in branch:
            assert branch.get("released_source", "").startswith("https://"), branch["branch"]


def test_drivers_long_term_support_branches():
    lts = {b["branch"] for b in _branches() if b.get("lts")}
    assert {"470", "535", "580"} <= lts
    assert "570" not in lts and "595" not in lts


# --------------------------------------------------------------------------------------------------
# cross-references
# --------------------------------------------------------------------------------------------------


def test_cross_arch_last_driver_branch_exists_in_drivers():
    branches = {b["branch"] for b in _branches()}
    for arch in load("gpus")["arch"]:
        if "last_driver_branch" in arch:
            assert arch["last_driver_branch"] in branches, arch["name"]
        if "min_driver_branch" in arch:
            assert arch["min_driver_branch"] in branches, arch["name"]


def test_cross_last_driver_branches_match_nvidia_matrix():
    archs = _archs()
    assert archs["Kepler"]["last_driver_branch"] == "470"
    for name in ("Maxwell", "Pascal", "Volta"):
        assert archs[name]["last_driver_branch"] == "580", name
    for name in ("Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell"):
        assert "last_driver_branch" not in archs[name], name


def test_cross_branch_max_cuda_exists_in_cuda():
    versions = {t["version"] for t in _toolkits()}
    for branch in _branches():
        assert branch["max_cuda"] in versions, branch["branch"]


def test_cross_branch_first_release_meets_its_max_cuda_floor():
    floors = {t["version"]: _version(t["min_driver"]) for t in _toolkits()}
    for branch in _branches():
        assert _version(branch["first_release"]) >= floors[branch["max_cuda"]], branch["branch"]


def test_cross_every_toolkit_floor_is_a_known_branch():
    branches = {b["branch"] for b in _branches()}
    for toolkit in _toolkits():
        assert toolkit["min_driver"].split(".")[0] in branches, toolkit["version"]


def test_cross_toolkit_compute_capabilities_are_known_architectures():
    known = {cc for arch in load("gpus")["arch"] for cc in arch["compute_capabilities"]}
    for toolkit in _toolkits():
        unknown = set(toolkit["compute_capabilities"]) - known
        assert not unknown, f"CUDA {toolkit['version']}: {sorted(unknown)}"


def test_cross_every_gpu_can_be_built_for_by_some_toolkit():
    buildable = {cc for t in _toolkits() for cc in t["compute_capabilities"]}
    for gpu in _gpus():  # Kepler 3.0/3.2 too: CUDA 10.2 is the last to build for them
        assert gpu["compute_capability"] in buildable, gpu["id"]


# --------------------------------------------------------------------------------------------------
# torch.toml
# --------------------------------------------------------------------------------------------------

TORCH_VARIANT_NAME = re.compile(r"^(cpu|cu(\d{1,2})(\d))$")
# "reported": a build public reports name but that was not read from its wheel or index; such rows carry
# confirmed = false and torchrig says "not confirmed" wherever it uses them.
TORCH_EVIDENCE = {
    "wheel",
    "build-script",
    "release-matrix",
    "release-page",
    "torch-output",
    "index-pin",
    "reported",
}
TORCH_INDEX = "https://download.pytorch.org/whl/"


def _torch_releases() -> list[dict[str, Any]]:
    return list(load("torch")["release"])


def _torch_variants() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for release in _torch_releases():
        for variant in release["variant"]:
            yield release, variant


def _torch_release(version: str) -> dict[str, Any]:
    matches = [r for r in _torch_releases() if r["version"] == version]
    assert len(matches) == 1, version
    return matches[0]


def _torch_variant(version: str, name: str) -> dict[str, Any]:
    matches = [v for v in _torch_release(version)["variant"] if v["name"] == name]
    assert len(matches) == 1, f"{version}+{name}"
    return matches[0]


def test_torch_file_loads_with_schema_version_and_sourced_rows():
    data = load("torch")
    assert data["schema_version"] == 1
    for release in data["release"]:
        _check_row(release, f"torch {release['version']}")
        for variant in release["variant"]:
            where = f"torch {release['version']}+{variant['name']}"
            _check_row(variant, where)
            if "pins_source" in variant:
                assert variant["pins_source"].startswith("https://"), where


def test_torch_releases_have_the_schema_fields():
    versions = [r["version"] for r in _torch_releases()]
    assert len(versions) == len(set(versions)), "duplicate releases"
    for release in _torch_releases():
        where = f"torch {release['version']}"
        assert re.match(r"^[12]\.\d+\.\d+$", release["version"]), where
        datetime.date.fromisoformat(release["released"])
        python = release["python"]
        assert python and all(re.match(r"^3\.\d+$", p) for p in python), where
        assert python == sorted(python, key=_version), where
        for companion in ("torchvision", "torchaudio"):
            if companion in release:
                _version(release[companion])
        assert release["variant"], where


def test_torch_variants_have_the_schema_fields():
    for release, variant in _torch_variants():
        where = f"torch {release['version']}+{variant['name']}"
        match = TORCH_VARIANT_NAME.match(variant["name"])
        assert match, where
        assert variant["index_url"] == TORCH_INDEX + variant["name"], where
        assert variant.get("evidence") in TORCH_EVIDENCE, where
        assert (variant["evidence"] == "reported") == (variant.get("confirmed") is False), where
        if "find_links" in variant:  # the find-links era: pytorch.org's commands for 1.x before 1.11
            assert _version(release["version"]) < (1, 11), where
            assert re.match(
                r"^https://download\.pytorch\.org/whl/(\w+/)?torch_stable\.html$", variant["find_links"]
            )
        if variant["name"] == "cpu":
            assert not {"cuda", "arch_list", "ptx", "cudnn", "nccl"} & set(variant), where
            continue
        assert variant["cuda"] == f"{match.group(2)}.{match.group(3)}", where
        arch_list = variant["arch_list"]
        assert arch_list and all(re.match(r"^sm_\d{2,3}$", a) for a in arch_list), where
        assert arch_list == sorted(arch_list, key=lambda a: int(a[3:])), where
        assert all(re.match(r"^compute_\d{2,3}$", p) for p in variant.get("ptx", [])), where
        for pin in ("cudnn", "nccl"):
            if pin in variant:
                _version(variant[pin])
    for release in _torch_releases():
        names = [v["name"] for v in release["variant"]]
        assert len(names) == len(set(names)), f"torch {release['version']}: {names}"


def test_torch_pypi_variant_is_a_published_variant_read_from_the_wheel():
    for release in _torch_releases():
        version = _version(release["version"])
        pypi = _torch_variant(release["version"], release["pypi_variant"])
        if version < (1, 6):
            # 1.5's libtorch_python.so carries no arch-flags text: its CUDA was read from the wheel's
            # torch/version.py (notes name the wheel), its kernels from the build script
            assert pypi["evidence"] == "build-script" and ".whl" in pypi["notes"], release["version"]
            continue
        # The PyPI build is the one a plain `pip install torch==X` gets: its facts come from that wheel.
        assert pypi["evidence"] == "wheel", release["version"]
        assert pypi["source"].startswith("https://files.pythonhosted.org/"), release["version"]
        assert {"arch_list", "ptx"} <= set(pypi), release["version"]
        if version >= (2, 0):  # 1.x wheels bundle cuDNN and NCCL (1.13 pins cuDNN only): no pins to read
            assert {"cudnn", "nccl"} <= set(pypi), release["version"]


def test_torch_index_pin_rows_name_the_wheel_and_its_sha256():
    # "index-pin": the wheel on download.pytorch.org, known by its URL and sha256 as public lock files pin it.
    for release, variant in _torch_variants():
        if variant["evidence"] != "index-pin":
            continue
        where = f"torch {release['version']}+{variant['name']}"
        wheel = f"{TORCH_INDEX}{variant['name']}/torch-{release['version']}%2B{variant['name']}-cp3"
        assert variant["source"].startswith(wheel) and variant["source"].endswith(".whl"), where
        assert re.search(r"sha256 [0-9a-f]{64}\b", variant["notes"]), where


def test_torch_cpu_builds_of_the_2_14_releases_are_listed():
    # Both 2.14 releases have a CPU wheel on download.pytorch.org (pinned by sha256 in public lock files).
    for version in ("2.14.0", "2.14.1"):
        cpu = _torch_variant(version, "cpu")
        assert cpu["index_url"] == TORCH_INDEX + "cpu" and cpu["evidence"] == "index-pin", version


def test_torch_cross_variant_cuda_is_a_toolkit_that_builds_its_archs():
    toolkits = {t["version"]: set(t["compute_capabilities"]) for t in _toolkits()}
    for release, variant in _torch_variants():
        if variant["name"] == "cpu":
            continue
        where = f"torch {release['version']}+{variant['name']}"
        assert variant["cuda"] in toolkits, f"{where}: CUDA {variant['cuda']} not in cuda.toml"
        buildable = toolkits[variant["cuda"]]
        for entry in [*variant["arch_list"], *variant.get("ptx", [])]:
            digits = entry.split("_")[1]
            cc = f"{digits[:-1]}.{digits[-1]}"
            assert cc in buildable, f"{where}: {entry} is not a target of CUDA {variant['cuda']}"


def test_torch_covers_1_5_through_the_newest_with_patch_releases():
    versions = {r["version"] for r in _torch_releases()}
    for required in (
        "1.5.0", "1.6.0", "1.7.1", "1.8.0", "1.8.1", "1.9.1", "1.10.2", "1.11.0", "1.12.1", "1.13.0", "1.13.1",
        "2.0.0", "2.0.1", "2.1.0", "2.1.2", "2.2.2", "2.3.1", "2.4.1", "2.5.1", "2.6.0",
        "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1",
    ):  # fmt: skip
        assert required in versions, required
    assert _version(max(versions, key=_version)) >= (2, 14)
    # Release dates grow within a minor series, and from one minor's .0 to the next.
    ordered = sorted(_torch_releases(), key=lambda r: _version(r["version"]))
    series: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for release in ordered:
        series[_version(release["version"])[:2]].append(release["released"])
    for minor, dates in series.items():
        assert dates == sorted(dates), f"torch {minor}: release dates must grow with the patch version"
    firsts = [dates[0] for dates in series.values()]
    assert firsts == sorted(firsts), "each minor series starts after the previous one"


@pytest.mark.parametrize(
    ("series", "variant"),
    [
        ("2.0", "cu117"),
        ("2.1", "cu121"),
        ("2.2", "cu121"),
        ("2.3", "cu121"),
        ("2.4", "cu121"),
        ("2.5", "cu124"),
        ("2.6", "cu124"),
        ("2.7", "cu126"),
        ("2.8", "cu128"),
        ("2.9", "cu128"),
        ("2.10", "cu128"),
        ("2.11", "cu130"),
        ("2.12", "cu130"),
        ("2.13", "cu130"),
        ("2.14", "cu130"),
    ],
)
def test_torch_pypi_default_matches_the_wheels_cuda_runtime_pin(series: str, variant: str):
    # Read from each release's Requires-Dist on PyPI (nvidia-cuda-runtime-cuXX / cuda-toolkit pins).
    releases = [r for r in _torch_releases() if r["version"].startswith(series + ".")]
    assert releases, series
    for release in releases:
        assert release["pypi_variant"] == variant, release["version"]


def test_torch_arch_list_changes_read_from_the_wheels():
    # Pascal/Maxwell/Volta dropped from 2.7's cu128; Volta back in 2.8's cu128 (pytorch/pytorch#157517);
    # cu13x builds start at Turing; Kepler (sm_37) only in the CUDA 11 builds.
    cu128_27 = _torch_variant("2.7.0", "cu128")["arch_list"]
    assert "sm_120" in cu128_27 and not {"sm_50", "sm_60", "sm_70"} & set(cu128_27)
    cu128_28 = _torch_variant("2.8.0", "cu128")["arch_list"]
    assert {"sm_70", "sm_100", "sm_120"} <= set(cu128_28) and "sm_60" not in cu128_28
    assert _torch_variant("2.7.1", "cu126")["arch_list"][0] == "sm_50"
    assert _torch_variant("2.0.0", "cu117")["arch_list"][0] == "sm_37"
    for release, variant in _torch_variants():
        if variant.get("cuda", "").startswith("13."):
            assert variant["arch_list"][0] == "sm_75", f"{release['version']}+{variant['name']}"
        if variant.get("cuda", "").startswith("12."):
            assert "sm_37" not in variant["arch_list"], f"{release['version']}+{variant['name']}"


def test_torch_cudnn_and_nccl_pins_read_from_pypi():
    expected = {
        "2.0.1": ("8.5.0.96", "2.14.3"),
        "2.1.2": ("8.9.2.26", "2.18.1"),
        "2.3.1": ("8.9.2.26", "2.20.5"),
        "2.4.1": ("9.1.0.70", "2.20.5"),
        "2.5.1": ("9.1.0.70", "2.21.5"),
        "2.7.1": ("9.5.1.17", "2.26.2"),
        "2.8.0": ("9.10.2.21", "2.27.3"),
        "2.9.1": ("9.10.2.21", "2.27.5"),
        "2.11.0": ("9.19.0.56", "2.28.9"),
        "2.14.1": ("9.24.0.43", "2.30.7"),
    }
    for version, (cudnn, nccl) in expected.items():
        release = _torch_release(version)
        pypi = _torch_variant(version, release["pypi_variant"])
        assert (pypi["cudnn"], pypi["nccl"]) == (cudnn, nccl), version


def test_torch_1_x_builds_as_pytorch_org_lists_them():
    # pytorch.org's previous-versions page: each release's CUDA variants; PyPI's wheel: the default (cu102 up to
    # 1.12.1, cu117 for 1.13)
    expected = {
        "1.5.0": {"cu92", "cu101", "cu102", "cpu"},
        "1.7.1": {"cu92", "cu101", "cu102", "cu110", "cpu"},
        "1.8.1": {"cu101", "cu102", "cu111", "cpu"},
        "1.12.1": {"cu102", "cu113", "cu116", "cpu"},
        "1.13.1": {"cu116", "cu117", "cpu"},
    }
    for version, names in expected.items():
        assert {v["name"] for v in _torch_release(version)["variant"]} == names, version
    for release in _torch_releases():
        if _version(release["version"]) < (1, 13):
            assert release["pypi_variant"] == "cu102", release["version"]
    assert _torch_release("1.13.1")["pypi_variant"] == "cu117"
    # the builds' kernels: 10.2 lost sm_75 in 1.8 (builder "Drop 7.5 for CUDA 10.2"), as the PyPI wheels show
    assert "sm_75" in _torch_variant("1.7.1", "cu102")["arch_list"]
    assert _torch_variant("1.8.0", "cu102")["arch_list"] == ["sm_37", "sm_50", "sm_60", "sm_70"]
