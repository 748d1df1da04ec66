"""One GPU: the gradients of GPT-2 large's first step, eager against compiled, parameter by parameter.

`torchrig train --size large --precision bf16 --compile` diverges (loss 11 -> 27-31 in 30 steps) where the
same model with --precision fp8, and GPT-2 medium, train. If Inductor computes a wrong gradient for this shape
(e.g. its mix-order reduction, https://github.com/pytorch/pytorch/issues/193061), the compiled step's
gradient differs from eager's by far more than bf16 rounding for the parameters it touches. Prints, for each
compile mode, the parameters whose relative difference |g_c - g_e| / |g_e| exceeds THRESHOLD (0.05), and
the largest ones. Same model, batch and fused loss as the trainer on one GPU (micro-batch 16, context 1024).
Usage (repository root): PYTHONPATH=src python3 tools/gpu/large_grads.py [SIZE] [MICRO_BATCH]
  (about 3 minutes for large; MODES="default reduce-overhead" by default)
"""

import os
import sys

import torch

from torchrig.train.config import sizes
from torchrig.train.data import GeneratedTokens
from torchrig.train.models import build_model

SIZE = sys.argv[1] if len(sys.argv) > 1 else "large"
MB = int(sys.argv[2]) if len(sys.argv) > 2 else 16
THRESHOLD = float(os.environ.get("THRESHOLD", "0.05"))
DEVICE = os.environ.get("DEVICE", "cuda")  # cpu: a smoke run of this script (SIZE tiny)
torch.backends.cuda.matmul.allow_tf32 = True


def grads(model, run, x, y):
    model.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = run(x, y)
    loss.backward()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return float(loss.detach()), {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}


def main() -> None:
    info = sizes()["gpt"][SIZE]
    torch.manual_seed(0)
    model = build_model("gpt", info, context=int(info["block_size"]), vocab=int(info["vocab"])).to(DEVICE)
    model.fused_loss = True
    ds = GeneratedTokens(MB, int(info["block_size"]), int(info["vocab"]), 0)
    x = torch.stack([ds[i][0] for i in range(MB)]).to(DEVICE)
    y = torch.stack([ds[i][1] for i in range(MB)]).to(DEVICE)
    loss_e, ge = grads(model, model, x, y)
    print(f"{SIZE} micro-batch {MB}, torch {torch.__version__}: eager loss {loss_e:.4f}", flush=True)
    for mode in os.environ.get("MODES", "default reduce-overhead").split():
        torch._dynamo.reset()
        run = torch.compile(model, mode=None if mode == "default" else mode)
        for _ in range(3):  # warm-up runs (CUDA graphs record on the third), then the compared one
            if mode == "reduce-overhead" and DEVICE == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            loss_c, gc = grads(model, run, x, y)
        rel = {n: float((gc[n] - ge[n]).norm() / ge[n].norm().clamp(min=1e-30)) for n in ge}
        bad = [n for n, r in rel.items() if r > THRESHOLD]
        worst = sorted(rel.items(), key=lambda kv: -kv[1])[:8]
        print(
            f"compiled ({mode}): loss {loss_c:.4f}; {len(bad)} of {len(rel)} parameters differ by more "
            f"than {THRESHOLD}: " + ", ".join(bad[:20]),
            flush=True,
        )
        print("   largest: " + ", ".join(f"{n} {r:.3g}" for n, r in worst), flush=True)


if __name__ == "__main__":
    main()
