"""The GPT head's output projection and cross-entropy in one autograd step: ``linear_cross_entropy``.

The plain head (``F.cross_entropy(head(x).float(), y)``) writes the logits (tokens x vocabulary, 1.65 GB at
GPT-2 small's micro-batch 16), reads them in the loss's forward, and reads them again and writes their
gradient in the backward: on 1x H200 its two loss kernels took 2.05 ms of a 32.3 ms step
(docs/results/training-speed.md). Here one kernel per row computes the row's log-sum-exp and then, in the same
pass over the logits, the gradient ``softmax(x) - onehot(y)``; the backward only multiplies that gradient
into the two matmuls (scaled there by ``grad_output / n``, on the small results, never on the logits). The
numerics are the plain head's: logits in the autocast dtype, the softmax and its sums in fp32, the
gradient stored in the logits' dtype as autograd stores it for the plain head.

Liger-Kernel's fused cross-entropy does the same on one pass per row, but it reads the count of non-ignored
targets back to the host with ``.item()`` on every call (src/liger_kernel/ops/cross_entropy.py, liger-kernel
0.6), a host sync that ends a CUDA graph: here the count stays on the GPU.

``ce_rows`` is a PyTorch custom operator (``torch.library.custom_op``): ``torch.compile`` and CUDA graphs see
one opaque kernel. On CUDA with Triton it runs the Triton kernel below; elsewhere (CPU, no Triton) the same
result from plain PyTorch ops, which the tests compare against ``F.cross_entropy``; so do GPUs older than
Triton supports.
"""

from __future__ import annotations

from typing import Any

import torch

from torchrig.train.ltgemm import mm  # PyTorch's GEMM, or with TORCHRIG_TUNED_GEMMS=1 the timed one

IGNORE_INDEX = -100  # F.cross_entropy's default: a target with this value adds neither loss nor gradient

try:  # Triton ships with PyTorch's CUDA builds; CPU builds have none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the build
    triton = None


def _rows_reference(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    picked = x.gather(1, safe[:, None]).squeeze(1)
    row_loss = torch.where(valid, lse - picked, torch.zeros_like(lse))
    grad = torch.exp(x - lse[:, None])
    grad.scatter_add_(1, safe[:, None], -torch.ones_like(lse)[:, None])
    grad = grad * valid[:, None]
    return row_loss, grad.to(logits.dtype)


if triton is not None:
    # Block width and warps tuned per vocabulary size on the GPU at the first call (a compiled step's warm-up
    # run, before CUDA graphs record it); Liger-Kernel's fixed choice is 32768 columns and 32 warps. On 1x H200
    # the smallest blocks were the fastest (4096 columns: 1.17 ms at GPT-2's micro-batch 16, 32768: 1.55 ms);
    # the whole row in one block, kept in registers for the gradient (one read instead of two), took 1.83 ms
    # (tools/gpu/loss_bench.py, docs/results/training-speed.md).
    # The second read of a row should come from L2, but with one program per row the GPU keeps about a
    # thousand rows in flight (8 programs an SM), 100 KB of logits and 100 KB of gradient each at GPT-2's
    # vocabulary: far more than the 50 MB L2, so much of the second read goes to memory again (1.17 ms is
    # 2.8 TB/s for the bytes one pass must move, of the H200's 4.8). PER_SM > 0 runs a persistent grid of
    # PER_SM programs an SM, each looping over rows, so only that many rows are in flight; FIRST and LAST
    # are L2 eviction policies: keep the first read (evict_last), stream the second and the gradient
    # (evict_first). The autotuner keeps whichever configuration is fastest on the card.
    _L2, _NO_L2 = {"FIRST": "evict_last", "LAST": "evict_first"}, {"FIRST": "", "LAST": ""}

    @triton.autotune(
        configs=[
            triton.Config({"BLOCK": 2048, "PER_SM": 0, **_NO_L2}, num_warps=4),
            triton.Config({"BLOCK": 4096, "PER_SM": 0, **_NO_L2}, num_warps=4),
            triton.Config({"BLOCK": 4096, "PER_SM": 0, **_NO_L2}, num_warps=8),
            triton.Config({"BLOCK": 8192, "PER_SM": 0, **_NO_L2}, num_warps=16),
            triton.Config({"BLOCK": 16384, "PER_SM": 0, **_NO_L2}, num_warps=16),
            triton.Config({"BLOCK": 32768, "PER_SM": 0, **_NO_L2}, num_warps=32),
            triton.Config({"BLOCK": 4096, "PER_SM": 0, **_L2}, num_warps=8),
            triton.Config({"BLOCK": 4096, "PER_SM": 1, **_L2}, num_warps=8),
            triton.Config({"BLOCK": 4096, "PER_SM": 2, **_L2}, num_warps=8),
            triton.Config({"BLOCK": 4096, "PER_SM": 4, **_L2}, num_warps=8),
            triton.Config({"BLOCK": 4096, "PER_SM": 2, **_NO_L2}, num_warps=8),
            triton.Config({"BLOCK": 8192, "PER_SM": 1, **_L2}, num_warps=16),
            triton.Config({"BLOCK": 8192, "PER_SM": 2, **_L2}, num_warps=16),
            triton.Config({"BLOCK": 2048, "PER_SM": 4, **_L2}, num_warps=4),
            triton.Config({"BLOCK": 2048, "PER_SM": 8, **_L2}, num_warps=4),
        ],
        key=["n_cols"],
    )
    @triton.jit
    def _ce_rows_kernel(
        logits_ptr,
        grad_ptr,
        targets_ptr,
        loss_ptr,
        stride,
        n_cols,
        ignore_index,
        n_rows,
        BLOCK: tl.constexpr,
        PER_SM: tl.constexpr,  # only the grid depends on it (grid(), below)
        FIRST: tl.constexpr,  # the first read's L2 eviction policy ("" = the default)
        LAST: tl.constexpr,  # the second read's and the gradient's
    ):
        for i in range(tl.program_id(0), n_rows, tl.num_programs(0)):
            row = tl.cast(i, tl.int64)  # row * stride passes 2**31 at micro-batch 64
            src = logits_ptr + row * stride
            dst = grad_ptr + row * stride
            target = tl.load(targets_ptr + row)
            # pass 1: the row's maximum and sum of exponentials, online (one read of the row)
            m = tl.full([], float("-inf"), tl.float32)
            d = tl.zeros([], tl.float32)
            for start in range(0, n_cols, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = tl.load(src + cols, mask=cols < n_cols, other=float("-inf"), eviction_policy=FIRST)
                x = x.to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=0))
                d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
                m = m_new
            lse = m + tl.log(d)
            valid = target != ignore_index
            picked = tl.load(src + target, mask=valid, other=0.0).to(tl.float32)
            tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
            # pass 2: softmax - onehot, written once (the row was just read: from L2 where it stayed)
            keep = tl.where(valid, 1.0, 0.0)
            for start in range(0, n_cols, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                mask = cols < n_cols
                x = tl.load(src + cols, mask=mask, other=float("-inf"), eviction_policy=LAST).to(tl.float32)
                p = tl.exp(x - lse)
                p = tl.where(cols == target, p - 1.0, p) * keep
                tl.store(dst + cols, p.to(dst.dtype.element_ty), mask=mask, eviction_policy=LAST)


def grid(rows: int, sms: int):
    """The row kernel's launch grid for a configuration: one program per row, or PER_SM programs an SM."""
    return lambda meta: (rows if not meta["PER_SM"] else max(1, min(rows, sms * meta["PER_SM"])),)


# Triton compiles for compute capability 7.0 and newer; on older GPUs (Pascal, Maxwell) the operator runs its
# PyTorch reference (torch/_inductor/exc.py, GPUTooOldForTriton: "Triton only supports devices of CUDA
# Capability >= 7.0").
TRITON_MIN_CAPABILITY = (7, 0)


def triton_runs_on(capability: tuple[int, int]) -> bool:
    """Whether the Triton kernel can run on a GPU of this compute capability (and Triton is installed)."""
    return triton is not None and tuple(capability) >= TRITON_MIN_CAPABILITY


@torch.library.custom_op("torchrig::ce_rows", mutates_args=())
def ce_rows(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``logits`` (N x V): the cross-entropy of its target (0 where ignored, fp32) and the
    unscaled gradient ``softmax - onehot`` (zero rows where ignored) in the logits' dtype."""
    return _rows_reference(logits, targets, ignore_index)


@ce_rows.register_fake
def _ce_rows_fake(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return logits.new_empty(logits.shape[0], dtype=torch.float32), torch.empty_like(logits)


@ce_rows.register_kernel("cuda")
def _ce_rows_cuda(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not triton_runs_on(torch.cuda.get_device_capability(logits.device)):
        return _rows_reference(logits, targets, ignore_index)
    logits = logits.contiguous()
    targets = targets.contiguous()
    rows, cols = logits.shape
    grad = torch.empty_like(logits)
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    sms = torch.cuda.get_device_properties(logits.device).multi_processor_count
    _ce_rows_kernel[grid(rows, sms)](logits, grad, targets, loss, logits.stride(0), cols, ignore_index, rows)
    return loss, grad


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override,unused-ignore]
        ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        hc, wc = h.to(dtype), weight.to(dtype)
        logits = mm(hc, wc.t())
        row_loss, grad = ce_rows(logits, targets, IGNORE_INDEX)
        n = (targets != IGNORE_INDEX).sum().clamp(min=1)
        ctx.save_for_backward(grad, hc, wc, n)
        ctx.dtypes = (h.dtype, weight.dtype)
        return row_loss.sum() / n

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:  # type: ignore[override,unused-ignore]
        grad, hc, wc, n = ctx.saved_tensors
        scale = (g / n).float()
        grad_h = (mm(grad, wc).float() * scale).to(ctx.dtypes[0])
        grad_w = (mm(grad.t(), hc).float() * scale).to(ctx.dtypes[1])
        return grad_h, grad_w, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy((h @ weight.T).float(), targets)`` (mean over non-ignored targets) without keeping the
    logits: ``h`` is (N, D), ``weight`` (V, D), ``targets`` (N,). Under autocast the matmuls run in its dtype."""
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    return _LinearCrossEntropy.apply(h, weight, targets, dtype)  # type: ignore[no-any-return,unused-ignore]
