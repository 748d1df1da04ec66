"""Atomic, resharding checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under ``OUT/checkpoints/``::

    step-000200/      a complete DCP checkpoint (.metadata + one shard file per rank) and meta.json
    step-000300.tmp/  a save in progress (never read; removed on the next start)
    latest            the name of the newest complete checkpoint, replaced atomically

A save writes into ``step-N.tmp/``; only when every rank has finished does rank 0 write ``meta.json``,
rename the folder to ``step-N/`` (atomic on one filesystem) and replace ``latest``. A crash at any moment
leaves ``latest`` pointing at the previous complete checkpoint. DCP stores each tensor with its global
shape, so a checkpoint saved by N ranks (DDP or FSDP2 shards) loads on M ranks, or in one process.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

LATEST = "latest"
META = "meta.json"


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (following ``latest``), or None."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    target = root / pointer.read_text().strip()
    return target if (target / META).is_file() else None


def resolve(path: Path) -> Path:
    """A checkpoint folder from a run folder, a checkpoints folder or a checkpoint folder itself."""
    for cand in (path, path / "checkpoints"):
        if (cand / META).is_file():
            return cand
        found = latest(cand)
        if found:
            return found
    raise FileNotFoundError(path)


def read_meta(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / META).read_text())


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def clean_partial(root: Path) -> None:
    """Remove unfinished saves (``*.tmp``) left by a crash; rank 0 only, before training starts."""
    if _is_main() and root.is_dir():
        for p in root.glob("step-*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
    _barrier()


def save(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optim: torch.optim.Optimizer,
    meta: dict[str, Any],
    *,
    keep: int,
    before_commit: Any = None,
) -> Path:
    """Save a checkpoint atomically; every rank calls this. Returns the final folder."""
    tmp, final = root / f"{step_name(step)}.tmp", root / step_name(step)
    if _is_main():
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp))
    _barrier()  # every rank's shard is on disk
    if before_commit is not None:
        before_commit()  # a test hook: a crash here must leave the last good checkpoint intact
    if _is_main():
        with open(tmp / META, "w") as f:
            json.dump({**meta, "step": step}, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = root / f"{LATEST}.tmp"
        pointer.write_text(final.name + "\n")
        os.replace(pointer, root / LATEST)
        done = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[:-keep] if keep else []:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load(ckpt: Path, model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """Load model and optimizer state (resharded to this run's layout); returns the checkpoint's meta."""
    msd, osd = get_state_dict(model, optim)
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(ckpt))  # fills msd and osd in place
    set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd)
    return read_meta(ckpt)


def load_model_only(ckpt: Path, model: torch.nn.Module) -> None:
    """Load just the weights into an unsharded model in a single process (no process group needed)."""
    msd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    state = {"model": msd}
    dcp.load(state, checkpoint_id=str(ckpt))
    model.load_state_dict(state["model"])
