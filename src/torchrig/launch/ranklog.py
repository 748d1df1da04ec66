"""What one rank's log says: the records read from a rank's files and the readers of their text.

``RankLog`` is one rank's log of one attempt (built from its files by ``torchrig.launch.logs``); the readers
here find in it the stack a rank was in (faulthandler's dump), its last traceback, the script's own frame
(``where_of``), its last exception and its last informative lines (``tail``). Pure: text in, records out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


def in_backward(stack: tuple[Frame, ...]) -> bool:
    """The main thread is in autograd's backward: with DDP, where its gradient all-reduce waits."""
    return any(
        "torch/autograd/" in f.path or (f.func == "backward" and "torch/_tensor.py" in f.path) for f in stack
    )


# gloo names the lost peer either after the word ("Connection closed by peer [ADDR]:PORT") or before it
# ("Read error [ADDR]:PORT: Connection reset by peer"), depending on which side saw the reset first.
_PEER_RE = re.compile(
    r"\[([0-9A-Za-z.:_-]+)\]:(\d+):? [^\n]{0,30}\bpeer\b"
    r"|(?:peer|remote)[^\[\n]{0,40}\[([0-9A-Za-z.:_-]+)\]:(\d+)"
)


def lost_peers(text: str) -> list[str]:
    """Addresses of peers a rank lost its connection to (gloo and NCCL name them in the error)."""
    return sorted({m[1] or m[3] for m in _PEER_RE.finditer(text)})
