"""Divergence: a loss or gradient that became NaN or infinite, found without a host sync every step.

Each step adds a few tiny kernels on the device: ``first`` keeps the first step whose loss (or gradient
norm) was not finite. Nothing is read back until the loop syncs anyway: at a logging step (it reads the
loss there) and before every checkpoint. There the ranks agree on the earliest bad step (one small
all-reduce) and the run stops (``--on-nonfinite stop``, the default), before a non-finite checkpoint can
be written. ``--on-nonfinite skip`` instead drops such a step's update (one sync per step, since the
decision is needed before the optimizer steps) and stops after :data:`MAX_SKIPPED_IN_A_ROW` in a row.

A save also checks the weights themselves (:func:`weights_finite`), so no checkpoint holding NaN or
infinity is ever committed, let alone named by ``latest``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from torchrig.errors import JobFailed

# --on-nonfinite skip: more bad steps than this in a row is a run that has diverged, not one bad batch
MAX_SKIPPED_IN_A_ROW = 10
_NONE = torch.iinfo(torch.int64).max  # "no bad step" in a MIN all-reduce


class Diverged(JobFailed):
    """The loss or the gradients became NaN/inf (exit 1: the run stopped; its finite checkpoints stay)."""


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's own shard (FSDP2's gradient norm is one): checked per rank, then all-reduced."""
    return t.to_local() if hasattr(t, "to_local") else t  # type: ignore[no-any-return,unused-ignore]


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


class NonFiniteWatch:
    """The first step with a non-finite loss or gradient norm, kept on the device until a check."""

    def __init__(self, device: torch.device) -> None:
        self.first = torch.zeros((), dtype=torch.int64, device=device)

    @staticmethod
    def bad(loss: torch.Tensor, grad_norm: torch.Tensor | None) -> torch.Tensor:
        """A 0-d bool tensor: this step's loss or gradient norm is NaN or infinite (no sync)."""
        bad = ~torch.isfinite(loss.detach().float())
        if grad_norm is not None:
            bad = bad | ~torch.isfinite(_local(grad_norm).detach().float())
        return bad

    def note(self, step: int, bad: torch.Tensor) -> None:
        """Remember ``step`` when it is the first bad one (no sync)."""
        self.first = torch.where((self.first == 0) & bad, step, self.first)

    def first_bad_queued(self) -> torch.Tensor:
        """The earliest bad step on any rank, 0 for none, as a 0-d tensor: no host sync; with several ranks,
        one all-reduce (queued: every rank calls this at the same point)."""
        v = torch.where(self.first == 0, _NONE, self.first)
        if _world() > 1:
            dist.all_reduce(v, op=dist.ReduceOp.MIN)
        return torch.where(v == _NONE, 0, v)

    def first_bad_step(self) -> int | None:
        """The earliest bad step on any rank, or None: one host sync and, with several ranks, one all-reduce."""
        return int(self.first_bad_queued().item()) or None


def any_rank(bad: torch.Tensor) -> bool:
    """Whether ``bad`` is true on any rank (a sync; ``--on-nonfinite skip`` decides each step with it)."""
    v = bad.to(torch.int32)
    if _world() > 1:
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return bool(v.item())


def weights_finite(model: torch.nn.Module) -> bool:
    """Every parameter finite on every rank (each rank checks its shards): a save's last check."""
    flags = [torch.isfinite(_local(p.detach())).all() for p in model.parameters()]
    ok = torch.stack(flags).all().to(torch.int32) if flags else torch.ones((), dtype=torch.int32)
    if _world() > 1:
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def grad_norm(params: list[Any]) -> torch.Tensor | None:
    """The total gradient norm (what clipping computes), for a run without ``--clip-grad``: one fused
    pass over the gradients, no sync."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    return torch.nn.utils.get_total_norm(grads)
