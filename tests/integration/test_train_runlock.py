"""Two ``torchrig train --resume-if-possible`` into one --out, started together (one process each, and once
with 2 gloo ranks each): exactly one trains, the other is refused at once with exit 2 naming the holder, and
the metrics history has no step twice. (20 rounds at the level of the lock itself:
tests/unit/test_train_runlock.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

TRAIN = [
    "train", "--model", "gpt", "--size", "tiny", "--seq-len", "16", "--micro-batch", "2", "--steps", "12",
    "--log-every", "1", "--ckpt-every", "4", "--workers", "0", "--no-tensorboard", "--device", "cpu",
    "--resume-if-possible",
]  # fmt: skip


def start(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "torchrig", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("ranks", [[], [], ["--nproc-per-node", "2", "--no-preflight", "--micro-batch", "1"]])
def test_two_resume_if_possible_runs_into_one_folder_one_trains(tmp_path, ranks):
    out = tmp_path / "run"
    procs = [start(*TRAIN, *ranks, "--out", str(out)) for _ in range(2)]
    results = [(p.wait(timeout=400), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], [(r[0], r[2][-2000:]) for r in results]
    refused = next(r for r in results if r[0] == 2)
    lines = [x for x in refused[2].splitlines() if x.startswith("torchrig: error: ")]
    assert len(lines) == 1 and "is in use by another run (pid " in lines[0], refused[2][-2000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r and r.get("event") is None]
    assert steps == list(range(1, 13)), steps
    assert not [s for s, n in Counter(steps).items() if n > 1]
    assert sum(1 for r in rows if r.get("event") == "start") == 1
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000012"
