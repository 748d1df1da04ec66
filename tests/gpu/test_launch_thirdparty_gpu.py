"""torchrig launch on nanoGPT's train.py (unedited, tests/fixtures/thirdparty/nanogpt) with NCCL: a SIGKILL sent from
outside to a rank names it, the signal and who sent it, with its last lines in the order written (one GPU, and
one rank of two on two GPUs); a SIGSTOP to one rank of two in DDP is a hang whose culprit is the stopped rank and
whose victim is the rank left waiting for its gradient all-reduce. Skipped without CUDA (the two-rank cases
without two GPUs)."""

from __future__ import annotations

import contextlib
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
            assert proc.poll() is None, f"the job ended first: {proc.communicate()[1][-3000:]}"
            time.sleep(0.5)
            for log in job.glob("logs/torchrig_*/attempt_0/0/output.log"):
                text = log.read_text()
                m = re.search(r"torchrig-worker: rank=0 .*? pid=(\d+)", text)
                if m and re.search(r"iter 20: loss", text):
                    pid = int(m[1])
        if pid is None:
            logs = "".join(p.read_text()[-2000:] for p in job.glob("logs/torchrig_*/attempt_0/0/output.log"))
            raise AssertionError(f"nanoGPT never reached iteration 20 in 120 s; rank 0's log ends:\n{logs}")
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


# two ranks split nanoGPT's gradient accumulation between them: it must divide by the world size
TRAIN_2 = [
    a if not a.startswith("--gradient_accumulation_steps=") else "--gradient_accumulation_steps=2"
    for a in TRAIN
]


def _two_gpus() -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")


def _start_2(job: Path, *options: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_PORT")}
    argv = [sys.executable, "-m", "torchrig", "--json", "launch", "--gpus", "2", "--no-preflight", *options]
    argv += ["--log-dir", "logs", *TRAIN_2]
    return subprocess.Popen(argv, cwd=job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rank1_pid_after_iter_20(job: Path, proc: subprocess.Popen) -> int:
    """Rank 1's pid (its log header) once rank 0 (nanoGPT's master process, the one that prints) logged
    iteration 20: both ranks are in the training loop then."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 180:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.5)
        r0 = [p.read_text() for p in job.glob("logs/torchrig_*/attempt_0/0/output.log")]
        r1 = [p.read_text() for p in job.glob("logs/torchrig_*/attempt_0/1/output.log")]
        m = re.search(r"torchrig-worker: rank=1 .*? pid=(\d+)", r1[0]) if r1 else None
        if m and r0 and re.search(r"iter 20: loss", r0[0]):
            return int(m[1])
    raise AssertionError("nanoGPT never reached iteration 20")


def test_two_ranks_sigkill_to_one_names_it_and_the_signal(tmp_path):
    _two_gpus()
    job = _job_dir(tmp_path)
    proc = _start_2(job)
    try:
        os.kill(_rank1_pid_after_iter_20(job, proc), signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    s = json.loads(out)["result"]["summary"]
    status = "killed by SIGKILL from outside the job: neither torchrun nor torchrig sent it"
    assert s["headline"] == f"rank 1 failed ({status})", s
    v = {x["rank"]: x for x in s["ranks"]}
    assert v[1]["role"] == "culprit" and v[1]["status"] == status
    assert v[0]["role"] != "culprit", s  # stopped by torchrun, or a victim that lost its peer


def test_two_ranks_sigstop_in_ddp_is_a_hang_with_the_stopped_rank_the_culprit(tmp_path):
    """Rank 1 stopped: rank 0's gradient all-reduce (NCCL, queued in backward()) never completes, and rank 0
    waits for it at its next host sync. After --stopped-grace the launcher stops the job on that evidence."""
    _two_gpus()
    job = _job_dir(tmp_path)
    proc, pid = _start_2(job, "--stopped-grace", "10"), None
    try:
        pid = _rank1_pid_after_iter_20(job, proc)
        os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 1, err[-3000:]
    r = json.loads(out)["result"]
    assert r["stopped_by"] == "stopped-rank", r
    s = r["summary"]
    assert s["headline"].startswith("hang: rank 1 never arrived at the collective that rank 0 wait(s) in"), s
    v = {x["rank"]: x for x in s["ranks"]}
    assert v[1]["role"] == "culprit" and v[1]["status"].startswith("stopped by a signal")
    assert v[0]["role"] == "victim" and v[0]["status"].startswith("hung: "), v[0]
    assert r["flight"]["culprits"] == [1] and r["flight"]["waiting"] == [0], r["flight"]
    assert "flight records: " in s["evidence"]
