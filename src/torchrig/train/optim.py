"""bf16 copies of the Linear layers' weights, kept up to date by the optimizer step (one GPU, bf16 autocast).

Under bf16 autocast every ``nn.Linear`` casts its fp32 weight and bias to bf16 on each use; compiled, the
backward makes those casts again (Inductor recomputes cheap pointwise ops rather than keep their results),
and the gradient comes back through the cast as ``float(bf16 gradient)``. On 1x H200 the casts took about
0.8 ms of GPT-2 small's 35 ms step (docs/results/training-speed.md).

``keep_bf16_copies`` gives each Linear layer a bf16 buffer of its weight and bias, refreshed in place after
every optimizer step (one multi-tensor copy) and after every ``load_state_dict``. The layer's forward uses the
buffer through ``_Copied``: its forward is a view of the buffer (no kernel), its backward returns the
gradient as fp32 for the fp32 parameter, which is exactly what autocast's cast did. So the parameters, the
optimizer (fused AdamW over fp32 masters), the gradients, clipping and the checkpoints are the same as
without copies; the forward and backward read bf16 weights that already exist. The buffers are not
persistent (not in the state dict) and cost 2 bytes per Linear parameter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _Copied(torch.autograd.Function):
    """``master.to(copy.dtype)`` where ``copy`` already holds that value: no cast in the forward."""

    @staticmethod
    def forward(ctx: Any, master: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:  # type: ignore[override,unused-ignore]
        ctx.master_dtype = master.dtype
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override,unused-ignore]
        return g.to(ctx.master_dtype), None


class CopiedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward uses bf16 copies of its weight and bias (buffers ``weight_copy``,
    ``bias_copy``) when autocast runs in their dtype; anything else is the plain Linear."""

    weight_copy: torch.Tensor
    bias_copy: torch.Tensor | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        dtype = self.weight_copy.dtype
        if not (torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == dtype):
            return super().forward(x)
        w = _Copied.apply(self.weight, self.weight_copy)
        b = _Copied.apply(self.bias, self.bias_copy) if self.bias is not None else None
        return F.linear(x.to(dtype), w, b)


class Bf16Copies:
    """The copies of a model's Linear layers and the hooks that keep them equal to the fp32 parameters."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, dtype: torch.dtype = torch.bfloat16):
        self.masters: list[torch.Tensor] = []
        self.copies: list[torch.Tensor] = []
        tied = _tied(model)
        for m in model.modules():
            if type(m) is not nn.Linear or id(m.weight) in tied:  # the tied head: the loss casts it once
                continue
            m.__class__ = CopiedLinear
            for name in ("weight", "bias"):
                p = getattr(m, name)
                copy = p.detach().to(dtype) if p is not None else None
                m.register_buffer(f"{name}_copy", copy, persistent=False)
                if p is not None:
                    self.masters.append(p)
                    self.copies.append(copy)  # type: ignore[arg-type]
        self.layers = sum(isinstance(m, CopiedLinear) for m in model.modules())
        opt.register_step_post_hook(lambda *_: self.refresh())
        model.register_load_state_dict_post_hook(lambda *_: self.refresh())

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy every fp32 parameter into its bf16 buffer, in place (the buffers keep their addresses, which
        CUDA graphs recorded)."""
        if self.copies:
            torch._foreach_copy_(self.copies, self.masters)


def _tied(model: nn.Module) -> set[int]:
    """ids of Linear weights that are also used elsewhere (an embedding's, shared by the output head)."""
    seen: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            seen[id(p)] = seen.get(id(p), 0) + 1
    return {k for k, n in seen.items() if n > 1}


def keep_bf16_copies(model: nn.Module, opt: torch.optim.Optimizer) -> Bf16Copies:
    """Give ``model``'s (untied) Linear layers bf16 weight copies kept equal to their parameters by
    ``opt``'s steps; returns the copies' holder (its ``layers``: how many layers use them)."""
    return Bf16Copies(model, opt)
