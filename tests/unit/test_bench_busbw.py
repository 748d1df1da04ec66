"""busbw arithmetic against hand-computed values (nccl-tests doc/PERFORMANCE.md)."""

from __future__ import annotations

import pytest

from torchrig.bench.busbw import (
    algbw_gbps,
    busbw_factor,
    busbw_gbps,
    effective_size,
    element_counts,
    format_size,
    size_sweep,
)
from torchrig.errors import UsageError
from torchrig.sizes import parse_size

GiB = 1 << 30


@pytest.mark.parametrize(
    ("op", "ranks", "factor"),
    [
        ("all_reduce", 2, 1.0),  # 2 * 1 / 2
        ("all_reduce", 4, 1.5),  # 2 * 3 / 4
        ("all_reduce", 8, 1.75),  # 2 * 7 / 8
        ("all_gather", 2, 0.5),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("all_to_all", 8, 0.875),
        ("broadcast", 8, 1.0),
        ("sendrecv", 8, 1.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_busbw_factors(op, ranks, factor):
    assert busbw_factor(op, ranks) == pytest.approx(factor)


def test_busbw_hand_computed():
    # 1 GiB all_reduce in 3.3 ms on 2 ranks: algbw = 1073741824 / 0.0033 / 1e9 = 325.376... GB/s, factor 1
    assert algbw_gbps(GiB, 0.0033) == pytest.approx(325.3763, rel=1e-6)
    assert busbw_gbps("all_reduce", GiB, 0.0033, 2) == pytest.approx(325.3763, rel=1e-6)
    # the same on 8 ranks: x 1.75 = 569.4085
    assert busbw_gbps("all_reduce", GiB, 0.0033, 8) == pytest.approx(569.4085, rel=1e-6)
    # 256 MiB all_gather (total output) in 1 ms on 8 ranks: 268.435456 GB/s x 7/8 = 234.881024
    assert busbw_gbps("all_gather", 256 << 20, 0.001, 8) == pytest.approx(234.881024)
    # 4 GiB broadcast in 10 ms: 429.4967296 GB/s, factor 1
    assert busbw_gbps("broadcast", 4 * GiB, 0.010, 4) == pytest.approx(429.4967296)


def test_time_must_be_positive():
    with pytest.raises(ValueError):
        algbw_gbps(1, 0.0)


def test_element_counts_follow_nccl_tests_sizes():
    # all_gather S = output: 1 MiB of bf16 over 4 ranks -> 131072 in, 524288 out
    assert element_counts("all_gather", 1 << 20, 2, 4) == (131072, 524288)
    # reduce_scatter S = input
    assert element_counts("reduce_scatter", 1 << 20, 2, 4) == (524288, 131072)
    assert element_counts("all_reduce", 1 << 20, 2, 4) == (524288, 524288)
    # 1000 bytes of fp32 over 3 ranks: 83 elements each -> S = 996 bytes
    assert effective_size("all_to_all", 1000, 4, 3) == 996
    assert effective_size("all_gather", 1000, 4, 3) == 996


@pytest.mark.parametrize(
    ("text", "value"),
    [("1KiB", 1024), ("256MiB", 256 << 20), ("4G", 4 * GiB), ("4096", 4096), ("1.5K", 1536)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4XB", "GiB", "-1K", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_size_sweep_and_format():
    assert size_sweep(1024, 1 << 20) == [1024, 4096, 16384, 65536, 262144, 1 << 20]
    assert size_sweep(1024, 5000) == [1024, 4096, 5000]
    assert format_size(4 * GiB) == "4 GiB" and format_size(1536) == "1.5 KiB" and format_size(7) == "7 B"
    with pytest.raises(UsageError):
        size_sweep(2048, 1024)
