"""The tanh GELU's backward and the bias gradient of the layer before it, in one pass over the tensors.

In the transformer MLP ``out(gelu_tanh(fc(x)))`` the backward needs ``dpre = dh * gelu_tanh'(pre)`` (the
input of ``fc``'s two gradient GEMMs) and ``fc``'s bias gradient ``Σ_rows dpre``. Compiled, Inductor makes
these two kernels: one reads ``dh`` and ``pre`` and writes ``dpre``; the other reads them again (or ``dpre``)
for the column sums. The profile of GPT-2 small at micro-batch 16 on an H200 puts them at 81 and 33 µs a
layer (docs/results/training-speed.md). Here one Triton kernel reads ``dh`` and ``pre`` once, writes
``dpre`` and, per block of rows, the column sums of its ``dpre``; a small sum of those partial sums gives the
bias gradient (in a fixed order: the same result every run).

The arithmetic is ``torch.ops.aten.gelu_backward(dh, pre, approximate="tanh")`` on bf16 tensors (fp32 inside,
``dpre`` rounded to bf16 once), then ``dpre.sum(0, dtype=torch.float32)`` rounded to bf16: what the compiled
model computes, up to the order of the fp32 sums. The operator is a ``torch.library`` custom op, so
``torch.compile`` keeps it as one call and CUDA graphs capture it; on the CPU, and on GPUs Triton does not
support, it runs that PyTorch reference.
"""

from __future__ import annotations

import torch

try:  # Triton ships with PyTorch's CUDA builds; CPU builds have none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the build
    triton = None

SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2/pi), the tanh GELU's constant (aten's kBeta)
KAPPA = 0.044715  # its cubic coefficient (aten's kKappa)
PARTIAL_ROWS = 128  # rows per partial column sum: the partial sums' buffer has ceil(M / 128) rows


def reference(dh: torch.Tensor, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dpre, dbias)`` as the compiled model computes them (see the module's documentation)."""
    dpre = torch.ops.aten.gelu_backward(dh, pre, approximate="tanh")
    return dpre, dpre.sum(0, dtype=torch.float32).to(dh.dtype)


if triton is not None:
    _BETA = tl.constexpr(SQRT_2_OVER_PI)
    _KAPPA = tl.constexpr(KAPPA)
    _CHUNK = tl.constexpr(PARTIAL_ROWS)

    @triton.jit
    def _gelu_bias_kernel(
        dh_ptr,
        pre_ptr,
        dpre_ptr,
        part_ptr,
        n_rows,
        n_cols,
        n_slots,
        stride_dh,
        stride_pre,
        stride_dpre,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        ROWS: tl.constexpr,
    ):
        # a program: ROWS rows x BLOCK_N columns, in chunks of 128 rows; each chunk's column sums are one row
        # ("slot") of the partial sums, so every slot is written whatever the block sizes
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        for chunk in range(0, ROWS // _CHUNK):
            # fp32 sums per element of the tile over the chunk's rows, reduced across rows once at its end
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            first = pid_m * ROWS + chunk * _CHUNK
            for start in range(0, _CHUNK, BLOCK_M):
                rows = (first + start + tl.arange(0, BLOCK_M)).to(tl.int64)
                mask = (rows[:, None] < n_rows) & col_ok[None, :]
                g = tl.load(dh_ptr + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0)
                x = tl.load(pre_ptr + rows[:, None] * stride_pre + cols[None, :], mask=mask, other=0.0)
                g = g.to(tl.float32)
                x = x.to(tl.float32)
                x_sq = x * x
                inner = _BETA * (x + _KAPPA * x_sq * x)
                # tanh is +-1 in fp32 beyond 15, and exp stays finite
                inner = tl.minimum(tl.maximum(inner, -15.0), 15.0)
                t = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)  # tanh(inner)
                d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (_BETA * (1.0 + 3.0 * _KAPPA * x_sq))
                dpre = (g * d).to(dpre_ptr.dtype.element_ty)
                tl.store(dpre_ptr + rows[:, None] * stride_dpre + cols[None, :], dpre, mask=mask)
                acc += dpre.to(tl.float32)  # 0 outside the tensor: g was loaded as 0 there
            slot = first // _CHUNK
            if slot < n_slots:
                tl.store(part_ptr + slot.to(tl.int64) * n_cols + cols, tl.sum(acc, axis=0), mask=col_ok)


# the block sizes tried on the GPU at the first call of each shape (a compiled step's warm-up, before CUDA
# graphs record it): (BLOCK_M, BLOCK_N, ROWS, warps)
CONFIGS = ((32, 128, 256, 4), (64, 128, 512, 8), (32, 256, 512, 8), (64, 64, 1024, 4), (16, 256, 128, 4))

if triton is not None:
    _tuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_M": m, "BLOCK_N": n, "ROWS": r}, num_warps=w) for m, n, r, w in CONFIGS
        ],
        key=["n_rows", "n_cols"],
    )(_gelu_bias_kernel)


def run_kernel(
    dh: torch.Tensor, pre: torch.Tensor, config: tuple[int, int, int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel on 2-D tensors of one shape: autotuned over :data:`CONFIGS` on the GPU, or with one
    of them (``config``; Triton's CPU interpreter, TRITON_INTERPRET=1, runs it so)."""
    dh, pre = dh.contiguous(), pre.contiguous()
    n_rows, n_cols = dh.shape
    dpre = torch.empty_like(dh)
    n_slots = triton.cdiv(n_rows, PARTIAL_ROWS)
    part = torch.empty(n_slots, n_cols, dtype=torch.float32, device=dh.device)  # every slot is written

    def grid(meta: dict) -> tuple[int, int]:
        return triton.cdiv(n_rows, meta["ROWS"]), triton.cdiv(n_cols, meta["BLOCK_N"])

    args = (dh, pre, dpre, part, n_rows, n_cols, n_slots, dh.stride(0), pre.stride(0), dpre.stride(0))
    if config is None:
        _tuned[grid](*args)
    else:
        m, n, r, w = config
        _gelu_bias_kernel[grid](*args, BLOCK_M=m, BLOCK_N=n, ROWS=r, num_warps=w)
    return dpre, part.sum(0).to(dh.dtype)


@torch.library.custom_op("torchrig::gelu_bias_backward", mutates_args=())
def gelu_bias_backward(dh: torch.Tensor, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dh * gelu_tanh'(pre), Σ_rows of it)`` for 2-D ``dh`` and ``pre`` of one shape and dtype: the GELU's
    input gradient and the bias gradient of the layer that made ``pre``. This definition runs on any device;
    CUDA's is one Triton kernel."""
    return reference(dh, pre)


@gelu_bias_backward.register_fake
def _(dh: torch.Tensor, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(dh), dh.new_empty(dh.shape[1])


@gelu_bias_backward.register_kernel("cuda")
def _(dh: torch.Tensor, pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torchrig.train.fusedloss import triton_runs_on  # Triton's GPUs: compute capability 7.0 and newer

    if not triton_runs_on(torch.cuda.get_device_capability(dh.device)):
        return reference(dh, pre)
    return run_kernel(dh, pre)
