"""Carry out a train plan: ``run(TrainPlan) -> TrainResult``, and ``train(TrainRequest)``, plan and run.

The run folder's lock is taken first (unless this process is one rank of a torchrun job: rank 0 takes it),
and the plan's start is checked against the folder under it; then the run trains in this process
(``loop.train``, handed the plan's start) or its ranks start through the launch API, with rank 0 running
under this process's lock and following the same start. Nothing here imports the CLI.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchrig.errors import JobFailed
from torchrig.train.plan import TrainPlan, TrainRequest, plan_for

if TYPE_CHECKING:
    from torchrig.launch.plan import LaunchRequest
    from torchrig.launch.run import LaunchReport
    from torchrig.train.record import TrainSummary

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class TrainResult:
    """What a train run did: the ranks' summary (``OUT/summary.json``; None when the run wrote none), the
    launch's report when its ranks were launched, the run folder, and the GPUs --force took in place."""

    summary: TrainSummary | None
    launch: LaunchReport | None
    out: str | None = None  # the run folder (metrics, checkpoints, summary)
    forced_gpus: tuple[str, ...] = ()  # trained in place on a GPU leased to someone else (--force)

    def to_json(self) -> dict[str, Any]:
        summary = self.summary.to_json() if self.summary is not None else None
        out: dict[str, Any] = {"summary": summary, "out": self.out}
        if self.launch is not None:
            out["launch"] = self.launch.to_json()
        if self.forced_gpus:
            out["forced_gpus"] = list(self.forced_gpus)
        return out

    @property
    def exit_code(self) -> int:
        return self.launch.exit_code if self.launch is not None else 0

    def render_text(self) -> str:
        lines = []
        if self.launch is not None:
            lines.append(self.launch.render_text())
        if self.summary is not None:
            lines += self.summary.lines()
        if self.out is not None:
            lines.append(f"the run is in {self.out} (metrics.jsonl, checkpoints/, summary.json)")
        return "\n".join(lines)


def read_summary(path: Path) -> TrainSummary | None:
    """The ranks' summary.json; None (the launch report still printed) when it is missing or unreadable."""
    from torchrig.errors import InputError
    from torchrig.train.record import read_summary as read

    try:  # bounded, a regular file only: a FIFO or /dev/zero in its place is no summary, not a hang
        return read(path)
    except InputError:
        return None


def train(request: TrainRequest) -> TrainResult:
    """Plan ``request`` on this host and run it."""
    return run(plan_for(request))


def run(plan: TrainPlan) -> TrainResult:
    """Carry out ``plan``: in this process, or its ranks through the launch API."""
    if (
        plan.config.precision == "fp8"
    ):  # before any rank starts (the ranks check the GPU's compute capability)
        from torchrig.train.fp8 import require_torchao

        require_torchao()
    from torchrig.train import runstart
    from torchrig.train.rundir import hold

    # refused before the folder is taken: a bad TORCHRIG_FUSED_MLP or TORCHRIG_TUNED_GEMMS (no torch import: a
    # launcher may have none), and for a run in this process, what its device refuses
    if plan.holds_folder:
        from torchrig.train.config import fused_mlp_backward, tuned_gemms

        fused_mlp_backward()
        tuned_gemms()
        if plan.launch is None:
            from torchrig.train import setup

            setup.check_device(plan.config)

    # one run per folder: a second one (even two --resume-if-possible) is refused. Run as one rank of a
    # torchrun job, rank 0 takes it in the loop instead (every rank runs this).
    with hold(plan.out) if plan.holds_folder else contextlib.nullcontext():
        if plan.holds_folder:
            runstart.confirm(plan.out, plan.start)  # decided before the lock: the folder is still as seen
        if plan.launch is None:
            return _in_place(plan)
        return _launched(plan, plan.launch)


def _in_place(plan: TrainPlan) -> TrainResult:
    from torchrig.train import loop

    for line in plan.forced_gpus:
        print(f"torchrig train: warning: --force: taking {line}", file=sys.stderr, flush=True)
    return TrainResult(loop.train(plan.config, plan.start), None, str(plan.out), plan.forced_gpus)


def _launched(plan: TrainPlan, request: LaunchRequest) -> TrainResult:
    from torchrig.launch import launch

    report = launch(request, preflight=plan.preflight, preflight_timeout_s=60)
    summary = read_summary(plan.out / SUMMARY_FILE) if report.exit_code == 0 else None
    if report.exit_code != 0 and report.result is None:
        raise JobFailed(
            "pre-flight failed: " + "; ".join(f.summary for f in report.findings if f.severity.is_problem)
        )
    return TrainResult(summary, report, str(plan.out))
