"""torchrig bench's GEMM figure against a plain ``torch.matmul`` / ``torch._scaled_mm`` in the same process.

Usage (GPU machine, repository root): PYTHONPATH=src python3 tools/gpu/gemm_plain.py [--n 8192] > gemm.json

For bf16 and fp8 (e4m3, tensor-wise scale 1, bf16 out, fast accumulation) it measures, one after the other:
- ``bench``: torchrig's own ``measure_gemm`` as ``torchrig bench`` calls it (idle settle, rotated inputs);
- ``plain``: the plain call on one pair of inputs, as a user times it: 10 warm-up calls, then CUDA events
  around each of 50 calls, the median (the anchor_probe.py method);
- ``plain_block``: the same 50 calls back to back between two events.
Prints one JSON object: TFLOP/s per row and bench / plain.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from torchrig.bench import device as dev


def plain(dtype: str, n: int) -> dict[str, float]:
    a, b = dev._gemm_inputs(torch, torch.device("cuda"), dtype, n, seed=0)
    mm = dev._gemm_fn(torch, dtype, torch.device("cuda"))
    for _ in range(10):
        mm(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        mm(a, b)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(50):
        mm(a, b)
    e.record()
    e.synchronize()
    flop = 2 * n**3
    return {
        "plain": flop / statistics.median(times) / 1e12,
        "plain_block": flop / (s.elapsed_time(e) / 1e3 / 50) / 1e12,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--settle-s", type=float, default=1.0)  # bench's default idle before each GEMM
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(device)
    l2 = getattr(props, "L2_cache_size", None)
    state = dev.gpu_state_reader(torch, device)
    rows = []
    for dtype in ("bf16", "fp8"):
        for _ in range(2):  # bench, plain, bench, plain: drift shows as a difference between the two pairs
            g = dev.measure_gemm(torch, device, dtype, args.n, 20, 5, l2, 0, args.settle_s, state)
            p = plain(dtype, args.n)
            rows.append(
                {
                    "dtype": dtype,
                    "n": args.n,
                    "bench": g.tflops,
                    "bench_clock_mhz": g.sm_clock_mhz,
                    **p,
                    "bench_over_plain": g.tflops / p["plain"],
                }
            )
    print(
        json.dumps(
            {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "rows": rows}, indent=1
        )
    )


if __name__ == "__main__":
    main()
