"""Typed records of one bench run: what the workers measured, and how each figure was graded.

Units are in field names (``tflops``, ``gbps`` = 10^9 bytes/s, ``ms``, ``us``); ``None`` means unknown or not
measured. The worker writes :class:`Measurements` as JSON; the CLI reads it back with
:func:`measurements_from_json`, grades it (``torchrig.bench.grading``) and renders it (``render``, ``plots``).
Each rank's GPU is the one record of a GPU's facts (:class:`torchrig.hw.record.GpuFacts`) in a
:class:`RankGpu`; the result format (``schema.json``) is unchanged, so every stored result still reads.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

from torchrig.hw.record import GpuFacts

MEASUREMENTS_SCHEMA = 1


@dataclasses.dataclass(frozen=True)
class RankGpuJson:
    """How a result file writes one rank's device (schema.json's ``gpus`` items, unchanged since schema 1):
    the format, read into :class:`RankGpu`."""

    rank: int
    device_index: int | None  # CUDA ordinal; None on the CPU path
    name: str  # as torch reports it ("NVIDIA H200"), or "cpu"
    compute_capability: str | None  # "9.0"
    memory_mib: int | None
    l2_cache_bytes: int | None


@dataclasses.dataclass(frozen=True)
class RankGpu:
    """One rank's device: its GPU as the one record of a GPU's facts (:class:`torchrig.hw.record.GpuFacts`,
    filled from torch's CUDA device properties: index, name, compute capability, memory, L2 cache), or None
    on the CPU path. Written and read as :class:`RankGpuJson` (``JSON_SHAPE``, torchrig.jsonrecords)."""

    JSON_SHAPE: ClassVar[type] = RankGpuJson
    rank: int
    gpu: GpuFacts | None

    @property
    def name(self) -> str:
        return "cpu" if self.gpu is None else self.gpu.name or "unknown GPU"

    @property
    def l2_cache_bytes(self) -> int | None:
        return None if self.gpu is None else self.gpu.l2_cache_bytes

    def to_json(self) -> dict[str, Any]:
        g = self.gpu
        return dataclasses.asdict(
            RankGpuJson(
                self.rank,
                None if g is None else g.index,
                self.name,
                None if g is None else g.compute_capability,
                None if g is None else g.memory_total_mib,
                self.l2_cache_bytes,
            )
        )

    @classmethod
    def from_shape(cls, j: RankGpuJson) -> RankGpu:
        if j.device_index is None:  # the CPU path
            return cls(j.rank, None)
        gpu = GpuFacts(
            index=j.device_index,
            name=j.name,
            compute_capability=j.compute_capability,
            memory_total_mib=j.memory_mib,
            l2_cache_bytes=j.l2_cache_bytes,
        )
        return cls(j.rank, gpu)


@dataclasses.dataclass(frozen=True)
class GemmResult:
    rank: int
    dtype: str  # fp32 | tf32 | bf16 | fp16 | fp8
    n: int  # square n x n x n
    tflops: float  # 2 n^3 / t
    median_ms: float
    repeats: int
    check_ok: bool
    max_rel_err: float | None
    note: str = ""
    # The GPU's state as the timed repeats ended (NVML; None without it): it tells a slow figure's cause.
    sm_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None

    def __post_init__(self) -> None:
        from torchrig.bench.config import GEMM_DTYPES

        if self.dtype not in GEMM_DTYPES:  # a report's dtype is one the bench measures (grading sorts by it)
            raise ValueError(f"gemm dtype {self.dtype!r:.30} is not one of {', '.join(GEMM_DTYPES)}")


@dataclasses.dataclass(frozen=True)
class MemoryResult:
    rank: int
    kind: str  # copy | triad
    size_bytes: int  # one array
    gbps: float  # bytes read + written per second
    median_ms: float
    repeats: int
    check_ok: bool


@dataclasses.dataclass(frozen=True)
class HostResult:
    rank: int
    direction: str  # h2d | d2h
    pinned: bool
    size_bytes: int
    gbps: float
    median_ms: float
    repeats: int
    check_ok: bool


@dataclasses.dataclass(frozen=True)
class P2PResult:
    src: int  # rank (= GPU of that rank)
    dst: int
    size_bytes: int
    oneway_gbps: float
    bidir_gbps: float  # both directions at once, the sum
    latency_us: float  # one-way, half a ping-pong round trip of a small message
    check_ok: bool


@dataclasses.dataclass(frozen=True)
class CollectiveResult:
    op: str  # torchrig.bench.busbw.Collective
    size_bytes: int  # nccl-tests S
    dtype: str
    ranks: int
    time_us: float  # one operation, averaged over iterations and ranks
    algbw_gbps: float
    busbw_gbps: float
    iterations: int
    check_ok: bool


@dataclasses.dataclass(frozen=True)
class ScalingResult:
    gpus: int
    tokens_per_s: float
    step_ms: float
    efficiency: float | None  # tokens_per_s / (gpus * tokens_per_s at 1 GPU)


@dataclasses.dataclass(frozen=True)
class Skipped:
    part: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Meta:
    date_utc: str
    hostname: str
    command_line: str
    device_kind: str  # cuda | cpu
    backend: str  # nccl | gloo
    world_size: int
    quick: bool
    torch_version: str
    cuda_version: str | None
    nccl_version: str | None
    elapsed_s: float
    scaling_model: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Everything one run measured (no grading yet)."""

    meta: Meta
    gpus: tuple[RankGpu, ...] = ()
    gemm: tuple[GemmResult, ...] = ()
    memory: tuple[MemoryResult, ...] = ()
    host: tuple[HostResult, ...] = ()
    p2p: tuple[P2PResult, ...] = ()
    collectives: tuple[CollectiveResult, ...] = ()
    scaling: tuple[ScalingResult, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    schema_version: int = MEASUREMENTS_SCHEMA


class Grade(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    NO_GPU = "no GPU"  # measured on the CPU path: nothing to grade against
    UNKNOWN = "unknown"  # no datasheet figure for this GPU
    INFO = "info"  # shown against a reference, never graded (pageable host copies: bounded by the host)


@dataclasses.dataclass(frozen=True)
class GradedFigure:
    """One graded figure: ``value`` against ``expected`` (a datasheet peak or a reference), and the verdict.

    Not a diagnostic :class:`torchrig.findings.Finding`: a measurement with a grade."""

    id: str  # e.g. "gemm.bf16.rank0", "p2p.0-1", "collective.all_reduce"
    figure: str  # human label
    value: float
    unit: str
    expected: float | None
    expected_what: str  # "bf16 datasheet peak", "NVLink per direction", ...
    fraction: float | None
    grade: Grade
    message: str = ""


def measurements_to_json(m: Measurements) -> dict[str, Any]:
    """:class:`Measurements` as JSON (the worker's file, ``bench.json``'s ``measurements``)."""
    data = dataclasses.asdict(m)
    data["gpus"] = [g.to_json() for g in m.gpus]
    return data


def measurements_from_json(data: Any) -> Measurements:
    """Rebuild :class:`Measurements` from its JSON form (as the worker writes it, or inside ``--json``); a
    :class:`~torchrig.jsonrecords.RecordError` (a ValueError) naming the key that does not fit."""
    from torchrig.jsonrecords import RecordError, structure

    if not isinstance(data, dict) or data.get("schema_version") != MEASUREMENTS_SCHEMA:
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise RecordError(f"unsupported measurements schema_version {version!r:.30}")
    return structure(data, Measurements, "measurements")
