"""Bench presets and the launch plan: sizes stay within budget, the plan is data, the parent's env is untouched."""

from __future__ import annotations

import os

import pytest

from torchrig.bench.config import BenchConfig, collective_iterations, make_config
from torchrig.bench.launch import worker_job
from torchrig.bench.scaling import group_sizes
from torchrig.bench.timing import rotation_sets
from torchrig.errors import UsageError
from torchrig.launch.plan import HostFacts, build_plan

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_full_gpu_preset_sweeps_1kib_to_4gib_and_matches_the_anchor_sizes():
    cfg = make_config(device_kind="cuda", quick=False)
    assert cfg.collective_sizes[0] == KiB and cfg.collective_sizes[-1] == 4 * GiB
    assert {256 * MiB, GiB, 4 * GiB} <= set(cfg.collective_sizes)
    assert max(cfg.collective_sizes) <= 8 * GiB
    assert cfg.gemm_dtypes == ("fp32", "tf32", "bf16", "fp16", "fp8") and 8192 in cfg.gemm_sizes
    assert cfg.memory_bytes == 4 * GiB and cfg.host_bytes == GiB and cfg.collective_dtype == "bf16"


def test_quick_and_cpu_presets_are_small():
    quick = make_config(device_kind="cuda", quick=True)
    assert max(quick.collective_sizes) == 256 * MiB and quick.gemm_sizes == (8192,)
    cpu = make_config(device_kind="cpu", quick=False)
    assert (
        max(cpu.collective_sizes) == MiB
        and cpu.gemm_dtypes == ("fp32", "bf16")
        and cpu.collective_dtype == "fp32"
    )


def test_fewer_repeats_at_big_sizes():
    assert collective_iterations(4 * GiB, False) == (2, 5, 3)
    assert collective_iterations(256 * MiB, False) == (3, 10, 3)
    assert collective_iterations(KiB, False) == (5, 50, 3)


def test_config_round_trips_and_validates():
    cfg = make_config(device_kind="cpu", quick=True, parts=("collectives",), min_size=KiB, max_size=64 * KiB)
    assert BenchConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(UsageError):
        make_config(device_kind="tpu", quick=True)
    with pytest.raises(ValueError):
        make_config(device_kind="cpu", quick=True, parts=("bogus",))


def test_the_workers_are_a_launch_request_and_the_parent_env_is_untouched(tmp_path):
    """bench's ranks start through the launch API: its plan, its shim (``torchrig.launch.worker``), its logs."""
    before = dict(os.environ)
    cfg = make_config(device_kind="cpu", quick=True)
    job = worker_job(cfg, 2, str(tmp_path))
    req = job.request
    assert (req.cpu, req.nproc_per_node, req.gpus, req.module) == (True, 2, None, True)
    assert req.script == "torchrig.bench.worker"
    assert req.script_args == ("--config", job.config_path, "--out", job.out_path)
    host = HostFacts(visible_gpus=(), cpu_count=4, python="/usr/bin/python3", env={})
    plan = build_plan(req, host, free_port=29999)
    assert plan.argv[:3] == ("/usr/bin/python3", "-m", "torch.distributed.run")
    assert "--nproc-per-node=2" in plan.argv and plan.backend == "gloo"
    tail = plan.argv[plan.argv.index("torchrig.launch.worker") :]
    assert tail[:3] == ("torchrig.launch.worker", "--module", "torchrig.bench.worker")
    assert plan.env["TORCHRIG_LOG_DIR"] == str(tmp_path / "logs")
    assert dict(os.environ) == before


def test_the_gpu_workers_run_on_the_gpus_placement_chose(tmp_path):
    cfg = make_config(device_kind="cuda", quick=True)
    job = worker_job(cfg, 2, str(tmp_path), gpus="1,3", force=True)
    assert (job.request.cpu, job.request.nproc_per_node, job.request.gpus) == (False, None, "1,3")
    assert job.request.force
    host = HostFacts(visible_gpus=(0, 1, 2, 3), cpu_count=8, python="python3", env={})
    plan = build_plan(job.request, host, free_port=29999)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1,3" and plan.backend == "nccl" and plan.nproc_per_node == 2


def test_group_sizes_and_rotation():
    assert group_sizes(1) == [1] and group_sizes(2) == [1, 2] and group_sizes(8) == [1, 2, 4, 8]
    assert group_sizes(6) == [1, 2, 4, 6]
    assert rotation_sets(256 * MiB, 50 * MiB) == 1  # one bf16 8192² pair already spans 4x the L2
    assert rotation_sets(128 * MiB, 50 * MiB) == 2
    assert rotation_sets(MiB, 50 * MiB) == 8  # capped
    assert rotation_sets(MiB, None) == 1
