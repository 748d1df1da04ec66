"""The trainer's configuration: one frozen record, validated on construction, and the model sizes."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from torchrig.errors import UsageError
from torchrig.train.fp8 import RECIPES as FP8_RECIPES

MODELS = ("gpt", "resnet")
PARALLEL = ("auto", "ddp", "fsdp", "none")
PRECISION = ("auto", "bf16", "fp16", "fp32", "fp8")  # fp8: torchao float8 Linear layers + bf16 (train/fp8.py)
DEVICES = ("auto", "cuda", "cpu")
DDP_COMPILE = ("inner", "outer")
DDP_COMM_HOOKS = ("none", "bf16")
# torch.compile's modes (https://docs.pytorch.org/docs/stable/generated/torch.compile.html)
# plus "auto": reduce-overhead (CUDA graphs) on GPUs where the shapes are static, default elsewhere.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "auto")
# scaled_dot_product_attention's kernel on GPUs: auto (PyTorch's own order), or one backend with the math
# kernel as the fallback (https://docs.pytorch.org/docs/stable/backends.html#torch.backends.cuda.enable_cudnn_sdp)
ATTENTION = ("auto", "cudnn", "flash", "efficient", "math")
# the GPT head's loss: fused (the output projection and the cross-entropy in one step, train/fusedloss.py),
# plain (F.cross_entropy over the logits), auto (fused on GPUs without FSDP)
LOSSES = ("auto", "fused", "plain")
# what a step whose loss or gradients are NaN/inf does (train/finite.py; kept free of torch here)
NONFINITE_ACTIONS = ("stop", "skip")
# TORCHRIG_FUSED_MLP (train/fusedmlp.py): the GPT MLP's GELU in cuBLASLt's GEMM epilogues, and how its backward
# gets dpre (the GELU's input gradient) and fc's bias gradient. Unset or auto: FUSED_MLP_AUTO where it was
# measured faster (compiled, one Hopper GPU, bf16: docs/results/training-speed.md); 0: off; 1: bgrad
FUSED_MLP_BACKWARDS = {
    "bgrad": "both in one GEMM's epilogue (DGELU_BGRAD)",
    "dgelu": "dpre in the GEMM's epilogue (DGELU), the bias sum compiled apart",
    "plain": "the GEMM, then GELU's backward and the bias sum as compiled ops (only the forward is fused)",
    "triton": "the GEMM, then GELU's backward and the bias sum in one Triton kernel (train/gelubias.py)",
    "wbgrad": "dpre as dgelu; every Linear's bias gradient in its weight-gradient GEMM's epilogue (BGRADB)",
}
FUSED_MLP_AUTO = "dgelu"
STEP_GRAPHS = ("auto", "on", "off")  # the whole optimizer step as one CUDA graph (train/stepgraph.py)
# what records the --profile-steps window (train/profile.py): torch.profiler, or cudaProfilerStart/Stop for a
# profiler outside the process (nsys --capture-range=cudaProfilerApi, ncu --profile-from-start off)
PROFILERS = ("torch", "cuda")


@cache
def sizes() -> dict[str, dict[str, dict[str, Any]]]:
    """``sizes()["gpt"]["small"]`` -> ``{"layers": 12, ...}`` from ``sizes.toml``."""
    from torchrig.data import packaged

    data = packaged("torchrig.train", "sizes.toml")
    return {k: v for k, v in data.items() if k in MODELS}


@dataclass(frozen=True)
class TrainConfig:
    """Every option of ``torchrig train``; the field name is the option (``micro_batch`` -> ``--micro-batch``)."""

    model: str = "gpt"
    size: str = "tiny"
    data: str = "generated"  # synthetic | generated | a token file (.bin uint16, .npy) | an image folder
    seq_len: int | None = None  # GPT context (default: the size's block size)
    image_size: int = 32
    num_classes: int = 10
    micro_batch: int = 8
    grad_accum: int = 1
    steps: int = 100
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    clip_grad: float = 1.0  # 0: no clipping
    parallel: str = "auto"
    precision: str = "auto"
    fp8_recipe: str = "rowwise"  # with --precision fp8: torchao's scaling recipe (train/fp8.py)
    compile: bool = False
    # auto: reduce-overhead (CUDA graphs, no host time between the step's kernels) on GPUs without FSDP;
    # measured 1.3 % faster than default on 1x H200, same losses (docs/results/training-speed.md)
    compile_mode: str = "auto"
    compile_tuning: bool = False  # Inductor's coordinate-descent tuning of its kernels (longer compile)
    # The whole optimizer step (forward, backward, clipping, AdamW) captured once as one CUDA graph and
    # replayed (train/stepgraph.py): one process on one GPU, compiled, without fp16's GradScaler.
    step_graph: str = "auto"
    attention: str = "auto"  # the SDPA kernel on GPUs: auto, cudnn, flash, efficient, math
    loss: str = "auto"  # the GPT head's loss: auto, fused, plain
    # DDP knobs. inner: DDP(torch.compile(model)), the gradients leave the compiled backward all at once and
    # are all-reduced after it; outer: torch.compile(DDP(model)), dynamo splits the graph at DDP's buckets
    # so the all-reduce overlaps the backward. bf16 comm hook: gradients travel in bf16 (numerics change).
    ddp_compile: str = "outer"
    ddp_bucket_mb: float = 100.0  # measured on 2x H200: docs/benchmarks.md, run 6
    ddp_static_graph: bool = False
    ddp_comm_hook: str = "none"
    # All-reduce the embeddings' gradient (complete only when the backward ends) outside DDP, while the
    # optimizer steps the other parameters (train/lategrads.py).
    ddp_overlap_embeddings: bool = True
    device: str = "auto"
    out: str = "torchrig-run"
    ckpt_every: int = 0  # steps; 0: only at the end (when --ckpt-final)
    ckpt_final: bool = True
    keep_ckpts: int = 2
    resume: bool = False  # continue from OUT's newest intact checkpoint; none is an error
    resume_if_possible: bool = False  # the same, or step 0 when OUT has no checkpoint (scheduler jobs)
    overwrite: bool = False  # a new run replacing the run OUT holds (its checkpoints and metrics)
    log_every: int = 10
    seed: int = 0
    workers: int = 2
    peak_tflops: float | None = None
    tensorboard: bool = True
    timing_warmup_steps: int = 10  # steps excluded from the steady-state throughput
    profile_steps: int = 0  # profile the last N steps (torch.profiler): trace + GPU time breakdown
    profiler: str = "torch"  # what records those steps: torch.profiler, or cuda (an outside tool's window)
    # Python's collector runs only every N steps, at the same step on every rank (0: Python's automatic
    # collection): an automatic collection pauses one rank at a random moment and the others wait for it.
    gc_every: int = 50
    # a step whose loss or gradients are NaN/inf: stop the run (exit 1, before any such checkpoint) or skip
    # the step (train/finite.py)
    on_nonfinite: str = "stop"
    # Test hooks (for fault-tolerance tests and demos); each fires only on the first attempt.
    test_kill_at_step: int = 0
    test_kill_rank: int = 1
    test_kill_in_save: int = 0
    test_hang_at_step: int = 0
    test_hang_rank: int = 1
    test_compile_tolerance: float = 0.0  # > 0: the compile check's only tolerance (train/compilecheck.py)

    def __post_init__(self) -> None:
        """Each option against its row of the tables below, in their order: the first broken one is the
        error (one line, exit 2)."""
        if self.model not in MODELS:
            raise UsageError(f"unknown --model {self.model!r}", hint=f"choose from {', '.join(MODELS)}")
        if self.size not in sizes()[self.model]:
            from torchrig.fuzzy import did_you_mean

            names = list(sizes()[self.model])
            raise UsageError(
                f"unknown --size {self.size!r} for {self.model}",
                hint=did_you_mean(self.size, names) or f"choose from {', '.join(names)}",
            )
        for name, allowed in CHOICES:
            if getattr(self, name) not in allowed:
                raise UsageError(
                    f"unknown {_flag(name)} {getattr(self, name)!r}", hint=f"choose from {', '.join(allowed)}"
                )
        for name, least in AT_LEAST:
            if getattr(self, name) < least:
                wording = "at least 1" if least == 1 else "0 or more"
                raise UsageError(f"{_flag(name)} must be {wording}, got {getattr(self, name)}")
        for rule in RULES:
            if rule.broken(self):
                raise UsageError(rule.message(self), hint=rule.hint)

    @property
    def size_info(self) -> dict[str, Any]:
        return sizes()[self.model][self.size]

    @property
    def context(self) -> int:
        return self.seq_len or int(self.size_info.get("block_size", 0))

    def to_argv(self) -> list[str]:
        """The ``torchrig train`` options that rebuild this config (used to start the ranks)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else "--no-" + f.name.replace("_", "-"))
            else:
                out += [flag, str(value)]
        return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The closed sets: each option and the values it takes.
CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("parallel", PARALLEL),
    ("precision", PRECISION),
    ("device", DEVICES),
    ("ddp_compile", DDP_COMPILE),
    ("ddp_comm_hook", DDP_COMM_HOOKS),
    ("compile_mode", COMPILE_MODES),
    ("attention", ATTENTION),
    ("loss", LOSSES),
    ("fp8_recipe", FP8_RECIPES),
    ("on_nonfinite", NONFINITE_ACTIONS),
    ("step_graph", STEP_GRAPHS),
    ("profiler", PROFILERS),
)
# The lower bounds of the numbers (their upper bounds are the parser's: train/options.py).
AT_LEAST: tuple[tuple[str, int], ...] = (
    *((n, 1) for n in ("micro_batch", "grad_accum", "steps", "log_every", "image_size", "num_classes")),
    *(
        (n, 0)
        for n in (
            "ckpt_every",
            "warmup_steps",
            "workers",
            "keep_ckpts",
            "clip_grad",
            "weight_decay",
            "profile_steps",
            "gc_every",
        )
    ),
)


@dataclass(frozen=True)
class Rule:
    """A rule between options: when ``broken`` holds for a config, it is refused with ``message``."""

    broken: Callable[[TrainConfig], bool]
    message: Callable[[TrainConfig], str]
    hint: str | None = None


def step_graph_conflict(c: TrainConfig) -> tuple[str, str] | None:
    """The option that keeps this run's step out of one CUDA graph (train/stepgraph.py), as (why, the fix);
    None: the options allow it (the runtime's own reasons: setup.step_graph_refusal)."""
    if not c.compile:
        return "the run is not compiled", "add --compile"
    if c.compile_mode in ("reduce-overhead", "max-autotune"):
        return (
            f"--compile-mode {c.compile_mode} captures the model's own graphs, and graphs do not nest",
            "use --compile-mode auto or default",
        )
    if c.precision == "fp16":
        return (
            "fp16's GradScaler reads the gradients on the host every step",
            "use --precision bf16 (or fp32, fp8)",
        )
    if c.on_nonfinite == "skip":
        return (
            "--on-nonfinite skip decides on the host before each update",
            "use --on-nonfinite stop (the default)",
        )
    if c.parallel in ("ddp", "fsdp"):
        return (
            f"--parallel {c.parallel} runs several processes; the step graph runs one process on one GPU",
            "use --parallel none or auto with one process",
        )
    return None


def _seq_len_broken(c: TrainConfig) -> bool:
    return c.seq_len is not None and not 2 <= c.seq_len <= c.size_info.get("block_size", 1 << 30)


RULES: tuple[Rule, ...] = (
    Rule(
        lambda c: not c.lr > 0 or not 0 <= c.min_lr_ratio <= 1,
        lambda c: "--lr must be > 0 and --min-lr-ratio in 0..1",
    ),
    Rule(
        _seq_len_broken,
        lambda c: f"--seq-len must be 2..{c.size_info.get('block_size')} for this size, got {c.seq_len}",
    ),
    Rule(
        lambda c: c.ddp_comm_hook == "bf16" and c.device == "cpu",
        lambda c: "--ddp-comm-hook bf16 needs GPUs (PyTorch's bf16 hook runs on NCCL only)",
        "leave --ddp-comm-hook none with --device cpu",
    ),
    Rule(
        lambda c: c.precision == "fp8" and c.device == "cpu",
        lambda c: "--precision fp8 needs a CUDA GPU with fp8 tensor cores (compute capability 8.9 or newer)",
        "use --precision bf16 on the CPU",
    ),
    Rule(
        lambda c: c.precision == "fp8" and c.model != "gpt",
        lambda c: (
            f"--precision fp8 converts a model's Linear layers to float8; --model {c.model} has none "
            "to convert (its convolutions and classifier stay bf16)"
        ),
        "use --precision bf16",
    ),
    Rule(
        lambda c: c.fp8_recipe != "rowwise" and c.precision != "fp8",
        lambda c: f"--fp8-recipe {c.fp8_recipe} applies only with --precision fp8",
        "add --precision fp8, or leave --fp8-recipe out",
    ),
    Rule(
        lambda c: bool(c.profile_steps) and c.profile_steps >= c.steps,
        lambda c: f"--profile-steps {c.profile_steps} leaves no unprofiled step of --steps {c.steps}",
        "profile fewer steps than the run has (the profiled ones are left out of the throughput)",
    ),
    Rule(
        lambda c: c.profiler == "cuda" and not c.profile_steps,
        lambda c: (
            "--profiler cuda marks the --profile-steps window for a profiler outside torchrig, and "
            "--profile-steps is 0"
        ),
        "add --profile-steps N, e.g. ncu --profile-from-start off torchrig train ... --profile-steps 1 "
        "--profiler cuda",
    ),
    Rule(
        lambda c: c.profiler == "cuda" and c.device == "cpu",
        lambda c: "--profiler cuda needs a CUDA GPU (it calls cudaProfilerStart and cudaProfilerStop)",
        "use --profiler torch on the CPU",
    ),
    Rule(
        lambda c: c.parallel == "fsdp" and c.compile_mode in ("reduce-overhead", "max-autotune"),
        lambda c: (
            f"--compile-mode {c.compile_mode} uses CUDA graphs, which need fixed addresses; FSDP2 "
            "frees and gathers the parameters again every step"
        ),
        "use --compile-mode default or max-autotune-no-cudagraphs with --parallel fsdp",
    ),
    Rule(
        lambda c: c.step_graph == "on" and step_graph_conflict(c) is not None,
        lambda c: "--step-graph on cannot be used here: " + "; ".join(step_graph_conflict(c) or ()),
        "or leave --step-graph out (auto)",
    ),
    Rule(
        lambda c: not c.ddp_bucket_mb > 0,
        lambda c: f"--ddp-bucket-mb must be positive, got {c.ddp_bucket_mb}",
    ),
    Rule(
        lambda c: c.peak_tflops is not None and c.peak_tflops <= 0,
        lambda c: "--peak-tflops must be positive",
    ),
)


def tuned_gemms() -> bool:
    """``TORCHRIG_TUNED_GEMMS=1`` (train/ltgemm.py, a speed lever under measurement): the GPT's GEMMs by the
    fastest of cuBLASLt's algorithms, timed at start; unset or 0: PyTorch's. Any other value is a UsageError,
    checked (without torch) before the run folder is taken."""
    value = os.environ.get("TORCHRIG_TUNED_GEMMS", "0").strip()
    if value not in ("", "0", "1"):
        raise UsageError(
            f"TORCHRIG_TUNED_GEMMS={value!r} is not 0 or 1",
            hint="unset it (PyTorch's GEMMs) or set it to 1 (time cuBLASLt's algorithms at start)",
        )
    return value == "1"


def fused_mlp_backward() -> str:
    """``TORCHRIG_FUSED_MLP``'s choice: a backward of :data:`FUSED_MLP_BACKWARDS` (``1`` is ``bgrad``), ``auto``
    when unset or auto, "" when 0; any other value is a UsageError. No torch import: ``torchrig train`` checks
    it before it takes the run folder, also where it only launches the ranks."""
    value = os.environ.get("TORCHRIG_FUSED_MLP", "auto").strip()
    if value in ("", "auto"):
        return "auto"
    if value == "0":
        return ""
    backward = "bgrad" if value == "1" else value
    if backward not in FUSED_MLP_BACKWARDS:
        raise UsageError(
            f"TORCHRIG_FUSED_MLP={value!r} is not auto, 0, 1 or a backward ({', '.join(FUSED_MLP_BACKWARDS)})",
            hint="unset it (auto), set it to 0 (off), 1 (the epilogue computes the bias gradient too), dgelu, "
            "plain, triton or wbgrad",
        )
    return backward
