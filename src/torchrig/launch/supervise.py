"""Run a plan through torch.distributed.run and watch it: the adapter between a ``LaunchPlan`` and the host.

torchrun does the process management (spawn, rendezvous, restarts); this module only starts it with the
plan's argv and environment (the parent's own ``os.environ`` is never changed), copies its output to
stderr, watches the rank logs for a hang, and when the job fails or hangs, reads the logs into a summary.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from torchrig.launch import flightrec, guard, logs
from torchrig.launch.plan import FLIGHT_RECORD_REQUEST, LaunchPlan
from torchrig.launch.summary import (
    RDZV_TIMEOUT,
    FailureSummary,
    rendezvous_timeout,
    summarize_failure,
    summarize_hang,
)
from torchrig.launch.worker import SYMBOLIZING


@dataclass(frozen=True)
class LaunchResult:
    exit_code: int  # torchrun's exit status (or 1 after a hang)
    attempts: int  # worker-group attempts torchrun made (1 + restarts)
    hung: bool
    elapsed_s: float
    run_dir: str | None  # torchrun's per-run log directory
    summary: FailureSummary | None  # why the job failed (final attempt), or None
    earlier_failures: tuple[FailureSummary, ...]  # attempts that failed and were restarted
    flight_records: tuple[str, ...] = ()  # flight-recorder dumps this job wrote (also read by torchfrtrace)
    flight: flightrec.FlightVerdict | None = None  # what those records say, after a hang or a failure
    # why torchrig stopped the job, when it did: "hang-timeout", "nccl-timeout" or "wall-timeout"
    stopped_by: str | None = None
    stop_reason: str | None = None  # that, in words


def _pump(stream, sink, keep: collections.deque) -> None:
    for line in iter(stream.readline, ""):
        keep.append(line)
        sink.write(line)
        sink.flush()
    stream.close()


def _signal_workers(attempt_dir: Path, sig: int) -> None:
    for rank in logs.read_attempt(attempt_dir, {}):
        if rank.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(rank.pid, sig)


def _stop(proc: subprocess.Popen) -> None:
    """Stop the job through its guard: torchrun gets one SIGTERM and forwards it to the ranks (which dump their
    stacks); whatever is left after ``guard.STOP_GRACE_S`` is SIGKILLed."""
    guard.stop(proc)


def _rank_name(attempt_dir: Path, local_rank: int) -> str:
    """ "rank G" from the rank's log header, else "local rank L"."""
    for r in logs.read_attempt(attempt_dir, {}):
        if r.local_rank == local_rank and r.global_rank is not None:
            return f"rank {r.global_rank}"
    return f"local rank {local_rank}"


def _watch(
    proc: subprocess.Popen, plan: LaunchPlan, log_dir: Path, start: float, wall_timeout_s: float | None
) -> tuple[str, str] | None:
    """Wait for torchrun. When the job hangs, every rank is asked for its stack (SIGUSR1), the job is stopped
    and (what stopped it, why) is returned; None when torchrun ended by itself. A hang is one of:

    - no rank output for ``hang_timeout_s`` ("hang-timeout");
    - a rank's NCCL watchdog logged a collective timeout and the job is still running
      ``nccl_timeout_grace_s`` later ("nccl-timeout"): PyTorch may dump its flight record and keep the
      process alive, and the grace lets a process that does end by itself end (and torchrun restart it);
    - past the wall timeout ("wall-timeout").
    """
    last_mark, last_change = (0, 0.0), time.monotonic()
    tail, tail_of = logs.LogTail(), None
    nccl: tuple[float, str] | None = None  # when the current attempt's first NCCL timeout was seen, and where
    while proc.poll() is None:
        time.sleep(0.5)
        found = logs.run_dirs(log_dir, plan.rdzv_id, start)
        run_dir = found[-1] if found else None
        mark, now = logs.activity_mark(run_dir), time.monotonic()
        if mark != last_mark:
            last_mark, last_change = mark, now
        att = logs.attempts(run_dir) if run_dir else []
        stop: tuple[str, str] | None = None
        if plan.nccl_timeout_grace_s and att:
            if att[-1] != tail_of:  # a new attempt (a restart): watch its logs afresh
                tail, tail_of, nccl = logs.LogTail(), att[-1], None
            if nccl is None and (hit := tail.find(att[-1], logs.NCCL_WATCHDOG_TIMEOUT)):
                nccl = (now, _rank_name(att[-1], hit[0]))
            if nccl and now - nccl[0] > plan.nccl_timeout_grace_s:
                stop = (
                    "nccl-timeout",
                    f"{nccl[1]}'s NCCL watchdog caught a collective timeout and the job was still running "
                    f"{plan.nccl_timeout_grace_s} s later (--nccl-timeout-grace)",
                )
        if plan.hang_timeout_s and run_dir and now - last_change > plan.hang_timeout_s:
            stop = ("hang-timeout", f"no rank wrote to its log for {plan.hang_timeout_s} s (--hang-timeout)")
        if wall_timeout_s and time.time() - start > wall_timeout_s:
            stop = ("wall-timeout", f"the job ran past its time limit of {wall_timeout_s:.0f} s")
        if stop:
            if att:
                _ask_flight_records(log_dir, att[-1])  # every rank writes its flight record next to the logs
                _signal_workers(att[-1], signal.SIGUSR1)  # every rank prints its stack into its log
                _await_flight_records(log_dir, att[-1], start, 2.0, 15.0)
            _stop(proc)
            return stop
    return None


def _request_path(log_dir: Path, attempt_dir: Path) -> Path:
    return log_dir / f"{FLIGHT_RECORD_REQUEST}.{attempt_dir.name.removeprefix('attempt_')}"


def _ask_flight_records(log_dir: Path, attempt_dir: Path) -> None:
    with contextlib.suppress(OSError):
        _request_path(log_dir, attempt_dir).touch()


def _await_flight_records(
    log_dir: Path, attempt_dir: Path, since_s: float, at_least_s: float, at_most_s: float
) -> None:
    """Give the ranks ``at_least_s`` for their stacks, and up to ``at_most_s`` for every rank's flight record
    with its Python stacks (a rank marks the record it is still symbolising: the first took up to 5.8 s on an
    H200)."""
    t0 = time.monotonic()
    ranks = {r.global_rank for r in logs.read_attempt(attempt_dir, {}) if r.global_rank is not None}
    while time.monotonic() - t0 < at_most_s:
        time.sleep(0.25)
        have = {flightrec.rank_of(p) for p in flight_records(log_dir, since_s)}
        busy = any(log_dir.glob(f"{flightrec.PREFIX}*{SYMBOLIZING}"))
        if time.monotonic() - t0 >= at_least_s and ranks <= have and not busy:
            return


def _clear_requests(log_dir: Path) -> None:
    """Remove the requests, and the markers of ranks stopped while they symbolised their record."""
    for p in [
        *log_dir.glob(f"{FLIGHT_RECORD_REQUEST}.*"),
        *log_dir.glob(f"{flightrec.PREFIX}*{SYMBOLIZING}"),
    ]:
        with contextlib.suppress(OSError):
            p.unlink()


def execute(plan: LaunchPlan, *, wall_timeout_s: float | None = None, echo=sys.stderr) -> LaunchResult:
    """Run the plan to the end; returns what happened. Output of torchrun and the ranks goes to ``echo``."""
    log_dir = Path(plan.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    env = {**os.environ, **plan.env}
    # torchrun runs under a guard (``torchrig.launch.guard``): one stop signal for torchrun however many come,
    # a bounded stop, and no rank left behind.
    proc = guard.start(plan.argv, env=env, stderr=subprocess.PIPE)
    # A SIGTERM to the launcher (a scheduler cancelling the job) stops torchrun and the ranks the same way.
    previous = None
    if threading.current_thread() is threading.main_thread():

        def on_term(*_: object) -> None:
            _stop(proc)
            sys.exit(143)

        previous = signal.signal(signal.SIGTERM, on_term)
    agent_out: collections.deque[str] = collections.deque(maxlen=5000)
    pumps = [
        threading.Thread(target=_pump, args=(s, echo, agent_out), daemon=True)
        for s in (proc.stdout, proc.stderr)
    ]
    for t in pumps:
        t.start()
    try:
        stopped = _watch(proc, plan, log_dir, start, wall_timeout_s)
    except KeyboardInterrupt:
        _stop(proc)
        raise
    for t in pumps:
        t.join(timeout=5)
    code = proc.wait()
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
    agent_text = "".join(agent_out)
    _clear_requests(log_dir)
    found = logs.run_dirs(log_dir, plan.rdzv_id, start)
    run_dir = found[-1] if found else None
    result = _result(plan, run_dir, code, stopped is not None, agent_text, time.time() - start)
    records = flight_records(log_dir, start)
    att = logs.attempts(run_dir) if run_dir else []
    here = (
        {r.global_rank for r in logs.read_attempt(att[-1], {}) if r.global_rank is not None} if att else None
    )
    return replace(
        result,
        flight_records=records,
        flight=read_flight_records(records, here or None) if code != 0 or stopped else None,
        stopped_by=stopped[0] if stopped else None,
        stop_reason=stopped[1] if stopped else None,
    )


def flight_records(log_dir: Path, since_s: float) -> tuple[str, ...]:
    """The flight-recorder dumps written into ``log_dir`` since ``since_s`` (by NCCL's watchdog at a timeout, or
    by the ranks when the launcher stopped a hung job)."""
    found = []
    for p in log_dir.glob(f"{flightrec.PREFIX}*"):
        try:
            if flightrec.rank_of(p) is not None and p.is_file() and p.stat().st_mtime >= since_s - 1:
                found.append(str(p))
        except OSError:
            continue
    return tuple(sorted(found))


def read_flight_records(
    paths: tuple[str, ...], present: set[int] | None = None
) -> flightrec.FlightVerdict | None:
    """What the dumps say (``present``: the global ranks that ran on this node); None without any dump."""
    records, problems = flightrec.load_all(paths)
    return flightrec.analyze(records, problems, present)


def _result(
    plan: LaunchPlan, run_dir: Path | None, code: int, hung: bool, agent_text: str, elapsed_s: float
) -> LaunchResult:
    codes = logs.exit_codes_by_pid(agent_text)
    att = logs.attempts(run_dir) if run_dir else []
    rdzv_failed = code != 0 and not hung and RDZV_TIMEOUT in agent_text
    earlier = []
    # After a rendezvous timeout the last attempt's ranks are gone too: its failure is history as well.
    for a in att if rdzv_failed else att[:-1]:
        ranks = logs.read_attempt(a, codes)
        if any(r.exit_code not in (None, 0) for r in ranks):
            earlier.append(summarize_failure(ranks, int(a.name[8:])))
    summary = None
    if rdzv_failed:
        first = earlier[-1].headline if earlier else None
        summary = rendezvous_timeout(agent_text, plan.nnodes, len(att), first)
    elif att and hung:
        summary = summarize_hang(
            logs.read_attempt(att[-1], codes), int(att[-1].name[8:]), plan.hang_timeout_s
        )
    elif att and code != 0:
        summary = summarize_failure(logs.read_attempt(att[-1], codes), int(att[-1].name[8:]))
    return LaunchResult(
        exit_code=1 if hung and code == 0 else code,
        attempts=len(att),
        hung=hung,
        elapsed_s=round(elapsed_s, 2),
        run_dir=str(run_dir) if run_dir else None,
        summary=summary,
        earlier_failures=tuple(earlier),
    )
