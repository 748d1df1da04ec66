"""``--profile-steps N``: torch.profiler over the last N steps, a Chrome trace per rank, and where the GPU time went
(``--profiler cuda``: the same steps marked for a profiler outside the process instead, :class:`CudaWindow`).

The breakdown answers the question a slow multi-GPU run raises: is the GPU computing, communicating (and is
that communication hidden behind compute or exposed), or waiting for the host? It is computed from the
kernel events of the exported Chrome trace (the profiler's documented output), per optimizer step:

- ``compute_ms``: time some non-NCCL kernel, copy or memset runs (their union);
- ``comm_ms``: time some NCCL kernel runs; ``comm_exposed_ms``: of that, the time no compute runs beside it;
- ``idle_ms``: time the GPU runs nothing (host-bound gaps, waits for data);
- ``step_ms``: the wall-clock step time over the profiled window (synchronised at both ends).

The profiled steps are left out of the run's throughput (the profiler slows the host side).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import time
import zlib
from pathlib import Path
from typing import Any

from torchrig.train.record import KernelTimes, ProfileSummary

Interval = tuple[float, float]

# Kernel-like trace categories: kernels, device copies and memsets (kineto's names for them).
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

# a profiled window of a few steps writes tens to hundreds of MB of JSON; a larger trace is refused
MAX_TRACE_BYTES = 2**30


def _union(spans: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(spans: list[Interval]) -> float:
    return sum(b - a for a, b in spans)


def is_comm_kernel(name: str) -> bool:
    """NCCL's device kernels (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_...``)."""
    return name.lower().startswith("nccl")


def breakdown(events: list[dict[str, Any]], steps: int, wall_s: float) -> ProfileSummary:
    """Per-step GPU time split from Chrome-trace events (``ts``/``dur`` in microseconds) of ``steps`` steps.

    Only events of the device (kernel, memcpy, memset categories) count; with several devices in one trace
    (one rank drives one GPU, so this is unusual) they are pooled.
    """
    compute: list[Interval] = []
    comm: list[Interval] = []
    kernels = comm_kernels = 0
    for ev in events:
        if ev.get("ph") != "X" or str(ev.get("cat", "")).lower() not in DEVICE_CATEGORIES:
            continue
        start, dur = float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0))
        if dur <= 0:
            continue
        if is_comm_kernel(str(ev.get("name", ""))):
            comm.append((start, start + dur))
            comm_kernels += 1
        else:
            compute.append((start, start + dur))
        kernels += 1
    n = max(steps, 1)
    step_ms = wall_s * 1e3 / n
    if not kernels:
        return ProfileSummary(steps=steps, step_ms=round(step_ms, 3), device_events=0)
    compute_len, comm_len = _length(_union(compute)), _length(_union(comm))
    busy = _length(_union(compute + comm))
    exposed = busy - compute_len  # the busy time with NCCL running and no compute beside it
    per = 1e-3 / n  # microseconds in the trace -> milliseconds per step
    return ProfileSummary(
        steps=steps,
        step_ms=round(step_ms, 3),
        compute_ms=round(compute_len * per, 3),
        comm_ms=round(comm_len * per, 3),
        comm_overlapped_ms=round((comm_len - exposed) * per, 3),
        comm_exposed_ms=round(exposed * per, 3),
        idle_ms=round(max(step_ms - busy * per, 0.0), 3),
        device_events=kernels,
        comm_kernels=comm_kernels,
    )


# Kernel-name patterns -> the part of the step they belong to (first match wins). Names as the profiler records
# them: cuBLAS (nvjet_*, sm90_xmma_gemm_*, cutlass_*gemm*), PyTorch's SDPA kernels (flash_fwd/bwd,
# fmha_cutlass*, cudnn's *sdpa*/*fmha*), Inductor's generated kernels (triton_{poi,red,per}_fused_<ops>).
KERNEL_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nccl", ("nccl",)),
    ("attention", ("flash", "fmha", "sdpa", "attention", "attn")),
    ("optimizer", ("adam", "multi_tensor")),
    ("loss (softmax, NLL)", ("softmax", "nll", "cross_entropy", "ce_rows")),
    ("embedding", ("embedding",)),
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "wgmma", "matmul", "splitk")),
    ("norm, GELU, adds (Triton)", ("triton",)),
    ("copy, fill", ("memcpy", "memset", "copy", "fill")),
)


def kernel_groups(events: list[dict[str, Any]], steps: int, top: int = 12) -> KernelTimes:
    """GPU time per step by part of the model (summed kernel durations, so overlapping kernels count twice),
    and the ``top`` kernels by time: where to look for a speed-up."""
    groups: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for ev in events:
        if ev.get("ph") != "X" or str(ev.get("cat", "")).lower() not in DEVICE_CATEGORIES:
            continue
        name, dur = str(ev.get("name", "")), float(ev.get("dur", 0.0))
        low = name.lower()
        group = next((g for g, pats in KERNEL_GROUPS if any(p in low for p in pats)), "other")
        groups[group] = groups.get(group, 0.0) + dur
        by_name[name] = by_name.get(name, 0.0) + dur
    per = 1e-3 / max(steps, 1)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return KernelTimes(
        groups_ms={g: round(v * per, 3) for g, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        top_kernels_ms=tuple((n[:120], round(v * per, 3)) for n, v in ranked),
    )


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a Chrome trace (``.json`` or ``.json.gz``), read and unpacked within MAX_TRACE_BYTES."""
    from torchrig import inputfiles

    raw = inputfiles.read_bytes(path, "profiler trace", max_bytes=MAX_TRACE_BYTES)
    if path.suffix == ".gz":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as err:
            raise inputfiles.InputError(f"profiler trace {str(path)!r} is not gzip data: {err}") from None
        if len(raw) > MAX_TRACE_BYTES:
            raise inputfiles.InputError(
                f"profiler trace {str(path)!r} unpacks to more than {MAX_TRACE_BYTES:,} bytes"
            )
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise inputfiles.InputError(f"profiler trace {str(path)!r} is not JSON: {err}") from None
    return list(data.get("traceEvents", []) if isinstance(data, dict) else data)


class StepProfiler:
    """torch.profiler around a window of steps; ``stop`` writes the trace and returns :func:`breakdown`."""

    def __init__(self, out_dir: Path, rank: int, device: Any) -> None:
        self.out_dir, self.rank, self.device = out_dir, rank, device
        self.prof: Any = None
        self.t0 = 0.0

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(ProfilerActivity.CUDA)
        self._sync()
        self.prof = profile(activities=acts)
        self.prof.__enter__()
        self.t0 = time.perf_counter()

    def step(self, step: int) -> Any:
        """Nothing around one step (torch.profiler records the whole window)."""
        return contextlib.nullcontext()

    def stop(self, steps: int) -> ProfileSummary:
        self._sync()
        wall = time.perf_counter() - self.t0
        self.prof.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank{self.rank}.trace.json.gz"
        self.prof.export_chrome_trace(str(path))
        events = read_trace(path)
        return dataclasses.replace(
            breakdown(events, steps, wall), kernels=kernel_groups(events, steps), trace=str(path)
        )


class CudaWindow:
    """``--profiler cuda``: the profiled steps between ``cudaProfilerStart`` and ``cudaProfilerStop``, each
    step an NVTX range ``torchrig step N``, so that a profiler outside the process records those steps and
    nothing else: ``nsys profile --capture-range=cudaProfilerApi`` (Nsight Systems' user guide) and
    ``ncu --profile-from-start off`` (Nsight Compute's CLI guide), not the compile, the warm-up or the
    checkpoints. torchrig measures the window's step time; the kernels are in that tool's report."""

    WINDOW = "cudaProfilerStart/Stop"

    def __init__(self, device: Any) -> None:
        self.device = device
        self.t0 = 0.0

    def start(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        torch.cuda.profiler.start()
        self.t0 = time.perf_counter()

    def step(self, step: int) -> Any:
        """The NVTX range of one step (a context manager)."""
        import torch

        return torch.cuda.nvtx.range(f"torchrig step {step}")

    def stop(self, steps: int) -> ProfileSummary:
        import torch

        torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self.t0
        torch.cuda.profiler.stop()
        return ProfileSummary(
            steps=steps, step_ms=round(wall * 1000 / max(steps, 1), 3), device_events=0, window=self.WINDOW
        )
