"""Grading: every figure as a fraction of what the hardware should do, and pass / warn / fail.

Pure functions of :class:`~torchrig.bench.records.Measurements`, the GPUs' datasheet peaks (from the
knowledge base, passed in) and the thresholds in ``thresholds.toml``. On the CPU path every figure is graded
``no GPU``; a GPU the knowledge base does not know, or a figure its datasheet does not state, is ``unknown``.
Links: a pair of GPUs is graded against NVLink when the datasheet lists NVLink, else PCIe; datasheets state
both directions together, so one direction is half.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from torchrig.bench.busbw import format_size
from torchrig.bench.config import GEMM_DTYPES
from torchrig.bench.records import Grade, GradedFigure, Measurements

DOCTOR = "run 'torchrig doctor' to check links, clocks and the PCIe width"
PAGEABLE_NOTE = (
    "not graded: the driver copies pageable memory through its pinned staging buffers with a host memcpy, "
    "so the host's memory copy speed bounds it, not PCIe; use pinned memory (DataLoader(pin_memory=True))"
)
MIN_GRADED_COLLECTIVE_BYTES = 64 << 20  # below this, collectives are latency-bound: their busbw says little


class Peaks(Protocol):
    """The knowledge base's datasheet peaks (``torchrig.compat.kb.Peaks``); ``None`` = not stated."""

    @property
    def fp32_tflops(self) -> float | None: ...
    @property
    def tf32_tflops(self) -> float | None: ...
    @property
    def bf16_tflops(self) -> float | None: ...
    @property
    def fp16_tflops(self) -> float | None: ...
    @property
    def fp8_tflops(self) -> float | None: ...
    @property
    def memory_bandwidth_gbps(self) -> float | None: ...
    @property
    def nvlink_bandwidth_gbps(self) -> float | None: ...
    @property
    def pcie_bandwidth_gbps(self) -> float | None: ...


@dataclasses.dataclass(frozen=True)
class Threshold:
    metric: str
    pass_at: float
    warn_at: float
    why: str


@dataclasses.dataclass(frozen=True)
class _ThresholdsFile:
    threshold: tuple[Threshold, ...]


def load_thresholds() -> dict[str, Threshold]:
    """``thresholds.toml``, read as torchrig's data files are (``torchrig.data.packaged``) into records; a
    damaged file is one line naming it."""
    from torchrig.data import packaged
    from torchrig.errors import InputError
    from torchrig.jsonrecords import RecordError, structure

    where = "torchrig/bench/thresholds.toml"
    try:
        rows = structure(packaged("torchrig.bench", "thresholds.toml"), _ThresholdsFile, where).threshold
    except RecordError as err:
        raise InputError(f"torchrig's data file {err}", hint="reinstall torchrig") from None
    return {r.metric: r for r in rows}


def grade_fraction(fraction: float, threshold: Threshold) -> Grade:
    if fraction >= threshold.pass_at:
        return Grade.PASS
    if fraction >= threshold.warn_at:
        return Grade.WARN
    return Grade.FAIL


def link_per_direction_gbps(peaks: Peaks | None) -> tuple[float | None, str]:
    """(GB/s one way, the link's name) for a GPU pair: NVLink when the datasheet has it, else PCIe."""
    if peaks is None:
        return None, "link"
    if peaks.nvlink_bandwidth_gbps:
        return peaks.nvlink_bandwidth_gbps / 2, "NVLink"
    if peaks.pcie_bandwidth_gbps:
        return peaks.pcie_bandwidth_gbps / 2, "PCIe"
    return None, "link"


class _Grader:
    def __init__(
        self, m: Measurements, peaks_by_rank: Mapping[int, Peaks | None], thresholds: Mapping[str, Threshold]
    ) -> None:
        self.m, self.peaks, self.th = m, peaks_by_rank, thresholds
        self.no_gpu = m.meta.device_kind != "cuda"
        self.who = "rank" if self.no_gpu else "GPU"  # the CPU path has processes, not GPUs
        self.findings: list[GradedFigure] = []

    def add(
        self,
        id: str,
        figure: str,
        value: float,
        unit: str,
        expected: float | None,
        expected_what: str,
        metric: str,
        check_ok: bool = True,
        advice: str = "",
        unknown: str = "",
    ) -> None:
        fraction = value / expected if expected else None
        if not check_ok:
            grade, msg = (
                Grade.FAIL,
                "the result differs from the reference: the hardware or the software stack computes wrong values",
            )
        elif self.no_gpu:
            grade, msg = Grade.NO_GPU, "no GPU: measured on the CPU with gloo, nothing to grade against"
        elif fraction is None:
            grade, msg = Grade.UNKNOWN, unknown or f"no {expected_what} in the knowledge base for this GPU"
        else:
            grade = grade_fraction(fraction, self.th[metric])
            msg = f"{fraction:.0%} of {expected_what} ({expected:,.0f} {unit})"
            if grade is not Grade.PASS and advice:
                msg += f"; {advice}"
        self.findings.append(
            GradedFigure(
                id=id,
                figure=figure,
                value=value,
                unit=unit,
                expected=None if self.no_gpu else expected,
                expected_what=expected_what,
                fraction=None if self.no_gpu else fraction,
                grade=grade,
                message=msg,
            )
        )

    def peak(self, rank: int, attr: str) -> float | None:
        p = self.peaks.get(rank)
        return getattr(p, attr, None) if p is not None else None

    def device(self) -> None:
        best: dict[tuple[int, str], Any] = {}
        for g in self.m.gemm:  # the best size per GPU and dtype; a wrong result wins, to be seen
            old = best.get((g.rank, g.dtype))
            if old is None or (old.check_ok and (not g.check_ok or g.tflops > old.tflops)):
                best[(g.rank, g.dtype)] = g
        for (rank, dtype), g in sorted(best.items(), key=lambda kv: (kv[0][0], GEMM_DTYPES.index(kv[0][1]))):
            self.add(
                f"gemm.{dtype}.gpu{rank}",
                f"{self.who} {rank} GEMM {dtype} ({g.n}³)",
                g.tflops,
                "TFLOP/s",
                self.peak(rank, f"{dtype}_tflops"),
                f"{dtype} datasheet peak",
                "gemm",
                g.check_ok,
                "check clocks, power cap and temperature: " + DOCTOR,
            )
        for r in self.m.memory:
            self.add(
                f"memory.{r.kind}.gpu{r.rank}",
                f"{self.who} {r.rank} device {r.kind}",
                r.gbps,
                "GB/s",
                self.peak(r.rank, "memory_bandwidth_gbps"),
                "memory datasheet bandwidth",
                "memory",
                r.check_ok,
                DOCTOR,
            )
        for h in self.m.host:
            if h.pinned:
                pcie = self.peak(h.rank, "pcie_bandwidth_gbps")
                self.add(
                    f"host.{h.direction}.pinned.gpu{h.rank}",
                    f"{self.who} {h.rank} {h.direction} pinned",
                    h.gbps,
                    "GB/s",
                    pcie / 2 if pcie else None,
                    "PCIe per direction",
                    "host_pinned",
                    h.check_ok,
                    DOCTOR,
                )
            else:
                self.pageable(h)

    def pageable(self, h: Any) -> None:
        """Informational: a pageable copy is a host memcpy into the driver's staging buffers, then DMA."""
        pinned = next(
            (p for p in self.m.host if p.rank == h.rank and p.direction == h.direction and p.pinned), None
        )
        expected = pinned.gbps if pinned is not None else None
        fraction = h.gbps / expected if expected else None
        if not h.check_ok or self.no_gpu:
            self.add(
                f"host.{h.direction}.pageable.gpu{h.rank}",
                f"{self.who} {h.rank} {h.direction} pageable",
                h.gbps,
                "GB/s",
                None,
                "",
                "host_pinned",
                h.check_ok,
            )
            return
        share = f"{fraction:.0%} of the pinned copy ({expected:,.1f} GB/s); " if fraction is not None else ""
        self.findings.append(
            GradedFigure(
                id=f"host.{h.direction}.pageable.gpu{h.rank}",
                figure=f"{self.who} {h.rank} {h.direction} pageable",
                value=h.gbps,
                unit="GB/s",
                expected=expected,
                expected_what="pinned copy, measured",
                fraction=fraction,
                grade=Grade.INFO,
                message=share + PAGEABLE_NOTE,
            )
        )

    def links(self) -> None:
        for p in self.m.p2p:
            per_dir, name = link_per_direction_gbps(self.peaks.get(p.src))
            advice = f"GPU pair {p.src}↔{p.dst} is far below its {name}: a link may be down or P2P disabled; {DOCTOR}"
            self.add(
                f"p2p.{p.src}-{p.dst}",
                f"P2P {p.src}→{p.dst} one way",
                p.oneway_gbps,
                "GB/s",
                per_dir,
                f"{name} per direction",
                "p2p_oneway",
                p.check_ok,
                advice,
            )
            if p.src < p.dst:
                self.add(
                    f"p2p.{p.src}-{p.dst}.bidir",
                    f"P2P {p.src}↔{p.dst} both ways",
                    p.bidir_gbps,
                    "GB/s",
                    per_dir * 2 if per_dir else None,
                    f"{name} both directions",
                    "p2p_bidir",
                    p.check_ok,
                    advice,
                )
        per_dir, name = link_per_direction_gbps(self.peaks.get(0))
        for op in dict.fromkeys(c.op for c in self.m.collectives):
            rows = [c for c in self.m.collectives if c.op == op]
            bad = [c for c in rows if not c.check_ok]
            big = [c for c in rows if c.size_bytes >= MIN_GRADED_COLLECTIVE_BYTES]
            row = bad[0] if bad else max(big or rows, key=lambda c: c.busbw_gbps)
            self.add(
                f"collective.{op}",
                f"{op} busbw ({format_size(row.size_bytes)}, {row.ranks} ranks)",
                row.busbw_gbps,
                "GB/s",
                per_dir if big else None,
                f"{name} per direction",
                "collective",
                not bad,
                DOCTOR,
                unknown=""
                if big
                else f"not graded: messages below {format_size(MIN_GRADED_COLLECTIVE_BYTES)} are latency-bound",
            )

    def failures(self) -> None:
        for i, s in enumerate(self.m.skipped):
            if s.reason.startswith("failed"):
                self.findings.append(
                    GradedFigure(
                        id=f"{s.part.split()[0]}.failed.{i}",
                        figure=s.part,
                        value=0.0,
                        unit="",
                        expected=None,
                        expected_what="",
                        fraction=None,
                        grade=Grade.FAIL,
                        message=f"the measurement {s.reason}",
                    )
                )

    def scaling(self) -> None:
        for s in self.m.scaling:
            if s.gpus > 1 and s.efficiency is not None:
                self.add(
                    f"scaling.{s.gpus}",
                    f"training scaling on {s.gpus} {self.who}s",
                    s.efficiency * 100,
                    "%",
                    100.0,
                    "linear scaling",
                    "scaling",
                    True,
                    "check the collectives above and the input pipeline; " + DOCTOR,
                )


def grade(
    m: Measurements,
    peaks_by_rank: Mapping[int, Peaks | None],
    thresholds: Mapping[str, Threshold] | None = None,
) -> list[GradedFigure]:
    """Every graded figure of ``m``, in report order."""
    g = _Grader(m, peaks_by_rank, thresholds or load_thresholds())
    g.device()
    g.links()
    g.scaling()
    g.failures()
    return g.findings


def summary(findings: list[GradedFigure]) -> dict[str, int]:
    counts = {grade.value: 0 for grade in Grade}
    for f in findings:
        counts[f.grade.value] += 1
    return counts


def kb_peaks(m: Measurements, lookup: Callable[[str], Peaks | None] | None = None) -> dict[int, Peaks | None]:
    """Each rank's datasheet peaks, looked up by the GPU name torch reported (``None`` when unknown)."""
    find = lookup or find_peaks
    return {g.rank: (find(g.name) if g.gpu is not None else None) for g in m.gpus}


def find_peaks(name: str) -> Peaks | None:
    """The knowledge base's peaks for a GPU name; ``None`` when the GPU or the knowledge base is missing."""
    from torchrig.compat import load_kb
    from torchrig.errors import TorchrigError

    try:
        return load_kb().find_gpu(name).peaks
    except TorchrigError:  # an unknown or ambiguous GPU name, a damaged knowledge base: grade as unknown
        return None
