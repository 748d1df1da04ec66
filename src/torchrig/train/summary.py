"""A run's summary: what ran (ranks, precision, parallelism, the levers), how fast (steady throughput with
warm-up, compile and profiled steps excluded; MFU), where the time went (``--profile-steps``) and every rank's
GPU clocks: one :class:`~torchrig.train.record.TrainSummary`, built here alone. Rank 0 writes it to
``OUT/summary.json`` and logs it as the ``end`` event of ``metrics.jsonl``; ``torchrig train`` prints it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch.distributed as dist

from torchrig.train import rundir, setup
from torchrig.train.record import DdpSummary, Fp8Summary, TrainSummary

if TYPE_CHECKING:
    from torchrig.train.job import Job, Run
    from torchrig.train.metrics import Metrics


def finish(job: Job, metrics: Metrics, run: Run) -> TrainSummary:
    """The run's summary (every rank), written by rank 0; closes ``metrics``."""
    cfg, rt = job.cfg, job.rt
    steady = metrics.steady(min(cfg.timing_warmup_steps, cfg.steps // 3), before_step=run.prof_first)
    gpus = [run.gpu]
    if dist.is_initialized() and rt.world > 1:  # every rank's GPU, in rank order (one small collective)
        gpus = [None] * rt.world
        dist.all_gather_object(gpus, run.gpu)
    summary = TrainSummary(
        steps=cfg.steps,
        resumed_from=run.start,
        final_loss=run.final_loss,
        world_size=rt.world,
        precision=rt.precision,
        parallel=rt.parallel,
        compile=cfg.compile,
        compile_mode=setup.compile_mode(cfg, rt) if cfg.compile else None,
        step_graph=job.step_graph is not None,
        attention=cfg.attention,
        loss=("fused" if setup.fused_loss(cfg, rt) else "plain") if cfg.model == "gpt" else None,
        fp8=Fp8Summary(cfg.fp8_recipe, len(job.fp8_layers), _torchao_version())
        if rt.precision == "fp8"
        else None,
        ddp=_ddp(job) if rt.parallel == "ddp" else None,
        bf16_weight_copies=job.weight_copies or None,
        fused_mlp_blocks=job.fused_mlp_blocks or None,
        tuned_gemm_shapes=job.tuned_gemm_shapes,
        gc_every=cfg.gc_every,
        on_nonfinite=cfg.on_nonfinite,
        skipped_steps=tuple(job.skipped),
        micro_batch=cfg.micro_batch,
        grad_accum=cfg.grad_accum,
        global_batch=job.global_batch,
        params=job.params,
        device=run.device_name or "cpu",
        rate_per_s=steady,
        mfu=steady * job.flops_per_unit / (rt.world * run.peak * 1e12) if steady and run.peak else None,
        peak_tflops=run.peak,
        peak_source=run.peak_source,
        elapsed_s=round(run.elapsed_s, 2),
        profile=run.profile,
        gpus=tuple(gpus) if any(gpus) else None,
        unit=job.unit,
    )
    if rt.is_main:
        data = summary.to_json()
        metrics.event(event="end", **data)
        # replaces a FIFO too
        rundir.atomic_write(job.out / "summary.json", json.dumps(data, indent=2) + "\n")
    metrics.close()
    return summary


def _ddp(job: Job) -> DdpSummary:
    cfg, late = job.cfg, job.late
    return DdpSummary(
        compile=cfg.ddp_compile,
        bucket_mb=cfg.ddp_bucket_mb,
        static_graph=cfg.ddp_static_graph,
        comm_hook=cfg.ddp_comm_hook,
        outside_ddp=tuple(
            n for n, p in job.model.named_parameters() if late and any(p is q for q in late.params)
        ),
    )


def _torchao_version() -> str | None:
    from torchrig.train.fp8 import torchao_version

    return torchao_version()
