"""Result objects and their two views: the human text and ``--json``.

Every command returns an object that satisfies :class:`Report`. The CLI prints ``render_text()`` to
stdout, or with ``--json`` the ``to_json()`` dictionary (which always carries ``schema_version`` and
``command``). Progress and logs go to stderr, never stdout.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

SCHEMA_VERSION = 1


@runtime_checkable
class Report(Protocol):
    """What a command returns."""

    def to_json(self) -> dict[str, Any]: ...

    def render_text(self) -> str: ...

    @property
    def exit_code(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class SimpleReport:
    """A report built from ready data and text, for commands whose result is small."""

    data: dict[str, Any]
    text: str
    code: int = 0

    def to_json(self) -> dict[str, Any]:
        return self.data

    def render_text(self) -> str:
        return self.text

    @property
    def exit_code(self) -> int:
        return self.code


def jsonable(obj: Any) -> Any:
    """Turn dataclasses, enums, paths, tuples and sets into JSON-ready values (None stays None)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    return obj


def dump_json(command: str, report: Report) -> str:
    payload = {"schema_version": SCHEMA_VERSION, "command": command}
    payload.update(jsonable(report.to_json()))
    return json.dumps(payload, indent=2, sort_keys=False)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, indent: str = "") -> str:
    """A plain aligned text table (no dependency, so light commands stay light)."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))

    def line(parts: Sequence[str]) -> str:
        return indent + "  ".join(p.ljust(widths[i]) for i, p in enumerate(parts)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)
