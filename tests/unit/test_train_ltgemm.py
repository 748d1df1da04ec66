"""TORCHRIG_TUNED_GEMMS (train/ltgemm.py): the choice between PyTorch's GEMM and cuBLASLt's algorithms, the
custom operator's registration, the autograd of the routed Linear, and the variable's refusal. The timing and
the cuBLASLt calls themselves run on a GPU: tests/gpu/test_train_ltgemm_gpu.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torchrig.errors import UsageError  # noqa: E402
from torchrig.train import config, ltgemm  # noqa: E402


@pytest.fixture(autouse=True)
def _off():
    yield
    ltgemm.disable()


def test_an_algorithm_replaces_pytorchs_gemm_only_where_it_is_faster_by_the_margin_and_agrees() -> None:
    assert ltgemm.pick(1.0, {0: 1.0, 1: 0.95, 2: 0.97}, {0: 0.0, 1: 0.001, 2: 0.0}) == 1
    assert ltgemm.pick(1.0, {0: 0.99, 1: 0.985}, {0: 0.0, 1: 0.0}) is None  # inside the margin: PyTorch's
    assert ltgemm.pick(1.0, {0: 0.5, 1: 0.9}, {0: 0.5, 1: 0.0}) == 1  # the fastest gives another result
    assert ltgemm.pick(1.0, {0: 0.5}, {}) is None  # no result compared: never chosen
    assert ltgemm.pick(1.0, {}, {}) is None


@given(
    torch_ms=st.floats(0.001, 100),
    times=st.dictionaries(st.integers(0, 31), st.floats(0.001, 100), max_size=8),
    bad=st.sets(st.integers(0, 31)),
)
@settings(max_examples=200, deadline=None)
def test_the_choice_is_never_slower_than_pytorch_nor_off_its_result(torch_ms, times, bad) -> None:
    diffs = {a: (0.5 if a in bad else 0.0) for a in times}
    algo = ltgemm.pick(torch_ms, times, diffs)
    if algo is not None:
        assert algo not in bad
        assert times[algo] <= torch_ms * (1 - ltgemm.MIN_GAIN)
        assert times[algo] == min(t for a, t in times.items() if a not in bad)


def test_off_or_off_the_gpu_every_gemm_is_pytorchs_own_call() -> None:
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(6, 4, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, generator=g)
    for active in (False, True):
        ltgemm.disable()
        if active:
            ltgemm.enable()  # on: a CPU tensor has no cuBLASLt key, so PyTorch's call still
        assert torch.equal(ltgemm.mm(x, w.t()), x @ w.t())
        assert torch.equal(ltgemm.mm(x, w.t(), b), torch.addmm(b, x, w.t()))
        layer = torch.nn.Linear(4, 5)
        assert torch.equal(ltgemm.linear(x, layer), layer(x))


def test_the_routed_linear_has_nn_linears_gradients() -> None:
    ltgemm.enable()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: ltgemm._Linear.apply(x, w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: ltgemm._Linear.apply(x, w, None), (x, w))


def test_the_custom_operator_is_registered_for_compile_and_runs_pytorchs_gemm_where_cublaslt_cannot() -> None:
    g = torch.Generator().manual_seed(2)
    x, y, b = torch.randn(8, 4, generator=g), torch.randn(4, 6, generator=g), torch.randn(6, generator=g)
    torch.library.opcheck(ltgemm.lt_mm, (x, y, b, 0))
    torch.library.opcheck(ltgemm.lt_mm, (x, y.t().contiguous().t(), None, 3))
    compiled = torch.compile(lambda x, y, b: ltgemm.lt_mm(x, y, b, 1), fullgraph=True, backend="inductor")
    assert torch.allclose(compiled(x, y, b), torch.addmm(b, x, y), atol=1e-6)


def test_a_gpt_with_the_flag_set_computes_what_it_computed_without_it_on_the_cpu() -> None:
    from torchrig.train.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(layers=2, heads=2, width=16, vocab=64, block_size=8))
    idx = torch.randint(0, 64, (2, 8))
    plain = model(idx, targets=idx)
    ltgemm.enable()
    for blk in model.blocks:
        blk.tuned_gemms = True
    assert torch.equal(model(idx, targets=idx), plain)


def test_the_trainer_leaves_pytorchs_gemms_on_the_cpu(monkeypatch) -> None:
    from torchrig.train import setup

    monkeypatch.setenv("TORCHRIG_TUNED_GEMMS", "1")
    rt = setup.Runtime(0, 0, 1, torch.device("cpu"), precision="bf16", parallel="none", restart=0)
    cfg = config.TrainConfig(model="gpt")
    assert setup.tuned_gemm_shapes(torch.nn.Linear(2, 2), rt, cfg) is None


@given(value=st.text(max_size=20).filter(lambda v: v.strip() not in ("", "0", "1") and "\x00" not in v))
@settings(max_examples=80, deadline=None)
def test_any_other_value_of_the_variable_is_refused_with_what_to_do(value) -> None:
    old = os.environ.get("TORCHRIG_TUNED_GEMMS")
    os.environ["TORCHRIG_TUNED_GEMMS"] = value
    try:
        with pytest.raises(UsageError, match=r"^TORCHRIG_TUNED_GEMMS=.* is not 0 or 1$") as e:
            config.tuned_gemms()
        assert "unset it" in (e.value.hint or "")
    finally:
        if old is None:
            del os.environ["TORCHRIG_TUNED_GEMMS"]
        else:
            os.environ["TORCHRIG_TUNED_GEMMS"] = old


def test_compiled_the_chosen_algorithms_are_calls_of_the_custom_operator_with_nn_linears_gradients(
    monkeypatch,
) -> None:
    """As on a GPU after the timing: every shape has a chosen algorithm, so torch.compile traces the forward
    and the backward as calls of torchrig::lt_mm (which on the CPU runs PyTorch's GEMM); the gradients are
    nn.Linear's."""
    from torch._dynamo.backends.common import aot_autograd

    from torchrig.train import cublaslt

    monkeypatch.setattr(ltgemm, "_key", lambda x, y, bias: (*cublaslt._mm_key(x, y), bias is not None, 0))
    ltgemm.enable()
    g = torch.Generator().manual_seed(3)
    layer = torch.nn.Linear(8, 12)
    x0, dy = torch.randn(5, 8, generator=g), torch.zeros(5, 12)
    for x, y, b in ((x0, layer.weight.t(), layer.bias), (dy, layer.weight, None), (dy.t(), x0, None)):
        ltgemm._choices[ltgemm._key(x, y, b)] = 2
    graphs: list[str] = []

    def keep(gm, _inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    def f(x, w, b):
        return ltgemm._Linear.apply(x, w, b).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    for fn in (f, compiled):
        x = x0.clone().requires_grad_(True)
        w, b = (
            layer.weight.detach().clone().requires_grad_(True),
            layer.bias.detach().clone().requires_grad_(True),
        )
        fn(x, w, b).backward()
        xr = x0.clone().requires_grad_(True)
        layer.zero_grad()
        layer(xr).square().sum().backward()
        assert torch.allclose(x.grad, xr.grad, atol=1e-5)
        assert torch.allclose(w.grad, layer.weight.grad, atol=1e-5)
        assert torch.allclose(b.grad, layer.bias.grad, atol=1e-5)
    forward, backward = graphs
    assert forward.count("torchrig.lt_mm") == 1 and backward.count("torchrig.lt_mm") == 2, graphs


def test_on_a_gpu_the_trainer_times_the_gpts_step_or_says_in_one_line_why_not(monkeypatch, capsys) -> None:
    from torchrig.train import cublaslt, setup
    from torchrig.train.models import GPT, GPTConfig

    monkeypatch.setenv("TORCHRIG_TUNED_GEMMS", "1")
    rt = setup.Runtime(0, 0, 1, torch.device("cuda"), precision="bf16", parallel="none", restart=0)
    cfg = config.TrainConfig(model="gpt")
    model = GPT(GPTConfig(layers=2, heads=2, width=32, block_size=16, vocab=64))

    def no_cublaslt(device):
        raise cublaslt.CublasLtError("libcublasLt is not loaded in this process (a CPU-only PyTorch?)")

    monkeypatch.setattr(cublaslt, "prepare", no_cublaslt)
    assert setup.tuned_gemm_shapes(model, rt, cfg) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "torchrig train: TORCHRIG_TUNED_GEMMS=1: PyTorch's GEMMs stay: libcublasLt is not loaded in this "
        "process (a CPU-only PyTorch?)"
    ]
    assert not any(b.tuned_gemms for b in model.blocks)

    monkeypatch.setattr(cublaslt, "prepare", lambda device: None)
    shapes = [
        {"calls": 2, "torch_ms": 1.0, "algo": 3, "ms": 0.9},
        {"calls": 1, "torch_ms": 0.5, "algo": None, "ms": None},
    ]
    monkeypatch.setattr(ltgemm, "tune_model", lambda run: ltgemm.Tuned(shapes))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    for parallel, precision in (("ddp", "bf16"), ("none", "fp16")):
        other = setup.Runtime(
            0, 0, 1, torch.device("cuda"), precision=precision, parallel=parallel, restart=0
        )
        assert setup.tuned_gemm_shapes(model, other, cfg) is None
    assert setup.tuned_gemm_shapes(model, rt, cfg) == 1
    assert all(b.tuned_gemms for b in model.blocks) and ltgemm._state["active"]
    assert all(p.grad is None for p in model.parameters())  # the timing step leaves no gradient behind
    assert capsys.readouterr().err.strip() == (
        "torchrig train: TORCHRIG_TUNED_GEMMS=1: 1 of 2 GEMM shapes run a faster cuBLASLt algorithm "
        "(0.20 ms a step by their timing)"
    )
