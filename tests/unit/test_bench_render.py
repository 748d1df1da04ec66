"""Report rendering from a results JSON: the text summary, the Markdown report and the PNG."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from torchrig.bench.grading import grade
from torchrig.bench.records import (
    CollectiveResult,
    GemmResult,
    Measurements,
    Meta,
    P2PResult,
    RankGpu,
    ScalingResult,
    measurements_from_json,
)
from torchrig.bench.render import render_markdown, render_text
from torchrig.bench.run import build_report
from torchrig.hw.record import GpuFacts

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "cpu-gloo-2proc-torch2.13.json"


@dataclasses.dataclass(frozen=True)
class Peaks:
    fp32_tflops: float | None = 67
    tf32_tflops: float | None = 494.7
    bf16_tflops: float | None = 989.4
    fp16_tflops: float | None = 989.4
    fp8_tflops: float | None = 1978.9
    memory_bandwidth_gbps: float | None = 4800
    nvlink_bandwidth_gbps: float | None = 900
    pcie_bandwidth_gbps: float | None = 128


def gpu_run() -> Measurements:
    meta = Meta(
        date_utc="2026-11-30T11:00:00Z",
        hostname="gpu-host",
        command_line="torchrig bench",
        device_kind="cuda",
        backend="nccl",
        world_size=2,
        quick=False,
        torch_version="2.11.0+cu130",
        cuda_version="13.0",
        nccl_version="2.27.7",
        elapsed_s=90.0,
        scaling_model="GPT-style decoder",
        env={"NCCL_NVLS_ENABLE": "0"},
    )
    h200 = GpuFacts(
        0, name="NVIDIA H200", compute_capability="9.0", memory_total_mib=143771, l2_cache_bytes=52428800
    )
    g = tuple(RankGpu(r, dataclasses.replace(h200, index=r)) for r in range(2))
    gemm = tuple(
        GemmResult(r, d, 8192, t, 1.0, 20, True, 1e-3)
        for r in range(2)
        for d, t in (("bf16", 760.0), ("fp8", 1300.0), ("fp32", 50.0))
    )
    p2p = (P2PResult(0, 1, 1 << 28, 390, 760, 11, True), P2PResult(1, 0, 1 << 28, 40, 760, 11, True))
    coll = tuple(
        CollectiveResult(op, s, "bf16", 2, 1.0, b, b, 15, True)
        for op in ("all_reduce", "all_gather")
        for s, b in ((1 << 20, 30.0), (1 << 30, 330.0), (4 << 30, 345.0))
    )
    scale = (ScalingResult(1, 300e3, 50, 1.0), ScalingResult(2, 580e3, 52, 0.967))
    return Measurements(meta=meta, gpus=g, gemm=gemm, p2p=p2p, collectives=coll, scaling=scale)


PEAKS = {0: Peaks(), 1: Peaks()}


def test_text_summary_shows_grades_and_what_needs_attention():
    m = gpu_run()
    fs = grade(m, PEAKS)
    report = build_report(m, PEAKS, None, plots=False)
    text = render_text(m, fs, report.counts, [])
    assert "machine: gpu-host, 2x NVIDIA H200" in text
    assert "torch 2.11.0+cu130, CUDA 13.0, NCCL 2.27.7" in text
    assert "FAIL: P2P 1→0 one way" in text and "torchrig doctor" in text
    assert "4 GiB" in text and "345.0" in text
    assert "verdict:" in text and "1 fail" in text


def test_markdown_report_has_every_section(tmp_path):
    m = gpu_run()
    report = build_report(m, PEAKS, str(tmp_path), plots=False)
    md = (tmp_path / "bench.md").read_text()
    for heading in (
        "## Graded figures",
        "## GEMM",
        "## P2P one way, GB/s",
        "## P2P latency, µs",
        "## Collectives: busbw GB/s (bf16, 2 ranks)",
        "## Training scaling",
    ):
        assert heading in md
    assert "| GPU 1 | 40.0 | - |" in md
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["command"] == "bench" and saved["summary"] == report.counts


def test_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    report = build_report(gpu_run(), PEAKS, str(tmp_path), plots=True)
    png = tmp_path / "bench.png"
    assert str(png) in report.files
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_recorded_cpu_run_renders_as_no_gpu(tmp_path):
    m = measurements_from_json(json.loads(FIXTURE.read_text()))
    report = build_report(m, {0: None, 1: None}, str(tmp_path), plots=False)
    text = report.render_text()
    assert "2 CPU processes (gloo)" in text and "verdict: no GPU" in text
    assert "skipped host: no GPU" in text
    md = render_markdown(m, report.findings, report.counts, None)
    assert md.startswith("# torchrig bench: CPU/gloo report")
