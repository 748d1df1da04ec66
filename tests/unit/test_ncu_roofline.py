"""tools/gpu/ncu_roofline.py: each part of a step against the card's memory bandwidth. The arithmetic on
kernel records here; its reading of ncu's real CSV runs in tests/gpu/test_train_profiler_gpu.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).parents[2] / "tools" / "gpu" / "ncu_roofline.py"
spec = importlib.util.spec_from_file_location("ncu_roofline", TOOL)
assert spec and spec.loader
roof = importlib.util.module_from_spec(spec)
sys.modules["ncu_roofline"] = roof  # its dataclasses look their module up
spec.loader.exec_module(roof)
K = roof.Kernel


def test_parts_time_bytes_and_the_floor_at_the_datasheet_bandwidth():
    # two steps; 4800 GB/s: 96 MB take 20 us at the floor
    kernels = 2 * [
        K("triton_poi_fused_gelu_view_9", 30e-6, 96e6),
        K("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 100e-6, 48e6),
        K("triton_per_fused__to_copy_add_native_layer_norm_backward_view_9", 25e-6, 96e6),
    ]
    rep = roof.report(kernels, steps=2, peak_gbps=4800.0)
    parts = {p["name"]: p for p in rep["parts"]}
    triton = parts["norm, GELU, adds (Triton)"]
    assert (
        triton["kernels"] == 2
        and triton["ms"] == pytest.approx(0.055)
        and triton["gb"] == pytest.approx(0.192)
    )
    assert triton["floor_ms"] == pytest.approx(0.04) and triton["excess_ms"] == pytest.approx(0.015)
    assert triton["tb_per_s"] == pytest.approx(3.491, abs=1e-3) and triton["share_of_peak"] == pytest.approx(
        0.727
    )
    assert rep["compute_bound_ms"] == pytest.approx(0.1) and rep["memory_parts_ms"] == pytest.approx(0.055)
    assert rep["memory_parts_floor_ms"] == pytest.approx(0.04) and rep["kernel_ms"] == pytest.approx(0.155)
    # the kernels ranked by time above their floor: the GEMM's 90 us first, the GELU's 10 us before the norm's 5
    assert [r["name"][:12] for r in rep["kernels_above_floor"]] == [
        "nvjet_sm90_t",
        "triton_poi_f",
        "triton_per_f",
    ]
    assert "the rest 0.055 ms, 0.040 ms of it at the datasheet bandwidth" in roof.render(rep)
    assert triton["sm_busy"] is None and "      -" in roof.render(rep).splitlines()[2]


def test_sm_busy_is_weighted_by_each_kernels_time():
    kernels = [
        K("nvjet_a_gemm", 300e-6, 1e6, 0.9),
        K("nvjet_b_gemm", 100e-6, 1e6, 0.5),
        K("nvjet_c_gemm", 1e-6, 0),
    ]
    (matmul,) = roof.report(kernels, steps=1, peak_gbps=4800.0)["parts"]
    assert matmul["sm_busy"] == pytest.approx(
        0.8
    )  # (0.9 * 300 + 0.5 * 100) / 400; the unmeasured one left out


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "no ncu CSV header"),
        ("==PROF== Disconnected\nhello\n", "no ncu CSV header"),
        ('"ID","Kernel Name"\n"0","k"\n', "no column 'Metric Name'"),
        (
            '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k","gpu__time_duration.sum","nsecond","1,000"\n',
            "pass --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum",
        ),
        (
            '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k","gpu__time_duration.sum","cycle","7"\n',
            "unknown unit 'cycle'",
        ),
        (
            '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k","dram__bytes_read.sum","byte","n/a"\n',
            "is not a number: 'n/a'",
        ),
        ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n', "holds no kernel"),
    ],
)
def test_what_is_not_ncus_csv_is_one_line_and_exit_2(tmp_path, text, says):
    with pytest.raises(roof.RooflineError) as err:
        roof.read_ncu_csv(text)
    assert says in str(err.value)
    f = tmp_path / "ncu.csv"
    f.write_text(text)
    r = subprocess.run(
        [sys.executable, str(TOOL), str(f), "--gpu", "NVIDIA H200", "--steps", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.stderr.count("\n") == 1 and says in r.stderr and "Traceback" not in r.stderr


def test_an_unknown_gpu_or_no_steps_is_one_line_and_exit_2(tmp_path):
    f = tmp_path / "ncu.csv"
    f.write_text("")
    for args, says in (
        (["--gpu", "Voodoo 5", "--steps", "1"], "Voodoo 5"),
        (["--gpu", "H200", "--steps", "0"], "--steps"),
    ):
        r = subprocess.run(
            [sys.executable, str(TOOL), str(f), *args], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
