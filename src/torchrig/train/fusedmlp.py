"""The transformer MLP ``out(gelu_tanh(fc(x)))`` with the GELU inside the GEMMs' epilogues (bf16, CUDA).

Compiled, the MLP's step is six GEMMs and, between them, Inductor's kernels for the GELU: in the forward one
that reads ``fc``'s output and writes the GELU's, in the backward one that reads ``dh`` and ``pre`` and
writes ``dpre`` and ``fc``'s bias gradient. Here cuBLASLt's epilogues do that work inside two of the GEMMs
(train/cublaslt.py): ``fc``'s forward GEMM writes both ``h`` and ``pre``; the backward GEMM of ``out``'s
input gradient writes ``dpre = dh * gelu'(pre)`` and ``fc``'s bias gradient. The other GEMMs are PyTorch's,
except with the ``wbgrad`` backward, where ``fc``'s and ``out``'s weight-gradient GEMMs also sum their bias
gradients (``BGRADB``) instead of two kernels that read ``dpre`` and ``dy`` again, and the block's other
Linears (``qkv``, ``proj``) do the same through ``linear``.

The arithmetic is the autocast path's: bf16 inputs, fp32 accumulation, bf16 outputs, the tanh GELU computed
in fp32. Two roundings move: the epilogue applies the GELU (and its derivative) to the fp32 accumulator where
the compiled model applies it to the GEMM's bf16 output, so results agree to bf16's rounding, not bit for
bit (tests/gpu/test_train_fusedmlp_gpu.py bounds it). The two cuBLASLt calls are ``torch.library`` custom
ops, so ``torch.compile`` keeps them as calls and CUDA graphs capture them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from torchrig.train.config import FUSED_MLP_BACKWARDS
from torchrig.train.ltgemm import mm  # PyTorch's GEMM, or with TORCHRIG_TUNED_GEMMS=1 the timed algorithm


@torch.library.custom_op("torchrig::linear_gelu", mutates_args=())
def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gelu_tanh(pre), pre)`` with ``pre = x @ wᵀ + b`` accumulated in fp32, both rounded to x's dtype
    once: the epilogue's arithmetic. This definition runs on any device; CUDA's is one cuBLASLt GEMM."""
    pre = torch.addmm(b.float(), x.float(), w.float().t())
    return F.gelu(pre, approximate="tanh").to(x.dtype), pre.to(x.dtype)


@linear_gelu.register_kernel("cuda")
def _(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torchrig.train import cublaslt

    return cublaslt.linear_gelu(x, w, b)


@linear_gelu.register_fake
def _(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = x.new_empty(x.shape[0], w.shape[0])
    return h, torch.empty_like(h)


@torch.library.custom_op("torchrig::dgelu_matmul", mutates_args=())
def dgelu_matmul(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``dpre = (g @ w) * gelu_tanh'(pre)`` with the product in fp32, and ``dbias = Σ_rows dpre`` (fp32 sum),
    each rounded to g's dtype once: the epilogue's arithmetic. CUDA's is one cuBLASLt GEMM."""
    dpre = torch.ops.aten.gelu_backward(g.float() @ w.float(), pre.float(), approximate="tanh")
    return dpre.to(g.dtype), dpre.sum(0).to(g.dtype)


@dgelu_matmul.register_kernel("cuda")
def _(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torchrig.train import cublaslt

    return cublaslt.dgelu_matmul(g, w, pre)


@dgelu_matmul.register_fake
def _(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(pre), pre.new_empty(pre.shape[1])


@torch.library.custom_op("torchrig::dgelu_only", mutates_args=())
def dgelu_only(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``dpre = (g @ w) * gelu_tanh'(pre)`` with the product in fp32, rounded to g's dtype once (``DGELU``: no
    bias sum). CUDA's is one cuBLASLt GEMM."""
    return torch.ops.aten.gelu_backward(g.float() @ w.float(), pre.float(), approximate="tanh").to(g.dtype)


@dgelu_only.register_kernel("cuda")
def _(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    from torchrig.train import cublaslt

    return cublaslt.dgelu_only(g, w, pre)


@dgelu_only.register_fake
def _(g: torch.Tensor, w: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(pre)


@torch.library.custom_op("torchrig::weight_grad", mutates_args=())
def weight_grad(dy: torch.Tensor, x: torch.Tensor, fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A Linear's ``(dyᵀ @ x, Σ_rows dy)`` with the product and the sum in fp32, each rounded once to dy's dtype
    or, with ``fp32``, kept in fp32 (the gradient of an fp32 parameter, without a cast kernel after): the
    epilogue's arithmetic. CUDA's is one cuBLASLt GEMM (``BGRADB``)."""
    out = torch.float32 if fp32 else dy.dtype
    return (dy.float().t() @ x.float()).to(out), dy.float().sum(0).to(out)


@weight_grad.register_kernel("cuda")
def _(dy: torch.Tensor, x: torch.Tensor, fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    from torchrig.train import cublaslt

    return cublaslt.weight_grad(dy, x, fp32=fp32)


@weight_grad.register_fake
def _(dy: torch.Tensor, x: torch.Tensor, fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.float32 if fp32 else dy.dtype
    return dy.new_empty(dy.shape[1], x.shape[1], dtype=out), dy.new_empty(dy.shape[1], dtype=out)


# how the backward gets dpre (the GELU's input gradient) and fc's bias gradient: the names and what they mean
BACKWARDS = FUSED_MLP_BACKWARDS


class _MLP(torch.autograd.Function):
    """y = gelu_tanh(x @ w1ᵀ + b1) @ w2ᵀ + b2 on 2-D bf16 tensors, with the GELU in the epilogues."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, backward: str) -> torch.Tensor:  # type: ignore[override,unused-ignore]  # fmt: skip
        # wbgrad is given the fp32 parameters and returns their gradients in fp32; the others get bf16 copies
        w1, b1, w2, b2 = (t.to(x.dtype) for t in (w1, b1, w2, b2))
        h, pre = linear_gelu(x, w1, b1)
        ctx.save_for_backward(x, w1, w2, h, pre)
        ctx.how = backward
        return mm(h, w2.t(), b2)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override,unused-ignore]
        x, w1, w2, h, pre = ctx.saved_tensors
        dy = dy.contiguous()
        from torchrig.train import gelubias

        if ctx.how == "bgrad":
            dpre, db1 = dgelu_matmul(dy, w2, pre)
        elif ctx.how == "triton":
            dpre, db1 = gelubias.gelu_bias_backward(mm(dy, w2), pre)
        elif ctx.how in ("dgelu", "wbgrad"):
            dpre = dgelu_only(dy, w2, pre)
            if ctx.how == "wbgrad":  # both bias gradients in the weight-gradient GEMMs' epilogues
                dw1, db1 = weight_grad(dpre, x, True)
                dw2, db2 = weight_grad(dy, h, True)
                return mm(dpre, w1), dw1, db1, dw2, db2, None
            db1 = dpre.sum(0, dtype=torch.float32).to(dpre.dtype)
        else:  # plain: the same arithmetic as the Triton kernel, as ops that Inductor compiles
            dpre, db1 = gelubias.reference(mm(dy, w2), pre)
        return mm(dpre, w1), mm(dpre.t(), x), db1, mm(dy.t(), h), dy.sum(0), None


def prepare(device: torch.device | str) -> None:
    """Make the CUDA kernels ready on ``device`` (cuBLASLt loaded, its workspace allocated): call it once before
    compiling a model that uses ``mlp`` with CUDA graphs, or capturing it (raises ``CublasLtError`` where
    cuBLASLt cannot be used)."""
    from torchrig.train import cublaslt

    cublaslt.prepare(device)


# the largest relative difference (of the largest element) between the fused and the plain MLP's output and
# gradients in bf16 that the trainer's check and tests/gpu/test_train_fusedmlp_gpu.py accept
CHECK_TOLERANCE = 0.03


def check(device: torch.device | str, width: int, hidden: int, backward: str) -> None:
    """One small forward and backward of the fused MLP (64 tokens, these widths) against the plain one on
    ``device`` and, for ``wbgrad``, of the attention's two Linears (``qkv``: width to 3 × width, ``proj``) through
    ``linear`` against plain ones: raises ``CublasLtError`` where a call fails or a result is off by more than
    bf16's rounding allows (``CHECK_TOLERANCE``). The random state is left as it was, so a run that checks draws
    the same data as one that does not."""
    from torchrig.train.cublaslt import CublasLtError

    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(0)
        fc, out = torch.nn.Linear(width, hidden, device=dev), torch.nn.Linear(hidden, width, device=dev)
        qkv, proj = torch.nn.Linear(width, 3 * width, device=dev), torch.nn.Linear(width, width, device=dev)
        for p in (*fc.parameters(), *out.parameters(), *qkv.parameters(), *proj.parameters()):
            torch.nn.init.normal_(p, std=0.02)
        x0 = torch.randn(64, width, device=dev)

        def grads(f: Any, first: torch.nn.Linear, second: torch.nn.Linear) -> list[torch.Tensor]:
            x = x0.clone().requires_grad_(True)
            for p in (*first.parameters(), *second.parameters()):
                p.grad = None
            with torch.autocast(dev.type, torch.bfloat16):
                y = f(x)
            y.float().square().mean().backward()
            return [
                t.detach().float()
                for t in (y, x.grad, *(p.grad for p in (*first.parameters(), *second.parameters())))
            ]

        def attention_like(lin: Any) -> Any:
            """qkv, its three parts mixed, then proj, each through ``lin``: the shapes a block's Linears have."""

            def f(x: torch.Tensor) -> torch.Tensor:
                q, k, v = lin(x, qkv).split(width, dim=-1)
                return lin(q + k * v, proj)

            return f

        # (what, the plain one, the function checked, the plain function, its two layers)
        tried: list[tuple[str, str, Any, Any, torch.nn.Linear, torch.nn.Linear]] = [
            ("fused MLP", "MLP's", lambda x: mlp(x, fc, out, backward),
             lambda x: out(F.gelu(fc(x), approximate="tanh")), fc, out),
        ]  # fmt: skip
        if backward == "wbgrad":  # the block's qkv and proj run through linear(): check it at their shapes
            tried.append(
                ("bias-gradient Linear", "Linears'", attention_like(linear),
                 attention_like(lambda x, m: m(x)), qkv, proj)
            )  # fmt: skip
        for what, ref, f, plain_f, first, second in tried:
            plain = grads(plain_f, first, second)
            try:
                got = grads(f, first, second)
            except RuntimeError as e:  # CublasLtError is one; a kernel that cannot launch is another
                raise CublasLtError(f"the {what} failed its check on {dev}: {str(e).splitlines()[0]}") from e
            _compare(f"the {what}'s", f"the plain {ref} on {dev}", ("fc", "out") if first is fc else ("qkv", "proj"),
                     got, plain)  # fmt: skip


def _compare(what: str, against: str, layers: tuple[str, str], got: list[torch.Tensor], plain: list[torch.Tensor]) -> None:  # fmt: skip
    """Raise CublasLtError where one of ``got`` (output, input gradient, then the two layers' weight and bias
    gradients) is further from ``plain``'s than ``CHECK_TOLERANCE``, relative to its largest element."""
    from torchrig.train.cublaslt import CublasLtError

    names = ["output", "input gradient"] + [f"{a}.{p} gradient" for a in layers for p in ("weight", "bias")]
    for name, a, b in zip(names, got, plain, strict=True):
        err = float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
        if not err < CHECK_TOLERANCE:
            raise CublasLtError(f"{what} {name} is {err:.3g} off {against}")


def mlp(x: torch.Tensor, fc: torch.nn.Linear, out: torch.nn.Linear, backward: str = "bgrad") -> torch.Tensor:
    """``out(gelu_tanh(fc(x)))`` in bf16 for x [..., width]: the weights are cast to bf16 as autocast casts
    them (the fp32 parameters get their gradients through the casts); ``backward``: one of ``BACKWARDS``. On
    CUDA, call ``prepare(device)`` first (train/setup.py does for the trainer)."""
    if backward not in BACKWARDS:
        raise ValueError(f"backward {backward!r}: one of {', '.join(BACKWARDS)}")
    dt = torch.bfloat16
    assert fc.bias is not None and out.bias is not None
    shape = x.shape
    params: tuple[torch.Tensor, ...] = (fc.weight, fc.bias, out.weight, out.bias)
    with torch.autocast(x.device.type, enabled=False):
        if backward != "wbgrad":  # cast here, so autograd casts the gradients back to fp32
            params = tuple(p.to(dt) for p in params)
        y = _MLP.apply(x.reshape(-1, shape[-1]).to(dt).contiguous(), *params, backward)
    return y.view(*shape[:-1], y.shape[-1])


class _BiasGradLinear(torch.autograd.Function):
    """``x @ wᵀ + b`` for a 2-D bf16 x and an fp32 weight and bias used in bf16, whose backward computes the
    weight and the bias gradient in one GEMM (``weight_grad``: ``BGRADB``) straight into fp32, instead of the
    GEMM, a sum that reads ``dy`` again, and the kernels that cast both gradients to fp32."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override,unused-ignore]
        w = w.to(x.dtype)
        ctx.save_for_backward(x, w)
        return mm(x, w.t(), b.to(x.dtype))

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override,unused-ignore]
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        dw, db = weight_grad(dy, x, True)
        return mm(dy, w), dw, db


def linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """``layer(x)`` in bf16 for a Linear with a bias, its backward's weight and bias gradient in one GEMM (the
    ``wbgrad`` backward applies it to a GPT block's other Linears, ``qkv`` and ``proj``). The weight and bias are
    used in bf16 as autocast uses them, and get fp32 gradients from the GEMM itself; on CUDA, call
    ``prepare(device)`` first."""
    assert layer.bias is not None
    dt = torch.bfloat16
    shape = x.shape
    with torch.autocast(x.device.type, enabled=False):
        y = _BiasGradLinear.apply(x.reshape(-1, shape[-1]).to(dt).contiguous(), layer.weight, layer.bias)
    return y.view(*shape[:-1], y.shape[-1])  # type: ignore[no-any-return,unused-ignore]
