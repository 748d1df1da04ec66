"""A train run's summary as a typed record: :class:`TrainSummary`, built by rank 0 in ``summary.finish`` (the
one place), written to ``OUT/summary.json`` and the ``end`` event of ``metrics.jsonl``, read back by
:func:`read_summary` (``torchrig train`` after its ranks end, ``bench``'s scaling runs) and printed by
:meth:`TrainSummary.lines`. No torch here: the CLI and bench read summaries without it.

The JSON keys are the field names, in field order, except the throughput: ``tokens_per_s`` (GPT) or
``images_per_s`` (ResNet), as the run's ``unit`` says; ``unit`` itself is not written. Its parts are records
too: :class:`ProfileSummary` (``--profile-steps``, train/profile.py) and one :class:`GpuClocks` per rank
(train/gpuwatch.py); a field marked "when known" is written only when it is known, as the breakdown has always
left out what a run without GPU kernels cannot say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_SUMMARY_BYTES = 16 * 2**20
UNITS = ("tokens", "images")

# [min, median, max] of a GPU's samples over the measured steps; a number as NVML gave it (a clock in whole
# MHz stays an integer in the JSON, a median of two may not)
Spread = tuple[int | float, int | float, int | float]
WHEN_KNOWN = {"when_known": True}  # a field written to the JSON only when known (torchrig.hw.record.to_json)


@dataclass(frozen=True)
class KernelTimes:
    """GPU time per step by part of the model, and the kernels that took the most (``profile.kernel_groups``)."""

    groups_ms: dict[str, float]  # summed kernel durations per part, largest first
    top_kernels_ms: tuple[tuple[str, float], ...]  # (kernel name, ms per step), largest first


@dataclass(frozen=True, kw_only=True)
class ProfileSummary:
    """``--profile-steps``: where rank 0's GPU time went per optimizer step (``profile.breakdown``). Without
    GPU kernels in the trace (the CPU) only the step time is known."""

    steps: int
    step_ms: float  # wall-clock step time over the profiled window
    # time some non-NCCL kernel, copy or memset runs; some NCCL kernel runs; of that, hidden behind compute
    # and with no compute beside it; the GPU runs nothing
    compute_ms: float | None = field(default=None, metadata=WHEN_KNOWN)
    comm_ms: float | None = field(default=None, metadata=WHEN_KNOWN)
    comm_overlapped_ms: float | None = field(default=None, metadata=WHEN_KNOWN)
    comm_exposed_ms: float | None = field(default=None, metadata=WHEN_KNOWN)
    idle_ms: float | None = field(default=None, metadata=WHEN_KNOWN)
    device_events: int
    comm_kernels: int | None = field(default=None, metadata=WHEN_KNOWN)
    kernels: KernelTimes | None = field(default=None, metadata=WHEN_KNOWN)
    trace: str | None = field(default=None, metadata=WHEN_KNOWN)  # the rank's Chrome trace
    # --profiler cuda: what marked the window for a profiler outside torchrig (its kernels are that tool's)
    window: str | None = field(default=None, metadata=WHEN_KNOWN)


@dataclass(frozen=True)
class GpuClocks:
    """One rank's GPU over the measured steps (``gpuwatch.GpuWatch.result``, through NVML): SM clock, power and
    temperature as :data:`Spread`, the GPU's limits, and the share of the time its driver held the clocks down.

    Not :class:`torchrig.hw.record.GpuFacts`: that record is one reading of a GPU (a clock, a temperature, a
    power draw, each one number), this one is a window of readings (spreads, a sample count, shares of the
    window's time) under the same field names, so one record for both would give ``sm_clock_mhz`` two meanings.
    The GPU itself is the summary's ``device``."""

    sm_clock_mhz: Spread | None
    sm_clock_max_mhz: int | None
    power_w: Spread | None
    power_limit_w: float | None
    # at a power limit a hotter GPU leaks more current and so runs a lower clock for the same watts
    temperature_c: Spread | None
    samples: int
    power_capped_share: float | None  # 0..1 of the window, NVML's power violation counter
    thermal_capped_share: float | None  # 0..1 of the window, NVML's thermal violation counter


@dataclass(frozen=True)
class Fp8Summary:
    """``--precision fp8``: torchao's scaling recipe, the Linear layers it converted, torchao's version."""

    recipe: str
    layers: int
    torchao: str | None


@dataclass(frozen=True)
class DdpSummary:
    """``--parallel ddp``'s levers, and the parameters all-reduced outside DDP (--ddp-overlap-embeddings)."""

    compile: str
    bucket_mb: float
    static_graph: bool
    comm_hook: str
    outside_ddp: tuple[str, ...]


@dataclass(frozen=True)
class TrainSummary:
    """What ran, how fast and where the time went (train/summary.py builds it; ``None``: unknown)."""

    steps: int
    resumed_from: int  # the step it resumed from (0: a new run)
    final_loss: float | None
    world_size: int
    precision: str
    parallel: str
    compile: bool
    compile_mode: str | None  # resolved (auto -> reduce-overhead or default); None without --compile
    step_graph: bool  # the whole step ran as one CUDA graph (train/stepgraph.py)
    attention: str
    loss: str | None  # GPT: "fused" or "plain"
    fp8: Fp8Summary | None
    ddp: DdpSummary | None
    bf16_weight_copies: int | None
    fused_mlp_blocks: int | None  # TORCHRIG_FUSED_MLP=1: blocks whose GELU runs in GEMM epilogues
    tuned_gemm_shapes: int | None  # TORCHRIG_TUNED_GEMMS: shapes on a timed cuBLASLt algorithm
    gc_every: int
    on_nonfinite: str
    skipped_steps: tuple[int, ...]  # --on-nonfinite skip: the steps skipped
    micro_batch: int
    grad_accum: int
    global_batch: int
    params: int
    device: str  # the GPU's name, or "cpu"
    rate_per_s: float | None  # steady throughput in ``unit``/s: the JSON key is f"{unit}_per_s"
    mfu: float | None
    peak_tflops: float | None
    peak_source: str
    elapsed_s: float
    profile: ProfileSummary | None  # --profile-steps: train/profile.py's breakdown (rank 0)
    gpus: tuple[GpuClocks | None, ...] | None  # every rank's GPU clocks (train/gpuwatch.py), rank order
    unit: str = "tokens"  # one of UNITS: what the model consumes

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit {self.unit!r:.30} is not one of {', '.join(UNITS)}")

    def to_json(self) -> dict[str, Any]:
        """The summary's JSON object (``summary.json``, ``train --json``'s ``summary``)."""
        from torchrig.hw.record import to_json

        data = to_json(self)
        del data["unit"]
        return {(f"{self.unit}_per_s" if k == "rate_per_s" else k): v for k, v in data.items()}

    @classmethod
    def from_json(cls, data: Any, where: str = "summary") -> TrainSummary:
        """The record of a summary's JSON object; a :class:`~torchrig.jsonrecords.RecordError` naming the key
        that does not fit."""
        from torchrig.jsonrecords import RecordError, structure

        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object")
        unit = next((u for u in UNITS if f"{u}_per_s" in data), None)
        if unit is None:
            raise RecordError(f"{where}: no tokens_per_s or images_per_s")
        rest = {k: v for k, v in data.items() if k != f"{unit}_per_s"}
        rest.setdefault("step_graph", False)  # summaries written before the step graph existed
        rest.setdefault("tuned_gemm_shapes", None)  # and before the timed GEMMs
        try:
            return structure({**rest, "rate_per_s": data[f"{unit}_per_s"], "unit": unit}, cls, where)
        except RecordError as err:  # named as the file names it
            raise RecordError(str(err).replace(f"{where}.rate_per_s", f"{where}.{unit}_per_s")) from None

    def lines(self) -> list[str]:
        """The summary's lines: what was trained and how fast, the profile, the GPUs' clocks."""
        rate, mfu, fp8 = self.rate_per_s, self.mfu, self.fp8
        lines = [
            f"trained {self.steps} steps on {self.world_size} rank(s) ({self.parallel}, {self.precision}"
            + (f" {fp8.recipe}: {fp8.layers} Linear layers" if fp8 else "")
            + f"{', compiled' if self.compile else ''}): final loss "
            + (f"{self.final_loss:.4f}" if self.final_loss is not None else "none")
            + (f", {len(self.skipped_steps)} NaN/inf step(s) skipped" if self.skipped_steps else "")
            + (f", {rate:,.0f} {self.unit}/s" if rate else "")
            + (f", MFU {mfu * 100:.1f}%" if mfu is not None else "")
        ]
        if self.profile:
            lines.append(render_profile(self.profile))
        clocks = render_clocks(list(self.gpus or []))
        if clocks:
            lines.append(clocks)
        return lines


def render_profile(p: ProfileSummary) -> str:
    """One line of ``--profile-steps``' breakdown (rank 0's GPU), and where its trace is."""
    head = f"profile, {p.steps} step(s) on rank 0: {p.step_ms:.2f} ms/step"
    trace = f"; trace {p.trace}" if p.trace else ""
    if p.window:
        return (
            f"{head}, marked by {p.window} for the outside profiler (its kernels are in that tool's report)"
        )
    if not p.device_events:
        return head + " (no GPU kernels recorded)" + trace
    return (
        f"{head}: compute {_ms(p.compute_ms)} ms, communication {_ms(p.comm_ms)} ms "
        f"({_ms(p.comm_exposed_ms)} ms of it not hidden behind compute), GPU idle {_ms(p.idle_ms)} ms" + trace
    )


def render_clocks(per_rank: list[GpuClocks | None]) -> str | None:
    """One line about the GPUs' clocks when a driver held them down for more than 5 % of the measured time."""
    parts = []
    for rank, r in enumerate(per_rank):
        if r is None:
            continue
        capped = {"power": r.power_capped_share or 0.0, "thermal": r.thermal_capped_share or 0.0}
        if max(capped.values()) <= 0.05:
            continue
        clock = r.sm_clock_mhz
        cause = " and ".join(f"{c} {v:.0%}" for c, v in capped.items() if v > 0.05)
        parts.append(
            f"rank {rank} clocks held down ({cause} of the time)"
            + (f", SM {clock[0]:.0f}-{clock[2]:.0f} MHz" if clock else "")
            + (f" of {r.sm_clock_max_mhz} MHz" if r.sm_clock_max_mhz else "")
        )
    if not parts:
        return None
    return (
        "GPU clocks: "
        + "; ".join(parts)
        + " (each GPU's speed then varies from step to step, and every multi-GPU step waits for the slowest)"
    )


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def read_summary(path: Path, what: str = "run summary") -> TrainSummary:
    """A run's ``summary.json``, read bounded and a regular file only (a FIFO or /dev/zero in its place is no
    summary, not a hang); an :class:`~torchrig.errors.InputError` of one line when it is missing or does not
    fit the record."""
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_json
    from torchrig.jsonrecords import RecordError

    data = read_json(path, what, max_bytes=MAX_SUMMARY_BYTES)
    try:
        return TrainSummary.from_json(data, path.name)
    except RecordError as err:
        raise InputError(f"{what} {str(path)!r} is malformed: {err}") from None
