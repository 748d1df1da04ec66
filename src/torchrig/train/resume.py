"""Where a rank's run starts: the run folder's start (rank 0 holds the folder and follows the one decision
made for it, train/runstart.py), the checkpoint to resume from, and loading it.

Used by the loop (train/loop.py); every rank calls :func:`start` and :func:`resume`, in that order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchrig.errors import InputError, UsageError
from torchrig.train import checkpoint as ckpt
from torchrig.train import rundir, runstart
from torchrig.train.config import TrainConfig
from torchrig.train.metrics import Metrics, rewind_jsonl
from torchrig.train.setup import Runtime


def start(
    cfg: TrainConfig,
    rt: Runtime,
    out: Path,
    root: Path,
    held: contextlib.ExitStack,
    given: runstart.Start | None = None,
) -> tuple[str, Path | None]:
    """Rank 0 takes the folder's lock (until the run ends) and carries out how the run starts in it
    (:func:`_decision`), every rank follows: the run's id and the verified checkpoint to resume from
    (None: step 0)."""
    plan: Any = None
    if rt.is_main:
        try:
            held.enter_context(rundir.hold(out))  # another live run in this folder: refused, exit 2
            plan = dataclasses.replace(_decision(cfg, rt, out, given), seen=None)  # small to broadcast
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


def _decision(cfg: TrainConfig, rt: Runtime, out: Path, given: runstart.Start | None) -> runstart.Start:
    """How the run starts (rank 0, holding the folder): the decision ``torchrig train`` made (``given`` in this
    process, checked against the folder now that it is held; or handed to the ranks it launched while holding
    the folder), an elastic restart's (it continues the run), or, started by no such plan (plain torchrun,
    ``torchrig launch -m torchrig.train``), decided here."""
    if given is not None:
        return runstart.confirm(out, given)
    if rt.restart > 0:
        return runstart.restarted(out)
    handed = os.environ.get(runstart.START_ENV)
    if handed is not None and rundir.launcher_holds(out):
        return runstart.from_env(out, handed)
    return runstart.plan_start(
        out, resume=cfg.resume, if_possible=cfg.resume_if_possible, overwrite=cfg.overwrite
    )


def _claim(rt: Runtime, out: Path, plan: runstart.Start, run_id: str) -> None:
    if rt.is_main:
        for line in runstart.claim(out, plan, run_id):
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


def resume(
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
