"""Grading thresholds: each figure against the datasheet peak, pass / warn / fail at the documented lines."""

from __future__ import annotations

import dataclasses

import pytest

from torchrig.bench.grading import grade, load_thresholds, summary
from torchrig.bench.records import (
    CollectiveResult,
    GemmResult,
    Grade,
    HostResult,
    Measurements,
    MemoryResult,
    Meta,
    P2PResult,
    RankGpu,
    ScalingResult,
)
from torchrig.bench.run import BenchReport
from torchrig.hw.record import GpuFacts


@dataclasses.dataclass(frozen=True)
class Peaks:  # the fields of torchrig.compat.kb.Peaks; figures of the H200 SXM datasheet
    fp32_tflops: float | None = 67
    tf32_tflops: float | None = 494.7
    bf16_tflops: float | None = 989.4
    fp16_tflops: float | None = 989.4
    fp8_tflops: float | None = 1978.9
    memory_bandwidth_gbps: float | None = 4800
    nvlink_bandwidth_gbps: float | None = 900
    pcie_bandwidth_gbps: float | None = 128


def meta(kind: str = "cuda") -> Meta:
    return Meta(
        date_utc="2026-11-30T10:00:00Z",
        hostname="h",
        command_line="torchrig bench",
        device_kind=kind,
        backend="nccl" if kind == "cuda" else "gloo",
        world_size=2,
        quick=False,
        torch_version="2.11.0",
        cuda_version="13.0",
        nccl_version="2.27.7",
        elapsed_s=1.0,
    )


def gpus(kind: str = "cuda") -> tuple[RankGpu, ...]:
    h200 = GpuFacts(
        0, name="NVIDIA H200", compute_capability="9.0", memory_total_mib=143771, l2_cache_bytes=52428800
    )
    return tuple(RankGpu(r, dataclasses.replace(h200, index=r) if kind == "cuda" else None) for r in range(2))


def gemm(tflops: float, ok: bool = True, dtype: str = "bf16", n: int = 8192) -> GemmResult:
    return GemmResult(
        rank=0, dtype=dtype, n=n, tflops=tflops, median_ms=1.0, repeats=20, check_ok=ok, max_rel_err=1e-3
    )


def by_id(findings):
    return {f.id: f for f in findings}


PEAKS = {0: Peaks(), 1: Peaks()}


@pytest.mark.parametrize(
    ("tflops", "expected"),
    [
        (760.0, Grade.PASS),  # 76.8% of 989.4
        (544.2, Grade.PASS),  # 55.0%: exactly at pass_at
        (500.0, Grade.WARN),  # 50.5%
        (346.3, Grade.WARN),  # 35.0%: exactly at warn_at
        (300.0, Grade.FAIL),  # 30.3%
    ],
)
def test_gemm_thresholds(tflops, expected):
    m = Measurements(meta=meta(), gpus=gpus(), gemm=(gemm(tflops),))
    f = by_id(grade(m, PEAKS))["gemm.bf16.gpu0"]
    assert f.grade is expected
    assert f.fraction == pytest.approx(tflops / 989.4)
    assert f.expected == 989.4


def test_best_size_is_graded_and_wrong_results_fail():
    m = Measurements(meta=meta(), gpus=gpus(), gemm=(gemm(700, n=8192), gemm(780, n=16384)))
    assert by_id(grade(m, PEAKS))["gemm.bf16.gpu0"].value == 780
    m = Measurements(meta=meta(), gpus=gpus(), gemm=(gemm(780, n=8192), gemm(790, ok=False, n=16384)))
    f = by_id(grade(m, PEAKS))["gemm.bf16.gpu0"]
    assert f.grade is Grade.FAIL and "differs from the reference" in f.message


def test_memory_and_host_against_datasheet():
    m = Measurements(
        meta=meta(),
        gpus=gpus(),
        memory=(
            MemoryResult(
                rank=0, kind="copy", size_bytes=1 << 32, gbps=4200, median_ms=2, repeats=20, check_ok=True
            ),
            MemoryResult(
                rank=0, kind="triad", size_bytes=1 << 32, gbps=2000, median_ms=2, repeats=20, check_ok=True
            ),
        ),
        host=(
            HostResult(
                rank=0,
                direction="h2d",
                pinned=True,
                size_bytes=1 << 30,
                gbps=55,
                median_ms=20,
                repeats=10,
                check_ok=True,
            ),
            HostResult(
                rank=0,
                direction="h2d",
                pinned=True,
                size_bytes=1 << 30,
                gbps=26,
                median_ms=20,
                repeats=10,
                check_ok=True,
            ),
            HostResult(
                rank=0,
                direction="d2h",
                pinned=False,
                size_bytes=1 << 30,
                gbps=3,
                median_ms=20,
                repeats=10,
                check_ok=True,
            ),
        ),
    )
    fs = grade(m, PEAKS)
    copy, triad = fs[0], fs[1]
    assert copy.grade is Grade.PASS and copy.fraction == pytest.approx(4200 / 4800)  # 87.5%
    assert triad.grade is Grade.FAIL  # 41.7% < 50%
    assert fs[2].expected == 64 and fs[2].grade is Grade.PASS  # 55 of 64 GB/s per direction: 85.9%
    assert fs[3].grade is Grade.WARN  # 26 of 64 = 40.6%: a PCIe link at half speed
    # pageable is informational, shown against the pinned figure of the same direction when there is one
    assert (
        fs[4].grade is Grade.INFO and "pin_memory" in fs[4].message and "host's memory copy" in fs[4].message
    )
    assert fs[4].expected is None and fs[4].fraction is None  # no pinned d2h in this run


def test_p2p_pair_far_below_its_link_fails_and_points_to_doctor():
    rows = (
        P2PResult(
            src=0, dst=1, size_bytes=1 << 28, oneway_gbps=390, bidir_gbps=760, latency_us=12, check_ok=True
        ),
        P2PResult(
            src=1, dst=0, size_bytes=1 << 28, oneway_gbps=48, bidir_gbps=760, latency_us=12, check_ok=True
        ),
    )
    f = by_id(grade(Measurements(meta=meta(), gpus=gpus(), p2p=rows), PEAKS))
    assert f["p2p.0-1"].grade is Grade.PASS and f["p2p.0-1"].expected == 450  # NVLink 900 both ways / 2
    assert f["p2p.0-1.bidir"].expected == 900 and f["p2p.0-1.bidir"].grade is Grade.PASS
    assert f["p2p.1-0"].grade is Grade.FAIL  # 48 / 450 = 10.7%
    assert "torchrig doctor" in f["p2p.1-0"].message and "1↔0" in f["p2p.1-0"].message


def test_p2p_without_nvlink_is_graded_against_pcie():
    pcie_only = {0: Peaks(nvlink_bandwidth_gbps=None), 1: Peaks(nvlink_bandwidth_gbps=None)}
    rows = (
        P2PResult(
            src=0, dst=1, size_bytes=1 << 28, oneway_gbps=50, bidir_gbps=90, latency_us=12, check_ok=True
        ),
    )
    f = by_id(grade(Measurements(meta=meta(), gpus=gpus(), p2p=rows), pcie_only))["p2p.0-1"]
    assert f.expected == 64 and f.grade is Grade.PASS and "PCIe" in f.expected_what


def coll(op: str, size: int, busbw: float, ok: bool = True) -> CollectiveResult:
    return CollectiveResult(
        op=op,
        size_bytes=size,
        dtype="bf16",
        ranks=2,
        time_us=1.0,
        algbw_gbps=busbw,
        busbw_gbps=busbw,
        iterations=15,
        check_ok=ok,
    )


def test_collectives_graded_at_large_sizes_only():
    rows = (
        coll("all_reduce", 1 << 20, 30),
        coll("all_reduce", 1 << 30, 327),
        coll("all_reduce", 4 << 30, 345),
        coll("broadcast", 1 << 20, 40),
        coll("all_gather", 1 << 30, 100),
        coll("sendrecv", 1 << 30, 300, ok=False),
    )
    f = by_id(grade(Measurements(meta=meta(), gpus=gpus(), collectives=rows), PEAKS))
    ar = f["collective.all_reduce"]
    assert ar.value == 345 and ar.grade is Grade.PASS and ar.fraction == pytest.approx(345 / 450)
    assert (
        f["collective.broadcast"].grade is Grade.UNKNOWN
        and "latency-bound" in f["collective.broadcast"].message
    )
    assert f["collective.all_gather"].grade is Grade.FAIL  # 22% of 450
    assert f["collective.sendrecv"].grade is Grade.FAIL and "differs" in f["collective.sendrecv"].message


@pytest.mark.parametrize(("eff", "expected"), [(0.96, Grade.PASS), (0.80, Grade.WARN), (0.5, Grade.FAIL)])
def test_scaling_efficiency(eff, expected):
    rows = (
        ScalingResult(gpus=1, tokens_per_s=400e3, step_ms=40, efficiency=1.0),
        ScalingResult(gpus=2, tokens_per_s=800e3 * eff, step_ms=40, efficiency=eff),
    )
    fs = grade(Measurements(meta=meta(), gpus=gpus(), scaling=rows), PEAKS)
    assert [f.id for f in fs] == ["scaling.2"] and fs[0].grade is expected


def test_cpu_path_is_graded_no_gpu():
    m = Measurements(
        meta=meta("cpu"), gpus=gpus("cpu"), gemm=(gemm(0.2),), collectives=(coll("all_reduce", 1 << 20, 0.3),)
    )
    fs = grade(m, {0: None, 1: None})
    assert {f.grade for f in fs} == {Grade.NO_GPU}
    assert all(f.fraction is None and f.expected is None for f in fs)
    assert BenchReport(m, tuple(fs)).exit_code == 0


def test_unknown_gpu_is_unknown_not_zero():
    m = Measurements(meta=meta(), gpus=gpus(), gemm=(gemm(700),))
    f = grade(m, {0: None, 1: None})[0]
    assert f.grade is Grade.UNKNOWN and f.fraction is None and "knowledge base" in f.message
    no_fp8 = {0: Peaks(fp8_tflops=None)}
    assert (
        grade(Measurements(meta=meta(), gpus=gpus(), gemm=(gemm(900, dtype="fp8"),)), no_fp8)[0].grade
        is Grade.UNKNOWN
    )


def test_exit_code_and_summary():
    m = Measurements(meta=meta(), gpus=gpus(), gemm=(gemm(760), gemm(10, dtype="fp16")))
    fs = grade(m, PEAKS)
    assert summary(fs)["pass"] == 1 and summary(fs)["fail"] == 1
    assert BenchReport(m, tuple(fs)).exit_code == 1


def test_thresholds_file_is_consistent():
    th = load_thresholds()
    assert set(th) == {
        "gemm",
        "memory",
        "host_pinned",
        "p2p_oneway",
        "p2p_bidir",
        "collective",
        "scaling",
    }
    for t in th.values():
        assert 0 <= t.warn_at <= t.pass_at <= 1 and t.why


def test_a_measurement_that_crashed_is_a_failure():
    from torchrig.bench.records import Skipped

    m = Measurements(
        meta=meta(),
        gpus=gpus(),
        skipped=(
            Skipped("gemm fp8 8192 on rank 1", "failed: RuntimeError: boom"),
            Skipped("host", "no GPU: host<->device transfers need a CUDA device"),
        ),
    )
    fs = grade(m, PEAKS)
    assert [(f.id, f.grade) for f in fs] == [("gemm.failed.0", Grade.FAIL)]
    assert "RuntimeError: boom" in fs[0].message


def test_pageable_is_informational_against_the_pinned_copy_and_never_fails():
    def host(pinned: bool, gbps: float) -> HostResult:
        return HostResult(
            rank=0,
            direction="h2d",
            pinned=pinned,
            size_bytes=1 << 30,
            gbps=gbps,
            median_ms=20,
            repeats=10,
            check_ok=True,
        )

    m = Measurements(meta=meta(), gpus=gpus(), host=(host(True, 55.3), host(False, 0.5)))
    fs = by_id(grade(m, PEAKS))
    page = fs["host.h2d.pageable.gpu0"]
    assert page.grade is Grade.INFO and page.expected == 55.3
    assert page.fraction == pytest.approx(0.5 / 55.3) and page.message.startswith("1% of the pinned copy")
    assert summary(list(fs.values()))["info"] == 1
    assert BenchReport(m, tuple(fs.values())).exit_code == 0


def test_a_damaged_thresholds_file_is_one_line_naming_the_key(monkeypatch):
    """thresholds.toml is read as every data file torchrig ships (torchrig.data.packaged) into records."""
    import torchrig.data
    from torchrig.errors import InputError

    assert load_thresholds()["gemm"].pass_at > load_thresholds()["gemm"].warn_at
    monkeypatch.setattr(torchrig.data, "packaged", lambda pkg, path: {"threshold": [{"metric": "gemm"}]})
    with pytest.raises(InputError, match=r"thresholds.toml.threshold\[0\].pass_at: missing") as e:
        load_thresholds()
    assert "\n" not in e.value.one_line() and e.value.exit_code == 2


def test_peaks_unknown_to_the_knowledge_base_are_unknown_and_a_bug_is_not_hidden(monkeypatch):
    """bench's grading and the trainer's MFU catch the knowledge base's own refusals (TorchrigError: an unknown
    GPU, a damaged data file) and nothing else: a bug in the lookup reaches the one exit-3 handler."""
    import torchrig.compat
    from torchrig.bench.grading import find_peaks
    from torchrig.train.metrics import peak_tflops

    assert find_peaks("NVIDIA H200") is not None and find_peaks("Foo GPU 9000") is None
    value, source = peak_tflops("Foo GPU 9000", "bf16", None)
    assert value is None and source == "unknown (unknown GPU 'Foo GPU 9000'; give --peak-tflops)"

    def broken():
        raise RuntimeError("a bug")

    monkeypatch.setattr(torchrig.compat, "load_kb", broken)
    with pytest.raises(RuntimeError):
        find_peaks("NVIDIA H200")
    with pytest.raises(RuntimeError):
        peak_tflops("NVIDIA H200", "bf16", None)
