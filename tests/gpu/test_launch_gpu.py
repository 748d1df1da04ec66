"""torchrig launch with real NCCL on a GPU: a collective that times out ends the job, and the ranks' flight
records say which collective is stuck. Skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "launch" / "nccl_kernel_ahead.py"


def launch_kernel_ahead(tmp_path: Path, *options: str) -> tuple[dict, float]:
    """``torchrig --json launch --gpus 1`` of the script with ``options``: (its result, seconds taken)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_PORT")}
    t0 = time.monotonic()
    argv = ["launch", "--gpus", "1", "--no-preflight", *options, "--log-dir", str(tmp_path), str(SCRIPT)]
    r = subprocess.run(
        [sys.executable, "-m", "torchrig", "--json", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr[-3000:]
    return json.loads(r.stdout)["result"], took


def test_nccl_timeout_ends_the_job_after_the_grace_with_the_flight_record(tmp_path):
    """One rank's all_reduce queued behind a 60 s kernel times out after 10 s. torch 2.11 logs the timeout,
    dumps the flight record and keeps the process running; torchrig stops the job 10 s later, long before
    the kernel ends, names the watchdog as the reason and lists the flight record it put in the log folder."""
    res, took = launch_kernel_ahead(tmp_path, "--collective-timeout", "10", "--nccl-timeout-grace", "10")
    assert res["stopped_by"] == "nccl-timeout", res
    assert res["stop_reason"].startswith("rank 0's NCCL watchdog caught a collective timeout")
    assert "timed out after 10 s (NCCL watchdog)" in res["summary"]["likely_cause"]
    assert took < 58, took  # timeout 10 + grace 10 + stop + start-up: before the 60 s kernel ends
    assert [Path(f).name for f in res["flight_records"]] == ["nccl_trace_rank_0"]
    assert Path(res["flight_records"][0]).parent == tmp_path
    assert res["flight"]["headline"].startswith("collective #2 (nccl:all_reduce Float[1048576])")
    assert res["flight"]["headline"].endswith(
        "is pending on rank 0: it never started on the GPU: the work queued ahead of it there has not finished"
    )


def test_a_hang_without_an_nccl_timeout_still_gets_the_flight_record_from_the_rank(tmp_path):
    """The same rank with a 600 s collective timeout: NCCL never dumps. torchrig's hang watchdog (15 s of
    silence) asks the rank for its record, which the rank shim writes while the main thread waits in .item()."""
    res, took = launch_kernel_ahead(tmp_path, "--collective-timeout", "600", "--hang-timeout", "15")
    assert res["stopped_by"] == "hang-timeout", res
    assert took < 58, took  # before the 60 s kernel ends
    assert [Path(f).name for f in res["flight_records"]] == ["nccl_trace_rank_0"]
    assert res["flight"]["headline"].startswith("collective #2 (nccl:all_reduce Float[1048576])"), res[
        "flight"
    ]
    assert "never started on the GPU" in res["flight"]["headline"]


def test_a_cold_launch_plans_from_nvml_torch_agrees_beside_the_job_and_the_next_launch_reuses_it(tmp_path):
    """An empty cache: the plan comes from NVML, the job starts, torch's probe beside it agrees (the ``cuda``
    finding is ok) and its answer is kept; the next launch plans from that answer and runs no ``cuda`` check.
    The plan is the same both times."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("pynvml")
    script = Path(__file__).resolve().parents[1] / "fixtures" / "launch" / "first_line.py"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_PORT")}
    env["TORCHRIG_CACHE_DIR"] = str(tmp_path / "cache")
    reports = []
    for run in ("cold", "warm"):
        r = subprocess.run(
            [sys.executable, "-m", "torchrig", "--json", "launch", "--gpus", "1", "--log-dir", str(tmp_path / run),
             str(script)],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        reports.append(json.loads(r.stdout))
    cold, warm = ({f["id"]: f for f in rep["preflight"]} for rep in reports)
    assert cold["cuda"]["severity"] == "ok", cold["cuda"]
    assert cold["cuda"]["summary"].startswith(f"torch {torch.__version__} can use the 1 GPU(s) NVML listed")
    assert "cuda" not in warm and warm["process-group"]["severity"] == "ok"
    assert (tmp_path / "cache" / "launch-gpu-probe.json").exists()
    assert cold["gpus"]["summary"] == warm["gpus"]["summary"]
    plans = [
        {k: v for k, v in rep["plan"]["env"].items() if str(tmp_path / run) not in v}  # its own log folder
        for rep, run in zip(reports, ("cold", "warm"), strict=True)
    ]
    assert plans[0] == plans[1]  # NVML's plan is the one torch's answer gives
