"""Every cause doctor knows, reproduced from a fixture named after the case: the root cause comes first, with
its severity and a fix. Fixtures are recorded snapshots (``no-driver-debian12-cpu-torch``: this machine;
``h200x*``: the GPU machines) and faults planted into them by ``tests/fixtures/doctor/derive.py``."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from torchrig.doctor import diagnose
from torchrig.doctor.facts import ProbeStatus, facts_from_json, load_facts
from torchrig.doctor.findings import Severity

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"

# fixture -> (the first finding's id, its severity)
ROOT_CAUSES = {
    "no-driver-debian12-cpu-torch": ("driver.no_gpu", "info"),
    "driver-not-installed-debian12-h200": ("driver.missing", "error"),
    "libcuda-570-on-ld-library-path-h200": ("driver.library_mismatch", "error"),
    "cuda-compat-on-newer-driver-h200": ("driver.cuda_compat_mismatch", "error"),
    "libcuda-stub-on-ld-library-path-h200": ("driver.stub_library", "error"),
    "gpu-memory-hog-h200": ("gpu.busy", "warning"),
    "torch-folder-in-working-directory-h200": ("torch.import_failed", "error"),
    "pcie-x8-of-x16-h200": ("gpu.pcie_link_degraded", "warning"),
    "xid-79-in-kernel-log-h200": ("gpu.xid", "warning"),
    "driver-module-not-loaded-h200": ("driver.module_not_loaded", "error"),
    "driver-module-not-built-for-kernel-h200": ("driver.module_not_loaded", "error"),
    "driver-nouveau-loaded-h200": ("driver.module_not_loaded", "error"),
    "driver-device-nodes-missing-h200": ("driver.device_nodes_missing", "error"),
    "driver-uvm-not-loaded-h200": ("driver.uvm", "error"),
    "driver-uvm-wedged-after-suspend-h200": ("driver.uvm", "error"),
    "driver-uvm-node-missing-h200": ("driver.uvm_node_missing", "error"),
    "container-uvm-node-missing-h200": ("driver.uvm_node_missing", "error"),
    "container-uvm-node-refused-h200": ("driver.uvm_node_missing", "error"),
    "driver-nvml-mismatch-570-580-h200": ("driver.version_mismatch", "error"),
    "driver-535-h200-cu130": ("torch.driver_too_old", "error"),
    "torch-cpu-build-h200": ("torch.cpu_build", "error"),
    "torch-cu126-rtx5090-sm120": ("torch.arch_not_covered", "error"),
    "cuda-visible-devices-7-h200x2": ("env.cuda_visible_devices", "error"),
    "cuda-visible-devices-empty-h200x2": ("env.cuda_visible_devices", "error"),
    "cuda-visible-devices-minus1-h200x2": ("env.cuda_visible_devices", "error"),
    "container-without-gpus-h200": ("container.no_gpu_access", "error"),
    "container-nvidia-runtime-not-used-h200": ("container.no_gpu_access", "error"),
    "mig-enabled-no-instances-h200": ("gpu.mig_no_instances", "error"),
    "fabric-manager-stopped-h200x2": ("driver.fabric_manager", "error"),
    "ld-library-path-shadows-cudnn-h200": ("env.shadowed_libraries", "error"),
    "torch-hangs-h200": ("torch.hangs", "error"),
    "torch-unexplained-cuda-error-h200": ("torch.cuda_unavailable", "error"),
    "wsl-no-windows-driver": ("driver.missing", "error"),
    "shm-64m-container-h200": ("limits.shm", "warning"),
    "p2p-blocked-by-acs-h200x2": ("gpu.p2p_unavailable", "warning"),
    "mixed-architectures-h200-a100": ("gpu.mixed_architectures", "warning"),
    "persistence-off-h200": ("gpu.persistence_off", "info"),
    "ecc-pending-remap-h200": ("gpu.ecc", "warning"),
    "throttled-at-idle-h200": ("gpu.throttling", "warning"),
    "memlock-limited-rdma-h200": ("limits.memlock", "warning"),
    "docker-without-nvidia-toolkit-h200": ("docker.no_nvidia_toolkit", "warning"),
}
# Snapshots recorded on healthy GPU machines by tools/gpu/doctor.sh (h200x<N>-driver<branch>-cu<cuda>.json),
# and its planted faults recorded there (<same>-cuda-visible-devices-7.json; <same>-shm-64m.json, run with
# --only container,gpu, so without the torch probe).
HEALTHY_RE = re.compile(r"h200x\d-driver\d+-cu\d+|h200x\d-recorded-healthy")
# Faults made for real on the 1x H200 by tools/gpu/doctor_faults.py (2026-12-01), their facts recorded there
# (docs/results/doctor-faults.md): each named by its cause, first.
RECORDED = {
    "libcuda-stub": ("driver.stub_library", "error"),
    "libnvidia-ml-stub": (
        "driver.stub_library",
        "error",
    ),  # missed in the first run (stdout), named in the second
    "libcuda-other-version": ("driver.library_mismatch", "error"),
    "cuda-compat": ("driver.cuda_compat_mismatch", "error"),
    "libnccl-shadow": ("env.shadowed_libraries", "warning"),  # torch preloaded the wheel's copy itself
    "device-nodes-denied": ("driver.device_nodes_denied", "error"),
    "uvm-node-missing": ("driver.uvm_node_missing", "warning"),  # CUDA recreated it (nvidia-modprobe), ran
    "cuda-visible-devices-minus1": ("env.cuda_visible_devices", "error"),
    "cuda-visible-devices-7": ("env.cuda_visible_devices", "error"),
    "cuda-visible-devices-empty": ("env.cuda_visible_devices", "error"),
    "cuda-visible-devices-bad-uuid": ("env.cuda_visible_devices", "error"),
    "cuda-visible-devices-0-7": ("env.cuda_visible_devices", "warning"),
    "shm-64m": ("limits.shm", "warning"),
    "gpu-memory-hog": ("gpu.busy", "warning"),
    "torch-folder-in-cwd": ("torch.import_failed", "error"),
    "python-without-torch": ("torch.not_installed", "warning"),
}
ROOT_CAUSES |= {f"h200x1-recorded-{name}": want for name, want in RECORDED.items()}
PLANTED = {
    "-cuda-visible-devices-7": ("env.cuda_visible_devices", "error"),
    "-shm-64m": ("limits.shm", "warning"),
}
NAMES = sorted(p.stem for p in FIX.glob("*.json"))
HEALTHY = [n for n in NAMES if HEALTHY_RE.fullmatch(n)]
for _name in NAMES:
    for _suffix, _want in PLANTED.items():
        if _name.endswith(_suffix) and HEALTHY_RE.fullmatch(_name.removesuffix(_suffix)):
            ROOT_CAUSES[_name] = _want


def report(name: str):
    return diagnose(load_facts(FIX / f"{name}.json"))


def test_every_fixture_is_covered():
    assert set(NAMES) == set(ROOT_CAUSES) | set(HEALTHY), set(NAMES) ^ (set(ROOT_CAUSES) | set(HEALTHY))
    assert {"h200x1-driver580-cu130", "h200x2-driver580-cu130"} <= set(HEALTHY)


@pytest.mark.parametrize("name", sorted(ROOT_CAUSES))
def test_root_cause_comes_first(name):
    r = report(name)
    want_id, want_sev = ROOT_CAUSES[name]
    if want_sev == "info":  # a note: named, and nothing worse claimed (notes keep the checks' order)
        named = [f for f in r.findings if f.id == want_id and f.severity.value == "info"]
        assert named and named[0].fix and named[0].cause and named[0].evidence
        assert r.exit_code == 0, [(f.id, f.severity.value) for f in r.findings]
        return
    first = r.findings[0]
    assert (first.id, first.severity.value) == (want_id, want_sev), [
        (f.id, f.severity.value) for f in r.findings
    ]
    assert first.fix, "every problem carries a fix"
    assert first.cause and first.evidence
    assert r.exit_code == 1


@pytest.mark.parametrize("name", sorted(n for n, (_i, s) in ROOT_CAUSES.items() if s == "error"))
def test_one_root_cause_per_broken_machine(name):
    """Derived faults plant one cause: doctor names it once, not a cascade of symptoms."""
    errors = [f.id for f in report(name).findings if f.severity is Severity.ERROR]
    assert errors == [ROOT_CAUSES[name][0]], errors


def _load_derive():
    spec = importlib.util.spec_from_file_location("doctor_fixture_derive", FIX / "derive.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DERIVE = _load_derive()


def _as_container(base: dict) -> None:
    base["container"].update(in_container=True, runtime="docker", evidence=[DERIVE.DOCKERENV_OVERLAY])
    base["env"].update(nvidia_visible_devices="all", nvcc_path=None, nvcc_version=None, cuda_home=None)


def _as_vm_with_toolkit(base: dict) -> None:
    base["container"].update(
        in_container=False,
        runtime=None,
        evidence=["/.dockerenv exists but / is ext4 (a host or VM made from an image)"],
    )
    base["env"].update(
        nvidia_visible_devices="0",
        nvcc_path="/usr/local/cuda/bin/nvcc",
        nvcc_version="13.0",
        cuda_home="/usr/local/cuda",
    )


@pytest.mark.parametrize("base_kind", ["container", "vm-with-toolkit"])
@pytest.mark.parametrize("name", sorted(DERIVE.CASES))
def test_derived_cases_do_not_lean_on_the_base(name, base_kind):
    """A case plants every fact that makes it what it is: from a base that is a container, or a VM with nvcc
    and NVIDIA_VISIBLE_DEVICES set, it still has the same root cause (and only that error)."""
    base = DERIVE.load_base(DERIVE.CASES[name][0])
    (_as_container if base_kind == "container" else _as_vm_with_toolkit)(base)
    r = diagnose(facts_from_json(DERIVE.derive(name, base)))
    want_id, want_sev = ROOT_CAUSES[name]
    found = [(f.id, f.severity.value) for f in r.findings]
    if want_sev == "info":
        assert (want_id, want_sev) in found and r.exit_code == 0, found
        return
    assert found[0] == (want_id, want_sev), found
    if want_sev == "error":
        assert [i for i, sev in found if sev == "error"] == [want_id], found


def test_derived_fixtures_are_up_to_date():
    """The fixture files are what derive.py makes from the bases now (rerun it after changing a base)."""
    stale = [n for n in DERIVE.CASES if json.loads((FIX / f"{n}.json").read_text()) != DERIVE.derive(n)]
    assert not stale, f"run 'python tests/fixtures/doctor/derive.py': stale {stale}"


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_h200_machines(name):
    r = report(name)
    assert r.exit_code == 0 and r.status == "healthy", [(f.id, f.summary) for f in r.findings]
    ids = {f.id for f in r.findings if f.severity is Severity.OK}
    assert {"driver.ok", "torch.ok", "limits.shm"} <= ids
    if name.startswith("h200x2"):
        assert "gpu.p2p" in ids


def test_no_driver_fix_is_for_this_distribution():
    f = report("driver-not-installed-debian12-h200").findings[0]
    assert f.summary == "no NVIDIA driver"
    assert any("apt-get install" in step and "nvidia-driver" in step for step in f.fix)
    assert any("PCI bus: 0000:00:06.0" in e for e in f.evidence)


def test_without_a_gpu_doctor_leads_to_the_cpu_build():
    """No NVIDIA GPU on the PCI bus: no driver to install; the CPU build is the working one (issue 17.8)."""
    r = report("no-driver-debian12-cpu-torch")
    assert r.exit_code == 0 and not [f for f in r.findings if f.severity.is_problem]
    no_gpu = next(f for f in r.findings if f.id == "driver.no_gpu")
    assert no_gpu.fix[0].split("#")[0].strip() == "torchrig resolve"
    assert not any("apt-get" in step for f in r.findings for step in f.fix)
    assert any("no NVIDIA device" in e for e in no_gpu.evidence)
    cpu = next(f for f in r.findings if f.id == "torch.cpu_build")
    assert cpu.severity is Severity.INFO and not any("uninstall" in step for step in cpu.fix)
    # no torch at all on such a machine: the fix is the CPU build, never a GPU to name
    facts = load_facts(FIX / "no-driver-debian12-cpu-torch.json")
    bare = dataclasses.replace(
        facts, torch=dataclasses.replace(facts.torch, status=ProbeStatus.MISSING, version=None)
    )
    fix = next(f for f in diagnose(bare).findings if f.id == "torch.not_installed").fix
    assert fix == (
        "torchrig resolve   # without --gpu: prints the pip command of the CPU build for this machine",
    )


def test_cpu_build_is_a_note_without_gpu_and_an_error_with_one():
    assert any(
        f.id == "torch.cpu_build" and f.severity is Severity.INFO
        for f in report("no-driver-debian12-cpu-torch").findings
    )
    assert report("torch-cpu-build-h200").findings[0].severity is Severity.ERROR


def test_visible_devices_7_names_the_valid_indices():
    f = report("cuda-visible-devices-7-h200x2").findings[0]
    assert "CUDA_VISIBLE_DEVICES=7" in f.summary
    assert "export CUDA_VISIBLE_DEVICES=0,1   # or a subset of these" in f.fix


def test_container_fix_names_gpus_flag_cdi_and_toolkit():
    f = report("container-without-gpus-h200").findings[0]
    text = "\n".join(f.fix)
    assert (
        "--gpus all" in text and "--device nvidia.com/gpu=all" in text and "nvidia-container-toolkit" in text
    )
    assert "NVIDIA_VISIBLE_DEVICES is unset" in f.cause
    g = report("container-nvidia-runtime-not-used-h200").findings[0]
    assert "NVIDIA_VISIBLE_DEVICES=all" in g.cause


def test_small_shm_in_a_container_is_fixed_by_docker_run():
    f = report("shm-64m-container-h200").findings[0]
    assert f.fix[0].startswith("docker run --ipc=host")


def test_driver_too_old_offers_a_build_or_a_driver():
    f = report("driver-535-h200-cu130").findings[0]
    assert "535.247.01" in f.summary and "13.0" in f.summary
    assert any("upgrade the driver" in x for x in f.fix)


def test_shadowing_names_files_and_gives_a_clean_path():
    f = report("ld-library-path-shadows-cudnn-h200").findings[0]
    assert any("/usr/local/cuda/lib64/libcudnn.so.9 shadows" in e for e in f.evidence)
    assert "export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu" in f.fix


def test_fabric_manager_fix_matches_the_driver_branch():
    f = report("fabric-manager-stopped-h200x2").findings[0]
    assert "802" in " ".join(f.evidence) and "nvidia-fabricmanager" in " ".join(f.fix)


def test_only_filters_areas_but_keeps_root_cause_logic():
    facts = load_facts(FIX / "cuda-visible-devices-7-h200x2.json")
    r = diagnose(facts, ["torch"])
    assert not any(f.id.startswith("env.") for f in r.findings)
    assert not any(f.id == "torch.cuda_unavailable" for f in r.findings)  # explained by CUDA_VISIBLE_DEVICES


def test_report_json_round_trips_findings():
    r = report("throttled-at-idle-h200")
    data = json.loads(json.dumps(r.to_json()))
    assert data["verdict"]["status"] == "problems" and data["verdict"]["exit_code"] == 1
    assert (data["verdict"]["error"], data["verdict"]["warning"]) == (0, 1)
    assert data["findings"][0]["id"] == "gpu.throttling"


def test_docker_with_the_toolkit_is_ready():
    facts = load_facts(FIX / "docker-without-nvidia-toolkit-h200.json")
    ready = dataclasses.replace(
        facts,
        docker=dataclasses.replace(
            facts.docker,
            runtimes=("nvidia", "runc"),
            toolkit_binaries=("nvidia-ctk", "nvidia-container-runtime-hook"),
        ),
    )
    found = {f.id: f.severity.value for f in diagnose(ready).findings}
    assert found.get("docker.gpu_ready") == "ok" and "docker.no_nvidia_toolkit" not in found


def test_a_failing_check_becomes_a_note_outside_strict_mode(monkeypatch):
    from torchrig.doctor import checks

    def broken(ctx):
        raise KeyError("boom")

    monkeypatch.setattr(checks, "CHECKS", (("gpu", broken), *checks.CHECKS))
    facts = load_facts(FIX / "persistence-off-h200.json")
    r = diagnose(facts, strict=False)
    assert any(f.id == "doctor.check_failed.broken" and f.severity is Severity.INFO for f in r.findings)
    assert any(f.id == "gpu.persistence_off" for f in r.findings)  # the others still ran
    with pytest.raises(KeyError):
        diagnose(facts)
