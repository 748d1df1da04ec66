"""Starting the workers: a plan (the torchrun command line and environment), then its execution.

The plan is plain data (``--dry-run`` prints it); :func:`execute` runs it as a subprocess —
``python -m torch.distributed.run --standalone --nproc-per-node N -m torchrig.bench.worker`` — reads the
workers' progress lines from their stderr, and loads rank 0's JSON. The parent's environment is never
changed: the child gets a copy with ``PYTHONPATH`` extended so it imports this same torchrig.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import torchrig
from torchrig.bench.config import BenchConfig
from torchrig.bench.records import Measurements, measurements_from_json
from torchrig.bench.worker import PROGRESS_TAG
from torchrig.errors import JobFailed
from torchrig.launch import guard


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    env_additions: dict[str, str]
    nproc: int
    config_path: str
    out_path: str

    def shell(self) -> str:
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env_additions.items())
        return (env + " " if env else "") + " ".join(shlex.quote(a) for a in self.argv)


def plan_launch(
    cfg: BenchConfig,
    nproc: int,
    workdir: str,
    python: str = sys.executable,
    *,
    visible_devices: str | None = None,
) -> LaunchPlan:
    """The workers' command; ``visible_devices``: the GPUs placement chose (``CUDA_VISIBLE_DEVICES``)."""
    config_path = str(pathlib.Path(workdir) / "bench-config.json")
    out_path = str(pathlib.Path(workdir) / "measurements.json")
    src = str(pathlib.Path(torchrig.__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    argv = (
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "torchrig.bench.worker",
        "--config",
        config_path,
        "--out",
        out_path,
    )
    env = {"PYTHONPATH": pythonpath}
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    return LaunchPlan(
        argv=argv,
        env_additions=env,
        nproc=nproc,
        config_path=config_path,
        out_path=out_path,
    )


def _failure_line(tail: collections.deque[str]) -> str:
    for line in reversed(tail):
        text = line.strip()
        if text and ("Error" in text or "error:" in text) and not text.startswith(("File ", "raise ")):
            return text[:300]
    return tail[-1].strip()[:300] if tail else "no output"


def execute(
    plan: LaunchPlan,
    cfg: BenchConfig,
    on_progress: Callable[[int, int, str], None],
    on_line: Callable[[str], None] | None = None,
) -> Measurements:
    """Run the plan; ``on_progress(done, total, label)`` for each step, ``on_line`` for other output."""
    pathlib.Path(plan.config_path).write_text(cfg.to_json())
    env = dict(os.environ)
    env.update(plan.env_additions)
    tail: collections.deque[str] = collections.deque(maxlen=60)
    # Under torchrig's launch guard, in a session of its own: a bench killed in any way takes torchrun and its
    # workers with it, and Ctrl-C stops them through the guard (one SIGTERM for torchrun, bounded).
    proc = guard.start(plan.argv, env=env, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith(PROGRESS_TAG):
                event = json.loads(line[len(PROGRESS_TAG) :])
                on_progress(int(event["done"]), int(event["total"]), str(event["label"]))
                continue
            tail.append(line)
            if on_line:
                on_line(line.rstrip("\n"))
    except BaseException:  # Ctrl-C, or a progress callback that failed: the workers must not run on
        guard.stop(proc)
        raise
    code = proc.wait()
    if code != 0 or not pathlib.Path(plan.out_path).exists():
        raise JobFailed(
            f"bench workers failed (exit {code}): {_failure_line(tail)}",
            hint="rerun with --debug to see the workers' output",
        )
    from torchrig.inputfiles import read_json

    return measurements_from_json(read_json(plan.out_path, "bench workers' result"))  # bounded, regular
