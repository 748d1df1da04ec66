"""Each GEMM of GPT-2 small's training step: PyTorch's call against every algorithm cuBLASLt's heuristic offers.

Run on the GPU machine (repository root): `python3 tools/gpu/gemm_algos.py [MICRO_BATCH ...]` (16 when none
is given). A step at micro-batch B (T = B·1024 tokens, width 768, vocabulary 50,304) makes, in each of the 12
blocks, for qkv (768→2304), proj (768→768), fc (768→3072) and out (3072→768): the forward (with the bias), the
input gradient (dY @ W) and the weight gradient (dYᵀ @ X, the transpose read in place); and once the head's
three (tied embedding, no bias). For each shape this times, with CUDA events (median of 5 repeats of 10
calls), PyTorch's own call (`F.linear`, `@`: cuBLAS's choice) and `train/cublaslt.py`'s `matmul` by each
algorithm of the heuristic (up to ALGOS, 32), checks every algorithm's result against PyTorch's (relative
difference of the largest element), and sums over the step: PyTorch's GEMM time against the fastest
algorithm's for every shape, i.e. what choosing cuBLASLt's algorithm by timing could save a step.
Prints one JSON object per line; the last line is the summary.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from torchrig.train import cublaslt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lt_epilogue_bench import timed  # the same CUDA-event timing: median ms per call

WIDTH, SEQ, VOCAB, LAYERS = 768, 1024, 50304, 12
LINEARS = {"qkv": (768, 2304), "proj": (768, 768), "fc": (768, 3072), "out": (3072, 768)}


def shapes(mb: int) -> list[tuple[str, int, tuple[int, int], tuple[int, int], bool, bool]]:
    """(name, calls a step, x's stored shape, y's stored shape, x transposed, y transposed); bias where the
    name ends in "fwd" and the layer has one."""
    t = mb * SEQ
    out = []
    for name, (i, o) in LINEARS.items():
        out += [
            (f"{name}.fwd", LAYERS, (t, i), (o, i), False, True),  # X @ Wᵀ + b
            (f"{name}.dgrad", LAYERS, (t, o), (o, i), False, False),  # dY @ W
            (f"{name}.wgrad", LAYERS, (t, o), (t, i), True, False),  # dYᵀ @ X
        ]
    out += [
        ("head.fwd", 1, (t, WIDTH), (VOCAB, WIDTH), False, True),
        ("head.dgrad", 1, (t, VOCAB), (VOCAB, WIDTH), False, False),
        ("head.wgrad", 1, (t, VOCAB), (t, WIDTH), True, False),
    ]
    return out


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def one(mb: int, algos: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(mb)
    rows, step_torch, step_best, step_first = [], 0.0, 0.0, 0.0
    for name, calls, xs, ys, xt, yt in shapes(mb):
        x = torch.randn(*xs, device="cuda", generator=g).to(torch.bfloat16)
        y = (0.02 * torch.randn(*ys, device="cuda", generator=g)).to(torch.bfloat16)
        x, y = (x.t() if xt else x), (y.t() if yt else y)
        bias = None
        if name.endswith(".fwd") and not name.startswith("head"):
            bias = (0.1 * torch.randn(y.shape[1], device="cuda", generator=g)).to(torch.bfloat16)

        def ref_call(x=x, y=y, bias=bias) -> torch.Tensor:
            return F.linear(x, y.t(), bias) if bias is not None else x @ y

        ref = ref_call()
        ms_torch = timed(ref_call, reps=5, calls=10)
        count = cublaslt.algorithm_count(x, y, bias is not None)
        by_algo = []
        for a in range(min(count, algos)):
            try:
                err = rel(cublaslt.matmul(x, y, bias, algo=a), ref)
                ms = timed(lambda a=a, x=x, y=y, b=bias: cublaslt.matmul(x, y, b, algo=a), reps=5, calls=10)
            except Exception as e:  # an algorithm that fails to run is a result too
                by_algo.append({"algo": a, "error": f"{type(e).__name__}: {e}"[:200]})
                continue
            by_algo.append({"algo": a, "ms": round(ms, 4), "rel_diff": float(f"{err:.2g}")})
        good = [r for r in by_algo if "ms" in r and r["rel_diff"] < 0.02]
        best = min(good, key=lambda r: r["ms"], default=None)
        first = next((r for r in by_algo if r["algo"] == 0 and "ms" in r), None)
        m, k = x.shape
        n = y.shape[1]
        row = {
            "micro_batch": mb,
            "gemm": name,
            "m_n_k": [m, n, k],
            "calls_a_step": calls,
            "torch_ms": round(ms_torch, 4),
            "torch_tflops": round(2 * m * n * k / ms_torch / 1e9),
            "lt_first_ms": first and first["ms"],
            "lt_best": best,
            "best_vs_torch": best and round(ms_torch / best["ms"], 3),
            "algorithms": len(by_algo),
            "by_algo": by_algo,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        step_torch += calls * ms_torch
        step_best += calls * min(ms_torch, best["ms"] if best else ms_torch)
        step_first += calls * (first["ms"] if first else ms_torch)
        del x, y, ref
    return {
        "micro_batch": mb,
        "step_gemm_ms_torch": round(step_torch, 3),
        "step_gemm_ms_lt_first": round(step_first, 3),
        "step_gemm_ms_fastest_each": round(step_best, 3),
        "saving_ms": round(step_torch - step_best, 3),
        "gemms": {r["gemm"]: [r["torch_ms"], r["lt_best"] and r["lt_best"]["ms"]] for r in rows},
    }


def main(argv: list[str]) -> int:
    mbs = [int(a) for a in argv] or [16]
    algos = int(os.environ.get("ALGOS", "32"))
    cublaslt.HEURISTIC_RESULTS = algos  # ask the heuristic for this many before the first plan is made
    cublaslt.prepare("cuda")
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "by_micro_batch": []}
    for mb in mbs:
        summary["by_micro_batch"].append(one(mb, algos))
        torch.cuda.empty_cache()
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
