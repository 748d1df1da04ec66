"""cuBLASLt's GELU epilogues (train/cublaslt.py, train/fusedmlp.py) against the compiled GEMM + GELU kernels.

Run on the GPU machine (repository root): `python3 tools/gpu/lt_epilogue_bench.py [MICRO_BATCH ...]`.
For GPT-2 small's MLP (width 768, hidden 3072, seq 1024) at each micro-batch (16 when none is given):
1. the module's enum values against the installed cuBLAS's cublasLt.h;
2. each epilogue's result against an fp32 reference (relative error of the largest element);
3. the time of each part, CUDA events, median of 7 repeats of 50 calls: the forward (`fc` GEMM + GELU,
   compiled, against `GELU_AUX_BIAS`), the backward piece (`dh = dy @ W2`, then GELU backward and the bias
   sum, compiled, against `DGELU_BGRAD`, and against `DGELU` with the bias sum compiled apart), each
   epilogue by every algorithm cuBLASLt's heuristic offers (`ms_by_algorithm`, its first choice first),
   the block's four weight-gradient GEMMs with the bias gradient in the epilogue (`BGRADB`, bf16 or fp32
   out) against the GEMM, the compiled bias sum and the casts to fp32 (the sum alone costs more here than in
   training, where Inductor fuses it into the LayerNorm and GELU backward: on an H100, 2026-12-07, these
   predicted 1.7 ms a step saved and training ran 0.985-1.000x; docs/results/training-speed.md),
   the Triton kernel of train/gelubias.py (GELU backward and bias sum in one pass) against Inductor's two
   kernels, and the whole MLP forward + backward, compiled with CUDA graphs
   (`reduce-overhead`), the plain MLP against train/fusedmlp.py's with each backward, gradients compared.
Prints one JSON object per line; the last line is the summary.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from torchrig.train import cublaslt, gelubias
from torchrig.train.fusedmlp import BACKWARDS
from torchrig.train.fusedmlp import mlp as fused_mlp
from torchrig.train.ltgemm import time_ms


def header_check() -> dict:
    text = cublaslt.installed_headers()
    if text is None:
        return {"header": None}
    return {
        "header": "found",
        "mismatches": cublaslt.header_mismatches(text),
        "library": cublaslt.library_path(),
    }


def timed(fn, reps: int = 7, calls: int = 50) -> float:
    """Median ms per call (CUDA events, after 5 warm-up calls): train/ltgemm.py's timing."""
    return time_ms(fn, reps=reps, calls=calls, warmup=5)


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def parts(mb: int) -> dict:
    t, d, n = mb * 1024, 768, 3072
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16

    def rnd(*s: int, std: float = 1.0) -> torch.Tensor:
        return (torch.randn(*s, device="cuda", generator=g) * std).to(bf)

    x, w1, b1, w2, dy = (
        rnd(t, d),
        rnd(n, d, std=0.02),
        rnd(n, std=0.1),
        rnd(d, n, std=0.02),
        rnd(t, d, std=0.01),
    )
    pre_ref = x.float() @ w1.float().t() + b1.float()
    h_ref = F.gelu(pre_ref, approximate="tanh")
    h, pre = cublaslt.linear_gelu(x, w1, b1)
    pre_b = pre_ref.to(bf)
    dh_ref = dy.float() @ w2.float()
    dpre_ref = torch.ops.aten.gelu_backward(dh_ref, pre_b.float(), approximate="tanh")
    dpre, db = cublaslt.dgelu_matmul(dy, w2, pre_b)
    errors = {
        "h": rel(h, h_ref), "pre": rel(pre, pre_ref), "dpre": rel(dpre, dpre_ref), "db1": rel(db, dpre_ref.sum(0)),
    }  # fmt: skip

    fwd_ref = torch.compile(lambda x, w, b: (F.gelu(p := F.linear(x, w, b), approximate="tanh"), p))
    bwd_ref = torch.compile(
        lambda dy, w2, pre: (
            q := torch.ops.aten.gelu_backward(dy @ w2, pre, approximate="tanh"),
            q.sum(0),
        )
    )
    ms = {
        "fwd_compiled": timed(lambda: fwd_ref(x, w1, b1)),
        "fwd_gemm_only": timed(lambda: F.linear(x, w1, b1)),
        "fwd_lt_gelu_aux_bias": timed(lambda: cublaslt.linear_gelu(x, w1, b1)),
        "bwd_compiled": timed(lambda: bwd_ref(dy, w2, pre_b)),
        "bwd_gemm_only": timed(lambda: dy @ w2),
        "bwd_lt_dgelu_bgrad": timed(lambda: cublaslt.dgelu_matmul(dy, w2, pre_b)),
        "bwd_lt_dgelu": timed(lambda: cublaslt.dgelu_only(dy, w2, pre_b)),
        "bwd_lt_dgelu_then_sum": timed(lambda: bias_sum(cublaslt.dgelu_only(dy, w2, pre_b))),
    }
    errors["dpre_dgelu_only"] = rel(cublaslt.dgelu_only(dy, w2, pre_b), dpre_ref)
    # the Triton kernel (train/gelubias.py) after the plain GEMM, and against Inductor's two kernels alone
    dh_b = dy @ w2
    t_dpre, t_db = gelubias.gelu_bias_backward(dh_b, pre_b)
    errors["dpre_triton"], errors["db1_triton"] = rel(t_dpre, dpre_ref), rel(t_db, dpre_ref.sum(0))
    gelu_bwd_sum = torch.compile(
        lambda dh, pre: (q := torch.ops.aten.gelu_backward(dh, pre, approximate="tanh"), q.sum(0))
    )
    ms["bwd_gemm_then_triton"] = timed(lambda: gelubias.gelu_bias_backward(dy @ w2, pre_b))
    ms["gelu_bwd_sum_compiled"] = timed(lambda: gelu_bwd_sum(dh_b, pre_b))
    ms["gelu_bwd_sum_triton"] = timed(lambda: gelubias.gelu_bias_backward(dh_b, pre_b))
    # a Linear's weight gradient with its bias gradient (BGRADB, bf16 or fp32 out) against the GEMM, the
    # compiled sum and (fp32) the casts autograd adds, for fc's shapes (dpre [T, 3072], x [T, 768]), out's
    # (dy [T, 768], h [T, 3072]), qkv's (dqkv [T, 2304], x) and proj's (dy, x)
    dqkv = rnd(t, 3 * d, std=0.01)
    for name, grad, inp in (("fc", dpre, x), ("out", dy, h), ("qkv", dqkv, x), ("proj", dy, x)):
        ref_w, ref_b = grad.float().t() @ inp.float(), grad.float().sum(0)
        for fp32 in (False, True):
            dw, dbias = cublaslt.weight_grad(grad, inp, fp32=fp32)
            tag = "_fp32" if fp32 else ""
            errors[f"dw_{name}_bgradb{tag}"], errors[f"db_{name}_bgradb{tag}"] = (
                rel(dw, ref_w),
                rel(dbias, ref_b),
            )
        ms[f"wgrad_{name}_gemm_only"] = timed(lambda g=grad, i=inp: g.t() @ i)
        ms[f"wgrad_{name}_gemm_then_sum"] = timed(lambda g=grad, i=inp: (g.t() @ i, bias_sum(g)))
        ms[f"wgrad_{name}_gemm_sum_casts"] = timed(
            lambda g=grad, i=inp: ((g.t() @ i).float(), bias_sum(g).float())
        )
        ms[f"wgrad_{name}_lt_bgradb"] = timed(lambda g=grad, i=inp: cublaslt.weight_grad(g, i))
        ms[f"wgrad_{name}_lt_bgradb_fp32"] = timed(
            lambda g=grad, i=inp: cublaslt.weight_grad(g, i, fp32=True)
        )
    # every algorithm the heuristic offers, not only its first choice (ms per call, in its order)
    algos = {
        "fwd_gelu_aux_bias": each_algorithm(lambda a: cublaslt.linear_gelu(x, w1, b1, algo=a)),
        "bwd_dgelu_bgrad": each_algorithm(lambda a: cublaslt.dgelu_matmul(dy, w2, pre_b, algo=a)),
        "bwd_dgelu": each_algorithm(lambda a: cublaslt.dgelu_only(dy, w2, pre_b, algo=a)),
        "wgrad_fc_bgradb_fp32": each_algorithm(lambda a: cublaslt.weight_grad(dpre, x, fp32=True, algo=a)),
        "wgrad_out_bgradb_fp32": each_algorithm(lambda a: cublaslt.weight_grad(dy, h, fp32=True, algo=a)),
    }
    return {"micro_batch": mb, "rel_error": errors, "ms": ms, "ms_by_algorithm": algos}


bias_sum = torch.compile(lambda q: q.sum(0, dtype=torch.float32).to(q.dtype))


def each_algorithm(call) -> list[float]:
    out = []
    for a in range(cublaslt.HEURISTIC_RESULTS):
        try:
            call(a)
        except cublaslt.CublasLtError:
            break
        out.append(round(timed(lambda a=a: call(a)), 4))
    return out


def whole(mb: int) -> dict:
    """The MLP's forward + backward, compiled with CUDA graphs: plain against each fused backward, same weights."""
    t, d = mb * 1024, 768
    torch.manual_seed(0)
    fc, out = torch.nn.Linear(d, 4 * d).cuda(), torch.nn.Linear(4 * d, d).cuda()
    for p in (*fc.parameters(), *out.parameters()):
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(t, d, device="cuda", requires_grad=True)
    params = [x, *fc.parameters(), *out.parameters()]

    def plain(x: torch.Tensor) -> torch.Tensor:
        return out(F.gelu(fc(x), approximate="tanh"))

    # each backward of the fused MLP (train/fusedmlp.py BACKWARDS), under its own name
    variants = {
        "plain": plain,
        **{f"fused_{b}": functools.partial(fused_mlp, fc=fc, out=out, backward=b) for b in BACKWARDS},
    }

    res = {}
    grads = {}
    for name, f in variants.items():
        cf = torch.compile(f, mode="reduce-overhead")

        def step(cf=cf) -> None:
            for p in params:
                p.grad = None
            with torch.autocast("cuda", torch.bfloat16):
                y = cf(x)
            (y.float().square().mean()).backward()

        step()
        grads[name] = [p.grad.float().clone() for p in params]
        res[f"{name}_ms"] = timed(step, reps=5, calls=20)
    for name in variants:
        if name != "plain":
            res[f"{name}_grad_rel_error"] = [
                rel(a, b) for a, b in zip(grads[name], grads["plain"], strict=True)
            ]
    return {"micro_batch": mb, "whole_mlp": res}


def main() -> None:
    mbs = [int(a) for a in sys.argv[1:]] or [16]
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, **header_check()}))
    summary = []
    for mb in mbs:
        p = parts(mb)
        print(json.dumps(p), flush=True)
        w = whole(mb)
        print(json.dumps(w), flush=True)
        summary.append({**p, **w})
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()
