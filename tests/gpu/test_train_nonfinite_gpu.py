"""A diverging run on the GPU (bf16, and ``--precision fp8`` with torchao): a learning rate that grows far too
high makes the loss or the gradients NaN/inf; the run stops with exit 1 and one line naming the step, the
newest finite checkpoint is still there and is ``latest``, and no checkpoint holding NaN/inf was written.

With ``--ckpt-every 1`` every step is checked before its save, so ``latest`` is exactly the step before the
first bad one. Run on the GPU machine: ``python3 -m pytest -q tests/gpu/test_train_nonfinite_gpu.py``.
The fp8 case needs a GPU of compute capability 8.9+ and torchao; it is skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

# lr ramps to 100 over 20 warm-up steps: finite at first (the first steps start from the initial weights),
# NaN/inf within a few steps (on the CPU: gradient norm inf at step 6 with a ramp to 50 over 10)
DIVERGE = [
    "train",
    "--model", "gpt", "--steps", "30", "--lr", "100", "--warmup-steps", "20", "--log-every", "5",
    "--ckpt-every", "1", "--keep-ckpts", "1", "--workers", "0", "--no-tensorboard", "--data", "generated",
]  # fmt: skip


def torchrig(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    return subprocess.run(
        [sys.executable, "-m", "torchrig", *args], capture_output=True, text=True, env=env, timeout=900
    )


def weights_finite(ckpt: Path) -> bool:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = ckpt.parent.parent / f"{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(target))
    state = torch.load(target, weights_only=True)
    return all(torch.isfinite(t.float()).all() for t in state["model"].values() if torch.is_tensor(t))


def check_diverged(r: subprocess.CompletedProcess, out: Path) -> None:
    text = r.stdout + r.stderr
    assert r.returncode == 1, text[-4000:]
    m = re.search(r"training diverged: NaN/inf loss or gradient at step (\d+)", text)
    assert m, text[-4000:]
    first_bad = int(m.group(1))
    root = out / "checkpoints"
    latest = (root / "latest").read_text().strip()
    assert latest == f"step-{first_bad - 1:06d}", (latest, first_bad, text[-2000:])
    assert sorted(p.name for p in root.glob("step-*")) == [latest], (
        "no NaN/inf checkpoint; the finite one kept"
    )
    meta = json.loads((root / latest / "meta.json").read_text())
    assert meta["finite"] is True and meta["step"] == first_bad - 1
    assert weights_finite(root / latest)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(x.get("event") == "nonfinite" and x.get("step") == first_bad for x in rows)


def test_bf16_divergence_stops_with_exit_1_and_latest_is_the_newest_finite(tmp_path):
    out = tmp_path / "run"
    r = torchrig(*DIVERGE, "--size", "tiny", "--precision", "bf16", "--device", "cuda", "--out", str(out))
    check_diverged(r, out)


def test_bf16_compiled_divergence_stops_with_exit_1(tmp_path):
    out = tmp_path / "run"
    r = torchrig(*DIVERGE, "--size", "tiny", "--precision", "bf16", "--compile", "--device", "cuda",
                 "--out", str(out))  # fmt: skip
    check_diverged(r, out)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="--precision fp8 needs torchao")
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability(0) < (8, 9),
    reason="fp8 needs compute capability 8.9+",
)
def test_fp8_divergence_stops_with_exit_1_and_latest_is_the_newest_finite(tmp_path):
    out = tmp_path / "run"
    # mini: every block Linear converts to float8 (its widths are multiples of 16)
    r = torchrig(*DIVERGE, "--size", "mini", "--micro-batch", "8", "--precision", "fp8", "--device", "cuda",
                 "--out", str(out))  # fmt: skip
    check_diverged(r, out)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_bf16_divergence_on_two_gpus_stops_every_rank_with_exit_1(tmp_path):
    out = tmp_path / "run"
    r = torchrig(*DIVERGE, "--size", "tiny", "--precision", "bf16", "--gpus", "2", "--micro-batch", "4",
                 "--out", str(out))  # fmt: skip
    check_diverged(r, out)
