"""One GPU: each kernel family of GPT-2 large's step against a reference, at the trainer's shapes.

`torchrig train --size large --precision bf16 --compile` diverges on an H200 where medium, and large with
--precision fp8 (which changes only the Linear layers' matmuls), train. This checks, in eager mode and in
seconds, the parts that bf16 large runs and that a CPU run does not: the attention kernels SDPA picks on the
GPU (cuDNN, flash, memory-efficient) against its math kernel in fp32, the fused loss against
``F.cross_entropy``, and the bf16 GEMMs of each Linear shape against fp32. Each line prints the relative
error ``|a - ref| / |ref|`` of the output and of each gradient; bf16 rounding gives about 0.003-0.01.
Usage (repository root): PYTHONPATH=src python3 tools/gpu/large_parts.py [SIZE ...]   (default: medium large)
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchrig.train.config import sizes
from torchrig.train.fusedloss import linear_cross_entropy

torch.backends.cuda.matmul.allow_tf32 = False
DEV = os.environ.get("DEVICE", "cuda")  # cpu: a smoke run of this script (SIZE tiny)
MB = int(os.environ.get("MICRO_BATCH", "16"))


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.detach().float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))


def attention(heads: int, width: int, t: int) -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    shape = (MB, heads, t, width // heads)
    q, k, v = (torch.randn(shape, device=DEV, generator=g) for _ in range(3))
    dy = torch.randn(shape, device=DEV, generator=g)

    def run(backend: SDPBackend, dtype: torch.dtype) -> list[torch.Tensor]:
        xs = [z.detach().to(dtype).clone().requires_grad_() for z in (q, k, v)]
        with sdpa_kernel(backend):
            y = F.scaled_dot_product_attention(*xs, is_causal=True)
        y.backward(dy.to(dtype))
        return [y.detach()] + [z.grad for z in xs]

    ref = run(SDPBackend.MATH, torch.float32)
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            got = run(backend, torch.bfloat16)
        except RuntimeError as e:
            print(f"  attention {backend.name}: not run ({str(e).splitlines()[0][:100]})")
            continue
        errs = " ".join(
            f"{n} {rel(a, r):.4f}" for n, a, r in zip(("out", "dq", "dk", "dv"), got, ref, strict=True)
        )
        print(f"  attention {backend.name} bf16 vs math fp32: {errs}", flush=True)
    with torch.autocast(DEV, dtype=torch.bfloat16):  # what the model gets: SDPA's own choice
        xs = [z.detach().to(torch.bfloat16).clone().requires_grad_() for z in (q, k, v)]
        y = F.scaled_dot_product_attention(*xs, is_causal=True)
        y.backward(dy.to(torch.bfloat16))
    errs = " ".join(
        f"{n} {rel(a, r):.4f}"
        for n, a, r in zip(("out", "dq", "dk", "dv"), [y] + [z.grad for z in xs], ref, strict=True)
    )
    print(f"  attention default choice bf16 vs math fp32: {errs}", flush=True)


def loss(width: int, vocab: int, t: int) -> None:
    g = torch.Generator(device=DEV).manual_seed(1)
    n = MB * t
    h = torch.randn(n, width, device=DEV, generator=g)
    w = torch.randn(vocab, width, device=DEV, generator=g) * 0.02
    y = torch.randint(0, vocab, (n,), device=DEV, generator=g)

    def run(fused: bool) -> list[torch.Tensor]:
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast(DEV, dtype=torch.bfloat16):
            out = linear_cross_entropy(hh, ww, y) if fused else F.cross_entropy((hh @ ww.t()).float(), y)
        out.backward()
        return [out.detach(), hh.grad, ww.grad]

    ref_h, ref_w = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref_loss = F.cross_entropy(ref_h @ ref_w.t(), y)
    ref_loss.backward()
    ref = [ref_loss.detach(), ref_h.grad, ref_w.grad]
    for name, fused in (("fused", True), ("plain", False)):
        got = run(fused)
        errs = " ".join(
            f"{k} {rel(a, r):.4f}" for k, a, r in zip(("loss", "dh", "dw"), got, ref, strict=True)
        )
        print(f"  loss {name} bf16 vs fp32: {errs}", flush=True)


def gemms(width: int, t: int) -> None:
    g = torch.Generator(device=DEV).manual_seed(2)
    n = MB * t
    for k_in, k_out in ((width, 3 * width), (width, width), (width, 4 * width), (4 * width, width)):
        x = torch.randn(n, k_in, device=DEV, generator=g)
        w = torch.randn(k_out, k_in, device=DEV, generator=g) * 0.02
        b = torch.randn(k_out, device=DEV, generator=g) * 0.02
        dy = torch.randn(n, k_out, device=DEV, generator=g)
        xs = [z.clone().requires_grad_() for z in (x, w, b)]
        ref = F.linear(*xs)
        ref.backward(dy)
        rs = [ref.detach()] + [z.grad for z in xs]
        xb = [z.clone().requires_grad_() for z in (x, w, b)]
        with torch.autocast(DEV, dtype=torch.bfloat16):
            out = F.linear(*xb)
        out.backward(dy.to(out.dtype))
        got = [out.detach()] + [z.grad for z in xb]
        errs = " ".join(
            f"{k} {rel(a, r):.4f}" for k, a, r in zip(("out", "dx", "dw", "db"), got, rs, strict=True)
        )
        print(f"  linear {k_in}->{k_out} bf16 vs fp32: {errs}", flush=True)


def main() -> None:
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {name}, cuDNN {torch.backends.cudnn.version()}")
    for size in sys.argv[1:] or ["medium", "large"]:
        info = sizes()["gpt"][size]
        heads, width, t, vocab = (int(info[k]) for k in ("heads", "width", "block_size", "vocab"))
        print(f"{size}: heads {heads}, width {width}, micro-batch {MB}, context {t}", flush=True)
        attention(heads, width, t)
        loss(width, vocab, t)
        gemms(width, t)
        if DEV == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
