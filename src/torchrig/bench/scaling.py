"""Training scaling: ``torchrig train``'s own throughput on 1, 2, 4 ... N GPUs and the scaling efficiency.

The figure comes from the trainer itself, not from a second model written for the bench: for each group size
``k`` bench runs ``python -m torchrig train --gpus k ...`` (GPT-2 small, synthetic data, bf16, compiled, the
trainer's defaults otherwise; ``--quick`` leaves out the compile) and reads the steady tokens/s from the run's
``summary.json``. A bench figure and a ``torchrig train`` run with the same options are therefore one
measurement of one code path. On the CPU path the same commands run a tiny GPT on gloo ranks.
Efficiency is ``tokens/s at k / (k x tokens/s at 1)``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import shlex
import subprocess
import sys
from collections.abc import Callable

from torchrig.bench.records import ScalingResult
from torchrig.errors import JobFailed


@dataclasses.dataclass(frozen=True)
class TrainerShape:
    """What each scaling run trains: the options given to ``torchrig train``."""

    size: str
    micro_batch: int
    seq_len: int
    compile: bool
    cpu: bool

    def options(self, steps: int, warmup: int) -> list[str]:
        opts = ["--model", "gpt", "--size", self.size, "--data", "synthetic"]
        opts += ["--micro-batch", str(self.micro_batch), "--steps", str(steps)]
        opts += ["--timing-warmup-steps", str(warmup), "--log-every", str(max(1, (steps - warmup) // 8))]
        # The CPU path loads its tiny batches in the rank itself (no DataLoader processes to start).
        cpu = ["--device", "cpu", "--precision", "fp32", "--workers", "0"]
        opts += cpu if self.cpu else ["--precision", "bf16"]
        opts += ["--compile"] if self.compile else ["--no-compile"]
        return opts

    def describe(self, steps: int, warmup: int) -> str:
        return "torchrig train " + shlex.join(self.options(steps, warmup))


# GPT-2 small's context is 1024 (train/sizes.toml); the tiny test size's is 64.
GPU_SHAPE = TrainerShape(size="small", micro_batch=16, seq_len=1024, compile=True, cpu=False)
GPU_QUICK_SHAPE = dataclasses.replace(GPU_SHAPE, compile=False)
CPU_SHAPE = TrainerShape(size="tiny", micro_batch=4, seq_len=64, compile=False, cpu=True)


def shape_for(device_kind: str, quick: bool) -> TrainerShape:
    if device_kind != "cuda":
        return CPU_SHAPE
    return GPU_QUICK_SHAPE if quick else GPU_SHAPE


def group_sizes(world: int) -> list[int]:
    """1, 2, 4, ... up to ``world``, always ending with ``world``."""
    sizes, k = [], 1
    while k < world:
        sizes.append(k)
        k *= 2
    sizes.append(world)
    return sizes


def trainer_argv(
    shape: TrainerShape,
    k: int,
    steps: int,
    warmup: int,
    out_dir: str,
    python: str = sys.executable,
    *,
    force: bool = False,
) -> list[str]:
    """The ``torchrig train`` command for ``k`` ranks (the first k of the bench's GPUs, or k gloo ranks on the
    CPU path)."""
    ranks = ["--nproc-per-node", str(k)] if shape.cpu else ["--gpus", str(k)]
    # The launcher's pre-flight checks were already made by the bench workers on these same GPUs.
    extra = ["--no-preflight"] if k > 1 else []
    extra += ["--force"] if force and not shape.cpu else []  # the bench took them with --force already
    return [
        python,
        "-m",
        "torchrig",
        "train",
        *shape.options(steps, warmup),
        *ranks,
        *extra,
        "--out",
        out_dir,
    ]


def _read_summary(out_dir: pathlib.Path, shape: TrainerShape, k: int) -> ScalingResult:
    path = out_dir / "summary.json"
    from torchrig.errors import InputError
    from torchrig.train.record import read_summary

    try:  # bounded, a regular file only (the run's own output, but in a folder anyone may write)
        summary = read_summary(path, "scaling run summary")
        tokens_per_s = summary.rate_per_s if summary.unit == "tokens" else None
        if not tokens_per_s:
            raise InputError("no tokens/s measured")
    except InputError as err:
        raise JobFailed(
            f"the {k}-GPU scaling run wrote no throughput to {path} ({err.message})",
            hint="rerun with --debug to see the trainer's output",
        ) from None
    tokens_per_step = shape.micro_batch * shape.seq_len * k
    return ScalingResult(
        gpus=k, tokens_per_s=tokens_per_s, step_ms=tokens_per_step / tokens_per_s * 1e3, efficiency=None
    )


def _run_one(
    argv: list[str], cpu: bool, on_line: Callable[[str], None] | None, extra_env: dict[str, str] | None = None
) -> None:
    from torchrig.launch import guard

    env = dict(os.environ)
    env.update({k: v for k, v in (extra_env or {}).items() if k == "CUDA_VISIBLE_DEVICES"})
    if cpu:
        # One thread per rank, as torchrun gives each of its ranks: the one-rank run (no torchrun) would
        # otherwise spin every core's thread against the others' and measure the contention.
        env.setdefault("OMP_NUM_THREADS", "1")
    src = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    tail: collections.deque[str] = collections.deque(maxlen=30)
    proc = guard.start(argv, env=env, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if on_line:
                on_line(line.rstrip("\n"))
    except BaseException:  # Ctrl-C: the trainer must not run on
        guard.stop(proc)
        raise
    code = proc.wait()
    if code != 0:
        last = next((t for t in reversed(tail) if t.strip()), "no output")
        raise JobFailed(
            f"the scaling run 'torchrig train' failed (exit {code}): {last[:300]}",
            hint="rerun with --debug to see the trainer's output, or leave scaling out with --only",
        )


def measure_scaling(
    device_kind: str,
    quick: bool,
    world: int,
    steps: int,
    warmup: int,
    workdir: str,
    progress: Callable[[str], None],
    on_line: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
    force: bool = False,
) -> tuple[list[ScalingResult], str]:
    """Run the trainer for each group size; the rows and the command they ran (without its ranks)."""
    shape = shape_for(device_kind, quick)
    rows: list[ScalingResult] = []
    base: float | None = None
    for k in group_sizes(world):
        progress(
            f"scaling: torchrig train on {k} {'GPU' if device_kind == 'cuda' else 'rank'}{'s' * (k > 1)}"
        )
        out = pathlib.Path(workdir) / f"scaling-{k}"
        _run_one(trainer_argv(shape, k, steps, warmup, str(out), force=force), shape.cpu, on_line, env)
        row = _read_summary(out, shape, k)
        base = row.tokens_per_s if k == 1 else base
        eff = row.tokens_per_s / (k * base) if base else None
        rows.append(dataclasses.replace(row, efficiency=eff))
    return rows, shape.describe(steps, warmup)
