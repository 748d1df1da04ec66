"""The whole optimizer step as one CUDA graph: forward, backward, clipping, the non-finite check and AdamW.

``--compile-mode reduce-overhead`` captures the compiled model's forward and backward as graphs of their own;
between and after them the host still launches the loss sum, the gradient norm, clipping, the optimizer and
the zeroing one by one, and the GPU waits for it (1.8 ms of a 34 ms GPT-2 small step on one H200:
docs/results/training-speed.md). Here the step is captured whole, the way PyTorch's CUDA graphs notes
capture a whole network (https://pytorch.org/docs/stable/notes/cuda.html#whole-network-capture): a few real
steps run first on a side stream (they compile the model and create the optimizer's state), then the next
step is captured once, and every step from then on is its batch copied into the graph's input buffers and one
replay.

The numerics are the ordinary step's: the same compiled kernels, AdamW's fused kernel with
``capturable=True`` (its step count on the GPU) and the learning rate as a one-element tensor on the GPU that
the host fills before each replay (a float would be frozen into the graph at capture). The gradients live in
the graph's memory between steps; nothing outside the step reads them.

One process on one GPU, compiled, without fp16's GradScaler and ``--on-nonfinite skip`` (both decide on the
host inside the step): :func:`torchrig.train.setup.step_graph_refusal`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchrig.train import finite

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from torch import nn

    from torchrig.train.config import TrainConfig
    from torchrig.train.setup import Runtime

# Real steps before the capture (PyTorch's notes warm up with 3; torch.compile compiles in the first):
# the optimizer's state exists after the first, and lazily created handles and workspaces after a few.
WARMUP_STEPS = 3


class StepGraph:
    """One run's step: warm-up steps on a side stream, then one capture, then a replay each step."""

    def __init__(
        self,
        cfg: TrainConfig,
        rt: Runtime,
        model: nn.Module,
        run_model: nn.Module,
        opt: torch.optim.Optimizer,
        autocast: Callable[[], Any],
    ) -> None:
        self.cfg, self.rt, self.run_model, self.opt, self.autocast = cfg, rt, run_model, opt, autocast
        device = rt.device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.side = torch.cuda.Stream(device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warm = 0
        self.inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.out: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None
        self.lrs = []
        for group in opt.param_groups:
            # the graph reads the learning rate from this tensor: filled in place, never replaced
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
            group["capturable"] = True
            self.lrs.append(group["lr"])

    def step(
        self, lr: float, it: Iterator[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, Any, Any]:
        """One optimizer step at learning rate ``lr`` on the next ``grad_accum`` micro-batches of ``it``;
        returns the step's loss, the gradient norm (None without clipping) and whether either is non-finite
        (device tensors, no sync)."""
        for t in self.lrs:
            t.fill_(lr)
        batches = [next(it) for _ in range(self.cfg.grad_accum)]
        device = self.rt.device
        if self.graph is None and self.warm < WARMUP_STEPS:
            self.warm += 1
            current = torch.cuda.current_stream(device)
            self.side.wait_stream(current)
            with torch.cuda.stream(self.side):
                moved = [
                    (x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in batches
                ]
                out = self._body(moved)
            current.wait_stream(self.side)
            return out
        if self.graph is None:
            self._capture(batches)
        for (sx, sy), (x, y) in zip(self.inputs, batches, strict=True):
            if sx.shape != x.shape or sy.shape != y.shape:
                raise RuntimeError(
                    f"a micro-batch of shape {tuple(x.shape)} after the step graph captured {tuple(sx.shape)}"
                )
            sx.copy_(x, non_blocking=True)
            sy.copy_(y, non_blocking=True)
        assert self.graph is not None and self.out is not None
        self.graph.replay()
        return self.out

    def _capture(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        device = self.rt.device
        self.inputs = [(x.to(device).clone(), y.to(device).clone()) for x, y in batches]
        torch.cuda.synchronize(device)
        self.graph = torch.cuda.CUDAGraph()
        # the gradients of the last warm-up step go; the captured backward makes its own in the graph's pool
        self.opt.zero_grad(set_to_none=True)
        # thread_local: the DataLoader's pin-memory thread goes on with its own CUDA calls (host buffers, their
        # events) while this thread captures; only this thread's calls must be capturable
        with torch.cuda.graph(self.graph, stream=self.side, capture_error_mode="thread_local"):
            self.out = self._body(self.inputs)

    def _body(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, Any, Any]:
        """The step itself, as the ordinary loop runs it (train/loop.py ``_step``) without host decisions."""
        cfg = self.cfg
        self.opt.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=self.rt.device)
        for x, y in batches:
            with self.autocast():
                loss = self.run_model(x, y) / cfg.grad_accum
            loss.backward()
            step_loss += loss.detach().float()
        norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.clip_grad) if cfg.clip_grad else None
        checked = norm if norm is not None else finite.grad_norm(self.params)
        bad = finite.NonFiniteWatch.bad(step_loss, checked)
        self.opt.step()
        return step_loss, norm, bad
