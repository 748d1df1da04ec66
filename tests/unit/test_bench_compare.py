"""tools/gpu/bench_compare.py: the side-by-side table against the plain-PyTorch anchor (pure parts)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "bench_compare.py"
spec = importlib.util.spec_from_file_location("bench_compare", TOOL)
assert spec and spec.loader
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)

GiB = 1 << 30
# The anchor's output format (anchor_probe.py), with the figures its README reports for these machines.
SINGLE = {
    "gemm_bf16_tflops": 760.0,
    "gemm_fp16_tflops": 700.0,
    "d2d_copy_GBps_rw": 4200.0,
    "h2d_pinned_GBps": 55.0,
}
COLL = {
    "world": 2,
    "collectives": [
        {"bytes": GiB, "allreduce_busbw": 327.0, "allgather_busbw": 300.0},
        {"bytes": 4 * GiB, "allreduce_busbw": 345.0, "allgather_busbw": 320.0},
    ],
}


def report(bf16=770.0, copy=4150.0, ar_4g=350.0):
    return {
        "measurements": {
            "gemm": [
                {"rank": 0, "dtype": "bf16", "n": 8192, "tflops": bf16},
                {"rank": 0, "dtype": "bf16", "n": 16384, "tflops": 1.0},
            ],
            "memory": [{"rank": 0, "kind": "copy", "gbps": copy}],
            "host": [{"rank": 0, "direction": "h2d", "pinned": True, "gbps": 54.0}],
            "collectives": [
                {"op": "all_reduce", "size_bytes": GiB, "busbw_gbps": 330.0},
                {"op": "all_reduce", "size_bytes": 4 * GiB, "busbw_gbps": ar_4g},
                {"op": "all_gather", "size_bytes": GiB, "busbw_gbps": 290.0},
            ],
        }
    }


def rows_by_figure(rows):
    return {r["figure"]: r for r in rows}


def test_ratios_and_the_five_percent_rule():
    rows = rows_by_figure(compare.comparison(report(), SINGLE, COLL))
    bf16 = rows["GEMM bf16 8192³ (GPU 0)"]
    assert (
        bf16["torchrig"] == 770.0
        and bf16["ratio"] == pytest.approx(770 / 760)
        and bf16["ok"]
        and bf16["required"]
    )
    copy = rows["device copy, read+write (GPU 0)"]
    assert copy["ratio"] == pytest.approx(4150 / 4200) and copy["ok"]  # 98.8%: within 5%
    h2d = rows["h2d pinned 1 GiB (GPU 0)"]
    assert h2d["ratio"] == pytest.approx(54 / 55) and h2d["ok"]
    assert rows["all_reduce busbw 4 GiB (2 GPUs)"]["ok"]
    ag = rows["all_gather busbw 1 GiB (2 GPUs)"]
    assert ag["ratio"] == pytest.approx(290 / 300) and ag["ok"]  # 96.7%
    missing = rows["all_gather busbw 4 GiB (2 GPUs)"]
    assert missing["torchrig"] is None and missing["ratio"] is None and not missing["ok"]
    assert not rows["GEMM fp16 8192³ (GPU 0)"]["required"]


def test_a_figure_more_than_five_percent_low_is_flagged():
    rows = rows_by_figure(compare.comparison(report(bf16=700.0, ar_4g=320.0), SINGLE, COLL))
    assert not rows["GEMM bf16 8192³ (GPU 0)"]["ok"]  # 92.1%
    assert not rows["all_reduce busbw 4 GiB (2 GPUs)"]["ok"]  # 92.8%
    assert any("LOW" in line for line in compare.table(list(rows.values())))


def test_read_json_takes_the_last_json_line(tmp_path):
    p = tmp_path / "out"
    p.write_text("W1130 some torchrun warning\n" + json.dumps(COLL) + "\n")
    assert compare.read_json(p) == COLL
    p.write_text(json.dumps(COLL, indent=1))
    assert compare.read_json(p) == COLL
    assert compare.read_json(tmp_path / "missing") is None


def test_probe_lines_show_the_diagnostics_with_the_sm_clock():
    probe = {
        "tf32_allow_tf32_idle_tflops": 398.0,
        "tf32_allow_tf32_idle_sm_mhz": 1980,
        "tf32_right_after_fp32_16384_tflops": 351.0,
        "h2d_pageable_never_written_GBps": 20.5,
        "h2d_pageable_written_GBps": 8.5,
    }
    lines = compare.probe_lines(probe)
    assert "| GEMM tf32 8192³, allow_tf32 = True, after 1 s idle | 398.0 TFLOP/s | 1980 MHz |" in lines
    assert "| GEMM tf32 8192³ right after 25 fp32 16384³ GEMMs | 351.0 TFLOP/s | - |" in lines
    assert any("never-written" in line and "20.5 GB/s" in line for line in lines)
    assert not any("host memcpy" in line for line in lines)  # absent figures are left out
    assert compare.probe_lines(None) == []


def test_probe_lines_show_both_tf32_calls_in_the_order_measured():
    probe = {
        "tf32_allow_tf32_idle_tflops": 411.1,
        "tf32_precision_high_idle_tflops": 382.0,
        "tf32_precision_high_idle_2_tflops": 405.0,
        "tf32_allow_tf32_idle_2_tflops": 386.0,
        "tf32_allow_tf32_idle_2_sm_mhz": 1980,
    }
    rows = [line for line in compare.probe_lines(probe) if "GEMM tf32" in line]
    assert [r.split(" | ")[1] for r in rows] == [
        "411.1 TFLOP/s",
        "382.0 TFLOP/s",
        "405.0 TFLOP/s",
        "386.0 TFLOP/s",
    ]
    assert (
        rows[3] == "| GEMM tf32 8192³, allow_tf32 = True again, after 1 s idle | 386.0 TFLOP/s | 1980 MHz |"
    )


def test_probe_rows_compare_against_plain_pytorch_measured_the_same_way():
    full = {
        "measurements": {
            "gemm": [{"rank": 0, "dtype": "tf32", "n": 8192, "tflops": 400.0}],
            "host": [{"rank": 0, "direction": "h2d", "pinned": False, "gbps": 8.5}],
        }
    }
    probe = {"tf32_allow_tf32_idle_tflops": 398.0, "h2d_pageable_written_GBps": 8.6}
    rows = {r["figure"]: r for r in compare.comparison(full, {}, None, probe)}
    tf32 = rows["GEMM tf32 8192³ vs. probe after 1 s idle"]
    assert tf32["ratio"] == pytest.approx(400 / 398) and tf32["ok"] and not tf32["required"]
    page = rows["h2d pageable 1 GiB vs. probe, written buffer"]
    assert page["ratio"] == pytest.approx(8.5 / 8.6) and page["ok"]
    assert "GEMM tf32 8192³ vs. probe after 1 s idle" not in {
        r["figure"] for r in compare.comparison(full, {}, None)
    }
