"""The scaling figure's commands: bench runs torchrig train itself, with the options it reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchrig.bench import scaling
from torchrig.bench.records import Measurements, Meta, P2PResult
from torchrig.errors import JobFailed

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_gpu_runs_are_torchrig_train_on_the_first_k_gpus():
    argv = scaling.trainer_argv(scaling.GPU_SHAPE, 2, 60, 20, "/tmp/x", python="py")
    assert argv[:4] == ["py", "-m", "torchrig", "train"]
    assert argv[argv.index("--gpus") + 1] == "2" and "--compile" in argv
    assert argv[argv.index("--size") + 1] == "small" and argv[argv.index("--precision") + 1] == "bf16"
    one = scaling.trainer_argv(scaling.GPU_SHAPE, 1, 60, 20, "/tmp/x", python="py")
    assert one[one.index("--gpus") + 1] == "1" and "--no-preflight" not in one


def test_the_reported_command_is_the_one_that_ran():
    shape = scaling.shape_for("cuda", quick=False)
    described = scaling.shape_for("cuda", quick=False).describe(60, 20).split()[2:]
    argv = scaling.trainer_argv(shape, 1, 60, 20, "/tmp/x")
    assert argv[4 : 4 + len(described)] == described
    assert "--no-compile" in scaling.shape_for("cuda", quick=True).options(20, 5)
    cpu = scaling.trainer_argv(scaling.shape_for("cpu", quick=False), 2, 6, 2, "/tmp/x")
    assert cpu[cpu.index("--nproc-per-node") + 1] == "2" and cpu[cpu.index("--device") + 1] == "cpu"


def test_step_time_and_a_missing_summary(tmp_path):
    summary = json.loads((FIXTURES / "train/summary-gpt-ddp-fp8-2gpus.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps(summary | {"tokens_per_s": 16 * 1024 * 10.0}))
    row = scaling._read_summary(tmp_path, scaling.GPU_SHAPE, 1)
    assert row.step_ms == pytest.approx(100.0)
    with pytest.raises(JobFailed, match="no throughput"):
        scaling._read_summary(tmp_path / "nope", scaling.GPU_SHAPE, 2)
    (tmp_path / "summary.json").write_text(json.dumps(summary | {"tokens_per_s": None}))
    with pytest.raises(JobFailed, match="no tokens/s measured"):
        scaling._read_summary(tmp_path, scaling.GPU_SHAPE, 1)
    (tmp_path / "summary.json").write_text(json.dumps(summary | {"tokens_per_s": "fast"}))
    with pytest.raises(JobFailed, match=r"summary.json.tokens_per_s: expected a number"):
        scaling._read_summary(tmp_path, scaling.GPU_SHAPE, 1)


def _m(*gbps: float) -> Measurements:
    meta = Meta(date_utc="", hostname="h", command_line="", device_kind="cuda", backend="nccl", world_size=2, quick=False, torch_version="", cuda_version=None, nccl_version=None, elapsed_s=0.0)  # fmt: skip
    rows = tuple(
        P2PResult(src=i, dst=1 - i, size_bytes=1, oneway_gbps=g, bidir_gbps=g, latency_us=1.0, check_ok=True)
        for i, g in enumerate(gbps)
    )
    return Measurements(meta=meta, gpus=(), p2p=rows)


class _Peaks:
    nvlink_bandwidth_gbps = 900.0
    pcie_bandwidth_gbps = None


def test_the_heat_map_scale_starts_at_zero():
    from torchrig.bench.plots import p2p_scale

    # Two equal links (353.8 and 354.6 GB/s) get nearly one colour: the range is 0 to the peak.
    assert p2p_scale(_m(353.8, 354.6), {0: _Peaks()}) == (0.0, 450.0, "0 to the NVLink peak")
    assert p2p_scale(_m(10.0, 12.0), {}) == (0.0, 12.0, "0 to the best pair")
