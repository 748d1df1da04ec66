"""Run the node command of a rendered sbatch script as two "nodes" on one 2-GPU machine, with NCCL.

Renders ``torchrig cluster slurm --nodes 2 --gpus-per-node 1``, takes the ``bash -c '...'`` node command
and the ``export`` lines from the script, and runs that command twice, each with the variables srun sets
on a node (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_ID) and one GPU (CUDA_VISIBLE_DEVICES=i); the
rendezvous is this host. Then a one-node ``torchrig launch --gpus 2`` run of the same training, and a
step-by-step loss comparison. Writes $OUT/cluster/two-node.json; exit 1 when anything failed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/gpu-out")) / "cluster"
STEPS = int(os.environ.get("STEPS", "60"))
CPU = os.environ.get("CPU") == "1"  # CPU=1: the same run with gloo ranks, to try this script without GPUs
SIZE = os.environ.get("SIZE", "tiny" if CPU else "mini")
TRAIN = ["--model", "gpt", "--size", SIZE, "--data", "synthetic", "--seed", "0", "--micro-batch", "8",
         "--steps", str(STEPS), "--log-every", "1", "--no-ckpt-final", "--no-tensorboard", "--workers", "0",
         "--precision", "fp32", "--resume-if-possible"]  # fmt: skip


def node_command(script: str) -> tuple[str, dict[str, str]]:
    """The command srun runs on each node, and the environment the batch script exports."""
    env = {}
    for line in script.splitlines():
        if line.startswith("export ") and not line.startswith("export RDZV_ENDPOINT"):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = shlex.split(value)[0]
    last = [ln for ln in script.splitlines() if ln.strip().startswith("bash -c ")][-1]
    return shlex.split(last.strip())[2], env


def losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "event" not in rec:
            out[rec["step"]] = rec["loss"]
    return out


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    bindir = (
        OUT / "bin"
    )  # torchrig is not installed here: a `torchrig` on PATH as the console script would be
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrig").write_text(f'#!/bin/sh\nexec {sys.executable} -m torchrig "$@"\n')
    (bindir / "torchrig").chmod(0o755)
    two = OUT / "two-node"
    sbatch = OUT / "job.sbatch"
    render = subprocess.run(
        [sys.executable, "-m", "torchrig", "cluster", "slurm", "--nodes", "2", "--gpus-per-node", "0" if CPU else "1",
         "--rdzv-timeout", "120", "--collective-timeout", "120", "-o", str(sbatch),
         "-m", "--", "torchrig.train", *TRAIN, "--out", str(two)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    print(render.stdout + render.stderr)
    if render.returncode:
        return 1
    cmd, exported = node_command(sbatch.read_text())
    print("node command:", cmd)
    procs, t0 = [], time.time()
    for rank in range(2):
        env = {**os.environ, **exported, "PATH": f"{bindir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "" if CPU else str(rank),
               "SLURM_NNODES": "2", "SLURM_NODEID": str(rank), "SLURM_JOB_ID": "4242",
               "RDZV_ENDPOINT": "127.0.0.1:29633"}  # fmt: skip
        log = open(OUT / f"node{rank}.log", "w")  # noqa: SIM115 - closed with the process below
        procs.append(
            (
                subprocess.Popen(
                    ["bash", "-c", cmd],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=OUT,
                    start_new_session=True,
                ),
                log,
            )
        )
    codes = []
    for p, log in procs:
        try:
            codes.append(p.wait(timeout=360))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the launcher and torchrun run in this group's session
            codes.append(None)
        log.close()
    two_s = time.time() - t0
    one = OUT / "one-node"
    t0 = time.time()
    ref = subprocess.run(
        [sys.executable, "-m", "torchrig", "launch", *(["--cpu", "--nproc-per-node"] if CPU else ["--gpus"]), "2",
         "--log-dir", str(OUT / "logs-one"),
         "-m", "torchrig.train", *TRAIN, "--out", str(one)],
        capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    one_s = time.time() - t0
    (OUT / "one-node.log").write_text(ref.stdout + ref.stderr)
    result: dict = {"two_node_exit": codes, "one_node_exit": ref.returncode, "two_node_s": round(two_s, 1),
                    "one_node_s": round(one_s, 1), "steps": STEPS}  # fmt: skip
    ok = codes == [0, 0] and ref.returncode == 0
    if ok:
        a, b = losses(two), losses(one)
        diff = max(abs(a[s] - b[s]) for s in b) if sorted(a) == sorted(b) else None
        result.update(
            steps_logged=len(a),
            max_abs_loss_diff=diff,
            final_loss_two=a.get(STEPS),
            final_loss_one=b.get(STEPS),
        )
        ok = diff is not None and diff <= 1e-4
    result["ok"] = ok
    (OUT / "two-node.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    for rank in range(2):
        print(f"--- node{rank}.log (tail)")
        print("\n".join((OUT / f"node{rank}.log").read_text(errors="replace").splitlines()[-8:]))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
