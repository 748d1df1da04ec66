"""The training loop: init -> data/model -> resume -> steps (accumulate, clip, step, log, checkpoint) -> teardown.

Run as ``python -m torchrig.train OPTIONS`` (that is what ``torchrig train`` and ``torchrig launch`` start on
each rank) or call :func:`train` with a :class:`~torchrig.train.config.TrainConfig`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchrig.errors import UsageError
from torchrig.train import checkpoint as ckpt
from torchrig.train.config import TrainConfig
from torchrig.train.data import batches, build_dataset
from torchrig.train.metrics import Metrics, peak_tflops, rewind_jsonl
from torchrig.train.models import build_model, model_spec
from torchrig.train.setup import Runtime, init, optimizer, teardown, wrap


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
        return float(model.flops_per_token(cfg.context))  # type: ignore[operator]
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
        return run_model.no_sync()  # type: ignore[operator]
    if rt.parallel == "fsdp":
        run_model.set_requires_gradient_sync(sync)  # type: ignore[operator]
    return contextlib.nullcontext()


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


def _resume(
    cfg: TrainConfig,
    rt: Runtime,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    root: Path,
    metrics: Metrics,
    global_batch: int,
) -> tuple[int, dict[str, Any]]:
    found = ckpt.latest(root) if cfg.resume else None
    if rt.is_main:
        if cfg.resume:
            rewind_jsonl(metrics.path, (found and ckpt.read_meta(found)["step"]) or 0)
        elif metrics.path.exists():
            metrics.path.unlink()
    if found is None:
        return 0, {}
    meta = ckpt.load(found, model, opt)
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


def _train(cfg: TrainConfig, rt: Runtime) -> dict[str, Any]:
    torch.manual_seed(cfg.seed)
    out, root = Path(cfg.out), Path(cfg.out) / "checkpoints"
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
    spec = model_spec(
        cfg.model,
        cfg.size_info,
        context=cfg.context,
        vocab=vocab,
        num_classes=n_out if cfg.model == "resnet" else cfg.num_classes,
        image_size=cfg.image_size,
    )
    model = build_model(
        cfg.model, cfg.size_info, context=cfg.context, vocab=vocab, num_classes=spec["num_classes"]
    ).to(rt.device)
    n_params = sum(p.numel() for p in model.parameters())
    per_unit = flops_per_unit(model, cfg, rt.device)
    run_model = wrap(model, rt, compile=cfg.compile)
    opt = optimizer(model, cfg, rt)
    ckpt.clean_partial(root)
    metrics = Metrics(out, cfg.steps, enabled=rt.is_main, tensorboard=cfg.tensorboard)
    start, meta = _resume(cfg, rt, model, opt, root, metrics, global_batch)
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
        global_batch=global_batch,
        params=n_params,
        device=device_name or "cpu",
        peak_tflops=peak,
        peak_source=peak_source,
    )
    unit = "tokens" if cfg.model == "gpt" else "images"
    units_per_step = global_batch * (cfg.context if cfg.model == "gpt" else 1)
    it = batches(
        ds,
        micro_batch=cfg.micro_batch,
        world=rt.world,
        rank=rt.rank,
        seed=cfg.seed,
        global_batch=global_batch,
        start_sample=start * global_batch,
        workers=cfg.workers,
        pin=rt.device.type == "cuda",
    )
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(rt.precision)
    autocast = (lambda: torch.autocast(rt.device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    scaler = torch.amp.GradScaler("cuda") if rt.precision == "fp16" else None
    if scaler is not None and meta.get("grad_scale"):
        scaler.update(float(meta["grad_scale"]))
    loss_sum = torch.zeros((), device=rt.device)
    last = {"step": start, "t": time.perf_counter()}
    final_loss = None
    t0 = time.perf_counter()
    for step in range(start + 1, cfg.steps + 1):
        _test_hooks(cfg, rt, step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        for micro in range(cfg.grad_accum):
            x, y = next(it)
            x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
            with _sync_context(run_model, rt, micro == cfg.grad_accum - 1), autocast():
                loss = run_model(x, y) / cfg.grad_accum
            (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += loss.detach()
        if scaler is not None:
            scaler.unscale_(opt)
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad) if cfg.clip_grad else None
        )
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0 or step == cfg.steps:
            final_loss = _log(
                step, last, loss_sum, grad_norm, rt, cfg, metrics, unit, units_per_step, per_unit, peak
            )
            loss_sum.zero_()
        if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or (step == cfg.steps and cfg.ckpt_final):
            _save(cfg, rt, root, step, model, opt, spec, global_batch, scaler)
            last["t"] = time.perf_counter()  # checkpoint time is not training throughput
    steady = metrics.steady(min(cfg.timing_warmup_steps, cfg.steps // 3))
    summary = {
        "steps": cfg.steps,
        "resumed_from": start,
        "final_loss": final_loss,
        "world_size": rt.world,
        "precision": rt.precision,
        "parallel": rt.parallel,
        "compile": cfg.compile,
        "micro_batch": cfg.micro_batch,
        "grad_accum": cfg.grad_accum,
        "global_batch": global_batch,
        "params": n_params,
        "device": device_name or "cpu",
        f"{unit}_per_s": steady,
        "mfu": steady * per_unit / (rt.world * peak * 1e12) if steady and peak else None,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "elapsed_s": round(time.perf_counter() - t0, 2),
    }
    if rt.is_main:
        import json

        metrics.event(event="end", **summary)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    metrics.close()
    return summary


def _log(
    step: int,
    last: dict[str, Any],
    loss_sum: torch.Tensor,
    grad_norm: torch.Tensor | None,
    rt: Runtime,
    cfg: TrainConfig,
    metrics: Metrics,
    unit: str,
    units_per_step: int,
    per_unit: float,
    peak: float | None,
) -> float:
    n = step - last["step"]
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
    rate = n * units_per_step / max(now - last["t"], 1e-9)
    rec = {
        "step": step,
        "loss": value,
        "lr": lr_at(step, cfg),
        "grad_norm": gn,
        f"{unit}_per_s": rate,
        "mfu": rate * per_unit / (rt.world * peak * 1e12) if peak else None,
        "world_size": rt.world,
        "restart": rt.restart,
    }
    metrics.step(rec, unit, last["step"] + 1)
    last["step"], last["t"] = step, now
    return value


def _save(
    cfg: TrainConfig,
    rt: Runtime,
    root: Path,
    step: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    spec: dict[str, Any],
    global_batch: int,
    scaler: Any,
) -> None:
    def crash_in_save() -> None:
        if cfg.test_kill_in_save == step and rt.is_main and not rt.restart:
            print(
                f"torchrig train: test hook: rank 0 killed during the save of step {step}",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)

    meta = {
        "global_batch": global_batch,
        "world_size": rt.world,
        "parallel": rt.parallel,
        "precision": rt.precision,
        "model_spec": spec,
        "config": {k: v for k, v in vars(cfg).items()},
        "grad_scale": float(scaler.get_scale()) if scaler is not None else None,
    }
    ckpt.save(root, step, model, opt, meta, keep=cfg.keep_ckpts, before_commit=crash_in_save)
