"""Why a rank ended: its cause and what to do, read from its log, its error file and its exit status.

Each kind of ending is one small rule (``RULES``): a function from the rank's :class:`Ending` to a
``(cause, fix)`` pair, or None when the rule does not apply. The first rule that applies gives the cause;
the order goes from the specific (a known message in the log, a crash signal) to the generic (an uncaught
exception). A new failure kind is one more rule, placed where it belongs in that order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from torchrig.launch.ranklog import RankLog, last_exception, signal_name, sys_exit_message, tail

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


def match_cause(text: str) -> tuple[str, str] | None:
    """The first of ``CAUSES`` whose pattern is in ``text``."""
    for pattern, cause, fix in CAUSES:
        if re.search(pattern, text):
            return cause, fix
    return None


STOPPED_BY_TORCHRUN = "stopped by torchrun after another rank failed"
VICTIM_CAUSES = ("a collective timed out", "a peer rank went away", STOPPED_BY_TORCHRUN)


FROM_OUTSIDE = "from outside the job: neither torchrun nor torchrig sent it"
SENT_SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT")  # signals another process sends


def stopped_while_exiting(log: RankLog) -> bool:
    """torchrun's closing SIGTERM reached the rank after it had failed by itself (its error file is written):
    it was on its way out with its own error when another rank's failure, seen first, made torchrun stop it."""
    return signal_name(log.exit_code) == "SIGTERM" and log.closed_by_agent and bool(log.error_message)


def status(log: RankLog, first: str | None = None) -> str:
    """How the rank ended, in words: its exit status, the signal that killed it and who sent it. ``first``
    names the rank(s) whose failure torchrun saw first, the reason it stops the others ("rank 1")."""
    sig = signal_name(log.exit_code)
    if sig == "SIGTERM" and log.closed_by_agent:
        because = f" because {first} failed first" if first else ""
        if stopped_while_exiting(log):
            return f"failed by itself, then stopped by torchrun (SIGTERM) while exiting{because}"
        return f"stopped by torchrun (SIGTERM){because}"
    if sig:
        sent = sig in SENT_SIGNALS and not log.closed_by_agent  # SIGSEGV, SIGABRT...: the process's own crash
        return f"killed by {sig}" + (f" {FROM_OUTSIDE}" if sent else "")
    return f"exit {log.exit_code}" if log.exit_code is not None else "vanished without an exit status"


Cause = tuple[str, str]  # (likely cause, what to do)


@dataclass(frozen=True)
class Ending:
    """What the rules read of a rank's end, worked out once."""

    log: RankLog
    signal: str | None  # the signal that ended it ("SIGKILL"), None for an exit status
    printed: str | None  # the last exception Python printed in the rank's log
    exception: str | None  # that, else the last line of its error file's message
    exit_given: str | None  # what a failing ``sys.exit`` was given, when that is how it ended
    exit_status: int | None  # its own exit status; None when a signal, or torchrun's stop, replaced it
    stopped_exiting: bool = False  # torchrun's SIGTERM came after the rank had failed by itself

    @classmethod
    def of(cls, log: RankLog) -> Ending:
        err_lines = (log.error_message or "").strip().splitlines()
        printed = last_exception(log.text)
        exception = printed or (err_lines[-1] if err_lines else None)
        if stopped_while_exiting(log):
            # the rank's own ending is the one its error file records; the SIGTERM only cut its exit short
            return cls(log, None, printed, exception, sys_exit_message(log), None, stopped_exiting=True)
        sig = signal_name(log.exit_code)
        return cls(log, sig, printed, exception, sys_exit_message(log), None if sig else log.exit_code)


def _known_message(e: Ending) -> Cause | None:
    """A message the field knows (out of memory, a port taken, a collective timeout...): ``CAUSES``."""
    return match_cause(f"{e.log.text}\n{e.log.error_message or ''}")


def _aborted_after_exception(e: Ending) -> Cause | None:
    # Python printed an uncaught exception, then the process aborted on its way out (a process-group or
    # CUDA destructor at interpreter exit): the exception is the cause, the abort its echo.
    if e.signal == "SIGABRT" and e.printed:
        return (
            f"an uncaught exception in the script: {e.printed} (the process then aborted while shutting down)",
            "fix the error above; the traceback is in the rank's log",
        )
    return None


def _crash_signal(e: Ending) -> Cause | None:
    """SIGKILL, SIGSEGV, SIGABRT, SIGBUS: ``SIGNAL_CAUSES``."""
    return SIGNAL_CAUSES.get(e.signal or "")


def _terminated_from_outside(e: Ending) -> Cause | None:
    if e.signal == "SIGTERM" and not e.log.closed_by_agent:
        return (
            f"the rank was terminated with SIGTERM {FROM_OUTSIDE} (a scheduler, a user, a job manager)",
            "find who stops processes on this host (a scheduler's preemption or time limit, a kill command)",
        )
    return None


def _other_signal(e: Ending) -> Cause | None:
    """Any other signal; a rank that raised before torchrun's SIGTERM reached it is read by its exception."""
    if e.signal and not (e.signal == "SIGTERM" and e.exception):
        return f"the rank was killed by {e.signal}", "read the rank's last lines"
    return None


def _exit_in_stop_handler(e: Ending) -> Cause | None:
    if e.exit_given is not None and not e.signal and e.log.closed_by_agent and not e.stopped_exiting:
        return (
            f"{STOPPED_BY_TORCHRUN}: the script's SIGTERM handler ended it with sys.exit({e.exit_given})",
            "fix the rank that failed first",
        )
    return None


def _own_sys_exit(e: Ending) -> Cause | None:
    """The script ended itself with ``sys.exit(status)`` or ``sys.exit("message")``."""
    given, log = e.exit_given, e.log
    if given is None or e.signal or e.printed:
        return None
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


def _caught_exception(e: Ending) -> Cause | None:
    if e.exception and e.log.error_handled:
        with_status = f" with status {e.exit_status}" if e.exit_status is not None else ""
        return (
            "an exception in the script, which the script (or a framework it uses) caught before it exited"
            f"{with_status}: {e.exception}",
            "fix the error above; its traceback is in the rank's error file (error.json)",
        )
    return None


def _uncaught_exception(e: Ending) -> Cause | None:
    if e.exception:
        return (
            f"an uncaught exception in the script: {e.exception}",
            "fix the error above; the traceback is in the rank's log",
        )
    return None


Rule = Callable[[Ending], Cause | None]
# From the specific to the generic: the first rule that applies gives the cause.
RULES: tuple[Rule, ...] = (
    _known_message,
    _aborted_after_exception,
    _crash_signal,
    _terminated_from_outside,
    _other_signal,
    _exit_in_stop_handler,
    _own_sys_exit,
    _caught_exception,
    _uncaught_exception,
)
NO_MESSAGE: Cause = ("the rank exited with an error and no message", "read the rank's full log")


def own_cause(log: RankLog) -> Cause:
    """Why this rank ended, by its own log, error file and exit status (not by what the others did)."""
    ending = Ending.of(log)
    for rule in RULES:
        found = rule(ending)
        if found is not None:
            return found
    return NO_MESSAGE


def is_victim(cause: str) -> bool:
    """The cause says the rank ended because of another rank (a timeout, a lost peer, torchrun's stop)."""
    return cause.startswith(VICTIM_CAUSES)
