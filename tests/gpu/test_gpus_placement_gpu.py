"""The placement rule on real GPUs and real NVML: with a ledger in which another user holds GPU 0, ``launch``
refuses GPU 0 and ``--gpus all`` leaves it out, and ``train --gpus 1`` trains on the free GPU 1 (its rank
started through the launcher with CUDA_VISIBLE_DEVICES=1) to the end. Skipped without two CUDA GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _torchrig(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrig", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture
def held_gpu0(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    from torchrig.runtime.ledger import Ledger
    from torchrig.runtime.nvml import probe

    inv = probe()
    gpu0 = next(u for u in inv.units() if u.gpu_index == 0 and not u.is_mig)
    led = Ledger.open(tmp_path / "state")
    with led.transaction() as db:  # held by a live process (this one): not a stale pending lease
        led.insert_in(db, [(gpu0.uuid, 0, "0")], "someone-else", "their-env", False)
    led.close()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "CUDA_VISIBLE_DEVICES")}
    env.update(TORCHRIG_STATE_DIR=str(tmp_path / "state"), TORCHRIG_CACHE_DIR=str(tmp_path / "cache"))
    return env


def test_launch_and_train_keep_off_the_gpu_someone_else_leased(held_gpu0, tmp_path):
    job = tmp_path / "job.py"
    job.write_text("print('ok')\n")
    r = _torchrig("launch", "--dry-run", "--gpus", "device=0", str(job), env=held_gpu0)
    assert r.returncode == 2 and "GPU 0 held by someone-else/their-env since" in r.stderr, r.stderr
    r = _torchrig("--json", "launch", "--dry-run", "--gpus", "all", str(job), env=held_gpu0)
    assert r.returncode == 0, r.stderr
    assert "0" not in json.loads(r.stdout)["plan"]["env"]["CUDA_VISIBLE_DEVICES"].split(",")
    out = tmp_path / "run"
    r = _torchrig(
        "--json", "train", "--gpus", "1", "--model", "gpt", "--size", "tiny", "--steps", "5",
        "--no-tensorboard", "--out", str(out), env=held_gpu0,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["launch"]["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert rep["summary"]["steps"] == 5
    assert Path(out / "summary.json").is_file()
