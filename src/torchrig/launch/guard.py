"""The small process between ``torchrig launch`` and torchrun, so that stopping a job is exact and bounded.

``python -m torchrig.launch.guard GRACE_S -- TORCHRUN_ARGV...`` runs torchrun as its child and:

- passes a stop on to torchrun **once**. The launcher arms ``PR_SET_PDEATHSIG`` on the guard so a SIGKILLed
  launcher still stops the job; the kernel sends that signal again each time the child is handed to another of
  the dying launcher's threads, so a launcher with several threads can deliver two or three SIGTERMs within a
  millisecond. torchrun's elastic agent is not safe against a second SIGTERM: it interrupts the agent's own
  shutdown before its log tailers stop, and the agent then waits for them forever at exit (seen with
  torch 2.13: torchrun left running with no workers, blocked in ``concurrent.futures``' exit handler). The
  guard is single-threaded, takes every stop signal itself and sends torchrun exactly one SIGTERM;
- bounds the stop: torchrun and everything under it still running ``GRACE_S`` seconds after the stop are
  SIGKILLed;
- leaves nothing behind: it is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so ranks orphaned by a torchrun
  that died are handed to the guard, which kills them when torchrun is gone (torchrun starts each rank in a
  session of its own, out of reach of a process-group kill).

It exits with torchrun's status (128 + N when torchrun was killed by signal N). Linux only for the prctl and
/proc parts; elsewhere it is a plain pass-through. It imports nothing beyond the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
USAGE = "usage: python -m torchrig.launch.guard GRACE_S -- COMMAND [ARGS...]"
STOP_GRACE_S = 15.0  # launch's and bench's: from a stop to SIGKILL for torchrun and everything under it


def _prctl(option: int, arg: int) -> bool:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg) == 0
    except (OSError, AttributeError):
        return False


def _child_setup() -> None:
    """In torchrun before exec: the stop signals the guard held back while starting it are let through again,
    and one SIGTERM comes if the guard itself dies (the guard has one thread, so one signal)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def command(argv: list[str] | tuple[str, ...], grace_s: float) -> list[str]:
    """``argv`` run under the guard, with the interpreter running this code."""
    return [sys.executable, "-m", "torchrig.launch.guard", str(grace_s), "--", *argv]


def start(
    argv: list[str] | tuple[str, ...], *, env: dict[str, str], stderr: int, grace_s: float = STOP_GRACE_S
) -> subprocess.Popen:
    """Start ``argv`` (torchrun) under the guard, in a session of its own, its output read line by line from
    ``stdout`` (``stderr``: ``subprocess.PIPE`` or ``subprocess.STDOUT``). The guard stops the job when this
    process dies in any way; :func:`stop` stops it on purpose."""
    return subprocess.Popen(
        command(argv, grace_s),
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        bufsize=1,
        errors="replace",
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


def die_with_parent() -> None:
    """``preexec_fn`` for the guard: SIGTERM when the process that started it dies (PR_SET_PDEATHSIG), so a
    SIGKILLed launcher still stops the job. The kernel may send it more than once; the guard passes on one."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Ask a running guard to stop its job and wait for it: the guard alone is signalled (a second SIGTERM to
    torchrun is what wedges it); SIGKILL to the guard's process group only if the guard itself is stuck."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s + 10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def descendants(root: int, proc_dir: str = "/proc") -> list[int]:
    """Every live process under ``root``, parents before children, read from ``/proc/<pid>/stat``."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(proc_dir)
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc_dir}/{name}/stat", "rb") as f:  # raw-read: stdlib only; the kernel's stat line
                stat = f.read(4096).decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 2 or fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(0), []):
            if kid not in found:
                found.append(kid)
                todo.append(kid)
    return found


def _kill_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap(timeout_s: float) -> None:
    """Collect the exit status of every child the guard has inherited (zombies), for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def run(argv: list[str], grace_s: float) -> int:
    """Run ``argv`` under the guard; returns the exit status to leave with."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    me = os.getpid()
    stop: dict[str, float] = {}
    child: subprocess.Popen | None = None

    def on_stop(signum: int, _frame: object) -> None:
        if "at" in stop:
            return  # a repeated stop (another PDEATHSIG, a second Ctrl-C): torchrun already has its SIGTERM
        stop["at"], stop["sig"] = time.monotonic(), signum
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_stop)
    if "at" in stop:  # stopped before torchrun could start
        return 128 + int(stop["sig"])
    # A stop that comes while torchrun is being started waits until ``child`` is set, then takes the one path.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        child = subprocess.Popen(argv, preexec_fn=_child_setup)
    except OSError as err:
        print(f"torchrig: cannot start {argv[0]}: {err.strerror or err}", file=sys.stderr)
        return 127
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    killed = False
    while True:
        try:
            code = child.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if "at" in stop and not killed and time.monotonic() - stop["at"] > grace_s:
                # torchrun did not stop in time: it and every process under it, at once.
                _kill_all([child.pid, *descendants(child.pid)], signal.SIGKILL)
                killed = True
    # torchrun is gone; its ranks may not be (torchrun SIGKILLed, or wedged and killed above): they are ours now.
    for _ in range(3):
        left = descendants(me)
        if not left:
            break
        _kill_all(left, signal.SIGKILL)
        _reap(5.0)
    return code if code >= 0 else 128 - code


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    try:
        grace_s = float(args[0])
        if args[1] != "--" or len(args) < 3 or grace_s < 0:
            raise ValueError
    except (IndexError, ValueError):
        print(USAGE, file=sys.stderr)
        return 2
    return run(args[2:], grace_s)


if __name__ == "__main__":
    sys.exit(main())
