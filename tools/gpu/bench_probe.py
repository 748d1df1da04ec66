"""Plain-PyTorch diagnostics for two bench figures that differed from the anchor on 1x H200 (run 1).

1. GEMM tf32 8192^3: does the GPU's state after a long run (4 s of fp32 16384^3) lower the next figure,
   and do ``allow_tf32 = True`` and ``set_float32_matmul_precision("high")`` give the same speed (measured
   in the order A B B A, so that the order and the GPU's state are not read as the call's effect)?
2. h2d pageable 1 GiB: a never-written ``torch.empty`` buffer (the anchor's) against the same buffer once
   every page holds data (what a program copies), and the host's one-thread memory copy speed, which bounds
   the driver's staging of pageable memory.

Usage (from tools/gpu/bench.sh): python3 tools/gpu/bench_probe.py   -> one JSON line on stdout.
Timing as the anchor: CUDA events around each call, median of the repeats after warm-up.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch

N, BIG, HOST_BYTES = 8192, 16384, 1 << 30


def cuda_time(fn: Any, reps: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def sm_clock() -> Any:
    """A callable returning the SM clock in MHz now (None without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        return lambda: int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:
        return lambda: None


def gemm(out: dict[str, Any]) -> None:
    clock = sm_clock()
    a, b = torch.randn(N, N, device="cuda"), torch.randn(N, N, device="cuda")

    def tf32(tag: str) -> None:
        t = cuda_time(lambda: a @ b)
        out[f"tf32_{tag}_tflops"] = round(2 * N**3 / t / 1e12, 1)
        out[f"tf32_{tag}_sm_mhz"] = clock()

    # Both calls set the same two flags (float32 matmul precision HIGH, CUDA matmul fp32 precision TF32),
    # so any gap between them is the GPU's state: measured in both orders, A B B A, to tell the two apart.
    def with_allow_tf32(tag: str) -> None:
        torch.backends.cuda.matmul.allow_tf32 = True
        time.sleep(1.0)
        tf32(tag)
        torch.backends.cuda.matmul.allow_tf32 = False

    def with_precision_high(tag: str) -> None:
        torch.set_float32_matmul_precision("high")
        time.sleep(1.0)
        tf32(tag)
        torch.set_float32_matmul_precision("highest")

    with_allow_tf32("allow_tf32_idle")
    with_precision_high("precision_high_idle")
    with_precision_high("precision_high_idle_2")
    with_allow_tf32("allow_tf32_idle_2")
    x, y = torch.randn(BIG, BIG, device="cuda"), torch.randn(BIG, BIG, device="cuda")
    t0 = time.perf_counter()
    for _ in range(25):  # as bench's fp32 16384^3 (5 warm-up + 20 timed), ~4 s on an H200
        x @ y
    torch.cuda.synchronize()
    out["fp32_16384_heat_s"] = round(time.perf_counter() - t0, 1)
    out["sm_mhz_after_heat"] = clock()
    del x, y
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32("right_after_fp32_16384")
    time.sleep(1.0)
    tf32("after_fp32_16384_and_1s_idle")
    torch.backends.cuda.matmul.allow_tf32 = False


def host(out: dict[str, Any]) -> None:
    d = torch.empty(HOST_BYTES, dtype=torch.uint8, device="cuda")
    h = torch.empty(HOST_BYTES, dtype=torch.uint8)  # never written: its pages read the zero page
    t = cuda_time(lambda: d.copy_(h, non_blocking=True), reps=10)
    out["h2d_pageable_never_written_GBps"] = round(HOST_BYTES / t / 1e9, 1)
    h.fill_(0xA5)  # every page now holds data of its own
    t = cuda_time(lambda: d.copy_(h, non_blocking=True), reps=10)
    out["h2d_pageable_written_GBps"] = round(HOST_BYTES / t / 1e9, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the driver stages pageable memory with one thread
    dst = torch.empty_like(h)
    dst.fill_(1)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        dst.copy_(h)
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(threads)
    out["host_memcpy_1thread_GBps"] = round(HOST_BYTES / statistics.median(times) / 1e9, 1)


def main() -> None:
    out: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    gemm(out)
    host(out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
