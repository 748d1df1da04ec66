"""Bandwidth arithmetic for collectives, exactly as nccl-tests defines it.

Source: nccl-tests ``doc/PERFORMANCE.md`` (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
``algbw = S / t`` where ``S`` is the size nccl-tests reports for the operation and ``t`` the time of one
operation; ``busbw = algbw * factor(n)``, a correction that makes the figure comparable to the hardware's
peak link bandwidth whatever the number of ranks ``n``:

============== ========================= =========================================
operation      factor(n)                 S (bytes)
============== ========================= =========================================
all_reduce     2 (n - 1) / n             the buffer each rank reduces
all_gather     (n - 1) / n               the gathered output (n x each rank's input)
reduce_scatter (n - 1) / n               the input (n x each rank's output)
broadcast      1                         the buffer
all_to_all     (n - 1) / n               each rank's whole send buffer
sendrecv       1                         the buffer each rank sends
============== ========================= =========================================

>>> round(busbw_gbps("all_reduce", 1 << 30, 0.01, 2), 2)
107.37
>>> busbw_factor("all_gather", 4)
0.75
"""

from __future__ import annotations

import enum

from torchrig.errors import UsageError


class Collective(str, enum.Enum):
    """The collectives torchrig bench measures (names as in ``torch.distributed``, sendrecv as nccl-tests)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    ALL_TO_ALL = "all_to_all"
    SENDRECV = "sendrecv"


def busbw_factor(op: str | Collective, ranks: int) -> float:
    """The nccl-tests bus-bandwidth factor for ``op`` on ``ranks`` ranks (see the table above)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    kind = Collective(op)
    n = float(ranks)
    if kind is Collective.ALL_REDUCE:
        return 2.0 * (n - 1.0) / n
    if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        return (n - 1.0) / n
    return 1.0  # broadcast, sendrecv


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second, as nccl-tests prints it)."""
    if time_s <= 0:
        raise ValueError(f"time must be positive, got {time_s}")
    return size_bytes / time_s / 1e9


def busbw_gbps(op: str | Collective, size_bytes: int, time_s: float, ranks: int) -> float:
    """Bus bandwidth in GB/s: ``algbw * busbw_factor(op, ranks)``."""
    return algbw_gbps(size_bytes, time_s) * busbw_factor(op, ranks)


def element_counts(op: str | Collective, size_bytes: int, elem_bytes: int, ranks: int) -> tuple[int, int]:
    """(input elements, output elements) per rank for a collective whose nccl-tests size is ``size_bytes``.

    The size is rounded down so that every rank's share is a whole number of elements (as nccl-tests
    does); :func:`effective_size` gives the size actually moved.
    """
    kind = Collective(op)
    per_rank = max(1, size_bytes // elem_bytes // ranks)
    total = per_rank * ranks
    if kind is Collective.ALL_GATHER:
        return per_rank, total
    if kind is Collective.REDUCE_SCATTER:
        return total, per_rank
    if kind is Collective.ALL_TO_ALL:
        return total, total
    return total, total  # all_reduce, broadcast, sendrecv: one buffer of ``total`` elements


def effective_size(op: str | Collective, size_bytes: int, elem_bytes: int, ranks: int) -> int:
    """The nccl-tests ``S`` in bytes after rounding to whole elements per rank."""
    n_in, n_out = element_counts(op, size_bytes, elem_bytes, ranks)
    kind = Collective(op)
    return (n_out if kind is Collective.ALL_GATHER else n_in) * elem_bytes


def format_size(size_bytes: int) -> str:
    """``1073741824`` -> ``"1 GiB"``; sizes that are not whole units keep one decimal."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale:
            value = size_bytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size_bytes} B"


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes`` multiplying by ``factor`` (nccl-tests ``-b -e -f``)."""
    if min_bytes > max_bytes:
        raise UsageError(
            f"--min-size {format_size(min_bytes)} is above --max-size {format_size(max_bytes)}",
            hint="swap them",
        )
    if factor < 2:
        raise UsageError(f"size factor must be >= 2, got {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes
