"""What each rank's GPU did while it trained: its SM clock and power at every log step, and how much of the
measured time the driver held its clocks down for power or heat (NVML's violation counters).

A GPU at its power limit lowers its clock, and by how much changes from step to step; on several GPUs every
step then waits for the slowest one. On an H200 training GPT-2 small the driver held the clocks down for
power the whole time, and the SM clock moved between 1665 and 1965 MHz of 1980 (recorded in
tests/fixtures/train/nvml-clocks-h200-gpt2small.json; docs/benchmarks.md, run 8). The summary shows it, so
a run that scales less than expected says whether the GPUs were the cause.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchrig.train.record import GpuClocks, Spread


def _spread(values: list[int | float | None]) -> Spread | None:
    """(min, median, max) of the known values, or None."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return (min(known), statistics.median(known), max(known))


@dataclass
class GpuWatch:
    """One rank's GPU through torchrig's NVML adapter (``torchrig.hw.nvml``), found by UUID."""

    gpus: Any  # an open torchrig.hw.nvml.Nvml
    index: int
    # (step, time, SM clock, power, clocks_held_down_s, temperature)
    samples: list[tuple[int, float, int | None, float | None, dict[str, float | None], int | None]] = field(
        default_factory=list
    )
    clock: Callable[[], float] = time.perf_counter

    @classmethod
    def open(cls, torch: Any, device: Any) -> GpuWatch | None:
        """The watch of ``device``, or None: a CPU rank, no NVML (no nvidia-ml-py, no driver), or a GPU NVML
        does not list (the UUID is what CUDA and NVML share; ``CUDA_VISIBLE_DEVICES`` renumbers only CUDA's)."""
        from torchrig.hw import nvml

        opened = nvml.open_for_cuda(torch, device)
        return None if opened is None else cls(*opened)

    def sample(self, step: int) -> None:
        """Read the GPU now (at a log step, after its host sync)."""
        s = self.gpus.sensors(self.index)
        held = self.gpus.clocks_held_down_s(self.index)
        self.samples.append((step, self.clock(), s.sm_clock_mhz, s.power_draw_w, held, s.temperature_c))

    def result(self, from_step: int = 0) -> GpuClocks | None:
        """Clock, power and temperature at the log steps from ``from_step`` on (the steps the throughput is measured over)
        and the share of the time between the first and the last of them the clocks were held down."""
        window = [w for w in self.samples if w[0] >= from_step]
        if not window:
            return None
        top, limit = self.gpus.limits(self.index)
        span = window[-1][1] - window[0][1]

        def capped_share(cause: str) -> float | None:
            a, b = window[0][4].get(cause), window[-1][4].get(cause)
            return (
                None if a is None or b is None or span <= 0 else round(min(max((b - a) / span, 0.0), 1.0), 3)
            )

        return GpuClocks(
            sm_clock_mhz=_spread([w[2] for w in window]),
            sm_clock_max_mhz=top,
            power_w=_spread([w[3] for w in window]),
            power_limit_w=limit,
            temperature_c=_spread([w[5] for w in window]),
            samples=len(window),
            power_capped_share=capped_share("power"),
            thermal_capped_share=capped_share("thermal"),
        )

    def close(self) -> None:
        self.gpus.close()
