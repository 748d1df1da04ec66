"""The log step: the interval's mean loss, gradient norm and throughput, read without making the GPU wait.

Reading a value on the host (``.item()``) waits until the GPU has finished the step; the host then writes the
record (NVML's sensors included) and only afterwards queues the next step, so the GPU sits idle for as long as
all that takes. Here a log step only *queues* its reads: the values (mean loss, gradient norm, the first
non-finite step) are copied into pinned host memory behind a CUDA event, the loop queues the next step, and
only then does the host wait for the event, while the GPU works on that next step, and write the record.
The record is the same; it is printed one step later.

A few log steps are read at once, because what comes right after needs their values or a quiet GPU: the last
step, a step that saves a checkpoint and the step before the profiled window. A queued read is also finished
before a test hook fires, and when the run stops with an error if its values are already on the host, so the
last interval's record is kept (a rank killed from outside, as torchrun stops the others when one fails, or one
whose GPU is stuck, loses at most that one record).

The checks stay where they were: ``--on-nonfinite stop`` still stops at the log step's record (one step
later on the GPU: no checkpoint is written in between, every save checks for itself).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from torchrig.train.job import Job
from torchrig.train.metrics import Metrics

# (first bad step or None, "log of step N") -> raises Diverged where a step so far was NaN/inf
CheckFinite = Callable[[int | None, str], None]


@dataclasses.dataclass
class _Queued:
    step: int
    all_skipped: bool  # --on-nonfinite skip dropped every step of the interval: no loss to show
    host: torch.Tensor  # [loss, grad norm (if any), first bad step (if checked)], float64, on the host
    event: torch.cuda.Event | None  # the copy's end on the GPU; None: the values are there already
    has_norm: bool
    checks: bool


class LogReader:
    """Queues a log step's reads (``queue``) and writes its record once they are on the host (``finish``)."""

    def __init__(
        self,
        job: Job,
        metrics: Metrics,
        peak: float | None,
        last: dict[str, Any],
        check: CheckFinite,
        lr: Callable[[int], float],
    ) -> None:
        self.job, self.metrics, self.peak, self.last = job, metrics, peak, last
        self.check, self.lr = check, lr
        self.pending: _Queued | None = None

    def queue(self, step: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        """Queue the reads of log step ``step`` (no host sync on a GPU). Collectives are queued here, in
        the same order on every rank. ``loss_sum`` may be zeroed right after: the reads hold copies."""
        assert self.pending is None, "finish the earlier log step first"
        job = self.job
        skipped = sum(1 for s in job.skipped if s > self.last["step"])
        n = max(step - self.last["step"] - skipped, 1)  # the steps whose losses loss_sum holds
        loss = loss_sum.detach().float() / n
        if dist.is_initialized():
            dist.all_reduce(loss)  # the mean over ranks (gloo has no AVG)
            loss = loss / job.rt.world
        parts = [loss.reshape(1).double()]
        if grad_norm is not None:
            full = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            parts.append(full.detach().reshape(1).double())
        checks = job.nonfinite is not None and job.cfg.on_nonfinite != "skip"
        if checks:
            assert job.nonfinite is not None
            parts.append(job.nonfinite.first_bad_queued().reshape(1).double())
        values = torch.cat(parts)
        host, event = values, None
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        all_skipped = skipped == step - self.last["step"]
        self.pending = _Queued(step, all_skipped, host, event, grad_norm is not None, checks)

    def finish(self) -> float | None:
        """Wait for the queued reads (the GPU meanwhile runs what was queued after them), check them and write
        the record. Returns the interval's mean loss; None when nothing was queued or every step was skipped."""
        q, self.pending = self.pending, None
        if q is None:
            return None
        if q.event is not None:
            q.event.synchronize()  # the one host wait of the interval
        values = q.host.tolist()
        if q.checks:
            self.check(int(values[-1]) or None, f"log of step {q.step}")
        gn = values[1] if q.has_norm else None
        gn = gn if gn is not None and math.isfinite(gn) else None  # a skipped step's norm: JSON has no NaN
        value = None if q.all_skipped else values[0]
        self._record(q.step, value, gn)
        return value

    def now(self, step: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor | None) -> float | None:
        """Log step ``step`` at once: queue its reads and wait for them."""
        self.finish()
        self.queue(step, loss_sum, grad_norm)
        return self.finish()

    def abandon(self) -> None:
        """The run stops with an error: write the queued record if its values are already on the host. It never
        waits for the GPU: a GPU stuck in a collective would hold the error (or a Ctrl-C) here for good."""
        q = self.pending
        try:
            if q is not None and q.event is not None and not q.event.query():
                self.pending = None
                return
            self.finish()
        except Exception:  # the error that stops the run is the one to report
            self.pending = None

    def _record(self, step: int, value: float | None, gn: float | None) -> None:
        job, last, rt = self.job, self.last, self.job.rt
        now = time.perf_counter()
        if job.watch is not None:
            job.watch.sample(step)
        rate = (step - last["step"]) * job.units_per_step / max(now - last["t"], 1e-9)
        peak = self.peak
        rec = {
            "step": step,
            "loss": value,
            "lr": self.lr(step),
            "grad_norm": gn,
            f"{job.unit}_per_s": rate,
            "mfu": rate * job.flops_per_unit / (rt.world * peak * 1e12) if peak else None,
            "world_size": rt.world,
            "restart": rt.restart,
        }
        self.metrics.step(rec, job.unit, last["step"] + 1)
        last["step"], last["t"] = step, now
