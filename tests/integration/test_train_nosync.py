"""Gradient accumulation synchronises gradients only on the last micro-step (DDP no_sync, FSDP2
set_requires_gradient_sync): counted with a DDP communication hook on 2 gloo ranks."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import sys, torch, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torchrig.train.config import TrainConfig, sizes
from torchrig.train.loop import _sync_context
from torchrig.train.models import build_model
from torchrig.train.setup import init, wrap
cfg = TrainConfig(device="cpu")
rt = init(cfg)
model = build_model("gpt", sizes()["gpt"]["tiny"], context=16)
ddp = wrap(model, rt, cfg)
calls = []
def hook(state, bucket):
    calls.append(micro)
    return allreduce_hook(state, bucket)
ddp.register_comm_hook(None, hook)
K = 4
for micro in range(K):
    x = torch.randint(0, 512, (2, 16))
    with _sync_context(ddp, rt, micro == K - 1):
        ddp(x, x).backward()
if rt.rank == 0:
    # one write: torchrun's log tailer reads line by line, and under load it can prefix the part of a line
    # written so far ("SYNCED_MICRO_STEPS [default0]:[3]") when print writes its arguments one at a time
    sys.stdout.write(f"SYNCED_MICRO_STEPS {sorted(set(calls))}\n")
    sys.stdout.flush()
del ddp, model  # the reducer must go while its process group exists (else it can abort at exit)
import gc; gc.collect()
dist.destroy_process_group()
"""


def test_accumulation_all_reduces_only_on_the_last_micro_step(tmp_path):
    script = tmp_path / "count.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrig",
            "launch",
            "--cpu",
            "--nproc-per-node",
            "2",
            "--no-preflight",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SYNCED_MICRO_STEPS [3]" in r.stderr  # rank output is copied to stderr (stdout carries the report)
