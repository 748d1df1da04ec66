"""Datacenter forward compatibility: an older Long Term Support driver branch runs a newer CUDA on data center
GPUs with the cuda-compat package (works with caveats, naming the package and its own driver floor); consumer
GPUs and non-LTS branches still fail."""

from __future__ import annotations

import pytest

from torchrig.compat import Verdict, check, load_kb
from torchrig.compat.platforms import Platform


@pytest.fixture(scope="module")
def kb():
    return load_kb()


def _check(kb, gpu, driver, torch):
    return check(kb, gpus=[kb.find_gpu(gpu)], driver=driver, build=kb.find_build(torch), platform=Platform())


def test_an_lts_driver_on_a_datacenter_gpu_runs_a_newer_cuda_with_the_compat_package(kb):
    r = _check(kb, "A100", "535.104.05", "2.9.0+cu130")
    assert r.verdict is Verdict.WORKS_WITH_CAVEATS
    reason = next(x for x in r.reasons if x.code == "driver_forward_compat")
    assert "cuda-compat-13-0" in reason.message and kb.toolkit("13.0").min_driver in reason.message


def test_consumer_gpus_and_non_lts_branches_still_fail(kb):
    assert _check(kb, "RTX 4090", "535.104.05", "2.9.0+cu130").verdict is Verdict.FAILS
    assert "driver_too_old" in _check(kb, "H100", "545.23.06", "2.9.0+cu130").codes
    assert _check(kb, "H100", "545.23.06", "2.9.0+cu130").verdict is Verdict.FAILS


def test_a_bundled_library_floor_is_a_caveat_naming_it(kb):
    r = _check(kb, "Tesla K80", None, "2.5.1+cu118")  # sm_37 kernels, cuDNN 9.1 (needs 5.0)
    assert r.verdict is Verdict.WORKS_WITH_CAVEATS
    floor = next(x for x in r.reasons if x.code == "library_floor")
    assert "cuDNN 9.1" in floor.message and "5.0" in floor.message
    assert "library_floor" not in _check(kb, "Tesla K80", None, "2.3.1+cu118").codes  # cuDNN 8
    assert "library_floor" not in _check(kb, "Tesla M60", None, "2.5.1+cu118").codes  # 5.2 is above it
