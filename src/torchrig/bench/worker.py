"""The process torchrun starts, one per GPU: ``python -m torch.distributed.run ... -m torchrig.bench.worker``.

Reads the run's :class:`~torchrig.bench.config.BenchConfig` (``--config FILE``), measures the parts it
names, and rank 0 writes the :class:`~torchrig.bench.records.Measurements` as JSON (``--out FILE``).
Progress goes to stderr as lines starting with ``PROGRESS_TAG`` (rank 0 only), which ``torchrig bench``
turns into its live display. Backend: NCCL when the workers have GPUs, gloo otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import sys
import time
from typing import Any

from torchrig.bench.config import BenchConfig, Part
from torchrig.bench.records import Measurements, Meta, RankGpu, Skipped, measurements_to_json
from torchrig.hw.record import GpuFacts

PROGRESS_TAG = "@torchrig-bench-progress "
# NCCL/torch settings worth recording with the figures: they change what the links deliver.
RECORDED_ENV = (
    "NCCL_NVLS_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "CUDA_VISIBLE_DEVICES",
    # the launcher keeps NCCL's flight recorder on (torchrig.launch.envdefaults): a record per collective
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
)


class Progress:
    def __init__(self, rank: int, total: int) -> None:
        self.rank, self.total, self.done = rank, total, 0

    def __call__(self, label: str) -> None:
        if self.rank == 0:
            print(
                PROGRESS_TAG + json.dumps({"done": self.done, "total": self.total, "label": label}),
                file=sys.stderr,
                flush=True,
            )
        self.done += 1


def _steps(cfg: BenchConfig, world: int) -> int:
    per = {
        Part.GEMM.value: len(cfg.gemm_dtypes) * len(cfg.gemm_sizes),
        Part.MEMORY.value: 2,
        Part.HOST.value: 4 * world if cfg.device_kind == "cuda" else 0,
        Part.P2P.value: world * (world - 1),
        Part.COLLECTIVES.value: len(cfg.collectives) * len(cfg.collective_sizes),
        Part.SCALING.value: 0,  # run by the bench itself after the workers: scaling.measure_scaling
    }
    return sum(per[p] for p in cfg.parts)


def _gpu_info(torch: Any, device: Any, rank: int) -> RankGpu:
    """This rank's device as CUDA's device properties describe it (``nvidia-smi --query-gpu=name,
    compute_cap,memory.total``; the L2 size only CUDA says); None on the CPU path."""
    if device.type != "cuda":
        return RankGpu(rank, None)
    p = torch.cuda.get_device_properties(device)
    gpu = GpuFacts(
        index=device.index,
        name=p.name,
        compute_capability=f"{p.major}.{p.minor}",
        memory_total_mib=p.total_memory // (1 << 20),
        l2_cache_bytes=getattr(p, "L2_cache_size", None),
    )
    return RankGpu(rank, gpu)


def _local(out: dict[str, list[Any]], what: str, fn: Any, *args: Any, into: str) -> None:
    """Run a measurement that involves this rank alone; a failure is recorded, not fatal (no other rank waits on it)."""
    try:
        out[into].append(fn(*args))
    except Exception as err:  # e.g. out of memory, or a dtype this torch build cannot multiply
        out["skipped"].append(
            Skipped(what, f"failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
        )


def _device_parts(
    torch: Any, dist: Any, device: Any, cfg: BenchConfig, info: RankGpu, progress: Progress
) -> dict[str, list[Any]]:
    """GEMM and device memory on every GPU at once; host transfers one GPU at a time (they share the host)."""
    from torchrig.bench import device as dev

    out: dict[str, list[Any]] = {"gemm": [], "memory": [], "host": [], "skipped": []}
    rank = dist.get_rank()
    if Part.GEMM.value in cfg.parts:
        _gemm_part(torch, device, cfg, info, rank, out, progress)
    if Part.MEMORY.value in cfg.parts:
        for kind in ("copy", "triad"):
            progress(f"device memory {kind}")
            _local(
                out,
                f"memory {kind} on rank {rank}",
                dev.measure_memory,
                torch,
                device,
                kind,
                cfg.memory_bytes,
                cfg.memory_repeats,
                cfg.warmup,
                info.l2_cache_bytes,
                rank,
                into="memory",
            )
    if Part.HOST.value in cfg.parts:
        if device.type != "cuda":
            if rank == 0:
                out["skipped"].append(Skipped("host", "no GPU: host<->device transfers need a CUDA device"))
        else:
            for turn in range(dist.get_world_size()):
                for pinned in (True, False):
                    for direction in ("h2d", "d2h"):
                        progress(f"host {direction} {'pinned' if pinned else 'pageable'} (rank {turn})")
                        if turn == rank:
                            _local(
                                out,
                                f"host {direction} on rank {rank}",
                                dev.measure_host,
                                torch,
                                device,
                                direction,
                                pinned,
                                cfg.host_bytes,
                                cfg.host_repeats,
                                cfg.warmup,
                                rank,
                                into="host",
                            )
                dist.barrier()
    return out


def gemm_repeats(repeats: int, n: int) -> int:
    """Timed repeats at size ``n``: half above 8192 (an fp32 16384³ call alone takes ~0.17 s on an H200)."""
    return repeats if n <= 8192 else max(5, repeats // 2)


def _gemm_part(
    torch: Any,
    device: Any,
    cfg: BenchConfig,
    info: RankGpu,
    rank: int,
    out: dict[str, list[Any]],
    progress: Progress,
) -> None:
    """Every size for every dtype, smallest size first and in ``GEMM_RUN_ORDER``, each after an idle settle."""
    from torchrig.bench import device as dev

    dtypes = sorted(cfg.gemm_dtypes, key=dev.GEMM_RUN_ORDER.index)
    why: dict[str, str | None] = {}
    for dtype in dtypes:
        why[dtype] = dev.fp8_supported(torch, device) if dtype == "fp8" else None
        if why[dtype] is None and dtype in ("tf32", "fp16") and device.type != "cuda":
            why[dtype] = f"{dtype} tensor-core GEMM needs a CUDA GPU"
        reason = why[dtype]
        if reason is not None and rank == 0:
            out["skipped"].append(Skipped(f"gemm {dtype}", reason))
    state = dev.gpu_state_reader(torch, device)
    settle = cfg.gemm_settle_s if device.type == "cuda" else 0.0
    for n in sorted(cfg.gemm_sizes):
        for dtype in dtypes:
            progress(f"GEMM {dtype} {n}x{n}x{n}")
            if why[dtype] is None:
                _local(
                    out,
                    f"gemm {dtype} {n} on rank {rank}",
                    dev.measure_gemm,
                    torch,
                    device,
                    dtype,
                    n,
                    gemm_repeats(cfg.gemm_repeats, n),
                    cfg.warmup,
                    info.l2_cache_bytes,
                    rank,
                    settle,
                    state,
                    into="gemm",
                )


def _link_parts(
    torch: Any, dist: Any, device: Any, cfg: BenchConfig, progress: Progress
) -> dict[str, list[Any]]:
    from torchrig.bench import comm

    out: dict[str, list[Any]] = {"p2p": [], "collectives": [], "scaling": [], "skipped": [], "model": []}
    world = dist.get_world_size()
    one = "one process: between-GPU figures need at least 2 (use --nproc-per-node 2 or more)"
    if Part.P2P.value in cfg.parts:
        if world < 2:
            out["skipped"].append(Skipped("p2p", one))
        else:
            out["p2p"] = comm.measure_p2p(torch, dist, device, cfg.p2p_bytes, cfg.p2p_iterations, progress)
    if Part.COLLECTIVES.value in cfg.parts:
        if world < 2:
            out["skipped"].append(Skipped("collectives", one))
        else:
            for op in cfg.collectives:
                for size in cfg.collective_sizes:
                    progress(f"{op} {size} B")
                    out["collectives"].append(
                        comm.measure_collective(
                            torch, dist, device, op, size, cfg.collective_dtype, cfg.quick
                        )
                    )
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return out


def run(cfg: BenchConfig, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    cuda = cfg.device_kind == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    progress = Progress(rank, _steps(cfg, world))
    try:
        info = _gpu_info(torch, device, rank)
        local = _device_parts(torch, dist, device, cfg, info, progress)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (info, local))
        links = _link_parts(torch, dist, device, cfg, progress)
        if rank == 0:
            _write(torch, cfg, out_path, gathered, links, world, time.perf_counter() - started)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _write(
    torch: Any,
    cfg: BenchConfig,
    out_path: str,
    gathered: list[Any],
    links: dict[str, list[Any]],
    world: int,
    elapsed_s: float,
) -> None:
    cuda = cfg.device_kind == "cuda"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    meta = Meta(
        date_utc=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        hostname=socket.gethostname(),
        command_line=cfg.command_line,
        device_kind=cfg.device_kind,
        backend="nccl" if cuda else "gloo",
        world_size=world,
        quick=cfg.quick,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        nccl_version=nccl,
        elapsed_s=round(elapsed_s, 1),
        scaling_model=(links["model"] or [""])[0],
        env={k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
    )
    m = Measurements(
        meta=meta,
        gpus=tuple(info for info, _ in gathered),
        gemm=tuple(r for _, loc in gathered for r in loc["gemm"]),
        memory=tuple(r for _, loc in gathered for r in loc["memory"]),
        host=tuple(r for _, loc in gathered for r in loc["host"]),
        p2p=tuple(links["p2p"]),
        collectives=tuple(links["collectives"]),
        scaling=tuple(links["scaling"]),
        skipped=tuple(s for _, loc in gathered for s in loc["skipped"]) + tuple(links["skipped"]),
    )
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(measurements_to_json(m), f, indent=1)
    os.replace(tmp, out_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchrig.bench.worker", description=__doc__)
    parser.add_argument("--config", required=True, help="the run's BenchConfig as a JSON file")
    parser.add_argument("--out", required=True, help="where rank 0 writes the measurements JSON")
    args = parser.parse_args(argv)
    from torchrig.inputfiles import read_text

    cfg = BenchConfig.from_json(read_text(args.config, "bench config", max_bytes=2**20))  # bench wrote it
    run(cfg, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
