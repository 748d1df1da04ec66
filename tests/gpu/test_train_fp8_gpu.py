"""``--precision fp8`` on a real GPU (torchao's float8 training): it trains, its loss curve stays near bf16's
on the same data, its checkpoints resume in bf16 and export, and it runs under DDP and FSDP2 on two GPUs.

Skipped without a CUDA GPU of compute capability 8.9 or newer (fp8 tensor cores) or without torchao (carry
the wheel: ``pip install --no-deps torchao-0.18.0-*.whl``)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < (8, 9):
    pytest.skip("needs a CUDA GPU with fp8 tensor cores (compute capability 8.9+)", allow_module_level=True)

# GPT "mini" (6 layers, 384 wide, vocabulary 50304): every block Linear qualifies (384, 1152, 1536 are
# multiples of 16), large enough that fp8's rounding shows in the loss if it were wrong.
MINI = [
    "train",
    "--model",
    "gpt",
    "--size",
    "mini",
    "--data",
    "generated",
    "--micro-batch",
    "16",
    "--steps",
    "60",
    "--log-every",
    "10",
    "--warmup-steps",
    "10",
    "--lr",
    "1e-3",
    "--workers",
    "2",
    "--no-tensorboard",
    "--compile",
]
# fp8 against bf16 at every logged step: within 5 % of bf16's loss. e4m3 keeps 3 mantissa bits (a relative
# rounding error up to 2^-4 per element), but the errors of a GEMM's sums largely cancel; torchao and
# torchtitan report fp8 loss curves that track bf16's within about 1 % on long runs.
REL_TOLERANCE = 0.05


def torchrig(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    return subprocess.run(
        [sys.executable, "-m", "torchrig", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def summary(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)["summary"]


def curve(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and r.get("step")}


def test_fp8_trains_like_bf16_on_the_same_data(tmp_path):
    runs = {
        "bf16": ["--precision", "bf16"],
        "rowwise": ["--precision", "fp8"],
        "tensorwise": ["--precision", "fp8", "--fp8-recipe", "tensorwise"],
    }
    curves, sums = {}, {}
    for name, extra in runs.items():
        out = tmp_path / name
        sums[name] = summary(torchrig(*MINI, "--gpus", "1", "--out", str(out), *extra))
        curves[name] = curve(out)
    for name in ("rowwise", "tensorwise"):
        s = sums[name]
        assert s["precision"] == "fp8" and s["fp8"]["recipe"] == name
        assert s["fp8"]["layers"] == 24  # 6 blocks x (qkv, proj, fc, out); the tied head stays bf16
        assert set(curves[name]) == set(curves["bf16"]) and len(curves[name]) == 6
        losses = list(curves[name].values())
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], curves[name]
        for step, ref in curves["bf16"].items():
            assert abs(curves[name][step] - ref) <= REL_TOLERANCE * ref, (name, step, curves)
    assert sums["bf16"]["fp8"] is None


def test_an_fp8_checkpoint_resumes_in_bf16_and_exports(tmp_path):
    out = tmp_path / "run"
    base = [*MINI, "--gpus", "1", "--out", str(out)]
    base[base.index("--steps") + 1] = "20"
    s = summary(torchrig(*base, "--precision", "fp8"))
    assert s["precision"] == "fp8"
    base[base.index("--steps") + 1] = "30"
    s = summary(torchrig(*base, "--precision", "bf16", "--resume"))
    assert s["resumed_from"] == 20 and s["precision"] == "bf16" and s["final_loss"] < 20
    if importlib.util.find_spec("onnx") is None:
        pytest.skip("the bf16 resume passed; export needs onnx (pip install torchrig[train])")
    r = torchrig("export", str(out), "--out", str(tmp_path / "exp"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "exp" / "model.onnx").is_file()


def test_two_gpus_fp8_under_ddp_and_fsdp(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    for par, mode in (("ddp", "auto"), ("fsdp", "default")):
        out = tmp_path / par
        args = [*MINI, "--gpus", "2", "--parallel", par, "--compile-mode", mode, "--out", str(out)]
        s = summary(torchrig(*args, "--precision", "fp8"))
        assert s["world_size"] == 2 and s["parallel"] == par and s["precision"] == "fp8"
        losses = list(curve(out).values())
        assert losses[-1] < losses[0], (par, losses)
    if importlib.util.find_spec("onnx") is None:
        pytest.skip("DDP and FSDP2 trained; export needs onnx (pip install torchrig[train])")
    r = torchrig("export", str(tmp_path / "fsdp"), "--out", str(tmp_path / "exp"))
    assert r.returncode == 0, r.stderr[-2000:]
