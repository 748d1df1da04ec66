"""Follow a submitted Slurm job to its end and say what happened, from Slurm's own records.

``torchrig cluster slurm --submit --wait`` polls ``scontrol show job -o JOBID`` (the controller's record of
the job: its state, reason, exit code, requeue count and nodes) until the job ends, and notes every change
on the way: started, requeued (``Restarts`` went up; Slurm requeues a job whose node failed), ended. When a
job is requeued or ends in any state but ``COMPLETED``, the nodes it ran on are looked up with
``scontrol show node -o NODE``: a node that is ``DOWN``, ``NOT_RESPONDING`` or ``FAIL`` is named as lost,
with Slurm's reason.

The equivalent by hand::

    scontrol show job -o 1234     # JobState=, Reason=, ExitCode=, Restarts=, NodeList=
    scontrol show node -o node1   # State=DOWN+NOT_RESPONDING ... Reason=Not responding

Parsing is pure (:func:`parse_job`, :func:`parse_node`) and tested on recorded ``scontrol`` output; the
one adapter, :func:`run_scontrol`, is passed in.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from torchrig.errors import EngineUnavailable, JobFailed

# JobState values a job does not leave (Slurm's job_state_string(), src/common/slurm_protocol_defs.c).
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
     "OUT_OF_MEMORY"}
)  # fmt: skip
LOST_NODE_STATES = ("DOWN", "NOT_RESPONDING", "FAIL")
# What JobState=CANCELLED means: `scancel` (Slurm's other endings have states of their own: TIMEOUT, PREEMPTED,
# NODE_FAIL, DEADLINE). Who ran it is in Slurm's accounting (`sacct -j ID -o State` says "CANCELLED by UID").
CANCELLED_BY = "scancel, by its user or an admin"
_PAIR = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")

Scontrol = Callable[[list[str]], str]

# Pending reasons that never clear by waiting: the request itself is outside what the partition, account or
# QOS allows, and only a new submission (or an admin's change) helps. From Slurm's "Job Reason Codes"
# (https://slurm.schedmd.com/job_reason_codes.html, verified 2026-12-03): "AssocMax* / QOSMax*: a portion of
# the job request exceeds a maximum limit (e.g., PerJob, PerNode)", "PartitionConfig: the requested partition
# configuration does not allow this job", "PartitionTimeLimit: the job's time limit exceeds its partition's
# current time limit", "BadConstraints: the job's constraints can not be satisfied", and the invalid or not
# allowed account/QOS. Limits on *counts* of jobs (AssocMaxJobsLimit: "the job's association has reached its
# maximum job count", *MaxJobsPerUser*, *MaxSubmitJob*) clear when the user's other jobs end: waited for.
# PartitionNodeLimit ("the number of nodes required by this job is outside of its partition's current limits.
# Can also indicate that required nodes are DOWN or DRAINED") is hopeless only when the job asks for more
# nodes than the partition has or allows (:func:`beyond_partition`); down nodes may come back.
NEVER_CLEAR = frozenset(
    {"PartitionConfig", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS",
     "AccountNotAllowed", "QOSNotAllowed", "PartitionInactive"}
)  # fmt: skip
MEANING = {  # Slurm's words for each (job_reason_codes.html), shortened
    "PartitionConfig": "the partition's configuration does not allow this job (more nodes, CPUs or memory "
    "than it has?)",
    "PartitionTimeLimit": "the job's time limit exceeds its partition's",
    "BadConstraints": "the job's constraints can not be satisfied",
    "InvalidAccount": "the job's account is invalid",
    "InvalidQOS": "the job's QOS is invalid",
    "AccountNotAllowed": "the job's account is not allowed in the partition",
    "QOSNotAllowed": "the job's QOS is not allowed in the partition",
    "PartitionInactive": "the partition is inactive",
}
_COUNT_LIMITS = ("MaxJobs", "MaxSubmit", "JobsPerUser", "JobsPerAccount")
SOURCE_REASONS = "https://slurm.schedmd.com/job_reason_codes.html"


def never_clears(reason: str | None) -> bool:
    """Whether a pending ``reason`` is one that waiting cannot clear (see :data:`NEVER_CLEAR`)."""
    if not reason:
        return False
    if reason in NEVER_CLEAR:
        return True
    per_job = reason.startswith(("AssocMax", "QOSMax")) or (
        reason.startswith("Max") and "PerAccount" in reason
    )
    return per_job and not any(c in reason for c in _COUNT_LIMITS)


@dataclass(frozen=True)
class JobRecord:
    """One ``scontrol show job -o`` answer."""

    job_id: str
    state: str  # JobState, e.g. RUNNING, PENDING, COMPLETED, CANCELLED, NODE_FAIL
    reason: str | None  # Reason (why pending or why it ended), None for "None"
    exit_code: str | None  # ExitCode "status:signal"
    restarts: int  # how many times Slurm requeued it
    nodes: str | None  # NodeList, Slurm's hostlist expression (empty while pending)
    run_time: str | None
    stdout: str | None
    num_nodes: int | None = None  # NumNodes (the lower bound of "2-2" or "2-4")
    partition: str | None = None


@dataclass(frozen=True)
class NodeRecord:
    name: str
    state: str  # State, e.g. IDLE, ALLOCATED, DOWN+NOT_RESPONDING
    reason: str | None  # Reason, e.g. "Not responding [root@2026-12-01T16:13:53]"
    addr: str | None

    @property
    def lost(self) -> bool:
        return any(s in self.state.split("+") or self.state.startswith(s) for s in LOST_NODE_STATES)


@dataclass(frozen=True)
class JobOutcome:
    """How the job ended (or where it stood when the wait ran out), and what happened on the way."""

    job_id: str
    state: str
    exit_code: str | None
    reason: str | None
    restarts: int
    nodes: tuple[str, ...]  # every node the job ran on, over all its runs
    lost_nodes: tuple[str, ...]  # nodes Slurm marked down / not responding while the job had them
    events: tuple[str, ...]
    waited_s: float
    finished: bool  # False: the wait timed out with the job still pending or running
    output: str | None
    lost_detail: dict[str, str] = field(default_factory=dict)  # node -> Slurm's state and reason
    blocked: str | None = None  # pending for a reason that never clears: why (the wait gave up at once)

    @property
    def ok(self) -> bool:
        return self.finished and self.state == "COMPLETED"

    def headline(self) -> str:
        if self.blocked:
            text = (
                f"job {self.job_id} can never start: {self.blocked}; it stays queued until you remove it "
                f"(scancel {self.job_id}) and submit what the cluster allows"
            )
        elif not self.finished:
            text = (
                f"job {self.job_id} is still {self.state} after {self.waited_s:.0f} s of waiting (it goes on); "
                f"follow it with 'squeue -j {self.job_id}'"
                + (f" and 'tail -f {self.output}'" if self.output else "")
                + f", stop it with 'scancel {self.job_id}'"
            )
        else:
            text = f"job {self.job_id} {self.state}"
            notes = [CANCELLED_BY] if self.state == "CANCELLED" else []
            if self.exit_code and self.state != "COMPLETED":
                notes.append(f"exit code {self.exit_code}")
            if notes:
                text += f" ({'; '.join(notes)})"
        if self.restarts:
            text += f", requeued {self.restarts} time(s)"
        if self.lost_nodes:
            text += "; lost node(s): " + ", ".join(
                f"{n} ({self.lost_detail[n]})" if n in self.lost_detail else n for n in self.lost_nodes
            )
        return text


def _pairs(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in _PAIR.finditer(text)}


def _none(value: str | None) -> str | None:
    return None if value in (None, "", "None", "(null)", "N/A") else value


def parse_job(text: str) -> JobRecord:
    """``scontrol show job -o JOBID``'s one line. Values with spaces are cut at the first one (none of the
    fields read here has spaces, except a path in StdOut)."""
    kv = _pairs(text.strip())
    if "JobId" not in kv or "JobState" not in kv:
        raise ValueError(f"not a `scontrol show job -o` line: {text[:120]!r}")
    out = re.search(r"\bStdOut=(.*?)(?: Power=|$)", text.strip())
    return JobRecord(
        job_id=kv["JobId"],
        state=kv["JobState"],
        reason=_none(kv.get("Reason")),
        exit_code=_none(kv.get("ExitCode")),
        restarts=int(kv.get("Restarts", "0") or 0),
        nodes=_none(kv.get("NodeList")),
        run_time=_none(kv.get("RunTime")),
        stdout=_none(out.group(1)) if out else None,
        num_nodes=int(m.group(1)) if (m := re.match(r"(\d+)", kv.get("NumNodes", ""))) else None,
        partition=_none(kv.get("Partition")),
    )


def beyond_partition(rec: JobRecord, scontrol: Scontrol) -> str | None:
    """Why a job pending with PartitionNodeLimit can never start: it asks for more nodes than its partition
    has (TotalNodes) or lets one job have (MaxNodes); None when it fits (nodes down or drained: wait)."""
    if rec.num_nodes is None or not rec.partition:
        return None
    try:
        kv = _pairs(scontrol(["show", "partition", "-o", rec.partition.split(",")[0]]))
    except JobFailed:
        return None
    for key, what in (("TotalNodes", "has"), ("MaxNodes", "allows a job")):
        value = kv.get(key, "")
        if value.isdigit() and rec.num_nodes > int(value):
            return f"{rec.num_nodes} nodes asked, partition {rec.partition} {what} {value}"
    return None


def blocked_reason(rec: JobRecord, scontrol: Scontrol) -> str | None:
    """Slurm's pending reason, when it is one waiting cannot clear, with what it means; else None."""
    if rec.state != "PENDING" or not rec.reason:
        return None
    if rec.reason == "PartitionNodeLimit":
        why = beyond_partition(rec, scontrol)
        return f"Slurm says PartitionNodeLimit ({why})" if why else None
    if never_clears(rec.reason):
        meaning = MEANING.get(
            rec.reason, "a part of the job's request exceeds a per-job limit of its account or QOS"
        )
        return f"Slurm says {rec.reason}: {meaning} (see {SOURCE_REASONS})"
    return None


def parse_node(text: str) -> NodeRecord:
    """``scontrol show node -o NODE``'s one line; Reason is last and may have spaces."""
    line = text.strip()
    kv = _pairs(line)
    reason = re.search(r"\bReason=(.*)$", line)
    if "NodeName" not in kv or "State" not in kv:
        raise ValueError(f"not a `scontrol show node -o` line: {line[:120]!r}")
    return NodeRecord(kv["NodeName"], kv["State"], _none(reason.group(1).strip()) if reason else None,
                      _none(kv.get("NodeAddr")))  # fmt: skip


def run_scontrol(args: list[str]) -> str:
    """The adapter: ``scontrol ARGS``; its stdout, or JobFailed with its error."""
    exe = shutil.which("scontrol")
    if not exe:
        raise EngineUnavailable("scontrol is not on PATH", hint="run on a Slurm login node")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines() or ["no output"]
        raise JobFailed(f"scontrol {' '.join(args)} failed: {lines[-1][:300]}")
    return proc.stdout


def hostnames(expr: str, scontrol: Scontrol) -> tuple[str, ...]:
    """A hostlist expression (``node[0-1]``) expanded by Slurm itself."""
    return tuple(scontrol(["show", "hostnames", expr]).split())


def lost_nodes(nodes: tuple[str, ...], scontrol: Scontrol) -> dict[str, str]:
    """The nodes Slurm has marked lost, with its state and reason."""
    lost = {}
    for name in nodes:
        node = parse_node(scontrol(["show", "node", "-o", name]))
        if node.lost:
            lost[name] = node.state + (f": {node.reason}" if node.reason else "")
    return lost


def wait(
    job_id: str,
    *,
    scontrol: Scontrol = run_scontrol,
    timeout_s: float | None = None,
    poll_s: float = 2.0,
    on_event: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobOutcome:
    """Poll the job until it reaches a final state (or ``timeout_s`` passes); the outcome and its history."""
    start = clock()
    events: list[str] = []
    nodes: list[str] = []
    lost: dict[str, str] = {}
    last: JobRecord | None = None

    def note(text: str) -> None:
        events.append(text)
        if on_event:
            on_event(text)

    while True:
        rec = parse_job(scontrol(["show", "job", "-o", job_id]))
        if rec.nodes:
            for n in hostnames(rec.nodes, scontrol):
                if n not in nodes:
                    nodes.append(n)
        if last is None or rec.state != last.state or rec.restarts != last.restarts:
            requeued = last is not None and rec.restarts > last.restarts
            if requeued or (rec.state in FINAL_STATES and rec.state != "COMPLETED"):
                lost.update(lost_nodes(tuple(nodes), scontrol))
            text = f"{rec.state}" + (f" ({rec.reason})" if rec.reason else "")
            if requeued:
                text = f"requeued by Slurm (restart {rec.restarts}), now {text}"
                if lost:
                    text += "; lost: " + ", ".join(lost)
            elif rec.nodes and rec.state == "RUNNING":
                text += f" on {rec.nodes}"
            note(text)
        last = rec
        waited = clock() - start
        done = rec.state in FINAL_STATES
        blocked = blocked_reason(rec, scontrol)
        if done or blocked or (timeout_s is not None and waited >= timeout_s):
            return JobOutcome(
                job_id=rec.job_id,
                state=rec.state,
                exit_code=rec.exit_code,
                reason=rec.reason,
                restarts=rec.restarts,
                nodes=tuple(nodes),
                lost_nodes=tuple(lost),
                events=tuple(events),
                waited_s=round(waited, 1),
                finished=done,
                output=rec.stdout,
                lost_detail=lost,
                blocked=blocked,
            )
        sleep(poll_s)
