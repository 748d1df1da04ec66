"""Is a hung rank waiting for a collective on the GPU? NCCL collectives are asynchronous: a rank whose peer
never joins does not block inside the Python collective call but at its next host sync (``.item()``,
``.cpu()``, ``torch.cuda.synchronize()``, a ``work.wait()``), and its NCCL watchdog may already have logged
the timed-out collective. Both facts come from the rank's own log and the source line of its stack.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Callable
from dataclasses import dataclass

# A line of Python that blocks the host until the GPU's queue (with any pending collective) has run.
_SYNC_RE = re.compile(
    r"\.(?P<call>item|cpu|tolist|numpy|synchronize|wait)\(\)|(?P<sync>synchronize)\(|\.to\([\"']cpu"
)
# ProcessGroupNCCL.cpp's watchdog (torch 2.11 wording, recorded in tests/fixtures/launch/nccl-2rank-h200-*).
_NCCL_TIMEOUT_RE = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r".*?ran for (?P<ms>\d+) milliseconds"
)

SourceLine = Callable[[str, int], str]


@dataclass(frozen=True)
class GpuWait:
    how: str  # e.g. "blocked in .item() behind a pending collective"
    nccl_timeout: str | None  # e.g. "ALLREDUCE #11 timed out after 15 s (NCCL watchdog)"


def nccl_timeout(text: str) -> str | None:
    m = _NCCL_TIMEOUT_RE.search(text)
    if not m:
        return None
    return f"{m['op']} #{m['seq']} timed out after {int(m['ms']) // 1000} s (NCCL watchdog)"


def sync_call(path: str, line: int, source: SourceLine = linecache.getline) -> str | None:
    """The host-sync call on ``path:line`` (``".item()"``), or None."""
    m = _SYNC_RE.search(source(path, line) or "")
    if not m:
        return None
    return f".{m['call']}()" if m["call"] else "synchronize()" if m["sync"] else ".to('cpu')"


def gpu_wait(
    text: str, path: str | None, line: int | None, source: SourceLine = linecache.getline
) -> GpuWait | None:
    """How the rank waits on the GPU for a collective, if its log or innermost user line shows it."""
    timed_out = nccl_timeout(text)
    call = sync_call(path, line, source) if path and line else None
    if call:
        return GpuWait(f"blocked in {call}, a host sync behind a pending collective", timed_out)
    if timed_out:
        return GpuWait("waiting for a collective that timed out on the GPU", timed_out)
    return None
