"""Read what torchrun leaves on disk and on its console into ``ranklog.RankLog`` records.

torchrun's ``--log-dir D`` layout: ``D/<rdzv_id>_<suffix>/attempt_<k>/<local_rank>/{stdout,stderr}.log``
and ``error.json`` (written by torchelastic's ``record`` when a rank raises).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from torchrig.errors import InputError
from torchrig.inputfiles import open_regular, read_from, read_head, read_json, read_proc
from torchrig.launch.ranklog import RankLog, parse_header, parse_stack

OUTPUT_LOG = "output.log"  # the worker's merged, timestamped stream (``worker.OUTPUT_LOG``)
# in an error file's extraInfo: the worker wrote it (a caught exception, or a failing sys.exit), with the status
EXIT_CODE_KEY = "torchrig_exit_code"
# What is read of one rank's log: its head (the worker's header) and its tail (the traceback, the last
# output); a log past the two is read as those two ends, so a runaway log cannot exhaust memory.
LOG_HEAD_BYTES = 64 * 1024
LOG_TAIL_BYTES = 8 * 2**20

_FAILED_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_SIGTERM_RE = re.compile(r"Sending process (\d+) closing signal SIGTERM")
_BLOCK_RE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")


def run_dirs(log_dir: Path, rdzv_id: str, since_s: float) -> list[Path]:
    """torchrun's per-run directories for this rdzv id created since ``since_s`` (newest last)."""
    if not log_dir.is_dir():
        return []
    found = [
        p
        for p in log_dir.iterdir()
        if p.is_dir() and p.name.startswith(f"{rdzv_id}_") and p.stat().st_mtime >= since_s - 1
    ]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def attempts(run_dir: Path) -> list[Path]:
    found = [p for p in run_dir.glob("attempt_*") if p.name[8:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[8:]))


def exit_codes_by_pid(agent_output: str) -> dict[int, int]:
    """pid -> exit code, from torchrun's console report (SIGTERM'd survivors get -15)."""
    codes: dict[int, int] = {}
    for m in _SIGTERM_RE.finditer(agent_output):
        codes.setdefault(int(m[1]), -15)
    for m in _FAILED_RE.finditer(agent_output):
        codes[int(m[3])] = int(m[1])
    for m in _BLOCK_RE.finditer(agent_output):
        codes[int(m[4])] = int(m[3])
    return codes


def closed_by_agent(agent_output: str) -> frozenset[int]:
    """The pids torchrun itself sent its closing signal (the survivors, after a rank failed or a stop): a
    rank that ended by SIGTERM and is not among them was terminated from outside the job."""
    return frozenset(int(m[1]) for m in _SIGTERM_RE.finditer(agent_output))


def _read(path: Path) -> str:
    """A rank's log as text: the whole of it up to ``LOG_HEAD_BYTES + LOG_TAIL_BYTES``, else its head (the
    worker's header) and its tail (the traceback), never the whole of a runaway log. A missing log is "";
    one that cannot be read (a FIFO, a device, unreadable) is a one-line note in its place."""
    if not os.path.lexists(path):
        return ""
    try:
        with open_regular(path, "rank log") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(LOG_HEAD_BYTES + LOG_TAIL_BYTES)
            if size > len(data):  # more than the bound: keep the head, then the last LOG_TAIL_BYTES
                fh.seek(max(size - LOG_TAIL_BYTES, LOG_HEAD_BYTES))
                left_out = fh.tell() - LOG_HEAD_BYTES
                data = (
                    data[:LOG_HEAD_BYTES]
                    + f"\n[{left_out:,} bytes left out]\n".encode()
                    + fh.read(LOG_TAIL_BYTES)
                )
    except InputError as err:
        return f"[torchrig: {err.message}]"
    except OSError as err:
        return f"[torchrig: cannot read {path}: {err.strerror or err}]"
    return data.decode(errors="replace")


def _error_file(path: Path) -> tuple[str | None, str | None, bool]:
    """(message, traceback, handled) from torchelastic's error.json; ``handled``: the script caught the exception
    itself and then exited with a failing status (the worker recorded it so)."""
    if not os.path.lexists(path):
        return None, None, False
    try:
        data = read_json(path, "error file", max_bytes=LOG_TAIL_BYTES)
        msg = data.get("message", {})
        if not isinstance(msg, dict):
            return str(msg), None, False
        extra = msg.get("extraInfo") or {}
        trace = extra.get("py_callstack")
        return str(msg.get("message")), str(trace) if trace else None, EXIT_CODE_KEY in extra
    except (InputError, AttributeError):
        return None, None, False


def rank_pids(attempt_dir: Path) -> dict[int, int | None]:
    """pid -> global rank of an attempt's ranks, from the worker's header near the top of each stderr.log
    (read cheaply: the watcher calls this twice a second)."""
    out: dict[int, int | None] = {}
    for f in attempt_dir.glob("*/stderr.log"):
        try:
            head = parse_header(read_head(f, "rank log", max_bytes=65536).decode(errors="replace")) or {}
        except InputError:
            continue
        if head.get("pid", "").isdigit():
            out[int(head["pid"])] = int(head["rank"]) if head.get("rank", "").isdigit() else None
    return out


def process_state(pid: int | None) -> str | None:
    """The state letter of ``/proc/PID/stat`` (R, S, D, T stopped, t traced, Z zombie), or None if gone."""
    if pid is None:
        return None
    text = read_proc(f"/proc/{pid}/stat", max_bytes=4096)
    if text is None or ")" not in text:
        return None
    return text[text.rindex(")") + 2 :].split(" ", 1)[0] or None


def read_attempt(
    attempt_dir: Path, codes: dict[int, int], closed: frozenset[int] = frozenset(), states: bool = False
) -> list[RankLog]:
    """One RankLog per local rank directory of an attempt (``closed``: the pids torchrun sent its closing
    signal; ``states``: read each live rank's process state)."""
    out = []
    k = int(attempt_dir.name[8:])
    for d in sorted(
        (p for p in attempt_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    ):
        text = _read(d / "stdout.log") + "\n" + _read(d / "stderr.log")
        message, trace, handled = _error_file(d / "error.json")
        head = parse_header(text) or {}
        pid = int(head["pid"]) if head.get("pid", "").isdigit() else None
        rank = int(head["rank"]) if head.get("rank", "").isdigit() else None
        world = int(head["world"]) if head.get("world", "").isdigit() else None
        out.append(
            RankLog(
                global_rank=rank,
                local_rank=int(d.name),
                host=head.get("host"),
                pid=pid,
                attempt=k,
                text=text,
                error_message=message,
                exit_code=codes.get(pid) if pid is not None else None,
                stack=parse_stack(text),
                world_size=world,
                output=_read(d / OUTPUT_LOG),
                closed_by_agent=pid in closed,
                error_trace=trace,
                error_handled=handled,
                state=process_state(pid) if states else None,
            )
        )
    return out


NCCL_WATCHDOG_TIMEOUT = "Watchdog caught collective operation timeout"  # ProcessGroupNCCL's watchdog


class LogTail:
    """The text the ranks of one attempt appended to their logs since the last look, for markers that appear
    while the job runs. Reads only new bytes; a line cut by a read is completed at the next one."""

    def __init__(self) -> None:
        self._pos: dict[Path, int] = {}
        self._rest: dict[Path, str] = {}

    def find(self, attempt_dir: Path, needle: str) -> tuple[int, str] | None:
        """(local rank, the line) of the first new line holding ``needle``, or None."""
        for f in sorted(attempt_dir.glob("*/*.log")):
            if not f.parent.name.isdigit():
                continue
            try:  # at most LOG_TAIL_BYTES a look: a rank that writes faster is read on at the next
                data = read_from(f, "rank log", self._pos.get(f, 0), max_bytes=LOG_TAIL_BYTES)
            except InputError:
                continue
            if not data:
                continue
            self._pos[f] = self._pos.get(f, 0) + len(data)
            lines = (self._rest.pop(f, "") + data.decode(errors="replace")).split("\n")
            self._rest[f] = lines.pop()[-65536:]  # the last, unfinished line (a line past 64 KiB: its end)
            for line in lines:
                if needle in line:
                    return int(f.parent.name), line.strip()
        return None


def activity_mark(run_dir: Path | None) -> tuple[int, float]:
    """(total bytes, newest mtime) of the run's log files: it changes whenever any rank writes."""
    if run_dir is None:
        return (0, 0.0)
    total, newest = 0, 0.0
    for f in run_dir.glob("attempt_*/*/*.log"):
        try:
            st = f.stat()
        except OSError:
            continue
        total += st.st_size
        newest = max(newest, st.st_mtime)
    return total, newest
