"""Init and teardown: process group, device, precision, and wrapping the model (DDP or FSDP2, compile)."""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchrig.errors import UsageError
from torchrig.train.config import (
    FUSED_MLP_AUTO,
    TrainConfig,
    fused_mlp_backward,
    step_graph_conflict,
    tuned_gemms,
)


@dataclass(frozen=True)
class Runtime:
    rank: int
    local_rank: int
    world: int
    device: torch.device
    precision: str  # "bf16", "fp16", "fp32" or "fp8" (float8 Linear layers, bf16 autocast for the rest)
    parallel: str  # "ddp", "fsdp" or "none"
    restart: int  # torchelastic's restart count (0 on the first attempt)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(cfg: TrainConfig) -> Runtime:
    """Join the process group when started by torchrun (WORLD_SIZE set), pick the device and precision."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = _device(cfg, local)
    want_cuda = device.type == "cuda"
    err = device_refusal(cfg, device)  # before joining the process group: nothing to tear down
    if err is not None:
        raise err
    _compile_settings(cfg, device)
    if world > 1:
        timeout = datetime.timedelta(seconds=int(os.environ.get("TORCHRIG_COLLECTIVE_TIMEOUT_S", "600")))
        dist.init_process_group(
            "nccl" if want_cuda else "gloo", timeout=timeout, device_id=device if want_cuda else None
        )
    return Runtime(
        rank,
        local,
        world,
        device,
        _precision(cfg, want_cuda),
        _parallel(cfg, world),
        int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )


def device_refusal(cfg: TrainConfig, device: torch.device) -> UsageError | None:
    """What ``device`` cannot do of ``cfg`` (None: nothing): fp8 without fp8 tensor cores or torchao,
    ``--profiler cuda`` without a GPU (refused at start, not at the profiled steps at the run's end)."""
    want_cuda = device.type == "cuda"
    if cfg.precision == "fp8":
        from torchrig.train import fp8

        capability = torch.cuda.get_device_capability(device) if want_cuda else None
        err = fp8.problem(device.type, capability, fp8.torchao_version())
        if err is not None:
            return err
    if cfg.profiler == "cuda" and not want_cuda:
        return UsageError(
            "--profiler cuda needs a CUDA GPU (it calls cudaProfilerStart and cudaProfilerStop); this run "
            "found none",
            hint="use --profiler torch, or run on a machine where torch.cuda.is_available()",
        )
    return None


def check_device(cfg: TrainConfig) -> None:
    """:func:`device_refusal` for a run in this process, before ``torchrig train`` takes its run folder: a
    refused run leaves no folder and no lock file behind."""
    err = device_refusal(cfg, _device(cfg, int(os.environ.get("LOCAL_RANK", "0"))))
    if err is not None:
        raise err


def _device(cfg: TrainConfig, local_rank: int) -> torch.device:
    """This rank's device (``--device``; auto: its GPU when torch sees one), set up for training."""
    want_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if want_cuda and not torch.cuda.is_available():
        raise UsageError(
            "--device cuda but torch sees no GPU", hint="run 'torchrig doctor', or use --device cpu"
        )
    if not want_cuda:
        return torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    # TF32 for the fp32 matmuls that remain outside autocast (PyTorch's CUDA semantics notes).
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    _attention_backend(cfg.attention)
    return device


def mix_order_reduction_off(device: Any) -> bool:
    """Whether the trainer turns Inductor's mix-order reduction off: on Hopper GPUs (compute capability 9.x),
    unless the user chose with ``TORCHINDUCTOR_MIX_ORDER_REDUCTION`` (Inductor's own variable, read at import).

    The mix-order reduction computes the LayerNorm backward's row sums and its weight/bias column sums in
    one kernel. On an H100 (torch 2.11, GPT-2 small, micro-batch 16) the step with separate kernels ran
    1.3-1.4 % faster in three pairs of runs, its loss within 0.0003 of the fused kernel's
    (docs/results/training-speed.md)."""
    if "TORCHINDUCTOR_MIX_ORDER_REDUCTION" in os.environ or getattr(device, "type", None) != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def _compile_settings(cfg: TrainConfig, device: Any = None) -> None:
    """Inductor's settings for ``--compile-tuning``, the mix-order reduction (off on Hopper) and
    ``TORCHRIG_INDUCTOR_CONFIG`` (applied last, so it can set anything back), before anything compiles."""
    if not cfg.compile:
        return
    import torch._inductor.config as inductor_config

    if mix_order_reduction_off(device) and hasattr(inductor_config.triton, "mix_order_reduction"):
        inductor_config.triton.mix_order_reduction = False
    if cfg.compile_tuning:
        # Tunes block sizes and warps of each generated kernel, measured on the GPU at compile time (the
        # results go into Inductor's cache with the kernel).
        inductor_config.coordinate_descent_tuning = True
    if os.environ.get("TORCHRIG_INDUCTOR_CONFIG"):
        inductor_settings(os.environ["TORCHRIG_INDUCTOR_CONFIG"])


def _precision(cfg: TrainConfig, want_cuda: bool) -> str:
    """``--precision`` resolved: auto is bf16 on a GPU that has it, else fp32; fp16 needs a GPU."""
    precision = cfg.precision
    if precision == "auto":
        precision = "bf16" if want_cuda and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "fp16" and not want_cuda:
        raise UsageError("--precision fp16 needs a GPU", hint="use bf16 or fp32 on the CPU")
    return precision


def _parallel(cfg: TrainConfig, world: int) -> str:
    """``--parallel`` resolved after joining the process group: auto is ddp on several ranks, none on one."""
    parallel = cfg.parallel
    if parallel == "auto":
        parallel = "ddp" if world > 1 else "none"
    if parallel != "none" and world == 1 and not dist.is_initialized():
        parallel = "none"  # one process: nothing to synchronise
    if parallel == "none" and world > 1:
        raise UsageError(
            "--parallel none with several ranks would train diverging copies", hint="use ddp or fsdp"
        )
    return parallel


def inductor_settings(spec: str) -> dict[str, Any]:
    """``TORCHRIG_INDUCTOR_CONFIG="aggressive_fusion=1,triton.mix_order_reduction=1"`` (speed levers under
    measurement, tools/gpu/train_levers.py): set those ``torch._inductor.config`` entries (dotted names
    reach its sub-configs) before torch.compile runs; returns what was set. Not every entry pays: on an H100,
    ``combo_kernels=1,benchmark_combo_kernel=1`` halved GPT-2 small's tokens/s (docs/results/training-speed.md)."""
    import torch._inductor.config as inductor_config

    done: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        key, eq, raw = item.partition("=")
        *path, name = key.strip().split(".")
        owner: Any = inductor_config
        for part in path:
            owner = getattr(owner, part, None)
        if not eq or owner is None or not hasattr(owner, name):
            raise UsageError(
                f"TORCHRIG_INDUCTOR_CONFIG: {item!r} is not NAME=VALUE of an entry of torch._inductor.config",
                hint="unset it, or name entries torch._inductor.config has (e.g. aggressive_fusion=1)",
            )
        old = getattr(owner, name)
        value: Any = raw.strip()
        if isinstance(old, bool) or value.lower() in ("true", "false"):
            value = value.lower() in ("1", "true")
        elif isinstance(old, int):
            value = int(value) if value.lstrip("-").isdigit() else value
        setattr(owner, name, value)
        done[key.strip()] = value
    return done


def low_precision(model: nn.Module, rt: Runtime, cfg: TrainConfig) -> list[str]:
    """``--precision fp8``: swap the qualifying Linear layers for torchao's Float8Linear, in place, before
    ``wrap`` compiles and wraps the model (torchao and torchtitan convert first). The parameters keep their
    names and fp32 values, so checkpoints and the optimizer see the same model. Returns the converted layers'
    names ([] for other precisions).

    Under FSDP2 the parameters are all-gathered in fp32 and cast to fp8 per layer (torchao's default,
    ``enable_fsdp_float8_all_gather=False``; torchtitan's rowwise recipes communicate in high precision too).
    """
    if rt.precision != "fp8":
        return []
    from torchrig.train import fp8

    return fp8.convert(model, cfg.fp8_recipe, compiled=cfg.compile)


def outside_ddp(model: nn.Module, rt: Runtime, cfg: TrainConfig) -> list[nn.Parameter]:
    """The parameters the trainer all-reduces itself, outside DDP (``--ddp-overlap-embeddings``), or []."""
    if rt.parallel != "ddp" or rt.world < 2 or not cfg.ddp_overlap_embeddings:
        return []
    from torchrig.train import lategrads

    return lategrads.late_params(model)


def wrap(
    model: nn.Module, rt: Runtime, cfg: TrainConfig, late: list[nn.Parameter] | None = None
) -> nn.Module:
    """The module the loop calls: FSDP2 (shard, then compile) or DDP with ``cfg``'s DDP knobs, or the model.

    DDP with ``--ddp-compile inner`` is DDP(compile(model)); ``outer`` is compile(DDP(model)), where dynamo's
    DDP optimizer splits the graph at bucket boundaries so the all-reduce can overlap the backward. DDP
    leaves out the ``late`` parameters (dynamo's DDP optimizer honours that too): the loop all-reduces them.
    """
    if rt.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        blocks = list(getattr(model, "blocks", []))
        if cfg.compile and blocks:
            # Compile each block, then shard (torchtitan's order). torch.compile of the whole sharded model
            # makes dynamo skip the model's forward: FSDP2's hooks break the graph inside the loop over the
            # blocks, and a graph break in a loop drops the whole frame to eager.
            # dynamic=False: blocks of different widths (ResNet's stages) each get a static graph instead of
            # one dynamic-shape graph after the second width.
            for blk in blocks:
                blk.compile(mode=_mode(cfg, rt), dynamic=False)
            head = getattr(model, "head_loss", None)  # the models' part after the blocks
            if callable(head):
                model.__dict__["head_loss"] = torch.compile(head, mode=_mode(cfg, rt))
        for blk in blocks:
            fully_shard(blk)
        fully_shard(model)
        return _compile(model, cfg, rt) if cfg.compile and not blocks else model
    if rt.parallel != "ddp":
        return _compile(model, cfg, rt) if cfg.compile else model
    outer = cfg.compile and cfg.ddp_compile == "outer"
    inner = _compile(model, cfg, rt) if cfg.compile and not outer else model
    ddp = _ddp(inner, rt, cfg, late or [])
    return _compile(ddp, cfg, rt) if outer else ddp


def compile_mode(cfg: TrainConfig, rt: Runtime) -> str:
    """``--compile-mode`` with ``auto`` resolved: default under the step graph (it captures the whole step
    itself); reduce-overhead (CUDA graphs: the model's kernels launched as graphs, no host time between them)
    on GPUs where the step's shapes are static, i.e. not under FSDP2, which frees and gathers the parameters
    every step; default elsewhere (CPU has no graphs)."""
    if cfg.compile_mode != "auto":
        return cfg.compile_mode
    if step_graph(cfg, rt):
        return "default"
    return "reduce-overhead" if rt.device.type == "cuda" and rt.parallel != "fsdp" else "default"


def step_graph_refusal(cfg: TrainConfig, rt: Runtime) -> str | None:
    """Why this run cannot capture its whole step as one CUDA graph (train/stepgraph.py); None: it can.
    The options' reasons (config.step_graph_conflict), then the runtime's."""
    conflict = step_graph_conflict(cfg)
    if conflict is not None:
        return conflict[0]
    if rt.device.type != "cuda":
        return "CUDA graphs need a GPU"
    if rt.world > 1 or rt.parallel != "none":
        return f"{rt.world} processes ({rt.parallel}): the step graph runs one process on one GPU"
    return None


def step_graph(cfg: TrainConfig, rt: Runtime) -> bool:
    """``--step-graph`` resolved: on when asked and possible (asked and impossible is a usage error);
    auto: off until measured faster (docs/results/training-speed.md)."""
    if cfg.step_graph == "off":
        return False
    why = step_graph_refusal(cfg, rt)
    if cfg.step_graph == "on" and why is not None:
        raise UsageError(f"--step-graph on cannot be used here: {why}", hint="leave --step-graph out (auto)")
    return cfg.step_graph == "on"


def fused_loss(cfg: TrainConfig, rt: Runtime) -> bool:
    """``--loss`` resolved for a GPT: ``auto`` is fused on GPUs outside FSDP2 (measured there:
    docs/results/training-speed.md), plain elsewhere; ResNets have no vocabulary-sized head."""
    if cfg.model != "gpt" or cfg.loss == "plain":
        return False
    return cfg.loss == "fused" or (rt.device.type == "cuda" and rt.parallel != "fsdp")


def gpt_kernels(model: nn.Module, rt: Runtime, cfg: TrainConfig) -> tuple[int, int | None]:
    """The GPT's own kernels, in this order: the fused loss (``--loss``), the fused MLP
    (``TORCHRIG_FUSED_MLP``), then the timed GEMMs (``TORCHRIG_TUNED_GEMMS``), which time the fused MLP's
    GEMMs too. Returns how many blocks run the fused MLP (0: none) and how many GEMM shapes run another
    algorithm than PyTorch's (None: not timed)."""
    if fused_loss(cfg, rt):
        model.fused_loss = True  # type: ignore[assignment,unused-ignore]  # only with torch installed
    blocks = fused_mlp(model, rt, cfg.compile)
    return blocks, tuned_gemm_shapes(model, rt, cfg)


def fused_mlp(model: nn.Module, rt: Runtime, compiled: bool) -> int:
    """``TORCHRIG_FUSED_MLP`` (train/fusedmlp.py): the GPT blocks' MLPs run with the GELU in cuBLASLt's GEMM
    epilogues, on one GPU under bf16; returns how many blocks do (0: off). ``auto`` (unset) takes
    ``config.FUSED_MLP_AUTO`` (``dgelu``) where it was measured faster than Inductor's kernels: compiled, on a
    Hopper GPU (compute capability 9.x; 1.7-3.2 % a step on an H100, docs/results/training-speed.md), after a
    small check that the fused MLP gives the plain one's results there. A named backward (``1`` is ``bgrad``;
    ``dgelu``, ``plain``, ``triton``: config.FUSED_MLP_BACKWARDS) runs wherever it can, compiled or not."""
    choice = fused_mlp_backward()  # config.py's: a bad value was refused before the run folder was taken
    if not choice or rt.device.type != "cuda" or rt.precision != "bf16" or rt.parallel != "none":
        return 0
    if choice == "auto" and (not compiled or torch.cuda.get_device_capability(rt.device)[0] != 9):
        return 0
    backward = FUSED_MLP_AUTO if choice == "auto" else choice
    from torchrig.train import cublaslt, fusedmlp
    from torchrig.train.models import Block

    # the epilogue's aux matrix (the GELU's input) needs a leading dimension that is a multiple of 8
    blocks = [m for m in model.modules() if isinstance(m, Block) and m.fc.in_features % 8 == 0]
    if not blocks:
        return 0
    try:
        fusedmlp.prepare(rt.device)  # before the first compiled step: see cublaslt.prepare
        fusedmlp.check(rt.device, blocks[0].fc.in_features, blocks[0].fc.out_features, backward)
    except cublaslt.CublasLtError as e:
        value = os.environ.get("TORCHRIG_FUSED_MLP", "auto").strip() or "auto"
        print(f"torchrig train: TORCHRIG_FUSED_MLP={value}: the fused MLP stays off: {e}", file=sys.stderr)
        return 0
    for m in blocks:
        m.fused_mlp = backward
    return len(blocks)


def tuned_gemm_shapes(model: nn.Module, rt: Runtime, cfg: TrainConfig) -> int | None:
    """``TORCHRIG_TUNED_GEMMS=1`` (train/ltgemm.py): on one GPU under bf16, a GPT's GEMMs run the fastest of
    cuBLASLt's algorithms for their shape, timed now in one eager forward and backward at the run's
    micro-batch (before anything compiles; the gradients it leaves are cleared, the random state kept).
    Off by default: slower in the compiled step (docs/results/training-speed.md). Returns how many shapes got
    an algorithm other than PyTorch's (0: none was faster), None where nothing was timed."""
    if not tuned_gemms() or cfg.model != "gpt" or rt.device.type != "cuda" or rt.precision != "bf16":
        return None
    if rt.parallel != "none":  # measured on one GPU only
        return None
    from torchrig.train import cublaslt, ltgemm
    from torchrig.train.models import Block

    try:
        cublaslt.prepare(rt.device)  # before the first compiled step: see cublaslt.prepare
    except cublaslt.CublasLtError as e:
        print(f"torchrig train: TORCHRIG_TUNED_GEMMS=1: PyTorch's GEMMs stay: {e}", file=sys.stderr)
        return None
    ltgemm.enable()
    for m in model.modules():
        if isinstance(m, Block):
            m.tuned_gemms = True
    vocab, context = int(model.config.vocab), cfg.context  # type: ignore[union-attr,arg-type,unused-ignore]

    def one_step() -> None:
        idx = torch.randint(0, vocab, (cfg.micro_batch, context), device=rt.device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, targets=idx)
        loss.backward()

    tuned = ltgemm.tune_model(one_step)
    model.zero_grad(set_to_none=True)
    print(f"torchrig train: TORCHRIG_TUNED_GEMMS=1: {tuned.line()}", file=sys.stderr)
    return tuned.chosen


def profiler(cfg: TrainConfig, rt: Runtime, trace_dir: Any) -> Any:
    """What records the ``--profile-steps`` window (train/profile.py): torch.profiler with its trace in
    ``trace_dir``, or (``--profiler cuda``) the CUDA profiler's window for a tool outside the process."""
    from torchrig.train.profile import CudaWindow, StepProfiler

    if cfg.profiler == "cuda":
        return CudaWindow(rt.device)
    return StepProfiler(trace_dir, rt.rank, rt.device)


def uses_cudagraphs(cfg: TrainConfig, rt: Runtime) -> bool:
    return (
        cfg.compile
        and rt.device.type == "cuda"
        and compile_mode(cfg, rt) in ("reduce-overhead", "max-autotune")
    )


def _attention_backend(choice: str) -> None:
    """Restrict ``scaled_dot_product_attention`` on GPUs to one kernel (the math kernel stays on as the
    fallback for shapes that kernel refuses); ``auto`` leaves PyTorch's own order. Process-wide flags, read when
    torch.compile traces the model, so set before it."""
    if choice == "auto":
        return
    b = torch.backends.cuda
    b.enable_cudnn_sdp(choice == "cudnn")
    b.enable_flash_sdp(choice == "flash")
    b.enable_mem_efficient_sdp(choice == "efficient")
    b.enable_math_sdp(True)


def _mode(cfg: TrainConfig, rt: Runtime | None = None) -> str | None:
    mode = compile_mode(cfg, rt) if rt is not None else cfg.compile_mode
    return None if mode in ("default", "auto") else mode


def _compile(module: nn.Module, cfg: TrainConfig, rt: Runtime) -> nn.Module:
    return torch.compile(module, mode=_mode(cfg, rt))  # type: ignore[return-value,unused-ignore]  # only with torch installed


def _ddp(module: nn.Module, rt: Runtime, cfg: TrainConfig, late: list[nn.Parameter]) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [rt.device.index] if rt.device.type == "cuda" else None
    if late:
        # By name as the wrapped module spells it (a compiled module prefixes "_orig_mod.").
        ids_late = {id(p) for p in late}
        names = [n for n, p in module.named_parameters() if id(p) in ids_late]
        DDP._set_params_and_buffers_to_ignore_for_model(module, names)
        with torch.no_grad():  # DDP broadcasts rank 0's parameters at start, but not the ones it ignores
            for p in late:
                dist.broadcast(p.data, src=0)
    ddp = DDP(
        module,
        device_ids=ids,
        gradient_as_bucket_view=True,
        bucket_cap_mb=cfg.ddp_bucket_mb,
        static_graph=cfg.ddp_static_graph,
    )
    if cfg.ddp_comm_hook == "bf16":
        if rt.device.type != "cuda":
            raise UsageError(
                "--ddp-comm-hook bf16 needs GPUs (PyTorch's bf16 hook runs on NCCL only)",
                hint="leave --ddp-comm-hook none on CPU ranks",
            )
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    return ddp


def optimizer(model: nn.Module, cfg: TrainConfig, rt: Runtime) -> torch.optim.Optimizer:
    """AdamW, weight decay on matrices only (not biases, norms); fused kernel on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kw: dict[str, Any] = {"fused": True} if rt.device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), **kw)


def bf16_weight_copies(model: nn.Module, opt: torch.optim.Optimizer, rt: Runtime, cfg: TrainConfig) -> int:
    """``TORCHRIG_BF16_WEIGHTS=1`` (a speed lever under measurement, off by default): bf16 copies of the
    Linear layers' weights kept by the optimizer step (train/optim.py), on one GPU or CPU process under bf16
    autocast; returns how many layers use them (0: off)."""
    if os.environ.get("TORCHRIG_BF16_WEIGHTS", "0") != "1" or rt.precision != "bf16" or rt.parallel != "none":
        return 0
    from torchrig.train.optim import keep_bf16_copies

    return keep_bf16_copies(model, opt).layers


def teardown() -> None:
    if dist.is_initialized():
        # Free DDP/FSDP wrappers (compiled models sit in reference cycles) while their process group still
        # exists: a reducer collected after destroy_process_group can abort the process at exit.
        import gc

        gc.collect()
        dist.destroy_process_group()
