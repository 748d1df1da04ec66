"""A train run's summary as a typed record: :class:`TrainSummary`, built by rank 0 in ``summary.finish`` (the
one place), written to ``OUT/summary.json`` and the ``end`` event of ``metrics.jsonl``, read back by
:func:`read_summary` (``torchrig train`` after its ranks end, ``bench``'s scaling runs) and printed by
:meth:`TrainSummary.lines`. No torch here: the CLI and bench read summaries without it.

The JSON keys are the field names, in field order, except the throughput: ``tokens_per_s`` (GPT) or
``images_per_s`` (ResNet), as the run's ``unit`` says; ``unit`` itself is not written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_SUMMARY_BYTES = 16 * 2**20
UNITS = ("tokens", "images")


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
    attention: str
    loss: str | None  # GPT: "fused" or "plain"
    fp8: Fp8Summary | None
    ddp: DdpSummary | None
    bf16_weight_copies: int | None
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
    profile: dict[str, Any] | None  # --profile-steps: train/profile.py's breakdown (rank 0)
    gpus: tuple[dict[str, Any] | None, ...] | None  # every rank's GPU clocks (train/gpuwatch.py), rank order
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
        try:
            return structure({**rest, "rate_per_s": data[f"{unit}_per_s"], "unit": unit}, cls, where)
        except RecordError as err:  # named as the file names it
            raise RecordError(str(err).replace(f"{where}.rate_per_s", f"{where}.{unit}_per_s")) from None

    def lines(self) -> list[str]:
        """The summary's lines: what was trained and how fast, the profile, the GPUs' clocks."""
        from torchrig.train.gpuwatch import render as render_gpus

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
        clocks = render_gpus(list(self.gpus or []))
        if clocks:
            lines.append(clocks)
        return lines


def render_profile(p: dict[str, Any]) -> str:
    """One line of ``--profile-steps``' breakdown (rank 0's GPU), and where its trace is."""
    head = f"profile, {p['steps']} step(s) on rank 0: {p['step_ms']:.2f} ms/step"
    if not p.get("device_events"):
        return head + " (no GPU kernels recorded)" + (f"; trace {p['trace']}" if p.get("trace") else "")
    return (
        f"{head}: compute {p['compute_ms']:.2f} ms, communication {p['comm_ms']:.2f} ms "
        f"({p['comm_exposed_ms']:.2f} ms of it not hidden behind compute), GPU idle {p['idle_ms']:.2f} ms"
        + (f"; trace {p['trace']}" if p.get("trace") else "")
    )


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
