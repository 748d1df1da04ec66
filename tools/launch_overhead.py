"""How much later the script's first line runs under ``torchrig launch`` than under plain torchrun.

    python tools/launch_overhead.py --rounds 3 [--cpu --nproc 2] --out overhead.json

Each round runs tests/fixtures/launch/first_line.py under plain ``python -m torch.distributed.run`` and under
``torchrig launch`` (with the pre-flight, as users run it), alternating, and reads the wall-clock time of the
script's first line from its output: "first line" is that time minus the start of the command, "ready" the
time after init_process_group and one all_reduce. torchrig runs twice per round: "cold" with an empty cache
(a fresh TORCHRIG_CACHE_DIR: the first launch on a host; with NVML it plans from NVML and torch checks the
plan beside the job, without NVML torch is probed before the job) and "warm" (the answer the cold run kept).
Each row says whether the GPU probe's cache file existed before the run ("cache_before") and what the
``cuda`` check beside the job found ("cuda_check": ok, warning, error, or null where it did not run).
With --cpu torchrig gets --cpu and never probes GPUs: cold and warm are then the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "launch" / "first_line.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def once(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    cache = Path(env.get("TORCHRIG_CACHE_DIR", "/nonexistent")) / "launch-gpu-probe.json"
    cached = cache.exists()
    t0 = time.time()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    out = r.stdout + r.stderr
    first = re.search(r"first-line (\d+\.\d+)", out)
    ready = re.search(r"ready (\d+\.\d+)", out)
    check = re.search(r"pre-flight cuda: (ok|warning|error):", out)
    if r.returncode != 0 or not first:
        sys.stderr.write(out[-3000:])
    return {
        "first_line_s": round(float(first[1]) - t0, 3) if first else None,
        "ready_s": round(float(ready[1]) - t0, 3) if ready else None,
        "total_s": round(time.time() - t0, 3),
        "rc": r.returncode,
        "cache_before": cached,
        "cuda_check": check[1] if check else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--out", default="launch-overhead.json")
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    if a.cpu:
        env["FIRST_LINE_BACKEND"] = "gloo"
    py = sys.executable
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        logs = str(Path(tmp) / "logs")
        for k in range(a.rounds):
            cache = str(Path(tmp) / f"cache{k}")  # empty: the cold launch probes the GPUs
            plain = [py, "-m", "torch.distributed.run", f"--nproc-per-node={a.nproc}"]
            plain += [f"--rdzv-endpoint=localhost:{free_port()}", "--rdzv-backend=c10d", str(SCRIPT)]
            rig = [py, "-m", "torchrig", "launch", "--log-dir", logs]
            rig += ["--cpu", "--nproc-per-node", str(a.nproc)] if a.cpu else ["--gpus", str(a.nproc)]
            rig += [str(SCRIPT)]
            for name, argv in (("torchrun", plain), ("torchrig-cold", rig), ("torchrig-warm", rig)):
                row = {"round": k, "launcher": name, **once(argv, {**env, "TORCHRIG_CACHE_DIR": cache})}
                if name == "torchrig-cold" and row["cache_before"]:
                    sys.exit(f"the cold run found a cache in {cache}: not a cold start")
                if name == "torchrig-warm" and not a.cpu and not row["cache_before"]:
                    sys.stderr.write("the cold run kept no GPU probe answer: this 'warm' run was cold too\n")
                print(json.dumps(row), flush=True)
                rows.append(row)
    summary = {}
    for name in ("torchrun", "torchrig-cold", "torchrig-warm"):
        firsts = sorted(r["first_line_s"] for r in rows if r["launcher"] == name and r["first_line_s"])
        readies = sorted(r["ready_s"] for r in rows if r["launcher"] == name and r["ready_s"])
        summary[name] = {
            "first_line_median_s": firsts[len(firsts) // 2] if firsts else None,
            "ready_median_s": readies[len(readies) // 2] if readies else None,
        }
    doc = {"host": socket.gethostname(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "cpu": a.cpu, "nproc": a.nproc, "rows": rows, "median": summary}  # fmt: skip
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
