"""The training loop: init -> data/model -> resume -> steps (accumulate, clip, step, log, checkpoint) -> teardown.

Run as ``python -m torchrig.train OPTIONS`` (that is what ``torchrig train`` and ``torchrig launch`` start on
each rank) or call :func:`train` with a :class:`~torchrig.train.config.TrainConfig`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchrig.train import checkpoint as ckpt
from torchrig.train import compilecheck, finite, resume, rundir, setup, summary
from torchrig.train.config import TrainConfig
from torchrig.train.data import batches, build_dataset
from torchrig.train.finite import MAX_SKIPPED_IN_A_ROW, Diverged, NonFiniteWatch, any_rank, weights_finite
from torchrig.train.gpuwatch import GpuWatch
from torchrig.train.job import Job, Run
from torchrig.train.lategrads import LateGrads
from torchrig.train.logstep import LogReader
from torchrig.train.metrics import Metrics, peak_tflops
from torchrig.train.models import build_model, model_spec
from torchrig.train.record import TrainSummary
from torchrig.train.runstart import Start
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


def _hook_step(cfg: TrainConfig, rt: Runtime, step: int) -> bool:
    """A test hook fires on some rank at ``step``: every rank writes its queued log record first."""
    return not rt.restart and step in (cfg.test_kill_at_step, cfg.test_hang_at_step)


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


def train(cfg: TrainConfig, start: Start | None = None) -> TrainSummary:
    """Train to ``cfg.steps``; returns the run's summary (also written to ``OUT/summary.json`` by rank 0).
    ``start``: how the run starts in its folder, as ``torchrig train``'s plan decided it (train/plan.py);
    None: rank 0 follows the launcher's decision, or decides (train/resume.py)."""
    rt = init(cfg)
    try:
        with contextlib.ExitStack() as held:  # the run folder's lock, taken by rank 0 in resume.start
            return _train(cfg, rt, held, start)
    finally:
        teardown()


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
    fused_mlp_blocks, tuned_gemm_shapes = setup.gpt_kernels(model, rt, cfg)  # fused loss and MLP, timed GEMMs
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
        fused_mlp_blocks=fused_mlp_blocks,
        tuned_gemm_shapes=tuned_gemm_shapes,
        nonfinite=NonFiniteWatch(rt.device),
    )


def _graph_step(job: Job, _: Metrics, step: int, it: Any, loss_sum: torch.Tensor) -> torch.Tensor | None:
    """One optimizer step as one replay of the whole step's CUDA graph (train/stepgraph.py); as ``_step``."""
    assert job.step_graph is not None and job.nonfinite is not None  # --on-nonfinite stop: it never skips
    step_loss, norm, bad = job.step_graph.step(lr_at(step, job.cfg), it)
    job.nonfinite.note(step, bad)
    loss_sum += step_loss
    return norm


def _step(job: Job, metrics: Metrics, step: int, it: Any, loss_sum: torch.Tensor) -> torch.Tensor | None:
    """One optimizer step of ``grad_accum`` micro-steps; returns the gradient norm (a tensor, no sync).
    A step whose loss or gradients are NaN/inf is noted on the device (``--on-nonfinite stop``) or, with
    ``--on-nonfinite skip``, not applied (one sync: the decision comes before the optimizer steps)."""
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
    step_loss = torch.zeros((), device=rt.device)
    for micro in range(cfg.grad_accum):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be reused
        x, y = next(it)
        x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
        with _sync_context(job.run_model, rt, micro == cfg.grad_accum - 1), job.autocast():
            loss = job.run_model(x, y) / cfg.grad_accum
        (job.scaler.scale(loss) if job.scaler is not None else loss).backward()
        step_loss += loss.detach().float()
    if job.late is not None:
        job.late.start()  # the embeddings' all-reduce, on NCCL's stream
        if job.scaler is not None or cfg.clip_grad:
            job.late.finish()  # a global norm and the GradScaler's inf check need every gradient
    if job.scaler is not None:
        job.scaler.unscale_(job.opt)
    norm = torch.nn.utils.clip_grad_norm_(job.model.parameters(), cfg.clip_grad) if cfg.clip_grad else None
    if _nonfinite(job, metrics, step, step_loss, norm):
        return norm  # --on-nonfinite skip: this step changed nothing
    loss_sum += step_loss
    if job.scaler is not None:
        job.scaler.step(job.opt)
        job.scaler.update()
    elif job.late is not None and job.late.pending:
        job.late.step(job.opt)  # the other parameters while the all-reduce runs, then the embeddings
    else:
        job.opt.step()
    job.opt.zero_grad(set_to_none=not keep_grads)
    return norm


def _nonfinite(
    job: Job, metrics: Metrics, step: int, step_loss: torch.Tensor, norm: torch.Tensor | None
) -> bool:
    """Note a NaN/inf loss or gradient of this step; True when ``--on-nonfinite skip`` drops the step."""
    cfg = job.cfg
    if job.scaler is not None:
        checked = (
            None  # fp16: an inf gradient is the GradScaler's to skip (it lowers the scale); the loss is ours
        )
    elif norm is not None:
        checked = norm
    else:  # no clipping: the same norm clipping computes, one fused pass over the gradients
        late = {id(p) for p in job.late.params} if job.late is not None else set()
        checked = finite.grad_norm([p for p in job.model.parameters() if id(p) not in late])
    bad = NonFiniteWatch.bad(step_loss, checked)
    if cfg.on_nonfinite != "skip":
        assert job.nonfinite is not None
        job.nonfinite.note(step, bad)
        return False
    if not any_rank(bad):
        job.skipped_in_a_row = 0
        return False
    if job.late is not None:
        job.late.finish()  # its all-reduce completes before the gradients it writes are dropped
    if job.scaler is not None:
        job.scaler.update()  # closes this step's unscale_ (the next one would refuse a second)
    job.opt.zero_grad(set_to_none=not (setup.uses_cudagraphs(cfg, job.rt) and cfg.grad_accum > 1))
    job.skipped.append(step)
    job.skipped_in_a_row += 1
    metrics.event(event="nonfinite", step=step, action="skip")
    if job.rt.is_main:
        print(
            f"torchrig train: step {step}: the loss or a gradient is NaN/inf; the step is skipped "
            "(--on-nonfinite skip)",
            file=sys.stderr,
            flush=True,
        )
    if job.skipped_in_a_row > MAX_SKIPPED_IN_A_ROW:
        raise _diverged(job, step, f"{job.skipped_in_a_row} steps in a row skipped by --on-nonfinite skip")
    return True


def _diverged(job: Job, step: int, how: str) -> Diverged:
    good = rundir.latest_or_none(job.root)
    return Diverged(
        f"training diverged: NaN/inf loss or gradient at step {step}; "
        + (f"the last finite checkpoint is {good}" if good else "no checkpoint of this run was saved")
        + f" ({how})",
        hint="lower --lr, raise --warmup-steps or keep --clip-grad, then continue with --resume"
        + ("" if job.cfg.on_nonfinite == "skip" else "; --on-nonfinite skip drops such steps instead"),
    )


def _check_finite(job: Job, metrics: Metrics, at: str) -> None:
    """At a point the loop syncs anyway (a save): stop when any step so far was NaN/inf."""
    if job.nonfinite is None or job.cfg.on_nonfinite == "skip":
        return
    _stop_if_bad(job, metrics, job.nonfinite.first_bad_step(), at)


def _stop_if_bad(job: Job, metrics: Metrics, first: int | None, at: str) -> None:
    """Stop the run (Diverged) when ``first``, the first NaN/inf step on any rank, is a step."""
    if first is None:
        return
    metrics.event(event="nonfinite", step=first, action="stop", found_at=at)
    raise _diverged(job, first, f"seen at the {at}: checked at every log step and before every save")


def _check_weights(job: Job, metrics: Metrics, step: int) -> None:
    """A save never commits NaN/inf weights, whatever the per-step checks missed (``--on-nonfinite skip``)."""
    if not weights_finite(job.model):
        metrics.event(event="nonfinite", step=step, action="stop", found_at=f"save of step {step}")
        raise _diverged(job, step, "the weights to save hold NaN/inf")


def _train(cfg: TrainConfig, rt: Runtime, held: contextlib.ExitStack, given: Start | None) -> TrainSummary:
    job = _build(cfg, rt)
    job.run_id, found = resume.start(cfg, rt, job.out, job.root, held, given)
    metrics = Metrics(job.out, cfg.steps, enabled=rt.is_main, tensorboard=cfg.tensorboard)
    run = _begin(job, metrics, found)
    _steps(job, metrics, run)
    return summary.finish(job, metrics, run)


def _begin(job: Job, metrics: Metrics, found: Path | None) -> Run:
    """Load the checkpoint to resume from (if any) and log the run's start."""
    cfg, rt = job.cfg, job.rt
    resuming = cfg.resume or cfg.resume_if_possible or rt.restart > 0
    start, meta = resume.resume(
        cfg, rt, job.model, job.opt, found, resuming, metrics, job.global_batch, job.spec
    )
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
    # --profile-steps N: the last N steps run under torch.profiler, in a log interval of their own.
    prof_first = max(cfg.steps - cfg.profile_steps + 1, start + 1) if cfg.profile_steps else None
    return Run(start, device_name, peak, peak_source, prof_first)


def _steps(job: Job, metrics: Metrics, run: Run) -> None:
    """Steps ``run.start + 1 .. cfg.steps``: log, profile and checkpoint on their steps."""
    cfg, rt = job.cfg, job.rt
    it = batches(
        job.dataset,
        micro_batch=cfg.micro_batch,
        world=rt.world,
        rank=rt.rank,
        seed=cfg.seed,
        global_batch=job.global_batch,
        start_sample=run.start * job.global_batch,
        workers=cfg.workers,
        pin=rt.device.type == "cuda",
    )
    t0, profiler = time.perf_counter(), None
    it = _prepare(job, metrics, it, run)
    cfg = job.cfg  # compile off when the compile check failed
    one_step = _step if job.step_graph is None else _graph_step
    loss_sum = torch.zeros((), device=rt.device)
    last: dict[str, Any] = {"step": run.start, "t": t0}
    collector = Collector(cfg.gc_every)
    job.watch = GpuWatch.open(torch, rt.device)
    reader = LogReader(
        job,
        metrics,
        run.peak,
        last,
        lambda first, at: _stop_if_bad(job, metrics, first, at),
        lambda s: lr_at(s, job.cfg),
    )
    try:
        for step in range(run.start + 1, cfg.steps + 1):
            if _hook_step(cfg, rt, step):
                _logged(run, reader.finish())  # a test hook may stop this run: the record is written first
            _test_hooks(cfg, rt, step)
            if step == run.prof_first:
                profiler = setup.profiler(cfg, rt, job.out / "profile")
                profiler.start()
            with profiler.step(step) if profiler is not None else contextlib.nullcontext():
                grad_norm = one_step(job, metrics, step, it, loss_sum)
            collector.after_step(step, run.start + 1)
            _logged(run, reader.finish())  # the last log step's record, now that this step is queued
            if step == cfg.steps and profiler is not None:
                run.profile = profiler.stop(cfg.steps - (run.prof_first or step) + 1)
            _log(job, run, reader, step, loss_sum, grad_norm)
            if _saves(cfg, step):
                _check_finite(job, metrics, f"save of step {step}")
                _check_weights(job, metrics, step)
                _save(job, step)
                last["t"] = time.perf_counter()  # checkpoint time is not training throughput
        warm = run.start + min(cfg.timing_warmup_steps, cfg.steps // 3)
        run.gpu = job.watch.result(from_step=warm) if job.watch is not None else None
    except BaseException:
        reader.abandon()  # the interval before the error keeps its record
        raise
    finally:
        collector.close()
        if job.watch is not None:
            job.watch.close()
    run.elapsed_s = time.perf_counter() - t0


def _prepare(job: Job, metrics: Metrics, it: Any, run: Run) -> Any:
    """Before the first step: the compile check (it compiles the model, as the first step did before) and
    the whole-step CUDA graph where it runs. Returns the batches."""
    cfg, rt = job.cfg, job.rt
    if cfg.compile and run.start < cfg.steps and rt.parallel != "fsdp":
        it = _check_compile(job, metrics, it, run.start)
        cfg = job.cfg  # compile off when the check failed
    if setup.step_graph(cfg, rt):
        from torchrig.train.stepgraph import StepGraph

        job.step_graph = StepGraph(cfg, rt, job.model, job.run_model, job.opt, job.autocast)
    return it


def _check_compile(job: Job, metrics: Metrics, it: Any, start: int) -> Any:
    """The compiled model's loss against eager's on the first micro-batch (train/compilecheck.py); on one
    process a failed check continues without compile, on several it stops every rank. Returns the batches,
    the first one put back."""
    cfg, rt = job.cfg, job.rt
    x, y = next(it)
    batch = (x, y)
    x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
    check = compilecheck.measure(
        job.model,
        job.run_model,
        x,
        y,
        job.autocast,
        no_sync=lambda: _sync_context(job.run_model, rt, False),
        graphs=setup.uses_cudagraphs(cfg, rt),
        abs_tol=cfg.test_compile_tolerance or compilecheck.TOLERANCE_ABS,
    )
    failed = compilecheck.any_rank_disagrees(check, rt.device)
    action = "kept" if not failed else ("eager" if rt.world == 1 else "stop")
    metrics.event(
        event="compile_check",
        step=start,
        eager_loss=check.eager if math.isfinite(check.eager) else None,
        compiled_loss=check.compiled if math.isfinite(check.compiled) else None,
        action=action,
    )
    if failed and rt.world > 1:
        raise compilecheck.mismatch_error(check, torch.__version__)
    if failed:
        job.run_model = job.model
        job.cfg = dataclasses.replace(cfg, compile=False, step_graph="off")
        if rt.is_main:
            print(
                f"torchrig train: warning: {check.text()} (torch {torch.__version__}): torch.compile computed a "
                "wrong result for this model; training continues without compile (correct, slower)",
                file=sys.stderr,
                flush=True,
            )
    return itertools.chain([batch], it)


def _log(
    job: Job, run: Run, reader: LogReader, step: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor | None
) -> None:
    """On a log step, queue its record's reads (train/logstep.py); read them at once where what follows needs
    them: the last step, a save, the step before the profiled window."""
    cfg = job.cfg
    if not (step % cfg.log_every == 0 or step == cfg.steps or step == (run.prof_first or 0) - 1):
        return
    if step == cfg.steps or _saves(cfg, step) or step == (run.prof_first or 0) - 1:
        _logged(run, reader.now(step, loss_sum, grad_norm))
    else:
        reader.queue(step, loss_sum, grad_norm)
    loss_sum.zero_()


def _saves(cfg: TrainConfig, step: int) -> bool:
    """A checkpoint is saved after ``step``: every ``--ckpt-every`` steps, and the last with ``--ckpt-final``."""
    return bool(cfg.ckpt_every and step % cfg.ckpt_every == 0) or (step == cfg.steps and cfg.ckpt_final)


def _logged(run: Run, value: float | None) -> None:
    run.final_loss = value if value is not None else run.final_loss


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
        "finite": True,  # checked just before (_check_finite): pruning never removes the newest such one
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
