"""Per-GPU measurements: matrix-multiply TFLOP/s, device memory bandwidth, host<->device bandwidth.

Definitions (the same as the plain-PyTorch anchors): GEMM ``2 n^3 / t`` on square random matrices; device
copy counts bytes read plus written (``2 x size``), triad ``a = b + s * c`` counts ``3 x size``; host<->device
counts the bytes moved once. Every figure is the median of CUDA-event-timed repeats after warm-up, on
inputs rotated so the L2 cache cannot flatter them, and every result is checked against a reference.
``torch`` is passed in: this module imports nothing heavy itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torchrig.bench.records import GemmResult, HostResult, MemoryResult
from torchrig.bench.timing import Timer, median, rotation_sets

# Tolerances for max |C - C_ref| / max |C_ref| on a checked block (the reference is float64 on the same
# inputs); tf32 keeps a 10-bit mantissa, bf16/fp16/fp8 outputs are rounded to bf16/fp16.
GEMM_TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 2e-2, "fp16": 1e-2, "fp8": 2e-2}
CHECK_BLOCK = 256
# GEMMs run smallest size first and, within a size, in this order (the anchor's, fp8 before the slow fp32):
# a long fp32 run at 16384 (seconds at full power) right before another dtype lowered that one's figure.
GEMM_RUN_ORDER = ("bf16", "fp16", "tf32", "fp8", "fp32")
# Warm-up lasts at least this long (and at least ``warmup`` calls): after the idle settle the GPU's clocks
# must be back up before the first timed call.
GEMM_MIN_WARMUP_S = 0.05

# (SM clock MHz, temperature C, power W) of the GPU now, any of them None when unknown.
GpuState = tuple[int | None, int | None, float | None]


def gpu_state_reader(torch: Any, device: Any) -> Callable[[], GpuState] | None:
    """A callable that reads the GPU's SM clock, temperature and power through NVML (torchrig's NVML adapter,
    ``torchrig.hw.nvml``); None without NVML or when NVML does not know this GPU.

    The GPU is found by its UUID, so ``CUDA_VISIBLE_DEVICES`` renumbering does not matter. The NVML session
    stays open for the worker's life: the reader is called after every timed GEMM.
    """
    from torchrig.hw import nvml

    opened = nvml.open_for_cuda(torch, device)
    if opened is None:
        return None
    gpus, found = opened

    def read() -> GpuState:
        s = gpus.sensors(found)
        power = None if s.power_draw_w is None else round(s.power_draw_w, 1)
        return s.sm_clock_mhz, s.temperature_c, power

    return read


def fp8_supported(torch: Any, device: Any) -> str | None:
    """None when fp8 GEMM can run here, else the reason it cannot."""
    if device.type != "cuda":
        return "fp8 GEMM needs a CUDA GPU"
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no fp8 matmul (torch._scaled_mm)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"fp8 tensor cores need compute capability >= 8.9; this GPU is {major}.{minor}"
    return None


def _gemm_inputs(torch: Any, device: Any, dtype_name: str, n: int, seed: int) -> tuple[Any, Any]:
    gen = torch.Generator(device=device).manual_seed(seed)
    if dtype_name == "fp8":
        a = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device, generator=gen).to(torch.float8_e4m3fn).t()  # column-major
        return a, b
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        dtype_name
    ]
    return (
        torch.randn(n, n, device=device, dtype=dtype, generator=gen),
        torch.randn(n, n, device=device, dtype=dtype, generator=gen),
    )


def _gemm_fn(torch: Any, dtype_name: str, device: Any) -> Any:
    if dtype_name == "fp8":
        one = torch.ones((), device=device, dtype=torch.float32)
        # Tensor-wise scales of 1, bf16 output, fast accumulation (as Transformer Engine's forward pass).
        return lambda a, b: torch._scaled_mm(
            a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    return lambda a, b: torch.matmul(a, b)


def measure_gemm(
    torch: Any,
    device: Any,
    dtype_name: str,
    n: int,
    repeats: int,
    warmup: int,
    l2_cache_bytes: int | None,
    rank: int,
    settle_s: float = 0.0,
    state: Callable[[], GpuState] | None = None,
) -> GemmResult:
    """TFLOP/s of an ``n x n x n`` matrix multiply in ``dtype_name`` (fp32 | tf32 | bf16 | fp16 | fp8).

    The GPU idles ``settle_s`` seconds after the inputs are made and before the warm-up; ``state`` (see
    :func:`gpu_state_reader`) is read as the last timed repeat ends.
    """
    previous = torch.get_float32_matmul_precision()
    # "highest" keeps fp32 matmuls in IEEE fp32; "high" lets them use TF32 tensor cores. It sets the same two
    # flags as ``torch.backends.cuda.matmul.allow_tf32`` (ATen Context.cpp). The newer ``fp32_precision``
    # attribute is not used: set alone, it makes ``get_float32_matmul_precision()`` raise (mixed APIs).
    torch.set_float32_matmul_precision("high" if dtype_name == "tf32" else "highest")
    try:
        first = _gemm_inputs(torch, device, dtype_name, n, seed=0)
        per_set = 2 * first[0].numel() * first[0].element_size()
        sets = [first] + [
            _gemm_inputs(torch, device, dtype_name, n, seed=k)
            for k in range(1, rotation_sets(per_set, l2_cache_bytes))
        ]
        mm = _gemm_fn(torch, dtype_name, device)
        timer = Timer(torch, device)
        timer.sync()
        if settle_s > 0:
            time.sleep(settle_s)
        times = timer.time_each(lambda i: mm(*sets[i % len(sets)]), repeats, warmup, GEMM_MIN_WARMUP_S)
        clock, temp, power = state() if state is not None else (None, None, None)
        err = _gemm_error(torch, mm, *first)
    finally:
        torch.set_float32_matmul_precision(previous)
    t = median(times)
    ok = err <= GEMM_TOLERANCE[dtype_name]
    return GemmResult(
        rank=rank,
        dtype=dtype_name,
        n=n,
        tflops=2.0 * n**3 / t / 1e12,
        median_ms=t * 1e3,
        repeats=repeats,
        check_ok=ok,
        max_rel_err=err,
        note="e4m3, tensor-wise scale, fast accumulation" if dtype_name == "fp8" else "",
        sm_clock_mhz=clock,
        temperature_c=temp,
        power_w=power,
    )


def _gemm_error(torch: Any, mm: Any, a: Any, b: Any) -> float:
    """max |C - C_ref| / max |C_ref| on the top-left block, the reference in float64 from the same inputs."""
    k = min(CHECK_BLOCK, a.shape[0])
    got = mm(a, b)[:k, :k].float().double()
    ref = a[:k, :].float().double() @ b[:, :k].float().double()
    scale = ref.abs().max().clamp_min(1e-30)
    return float(((got - ref).abs().max() / scale).item())


def measure_memory(
    torch: Any,
    device: Any,
    kind: str,
    size_bytes: int,
    repeats: int,
    warmup: int,
    l2_cache_bytes: int | None,
    rank: int,
) -> MemoryResult:
    """Device memory bandwidth: ``copy`` (y = x, 2 x size bytes) or ``triad`` (a = b + s c, 3 x size bytes)."""
    timer = Timer(torch, device)
    if kind == "copy":
        n = size_bytes
        sets = [
            (
                torch.randint(0, 256, (n,), dtype=torch.uint8, device=device),
                torch.empty(n, dtype=torch.uint8, device=device),
            )
            for _ in range(rotation_sets(2 * n, l2_cache_bytes))
        ]
        times = timer.time_each(
            lambda i: sets[i % len(sets)][1].copy_(sets[i % len(sets)][0]), repeats, warmup
        )
        ok = all(bool(torch.equal(dst, src)) for src, dst in sets)
        moved = 2 * n
    elif kind == "triad":
        n = size_bytes // 4
        tsets = [
            (torch.empty(n, device=device), torch.rand(n, device=device), torch.rand(n, device=device))
            for _ in range(rotation_sets(3 * 4 * n, l2_cache_bytes))
        ]

        def triad(i: int) -> None:
            a, b, c = tsets[i % len(tsets)]
            torch.add(b, c, alpha=3.0, out=a)

        times = timer.time_each(triad, repeats, warmup)
        a, b, c = tsets[0]
        k = min(n, 1 << 20)
        ok = bool(torch.allclose(a[:k], b[:k] + 3.0 * c[:k]))
        moved = 3 * 4 * n
    else:
        raise ValueError(f"unknown memory kind {kind!r}")
    t = median(times)
    return MemoryResult(
        rank=rank,
        kind=kind,
        size_bytes=moved // (2 if kind == "copy" else 3),
        gbps=moved / t / 1e9,
        median_ms=t * 1e3,
        repeats=repeats,
        check_ok=ok,
    )


def _fill_random(torch: Any, buf: Any, block_bytes: int = 1 << 20) -> None:
    """Write every byte of a 1-D uint8 CPU tensor: one random block, repeated (memcpy speed, not RNG speed)."""
    block = torch.randint(0, 256, (min(block_bytes, buf.numel()),), dtype=torch.uint8)
    whole = buf.numel() // block.numel() * block.numel()
    if whole:
        buf[:whole].view(-1, block.numel()).copy_(block.expand(whole // block.numel(), -1))
    rest = buf.numel() - whole
    if rest:
        buf[whole:].copy_(block[:rest])


def measure_host(
    torch: Any,
    device: Any,
    direction: str,
    pinned: bool,
    size_bytes: int,
    repeats: int,
    warmup: int,
    rank: int,
) -> HostResult:
    """Host<->device bandwidth of one ``size_bytes`` copy (``non_blocking``, as a data loader copies).

    The host buffer holds data in every page, as a batch a program made does: random bytes, written
    before timing. A pageable buffer that was never written would read the kernel's shared zero page and
    flatter the copy (the driver's staging memcpy then reads one cached page instead of memory).
    """
    # Allocated pinned directly (no pageable staging copy).
    host = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=pinned)
    _fill_random(torch, host)
    dev = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    timer = Timer(torch, device)
    if direction == "h2d":
        times = timer.time_each(lambda i: dev.copy_(host, non_blocking=True), repeats, warmup)
        timer.sync()
        ok = bool(torch.equal(dev[: 1 << 20].cpu(), host[: 1 << 20]))
    elif direction == "d2h":
        dev.random_(0, 256)
        times = timer.time_each(lambda i: host.copy_(dev, non_blocking=True), repeats, warmup)
        timer.sync()
        ok = bool(torch.equal(dev[: 1 << 20].cpu(), host[: 1 << 20]))
    else:
        raise ValueError(f"unknown direction {direction!r}")
    t = median(times)
    return HostResult(
        rank=rank,
        direction=direction,
        pinned=pinned,
        size_bytes=size_bytes,
        gbps=size_bytes / t / 1e9,
        median_ms=t * 1e3,
        repeats=repeats,
        check_ok=ok,
    )
