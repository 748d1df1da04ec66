"""The fused loss's row kernel (train/fusedloss.py) by each of its autotuning choices, against the bandwidth.

A one-pass form (the whole row in one 65,536-column block, kept in registers for the gradient) was measured
with this script on 1x H200 on 2026-12-06 and took 1.83 ms against the two-pass kernel's 1.17 ms at
micro-batch 16 (docs/results/training-speed.md); it is no longer among the choices.

Run on the GPU machine (repository root): `python3 tools/gpu/loss_bench.py [MICRO_BATCH ...]` (16 when none
is given). For GPT-2's head (vocabulary 50,304, seq 1024) at each micro-batch: bf16 logits, one target in
17 ignored, then
1. each configuration of `_ce_rows_kernel` (block, warps, programs an SM, L2 hints) called directly: ms per call (CUDA events, median
   of 7 repeats of 20 calls), GB/s for the bytes one pass must move (the logits read once, their gradient
   written once), and its rows against the PyTorch reference (largest difference);
2. `ce_rows` as training calls it, with the autotuner's pick.
Prints one JSON object per line; the last line is the summary (the fastest choice and the autotuner's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from torchrig.train import fusedloss as fl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lt_epilogue_bench import timed  # the same CUDA-event timing: median ms per call

VOCAB, SEQ = 50304, 1024


def one(mb: int) -> dict:
    rows = mb * SEQ
    g = torch.Generator(device="cuda").manual_seed(mb)
    logits = (4 * torch.randn(rows, VOCAB, device="cuda", generator=g)).to(torch.bfloat16)
    targets = torch.randint(0, VOCAB, (rows,), device="cuda", generator=g)
    targets[::17] = fl.IGNORE_INDEX
    # the first and the last 256 rows: a persistent grid's programs reach the last rows on their last loop
    check = torch.cat([torch.arange(256), torch.arange(rows - 256, rows)]).cuda()
    ref_loss, ref_grad = fl._rows_reference(logits[check], targets[check], fl.IGNORE_INDEX)
    ideal_gb = 2 * logits.numel() * logits.element_size() / 1e9
    grad, loss = torch.empty_like(logits), torch.empty(rows, dtype=torch.float32, device="cuda")
    configs = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cfg in fl._ce_rows_kernel.configs:
        kw, warps = cfg.kwargs, cfg.num_warps
        block, per_sm, hints = kw["BLOCK"], kw["PER_SM"], bool(kw["FIRST"] or kw["LAST"])

        def call(kw=kw, warps=warps) -> None:
            fl._ce_rows_kernel.fn[fl.grid(rows, sms)(kw)](
                logits,
                grad,
                targets,
                loss,
                logits.stride(0),
                VOCAB,
                fl.IGNORE_INDEX,
                rows,
                num_warps=warps,
                **kw,
            )

        grad.fill_(float("nan"))  # a row a configuration never writes shows as nan below
        loss.fill_(float("nan"))
        try:
            ms = timed(call, calls=20)
        except Exception as e:  # a configuration the GPU cannot run is a result too
            configs.append(
                {"block": block, "warps": warps, "per_sm": per_sm, "error": f"{type(e).__name__}: {e}"[:300]}
            )
            continue
        row = {
            "block": block,
            "warps": warps,
            "per_sm": per_sm,  # 0: one program a row; else a persistent grid of per_sm programs an SM
            "l2_hints": hints,
            "ms": round(ms, 4),
            "effective_gb_s": round(ideal_gb / ms * 1e3),
            "loss_diff": float((loss[check] - ref_loss).abs().max()),
            "grad_diff": float((grad[check].float() - ref_grad.float()).abs().max()),
        }
        configs.append(row)
        print(json.dumps({"micro_batch": mb, **row}), flush=True)
    ms = timed(lambda: fl.ce_rows(logits, targets, fl.IGNORE_INDEX), calls=20)
    best = fl._ce_rows_kernel.best_config
    picked = {
        "block": best.kwargs["BLOCK"],
        "warps": best.num_warps,
        "per_sm": best.kwargs["PER_SM"],
        "l2_hints": bool(best.kwargs["FIRST"] or best.kwargs["LAST"]),
        "ms": round(ms, 4),
    }
    fastest = min((c for c in configs if "ms" in c), key=lambda c: c["ms"], default=None)
    return {
        "micro_batch": mb,
        "rows": rows,
        "ideal_gb": round(ideal_gb, 3),
        "autotuned": picked,
        "fastest": fastest,
    }


def main() -> None:
    mbs = [int(a) for a in sys.argv[1:]] or [16]
    name = torch.cuda.get_device_name()
    out = [one(mb) for mb in mbs]
    for o in out:
        print(json.dumps(o), flush=True)
    print(json.dumps({"gpu": name, "torch": torch.__version__, "summary": out}))


if __name__ == "__main__":
    main()
