"""Pre-flight: the image's labels against the (recorded) host driver and GPUs, through the compat rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchrig.compat import load_kb
from torchrig.contract import LABEL_ARCH_LIST, LABEL_CUDA, LABEL_MIN_DRIVER, LABEL_TORCH
from torchrig.runtime.inventory import load_snapshot
from torchrig.runtime.preflight import Severity, preflight

FIX = Path(__file__).resolve().parents[1] / "fixtures/runtime"


def labels(cuda="13.0", archs="sm_80 sm_90 sm_100 sm_120 compute_120", min_driver=None, torch="2.9.1+cu130"):
    out = {LABEL_TORCH: torch, LABEL_CUDA: cuda, LABEL_ARCH_LIST: archs}
    if min_driver:
        out[LABEL_MIN_DRIVER] = min_driver
    return out


def test_cu130_image_refused_on_driver_535_with_fix():
    inv = load_snapshot(FIX / "driver-535-2xa100-pcie.json")
    pf = preflight(labels(), inv, inv.units()[:1], load_kb)
    assert not pf.ok
    f = pf.failures()[0]
    assert f.id == "driver_too_old" and "535.104.05" in f.summary
    assert "upgrade the host driver to ≥ 580" in f.fix[0] and "CUDA ≤ 12.2" in f.fix[0]


def test_min_driver_label_refuses():
    inv = load_snapshot(FIX / "inventory-8xh200.json")
    pf = preflight(labels(cuda="12.8", min_driver="590.1"), inv, inv.units()[:1], load_kb)
    assert [f.id for f in pf.failures()] == ["image_needs_newer_driver"]


def test_h200_with_cu130_runs():
    inv = load_snapshot(FIX / "inventory-8xh200.json")
    pf = preflight(labels(), inv, inv.units()[:2], load_kb)
    assert pf.ok and any(f.id == "driver_native" for f in pf.findings)


def test_arch_missing_is_refused():
    inv = load_snapshot(FIX / "inventory-8xh200.json")
    pf = preflight(labels(archs="sm_80 sm_86"), inv, inv.units()[:1], load_kb)
    assert [f.id for f in pf.failures()] == ["arch_not_covered"]
    assert "sm_90" in pf.failures()[0].fix[0]


def test_torch_arch_list_form_is_understood():
    inv = load_snapshot(FIX / "inventory-8xh200.json")
    assert preflight(labels(archs="8.0;9.0+PTX"), inv, inv.units()[:1], load_kb).ok


@pytest.mark.parametrize(
    "lab,code,sev",
    [
        ({}, "image_unlabelled", Severity.CAVEAT),
        ({LABEL_TORCH: "2.9.1+cpu", LABEL_CUDA: "cpu"}, "cpu_only_image", Severity.FAIL),
    ],
)
def test_unlabelled_and_cpu_images(lab, code, sev):
    inv = load_snapshot(FIX / "inventory-8xh200.json")
    pf = preflight(lab, inv, inv.units()[:1], load_kb)
    assert pf.findings[0].id == code and pf.findings[0].severity is sev


def test_no_gpus_no_checks():
    inv = load_snapshot(FIX / "inventory-8xh200.json")
    assert preflight(labels(), inv, (), load_kb).findings == ()


def test_recorded_h200_host_runs_its_own_torch_build_and_refuses_a_newer_cuda():
    """Recorded on the GPU machine (1x H200, driver 580.159.04) by tools/gpu/runtime.sh."""
    inv = load_snapshot(FIX / "recorded-1xh200-driver580.json")
    assert [g.name for g in inv.gpus] == ["NVIDIA H200"]
    # torch 2.11.0+cu130 is what that machine runs: sm_75..sm_120 cubins.
    ok = preflight(
        labels(cuda="13.0", archs="sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", torch="2.11.0+cu130"),
        inv,
        inv.units(),
        load_kb,
    )
    assert ok.ok
    newer = preflight(labels(cuda="13.0", min_driver="595.1"), inv, inv.units(), load_kb)
    assert [f.id for f in newer.failures()] == ["image_needs_newer_driver"]
