"""What went wrong, and on which rank: a pure reading of the per-rank logs and torchrun's own report.

Inputs are plain records (``RankLog``, ``torchrig.launch.ranklog``) built from files by
``torchrig.launch.logs``; the verdict is a ``FailureSummary`` naming the rank(s) at fault, their last log
lines and the likely cause. It answers three questions, each in its own place:

- *who failed first* — the culprit: the rank that died first, or the one that never reached the collective
  the others wait in (its stack dump, its flight record or its process state shows it elsewhere);
- *why* — each rank's own cause, one small rule per kind of ending (``torchrig.launch.causes``);
- *what the others were doing* — victims (timed out or waiting in a collective, lost their peer) and
  bystanders (stopped by torchrun after the failure), and from that the headline.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from typing import Any

from torchrig.launch.causes import (
    SIGNAL_CAUSES,
    VANISHED,
    Cause,
    is_victim,
    own_cause,
    status,
    stopped_while_exiting,
)
from torchrig.launch.gpuwait import GpuWait, SourceLine, gpu_wait
from torchrig.launch.ranklog import (
    RankLog,
    in_backward,
    in_collective,
    lost_peers,
    signal_name,
    tail,
    user_frame,
    where_of,
)


@dataclass(frozen=True)
class RankVerdict:
    rank: int | None
    local_rank: int
    host: str | None
    role: str  # "culprit", "victim" or "bystander"
    status: str  # e.g. "exit 1", "killed by SIGKILL", "stopped by the launcher", "hung"
    cause: str | None
    where: str | None  # FILE:LINE in FUNC in the script: from its traceback, error file or stack dump
    last_lines: tuple[str, ...]  # its last lines, stdout and stderr in the order written (timestamped)


@dataclass(frozen=True)
class FailureSummary:
    kind: str  # "failed" or "hang"
    headline: str
    likely_cause: str
    fix: str
    ranks: tuple[RankVerdict, ...]
    attempt: int
    evidence: str | None = None  # what a hang verdict rests on (flight records, process states, silence)


def _verdict(log: RankLog, role: str, how: str, cause: str | None) -> RankVerdict:
    """One rank's line in the summary: its role, how it ended (``how``), its cause, where and last lines."""
    where = where_of(log)
    return RankVerdict(
        rank=log.global_rank,
        local_rank=log.local_rank,
        host=log.host,
        role=role,
        status=how,
        cause=cause,
        where=str(where) if where else None,
        last_lines=tail(log.output or log.text),
    )


def _name(ranks: list[RankLog]) -> str:
    return (
        ", ".join(f"rank {r.global_rank if r.global_rank is not None else '?'}" for r in ranks) or "no rank"
    )


# --- a hang: who never arrived, and what the others were waiting in ---


@dataclass(frozen=True)
class _HangParties:
    """Who is where in a hung job: the culprits (stopped by a signal, or named by the flight records), the
    ranks waiting in a collective, and where each waiting rank waits on the GPU."""

    stopped: list[RankLog]
    culprits: list[RankLog]
    waiting: list[RankLog]
    on_gpu: dict[int, GpuWait | None]


def _hang_parties(logs: list[RankLog], source: SourceLine, flight: Any) -> _HangParties:
    by_rank = {r.global_rank: r for r in logs}
    stopped = [r for r in logs if r.state in ("T", "t")]
    named = [
        by_rank[g] for g in (flight.culprits if flight else ()) if g in by_rank and by_rank[g] not in stopped
    ]
    culprits = stopped + named
    on_gpu = {id(r): _gpu_wait(r, source) for r in logs if r.stack}
    pending = set(flight.waiting) if flight else set()
    waiting = [
        r
        for r in logs
        if r not in culprits
        and (r.global_rank in pending or (r.stack and (in_collective(r.stack) or on_gpu.get(id(r)))))
    ]
    return _HangParties(stopped, culprits, waiting, on_gpu)


def summarize_hang(
    logs: list[RankLog],
    attempt: int,
    timeout_s: int,
    source: SourceLine = linecache.getline,
    *,
    flight: Any = None,
    evidence: str | None = None,
) -> FailureSummary:
    """Verdict on a hung job, from the evidence of the collectives first: the ranks' flight records
    (``flight``, a ``flightrec.FlightVerdict``: who never called the collective the others wait in) and the
    ranks' process states (a rank stopped by a signal, state T, never arrives). The rank that never arrived is
    the culprit; a rank waiting in a collective (a Python collective call, DDP's all-reduce inside
    ``backward()``, a host sync behind an NCCL collective) is a victim. Without such evidence the ranks' stacks
    decide, as before: a rank outside any collective while others wait in one is the culprit.
    """
    who = _hang_parties(logs, source, flight)
    if who.culprits:
        return _hang_with_culprits(logs, attempt, who, flight, evidence)
    waiting = who.waiting
    elsewhere = [r for r in logs if r.stack and r not in waiting]
    silent = [r for r in logs if not r.stack and r not in waiting]
    headline, cause, fix = _hang_story(logs, waiting, elsewhere, timeout_s)
    timeouts = [
        f"{_name([r])}: {w.nccl_timeout}" for r in waiting if (w := who.on_gpu.get(id(r))) and w.nccl_timeout
    ]
    if timeouts:
        cause += f"; {'; '.join(timeouts)}, but the process did not end by itself"
    verdicts = [_verdict(r, "victim", _wait_status(r, who.on_gpu.get(id(r))), None) for r in waiting]
    verdicts += [_verdict(r, "culprit", "hung: outside any collective", None) for r in elsewhere]
    verdicts += [
        _verdict(r, "culprit" if not waiting else "bystander", "hung: no stack", None) for r in silent
    ]
    return FailureSummary(
        "hang", headline, cause, fix, tuple(sorted(verdicts, key=_order)), attempt, evidence
    )


def _hang_story(
    logs: list[RankLog], waiting: list[RankLog], elsewhere: list[RankLog], timeout_s: int
) -> tuple[str, str, str]:
    """Headline, cause and fix of a hang with no named culprit, from where the ranks were."""
    if waiting and elsewhere:
        headline = f"hang: {_name(elsewhere)} never joined the collective that {_name(waiting)} wait(s) in"
        cause = f"{_name(elsewhere)} is stuck outside any collective (see 'where'): a rank-dependent branch, a deadlock or a data loader that never returns"
        fix = "make every rank reach the same collectives in the same order; fix the code at 'where'"
    elif waiting and len(logs) == 1 and logs[0].world_size == 1:
        headline = f"hang: the only rank waits for its own collective ({_name(waiting)})"
        cause = (
            "with one rank no peer can be missing: the work queued on the GPU ahead of the collective has not "
            "finished (a kernel that runs long or never ends, or a stuck GPU)"
        )
        fix = "see 'where' for the wait; check the GPU with 'torchrig doctor' and time the kernels before it"
    elif waiting:
        headline = f"hang: every rank waits in a collective ({_name(waiting)})"
        cause = "the ranks called different collectives, or the same one with different shapes (a desync)"
        fix = "check that all ranks run the same sequence of collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL names them)"
    elif elsewhere:
        headline = f"hang: no rank is in a collective ({_name(elsewhere)})"
        cause = "the job is stuck in user code (a deadlock, a blocking read, a data loader worker)"
        fix = "see each rank's 'where'"
    else:
        headline = f"hang: no output for {timeout_s} s and no rank answered with its stack"
        cause = "the ranks are stuck in native code (a CUDA or NCCL call) or not running the torchrig shim"
        fix = "rerun with NCCL_DEBUG=INFO; check the GPUs with 'torchrig doctor'"
    return headline, cause, fix


STOPPED_STATUS = "stopped by a signal (SIGSTOP or SIGTSTP: process state T), so it cannot arrive"


def _hang_with_culprits(
    logs: list[RankLog], attempt: int, who: _HangParties, flight: Any, evidence: str | None
) -> FailureSummary:
    culprits, stopped, waiting = who.culprits, who.stopped, who.waiting
    others = f" that {_name(waiting)} wait(s) in" if waiting else ""
    headline = f"hang: {_name(culprits)} never arrived at the collective{others}"
    if stopped:
        headline += f" ({_name(stopped)} stopped by a signal)"
        cause = (
            f"{_name(stopped)} was stopped by a signal (SIGSTOP or SIGTSTP; its process state is T: a debugger, a "
            "job manager or 'kill -STOP'), so it never reaches the collective the others wait in"
        )
        fix = "find what stopped it; 'kill -CONT <pid>' resumes it (pid in the rank's log header)"
    else:
        cause = f"{_name(culprits)} never called the collective (see 'where'): a rank-dependent branch, a deadlock or a data loader that never returns"
        fix = "make every rank reach the same collectives in the same order; fix the code at the culprit's 'where'"
    if flight is not None:
        cause += f"; flight record: {flight.headline}"
    verdicts = [
        _verdict(r, "culprit", STOPPED_STATUS if r in stopped else "hung: never called the collective", None)
        for r in culprits
    ]
    verdicts += [_verdict(r, "victim", _wait_status(r, who.on_gpu.get(id(r))), None) for r in waiting]
    verdicts += [
        _verdict(r, "bystander", "hung", None) for r in logs if r not in culprits and r not in waiting
    ]
    return FailureSummary(
        "hang", headline, cause, fix, tuple(sorted(verdicts, key=_order)), attempt, evidence
    )


def _gpu_wait(log: RankLog, source: SourceLine) -> GpuWait | None:
    f = user_frame(log.stack)
    return gpu_wait(log.text, f.path if f else None, f.line if f else None, source)


def _wait_status(log: RankLog, w: GpuWait | None) -> str:
    if w:
        return f"hung: {w.how}"
    if in_backward(log.stack):
        return "hung: waiting in a collective inside backward() (DDP's gradient all-reduce)"
    return "hung: waiting in a collective"


def _order(v: RankVerdict) -> tuple[int, int]:
    return (
        {"culprit": 0, "victim": 1, "bystander": 2}[v.role],
        v.rank if v.rank is not None else v.local_rank,
    )


# --- a failure: who failed first, why, and what the others were doing ---


def _closed(r: RankLog) -> bool:
    """Ended by torchrun's own stop after another rank's failure, unless it had failed by then itself (its
    error file is written, ``stopped_while_exiting``): then it failed as well."""
    return signal_name(r.exit_code) == "SIGTERM" and r.closed_by_agent and not stopped_while_exiting(r)


@dataclass(frozen=True)
class _FailureParties:
    """Who is who in a failed attempt: the ranks that failed by themselves (culprits) and because of another
    (victims), each with its own cause (by ``id``), the ranks torchrun stopped after the failure, and the
    rank(s) whose exit torchrun saw first."""

    culprits: list[RankLog]
    victims: list[RankLog]
    stopped: list[RankLog]
    causes: dict[int, Cause]
    first: list[RankLog]


def _failure_parties(logs: list[RankLog]) -> _FailureParties:
    failed = [r for r in logs if r.exit_code not in (None, 0) and not _closed(r)]
    causes = {id(r): own_cause(r) for r in failed}
    victims = [r for r in failed if is_victim(causes[id(r)][0])]
    culprits = [r for r in failed if r not in victims]
    if not culprits:
        # torchrun reports only the first exit it observes; a rank that vanished (SIGKILL, native crash) while
        # the survivors were being stopped has no exit status and no error file of its own.
        culprits = [r for r in logs if r.exit_code is None and not r.error_message]
        causes.update({id(r): (VANISHED, SIGNAL_CAUSES["SIGKILL"][1]) for r in culprits})
    # The rank(s) torchrun saw fail first: those that ended with their own status. torchrun stopped the others
    # because of them, even one that was already exiting with its own error.
    first = [r for r in failed if not stopped_while_exiting(r)] or culprits
    return _FailureParties(culprits, victims, [r for r in logs if _closed(r)], causes, first)


def _failure_story(who: _FailureParties) -> tuple[str, str, str, list[RankLog]]:
    """Headline, cause and fix of a failed attempt, and the stopped ranks that are culprits themselves (those
    outside the collective the others timed out in)."""
    if who.culprits:
        return (*_failed_story(who.culprits, who.causes), [])
    if any(who.causes[id(r)][0].startswith("a collective timed out") for r in who.victims):
        outside = [r for r in who.stopped if not (r.stack and in_collective(r.stack))] or who.stopped
        return (*_timeout_story(who.victims, outside), outside)
    if who.victims:
        return (*_lost_peer_story(who.victims), [])
    return ("the job failed, but no rank reported an error", "unknown", "read the torchrun output above", [])


def summarize_failure(logs: list[RankLog], attempt: int) -> FailureSummary:
    """Verdict for an attempt where torchrun reported failed ranks."""
    who = _failure_parties(logs)
    after = _name(who.first) if who.first else None
    headline, cause, fix, outside = _failure_story(who)
    verdicts = [_verdict(r, "culprit", status(r, after), who.causes[id(r)][0]) for r in who.culprits]
    verdicts += [_verdict(r, "victim", status(r, after), who.causes[id(r)][0]) for r in who.victims]
    verdicts += [
        _verdict(r, "culprit" if r in outside else "bystander", status(r, after), None) for r in who.stopped
    ]
    return FailureSummary("failed", headline, cause, fix, tuple(sorted(verdicts, key=_order)), attempt)


def _failed_story(culprits: list[RankLog], causes: dict[int, Cause]) -> tuple[str, str, str]:
    """Headline, cause and fix when ranks failed by themselves: told from the rank whose own exit torchrun saw
    first; a culprit that torchrun then stopped while it was exiting with its own error is named after it."""
    exiting = [r for r in culprits if stopped_while_exiting(r)]
    own = [r for r in culprits if r not in exiting] or exiting
    cause, fix = causes[id(own[0])]
    headline = f"{_name(own)} failed ({status(own[0])})"
    if exiting and own is not exiting:
        headline += f"; {_name(exiting)} failed as well, stopped by torchrun while exiting"
    return headline, cause, fix


def _timeout_story(victims: list[RankLog], outside: list[RankLog]) -> tuple[str, str, str]:
    """The ranks timed out in a collective: the culprit is the rank that was elsewhere (``outside``)."""
    headline = (
        f"{_name(victims)} timed out in a collective that {_name(outside)} never joined"
        if outside
        else f"{_name(victims)} timed out in a collective"
    )
    cause = (
        f"{_name(outside)} was elsewhere when the others timed out (see 'where'): it never reached the collective"
        if outside
        else "a rank on another node never reached the collective"
    )
    return (
        headline,
        cause,
        "make every rank reach the same collectives; fix the code at the culprit's 'where'",
    )


def _lost_peer_story(victims: list[RankLog]) -> tuple[str, str, str]:
    """The ranks here lost a peer: the rank that failed first is on another node, or left no log here."""
    peers = sorted({p for r in victims for p in lost_peers(r.text)})
    at = f" at {', '.join(peers)}" if peers else ""
    return (
        f"{_name(victims)} lost a peer{at}",
        f"a peer rank{at} (on another node, or one that died without a log here) went away first",
        "read that node's logs and summary; if the node is gone, restart it or rerun on the remaining nodes",
    )


# --- the rendezvous: a node that never came (back) ---

RDZV_TIMEOUT = "RendezvousTimeoutError"


def rendezvous_timeout(
    agent_output: str, nnodes: int, attempt: int, before: str | None = None
) -> FailureSummary:
    """torchrun gave up waiting for the nodes to (re)join: a node is gone or cannot reach node 0."""
    lost = sorted(set(re.findall(r"Detected dead node '([^']+)'", agent_output)))
    names = f" (lost: {', '.join(lost)})" if lost else ""
    then = f", after: {before}" if before else ""
    return FailureSummary(
        "failed",
        f"the rendezvous timed out: not all {nnodes} node(s) joined again{names}{then}",
        "a node stopped (its launcher was killed or the machine went away) or cannot reach the rendezvous endpoint",
        "restart the missing node's launcher with the same --rdzv-endpoint and --rdzv-id, or check the network "
        "to node 0; --rdzv-timeout sets how long to wait",
        (),
        attempt,
    )


def render(summary: FailureSummary) -> str:
    """The human view: headline, cause, fix, then each rank at fault with its last lines."""
    out = [
        f"torchrig launch: {summary.headline} [attempt {summary.attempt}]",
        f"  likely cause: {summary.likely_cause}",
        f"  fix: {summary.fix}",
    ]
    for v in summary.ranks:
        if v.role == "bystander":
            continue
        out.append(
            f"  rank {v.rank if v.rank is not None else '?'} (local {v.local_rank}"
            f"{', ' + v.host if v.host else ''}) — {v.role}: {v.status}" + (f"; {v.cause}" if v.cause else "")
        )
        if v.where:
            out.append(f"    at {v.where}")
        out += [f"    | {ln}" for ln in v.last_lines]
    return "\n".join(out)
