"""What the ranks' flight records say about a hang: which rank never called which collective.

PyTorch's flight recorder keeps each rank's last collectives (operation, sequence number, shapes, state, the
Python stack that called it) and per process group the last collective enqueued, started and completed.
NCCL dumps it when its watchdog fires; ``torchrig launch`` also asks every rank for it when it stops a hung
job (``torchrig.launch.worker``), for any backend that records (NCCL, and gloo in recent releases).

This module is the pure reading: ``load`` a dump (PyTorch's pickle of plain data, or its JSON), then
``analyze`` the ranks' records into a ``FlightVerdict``. The pickles are read with an unpickler that refuses
every class, so a dump can only ever yield dicts, lists, strings and numbers, never run code.
``torchfrtrace`` (PyTorch's own analyser) reads the same files in more depth.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig import safepickle
from torchrig.errors import InputError
from torchrig.inputfiles import read_bytes
from torchrig.launch.ranklog import Frame, user_frame

PREFIX = "nccl_trace_rank_"  # + global rank: PyTorch's file name for a dump, and what torchfrtrace reads
_RANK_RE = re.compile(rf"{PREFIX}(\d+)$")


# Far above a real dump (PyTorch keeps 2000 entries by default, TORCH_FR_BUFFER_SIZE; an H200 dump with
# Python stacks is a few MB): a larger file is not read, so a runaway or foreign file cannot exhaust memory.
MAX_RECORD_BYTES = 64 * 2**20
# What the analysis looks at in one record: the newest entries, the innermost frames of each, the first
# tensors of each: all a verdict needs, and the cost of reading a crafted record stays bounded.
MAX_ENTRIES, MAX_FRAMES, MAX_TENSORS = 100_000, 64, 16


def load(path: str | Path) -> dict[str, Any]:
    """One rank's dump. Raises ``ValueError`` (with the reason) for a file that is not a flight record."""
    try:  # a FIFO, a device or a file past the bound is refused before any byte is read
        data = read_bytes(path, "flight record", max_bytes=MAX_RECORD_BYTES)
    except InputError as e:
        raise ValueError(e.message) from None
    return loads(data, Path(path).name)


def loads(data: bytes, name: str = "the dump") -> dict[str, Any]:
    """A dump's bytes (pickle or JSON) as plain data; ``ValueError`` when they are not a flight record."""
    try:
        record = (
            json.loads(data)
            if data[:1] == b"{"
            else safepickle.loads(data, safepickle.nothing, "a flight record holds plain data only")
        )
    except Exception as e:  # a truncated or foreign file: any unpickling error
        raise ValueError(f"{name} is not a flight record ({e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("entries", []), list):
        raise ValueError(f"{name} is not a flight record (no entries)")
    return record


def rank_of(path: str | Path) -> int | None:
    """The global rank in a dump's file name (``nccl_trace_rank_3`` -> 3)."""
    m = _RANK_RE.search(Path(path).name)
    return int(m[1]) if m else None


def load_all(paths: list[str] | tuple[str, ...]) -> tuple[dict[int, dict[str, Any]], tuple[str, ...]]:
    """``{global rank: record}`` for the readable dumps, and a note for each file that could not be read."""
    records, problems = {}, []
    for p in paths:
        rank = rank_of(p)
        if rank is None:
            continue
        try:
            records[rank] = load(p)
        except ValueError as e:
            problems.append(f"rank {rank}: {e}")
    return records, tuple(problems)


@dataclass(frozen=True)
class Call:
    """One collective as a rank's flight record has it."""

    seq: int
    op: str  # e.g. "nccl:all_reduce"
    shapes: str  # e.g. "Float[1048576]"
    where: str | None  # the innermost frame of the caller outside Python's and torch's files

    def __str__(self) -> str:
        return f"#{self.seq} ({self.op} {self.shapes})"

    def at(self) -> str:
        return f" at {self.where}" if self.where else ""


@dataclass(frozen=True)
class GroupState:
    """One rank's position in one process group."""

    enqueued: int  # the last collective this rank called (0: none)
    started: int  # the last one the GPU started (-1: unknown, as with gloo)
    completed: int  # the last one that completed
    calls: tuple[Call, ...]  # the recorded collectives after the last completed one, oldest first


@dataclass(frozen=True)
class FlightVerdict:
    headline: str
    culprits: tuple[int, ...]  # global ranks at fault, when the records name them
    details: tuple[str, ...]  # one line per finding: a group's state, a missing or unreadable record
    waiting: tuple[int, ...] = ()  # global ranks with a collective pending (called, not completed): victims


# ---- a record is data from a file: every value is read through these, whatever its type


def _int(value: Any, default: int) -> int:
    """An integer field (PyTorch writes ints; a JSON dump may hold numeric strings); ``default`` else."""
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return int(value)
    if isinstance(value, str) and len(value) <= 20:
        try:
            return int(value)
        except ValueError:
            return default
    return default


def _text(value: Any, default: str = "?") -> str:
    """A string field, shortened; numbers as text; anything else ``default``."""
    if isinstance(value, str):
        return value[:300]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 2**63:
        return str(value)
    return default


def _items(value: Any, limit: int) -> list[Any]:
    """The first ``limit`` items of a list or tuple field (anything else: none)."""
    return list(value[:limit]) if isinstance(value, (list, tuple)) else []


def _group_of(entry: Mapping[str, Any]) -> str:
    """The name of the process group an entry belongs to (``process_group``: (name, description))."""
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)):
        return _text(group[0], "") if group else ""
    return _text(group, "")


def _where(frames: Any) -> str | None:
    """The caller's innermost frame in user code, as the stack summary picks it (``ranklog.user_frame``)."""
    stack = tuple(
        Frame(_text(f.get("filename"), ""), _int(f.get("line"), 0), _text(f.get("name")))
        for f in _items(frames, MAX_FRAMES)
        if isinstance(f, dict) and _text(f.get("filename"), "")
    )
    found = user_frame(stack)
    return str(found) if found else None


def _shapes(entry: Mapping[str, Any]) -> str:
    dtypes = _items(entry.get("input_dtypes"), MAX_TENSORS)
    sizes = _items(entry.get("input_sizes"), MAX_TENSORS)
    parts = [f"{_text(d)}{[_int(n, -1) for n in _items(s, 8)]}" for d, s in zip(dtypes, sizes, strict=False)]
    return ", ".join(parts) if parts else "-"


def _call(entry: Mapping[str, Any]) -> Call:
    return Call(
        seq=_int(entry.get("collective_seq_id"), 0),
        op=_text(entry.get("profiling_name")),
        shapes=_shapes(entry),
        where=_where(entry.get("frames")),
    )


def _group_ranks(config: Any) -> tuple[int, ...] | None:
    """The global ranks of a group from its ``pg_config`` (``"[0, 1]"``), or None when not listed."""
    raw = config.get("ranks") if isinstance(config, Mapping) else None
    if isinstance(raw, str) and len(raw) > 1_000_000:
        return None
    try:
        ranks = ast.literal_eval(raw) if isinstance(raw, str) else raw
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return None
    if not isinstance(ranks, (list, tuple)):
        return None
    found = tuple(_int(r, -1) for r in ranks)
    return found if all(0 <= r < 2**31 for r in found) else None


def _states(records: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[int, GroupState]]:
    """``{group name: {rank: GroupState}}`` from each record's ``pg_status`` and entries."""
    groups: dict[str, dict[int, GroupState]] = {}
    for rank, rec in records.items():
        status = rec.get("pg_status") or {}
        by_group: dict[str, list[Mapping[str, Any]]] = {}
        entries = rec.get("entries")
        for e in entries[-MAX_ENTRIES:] if isinstance(entries, list) else ():
            if isinstance(e, dict) and not e.get("is_p2p"):
                by_group.setdefault(_group_of(e), []).append(e)
        for key, st in status.items() if isinstance(status, dict) else ():
            pg = _text(key, "")
            if not isinstance(st, dict) or not pg:
                continue
            done = _int(st.get("last_completed_collective"), -1)
            calls = sorted(
                (c for c in map(_call, by_group.get(pg, ())) if c.seq > done),
                key=lambda c: c.seq,
            )
            groups.setdefault(pg, {})[rank] = GroupState(
                enqueued=_int(st.get("last_enqueued_collective"), -1),
                started=_int(st.get("last_started_collective"), -1),
                completed=done,
                calls=tuple(calls),
            )
    return groups


def _names(ranks: list[int] | tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _config(rec: Mapping[str, Any], pg: str) -> Mapping[str, Any]:
    """A group's ``pg_config`` entry. gloo (torch 2.13) files its only group under the name "" while
    ``pg_status`` and the entries call it "0": a lone unnamed entry is taken for a lone group."""
    configs = rec.get("pg_config") or {}
    if not isinstance(configs, dict):
        return {}
    if pg in configs and isinstance(configs[pg], dict):
        return configs[pg]
    status = rec.get("pg_status") or {}
    if (
        list(configs) == [""]
        and isinstance(status, dict)
        and len(status) == 1
        and isinstance(configs[""], dict)
    ):
        return configs[""]
    return {}


def _verb(ranks: Any, one: str, many: str) -> str:
    return one if len(ranks) == 1 else many


def _label(pg: str, records: Mapping[int, Mapping[str, Any]]) -> str:
    for rec in records.values():
        desc = _text(_config(rec, pg).get("desc"), "")
        entries = rec.get("entries")
        for e in entries[-MAX_ENTRIES:] if isinstance(entries, list) and not desc else ():
            group = e.get("process_group") if isinstance(e, dict) else None
            if isinstance(group, (list, tuple)) and len(group) == 2 and _text(group[0], "") == pg:
                desc = _text(group[1], "")
                if desc:
                    break
        if desc:
            return f"process group {pg} ({desc})"
    return f"process group {pg}"


def _find(states: Mapping[int, GroupState], seq: int) -> Call | None:
    for st in states.values():
        for c in st.calls:
            if c.seq == seq:
                return c
    return None


GroupFinding = tuple[int, str, tuple[int, ...], str, tuple[int, ...]]


def _group_finding(
    pg: str,
    states: dict[int, GroupState],
    expected: tuple[int, ...] | None,
    label: str,
    present: set[int] | None = None,
) -> GroupFinding | None:
    """(severity, headline, culprits, detail, waiting ranks) for one group, or None when nothing is pending in it.
    Severity orders the findings across groups: a named culprit first, then a desync, then a stuck call.
    ``present``: the ranks that ran here (the others' records are on their own nodes)."""
    here = set(expected or ()) if present is None else set(expected or ()) & present
    missing = sorted(here - set(states))
    waiting = {r: st for r, st in states.items() if st.completed < st.enqueued}
    positions = "; ".join(
        f"rank {r}: called #{st.enqueued}, completed #{st.completed}" for r, st in sorted(states.items())
    )
    detail = f"{label}: {positions}" + (f"; no record from {_names(missing)}" if missing else "")
    if not waiting:
        return None
    return _never_called(states, label, detail) or _desync_or_pending(states, waiting, missing, label, detail)


def _never_called(states: dict[int, GroupState], label: str, detail: str) -> GroupFinding | None:
    """Some ranks called fewer collectives than the others: they never called the one the others wait in."""
    top = max(st.enqueued for st in states.values())
    behind = sorted(r for r, st in states.items() if st.enqueued < top)
    if not behind:
        return None
    ahead = sorted(r for r, st in states.items() if st.enqueued == top)
    first = min(states[r].enqueued for r in behind) + 1
    call = _find({r: states[r] for r in ahead}, first)
    last = {r: states[r].enqueued for r in behind}
    lasts = ", ".join(f"rank {r} last called #{n}" for r, n in sorted(last.items()))
    what, at = (str(call), call.at()) if call else (f"#{first}", "")
    return (
        0,
        f"{_names(behind)} never called collective {what} of {label}, which {_names(ahead)} "
        f"{_verb(ahead, 'waits', 'wait')} in{at} ({lasts})",
        tuple(behind),
        detail,
        tuple(ahead),
    )


def _desync_or_pending(
    states: dict[int, GroupState],
    waiting: dict[int, GroupState],
    missing: list[int],
    label: str,
    detail: str,
) -> GroupFinding:
    """Every rank called the same number of collectives: do they agree on the first pending one? If they do,
    a rank without a record is the culprit; else the call is stuck (on the GPU or on the link)."""
    first = min(st.completed for st in waiting.values()) + 1
    seen = {r: c for r, st in states.items() for c in st.calls if c.seq == first}
    pending = tuple(sorted(waiting))
    if len({(c.op, c.shapes) for c in seen.values()}) > 1:
        calls = "; ".join(f"rank {r}: {c.op} {c.shapes}{c.at()}" for r, c in sorted(seen.items()))
        return (
            1,
            f"the ranks called collective #{first} of {label} differently ({calls}): a desync",
            (),
            detail,
            pending,
        )
    call = next(iter(seen.values()), None)
    what, at = (str(call), call.at()) if call else (f"#{first}", "")
    if missing:
        return (
            0,
            f"{_names(sorted(waiting))} {_verb(waiting, 'waits', 'wait')} in collective {what} of {label}{at}; "
            f"{_names(missing)} left no flight record (died, or hung where it could not write one)",
            tuple(missing),
            detail,
            pending,
        )
    why = _why_stuck(states, waiting, call, first)
    return (
        2,
        f"collective {what} of {label}{at} is pending on {_names(sorted(waiting))}: {why}",
        (),
        detail,
        pending,
    )


def _why_stuck(states: dict[int, GroupState], waiting: dict[int, GroupState], call: Any, first: int) -> str:
    nccl = call is not None and call.op.startswith("nccl:")
    not_started = sorted(r for r, st in waiting.items() if nccl and st.started < first)
    if not_started and len(not_started) == len(states):
        return "it never started on the GPU: the work queued ahead of it there has not finished"
    if not_started:
        return (
            f"it never started on {_names(not_started)}'s GPU (the work queued ahead of it there has not "
            "finished), while the others wait for it"
        )
    return "every rank called it and it did not complete: a slow or stuck link, or a peer outside the records"


def analyze(
    records: Mapping[int, Mapping[str, Any]], problems: tuple[str, ...] = (), present: set[int] | None = None
) -> FlightVerdict | None:
    """The verdict of the records of one attempt's ranks (``{global rank: record}``); None without records.
    ``present``: the global ranks that ran on this node, when known; a rank of another node without a record
    here is not taken for one that left none."""
    if not records:
        return FlightVerdict("no flight record could be read", (), problems) if problems else None
    groups = _states(records)
    findings, details = [], []
    for pg in sorted(groups, key=lambda g: (len(g), g)):
        expected = next(
            (r for rec in records.values() if (r := _group_ranks(_config(rec, pg))) is not None),
            None,
        )
        found = _group_finding(pg, groups[pg], expected, _label(pg, records), present)
        if found:
            findings.append(found)
            details.append(found[3])
    details += [f"unreadable record: {p}" for p in problems]
    if not findings:
        n = len(records)
        return FlightVerdict(
            f"no collective is pending in the flight records of {n} rank(s): the hang is outside communication",
            (),
            tuple(details),
        )
    _, headline, culprits, _, waiting = min(findings, key=lambda f: f[0])
    return FlightVerdict(headline, culprits, tuple(details), waiting)


def render(verdict: FlightVerdict) -> list[str]:
    return [f"flight record: {verdict.headline}"] + [f"  {d}" for d in verdict.details]
