"""What went wrong, and on which rank: a pure reading of the per-rank logs and torchrun's own report.

Inputs are plain records (``RankLog``) built from files by ``torchrig.launch.logs``; the verdict is a
``FailureSummary`` naming the rank(s) at fault, their last log lines and the likely cause. A rank that
timed out in a collective is a *victim*; the rank that never reached the collective (its stack dump shows
it elsewhere) or that died first is the *culprit*.
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass
from typing import Any

from torchrig.launch.gpuwait import GpuWait, SourceLine, gpu_wait

# (pattern in a rank's log, likely cause, what to do). First match wins; order from specific to generic.
CAUSES: tuple[tuple[str, str, str], ...] = (
    (
        r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
        "the GPU ran out of memory",
        "lower the micro-batch (raise --grad-accum to keep the global batch) or use FSDP",
    ),
    (
        r"illegal memory access|device-side assert",
        "a CUDA kernel faulted (illegal memory access or a device-side assert)",
        "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; check indices against the vocabulary/class count",
    ),
    (
        r"Address already in use|EADDRINUSE|address already in use",
        "the rendezvous or master port was already taken",
        "pick another --rdzv-endpoint port, or stop the job holding it",
    ),
    (
        r"Watchdog caught collective operation timeout|Some NCCL operations have failed or timed out|Timed out waiting|timed out in|[Tt]imeout.*(collective|ALLREDUCE|BROADCAST|barrier)",
        "a collective timed out: some rank never joined it",
        "look at the rank that was not in the collective; raise --collective-timeout only if it is just slow",
    ),
    (
        r"Connection closed by peer|Connection reset by peer|remote worker crash|NCCL communicator was aborted|ncclRemoteError",
        "a peer rank went away and this rank lost its connection to it",
        "this rank is a victim: read the rank that failed first",
    ),
    (
        r"ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclInvalidUsage|NCCL error",
        "NCCL reported an error",
        "rerun with NCCL_DEBUG=INFO; check that P2P/IB work (torchrig launch pre-flight)",
    ),
    (r"No space left on device", "a disk filled up", "free space where checkpoints and logs are written"),
)
SIGNAL_CAUSES = {
    "SIGKILL": (
        "the process was killed with SIGKILL (the kernel's OOM killer, a scheduler, or a user)",
        "check 'dmesg' for the OOM killer and the host's memory; lower DataLoader workers or batch",
    ),
    "SIGSEGV": (
        "the process crashed with a segmentation fault",
        "read the stack above; often a native extension",
    ),
    "SIGABRT": (
        "the process aborted (a native assertion or NCCL's watchdog tearing it down)",
        "read the rank's last lines: the reason is printed just before the abort",
    ),
    "SIGBUS": (
        "a bus error: usually /dev/shm too small for DataLoader workers",
        "give the container a bigger --shm-size",
    ),
}
VANISHED = (
    "the process vanished without an exit status or error report: killed by a signal such as SIGKILL "
    "(the kernel's OOM killer, a scheduler, a user) or a native crash"
)
# faulthandler writes 'File "x", line 3 in f'; a Python traceback 'File "x", line 3, in f'.
_FRAME_RE = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_TRACEBACK = "Traceback (most recent call last):"
# one line of the worker's output.log: "16:01:02.345 err| text"
_STAMPED_RE = re.compile(r"^(?P<stamp>\d\d:\d\d:\d\d\.\d{3}) (?:out|err)\| (?P<text>.*)$")
_THREAD_RE = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_HEADER_RE = re.compile(
    r"torchrig-worker: rank=(?P<rank>\S+) local_rank=(?P<local>\S+) world_size=(?P<world>\S+) "
    r"restart=(?P<restart>\d+) pid=(?P<pid>\d+) host=(?P<host>\S+)"
)
_EXC_RE = re.compile(r"^(?:\[rank\d+\]: )?(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$")
COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} in {self.func}"


@dataclass(frozen=True)
class RankLog:
    """One rank's log of one attempt, read from disk."""

    global_rank: int | None
    local_rank: int
    host: str | None
    pid: int | None
    attempt: int
    text: str  # stdout + stderr
    error_message: str | None = None  # from torchelastic's error.json
    exit_code: int | None = None  # from torchrun's report; negative: killed by that signal
    stack: tuple[Frame, ...] = ()  # main thread, innermost first (last dump in the log)
    world_size: int | None = None  # from the rank's header
    output: str = ""  # the worker's output.log: stdout and stderr merged in the order written, timestamped
    closed_by_agent: bool = (
        False  # torchrun sent it its closing signal (after another rank failed, or a stop)
    )
    error_trace: str | None = None  # the traceback in torchelastic's error.json
    state: str | None = None  # the process state when the launcher looked ("T": stopped by a signal)
    error_handled: bool = False  # the worker wrote the error file: a caught exception, or a failing sys.exit


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


def parse_header(text: str) -> dict[str, str] | None:
    m = _HEADER_RE.search(text)
    return m.groupdict() if m else None


def parse_stack(text: str) -> tuple[Frame, ...]:
    """The main thread's frames (innermost first) from the last faulthandler dump in a log."""
    dumps: list[list[list[Frame]]] = []  # dumps -> thread blocks -> frames
    in_dump = False
    for ln in text.splitlines():
        if _THREAD_RE.match(ln):
            if not in_dump:
                dumps.append([])
            dumps[-1].append([])
            in_dump = True
            continue
        m = _FRAME_RE.match(ln)
        if in_dump and m:
            dumps[-1][-1].append(Frame(m["path"], int(m["line"]), m["func"]))
        elif ln.strip():
            in_dump = False
    if not dumps:
        return ()
    blocks = dumps[-1]
    for block in blocks:  # the main thread: it started in the shim's module body (its helper threads did not)
        if any("torchrig/launch/worker.py" in f.path and f.func == "<module>" for f in block):
            return tuple(block)
    for block in blocks:
        if any("torchrig/launch/worker.py" in f.path for f in block) and not any(
            f.path.endswith("threading.py") for f in block
        ):
            return tuple(block)
    return tuple(blocks[0])


def parse_traceback(text: str) -> tuple[Frame, ...]:
    """The frames of the last Python traceback in ``text``, innermost first (a chained exception's last)."""
    found = parse_tracebacks(text)
    return found[-1] if found else ()


def parse_tracebacks(text: str) -> list[tuple[Frame, ...]]:
    """The frames of every Python traceback in ``text`` (chained exceptions give several), each innermost
    first, in the order printed."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.strip().endswith(_TRACEBACK)]
    out = []
    for start in starts:
        frames = []
        for ln in lines[start + 1 :]:
            ln = re.sub(r"^\[rank\d+\]: ", "", ln)
            m = _FRAME_RE.match(ln)
            if m:
                frames.append(Frame(m["path"], int(m["line"]), m["func"]))
            elif ln.strip() and not ln.startswith(" "):
                break  # the exception line ends the traceback
        out.append(tuple(reversed(frames)))
    return out


def user_frame(stack: tuple[Frame, ...]) -> Frame | None:
    """The innermost frame outside Python's and torch's own files: where the user's code is."""
    for f in stack:
        if "site-packages" in f.path or "dist-packages" in f.path or f.path.startswith("<"):
            continue
        if "/lib/python3" in f.path or "torchrig/launch/worker.py" in f.path:
            continue
        return f
    return None


def in_collective(stack: tuple[Frame, ...]) -> bool:
    return any(any(p in f.path for p in COLLECTIVE_FILES) for f in stack)


def signal_name(exit_code: int | None) -> str | None:
    if exit_code is None or exit_code >= 0:
        return None
    import signal

    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


# an error file's message for a failing ``sys.exit`` that handled no exception (``worker._record_exit``)
SYS_EXIT_PREFIX = "SystemExit: "


def sys_exit_message(log: RankLog) -> str | None:
    """What a rank's failing ``sys.exit`` was given (its message or status), when that is how it ended."""
    msg = log.error_message or ""
    return msg[len(SYS_EXIT_PREFIX) :] if log.error_handled and msg.startswith(SYS_EXIT_PREFIX) else None


def match_cause(text: str) -> tuple[str, str] | None:
    for pattern, cause, fix in CAUSES:
        if re.search(pattern, text):
            return cause, fix
    return None


def last_exception(text: str) -> str | None:
    for ln in reversed(text.splitlines()):
        m = _EXC_RE.match(ln.strip())
        if m:
            return m["exc"][:300]
    return None


def tail(text: str, n: int = 8, stamps: bool = True) -> tuple[str, ...]:
    """The last ``n`` informative lines: no stack-frame lines, no caret markers, no gloo retry noise. Lines of
    the worker's merged ``output.log`` keep their time stamp (``16:01:02.345 text``) unless ``stamps`` is off."""
    keep, after_frame = [], False
    for raw in text.splitlines():
        m = _STAMPED_RE.match(raw)
        stamp, raw = (m["stamp"] + " " if stamps else "", m["text"]) if m else ("", raw)
        ln = re.sub(r"^\[rank\d+\]: ", "", raw).rstrip()
        s = ln.strip()
        code_line, after_frame = after_frame and ln.startswith("    "), s.startswith('File "')
        if (
            not s
            or after_frame
            or code_line
            or _THREAD_RE.match(ln)
            or set(s) <= set("^~ ")
            or "debug_logger.cc" in s
            or s in ("<no Python frame>", "Garbage-collecting")  # faulthandler's dump, not the script's
            or s.startswith("torchrig-worker:")
        ):
            continue
        keep.append((stamp + ln)[:300])
    return tuple(keep[-n:])


STOPPED_BY_TORCHRUN = "stopped by torchrun after another rank failed"
_VICTIM_CAUSES = ("a collective timed out", "a peer rank went away", STOPPED_BY_TORCHRUN)


def where_of(log: RankLog) -> Frame | None:
    """The script's own frame: the innermost user frame of the rank's last traceback (its log, else the last of
    its error file's that has one), else of its last stack dump (faulthandler's, on a crash or when the
    launcher asked)."""
    # the error file's tracebacks from the last: an exception the script caught before it exited may have
    # been raised in a library's frames only (argparse's); the exit's own traceback, written first, reaches
    # the script's line that called into it
    errors = reversed(parse_tracebacks(log.error_trace or ""))
    for stack in (parse_traceback(log.text), *errors, log.stack):
        found = user_frame(stack)
        if found:
            return found
    return None


def _verdict(log: RankLog, role: str, status: str, cause: str | None) -> RankVerdict:
    where = where_of(log)
    return RankVerdict(
        rank=log.global_rank,
        local_rank=log.local_rank,
        host=log.host,
        role=role,
        status=status,
        cause=cause,
        where=str(where) if where else None,
        last_lines=tail(log.output or log.text),
    )


# who sends a rank a signal, when the launcher can tell
FROM_OUTSIDE = "from outside the job: neither torchrun nor torchrig sent it"
SENT_SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT")  # signals another process sends


def _status(log: RankLog) -> str:
    sig = signal_name(log.exit_code)
    if sig == "SIGTERM" and log.closed_by_agent:
        if log.error_message:
            return "raised an exception, then stopped by torchrun (SIGTERM) while exiting"
        return "stopped by torchrun (SIGTERM)"
    if sig:
        sent = sig in SENT_SIGNALS and not log.closed_by_agent  # SIGSEGV, SIGABRT...: the process's own crash
        return f"killed by {sig}" + (f" {FROM_OUTSIDE}" if sent else "")
    return f"exit {log.exit_code}" if log.exit_code is not None else "vanished without an exit status"


def _own_cause(log: RankLog) -> tuple[str, str]:
    sig = signal_name(log.exit_code)
    found = match_cause(f"{log.text}\n{log.error_message or ''}")
    if found:
        return found
    err_lines = (log.error_message or "").strip().splitlines()
    printed = last_exception(log.text)  # the last exception Python printed in the rank's log
    exc = printed or (err_lines[-1] if err_lines else None)
    if sig == "SIGABRT" and printed:
        # Python printed an uncaught exception, then the process aborted on its way out (a process-group or
        # CUDA destructor at interpreter exit): the exception is the cause, the abort its echo.
        return (
            f"an uncaught exception in the script: {printed} (the process then aborted while shutting down)",
            "fix the error above; the traceback is in the rank's log",
        )
    if sig in SIGNAL_CAUSES:
        return SIGNAL_CAUSES[sig]
    if sig == "SIGTERM" and not log.closed_by_agent:
        return (
            f"the rank was terminated with SIGTERM {FROM_OUTSIDE} (a scheduler, a user, a job manager)",
            "find who stops processes on this host (a scheduler's preemption or time limit, a kill command)",
        )
    if sig and not (sig == "SIGTERM" and exc):
        return f"the rank was killed by {sig}", "read the rank's last lines"
    given = sys_exit_message(log)
    if given is not None and not sig and log.closed_by_agent:
        return (
            f"{STOPPED_BY_TORCHRUN}: the script's SIGTERM handler ended it with sys.exit({given})",
            "fix the rank that failed first",
        )
    if given is not None and not sig and not printed:
        if given.lstrip("-").isdigit():
            last = tail(log.output or log.text, 1, stamps=False)
            return (
                f"the script ended itself with sys.exit({given})"
                + (f" after printing: {last[0].strip()[:200]}" if last else ""),
                "read the rank's last lines for why it exited (the line that exited is named below)",
            )
        first = (given.strip().splitlines() or [""])[0][:200]  # one line, as an exception's cause is
        return (
            f"the script ended itself with sys.exit and the message: {first}",
            "the message is the script's own: fix what it names",
        )
    if exc and log.error_handled:
        return (
            "an exception in the script, which the script (or a framework it uses) caught before it exited "
            f"with status {log.exit_code}: {exc}",
            "fix the error above; its traceback is in the rank's error file (error.json)",
        )
    if exc:
        return (
            f"an uncaught exception in the script: {exc}",
            "fix the error above; the traceback is in the rank's log",
        )
    return "the rank exited with an error and no message", "read the rank's full log"


def _name(ranks: list[RankLog]) -> str:
    return (
        ", ".join(f"rank {r.global_rank if r.global_rank is not None else '?'}" for r in ranks) or "no rank"
    )


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
    if culprits:
        return _hang_with_culprits(logs, attempt, culprits, stopped, waiting, on_gpu, flight, evidence)
    elsewhere = [r for r in logs if r.stack and r not in waiting]
    silent = [r for r in logs if not r.stack and r not in waiting]
    verdicts = [_verdict(r, "victim", _wait_status(r, on_gpu.get(id(r))), None) for r in waiting]
    timeouts = [
        f"{_name([r])}: {w.nccl_timeout}" for r in waiting if (w := on_gpu.get(id(r))) and w.nccl_timeout
    ]
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
    if timeouts:
        cause += f"; {'; '.join(timeouts)}, but the process did not end by itself"
    verdicts += [_verdict(r, "culprit", "hung: outside any collective", None) for r in elsewhere]
    verdicts += [
        _verdict(r, "culprit" if not waiting else "bystander", "hung: no stack", None) for r in silent
    ]
    return FailureSummary(
        "hang", headline, cause, fix, tuple(sorted(verdicts, key=_order)), attempt, evidence
    )


STOPPED_STATUS = "stopped by a signal (SIGSTOP or SIGTSTP: process state T), so it cannot arrive"


def _hang_with_culprits(
    logs: list[RankLog],
    attempt: int,
    culprits: list[RankLog],
    stopped: list[RankLog],
    waiting: list[RankLog],
    on_gpu: dict[int, GpuWait | None],
    flight: Any,
    evidence: str | None,
) -> FailureSummary:
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
    verdicts += [_verdict(r, "victim", _wait_status(r, on_gpu.get(id(r))), None) for r in waiting]
    verdicts += [
        _verdict(r, "bystander", "hung", None) for r in logs if r not in culprits and r not in waiting
    ]
    return FailureSummary(
        "hang", headline, cause, fix, tuple(sorted(verdicts, key=_order)), attempt, evidence
    )


def in_backward(stack: tuple[Frame, ...]) -> bool:
    """The main thread is in autograd's backward: with DDP, where its gradient all-reduce waits."""
    return any(
        "torch/autograd/" in f.path or (f.func == "backward" and "torch/_tensor.py" in f.path) for f in stack
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


def summarize_failure(logs: list[RankLog], attempt: int) -> FailureSummary:
    """Verdict for an attempt where torchrun reported failed ranks."""

    def closed(r: RankLog) -> bool:  # ended by torchrun's own stop after another rank's failure, unless
        # it had raised by then itself (its error file is written): then it failed as well
        return signal_name(r.exit_code) == "SIGTERM" and r.closed_by_agent and not r.error_message

    failed = [r for r in logs if r.exit_code not in (None, 0) and not closed(r)]
    stopped = [r for r in logs if closed(r)]
    causes = {id(r): _own_cause(r) for r in failed}
    victims = [r for r in failed if causes[id(r)][0].startswith(_VICTIM_CAUSES)]
    culprits = [r for r in failed if r not in victims]
    if not culprits:
        # torchrun reports only the first exit it observes; a rank that vanished (SIGKILL, native crash) while
        # the survivors were being stopped has no exit status and no error file of its own.
        vanished = [r for r in logs if r.exit_code is None and not r.error_message]
        for r in vanished:
            causes[id(r)] = (VANISHED, SIGNAL_CAUSES["SIGKILL"][1])
        culprits = vanished
    verdicts = [_verdict(r, "culprit", _status(r), causes[id(r)][0]) for r in culprits]
    verdicts += [_verdict(r, "victim", _status(r), causes[id(r)][0]) for r in victims]
    if culprits:
        first = culprits[0]
        cause, fix = causes[id(first)]
        headline = f"{_name(culprits)} failed ({_status(first)})"
        verdicts += [_verdict(r, "bystander", _status(r), None) for r in stopped]
    elif victims and any(causes[id(r)][0].startswith("a collective timed out") for r in victims):
        outside = [r for r in stopped if not (r.stack and in_collective(r.stack))] or stopped
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
        fix = "make every rank reach the same collectives; fix the code at the culprit's 'where'"
        verdicts += [
            _verdict(r, "culprit" if r in outside else "bystander", _status(r), None) for r in stopped
        ]
    elif victims:
        peers = sorted({p for r in victims for p in lost_peers(r.text)})
        at = f" at {', '.join(peers)}" if peers else ""
        headline = f"{_name(victims)} lost a peer{at}"
        cause = f"a peer rank{at} (on another node, or one that died without a log here) went away first"
        fix = "read that node's logs and summary; if the node is gone, restart it or rerun on the remaining nodes"
        verdicts += [_verdict(r, "bystander", _status(r), None) for r in stopped]
    else:
        headline, cause, fix = (
            "the job failed, but no rank reported an error",
            "unknown",
            "read the torchrun output above",
        )
        verdicts += [_verdict(r, "bystander", _status(r), None) for r in stopped]
    return FailureSummary("failed", headline, cause, fix, tuple(sorted(verdicts, key=_order)), attempt)


RDZV_TIMEOUT = "RendezvousTimeoutError"
# gloo names the lost peer either after the word ("Connection closed by peer [ADDR]:PORT") or before it
# ("Read error [ADDR]:PORT: Connection reset by peer"), depending on which side saw the reset first.
_PEER_RE = re.compile(
    r"\[([0-9A-Za-z.:_-]+)\]:(\d+):? [^\n]{0,30}\bpeer\b"
    r"|(?:peer|remote)[^\[\n]{0,40}\[([0-9A-Za-z.:_-]+)\]:(\d+)"
)


def lost_peers(text: str) -> list[str]:
    """Addresses of peers a rank lost its connection to (gloo and NCCL name them in the error)."""
    return sorted({m[1] or m[3] for m in _PEER_RE.finditer(text)})


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
