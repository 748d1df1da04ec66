"""Timers for the measuring code: CUDA events on a GPU, the wall clock on the CPU path.

GPU figures are timed the way the reference tools time them: CUDA events recorded on the stream around
the work, after warm-up, and the median of repeats (``time_each``); collectives are timed nccl-tests style,
``iters`` operations launched back to back between two events, divided by ``iters`` (``time_block``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


class Timer:
    """Times callables on one device; ``torch`` is passed in so this module stays import-light."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.cuda = getattr(device, "type", "cpu") == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def time_each(
        self, fn: Callable[[int], Any], repeats: int, warmup: int, min_warmup_s: float = 0.0
    ) -> list[float]:
        """Seconds of each of ``repeats`` calls ``fn(i)`` (``i`` picks the rotated inputs), after ``warmup`` calls.

        With ``min_warmup_s``, warm-up goes on (up to 200 calls) until that long has passed, so a GPU that
        idled has raised its clocks before the first timed call.
        """
        t0 = time.perf_counter()
        for i in range(warmup):
            fn(i)
        self.sync()
        extra = 0
        while time.perf_counter() - t0 < min_warmup_s and extra < 200:
            fn(warmup + extra)
            extra += 1
            self.sync()
        times = []
        for i in range(repeats):
            if self.cuda:
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                fn(i)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn(i)
                times.append(time.perf_counter() - t0)
        return times

    def time_block(self, fn: Callable[[int], Any], iterations: int) -> float:
        """Seconds per call of ``iterations`` calls launched back to back (no sync between them)."""
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(iterations):
                fn(i)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / iterations
        t0 = time.perf_counter()
        for i in range(iterations):
            fn(i)
        return (time.perf_counter() - t0) / iterations


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def rotation_sets(bytes_per_set: int, l2_cache_bytes: int | None, limit: int = 8) -> int:
    """How many copies of the inputs to cycle through so the L2 cache cannot serve repeats from cache.

    Enough sets that they span four times the L2 cache; one set when a single set already does.
    """
    if not l2_cache_bytes or bytes_per_set <= 0:
        return 1
    need = -(-4 * l2_cache_bytes // bytes_per_set)
    return max(1, min(limit, need))
