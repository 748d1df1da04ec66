"""torchrig launch on nanoGPT's train.py (unedited, tests/fixtures/thirdparty/nanogpt) with NCCL on one GPU:
a SIGKILL sent from outside to the rank names it, the signal and who sent it, with its last lines in the order
written. Skipped without CUDA. (With one GPU a job has one NCCL rank: the hang of one rank among several is
covered on CPU/gloo, the NCCL hang by test_launch_gpu.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

NANOGPT = Path(__file__).resolve().parents[1] / "fixtures" / "thirdparty" / "nanogpt"
# a small model (nanoGPT's own options), random tokens, no evaluation after the first
TRAIN = [
    "train.py",
    "--dataset=random",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=128",
    "--block_size=64",
    "--batch_size=8",
    "--gradient_accumulation_steps=1",
    "--max_iters=1000000",
    "--lr_decay_iters=1000000",
    "--eval_interval=1000000",
    "--eval_iters=2",
    "--log_interval=1",
    "--compile=False",
    "--always_save_checkpoint=False",
    "--out_dir=out",
]


def _job_dir(tmp_path: Path) -> Path:
    """nanoGPT's files and a token file where train.py looks for them (data/random/, from the working dir)."""
    import numpy as np

    for f in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / f, tmp_path / f)
    data = tmp_path / "data" / "random"
    data.mkdir(parents=True)
    tokens = np.random.default_rng(0).integers(0, 50304, 200_000, dtype=np.uint16)
    tokens.tofile(data / "train.bin")
    tokens.tofile(data / "val.bin")
    return tmp_path


def test_sigkill_from_outside_names_the_rank_the_signal_and_its_last_iteration(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    job = _job_dir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_PORT")}
    argv = [sys.executable, "-m", "torchrig", "--json", "launch", "--gpus", "1", "--log-dir", "logs", *TRAIN]
    proc = subprocess.Popen(argv, cwd=job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0, pid = time.monotonic(), None
        while time.monotonic() - t0 < 120 and pid is None:
            time.sleep(0.5)
            for log in job.glob("logs/torchrig_*/attempt_0/0/output.log"):
                text = log.read_text()
                m = re.search(r"torchrig-worker: rank=0 .*? pid=(\d+)", text)
                if m and re.search(r"iter 20: loss", text):
                    pid = int(m[1])
        assert pid is not None, "nanoGPT never reached iteration 20"
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    r = json.loads(out)["result"]
    s = r["summary"]
    status = "killed by SIGKILL from outside the job: neither torchrun nor torchrig sent it"
    assert s["headline"] == f"rank 0 failed ({status})"
    v = s["ranks"][0]
    assert (v["rank"], v["role"], v["status"]) == (0, "culprit", status)
    written = re.findall(
        r"^\S+ out\| (iter \d+: loss .*)$", (Path(r["run_dir"]) / "attempt_0/0/output.log").read_text(), re.M
    )
    assert v["last_lines"][-1].endswith(written[-1])
    assert Path(r["run_dir"]).is_absolute() and Path(r["run_dir"]).parent == job / "logs"
