"""The fused MLP (train/fusedmlp.py) on the CPU: its autograd against the plain MLP's, eager and compiled.

On the CPU the two custom ops run their portable definitions (the epilogues' arithmetic in PyTorch ops); the
cuBLASLt kernels themselves are compared with those definitions on the GPU (tests/gpu/test_train_fusedmlp_gpu.py).
"""

from __future__ import annotations

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torchrig.errors import UsageError  # noqa: E402
from torchrig.train import cublaslt, fusedmlp, setup  # noqa: E402
from torchrig.train.fusedmlp import BACKWARDS, dgelu_matmul, dgelu_only, linear_gelu, mlp, weight_grad  # noqa: E402
from torchrig.train.models import GPT, GPTConfig  # noqa: E402


def _layers(d: int = 32) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    fc, out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
    for p in (*fc.parameters(), *out.parameters()):
        torch.nn.init.normal_(p, std=0.1)
    return fc, out


def _run(f, fc: torch.nn.Linear, out: torch.nn.Linear, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_(True)
    for p in (*fc.parameters(), *out.parameters()):
        p.grad = None
    with torch.autocast("cpu", torch.bfloat16):
        y = f(x)
    y.float().square().mean().backward()
    return [y.detach().float(), x.grad, fc.weight.grad, fc.bias.grad, out.weight.grad, out.bias.grad]


def _plain(fc: torch.nn.Linear, out: torch.nn.Linear):
    return lambda x: out(F.gelu(fc(x), approximate="tanh"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("backward", sorted(BACKWARDS))
def test_the_fused_mlp_computes_the_plain_mlp_and_its_gradients_to_bf16_rounding(backward: str) -> None:
    fc, out = _layers()
    x = torch.randn(2, 64, 32)
    ref = _run(_plain(fc, out), fc, out, x)
    got = _run(lambda x: mlp(x, fc, out, backward), fc, out, x)
    names = ["y", "x", "fc.weight", "fc.bias", "out.weight", "out.bias"]
    for name, a, b in zip(names, got, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert _rel(a, b) < 0.03, (name, _rel(a, b))  # bf16 keeps 8 bits: 2^-8 = 0.004 per rounding
    # the fp32 parameters get fp32 gradients, through autocast's casts
    assert fc.weight.grad.dtype == torch.float32 and out.bias.grad.dtype == torch.float32


def test_a_wrong_gradient_would_show_in_that_comparison() -> None:
    """The comparison above can fail: the same MLP with the GELU's derivative left out is far off."""
    fc, out = _layers()
    x = torch.randn(2, 64, 32)
    ref = _run(_plain(fc, out), fc, out, x)
    broken = _run(lambda x: out((p := fc(x)) + (F.gelu(p, approximate="tanh") - p).detach()), fc, out, x)
    assert max(_rel(a, b) for a, b in zip(broken[1:], ref[1:], strict=True)) > 0.1


@pytest.mark.parametrize("backward", sorted(BACKWARDS))
def test_compiled_the_ops_stay_calls_and_give_the_eager_results(backward: str) -> None:
    fc, out = _layers()
    x = torch.randn(2, 64, 32)
    eager = _run(lambda x: mlp(x, fc, out, backward), fc, out, x)
    compiled = _run(torch.compile(lambda x: mlp(x, fc, out, backward)), fc, out, x)
    # bgrad's backward is opaque calls, the same arithmetic compiled or not; the others' GELU backward and bias
    # sum are ops that Inductor fuses, keeping fp32 where eager rounds dpre to bf16: one bf16 rounding apart
    bound = 1e-3 if backward in ("bgrad", "wbgrad") else 0.01
    for a, b in zip(compiled, eager, strict=True):
        assert _rel(a, b) < bound


def test_the_ops_definitions_are_the_epilogues_arithmetic() -> None:
    torch.manual_seed(1)
    x, w, b = torch.randn(8, 16).bfloat16(), torch.randn(24, 16).bfloat16(), torch.randn(24).bfloat16()
    h, pre = linear_gelu(x, w, b)
    exact = x.float() @ w.float().t() + b.float()
    assert torch.equal(pre, exact.bfloat16())
    assert torch.equal(
        h, F.gelu(exact, approximate="tanh").bfloat16()
    )  # GELU of the fp32 value, rounded once
    g, w2 = torch.randn(8, 16).bfloat16(), torch.randn(16, 24).bfloat16()
    dpre, db = dgelu_matmul(g, w2, pre)
    d = torch.ops.aten.gelu_backward(g.float() @ w2.float(), pre.float(), approximate="tanh")
    assert torch.equal(dpre, d.bfloat16()) and torch.equal(db, d.sum(0).bfloat16())
    assert torch.equal(dgelu_only(g, w2, pre), d.bfloat16())
    dw, dbias = weight_grad(g, x)  # a Linear's weight gradient [16, 16] and its bias gradient [16], fp32 sums
    assert torch.equal(dw, (g.float().t() @ x.float()).bfloat16())
    assert torch.equal(dbias, g.float().sum(0).bfloat16())
    dw32, dbias32 = weight_grad(g, x, True)  # an fp32 parameter's gradients, never rounded to bf16
    assert torch.equal(dw32, g.float().t() @ x.float()) and torch.equal(dbias32, g.float().sum(0))


def test_the_bias_grad_linear_computes_the_plain_linear_and_its_gradients_to_bf16_rounding() -> None:
    torch.manual_seed(2)
    layer = torch.nn.Linear(32, 96)
    x0 = torch.randn(2, 64, 32)

    def run(f) -> list[torch.Tensor]:
        x = x0.clone().requires_grad_(True)
        layer.weight.grad = layer.bias.grad = None
        with torch.autocast("cpu", torch.bfloat16):
            y = f(x)
        (y.float() * torch.linspace(-1, 1, 96)).square().mean().backward()
        return [y.detach().float(), x.grad, layer.weight.grad, layer.bias.grad]

    ref, got = run(layer), run(lambda x: fusedmlp.linear(x, layer))
    for name, a, b in zip(["y", "x", "weight", "bias"], got, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert _rel(a, b) < 0.03, (name, _rel(a, b))
    assert layer.bias.grad.dtype == torch.float32  # the fp32 parameter's gradient, through the cast
    wrong = run(lambda x: layer(x) * 1.5)  # the comparison can fail: a bias gradient 1.5× too large
    assert _rel(wrong[3], ref[3]) > 0.3


def test_wbgrad_sends_a_gpt_blocks_attention_linears_through_the_bias_grad_linear(monkeypatch) -> None:
    m = GPT(GPTConfig(vocab=64, block_size=16, layers=1, heads=2, width=32))
    for b in m.blocks:
        b.fused_mlp = "wbgrad"
    seen = []
    real = fusedmlp.linear
    monkeypatch.setattr(fusedmlp, "linear", lambda x, layer: seen.append(layer) or real(x, layer))
    with torch.autocast("cpu", torch.bfloat16):
        m(torch.randint(0, 64, (2, 16)))
    assert seen == [m.blocks[0].qkv, m.blocks[0].proj]


def test_an_unknown_backward_is_refused() -> None:
    fc, out = _layers()
    with pytest.raises(ValueError, match="backward 'fast': one of bgrad, dgelu, plain"):
        mlp(torch.randn(2, 8, 32), fc, out, "fast")


def _train_tiny_gpt(fused: str, steps: int, compiled: bool = False) -> tuple[list[float], list[torch.Tensor]]:
    """A two-block GPT trained ``steps`` steps under bf16 autocast on the CPU with this fused-MLP backward ("": the
    plain MLP): each step's loss, and the parameters' gradients of the last step."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(layers=2, heads=2, width=32, block_size=16, vocab=64))
    for blk in m.blocks:
        blk.fused_mlp = fused
    f = torch.compile(m) if compiled else m
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    out, grads = [], []
    for _ in range(steps):
        with torch.autocast("cpu", torch.bfloat16):
            loss = f(batch, batch.roll(-1, 1))
        loss.backward()
        grads = [p.grad.clone() for p in m.parameters()]
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out, grads


@pytest.mark.parametrize("backward", sorted(BACKWARDS))
def test_a_gpt_with_fused_mlps_trains_as_the_plain_one(backward: str) -> None:
    (plain, _), (fused, _) = _train_tiny_gpt("", 4), _train_tiny_gpt(backward, 4)
    assert plain[-1] < plain[0]
    assert max(abs(a - b) for a, b in zip(plain, fused, strict=True)) < 0.02, (plain, fused)


def test_compiled_a_gpt_with_wbgrad_trains_as_eager() -> None:
    """wbgrad's Linears take the fp32 parameters and give their gradients in fp32 from the custom op: compiled,
    AOTAutograd traces that path, and the losses and gradients match the eager run's."""
    (eager, g_eager), (comp, g_comp) = (
        _train_tiny_gpt("wbgrad", 3),
        _train_tiny_gpt("wbgrad", 3, compiled=True),
    )
    assert max(abs(a - b) for a, b in zip(eager, comp, strict=True)) < 0.01, (eager, comp)
    assert all(g.dtype == torch.float32 for g in g_comp)
    assert max(_rel(a, b) for a, b in zip(g_comp, g_eager, strict=True)) < 0.05


def _rt(device: str, precision: str = "bf16", parallel: str = "none") -> object:
    return types.SimpleNamespace(device=torch.device(device), precision=precision, parallel=parallel)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The GPU boundary (no CUDA on this machine): the card's compute capability, and what prepare and check were
    called with."""
    state: dict = {"capability": (9, 0), "prepared": [], "checked": []}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state["capability"])
    monkeypatch.setattr(fusedmlp, "prepare", state["prepared"].append)
    monkeypatch.setattr(fusedmlp, "check", lambda *a: state["checked"].append(a))
    return state


def test_auto_is_dgelu_compiled_on_one_hopper_gpu_in_bf16_and_off_elsewhere(monkeypatch, gpu) -> None:
    m = GPT(GPTConfig(layers=2, heads=2, width=32, block_size=16, vocab=64))
    for value in (None, "auto", " "):  # unset, named, empty: auto
        if value is None:
            monkeypatch.delenv("TORCHRIG_FUSED_MLP", raising=False)
        else:
            monkeypatch.setenv("TORCHRIG_FUSED_MLP", value)
        for off in (
            _rt("cpu"),
            _rt("cuda", precision="fp8"),
            _rt("cuda", precision="fp16"),
            _rt("cuda", parallel="ddp"),
        ):
            assert setup.fused_mlp(m, off, compiled=True) == 0
        assert setup.fused_mlp(m, _rt("cuda"), compiled=False) == 0  # measured compiled only
        gpu["capability"] = (8, 0)  # an A100: not measured there
        assert setup.fused_mlp(m, _rt("cuda"), compiled=True) == 0
        assert not any(b.fused_mlp for b in m.blocks) and not gpu["checked"]
        gpu["capability"] = (9, 0)
        assert setup.fused_mlp(m, _rt("cuda"), compiled=True) == 2
        assert {b.fused_mlp for b in m.blocks} == {"dgelu"}
        assert gpu["prepared"][-1] == torch.device("cuda")  # the workspace before the first compiled step
        assert gpu["checked"][-1] == (torch.device("cuda"), 32, 128, "dgelu")  # the blocks' own widths
        for b in m.blocks:
            b.fused_mlp = ""
        gpu["checked"].clear()


def test_a_named_backward_runs_wherever_it_can_and_0_is_off(monkeypatch, gpu) -> None:
    m = GPT(GPTConfig(layers=2, heads=2, width=32, block_size=16, vocab=64))
    monkeypatch.setenv("TORCHRIG_FUSED_MLP", "0")
    assert setup.fused_mlp(m, _rt("cuda"), compiled=True) == 0 and not gpu["prepared"]
    gpu["capability"] = (8, 0)
    monkeypatch.setenv("TORCHRIG_FUSED_MLP", "1")
    assert setup.fused_mlp(m, _rt("cpu"), compiled=True) == 0
    assert setup.fused_mlp(m, _rt("cuda", parallel="ddp"), compiled=True) == 0
    assert setup.fused_mlp(m, _rt("cuda"), compiled=False) == 2  # asked for: not only where auto would
    assert {b.fused_mlp for b in m.blocks} == {"bgrad"}  # 1: the epilogue sums the bias gradient too
    for value in ("dgelu", "plain", "triton"):
        monkeypatch.setenv("TORCHRIG_FUSED_MLP", value)
        assert setup.fused_mlp(m, _rt("cuda"), compiled=True) == 2 and {b.fused_mlp for b in m.blocks} == {
            value
        }
    monkeypatch.setenv("TORCHRIG_FUSED_MLP", "yes")
    with pytest.raises(UsageError, match="TORCHRIG_FUSED_MLP='yes' is not auto, 0, 1 or a backward"):
        setup.fused_mlp(m, _rt("cpu"), compiled=True)


@pytest.mark.parametrize("value", ["1", None])
def test_the_fused_mlp_stays_off_where_cublaslt_cannot_load_or_its_check_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gpu: dict, value: str | None
) -> None:
    m = GPT(GPTConfig(layers=2, heads=2, width=32, block_size=16, vocab=64))

    def refuse(device: object) -> None:
        raise cublaslt.CublasLtError("libcublasLt is not loaded in this process (a CPU-only PyTorch?)")

    def wrong(*args: object) -> None:
        raise cublaslt.CublasLtError("the fused MLP's fc.bias gradient is 0.5 off the plain MLP's on cuda")

    if value is None:
        monkeypatch.delenv("TORCHRIG_FUSED_MLP", raising=False)
    else:
        monkeypatch.setenv("TORCHRIG_FUSED_MLP", value)
    shown = value or "auto"
    monkeypatch.setattr(fusedmlp, "prepare", refuse)
    assert setup.fused_mlp(m, _rt("cuda"), compiled=True) == 0
    assert not any(b.fused_mlp for b in m.blocks)
    err = capsys.readouterr().err
    assert (
        err
        == f"torchrig train: TORCHRIG_FUSED_MLP={shown}: the fused MLP stays off: libcublasLt is not loaded in this process (a CPU-only PyTorch?)\n"
    )
    monkeypatch.setattr(fusedmlp, "prepare", lambda device: None)
    monkeypatch.setattr(fusedmlp, "check", wrong)
    assert setup.fused_mlp(m, _rt("cuda"), compiled=True) == 0
    assert not any(b.fused_mlp for b in m.blocks)
    assert "the fused MLP stays off: the fused MLP's fc.bias gradient is 0.5 off" in capsys.readouterr().err


@pytest.mark.parametrize("backward", BACKWARDS)
def test_the_check_passes_the_fused_mlp_and_leaves_the_random_state(backward: str) -> None:
    """On the CPU the custom ops run their definitions: the check passes each backward, and the global random
    state after it is the one before (a run that checks draws the same data)."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    fusedmlp.check("cpu", 32, 128, backward)
    assert torch.equal(torch.get_rng_state(), before)


def test_the_check_finds_a_wrong_epilogue(monkeypatch: pytest.MonkeyPatch) -> None:
    """An epilogue whose derivative is off (here: twice the GELU's) fails the check, naming what is off; one
    that raises fails it with its first line."""
    real = fusedmlp.dgelu_only
    monkeypatch.setattr(fusedmlp, "dgelu_only", lambda dy, w, pre: 2 * real(dy, w, pre))
    with pytest.raises(
        cublaslt.CublasLtError, match=r"the fused MLP's input gradient is [\d.]+ off the plain"
    ):
        fusedmlp.check("cpu", 32, 128, "dgelu")

    def fails(dy: object, w: object, pre: object) -> None:
        raise cublaslt.CublasLtError(
            "cublasLtMatmulAlgoGetHeuristic: no algorithm (CUBLAS_STATUS_NOT_SUPPORTED)\nmore"
        )

    monkeypatch.setattr(fusedmlp, "dgelu_only", fails)
    with pytest.raises(
        cublaslt.CublasLtError,
        match=r"failed its check on cpu: cublasLtMatmulAlgoGetHeuristic: no algorithm \(CUBLAS_STATUS_NOT_SUPPORTED\)$",
    ):
        fusedmlp.check("cpu", 32, 128, "dgelu")


def test_the_wbgrad_check_also_checks_the_bias_gradient_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """wbgrad sends a block's qkv and proj Linears through ``linear``: where that is off, the check fails naming
    it, though the fused MLP itself is right."""
    real = fusedmlp.linear
    monkeypatch.setattr(fusedmlp, "linear", lambda x, layer: 1.5 * real(x, layer))
    fusedmlp.check("cpu", 32, 128, "dgelu")  # the other backwards do not use it
    with pytest.raises(
        cublaslt.CublasLtError, match=r"the bias-gradient Linear's output is [\d.]+ off the plain"
    ):
        fusedmlp.check("cpu", 32, 128, "wbgrad")


def test_the_cublaslt_boundary_checks_its_enums_against_the_header_and_refuses_cpu_tensors() -> None:
    header = "\n".join(f"  {name} = {value}," for name, value in cublaslt.HEADER_NAMES.items())
    # as cublasLt.h writes the epilogues: some as numbers, some composed of others
    header += """
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_AUX = (CUBLASLT_EPILOGUE_GELU | 128),
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS),
    CUBLASLT_EPILOGUE_DGELU = 64 | 128,
    CUBLASLT_EPILOGUE_DGELU_BGRAD = CUBLASLT_EPILOGUE_DGELU | 16,
    CUBLASLT_EPILOGUE_BGRADA = 256,
    CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;"""
    assert cublaslt.epilogue_values(header)["GELU_AUX_BIAS"] == 164
    assert cublaslt.header_mismatches(header) == []
    assert cublaslt.header_mismatches(
        header.replace("CUBLASLT_EPILOGUE_DGELU | 16", "CUBLASLT_EPILOGUE_DGELU")
    ) == ["CUBLASLT_EPILOGUE_DGELU_BGRAD: header 192, module 208"]
    wrong = header.replace(
        "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12", "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 13"
    )
    assert cublaslt.header_mismatches(wrong) == ["CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: header 13, module 12"]
    x = torch.zeros(8, 8, dtype=torch.bfloat16)
    with pytest.raises(cublaslt.CublasLtError, match="contiguous bf16 CUDA tensors"):
        cublaslt.linear_gelu(x, x, x[0])


@given(m=st.integers(1, 64), k=st.integers(1, 64), n=st.integers(1, 64), xt=st.booleans(), yt=st.booleans())
@settings(max_examples=60, deadline=None)
def test_the_plain_matmul_maps_row_major_operands_onto_cublaslt_column_major_call(m, k, n, xt, yt) -> None:
    """cuBLASLt computes D = op(A)·op(B) in column-major storage; a row-major C = X @ Y is Cᵀ = Yᵀ·Xᵀ. The
    key given to cuBLASLt, applied to the tensors' storage read column-major, must give X @ Y for every
    shape and either layout of each operand."""
    import numpy as np

    xs = np.arange(m * k, dtype=np.float64).reshape((k, m) if xt else (m, k)) % 7 - 3
    ys = np.arange(k * n, dtype=np.float64).reshape((n, k) if yt else (k, n)) % 5 - 2
    x = torch.from_numpy(xs).t() if xt else torch.from_numpy(xs)
    y = torch.from_numpy(ys).t() if yt else torch.from_numpy(ys)
    ta, tb, mm, nn, kk, lda, ldb, ldd = cublaslt._mm_key(x, y)

    def column_major(t: torch.Tensor, rows: int, cols: int, ld: int) -> np.ndarray:
        flat = t.contiguous().numpy().ravel() if t.is_contiguous() else t.t().contiguous().numpy().ravel()
        return np.array([[flat[c * ld + r] for c in range(cols)] for r in range(rows)])

    a = column_major(y, *((kk, mm) if ta else (mm, kk)), lda)  # A is y's storage
    b = column_major(x, *((nn, kk) if tb else (kk, nn)), ldb)  # B is x's storage
    d = (a.T if ta else a) @ (b.T if tb else b)  # [mm, nn] column-major, ld = ldd
    assert (mm, nn, kk, ldd) == (n, m, k, n)
    np.testing.assert_array_equal(d.T, x.numpy() @ y.numpy())


@given(t=st.integers(1, 48), n=st.integers(1, 48), k=st.integers(1, 48))
@settings(max_examples=40, deadline=None)
def test_the_weight_gradient_maps_onto_bgradb_as_cublaslt_defines_it(t, n, k) -> None:
    """cuBLASLt's ``BGRADB`` (cublasLt.h): D = op(A)·op(B) column-major, and the bias gradient is op(B) summed over
    the GEMM's k, one value per column of D. The call ``weight_grad`` makes, played on the tensors' storage
    read column-major, must give a Linear's ``dyᵀ @ x`` and ``dy.sum(0)``."""
    import numpy as np

    dy = torch.from_numpy(np.arange(t * n, dtype=np.float64).reshape(t, n) % 7 - 3)
    x = torch.from_numpy(np.arange(t * k, dtype=np.float64).reshape(t, k) % 5 - 2)
    calls = []

    def play(a, b, d, *, ta, tb, m, n, k, lda, ldb, ldd, epilogue, bias=None, aux=None, algo=0) -> None:
        def column_major(src: torch.Tensor, rows: int, cols: int, ld: int) -> np.ndarray:
            flat = src.numpy().ravel()
            return np.array([[flat[c * ld + r] for c in range(cols)] for r in range(rows)])

        opa = column_major(a, *((k, m) if ta else (m, k)), lda)
        opb = column_major(b, *((n, k) if tb else (k, n)), ldb)
        opa, opb = (opa.T if ta else opa), (opb.T if tb else opb)
        dd = opa @ opb  # [m, n] column-major with leading dimension ldd
        out = d.numpy().ravel()
        for c in range(n):
            out[c * ldd : c * ldd + m] = dd[:, c]
        bias.numpy()[:] = opb.sum(axis=0)
        calls.append(epilogue)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cublaslt, "_check_2d", lambda *ts: None)
        mp.setattr(cublaslt, "_matmul", play)
        dw, db = cublaslt.weight_grad(dy, x)
    assert calls == [cublaslt.EPILOGUE_BGRADB]
    np.testing.assert_array_equal(dw.numpy(), dy.numpy().T @ x.numpy())
    np.testing.assert_array_equal(db.numpy(), dy.numpy().sum(axis=0))


def test_the_plain_matmul_refuses_operands_it_cannot_read_in_place() -> None:
    x = torch.zeros(8, 6)
    with pytest.raises(cublaslt.CublasLtError, match=r"\[M, K\] @ \[K, N\]"):
        cublaslt._mm_key(x[:, ::2], torch.zeros(3, 4))
    with pytest.raises(cublaslt.CublasLtError, match=r"got \(8, 6\) strides \(6, 1\) and \(5, 4\)"):
        cublaslt._mm_key(x, torch.zeros(5, 4))
    with pytest.raises(cublaslt.CublasLtError, match="bf16 CUDA tensors"):
        cublaslt.matmul(x, torch.zeros(6, 4))


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        (
            "TORCHRIG_FUSED_MLP",
            "$(touch pwned)\nbgrad",
            "TORCHRIG_FUSED_MLP='$(touch pwned)\\nbgrad' is not auto, 0, 1",
        ),
        (
            "TORCHRIG_TUNED_GEMMS",
            "$(touch pwned)\n1",
            "TORCHRIG_TUNED_GEMMS='$(touch pwned)\\n1' is not 0 or 1",
        ),
    ],
)
def test_a_bad_value_from_the_shell_is_one_line_and_exit_2(tmp_path, variable, value, says) -> None:
    """What a user meets: `torchrig train` with a hostile TORCHRIG_FUSED_MLP or TORCHRIG_TUNED_GEMMS stops
    before training and before taking the run folder, on one line."""
    import os
    import subprocess
    import sys

    env = {**os.environ, variable: value}
    argv = [sys.executable, "-m", "torchrig", "train", "--model", "gpt", "--size", "tiny", "--steps", "1"]
    r = subprocess.run(
        [*argv, "--no-tensorboard", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert "Traceback" not in r.stderr and not (tmp_path / "pwned").exists()
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "run").exists()  # refused before torchrig train took the run folder


@settings(max_examples=300, deadline=None)
@given(value=st.text(max_size=40))
def test_any_value_of_the_variable_is_a_choice_or_one_usage_error(value: str) -> None:
    """Whatever TORCHRIG_FUSED_MLP holds: auto, off, a backward, or a UsageError naming the value; never
    another exception."""
    from torchrig.train.config import FUSED_MLP_BACKWARDS, fused_mlp_backward

    if "\x00" in value:  # the environment cannot hold a NUL
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHRIG_FUSED_MLP", value)
        try:
            choice = fused_mlp_backward()
        except UsageError as e:
            assert f"TORCHRIG_FUSED_MLP={value.strip()!r} is not auto, 0, 1 or a backward" in str(e)
            return
    assert choice in ("auto", "", *FUSED_MLP_BACKWARDS)
    assert choice == {"": "auto", "0": "", "1": "bgrad"}.get(value.strip(), value.strip())


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 32 * 1024 * 1024), ("0", 0), ("1024", 1024 * 1024), (" 64 ", 64 * 1024), ("-1", 32 * 1024 * 1024),
     ("1e3", 32 * 1024 * 1024), ("", 32 * 1024 * 1024)],
)  # fmt: skip
def test_the_workspace_is_pytorchs_setting_or_32_mib(monkeypatch, value, expected) -> None:
    """cuBLASLt gets the workspace PyTorch's own cuBLASLt calls are given by CUBLASLT_WORKSPACE_SIZE (KiB);
    a value that is not a whole number leaves the default. The size is read once: the heuristic's algorithms,
    the buffer and the call must agree."""
    from torchrig.train import cublaslt

    monkeypatch.setattr(cublaslt, "_state", {})
    if value is None:
        monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    else:
        monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", value)
    assert cublaslt.workspace_bytes() == expected
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "7")
    assert cublaslt.workspace_bytes() == expected  # fixed at its first use


@pytest.mark.parametrize(
    ("status", "count", "expected"),
    [
        (cublaslt.STATUS_NOT_SUPPORTED, 0, "no algorithm for this GEMM and epilogue 208 .* of 0 bytes"),
        (0, 0, "no algorithm for this GEMM and epilogue 208 .* of 0 bytes"),
        (13, 0, "cublasLtMatmulAlgoGetHeuristic returned cublasStatus_t 13"),
    ],
)
def test_no_algorithm_within_the_workspace_is_named_and_the_preference_is_freed(
    monkeypatch, status, count, expected
) -> None:
    """cuBLASLt answers "not supported" (15) when no algorithm fits the workspace (an H100 had none for
    DGELU_BGRAD without one): the error names the workspace's size, and the preference is freed either way."""
    import ctypes

    monkeypatch.setattr(cublaslt, "_state", {})
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "0")
    calls: list[str] = []

    class Heuristic:  # the library's answer, as an H100 gave it (2026-12-07, tests/gpu run)
        def cublasLtMatmulAlgoGetHeuristic(self, *args: object) -> int:
            args[-1]._obj.value = count  # type: ignore[attr-defined]
            return status

    class Lib:
        lib, handle = Heuristic(), ctypes.c_void_p()

        def check(self, fn: str, *args: object) -> None:
            calls.append(fn)

    none = ctypes.c_void_p()
    with pytest.raises(cublaslt.CublasLtError, match=expected):
        cublaslt._algorithms(Lib(), none, (none, none, none), "epilogue 208 (key)")  # type: ignore[arg-type]
    assert calls[-1] == "cublasLtMatmulPreferenceDestroy"
