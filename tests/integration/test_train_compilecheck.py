"""A real trainer run checks its compiled model against eager before the first step, and on one process
falls back to eager when compile is wrong (train/compilecheck.py; the check itself: tests/unit/
test_train_compilecheck.py). The miscompile is Inductor's own fault injection
(``cpp.inject_relu_bug_TESTING_ONLY = "accuracy"``: the compiled ReLU is one too high)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch._inductor.config as inductor_config


@pytest.mark.parametrize("broken", [False, True])
def test_a_one_process_run_falls_back_to_eager_when_compile_is_wrong(tmp_path, monkeypatch, capfd, broken):
    """A real trainer run (ResNet tiny, CPU, compiled). With the ReLU miscompile its first loss is 0.022
    off eager's on this seed, under the default tolerance; the run's tolerance is lowered to catch it
    (``--test-compile-tolerance``)."""
    from torchrig.train.config import TrainConfig
    from torchrig.train.loop import train

    torch._dynamo.reset()
    if broken:
        monkeypatch.setattr(inductor_config.cpp, "inject_relu_bug_TESTING_ONLY", "accuracy")
    cfg = TrainConfig(
        model="resnet",
        size="tiny",
        device="cpu",
        compile=True,
        steps=2,
        log_every=1,
        micro_batch=4,
        workers=0,
        tensorboard=False,
        ckpt_final=False,
        out=str(tmp_path / "run"),
        test_compile_tolerance=0.005 if broken else 0.0,
    )
    result = train(cfg)
    torch._dynamo.reset()
    events = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    check = [e for e in events if e.get("event") == "compile_check"]
    assert len(check) == 1 and check[0]["step"] == 0
    assert check[0]["action"] == ("eager" if broken else "kept"), check
    assert result.compile is (not broken)
    err = capfd.readouterr().err
    assert ("training continues without compile" in err) is broken, err
    losses = [e["loss"] for e in events if "loss" in e and "event" not in e]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    if broken:  # the steps ran eager: the first step's loss is eager's, not the miscompiled one
        assert abs(losses[0] - check[0]["eager_loss"]) < 1e-4, (losses, check)


def test_two_ranks_stop_together_before_any_step_when_compile_is_wrong(tmp_path):
    """Two CPU ranks through torchrun + gloo, with the miscompile in both: their compiled DDP modules cannot
    be swapped for eager mid-run, so every rank stops before the first step, exit 1, with the fix to choose."""
    out = tmp_path / "ddp"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env.update(OMP_NUM_THREADS="1", TORCHRIG_INDUCTOR_CONFIG="cpp.inject_relu_bug_TESTING_ONLY=accuracy")
    args = ["train", "--model", "resnet", "--size", "tiny", "--device", "cpu", "--compile", "--steps", "2"]
    args += ["--micro-batch", "4", "--workers", "0", "--no-tensorboard", "--no-ckpt-final", "--no-preflight"]
    args += ["--nproc-per-node", "2", "--test-compile-tolerance", "0.005", "--out", str(out)]
    r = subprocess.run(
        [sys.executable, "-m", "torchrig", *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert "torch.compile computed a wrong result for this model" in r.stderr, r.stderr[-3000:]
    assert "--no-compile" in r.stderr
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["action"] for e in events if e.get("event") == "compile_check"] == ["stop"]
    assert not [e for e in events if "loss" in e and "event" not in e]  # no step ran
