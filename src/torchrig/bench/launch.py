"""Starting the workers through the launch API, the one torchrun launcher of ``torchrig launch`` and ``train``.

The workers are a launch request (:func:`worker_job`): ``torchrig.bench.worker`` as the module each rank
runs, on the GPUs placement chose (or gloo ranks on the CPU). :func:`run_workers` hands it to
:func:`torchrig.launch.launch`, so the bench gets launch's plan (``--dry-run`` prints it), its pre-flight
checks, its supervision and its failure summary: a rank that dies is reported with which rank it was, why it
ended and its last lines, not as torchrun's exit status. The process-group check runs *before* the workers,
not beside them as for a training job: it would share the GPUs and CPUs the bench is measuring.

Rank 0's progress lines (``PROGRESS_TAG``, on its stderr) drive the live display; the rest of the output goes
to ``on_line`` (``--debug``) or nowhere, as the failure summary reads the rank logs. The logs live in a folder
of their own, removed after a run that succeeded and kept (the summary names it) after one that failed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchrig.bench.config import BenchConfig
from torchrig.bench.records import Measurements, measurements_from_json
from torchrig.bench.worker import PROGRESS_TAG
from torchrig.errors import JobFailed
from torchrig.launch.plan import TEE_PREFIX, LaunchRequest

if TYPE_CHECKING:
    from torchrig.launch.run import LaunchReport

WORKER_MODULE = "torchrig.bench.worker"
RDZV_ID = "torchrig-bench"


@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """The workers as a launch request, and the files they read and write."""

    request: LaunchRequest
    config_path: str
    out_path: str


def worker_job(
    cfg: BenchConfig,
    nproc: int,
    workdir: str,
    *,
    gpus: str | None = None,
    force: bool = False,
) -> WorkerJob:
    """The workers' launch request: ``nproc`` gloo ranks on the CPU path, else one rank on each of ``gpus``
    (the physical ids placement chose; ``--force`` as the user gave it). The logs go to ``workdir/logs``
    here; :func:`run_workers` gives them a folder that outlives the workdir."""
    config_path = str(Path(workdir) / "bench-config.json")
    out_path = str(Path(workdir) / "measurements.json")
    cpu = cfg.device_kind != "cuda"
    request = LaunchRequest(
        script=WORKER_MODULE,
        module=True,
        script_args=("--config", config_path, "--out", out_path),
        cpu=cpu,
        nproc_per_node=nproc if cpu else None,
        gpus=None if cpu else gpus,
        force=force,
        rdzv_id=RDZV_ID,
        log_dir=str(Path(workdir) / "logs"),
    )
    return WorkerJob(request, config_path, out_path)


class _Console:
    """Where launch's supervisor copies torchrun's and the ranks' output: progress lines drive the display,
    the others go to ``on_line`` (or nowhere). Written to from two threads (torchrun's stdout and stderr)."""

    def __init__(
        self, on_progress: Callable[[int, int, str], None], on_line: Callable[[str], None] | None
    ) -> None:
        self._on_progress, self._on_line, self._lock = on_progress, on_line, threading.Lock()

    def write(self, text: str) -> int:
        for line in text.splitlines():
            body = TEE_PREFIX.sub("", line, count=1)  # torchrun's prefix on the rank's line
            with self._lock:
                if body.startswith(PROGRESS_TAG) and self._progress(body[len(PROGRESS_TAG) :]):
                    continue
                if self._on_line and line.strip():
                    self._on_line(line)
        return len(text)

    def _progress(self, payload: str) -> bool:
        try:
            event = json.loads(payload)
            done, total, label = int(event["done"]), int(event["total"]), str(event["label"])
        except (ValueError, KeyError, TypeError):  # a line cut short: shown as it is
            return False
        self._on_progress(done, total, label)
        return True

    def flush(self) -> None:
        pass


def run_workers(
    job: WorkerJob,
    cfg: BenchConfig,
    on_progress: Callable[[int, int, str], None],
    on_line: Callable[[str], None] | None = None,
) -> Measurements:
    """Run the workers through the launch API; ``on_progress(done, total, label)`` for each step, ``on_line``
    for the other output. A failed pre-flight or rank raises ``JobFailed`` after the summary is printed."""
    from torchrig.launch import launch

    Path(job.config_path).write_text(cfg.to_json())
    # the logs outlive the bench's scratch folder: kept after a failure, for the summary names them
    logs = tempfile.mkdtemp(prefix="torchrig-bench-logs-")
    job = dataclasses.replace(job, request=dataclasses.replace(job.request, log_dir=logs))
    say = (lambda line: on_line(f"torchrig launch: {line}")) if on_line else None
    try:
        report = launch(job.request, progress=say, checks_beside=False, echo=_Console(on_progress, on_line))
    except BaseException:  # refused before any rank ran, or interrupted: nothing worth keeping
        shutil.rmtree(logs, ignore_errors=True)
        raise
    _raise_unless_done(report, job)
    shutil.rmtree(logs, ignore_errors=True)
    from torchrig.inputfiles import read_json

    return measurements_from_json(read_json(job.out_path, "bench workers' result"))  # bounded, regular


def _raise_unless_done(report: LaunchReport, job: WorkerJob) -> None:
    """Nothing when the workers ran to the end and rank 0 wrote its result; else the launcher's own words."""
    blocking = [f for f in report.findings if f.severity.blocks]
    if report.result is None and blocking:
        f = blocking[0]
        print(report.render_text(), file=sys.stderr, flush=True)  # the finding with its evidence
        raise JobFailed(
            f"bench workers not started: the pre-flight {f.id} check failed: {f.summary}",
            hint="; ".join((*f.fix, f"logs: {job.request.log_dir}")),
        )
    r: Any = report.result
    if r is not None and r.cancelled_by:  # the job is stopped: its logs tell nothing of a fault
        shutil.rmtree(job.request.log_dir, ignore_errors=True)
    if r is not None and r.cancelled_by == "SIGINT":
        raise KeyboardInterrupt  # the CLI says "interrupted" and exits 130, as before
    if r is not None and r.cancelled_by:
        raise JobFailed(f"bench cancelled: {r.stop_reason}", hint="torchrun and the workers were stopped")
    if r is not None and r.exit_code == 0 and Path(job.out_path).is_file():
        return
    print(report.render_text(), file=sys.stderr, flush=True)  # which rank, why, its last lines
    if r is not None and r.summary is not None:
        what = f"{r.summary.headline}; likely cause: {r.summary.likely_cause}"
    elif r is not None and r.exit_code != 0:
        what = f"torchrun exit {r.exit_code}"
    else:
        what = "rank 0 wrote no result"
    raise JobFailed(
        f"bench workers failed: {what}",
        hint=f"the summary above gives each rank's last lines; logs: {job.request.log_dir}",
    )
