"""The fused GPT head's Triton kernel (train/fusedloss.py) on a GPU: its rows equal the PyTorch reference for
GPT-2's vocabulary and odd ones, bf16 and fp32 logits, ignored targets; the trainer's default (fused) and
--loss plain give the same loss curve. Skipped without CUDA and Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from torchrig.train import fusedloss  # noqa: E402

TINY = ["train", "--model", "gpt", "--size", "tiny", "--steps", "30", "--lr", "1e-2", "--workers", "2"]
TINY += ["--no-tensorboard", "--gpus", "1"]


def torchrig(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    cmd = [sys.executable, "-m", "torchrig", "--json", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)["summary"]


@pytest.mark.parametrize("vocab", [50304, 50257, 1000, 70000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_equals_the_reference(vocab, dtype):
    g = torch.Generator(device="cuda").manual_seed(vocab)
    logits = (4 * torch.randn(257, vocab, device="cuda", generator=g)).to(dtype)
    y = torch.randint(0, vocab, (257,), device="cuda", generator=g)
    y[::17] = fusedloss.IGNORE_INDEX
    loss, grad = fusedloss.ce_rows(logits, y, fusedloss.IGNORE_INDEX)
    rloss, rgrad = fusedloss._rows_reference(logits, y, fusedloss.IGNORE_INDEX)
    assert grad.dtype == dtype and loss.dtype == torch.float32
    assert torch.allclose(loss, rloss, atol=1e-4, rtol=1e-5), (loss - rloss).abs().max()
    tol = 2**-8 if dtype == torch.bfloat16 else 1e-5  # one rounding apart at most (exp in fp32: 1.1e-6 seen)
    assert (grad.float() - rgrad.float()).abs().max() <= tol


def test_the_fused_default_trains_like_the_plain_head(tmp_path):
    curves = {}
    for loss in ("auto", "plain"):
        out = tmp_path / loss
        s = torchrig(
            *TINY, "--precision", "bf16", "--compile", "--loss", loss, "--log-every", "5", "--out", str(out)
        )
        assert s["loss"] == ("fused" if loss == "auto" else "plain")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        curves[loss] = [r["loss"] for r in rows if "loss" in r and r.get("step")]
    assert len(curves["auto"]) == 6
    for a, b in zip(curves["auto"], curves["plain"], strict=True):
        assert abs(a - b) < 5e-3 * abs(b), curves
