"""What one ``torchrig bench`` run measures: parts, sizes and repeats, as a frozen, validated config.

The CLI builds a :class:`BenchConfig` from its options (:func:`make_config`), the launcher passes it to every
worker as JSON, and the workers only read it. Presets: the full run on a GPU, ``--quick`` (under a minute
on one GPU), and the CPU/gloo path, which uses small sizes so CI can exercise the same code.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from torchrig.bench.busbw import Collective, size_sweep
from torchrig.errors import UsageError


class Part(str, enum.Enum):
    GEMM = "gemm"
    MEMORY = "memory"
    HOST = "host"
    P2P = "p2p"
    COLLECTIVES = "collectives"
    SCALING = "scaling"


GEMM_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    device_kind: str  # "cuda" | "cpu"
    quick: bool
    parts: tuple[str, ...]
    gemm_dtypes: tuple[str, ...]
    gemm_sizes: tuple[int, ...]
    gemm_repeats: int
    memory_bytes: int
    memory_repeats: int
    host_bytes: int
    host_repeats: int
    p2p_bytes: int
    p2p_iterations: int
    collectives: tuple[str, ...]
    collective_sizes: tuple[int, ...]
    collective_dtype: str  # "bf16" on CUDA (as the baseline), "fp32" on the CPU path
    scaling_steps: int
    scaling_warmup: int
    warmup: int = 5  # as the anchor and nccl-tests (-w 5)
    # Seconds the GPU idles before each GEMM's timed repeats, so each starts in the same clock and power
    # state (a burst after idle, as a single-figure benchmark measures it) whatever ran before it.
    gemm_settle_s: float = 1.0
    command_line: str = ""

    def __post_init__(self) -> None:
        if self.device_kind not in ("cuda", "cpu"):
            raise UsageError(f"unknown device kind {self.device_kind!r}", hint="use cuda or cpu")
        for p in self.parts:
            Part(p)
        for d in self.gemm_dtypes:
            if d not in GEMM_DTYPES:
                raise UsageError(f"unknown GEMM dtype {d!r}", hint=f"choose from {', '.join(GEMM_DTYPES)}")
        for c in self.collectives:
            Collective(c)
        if not self.collective_sizes and Part.COLLECTIVES.value in self.parts:
            raise UsageError("no collective sizes", hint="check --min-size and --max-size")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchConfig:
        """The config bench wrote for its workers (``to_json``), read into the record."""
        from torchrig.jsonrecords import structure

        return structure(json.loads(text), cls, "bench config")


def collective_iterations(size_bytes: int, quick: bool) -> tuple[int, int, int]:
    """(warm-up, iterations per timed block, timed blocks) for one size: fewer at big sizes.

    nccl-tests times ``iters`` operations launched back to back and divides (defaults: 5 warm-up, 20 iters);
    we do the same, in a few blocks whose median we keep.
    """
    if size_bytes >= GiB:
        return 2, 5, 3
    if size_bytes >= 64 * MiB:
        return 3, 10, 3
    return 5, 20 if quick else 50, 3


def make_config(
    *,
    device_kind: str,
    quick: bool,
    parts: tuple[str, ...] | None = None,
    collectives: tuple[str, ...] | None = None,
    min_size: int | None = None,
    max_size: int | None = None,
    gemm_dtypes: tuple[str, ...] | None = None,
    command_line: str = "",
) -> BenchConfig:
    """The preset for this device and speed, with the user's choices applied."""
    cuda = device_kind == "cuda"
    if cuda and not quick:
        lo, hi = 1 * KiB, 4 * GiB
        preset: dict[str, Any] = dict(
            gemm_sizes=(8192, 16384),
            gemm_repeats=20,
            memory_bytes=4 * GiB,
            memory_repeats=20,
            host_bytes=1 * GiB,
            host_repeats=10,
            p2p_bytes=256 * MiB,
            p2p_iterations=20,
            scaling_steps=60,
            scaling_warmup=20,
        )
    elif cuda:
        lo, hi = 64 * KiB, 256 * MiB
        preset = dict(
            gemm_sizes=(8192,),
            gemm_repeats=10,
            memory_bytes=1 * GiB,
            memory_repeats=10,
            host_bytes=256 * MiB,
            host_repeats=5,
            p2p_bytes=64 * MiB,
            p2p_iterations=10,
            scaling_steps=20,
            scaling_warmup=5,
        )
    else:  # the CPU/gloo path: small sizes, the same code
        lo, hi = 1 * KiB, (256 * KiB if quick else 1 * MiB)
        preset = dict(
            gemm_sizes=(128,) if quick else (256,),
            gemm_repeats=5,
            memory_bytes=4 * MiB,
            memory_repeats=5,
            host_bytes=0,
            host_repeats=0,
            p2p_bytes=256 * KiB,
            p2p_iterations=5,
            scaling_steps=6,
            scaling_warmup=2,
        )
    sizes = size_sweep(min_size or lo, max_size or hi)
    return BenchConfig(
        device_kind=device_kind,
        quick=quick,
        parts=tuple(parts or (p.value for p in Part)),
        gemm_dtypes=tuple(gemm_dtypes or (GEMM_DTYPES if cuda else ("fp32", "bf16"))),
        collectives=tuple(collectives or (c.value for c in Collective)),
        collective_sizes=tuple(sizes),
        collective_dtype="bf16" if cuda else "fp32",
        command_line=command_line,
        **preset,
    )
