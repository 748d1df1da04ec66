"""The fused GPT head (train/fusedloss.py) against the plain one: the same loss and gradients, with ignored
targets, under bf16 autocast and compiled whole (fullgraph: no graph break, so CUDA graphs keep the step).
On this CPU the operator runs its PyTorch reference, and the Triton kernel runs under Triton's interpreter;
tests/gpu/test_fusedloss_gpu.py checks the kernel on a GPU against the same reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torchrig.train import fusedloss  # noqa: E402
from torchrig.train.fusedloss import IGNORE_INDEX, ce_rows, linear_cross_entropy  # noqa: E402
from torchrig.train.models import GPT, GPTConfig  # noqa: E402


def _inputs(n=48, d=24, v=997, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).requires_grad_()
    w = (0.1 * torch.randn(v, d, generator=g)).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[[1, 7]] = IGNORE_INDEX
    return h, w, y


def test_loss_and_gradients_equal_the_plain_head_in_fp32():
    h, w, y = _inputs()
    plain = F.cross_entropy((h @ w.t()).float(), y)
    gp = torch.autograd.grad(plain * 3, [h, w])
    fused = linear_cross_entropy(h, w, y)
    gf = torch.autograd.grad(fused * 3, [h, w])
    assert torch.allclose(plain, fused, rtol=1e-6)
    for a, b in zip(gp, gf, strict=True):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    # an ignored target contributes nothing: its row of h gets no gradient
    assert torch.count_nonzero(gf[0][7]) == 0 and torch.count_nonzero(gf[0][1]) == 0


def test_rows_are_loss_and_softmax_minus_onehot():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 11, generator=g)
    y = torch.tensor([0, 10, IGNORE_INDEX, 3, 3])
    loss, grad = ce_rows(logits, y, IGNORE_INDEX)
    ref = F.cross_entropy(logits, y, reduction="none")
    assert torch.allclose(loss, ref, atol=1e-6) and loss[2] == 0
    onehot = F.one_hot(y.clamp(min=0), 11).float()
    want = (torch.softmax(logits, -1) - onehot) * (y != IGNORE_INDEX)[:, None]
    assert torch.allclose(grad, want, atol=1e-6) and grad.dtype == logits.dtype


def test_bf16_autocast_matches_the_plain_head_within_bf16_rounding():
    h, w, y = _inputs(seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = F.cross_entropy((h @ w.t()).float(), y)
        fused = linear_cross_entropy(h, w, y)
    gp, gf = torch.autograd.grad(plain, [h, w]), torch.autograd.grad(fused, [h, w])
    assert abs(plain.item() - fused.item()) < 1e-5 * abs(plain.item())
    for a, b in zip(gp, gf, strict=True):
        assert b.dtype == torch.float32  # the parameters' dtype, as autograd gives the plain head
        assert (a - b).abs().max() <= 2**-7 * a.abs().max()  # bf16 keeps 8 bits


def test_every_target_ignored_is_a_zero_loss_not_nan():
    h, w, y = _inputs()
    loss = linear_cross_entropy(h, w, torch.full_like(y, IGNORE_INDEX))
    (gh,) = torch.autograd.grad(loss, [h])
    assert loss.item() == 0 and torch.count_nonzero(gh) == 0


def _gpt_pair():
    torch.manual_seed(0)
    c = GPTConfig(layers=2, heads=2, width=64, block_size=32, vocab=503)
    plain, fused = GPT(c), GPT(c)
    fused.load_state_dict(plain.state_dict())
    fused.fused_loss = True
    return plain, fused


def test_a_compiled_gpt_with_the_fused_head_trains_like_the_plain_one():
    plain, fused = _gpt_pair()
    run = torch.compile(
        fused, fullgraph=True
    )  # fullgraph: the operator and the Function trace without a break
    x, y = torch.randint(0, 503, (4, 32)), torch.randint(0, 503, (4, 32))
    lp, lf = plain(x, y), run(x, y)
    lp.backward()
    lf.backward()
    assert torch.allclose(lp, lf, rtol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name
    # without targets both return the logits (export, generation)
    assert torch.equal(plain(x), fused(x))


def test_the_triton_kernel_runs_only_where_triton_compiles(monkeypatch):
    monkeypatch.setattr(fusedloss, "triton", object())  # as if Triton were installed
    assert fusedloss.triton_runs_on((9, 0)) and fusedloss.triton_runs_on((7, 0))
    assert not fusedloss.triton_runs_on((6, 1))  # a P40: the PyTorch reference instead
    monkeypatch.setattr(fusedloss, "triton", None)
    assert not fusedloss.triton_runs_on((9, 0))


def test_the_row_kernels_grid_is_one_program_a_row_or_a_few_an_sm():
    grid = fusedloss.grid(16384, 132)
    assert grid({"PER_SM": 0}) == (16384,)  # one program a row
    assert grid({"PER_SM": 2}) == (264,)  # persistent: 2 programs an SM, each loops over rows
    assert fusedloss.grid(100, 132)({"PER_SM": 4}) == (100,)  # never more programs than rows
    assert fusedloss.grid(0, 132)({"PER_SM": 1}) == (1,)


CE_KERNEL_CHECK = r"""
import sys, torch
from torchrig.train import fusedloss as fl
for rows, cols, block in ((5, 997, 256), (3, 4096, 1024), (4, 300, 512), (3, 5000, 2048)):
    g = torch.Generator().manual_seed(rows)
    logits = (4 * torch.randn(rows, cols, generator=g)).float()
    targets = torch.randint(0, cols, (rows,), generator=g)
    targets[1] = fl.IGNORE_INDEX
    ref_loss, ref_grad = fl._rows_reference(logits, targets, fl.IGNORE_INDEX)
    # one program a row; a persistent grid smaller than the rows (each program loops), with L2 hints
    for programs, first, last in ((rows, "", ""), (2, "evict_last", "evict_first"), (1, "", "")):
        grad, loss = torch.full_like(logits, float("nan")), torch.full((rows,), float("nan"))
        fl._ce_rows_kernel.fn[(programs,)](logits, grad, targets, loss, logits.stride(0), cols, fl.IGNORE_INDEX,
                                           rows, BLOCK=block, PER_SM=1, FIRST=first, LAST=last)
        if not (torch.allclose(loss, ref_loss, atol=1e-5) and torch.allclose(grad, ref_grad, atol=1e-6)):
            sys.exit(f"{rows}x{cols} block {block}, {programs} programs: loss {(loss - ref_loss).abs().max()}, "
                     f"grad {(grad - ref_grad).abs().max()}")
print("ok")
"""


@pytest.mark.skipif(fusedloss.triton is None, reason="needs Triton (its CPU interpreter)")
def test_the_triton_kernel_under_its_interpreter_is_the_reference():
    """The kernel itself (not its PyTorch reference) on the CPU, several blocks a row and a ragged last block,
    an ignored target, one program a row or fewer programs than rows (the persistent grid, each program
    looping): its losses and its softmax - onehot rows are the reference's, every row written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", CE_KERNEL_CHECK], capture_output=True, text=True, env=env,
                       timeout=600, cwd=Path(__file__).parents[2])  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.stdout + r.stderr)[-3000:]
