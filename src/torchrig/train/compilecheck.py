"""Before the first step: the compiled model's loss against eager's, on the same weights and micro-batch.

``torch.compile`` can compute a wrong result without any error. On 1x H200 with torch 2.11.0+cu130, GPT-2
large's compiled forward gave a loss of 11.97 at initialisation where eager PyTorch gave 11.08 on the same
weights and batch (every compile mode; GPT-2 small and medium compiled right), and bf16 training diverged
from the first steps while the eager run trained (docs/results/training-speed.md). A wrong gradient costs a
whole run; this check costs one eager forward without gradients and one compiled forward, once.

When the two losses differ by more than the bf16 rounding of a forward pass could make them (:func:`agrees`),
a one-process run continues without compile (correct, slower) and says so; several ranks stop together
before any step, with the fix to choose (their compiled DDP/FSDP wrappers cannot be swapped mid-run).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchrig.errors import JobFailed

# Compiled and eager losses of the same forward differ by the rounding of bf16 intermediates that Inductor
# keeps in fp32: about 1e-4 to 1e-3 at GPT-2's 11 (measured: docs/results/training-speed.md). The miscompile
# above was 0.89. A difference above this much (absolute, or relative to the loss) is not rounding.
TOLERANCE_ABS = 0.05
TOLERANCE_REL = 0.01


class CompileMismatch(JobFailed):
    """The compiled model's loss is not eager's on the same batch (exit 1, before any step)."""


@dataclass(frozen=True)
class CompileCheck:
    eager: float
    compiled: float
    abs_tol: float = TOLERANCE_ABS
    rel_tol: float = TOLERANCE_REL

    @property
    def agrees(self) -> bool:
        return agrees(self.eager, self.compiled, self.abs_tol, self.rel_tol)

    def text(self) -> str:
        return f"the compiled model's loss on the first batch is {self.compiled:.4f}, eager PyTorch's {self.eager:.4f}"


def agrees(
    eager: float, compiled: float, abs_tol: float = TOLERANCE_ABS, rel_tol: float = TOLERANCE_REL
) -> bool:
    """Whether a compiled loss is eager's up to rounding (a non-finite compiled loss with a finite eager one
    never agrees; both non-finite is the model's own problem, left to the non-finite watch)."""
    if not math.isfinite(eager):
        return True
    if not math.isfinite(compiled):
        return False
    return abs(compiled - eager) <= max(abs_tol, rel_tol * abs(eager))


def measure(
    model: nn.Module,
    run_model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    autocast: Callable[[], Any],
    no_sync: Callable[[], Any] = contextlib.nullcontext,
    graphs: bool = False,
    abs_tol: float = TOLERANCE_ABS,
) -> CompileCheck:
    """One eager forward of ``model`` (no gradients) and one of ``run_model`` as a training step runs it
    (gradients on, so the training graph is the one compiled), on the same micro-batch; nothing is stepped,
    and buffers the forwards update (BatchNorm's running statistics) are put back as they were.
    ``no_sync``: DDP's context that keeps its reducer out of a forward with no backward. ``abs_tol`` other
    than the default (torchrig's own tests: ``--test-compile-tolerance``) is the only tolerance."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    with torch.no_grad(), autocast():
        eager = float(model(x, y).detach().float())
    if graphs:
        torch.compiler.cudagraph_mark_step_begin()
    with no_sync(), autocast():
        out = run_model(x, y)
    compiled = float(out.detach().float())
    del out  # its autograd graph goes with it
    with torch.no_grad():
        for buf, value in saved:
            buf.copy_(value)
    if abs_tol != TOLERANCE_ABS:
        return CompileCheck(eager, compiled, abs_tol, 0.0)
    return CompileCheck(eager, compiled)


def any_rank_disagrees(check: CompileCheck, device: torch.device) -> bool:
    """Whether the check failed on any rank: every rank takes the same way on."""
    bad = torch.tensor([0 if check.agrees else 1], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return bool(bad.item())


def mismatch_error(check: CompileCheck, torch_version: str) -> CompileMismatch:
    return CompileMismatch(
        f"torch.compile computed a wrong result for this model with torch {torch_version}: {check.text()}; "
        "training would diverge",
        hint="train with --no-compile (correct, slower), or with another torch release; on one GPU torchrig "
        "falls back to eager by itself",
    )
