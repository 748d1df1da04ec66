"""torchrig bench on a real GPU: the measuring code, its checks, and the graded CLI run (skipped without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torchrig.bench import device as dev  # noqa: E402


@pytest.fixture(scope="module")
def cuda0():
    d = torch.device("cuda", 0)
    torch.cuda.set_device(d)
    return d


@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16", "fp16"])
def test_gemm_is_checked_and_fast(cuda0, dtype):
    l2 = torch.cuda.get_device_properties(cuda0).L2_cache_size
    r = dev.measure_gemm(torch, cuda0, dtype, 4096, repeats=5, warmup=2, l2_cache_bytes=l2, rank=0)
    assert r.check_ok, r
    assert r.tflops > 5 and r.median_ms > 0


def test_gemm_records_the_gpu_state_where_nvml_answers(cuda0):
    state = dev.gpu_state_reader(torch, cuda0)
    if state is None:
        pytest.skip("no NVML (pynvml) here")
    r = dev.measure_gemm(
        torch,
        cuda0,
        "bf16",
        4096,
        repeats=5,
        warmup=2,
        l2_cache_bytes=None,
        rank=0,
        settle_s=0.2,
        state=state,
    )
    assert r.check_ok and r.sm_clock_mhz and r.sm_clock_mhz > 100, r
    assert r.temperature_c is not None and 0 < r.temperature_c < 120, r


def test_fp8_gemm_where_supported(cuda0):
    why = dev.fp8_supported(torch, cuda0)
    if why:
        pytest.skip(why)
    r = dev.measure_gemm(torch, cuda0, "fp8", 4096, repeats=5, warmup=2, l2_cache_bytes=None, rank=0)
    assert r.check_ok and r.max_rel_err is not None and r.tflops > 50, r


@pytest.mark.parametrize("kind", ["copy", "triad"])
def test_device_memory(cuda0, kind):
    r = dev.measure_memory(torch, cuda0, kind, 256 << 20, repeats=5, warmup=2, l2_cache_bytes=None, rank=0)
    assert r.check_ok and r.gbps > 100, r


@pytest.mark.parametrize("pinned", [True, False])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_host_transfers(cuda0, direction, pinned):
    r = dev.measure_host(torch, cuda0, direction, pinned, 64 << 20, repeats=3, warmup=1, rank=0)
    assert r.check_ok and r.gbps > 0.5, r


def test_one_gpu_run_is_graded_against_the_datasheet(cli):
    r = cli(
        "bench",
        "--quick",
        "--nproc-per-node",
        "1",
        "--only",
        "gemm,memory,host",
        "--dtypes",
        "bf16",
        "--json",
        timeout=300,
    )
    assert r.code in (0, 1), r.err[-3000:]
    data = r.json()
    assert data["measurements"]["meta"]["device_kind"] == "cuda"
    grades = {f["id"]: f for f in data["findings"]}
    bf16 = grades["gemm.bf16.gpu0"]
    assert bf16["grade"] in ("pass", "warn", "fail", "unknown")
    if bf16["grade"] != "unknown":  # the knowledge base knows this GPU
        assert bf16["fraction"] == pytest.approx(bf16["value"] / bf16["expected"])
    for direction in ("h2d", "d2h"):  # pageable: shown against the pinned copy, never graded
        page = grades[f"host.{direction}.pageable.gpu0"]
        assert page["grade"] == "info"
        assert page["expected"] == pytest.approx(grades[f"host.{direction}.pinned.gpu0"]["value"])


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpu_links_and_collectives_are_checked(cli):
    r = cli(
        "bench",
        "--nproc-per-node",
        "2",
        "--only",
        "p2p,collectives",
        "--min-size",
        "1MiB",
        "--max-size",
        "64MiB",
        "--json",
        timeout=300,
    )
    assert r.code in (0, 1), r.err[-3000:]
    m = r.json()["measurements"]
    assert m["meta"]["backend"] == "nccl"
    assert all(c["check_ok"] for c in m["collectives"]) and {c["ranks"] for c in m["collectives"]} == {2}
    assert sorted((p["src"], p["dst"]) for p in m["p2p"]) == [(0, 1), (1, 0)]
    assert all(p["check_ok"] and p["oneway_gbps"] > 1 for p in m["p2p"])


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_dead_gpu_rank_is_named_by_the_launchers_summary(tmp_path):
    """On NCCL as on gloo: bench's workers start through the launch API, so a worker killed mid-run is named
    with how it ended and the likely cause (tests/integration/test_bench_gloo.py does the same on the CPU)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import rankkill

    options = ("--nproc-per-node", "2", "--only", "collectives", "--collectives", "all_reduce",
               "--min-size", "1GiB", "--max-size", "4GiB")  # fmt: skip
    rankkill.check_the_summary_names_it(tmp_path, *rankkill.bench_with_a_killed_rank(tmp_path, *options))
