"""The compile check before the first step (train/compilecheck.py): the compiled model's loss against eager's.

The miscompile is real: Inductor's own fault injection (``cpp.inject_relu_bug_TESTING_ONLY = "accuracy"``,
which the minifier's tests use) makes the compiled ReLU wrong by one, as the H200's GPT-2 large was wrong by
0.89 in its loss (docs/results/training-speed.md)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from torchrig.train import compilecheck
from torchrig.train.compilecheck import TOLERANCE_ABS, TOLERANCE_REL, CompileCheck, agrees


@pytest.mark.parametrize(
    ("eager", "compiled", "expected"),
    [
        (11.0811, 11.0815, True),  # rounding
        (11.0811, 11.9683, False),  # the H200's GPT-2 large, torch 2.11.0+cu130
        (2.2116, 2.2341, True),  # within 0.05
        (2.2116, 2.30, False),
        (math.nan, 3.0, True),  # eager's own NaN is the non-finite watch's business
        (3.0, math.nan, False),
        (3.0, math.inf, False),
        (1000.0, 1009.0, True),  # 1 % of a large loss
    ],
)
def test_what_agrees(eager, compiled, expected):
    assert agrees(eager, compiled) is expected
    assert CompileCheck(eager, compiled).agrees is expected


@given(
    eager=st.floats(-1e4, 1e4, allow_nan=False),
    frac=st.floats(0, 1),
    sign=st.sampled_from([-1, 1]),
)
def test_within_the_tolerance_agrees_beyond_it_does_not(eager, frac, sign):
    tol = max(TOLERANCE_ABS, TOLERANCE_REL * abs(eager))
    assert agrees(eager, eager + sign * frac * tol * 0.999)
    assert not agrees(eager, eager + sign * tol * (1.001 + frac))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(torch.relu(self.bn(self.lin(x))), y)


@pytest.mark.parametrize("broken", [False, True])
def test_a_real_inductor_miscompile_is_found_and_the_buffers_are_left_as_they_were(monkeypatch, broken):
    torch._dynamo.reset()
    if broken:
        monkeypatch.setattr(inductor_config.cpp, "inject_relu_bug_TESTING_ONLY", "accuracy")
    torch.manual_seed(0)
    model = Toy()
    x, y = torch.randn(32, 16), torch.randn(32, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check = compilecheck.measure(model, torch.compile(model), x, y, contextlib.nullcontext)
    torch._dynamo.reset()
    assert check.agrees is not broken, check
    if broken:
        assert check.compiled - check.eager > 0.5, check  # ReLU + 1 on every element
    for k, v in model.state_dict().items():  # BatchNorm's running statistics too
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters())


def test_ranks_agree_on_the_way_on():
    assert compilecheck.any_rank_disagrees(CompileCheck(1.0, 2.0), torch.device("cpu"))
    assert not compilecheck.any_rank_disagrees(CompileCheck(1.0, 1.0), torch.device("cpu"))
    err = compilecheck.mismatch_error(CompileCheck(11.0811, 11.9683), "2.11.0+cu130")
    assert err.exit_code == 1
    line = err.one_line()
    assert "11.9683" in line and "11.0811" in line and "2.11.0+cu130" in line and "--no-compile" in line
    assert "\n" not in line
