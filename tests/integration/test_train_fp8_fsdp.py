"""torchao's Float8Linear under the trainer's FSDP2 wrapping (``setup.wrap``, fully_shard per block) on 2
gloo ranks: the sharded fp8 model trains like an unsharded fp8 copy on the same data. The trainer refuses
fp8 on CPUs; this runs its pieces directly (torch's CPU ``_scaled_mm``, fp32 activations), to check the
composition the GPU runs rely on: weights all-gathered in high precision, each layer casting its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torchao")

SCRIPT = r"""
import json, torch, torch.distributed as dist
from torchrig.train import fp8
from torchrig.train.config import TrainConfig, sizes
from torchrig.train.models import build_model
from torchrig.train.setup import Runtime, optimizer, wrap

dist.init_process_group("gloo")
rank = dist.get_rank()
cfg = TrainConfig(device="cpu", parallel="fsdp", clip_grad=0, lr=1e-2)
rt = Runtime(rank, rank, 2, torch.device("cpu"), "fp8", "fsdp", 0)
out = {}
for recipe in ("tensorwise", "rowwise"):
    models = {}
    for kind in ("fsdp", "plain"):
        torch.manual_seed(0)
        m = build_model("gpt", sizes()["gpt"]["tiny"], context=32)
        layers = fp8.convert(m, recipe, compiled=False)
        run = wrap(m, rt, cfg) if kind == "fsdp" else m
        models[kind] = (m, run, optimizer(m, cfg, Runtime(0, 0, 1, torch.device("cpu"), "fp8", "none", 0)))
    torch.manual_seed(1)
    data = [torch.randint(0, 512, (4, 32))] * 4  # one batch, memorised; the same on every rank
    losses = {"fsdp": [], "plain": []}
    for x in data:
        for kind, (m, run, opt) in models.items():
            loss = run(x, x.roll(1, dims=1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[kind].append(loss.item())
    sharded = models["fsdp"][0].blocks[0].qkv
    out[recipe] = {"layers": len(layers), "sharded": [type(sharded).__name__, type(sharded.weight).__name__]}
    out[recipe] |= losses
    del models
if rank == 0:
    print("FP8_FSDP " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def test_fp8_linears_under_fsdp2_train_like_an_unsharded_copy(tmp_path):
    script = tmp_path / "fp8_fsdp.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    launch = [sys.executable, "-m", "torchrig", "launch", "--cpu", "--nproc-per-node", "2", "--no-preflight"]
    r = subprocess.run(
        [*launch, "--log-dir", str(tmp_path / "logs"), str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stderr.splitlines() if "FP8_FSDP " in x)
    # the object alone: torchrun's log tailer can run the next line's "[default0]:" prefix onto this one
    result, _ = json.JSONDecoder().raw_decode(line.split("FP8_FSDP ", 1)[1])
    for recipe, res in result.items():
        assert res["layers"] == 8, (recipe, res)  # 2 blocks x (qkv, proj, fc, out)
        assert res["sharded"] == ["Float8Linear", "DTensor"], res
        fsdp, plain = res["fsdp"], res["plain"]
        assert fsdp[-1] < fsdp[0], (recipe, res)
        # the scales come from the full (all-gathered) weight either way: only the gradient reduction's
        # summation order differs, so the losses agree closely
        for a, b in zip(fsdp, plain, strict=True):
            assert abs(a - b) <= 1e-3 * abs(b), (recipe, res)
