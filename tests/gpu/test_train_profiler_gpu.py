"""``--profiler cuda`` under Nsight Compute: ``ncu --profile-from-start off`` measures the --profile-steps
window and nothing before it (not the compile check, not the warm-up steps), and tools/gpu/ncu_roofline.py
reads what it wrote. Skipped without CUDA or ncu."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu)"),
]
ROOT = Path(__file__).resolve().parents[2]
METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"


def _under_ncu(tmp_path: Path, profiled: int) -> tuple[Path, str]:
    csv = tmp_path / f"ncu-{profiled}.csv"
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    env["NVSHMEM_DISABLE_NVLS"] = "1"
    r = subprocess.run(
        ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--print-units", "base", "--csv",
         "--log-file", str(csv), "--metrics", METRICS,
         sys.executable, "-m", "torchrig", "train", "--model", "gpt", "--size", "tiny", "--precision", "bf16",
         "--compile", "--steps", "8", "--profile-steps", str(profiled), "--profiler", "cuda", "--device", "cuda",
         "--no-tensorboard", "--no-ckpt-final", "--out", str(tmp_path / f"run-{profiled}")],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return csv, r.stdout


def _kernels(csv: Path) -> int:
    spec = importlib.util.spec_from_file_location("ncu_roofline", ROOT / "tools" / "gpu" / "ncu_roofline.py")
    assert spec and spec.loader
    roof = importlib.util.module_from_spec(spec)
    sys.modules["ncu_roofline"] = roof  # its dataclasses look their module up
    spec.loader.exec_module(roof)
    return len(roof.read_ncu_csv(csv.read_text()))


def test_ncu_measures_the_profiled_steps_only(tmp_path):
    one, out = _under_ncu(tmp_path, 1)
    assert "marked by cudaProfilerStart/Stop for the outside profiler" in out, out[-2000:]
    two, _ = _under_ncu(tmp_path, 2)
    k1, k2 = _kernels(one), _kernels(two)
    # the same step twice: about twice the kernels (the whole run would be the compile's, its check's and
    # 8 steps': many times more)
    assert k1 > 0 and 1.8 * k1 <= k2 <= 2.2 * k1, (k1, k2)
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools/gpu/ncu_roofline.py"), str(two), "--steps", "2",
         "--gpu", torch.cuda.get_device_name(0)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and "of it at the datasheet bandwidth" in r.stdout, r.stderr
