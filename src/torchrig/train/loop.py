"""The training loop: init -> data/model -> resume -> steps (accumulate, clip, step, log, checkpoint) -> teardown.

Run as ``python -m torchrig.train OPTIONS`` (that is what ``torchrig train`` and ``torchrig launch`` start on
each rank) or call :func:`train` with a :class:`~torchrig.train.config.TrainConfig`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchrig.errors import InputError, UsageError
from torchrig.train import checkpoint as ckpt
from torchrig.train import rundir, setup
from torchrig.train.config import TrainConfig
from torchrig.train.data import batches, build_dataset
from torchrig.train.gpuwatch import GpuWatch
from torchrig.train.lategrads import LateGrads
from torchrig.train.metrics import Metrics, peak_tflops, rewind_jsonl
from torchrig.train.models import build_model, model_spec
from torchrig.train.profile import StepProfiler
from torchrig.train.setup import Runtime, init, optimizer, outside_ddp, teardown, wrap


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def flops_per_unit(model: nn.Module, cfg: TrainConfig, device: torch.device) -> float:
    """Training FLOPs per token (GPT, PaLM's formula) or per image (ResNet: counted forward x 3)."""
    if cfg.model == "gpt":
        return float(model.flops_per_token(cfg.context))  # type: ignore[operator,unused-ignore]  # only with torch installed
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, 3, cfg.image_size, cfg.image_size, device=device)
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    model.train()
    return 3.0 * counter.get_total_flops()


def _sync_context(run_model: nn.Module, rt: Runtime, sync: bool) -> Any:
    """Skip gradient synchronisation on all but the last micro-step of an accumulation."""
    if rt.parallel == "ddp" and not sync:
        return run_model.no_sync()  # type: ignore[operator,unused-ignore]  # only with torch installed
    if rt.parallel == "fsdp":
        run_model.set_requires_gradient_sync(sync)  # type: ignore[operator,unused-ignore]  # only with torch installed
    return contextlib.nullcontext()


class Collector:
    """Python's garbage collection at fixed steps (``--gc-every N``), the same steps on every rank.

    The automatic collector pauses one rank's host at a moment of Python's choosing; with NCCL the other
    ranks then wait for it in the next collective, so every rank's pauses add up. torchtitan turns the
    automatic collector off for this reason and collects every N steps
    (https://github.com/pytorch/torchtitan/blob/main/torchtitan/tools/utils.py, ``GarbageCollection``).
    After the first step (compilation) the surviving objects are frozen, so later collections skip them.
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.was_enabled = gc.isenabled()
        if every:
            gc.disable()

    def after_step(self, step: int, first: int) -> None:
        if not self.every:
            return
        if step == first:
            gc.collect()
            gc.freeze()  # what compiling and building left behind stays out of later scans
        elif step % self.every == 0:
            gc.collect()

    def close(self) -> None:
        if self.every:
            gc.unfreeze()
            if self.was_enabled:
                gc.enable()


def _test_hooks(cfg: TrainConfig, rt: Runtime, step: int) -> None:
    if rt.restart:
        return
    if cfg.test_kill_at_step == step and rt.rank == cfg.test_kill_rank:
        print(
            f"torchrig train: test hook: rank {rt.rank} kills itself (SIGKILL) at step {step}",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.test_hang_at_step == step and rt.rank == cfg.test_hang_rank:
        print(
            f"torchrig train: test hook: rank {rt.rank} stops joining collectives at step {step}",
            file=sys.stderr,
            flush=True,
        )
        while True:
            time.sleep(3600)


def _start(cfg: TrainConfig, rt: Runtime, out: Path, root: Path) -> tuple[str, Path | None]:
    """Rank 0 decides how the run starts in its folder (train/rundir.py's rules), every rank follows: the
    run's id and the verified checkpoint to resume from (None: step 0)."""
    plan: Any = None
    if rt.is_main:
        try:
            plan = rundir.plan_start(
                out,
                resume=cfg.resume,
                if_possible=cfg.resume_if_possible,
                overwrite=cfg.overwrite,
                restart=rt.restart,
            )
        except UsageError as e:
            plan = (e.message, e.hint)
    plan = ckpt.agree(plan)
    if isinstance(plan, tuple):
        raise UsageError(plan[0], hint=plan[1])
    if plan.mode == "new":
        run_id = ckpt.agree(rundir.new_run_id())
        _claim(rt, out, plan, run_id)  # --overwrite: the previous run's outputs go first
        ckpt.clean_partial(root)
        return run_id, None
    ckpt.clean_partial(root)
    found, skipped = ckpt.find_intact(root)
    if found is None and (rundir.checkpoints(root) or rundir.unreadable(root)):
        raise UsageError(
            f"no intact checkpoint to resume from in {root}: {'; '.join(skipped)}",
            hint="restore the files, or start a new run with --overwrite or a fresh --out",
        )
    if skipped and rt.is_main:
        print(
            f"torchrig train: resuming from {found}, not a newer one: {'; '.join(skipped)}",
            file=sys.stderr,
            flush=True,
        )
    run_id = (ckpt.read_meta(found).get("run_id") if found else None) or plan.run_id
    run_id = ckpt.agree(run_id or rundir.new_run_id())
    _claim(rt, out, plan, run_id)
    return run_id, found


def _claim(rt: Runtime, out: Path, plan: rundir.Start, run_id: str) -> None:
    if rt.is_main:
        for line in rundir.claim(out, plan, run_id):
            print(f"torchrig train: {line}", file=sys.stderr, flush=True)
    if dist.is_initialized():
        dist.barrier()


_SAME_MODEL = "resume with the model options it was saved with, or train a new run in another --out"
# what the weights' shapes follow: the spec's own keys, and these of its size_info (not its sources, dates)
_SHAPE_KEYS = ("model", "context", "vocab", "num_classes")
_SIZE_SHAPE_KEYS = ("layers", "heads", "width", "vocab", "blocks")


def other_model(meta: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """How the model a checkpoint was saved with (its meta.json's ``model_spec`` and ``config``) differs from
    this run's, as "what: saved vs this run" items; None when they agree or the checkpoint records none."""
    saved = meta.get("model_spec")
    if not isinstance(saved, dict):
        return None

    def flat(s: dict[str, Any]) -> dict[str, Any]:
        got = s.get("size_info")
        info: dict[str, Any] = got if isinstance(got, dict) else {}
        out = {k: s.get(k) for k in _SHAPE_KEYS}
        out.update({k: info.get(k) for k in _SIZE_SHAPE_KEYS if k in info})
        if out.get("model") == "gpt":
            out.pop("num_classes", None)  # a GPT's weights do not depend on it
        return out

    was, now = flat(saved), flat(spec)

    def show(v: Any) -> str:  # one line whatever a meta.json holds
        return (repr(v) if isinstance(v, str) else str(v))[:40].encode("ascii", "replace").decode()

    diff = [f"{k} {show(was.get(k))} (saved) vs {show(now.get(k))}" for k in now if was.get(k) != now.get(k)]
    config = meta.get("config")
    size = config.get("size") if isinstance(config, dict) else None
    if diff and isinstance(size, str) and size.isprintable():
        diff.append(f"it was saved with --size {size[:40]}")
    return "; ".join(diff) or None


def _resume(
    cfg: TrainConfig,
    rt: Runtime,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    found: Path | None,
    resuming: bool,
    metrics: Metrics,
    global_batch: int,
    spec: dict[str, Any],
) -> tuple[int, dict[str, Any]]:
    # After an elastic restart (torchrun's --max-restarts) the group always continues from the last good
    # checkpoint: starting again from step 0 would repeat steps and throw the metrics away.
    if rt.is_main and resuming:
        rewind_jsonl(metrics.path, (found and ckpt.read_meta(found)["step"]) or 0)
    if found is None:
        return 0, {}
    try:
        meta = ckpt.load(found, model, opt)
    except InputError:
        try:
            other = other_model(ckpt.read_meta(found), spec)
        except (InputError, OSError, ValueError):  # its meta.json is the damage: the load's error says so
            other = None
        if other:  # not damage: the options build another model than the one saved
            raise UsageError(
                f"{found} holds another model than this run builds: {other}", hint=_SAME_MODEL
            ) from None
        raise
    if meta.get("global_batch") != global_batch:
        raise UsageError(
            f"{found} was saved with a global batch of {meta.get('global_batch')}, this run has "
            f"{global_batch}",
            hint="keep micro-batch x grad-accum x GPUs equal to resume exactly",
        )
    metrics.event(
        event="resume",
        step=meta["step"],
        checkpoint=found.name,
        restart=rt.restart,
        world_size=rt.world,
        saved_world_size=meta.get("world_size"),
    )
    return int(meta["step"]), meta


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train to ``cfg.steps``; returns the run's summary (also written to ``OUT/summary.json`` by rank 0)."""
    rt = init(cfg)
    try:
        return _train(cfg, rt)
    finally:
        teardown()


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


def _build(cfg: TrainConfig, rt: Runtime) -> Job:
    torch.manual_seed(cfg.seed)
    global_batch = cfg.micro_batch * cfg.grad_accum * rt.world
    vocab = int(cfg.size_info.get("vocab", 0)) or None
    ds, n_out = build_dataset(
        cfg.model,
        cfg.data,
        seq_len=cfg.context,
        vocab=vocab or 0,
        image_size=cfg.image_size,
        num_classes=cfg.num_classes,
        seed=cfg.seed,
        min_length=global_batch * cfg.steps,
    )
    classes = n_out if cfg.model == "resnet" else cfg.num_classes
    spec = model_spec(
        cfg.model,
        cfg.size_info,
        context=cfg.context,
        vocab=vocab,
        num_classes=classes,
        image_size=cfg.image_size,
    )
    model = build_model(cfg.model, cfg.size_info, context=cfg.context, vocab=vocab, num_classes=classes)
    model = model.to(rt.device)
    if setup.fused_loss(cfg, rt):
        model.fused_loss = True  # type: ignore[assignment,unused-ignore]  # only with torch installed
    per_unit = flops_per_unit(model, cfg, rt.device)  # before wrapping: counts the plain module
    fp8_layers = setup.low_precision(model, rt, cfg)  # --precision fp8: Float8Linear layers, same parameters
    late = outside_ddp(model, rt, cfg)
    run_model = wrap(model, rt, cfg, late)
    # fp8: the float8 Linear layers cast their own inputs; everything else runs under bf16 autocast
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(rt.precision)
    gpt = cfg.model == "gpt"
    opt = optimizer(model, cfg, rt)
    return Job(
        cfg=cfg,
        rt=rt,
        model=model,
        run_model=run_model,
        opt=opt,
        dataset=ds,
        spec=spec,
        global_batch=global_batch,
        params=sum(p.numel() for p in model.parameters()),
        flops_per_unit=per_unit,
        unit="tokens" if gpt else "images",
        units_per_step=global_batch * (cfg.context if gpt else 1),
        scaler=torch.amp.GradScaler("cuda") if rt.precision == "fp16" else None,
        autocast=(lambda: torch.autocast(rt.device.type, dtype=dtype)) if dtype else contextlib.nullcontext,
        out=Path(cfg.out),
        root=Path(cfg.out) / "checkpoints",
        late=LateGrads.for_backend(late) if late else None,
        fp8_layers=fp8_layers,
        weight_copies=setup.bf16_weight_copies(model, opt, rt, cfg),
    )


def _step(job: Job, step: int, it: Any, loss_sum: torch.Tensor) -> torch.Tensor | None:
    """One optimizer step of ``grad_accum`` micro-steps; returns the gradient norm (a tensor, no sync)."""
    cfg, rt = job.cfg, job.rt
    for group in job.opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    graphs = setup.uses_cudagraphs(cfg, rt)
    # With CUDA graphs a gradient that autograd stores as .grad (it does when .grad is None) lives in the
    # graph's own memory, which the next micro-step's replay overwrites. Accumulating over micro-steps then
    # needs .grad buffers of its own that autograd adds into: allocate them once and zero them in place.
    keep_grads = graphs and cfg.grad_accum > 1
    if keep_grads:
        for p in job.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    for micro in range(cfg.grad_accum):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be reused
        x, y = next(it)
        x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
        with _sync_context(job.run_model, rt, micro == cfg.grad_accum - 1), job.autocast():
            loss = job.run_model(x, y) / cfg.grad_accum
        (job.scaler.scale(loss) if job.scaler is not None else loss).backward()
        loss_sum += loss.detach()
    if job.late is not None:
        job.late.start()  # the embeddings' all-reduce, on NCCL's stream
        if job.scaler is not None or cfg.clip_grad:
            job.late.finish()  # a global norm and the GradScaler's inf check need every gradient
    if job.scaler is not None:
        job.scaler.unscale_(job.opt)
    norm = torch.nn.utils.clip_grad_norm_(job.model.parameters(), cfg.clip_grad) if cfg.clip_grad else None
    if job.scaler is not None:
        job.scaler.step(job.opt)
        job.scaler.update()
    elif job.late is not None and job.late.pending:
        job.late.step(job.opt)  # the other parameters while the all-reduce runs, then the embeddings
    else:
        job.opt.step()
    job.opt.zero_grad(set_to_none=not keep_grads)
    return norm


def _train(cfg: TrainConfig, rt: Runtime) -> dict[str, Any]:
    job = _build(cfg, rt)
    job.run_id, found = _start(cfg, rt, job.out, job.root)
    metrics = Metrics(job.out, cfg.steps, enabled=rt.is_main, tensorboard=cfg.tensorboard)
    resuming = cfg.resume or cfg.resume_if_possible or rt.restart > 0
    start, meta = _resume(cfg, rt, job.model, job.opt, found, resuming, metrics, job.global_batch, job.spec)
    if job.scaler is not None and meta.get("grad_scale"):
        job.scaler.update(float(meta["grad_scale"]))
    device_name = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else None
    peak, peak_source = peak_tflops(device_name, rt.precision, cfg.peak_tflops)
    metrics.event(
        event="start",
        step=start,
        world_size=rt.world,
        restart=rt.restart,
        precision=rt.precision,
        parallel=rt.parallel,
        compile=cfg.compile,
        global_batch=job.global_batch,
        params=job.params,
        device=device_name or "cpu",
        peak_tflops=peak,
        peak_source=peak_source,
    )
    it = batches(
        job.dataset,
        micro_batch=cfg.micro_batch,
        world=rt.world,
        rank=rt.rank,
        seed=cfg.seed,
        global_batch=job.global_batch,
        start_sample=start * job.global_batch,
        workers=cfg.workers,
        pin=rt.device.type == "cuda",
    )
    loss_sum = torch.zeros((), device=rt.device)
    last: dict[str, Any] = {"step": start, "t": time.perf_counter()}
    final_loss, t0 = None, time.perf_counter()
    # --profile-steps N: the last N steps run under torch.profiler, in a log interval of their own.
    prof_first = max(cfg.steps - cfg.profile_steps + 1, start + 1) if cfg.profile_steps else None
    profiler: StepProfiler | None = None
    profile: dict[str, Any] | None = None
    collector = Collector(cfg.gc_every)
    job.watch = GpuWatch.open(torch, rt.device)
    try:
        for step in range(start + 1, cfg.steps + 1):
            _test_hooks(cfg, rt, step)
            if step == prof_first:
                profiler = StepProfiler(job.out / "profile", rt.rank, rt.device)
                profiler.start()
            grad_norm = _step(job, step, it, loss_sum)
            collector.after_step(step, start + 1)
            if step == cfg.steps and profiler is not None:
                profile = profiler.stop(cfg.steps - (prof_first or step) + 1)
            if (
                step % cfg.log_every == 0
                or step == cfg.steps
                or (prof_first is not None and step == prof_first - 1)
            ):
                final_loss = _log(step, last, loss_sum, grad_norm, job, metrics, peak)
                loss_sum.zero_()
            if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or (step == cfg.steps and cfg.ckpt_final):
                _save(job, step)
                last["t"] = time.perf_counter()  # checkpoint time is not training throughput
        warm = start + min(cfg.timing_warmup_steps, cfg.steps // 3)
        gpu = job.watch.result(from_step=warm) if job.watch is not None else None
    finally:
        collector.close()
        if job.watch is not None:
            job.watch.close()
    elapsed = time.perf_counter() - t0
    return _finish(
        job, metrics, start, final_loss, elapsed, device_name, peak, peak_source, prof_first, profile, gpu
    )


def _finish(
    job: Job,
    metrics: Metrics,
    start: int,
    final_loss: float | None,
    elapsed_s: float,
    device_name: str | None,
    peak: float | None,
    peak_source: str,
    prof_first: int | None = None,
    profile: dict[str, Any] | None = None,
    gpu: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's summary: steady throughput (warm-up, compile and profiled steps excluded), MFU, profile."""
    cfg, rt = job.cfg, job.rt
    steady = metrics.steady(min(cfg.timing_warmup_steps, cfg.steps // 3), before_step=prof_first)
    gpus = [gpu]
    if dist.is_initialized() and rt.world > 1:  # every rank's GPU, in rank order (one small collective)
        gpus = [None] * rt.world
        dist.all_gather_object(gpus, gpu)
    summary = {
        "steps": cfg.steps,
        "resumed_from": start,
        "final_loss": final_loss,
        "world_size": rt.world,
        "precision": rt.precision,
        "parallel": rt.parallel,
        "compile": cfg.compile,
        "compile_mode": setup.compile_mode(cfg, rt) if cfg.compile else None,
        "attention": cfg.attention,
        "loss": ("fused" if setup.fused_loss(cfg, rt) else "plain") if cfg.model == "gpt" else None,
        "fp8": {"recipe": cfg.fp8_recipe, "layers": len(job.fp8_layers), "torchao": _torchao_version()}
        if rt.precision == "fp8"
        else None,
        "ddp": {
            "compile": cfg.ddp_compile,
            "bucket_mb": cfg.ddp_bucket_mb,
            "static_graph": cfg.ddp_static_graph,
            "comm_hook": cfg.ddp_comm_hook,
            "outside_ddp": [
                n
                for n, p in job.model.named_parameters()
                if job.late and any(p is q for q in job.late.params)
            ],
        }
        if rt.parallel == "ddp"
        else None,
        "bf16_weight_copies": job.weight_copies or None,
        "gc_every": cfg.gc_every,
        "micro_batch": cfg.micro_batch,
        "grad_accum": cfg.grad_accum,
        "global_batch": job.global_batch,
        "params": job.params,
        "device": device_name or "cpu",
        f"{job.unit}_per_s": steady,
        "mfu": steady * job.flops_per_unit / (rt.world * peak * 1e12) if steady and peak else None,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "elapsed_s": round(elapsed_s, 2),
        "profile": profile,
        "gpus": gpus if any(gpus) else None,
    }
    if rt.is_main:
        metrics.event(event="end", **summary)
        (job.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    metrics.close()
    return summary


def _torchao_version() -> str | None:
    from torchrig.train.fp8 import torchao_version

    return torchao_version()


def _log(
    step: int,
    last: dict[str, Any],
    loss_sum: torch.Tensor,
    grad_norm: torch.Tensor | None,
    job: Job,
    metrics: Metrics,
    peak: float | None,
) -> float:
    rt, n = job.rt, step - last["step"]
    loss = loss_sum / n
    if dist.is_initialized():
        dist.all_reduce(loss)  # the mean over ranks (gloo has no AVG)
        loss = loss / rt.world
    gn = None
    if grad_norm is not None:
        full = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        gn = float(full.item())
    value = float(loss.item())  # the one host sync of the interval
    now = time.perf_counter()
    if job.watch is not None:
        job.watch.sample(step)
    rate = n * job.units_per_step / max(now - last["t"], 1e-9)
    rec = {
        "step": step,
        "loss": value,
        "lr": lr_at(step, job.cfg),
        "grad_norm": gn,
        f"{job.unit}_per_s": rate,
        "mfu": rate * job.flops_per_unit / (rt.world * peak * 1e12) if peak else None,
        "world_size": rt.world,
        "restart": rt.restart,
    }
    metrics.step(rec, job.unit, last["step"] + 1)
    last["step"], last["t"] = step, now
    return value


def _save(job: Job, step: int) -> None:
    cfg, rt = job.cfg, job.rt

    def crash_in_save() -> None:
        if cfg.test_kill_in_save == step and rt.is_main and not rt.restart:
            print(
                f"torchrig train: test hook: rank 0 killed during the save of step {step}",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)

    meta = {
        "global_batch": job.global_batch,
        "world_size": rt.world,
        "parallel": rt.parallel,
        "precision": rt.precision,
        "model_spec": job.spec,
        "config": dict(vars(cfg)),
        "grad_scale": float(job.scaler.get_scale()) if job.scaler is not None else None,
    }
    ckpt.save(
        job.root,
        step,
        job.model,
        job.opt,
        meta,
        keep=cfg.keep_ckpts,
        run_id=job.run_id,
        before_commit=crash_in_save,
    )
