"""What one rank's loop works with (:class:`Job`, built once by ``loop._build``) and where an attempt of the
run stands (:class:`Run`): shared by the loop (train/loop.py) and the summary (train/summary.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchrig.train.config import TrainConfig
from torchrig.train.finite import NonFiniteWatch
from torchrig.train.gpuwatch import GpuWatch
from torchrig.train.lategrads import LateGrads
from torchrig.train.record import GpuClocks, ProfileSummary
from torchrig.train.setup import Runtime

if TYPE_CHECKING:
    from torchrig.train.stepgraph import StepGraph


@dataclass
class Job:
    """Everything one rank's loop works with, built once by :func:`_build`."""

    cfg: TrainConfig
    rt: Runtime
    model: nn.Module  # the raw module: state dicts, clipping, the optimizer
    run_model: nn.Module  # what the loop calls: compiled and/or DDP/FSDP-wrapped
    opt: torch.optim.Optimizer
    dataset: Any
    spec: dict[str, Any]
    global_batch: int
    params: int
    flops_per_unit: float
    unit: str  # "tokens" or "images"
    units_per_step: int
    scaler: Any
    autocast: Any
    out: Path
    root: Path
    watch: GpuWatch | None = None  # this rank's GPU clocks and power (NVML); None on CPU or without NVML
    run_id: str = ""  # this run's id (OUT/run.json; every checkpoint's meta.json)
    late: LateGrads | None = None  # DDP only: gradients all-reduced outside DDP (--ddp-overlap-embeddings)
    fp8_layers: list[str] = dataclasses.field(
        default_factory=list
    )  # --precision fp8: the Float8Linear layers
    weight_copies: int = 0  # TORCHRIG_BF16_WEIGHTS=1: Linear layers using bf16 weight copies (train/optim.py)
    fused_mlp_blocks: int = (
        0  # TORCHRIG_FUSED_MLP=1: GPT blocks with the GELU in GEMM epilogues (train/fusedmlp.py)
    )
    # TORCHRIG_TUNED_GEMMS: GEMM shapes on another cuBLASLt algorithm (train/ltgemm.py); None: not timed
    tuned_gemm_shapes: int | None = None
    nonfinite: NonFiniteWatch | None = None  # the first step whose loss or gradients were NaN/inf
    skipped: list[int] = dataclasses.field(default_factory=list)  # --on-nonfinite skip: the steps skipped
    skipped_in_a_row: int = 0
    step_graph: StepGraph | None = None  # the whole step as one CUDA graph (train/stepgraph.py), once set up


@dataclass
class Run:
    """Where this attempt of the run stands: set by :func:`_begin`, filled in by :func:`_steps`."""

    start: int  # the step it resumed from (0: a new run)
    device_name: str | None  # the GPU's name; None on the CPU
    peak: float | None  # peak TFLOP/s for MFU (None: unknown)
    peak_source: str
    prof_first: int | None  # --profile-steps: the first profiled step
    final_loss: float | None = None
    profile: ProfileSummary | None = None  # --profile-steps (rank 0)
    gpu: GpuClocks | None = None  # this rank's GPU clocks and power over the steady steps
    elapsed_s: float = 0.0
