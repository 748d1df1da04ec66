"""``torchrig doctor --deep``: a two-rank NCCL all-reduce over each pair of GPUs, one process per GPU.

The ranks start together (one interpreter per GPU, joined through a FileStore in a temporary directory, so no
port is involved); for every pair each rank takes part in ``new_group([a, b])`` and the pair's two ranks
all-reduce a tensor over it (each pair's own communicator: NVLink, P2P over PCIe or shared memory, as NCCL
chooses). Each rank prints its pairs' results as one JSON line. The whole check is bounded by ``timeout_s``:
a rank still running then is killed and its pairs are reported as timed out.

The child script (:data:`SCRIPT`) needs only the standard library and torch.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import tempfile
import time

from torchrig.doctor.facts import NcclPairCheck

SCRIPT = r"""
import json, os, sys, time
rank, world, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = {"rank": rank, "pairs": [], "error": None}
try:
    import torch
    import torch.distributed as dist
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    store = dist.FileStore(os.path.join(root, "store"), world)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world)
    for a in range(world):
        for b in range(a + 1, world):
            group = dist.new_group([a, b])
            if rank not in (a, b):
                continue
            rec = {"a": a, "b": b, "ok": False, "error": None, "elapsed_ms": None}
            t0 = time.perf_counter()
            try:
                x = torch.ones(1 << 20, device=dev)
                dist.all_reduce(x, group=group)
                torch.cuda.synchronize(dev)
                rec["ok"] = bool((x == 2).all().item())
                if not rec["ok"]:
                    rec["error"] = "the all-reduce of two ones did not give 2"
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {e}"[:1000]
            rec["elapsed_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            out["pairs"].append(rec)
    dist.destroy_process_group()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"[:1000]
print(json.dumps(out), flush=True)
sys.stdout.flush()
os._exit(0)
"""


def probe_pairs(python: str, gpus: int, timeout_s: float = 120.0) -> tuple[NcclPairCheck, ...]:
    """Every pair of the ``gpus`` visible GPUs, all-reduced by two ranks; () with fewer than two GPUs."""
    if gpus < 2:
        return ()
    pairs = list(itertools.combinations(range(gpus), 2))
    results: dict[tuple[int, int], NcclPairCheck] = {}
    rank_errors: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="torchrig-nccl-pairs-") as root:
        procs = [
            subprocess.Popen(
                [python, "-c", SCRIPT, str(r), str(gpus), root],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
            )
            for r in range(gpus)
        ]
        deadline = time.monotonic() + timeout_s
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            said = _collect(out, results)
            if said or p.returncode not in (0, None):
                tail = (err or "").strip().splitlines()[-1:] or [f"exit status {p.returncode}"]
                rank_errors[rank] = said or tail[0][:500]
    return tuple(
        results.get(
            (a, b),
            NcclPairCheck(
                a,
                b,
                False,
                rank_errors.get(a) or rank_errors.get(b) or f"no result in {timeout_s:g} s (a rank hung)",
            ),
        )
        for a, b in pairs
    )


def _collect(out: str, results: dict[tuple[int, int], NcclPairCheck]) -> str | None:
    """Record a rank's pairs; return the error it reported for itself (its init failed), if any."""
    data = None
    for line in (out or "").splitlines():
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
    if data is None:
        return None  # a rank that died or hung: its pairs stay without a result (see probe_pairs)
    for rec in data.get("pairs") or ():
        key = (int(rec["a"]), int(rec["b"]))
        prev = results.get(key)
        check = NcclPairCheck(key[0], key[1], bool(rec.get("ok")), rec.get("error"), rec.get("elapsed_ms"))
        if prev is None or (prev.ok and not check.ok):  # the worse of the two ranks' accounts
            results[key] = check
    return data.get("error")
