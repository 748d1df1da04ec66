"""train/gelubias.py: the tanh GELU's backward and the bias gradient in one pass. Its definition here (the
CPU runs it); the Triton kernel itself under Triton's CPU interpreter (the dev extras install Triton), and on
the GPU in tests/gpu/test_train_fusedmlp_gpu.py."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchrig.train import gelubias  # noqa: E402

BF16_ULP = 2.0**-7  # bf16 keeps 8 significant bits: neighbours differ by at most this, relative


def _inputs(rows=300, cols=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    dh = torch.randn(rows, cols, generator=g).bfloat16()
    pre = (3 * torch.randn(rows, cols, generator=g)).bfloat16()  # into both tails of the GELU
    return dh, pre


def _exact(dh, pre):
    """dh * gelu_tanh'(pre) in fp64, from the formula (not from PyTorch)."""
    x, g = pre.double(), dh.double()
    beta, kappa = math.sqrt(2 / math.pi), 0.044715
    t = torch.tanh(beta * (x + kappa * x**3))
    return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * beta * (1 + 3 * kappa * x * x))


def test_the_definition_is_the_formula_rounded_once_and_its_column_sums():
    dh, pre = _inputs()
    dpre, db = gelubias.gelu_bias_backward(dh, pre)
    exact = _exact(dh, pre)
    assert dpre.dtype == db.dtype == torch.bfloat16 and dpre.shape == dh.shape and db.shape == (200,)
    # fp32 inside, one rounding to bf16: within one bf16 step of the fp64 value, plus fp32's cancellation where
    # the derivative nears 0 (pre far below 0: 0.5 * (1 + tanh) of a tanh near -1), tiny against dh
    assert ((dpre.double() - exact).abs() <= BF16_ULP * exact.abs() + 4e-6 * dh.double().abs()).all()
    assert torch.equal(db, dpre.float().sum(0).bfloat16())
    assert pytest.approx(math.sqrt(2 / math.pi), rel=1e-15) == gelubias.SQRT_2_OVER_PI


def test_compiled_it_stays_one_call_with_the_shapes_of_its_fake():
    dh, pre = _inputs(64, 48)
    eager = gelubias.gelu_bias_backward(dh, pre)
    compiled = torch.compile(gelubias.gelu_bias_backward, fullgraph=True)(dh, pre)
    for a, b in zip(compiled, eager, strict=True):
        assert torch.equal(a, b)


def test_every_block_size_writes_whole_slots_of_the_partial_sums():
    """Each program sums whole 128-row slots (so every slot is written, whichever size autotuning picks)."""
    for block_m, block_n, rows, warps in gelubias.CONFIGS:
        assert rows % gelubias.PARTIAL_ROWS == 0 and gelubias.PARTIAL_ROWS % block_m == 0
        assert block_n & (block_n - 1) == 0 and warps in (1, 2, 4, 8, 16, 32)  # Triton's power-of-two sizes


KERNEL_CHECK = r"""
import sys, torch
from torchrig.train import gelubias as gb
for rows, cols in ((300, 200), (128, 64), (1000, 384), (1, 3)):
    g = torch.Generator().manual_seed(rows)
    dh = torch.randn(rows, cols, generator=g).bfloat16()
    pre = (3 * torch.randn(rows, cols, generator=g)).bfloat16()
    ref, _ = gb.reference(dh, pre)
    for cfg in gb.CONFIGS:
        dpre, db = gb.run_kernel(dh, pre, cfg)
        # the interpreter rounds fp32 to bf16 toward zero where the GPU rounds to nearest: one step apart; and
        # fp32's cancellation where the derivative nears 0, tiny against dh
        near = (dpre.float() - ref.float()).abs() <= 2.0**-7 * ref.float().abs() + 4e-6 * dh.float().abs()
        sums = torch.allclose(db.float(), dpre.float().sum(0), rtol=2.0**-7, atol=1e-6)
        if not (near.all() and sums):
            sys.exit(f"{rows}x{cols} {cfg}: {int((~near).sum())} elements off; sums {sums}")
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its CPU interpreter)")
def test_the_triton_kernel_under_its_interpreter_for_every_block_size():
    """Every autotuning choice on ragged shapes (rows not a multiple of 128, columns not of the block): the
    kernel's dpre is the definition's, and its bias gradient is the sum of its own dpre."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", KERNEL_CHECK], capture_output=True, text=True, env=env,
                       timeout=600, cwd=Path(__file__).parents[2])  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.stdout + r.stderr)[-3000:]
