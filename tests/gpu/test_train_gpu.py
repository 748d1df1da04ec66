"""The trainer on a real GPU: bf16 + compile, fp16 with GradScaler, FSDP2 on one rank, and NCCL DDP when two
GPUs are present (through torchrig launch). Skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "train",
    "--model",
    "gpt",
    "--size",
    "tiny",
    "--steps",
    "30",
    "--log-every",
    "10",
    "--lr",
    "1e-2",
    "--workers",
    "2",
    "--no-tensorboard",
    "--gpus",
    "1",
]


def torchrig(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    return subprocess.run(
        [sys.executable, "-m", "torchrig", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def summary(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)["summary"]


@pytest.mark.parametrize(
    "extra",
    [
        ["--precision", "bf16", "--compile"],
        ["--precision", "bf16", "--compile", "--compile-mode", "reduce-overhead", "--grad-accum", "2"],
        ["--precision", "fp16"],
        ["--model", "resnet", "--size", "tiny", "--precision", "bf16"],
    ],
)
def test_one_gpu_precisions(tmp_path, extra):
    s = summary(torchrig(*TINY, "--out", str(tmp_path), *extra))
    assert s["device"].startswith("NVIDIA") and s["final_loss"] < 6.0
    assert s["precision"] == extra[extra.index("--precision") + 1]


def test_cuda_graphs_with_accumulation_train_like_the_default_mode(tmp_path):
    """reduce-overhead replays CUDA graphs whose outputs the next replay overwrites: accumulated gradients
    must not live there (they did once, and the second micro-step's replay overwrote the first's)."""
    base = [*TINY, "--precision", "bf16", "--compile", "--grad-accum", "2", "--warmup-steps", "0"]
    losses = {}
    for mode in ("default", "reduce-overhead"):
        out = tmp_path / mode
        summary(torchrig(*base, "--compile-mode", mode, "--out", str(out)))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        losses[mode] = [r["loss"] for r in rows if "loss" in r and r.get("step")]
    assert len(losses["default"]) == 3
    for a, b in zip(losses["default"], losses["reduce-overhead"], strict=True):
        assert abs(a - b) < 1e-3 * abs(a), losses  # on an H200: 6.178195 vs 6.178180 at step 10


def test_two_gpus_ddp_and_fsdp(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    for par in ("ddp", "fsdp"):
        args = [*TINY[:-1], "2"]  # --gpus 2: one rank per GPU through torchrig launch
        s = summary(torchrig(*args, "--parallel", par, "--out", str(tmp_path / par)))
        assert s["world_size"] == 2 and s["parallel"] == par
    r = torchrig("export", str(tmp_path / "fsdp"), "--out", str(tmp_path / "exp"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert Path(tmp_path / "exp" / "model.onnx").is_file()


def test_two_gpus_embeddings_outside_ddp_with_cuda_graphs_and_accumulation(tmp_path):
    """The embeddings' gradient all-reduced by the trainer (NCCL, ReduceOp.AVG) while the optimizer steps the
    rest, under DDP with CUDA graphs and accumulation: the same losses as DDP all-reducing everything."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    base = [*TINY[:-1], "2", "--precision", "bf16", "--compile", "--compile-mode", "reduce-overhead"]
    base += ["--grad-accum", "2", "--clip-grad", "0", "--warmup-steps", "0", "--no-ckpt-final"]
    losses, outside = {}, {}
    for flag in ("--ddp-overlap-embeddings", "--no-ddp-overlap-embeddings"):
        out = tmp_path / flag
        s = summary(torchrig(*base, flag, "--out", str(out)))
        outside[flag] = s["ddp"]["outside_ddp"]
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        losses[flag] = [r["loss"] for r in rows if "loss" in r and r.get("step")]
    assert outside == {
        "--ddp-overlap-embeddings": ["wte.weight", "wpe.weight"],
        "--no-ddp-overlap-embeddings": [],
    }
    on, off = losses.values()
    assert len(on) == 3 and on[-1] < on[0]
    for a, b in zip(on, off, strict=True):
        assert abs(a - b) < 1e-3 * abs(a), losses


def test_embeddings_outside_ddp_on_one_nccl_rank_step_like_ddp_alone(tmp_path):
    """The pieces on a GPU, in one process (one NCCL rank): DDP leaving the embeddings out under
    compile(DDP(model)) with CUDA graphs, NCCL's ReduceOp.AVG on them, and the fused AdamW step in two parts,
    against DDP all-reducing everything with one step."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torchrig.train.config import TrainConfig, sizes
    from torchrig.train.lategrads import LateGrads, late_params
    from torchrig.train.models import build_model
    from torchrig.train.setup import Runtime, optimizer, wrap

    dist.init_process_group(
        "nccl",
        store=dist.FileStore(str(tmp_path / "store"), 1),
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", 0),
    )
    try:
        rt = Runtime(0, 0, 1, torch.device("cuda", 0), "bf16", "ddp", 0)
        cfg = TrainConfig(device="cuda", compile=True, compile_mode="reduce-overhead", clip_grad=0)
        torch.manual_seed(0)
        plain = build_model("gpt", sizes()["gpt"]["tiny"], context=64, vocab=None, num_classes=0).cuda()
        split = build_model("gpt", sizes()["gpt"]["tiny"], context=64, vocab=None, num_classes=0).cuda()
        split.load_state_dict(plain.state_dict())
        late = LateGrads.for_backend(late_params(split))
        assert late.average_op  # NCCL: ReduceOp.AVG
        runs = {"plain": (plain, wrap(plain, rt, cfg)), "split": (split, wrap(split, rt, cfg, late.params))}
        opts = {k: optimizer(m, cfg, rt) for k, (m, _) in runs.items()}
        losses: dict[str, list[float]] = {"plain": [], "split": []}
        torch.manual_seed(1)
        batches = [torch.randint(0, 512, (8, 64), device="cuda") for _ in range(6)]
        for idx in batches:
            for k, (_, run) in runs.items():
                torch.compiler.cudagraph_mark_step_begin()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = run(idx, idx.roll(1, dims=1))
                loss.backward()
                losses[k].append(loss.item())
                if k == "split":
                    late.start()
                    late.step(opts[k])
                else:
                    opts[k].step()
                opts[k].zero_grad()
        assert losses["split"][-1] < losses["split"][0]
        for a, b in zip(losses["plain"], losses["split"], strict=True):
            assert abs(a - b) < 1e-3 * abs(a), losses
        for (name, p), q in zip(plain.named_parameters(), split.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-4), name
    finally:
        dist.destroy_process_group()


def test_compile_mode_auto_is_cuda_graphs_on_one_gpu(tmp_path):
    """The default --compile-mode auto resolves to reduce-overhead on a GPU (no FSDP); --attention cudnn trains."""
    s = summary(
        torchrig(*TINY, "--precision", "bf16", "--compile", "--attention", "cudnn", "--out", str(tmp_path))
    )
    assert (s["compile_mode"], s["attention"]) == ("reduce-overhead", "cudnn") and s["final_loss"] < 6.0
