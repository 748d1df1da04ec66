"""The input embeddings' gradient, all-reduced outside DDP while the optimizer steps the other parameters.

An embedding's gradient is complete only when the backward ends: the lookup is the forward's first op, and
GPT's tied ``wte`` gets the output projection's gradient first and the lookup's last. DDP can start its
bucket only then, and the step waits for that all-reduce before the optimizer runs: on 2x H200 about
1.5 ms per step of NCCL that no compute hides (docs/benchmarks.md, run 8; ``wte`` alone is 154 MB of fp32
gradient in GPT-2 small). Here DDP leaves those parameters out
(``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``), and the trainer all-reduces
their gradients itself, asynchronously, right after the backward; the optimizer steps every other
parameter meanwhile, then the embeddings once their all-reduce is done.

The result is the same update as one ``optimizer.step()``: AdamW updates each parameter from its own
gradient and state, and a parameter whose ``.grad`` is None is skipped by the step (PyTorch's optimizers
skip it and leave its state untouched). Gradient clipping and fp16's GradScaler need every gradient first
(a global norm, a global inf check): with them the trainer waits for the all-reduce before either, and
only the all-reduce itself is taken out of DDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def late_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradient is complete only at the end of the backward (a model says which with
    ``late_grad_params()``; GPT: its embeddings), or []."""
    fn = getattr(model, "late_grad_params", None)
    return [p for p in fn() if isinstance(p, nn.Parameter) and p.requires_grad] if callable(fn) else []


@dataclass
class LateGrads:
    """All-reduce ``params``' gradients (mean over the ranks) outside DDP, overlapped with the optimizer."""

    params: list[nn.Parameter]
    world: int
    average_op: bool  # NCCL has ReduceOp.AVG; gloo sums, after a division by the world size (as DDP does)
    pending: list[Any] = field(default_factory=list)

    @classmethod
    def for_backend(cls, params: list[nn.Parameter]) -> LateGrads:
        return cls(params, dist.get_world_size(), dist.get_backend() == "nccl")

    def start(self) -> None:
        """After the last micro-step's backward: launch the all-reduces (they run on NCCL's stream)."""
        op = dist.ReduceOp.AVG if self.average_op else dist.ReduceOp.SUM
        for p in self.params:
            if p.grad is None:  # not used in this step on this rank: the others still wait for it
                p.grad = torch.zeros_like(p)
            if not self.average_op:
                p.grad.div_(self.world)
            self.pending.append(dist.all_reduce(p.grad, op=op, async_op=True))

    def finish(self) -> None:
        """Wait for the all-reduces (the current stream waits; the host does not block on NCCL)."""
        for work in self.pending:
            work.wait()
        self.pending.clear()

    def step(self, opt: torch.optim.Optimizer) -> None:
        """``opt.step()`` in two parts: every other parameter while the all-reduce runs, then these."""
        late = {id(p) for p in self.params}
        held = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        opt.step()
        self.finish()
        others = [
            (p, p.grad)
            for group in opt.param_groups
            for p in group["params"]
            if id(p) not in late and p.grad is not None
        ]
        for p, _ in others:
            p.grad = None
        for p, g in zip(self.params, held, strict=True):
            p.grad = g
        try:
            opt.step()
        finally:
            for p, g in others:
                p.grad = g
