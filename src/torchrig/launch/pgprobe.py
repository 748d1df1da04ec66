"""Pre-flight probe run on every rank (``torchrun ... -m torchrig.launch.pgprobe``).

Creates the process group the job will use, finishes one all_reduce within the collective timeout, checks
the sum, and prints one line per rank. A rank that cannot do this would hang or fail the real job.
"""

from __future__ import annotations

import datetime
import os
import time


def main() -> None:
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=int(os.environ.get("TORCHRIG_COLLECTIVE_TIMEOUT_S", "60")))
    use_cuda = os.environ.get("TORCHRIG_PREFLIGHT_BACKEND", "gloo") == "nccl"
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    t0 = time.perf_counter()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else None
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout, device_id=device)
    x = torch.ones(1024, device="cuda" if use_cuda else "cpu")
    dist.all_reduce(x)
    if use_cuda:
        torch.cuda.synchronize()
    world, rank = dist.get_world_size(), dist.get_rank()
    if not bool((x == world).all()):
        raise RuntimeError(f"all_reduce returned {x[0].item()} on rank {rank}, expected {world}")
    ms = (time.perf_counter() - t0) * 1e3
    print(f"torchrig-preflight: rank {rank}/{world} process group + all_reduce ok in {ms:.0f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
