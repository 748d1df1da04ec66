"""The worker's GEMM schedule: every dtype at the small size first, in a fixed order, fewer repeats when big."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from torchrig.bench import worker  # noqa: E402
from torchrig.bench.config import make_config  # noqa: E402
from torchrig.bench.records import RankGpu  # noqa: E402


def test_gemm_runs_smallest_size_first_in_the_fixed_dtype_order():
    cfg = dataclasses.replace(
        make_config(device_kind="cpu", quick=True, gemm_dtypes=("fp32", "bf16")),
        gemm_sizes=(64, 32),
        gemm_repeats=2,
        warmup=1,
    )
    info = RankGpu(0, None)  # the CPU path
    labels: list[str] = []
    out: dict[str, list] = {"gemm": [], "skipped": []}
    worker._gemm_part(torch, torch.device("cpu"), cfg, info, 0, out, lambda label: labels.append(label))
    assert [(g.dtype, g.n) for g in out["gemm"]] == [("bf16", 32), ("fp32", 32), ("bf16", 64), ("fp32", 64)]
    assert labels[0] == "GEMM bf16 32x32x32" and len(labels) == 4
    assert all(g.check_ok and g.sm_clock_mhz is None for g in out["gemm"])  # no NVML on the CPU path


def test_big_gemms_get_half_the_repeats():
    assert worker.gemm_repeats(20, 8192) == 20
    assert worker.gemm_repeats(20, 16384) == 10
    assert worker.gemm_repeats(6, 16384) == 5  # never fewer than 5


def test_warm_up_lasts_at_least_min_warmup_s():
    import time

    from torchrig.bench.timing import Timer

    calls: list[float] = []

    def fn(i: int) -> None:
        calls.append(time.perf_counter())
        time.sleep(0.002)

    times = Timer(torch, torch.device("cpu")).time_each(fn, repeats=3, warmup=2, min_warmup_s=0.03)
    assert len(times) == 3
    warmups = calls[:-3]
    # the timed calls began only after 30 ms of warm-up, however long each 2 ms sleep took on this machine
    # (without min_warmup_s, 2 warm-up calls end after ~4 ms)
    assert len(warmups) >= 2 and calls[-3] - warmups[0] >= 0.03
    calls.clear()
    Timer(torch, torch.device("cpu")).time_each(fn, repeats=3, warmup=2)
    assert len(calls) == 5  # without it, exactly the warm-up calls
