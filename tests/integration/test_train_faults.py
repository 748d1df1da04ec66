"""Fault tolerance through the real elastic launcher: a rank SIGKILLed mid-run is restarted by torchrun and
training resumes from the last checkpoint with no lost or repeated steps; a crash inside a save never
damages the last good checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TRAIN = [
    "--model",
    "gpt",
    "--size",
    "tiny",
    "--steps",
    "12",
    "--log-every",
    "1",
    "--lr",
    "1e-2",
    "--warmup-steps",
    "2",
    "--workers",
    "0",
    "--no-tensorboard",
    "--device",
    "cpu",
    "--ckpt-every",
    "4",
    "--micro-batch",
    "4",
    "--resume-if-possible",
]
BASE = ["train", *TRAIN, "--nproc-per-node", "2", "--no-preflight"]


def torchrig(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "torchrig", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )


def records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def steps(out: Path) -> list[int]:
    return [r["step"] for r in records(out) if "loss" in r and r.get("event") is None]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    r = torchrig(*BASE, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_killed_rank_is_restarted_and_resumes_from_the_checkpoint(clean, tmp_path):
    """`torchrig launch --max-restarts 1 -m torchrig.train ...`: rank 1 SIGKILLs itself at step 7."""
    out = tmp_path / "killed"
    r = torchrig(
        "launch",
        "--cpu",
        "--nproc-per-node",
        "2",
        "--no-preflight",
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        "-m",
        "torchrig.train",
        *TRAIN,
        "--out",
        str(out),
        "--test-kill-at-step",
        "7",
        "--test-kill-rank",
        "1",
    )
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout)["result"]
    assert res["attempts"] == 2
    earlier = res["earlier_failures"][0]
    assert earlier["headline"].startswith("rank 1 failed") and "SIGKILL" in earlier["likely_cause"]
    assert "test hook: rank 1 kills itself" in r.stderr
    # The committed history: every step exactly once, then a resume from step 4 on the second attempt.
    assert steps(out) == list(range(1, 13))
    resume = [x for x in records(out) if x.get("event") == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == 4 and resume[0]["restart"] == 1
    after = [x for x in records(out) if "loss" in x and x.get("event") is None and x["step"] > 4]
    assert all(x["restart"] == 1 for x in after)
    # No lost or repeated steps: the interrupted run ends exactly where an uninterrupted one does.
    clean_loss = {x["step"]: x["loss"] for x in records(clean) if "loss" in x and x.get("event") is None}
    for x in after:
        assert x["loss"] == pytest.approx(clean_loss[x["step"]], rel=2e-4)


def test_crash_during_a_save_keeps_the_last_good_checkpoint(clean, tmp_path):
    out = tmp_path / "save-crash"
    r = torchrig(*BASE, "--out", str(out), "--max-restarts", "1", "--test-kill-in-save", "8")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "killed during the save of step 8" in r.stderr
    resume = [x for x in records(out) if x.get("event") == "resume"]
    assert resume[0]["step"] == 4  # step 8's save never committed; step 4 was intact
    assert steps(out) == list(range(1, 13))
    ck = out / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step-000012"
    assert not list(ck.glob("*.tmp"))
    final = {x["step"]: x["loss"] for x in records(out) if "loss" in x and x.get("event") is None}
    clean_loss = {x["step"]: x["loss"] for x in records(clean) if "loss" in x and x.get("event") is None}
    assert final[12] == pytest.approx(clean_loss[12], rel=2e-4)
