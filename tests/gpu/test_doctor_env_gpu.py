"""doctor on a real GPU with the environment's faults made for real and undone (each runs doctor in a child
whose environment carries the fault; nothing of this process changes): NCCL_SOCKET_IFNAME naming a missing
interface, a malformed PYTORCH_CUDA_ALLOC_CONF, and the NCCL bootstrap check passing on a healthy GPU.

    python3 -m pytest -q tests/gpu/test_doctor_env_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuenv import SAFE, cuda_in_child  # tests/gpuenv.py

ROOT = Path(__file__).resolve().parents[2]


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_in_child(), reason="needs CUDA")]


def doctor(tmp_path: Path, **env: str) -> tuple[int, dict, float]:
    full = {**os.environ, **SAFE, "PYTHONPATH": str(ROOT / "src"), **env}
    for k, v in env.items():
        if v == "":
            full.pop(k, None)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", "doctor", "--json", "--timeout", "60"],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        timeout=400,
    )
    wall = time.perf_counter() - t0
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout), wall


def ids(report: dict, *severities: str) -> list[str]:
    return [f["id"] for f in report["findings"] if not severities or f["severity"] in severities]


def test_nccl_bootstrap_passes_on_a_healthy_gpu(tmp_path):
    code, report, wall = doctor(tmp_path)
    nccl = report["facts"]["torch"].get("nccl")
    assert nccl is not None and nccl["status"] == "ok", nccl
    assert all(d["ok"] for d in nccl["devices"]) and nccl["devices"]
    assert "nccl.ok" in ids(report, "ok")
    assert "nccl.bootstrap_failed" not in ids(report)
    print(f"healthy: exit {code}, {wall:.2f} s, NCCL {[d['elapsed_ms'] for d in nccl['devices']]} ms")


def test_a_socket_ifname_naming_a_missing_interface_is_named(tmp_path):
    code, report, _ = doctor(tmp_path, NCCL_SOCKET_IFNAME="doctorfault9")
    assert code == 1
    problems = ids(report, "error", "warning")
    assert "env.nccl_socket_ifname" in problems
    nccl = report["facts"]["torch"].get("nccl")
    print(f"NCCL under the fault: {nccl}")  # what a one-process communicator meets (the campaign records it)


def test_a_malformed_alloc_conf_is_named_not_reinstall(tmp_path):
    code, report, _ = doctor(
        tmp_path, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:maybe,max_split_size_mb=64"
    )
    assert code == 1
    problems = ids(report, "error", "warning")
    assert "env.alloc_conf" in problems or "env.breaks_torch" in problems, problems
    for f in report["findings"]:
        assert not any("--force-reinstall" in s for s in f["fix"]), f


def _gpus() -> int:
    code = "import torch; print(torch.cuda.device_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    return int(out.strip() or 0)


def test_deep_all_reduces_each_gpu_pair(tmp_path):
    n = _gpus()
    if n < 2:
        pytest.skip("--deep needs two GPUs")
    full = {**os.environ, **SAFE, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "torchrig", "doctor", "--json", "--deep", "--only", "torch"],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        timeout=400,
    )
    report = json.loads(proc.stdout)
    pairs = report["facts"]["torch"]["nccl"]["pairs"]
    assert len(pairs) == n * (n - 1) // 2 and all(p["ok"] for p in pairs), pairs
    assert "nccl.pair_failed" not in ids(report)
