"""Run a plan through torch.distributed.run and watch it: the adapter between a ``LaunchPlan`` and the host.

torchrun does the process management (spawn, rendezvous, restarts); this module only starts it with the
plan's argv and environment (the parent's own ``os.environ`` is never changed), copies its output to
stderr, watches the rank logs for a hang, and when the job fails or hangs, reads the logs into a summary.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from torchrig.launch import flightrec, guard, logs
from torchrig.launch.plan import FLIGHT_RECORD_REQUEST, TEE_PREFIX, LaunchPlan
from torchrig.launch.ranklog import RankLog
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
    # why the job was stopped, when it was: by torchrig, "hang-timeout", "nccl-timeout", "stopped-rank" or
    # "wall-timeout"; "cancelled" when the launcher itself was told to stop (see cancelled_by)
    stopped_by: str | None = None
    stop_reason: str | None = None  # that, in words
    agent_log: str | None = None  # torchrun's own output (its report and traceback), kept out of the console
    # the launcher was told to stop (SIGTERM: a scheduler cancelling the job; SIGINT: Ctrl-C): the signal's name;
    # the job was stopped and the launcher exits 128 + its number, as a process killed by it would
    cancelled_by: str | None = None


@dataclass(frozen=True)
class Stop:
    """Why the watcher stopped the job, and the evidence it saw before stopping it."""

    by: str
    reason: str
    stopped_pids: frozenset[int] = frozenset()  # ranks in process state T when the job was stopped
    flight: flightrec.FlightVerdict | None = None  # the records read before the stop (stopped-rank)


_HEADER_LINE = re.compile(
    r"^\[(?:rank|default)(\d+)\]:torchrig-worker: rank="
)  # a rank's shim is about to run the script


class _Started:
    """Calls ``then`` once every local rank's shim has printed its header (the script starts next)."""

    def __init__(self, nproc: int, then: Callable[[], None] | None) -> None:
        self._left, self._then, self._lock = set(range(nproc)), then, threading.Lock()

    def saw(self, line: str) -> None:
        m = _HEADER_LINE.match(line) if self._then is not None and self._left else None
        if m is None:
            return
        with self._lock:
            self._left.discard(int(m[1]))
            done, then = not self._left, self._then
            if done:
                self._then = None
        if done and then is not None:
            then()


def _pump(stream, sink, keep: collections.deque, started: _Started | None = None) -> None:
    """Copy torchrun's output to ``sink`` and ``keep``. Once torchrun prints its own traceback (the
    ChildFailedError and its report, which name the shim, not the script), its lines go to the log only; the
    ranks' own lines still reach the console. torchrig's summary says what failed."""
    own_report = False
    for line in iter(stream.readline, ""):
        keep.append(line)
        if started is not None:
            started.saw(line)
        if not TEE_PREFIX.match(line) and line.startswith("Traceback (most recent call last):"):
            own_report = True
        if own_report and not TEE_PREFIX.match(line):
            continue
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
    proc: subprocess.Popen,
    plan: LaunchPlan,
    log_dir: Path,
    start: float,
    wall_timeout_s: float | None,
    abort: Callable[[], str | None] | None = None,
) -> Stop | None:
    """Wait for torchrun. When the job hangs, every rank is asked for its flight record and its stack
    (SIGUSR1), the job is stopped and the ``Stop`` returned; None when torchrun ended by itself. A hang is
    decided on evidence, in this order:

    - a rank's NCCL watchdog logged a collective timeout and the job is still running
      ``nccl_timeout_grace_s`` later ("nccl-timeout"): PyTorch may dump its flight record and keep the
      process alive, and the grace lets a process that does end by itself end (and torchrun restart it);
    - a rank has been stopped by a signal (process state T) for ``stopped_grace_s`` while another rank's flight
      record shows it waiting in a collective ("stopped-rank");
    - only when asked (``hang_timeout_s``): no rank output for that long ("hang-timeout"); a healthy job that
      writes only to TensorBoard is never stopped by default;
    - past the wall timeout ("wall-timeout", the pre-flight's deadline).
    """
    w = _Watch(time.monotonic())
    while proc.poll() is None:
        time.sleep(0.5)
        att, now = w.look(log_dir, plan.rdzv_id, start)
        stop = _hang_stop(plan, log_dir, w, att, now)
        if abort is not None and (why := abort()):
            _stop(proc)  # not a hang: no records or stacks to gather
            return Stop("preflight", why)
        if wall_timeout_s and time.time() - start > wall_timeout_s:
            stop = Stop("wall-timeout", f"the job ran past its time limit of {wall_timeout_s:.0f} s")
        if stop:
            if att:
                asked = time.time()
                _ask_flight_records(log_dir, att[-1])  # every rank writes its flight record next to the logs
                _signal_workers(att[-1], signal.SIGUSR1)  # every rank prints its stack into its log
                _await_flight_records(log_dir, att[-1], asked, 2.0, 15.0)
            _stop(proc)
            return stop
    return None


class _Watch:
    """What the watcher has seen of the current attempt: when a rank last wrote, the first NCCL timeout, the
    ranks stopped by a signal. A new attempt (a restart) is watched afresh."""

    def __init__(self, now: float) -> None:
        self.last_mark, self.last_change = (0, 0.0), now
        self.run_dir: Path | None = None
        self.tail = logs.LogTail()
        self.tail_of: Path | None = None  # the attempt whose logs ``tail`` reads
        self.nccl: tuple[float, str] | None = (
            None  # when the attempt's first NCCL timeout was seen, and where
        )
        self.stopped_since: dict[int, float] = {}  # pid -> when it was first seen stopped

    def look(self, log_dir: Path, rdzv_id: str, start: float) -> tuple[list[Path], float]:
        """The run's attempts so far, and now (monotonic)."""
        found = logs.run_dirs(log_dir, rdzv_id, start)
        self.run_dir = found[-1] if found else None
        mark, now = logs.activity_mark(self.run_dir), time.monotonic()
        if mark != self.last_mark:
            self.last_mark, self.last_change = mark, now
        att = logs.attempts(self.run_dir) if self.run_dir else []
        if att and att[-1] != self.tail_of:
            self.tail, self.tail_of, self.nccl, self.stopped_since = logs.LogTail(), att[-1], None, {}
        return att, now


def _hang_stop(plan: LaunchPlan, log_dir: Path, w: _Watch, att: list[Path], now: float) -> Stop | None:
    """A Stop when the evidence says the job hangs (in ``_watch``'s order), else None."""
    stop: Stop | None = None
    if plan.nccl_timeout_grace_s and att:
        if w.nccl is None and (hit := w.tail.find(att[-1], logs.NCCL_WATCHDOG_TIMEOUT)):
            w.nccl = (now, _rank_name(att[-1], hit[0]))
        if w.nccl and now - w.nccl[0] > plan.nccl_timeout_grace_s:
            stop = Stop(
                "nccl-timeout",
                f"{w.nccl[1]}'s NCCL watchdog caught a collective timeout and the job was still running "
                f"{plan.nccl_timeout_grace_s} s later (--nccl-timeout-grace)",
            )
    if plan.stopped_grace_s and att and stop is None:
        stop = _stopped_rank(plan, log_dir, att[-1], w.stopped_since, now)
    if plan.hang_timeout_s and w.run_dir and now - w.last_change > plan.hang_timeout_s and stop is None:
        stop = Stop(
            "hang-timeout",
            f"no rank wrote to its log for {plan.hang_timeout_s} s (--hang-timeout, as asked)",
        )
    return stop


def _stopped_rank(
    plan: LaunchPlan, log_dir: Path, attempt_dir: Path, since: dict[int, float], now: float
) -> Stop | None:
    """A Stop when a rank has been in process state T (stopped by SIGSTOP/SIGTSTP) for the grace while another
    rank's flight record shows a collective it waits in (or no rank keeps a record to tell)."""
    pids = logs.rank_pids(attempt_dir)
    stopped, running = _track_stopped(pids, since, now)
    due = [pid for pid in stopped if now - since[pid] >= plan.stopped_grace_s]
    if not due or not running:  # every rank stopped: the user paused the whole job, not a hang
        return None
    verdict = _flight_now(log_dir, attempt_dir, expect={pids[p] for p in running})
    for pid in due:
        since[pid] = now  # look again after another grace if the others are not waiting yet
    if verdict is not None and not verdict.waiting:
        return None
    names = ", ".join(f"rank {pids[p]} (pid {p})" for p in sorted(due))
    waits = (
        f"; {', '.join(f'rank {r}' for r in verdict.waiting)} wait(s) in a collective (flight record)"
        if verdict
        else "; the ranks keep no flight record to tell whether the others wait"
    )
    return Stop(
        "stopped-rank",
        f"{names} stopped by a signal (process state T) for {plan.stopped_grace_s} s (--stopped-grace){waits}",
        frozenset(stopped),
        verdict,
    )


def _track_stopped(
    pids: dict[int, int | None], since: dict[int, float], now: float
) -> tuple[set[int], list[int]]:
    """The ranks' pids in process state T and those still running; ``since`` (when each stopped pid was first
    seen stopped) kept up to date: a pid that runs again leaves it."""
    states = {pid: logs.process_state(pid) for pid in pids}
    stopped = {pid for pid, st in states.items() if st in ("T", "t")}
    for pid in list(since):
        if pid not in stopped:
            del since[pid]
    for pid in stopped:
        since.setdefault(pid, now)
    return stopped, [pid for pid, st in states.items() if st not in (None, "T", "t", "Z")]


def _flight_now(log_dir: Path, attempt_dir: Path, expect: set[int | None]) -> flightrec.FlightVerdict | None:
    """Ask the running ranks (``expect``) to dump their flight records now and read what they wrote; None when
    no rank keeps a record."""
    asked = time.time()
    _ask_flight_records(log_dir, attempt_dir)
    _await_flight_records(log_dir, attempt_dir, asked, 0.5, 5.0, expect=expect)
    records = flight_records(log_dir, asked)
    return read_flight_records(records, None) if records else None


def _request_path(log_dir: Path, attempt_dir: Path) -> Path:
    return log_dir / f"{FLIGHT_RECORD_REQUEST}.{attempt_dir.name.removeprefix('attempt_')}"


def _ask_flight_records(log_dir: Path, attempt_dir: Path) -> None:
    with contextlib.suppress(OSError):
        _request_path(log_dir, attempt_dir).touch()


def _await_flight_records(
    log_dir: Path,
    attempt_dir: Path,
    since_s: float,
    at_least_s: float,
    at_most_s: float,
    expect: set[int | None] | None = None,
) -> None:
    """Give the ranks ``at_least_s`` for their stacks, and up to ``at_most_s`` for every rank's (or the
    ``expect``ed ranks') flight record written since ``since_s``, with its Python stacks (a rank marks the
    record it is still symbolising: the first took up to 5.8 s on an H200)."""
    t0 = time.monotonic()
    ranks = (
        {r for r in expect if r is not None}
        if expect is not None
        else {r.global_rank for r in logs.read_attempt(attempt_dir, {}) if r.global_rank is not None}
    )
    while time.monotonic() - t0 < at_most_s:
        time.sleep(0.25)
        have = {flightrec.rank_of(p) for p in flight_records(log_dir, since_s, slack_s=0)}
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


def execute(
    plan: LaunchPlan,
    *,
    wall_timeout_s: float | None = None,
    echo=sys.stderr,
    abort: Callable[[], str | None] | None = None,
    started: Callable[[], None] | None = None,
) -> LaunchResult:
    """Run the plan to the end; returns what happened. Output of torchrun and the ranks goes to ``echo``.
    ``abort``, polled while the job runs, returns a reason to stop it (the pre-flight beside it failed);
    ``started`` is called once every local rank of the first attempt is about to run the script."""
    log_dir = Path(plan.log_dir).absolute()
    log_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    ran = _run_torchrun(plan, log_dir, start, echo, wall_timeout_s, abort, started)
    _clear_requests(log_dir)
    found = logs.run_dirs(log_dir, plan.rdzv_id, start)
    run_dir = found[-1] if found else None
    agent_log = None
    if run_dir is not None:
        with contextlib.suppress(OSError):
            (run_dir / "torchrun.log").write_text(ran.agent_text)
            agent_log = str(run_dir / "torchrun.log")
    records = flight_records(log_dir, start)
    flight = _flight_verdict(ran, run_dir, records)
    stopped = ran.stopped
    if ran.cancelled:
        result = LaunchResult(
            exit_code=128 + signal.Signals[ran.cancelled].value,
            attempts=len(logs.attempts(run_dir) if run_dir else []),
            hung=False,
            elapsed_s=round(time.time() - start, 2),
            run_dir=str(run_dir) if run_dir else None,
            summary=None,  # the ranks ended because the job was stopped, not by a fault of their own
            earlier_failures=(),
        )
    else:
        result = _result(plan, run_dir, ran.code, stopped, ran.agent_text, time.time() - start, flight)
    return replace(
        result,
        flight_records=records,
        flight=flight,
        stopped_by=stopped.by if stopped else None,
        stop_reason=stopped.reason if stopped else None,
        agent_log=agent_log,
        cancelled_by=ran.cancelled,
    )


@dataclass(frozen=True)
class _Ran:
    """How torchrun ended: its exit status, why the watcher stopped it, the signal that cancelled the
    launcher, and torchrun's own output."""

    code: int
    stopped: Stop | None
    cancelled: str | None
    agent_text: str


def _run_torchrun(
    plan: LaunchPlan,
    log_dir: Path,
    start: float,
    echo: Any,
    wall_timeout_s: float | None,
    abort: Callable[[], str | None] | None,
    started: Callable[[], None] | None,
) -> _Ran:
    """Start torchrun with the plan, copy its output to ``echo``, watch it to its end."""
    env = {**os.environ, **plan.env}
    # torchrun runs under a guard (``torchrig.launch.guard``): one stop signal for torchrun however many come,
    # a bounded stop, and no rank left behind.
    proc = guard.start(plan.argv, env=env, stderr=subprocess.PIPE)
    agent_out: collections.deque[str] = collections.deque(maxlen=5000)
    ranks_up = _Started(plan.nproc_per_node, started)
    pumps = [
        threading.Thread(target=_pump, args=(s, echo, agent_out, ranks_up), daemon=True)
        for s in (proc.stdout, proc.stderr)
    ]
    for t in pumps:
        t.start()
    # A SIGTERM to the launcher (a scheduler cancelling the job) or a Ctrl-C stops torchrun and the ranks through
    # the guard, and the result says the job was cancelled.
    previous = _catch_cancel() if threading.current_thread() is threading.main_thread() else {}
    cancelled: str | None = None
    try:
        stopped = _watch(proc, plan, log_dir, start, wall_timeout_s, abort)
        for t in pumps:
            t.join(timeout=5)
        code = proc.wait()
    except _Cancel as c:
        cancelled, stopped = c.name, Stop("cancelled", cancel_reason(c.name, os.environ))
        # Said before the stop: a scheduler SIGKILLs whatever is left after its grace (Slurm's KillWait).
        print(f"torchrig launch: cancelled: {stopped.reason}; stopping torchrun and the ranks", file=echo)
        echo.flush()
        _stop(proc)
        for t in pumps:
            t.join(timeout=5)
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return _Ran(code, stopped, cancelled, "".join(agent_out))


def _flight_verdict(
    ran: _Ran, run_dir: Path | None, records: tuple[str, ...]
) -> flightrec.FlightVerdict | None:
    """What the flight records say, after a failure or a stop (not after a cancel)."""
    if ran.stopped is not None and ran.stopped.flight is not None:
        return ran.stopped.flight  # what the records said before the stop, when the verdict rests on them
    if (ran.code != 0 or ran.stopped) and not ran.cancelled:
        att = logs.attempts(run_dir) if run_dir else []
        here = (
            {r.global_rank for r in logs.read_attempt(att[-1], {}) if r.global_rank is not None}
            if att
            else None
        )
        return read_flight_records(records, here or None)
    return None


class _Cancel(BaseException):
    """Raised in the main thread by the SIGTERM / SIGINT handler: leave the watch and stop the job. A
    BaseException, as KeyboardInterrupt is, so that no ``except Exception`` on the way swallows it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _catch_cancel() -> dict[int, Any]:
    """Handlers for SIGTERM and SIGINT that raise :class:`_Cancel`; the previous handlers, to put back."""

    def on_signal(signum: int, _frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal while stopping changes nothing
            signal.signal(sig, signal.SIG_IGN)
        raise _Cancel(signal.Signals(signum).name)

    return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}


def cancel_reason(signal_name: str, env: Mapping[str, str]) -> str:
    """Who most likely sent the stop, in words. Under Slurm (``SLURM_JOB_ID`` set) a SIGTERM is Slurm ending
    the job step: ``scancel``, the time limit, a requeue or preemption, or a failed peer node (``srun
    --kill-on-bad-exit``); ``torchrig cluster slurm --wait`` and ``scontrol show job`` tell which."""
    if signal_name == "SIGINT":
        return "interrupted (SIGINT, Ctrl-C)"
    job = env.get("SLURM_JOB_ID")
    if job:
        where = f"job {job}, step {env['SLURM_STEP_ID']}" if env.get("SLURM_STEP_ID") else f"job {job}"
        causes = "scancel, the time limit, a requeue, preemption or a lost node"
        return f"{signal_name} from Slurm ({where}): {causes}; `scontrol show job {job}` says which"
    return f"{signal_name} from outside the job (a scheduler, or kill)"


def flight_records(log_dir: Path, since_s: float, slack_s: float = 1.0) -> tuple[str, ...]:
    """The flight-recorder dumps written into ``log_dir`` since ``since_s`` (by NCCL's watchdog at a timeout, or
    by the ranks when the launcher asked for them)."""
    found = []
    for p in log_dir.glob(f"{flightrec.PREFIX}*"):
        try:
            if flightrec.rank_of(p) is not None and p.is_file() and p.stat().st_mtime >= since_s - slack_s:
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


def _evidence(stop: Stop, flight: flightrec.FlightVerdict | None) -> str:
    """What a hang verdict rests on, in words."""
    parts = [stop.reason]
    if flight is not None:
        parts.append(f"flight records: {flight.headline}")
    else:
        parts.append("no flight record was written (recorder off, or every rank stopped)")
    return "; ".join(parts)


def _result(
    plan: LaunchPlan,
    run_dir: Path | None,
    code: int,
    stopped: Stop | None,
    agent_text: str,
    elapsed_s: float,
    flight: flightrec.FlightVerdict | None = None,
) -> LaunchResult:
    codes = logs.exit_codes_by_pid(agent_text)
    closed = logs.closed_by_agent(agent_text)
    att = logs.attempts(run_dir) if run_dir else []

    def read(attempt_dir: Path) -> list[RankLog]:
        return logs.read_attempt(attempt_dir, codes, closed)

    rdzv_failed = code != 0 and stopped is None and RDZV_TIMEOUT in agent_text
    # After a rendezvous timeout the last attempt's ranks are gone too: its failure is history as well.
    earlier = _earlier_failures(att if rdzv_failed else att[:-1], read)
    summary: FailureSummary | None
    if rdzv_failed:
        first = earlier[-1].headline if earlier else None
        summary = rendezvous_timeout(agent_text, plan.nnodes, len(att), first)
    else:
        summary = _last_summary(plan, att[-1] if att else None, code, stopped, flight, read)
    return LaunchResult(
        exit_code=1 if stopped is not None and code == 0 else code,
        attempts=len(att),
        # a job stopped because the pre-flight beside it failed did not hang
        hung=stopped is not None and stopped.by != "preflight",
        elapsed_s=round(elapsed_s, 2),
        run_dir=str(run_dir) if run_dir else None,
        summary=summary,
        earlier_failures=tuple(earlier),
    )


def _attempt_number(attempt_dir: Path) -> int:
    return int(attempt_dir.name.removeprefix("attempt_"))


def _earlier_failures(attempts: list[Path], read: Callable[[Path], list[RankLog]]) -> list[FailureSummary]:
    """The verdicts of the attempts that failed before the last (torchrun restarted the job after each)."""
    out = []
    for a in attempts:
        ranks = read(a)
        if any(r.exit_code not in (None, 0) for r in ranks):
            out.append(summarize_failure(ranks, _attempt_number(a)))
    return out


def _last_summary(
    plan: LaunchPlan,
    last: Path | None,
    code: int,
    stopped: Stop | None,
    flight: flightrec.FlightVerdict | None,
    read: Callable[[Path], list[RankLog]],
) -> FailureSummary | None:
    """The last attempt's verdict: a hang when the launcher stopped it, a failure when torchrun reported one.
    A job stopped because the pre-flight beside it failed did nothing wrong itself: the finding is the cause,
    not a hang of its ranks (no summary of them, as for a cancelled job)."""
    if last is None or (stopped is not None and stopped.by == "preflight"):
        return None
    if stopped is not None:
        ranks = [replace(r, state="T") if r.pid in stopped.stopped_pids else r for r in read(last)]
        return summarize_hang(
            ranks,
            _attempt_number(last),
            plan.hang_timeout_s,
            flight=flight,
            evidence=_evidence(stopped, flight),
        )
    return summarize_failure(read(last), _attempt_number(last)) if code != 0 else None
