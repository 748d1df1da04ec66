"""The trainer's options: one argparse group built from ``TrainConfig``'s fields, shared by ``torchrig train``
and the per-rank entry point ``python -m torchrig.train`` (which imports no CLI module).

Fields named ``test_*`` are fault-injection hooks for torchrig's own tests (kill a rank at a step, stop one
joining collectives): they parse as usual but stay out of ``--help``.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from torchrig.argtypes import INT64, MAX_COUNT, MAX_SEED, float_in, int_in
from torchrig.train.fp8 import TORCHAO_VERSION as _FP8_TORCHAO

TEST_HOOK_PREFIX = "test_"  # TrainConfig fields for torchrig's own tests: accepted, never listed in --help

_HELP = {
    "model": "gpt or resnet (gpt)",
    "size": "gpt: tiny, mini, small (GPT-2 124M), medium, large, xl; resnet: tiny, resnet18, resnet34 (tiny)",
    "data": "synthetic, generated (learnable, the default), a token file (.bin/.npy) or an image folder",
    "seq_len": "GPT context length (default: the size's)",
    "micro_batch": "samples per rank per micro-step (8)",
    "grad_accum": "micro-steps per optimizer step (1)",
    "steps": "optimizer steps in total (100)",
    "parallel": "auto (ddp with several ranks), ddp, fsdp, none",
    "precision": "auto (bf16 on GPU), bf16, fp16, fp32, or fp8: torchao's float8 training for the Linear "
    "layers (bf16 for the rest; a GPU of compute capability 8.9+ and torchao "
    f"{_FP8_TORCHAO}), e.g. --precision fp8 --compile",
    "fp8_recipe": "with --precision fp8: rowwise (the default: a scale per row), tensorwise (one scale per "
    "tensor, fastest) or rowwise_with_gw_hp (weight gradient in bf16, most accurate)",
    "compile": "torch.compile the model",
    "compile_mode": "torch.compile mode with --compile: auto (reduce-overhead on GPUs without FSDP, else default), default, reduce-overhead (CUDA graphs: less host time "
    "per step), max-autotune, max-autotune-no-cudagraphs",
    "compile_tuning": "with --compile: let Inductor tune the launch settings of the kernels it generates "
    "(norms, GELU, the loss) by coordinate descent; a longer first compile",
    "step_graph": "with --compile on one GPU: auto, on (the whole optimizer step, forward to AdamW, captured once "
    "as one CUDA graph and replayed: no host time between its kernels, the same numerics), off",
    "attention": "the attention kernel on GPUs: auto (PyTorch's choice), cudnn (cuDNN's fused attention), "
    "flash, efficient, math",
    "loss": "the GPT head's loss: auto (fused on GPUs without FSDP), fused (the output projection and the "
    "cross-entropy in one step that never keeps the logits: less memory and time, the same numerics), plain "
    "(F.cross_entropy over the logits)",
    "ddp_compile": "with --compile and DDP: outer (the default) = compile(DDP(model)), all-reduce overlapped "
    "with the backward, measured faster on 2xH200; inner = DDP(compile(model)), all-reduce after the backward",
    "ddp_bucket_mb": "DDP gradient bucket size in MB (default 100; PyTorch's own is 25: fewer, larger buckets measured faster with compile(DDP))",
    "ddp_static_graph": "tell DDP the graph never changes (static_graph=True)",
    "ddp_overlap_embeddings": "all-reduce the embeddings' gradient (complete only when the backward ends) "
    "outside DDP while the optimizer steps the other parameters; the same update (default: on)",
    "ddp_comm_hook": "none, or bf16: all-reduce gradients in bf16 (half the bytes; changes numerics slightly)",
    "device": "auto, cuda or cpu",
    "out": "run folder (torchrig-run)",
    "ckpt_every": "checkpoint every N steps (0: only the final one)",
    "resume": "continue the run in --out from its newest intact checkpoint (none: an error, exit 2)",
    "resume_if_possible": "like --resume, but start at step 0 when --out has no checkpoint yet (for jobs a "
    "scheduler may start again)",
    "overwrite": "start a new run in an --out that holds another run, removing that run's checkpoints and "
    "metrics (without it such an --out is refused)",
    "log_every": "log (one host sync) every N steps (10)",
    "peak_tflops": "peak TFLOP/s for MFU (default: from the knowledge base)",
    "workers": "DataLoader workers per rank (2)",
    "profile_steps": "profile the last N steps with torch.profiler: a Chrome trace per rank in OUT/profile/ and "
    "where each step's GPU time went (compute, NCCL, NCCL not hidden behind compute, idle); those steps are "
    "left out of the throughput (0: off)",
    "profiler": "what records the --profile-steps window: torch (torch.profiler: a trace and the breakdown), or "
    "cuda (cudaProfilerStart/Stop around those steps, each step an NVTX range, for a profiler outside "
    "torchrig: nsys profile --capture-range=cudaProfilerApi, ncu --profile-from-start off)",
    "on_nonfinite": "a step whose loss or gradients are NaN/inf: stop (the default: exit 1, checked at every "
    "log step and before every save, so no such checkpoint is written) or skip (drop that step's update; one "
    "host sync per step; stops after 10 in a row)",
    "gc_every": "run Python's garbage collector every N steps, at the same step on every rank, instead of "
    "whenever Python decides: one rank paused by a collection holds the others up (50; 0: Python's automatic "
    "collection)",
}


# Upper bounds of TrainConfig's integers (its __post_init__ checks the lower ones, with their reasons);
# every other integer field is at most MAX_COUNT, every float finite.
_INT_LIMITS = {
    "seed": (0, MAX_SEED),  # numpy and DataLoader workers take 32-bit seeds
    "micro_batch": (-INT64, 2**20),
    "image_size": (-INT64, 8192),
    "num_classes": (-INT64, 10**7),
    "workers": (-INT64, 256),  # DataLoader processes per rank
    "seq_len": (-INT64, 2**24),
}


def _number_type(name: str, kind: type) -> Any:
    if kind is float:
        return float_in(-1e30, 1e30)
    lo, hi = _INT_LIMITS.get(name, (-INT64, MAX_COUNT))
    return int_in(lo, hi)


def add_train_options(parser: argparse.ArgumentParser) -> None:
    from torchrig.train.config import TrainConfig

    g = parser.add_argument_group("training")
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = (
            argparse.SUPPRESS
            if f.name.startswith(TEST_HOOK_PREFIX)
            else _HELP.get(f.name, f"(default {f.default})")
        )
        if f.type in ("bool", bool):
            g.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
            )
            continue
        kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
        typ = _number_type(f.name, kind) if kind in (int, float) else kind
        g.add_argument(flag, dest=f.name, type=typ, default=f.default, help=help_text)


def config_from_args(args: argparse.Namespace) -> Any:
    from torchrig.train.config import TrainConfig

    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
