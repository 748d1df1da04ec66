"""The one severity scale every subsystem reports on, and the diagnostic finding record.

Two families of words sit on one scale, ordered by :attr:`Severity.rank` (higher is worse):

- rank 0, ``ok``: a passed probe (``doctor``, launch pre-flight);
- rank 1, ``info``: worth knowing, changes nothing (every subsystem);
- rank 2, ``caveat`` (a compatibility judgment: it runs, with a catch; ``check``, ``resolve``, ``matrix``,
  ``up``'s pre-flight) or ``warning`` (a probe's outcome: it will bite later; ``doctor``, launch pre-flight);
- rank 3, ``fail`` (a compatibility judgment: it does not run) or ``error`` (a probe's outcome: broken now).

``caveat``/``warning`` and ``fail``/``error`` share a rank: the words stay what each command's ``--json``
has always printed (``check --json`` reasons, ``doctor``'s ``report.schema.json``), while code compares
ranks and the properties below, never strings.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Severity(str, enum.Enum):
    OK = "ok"
    INFO = "info"
    CAVEAT = "caveat"
    WARNING = "warning"
    FAIL = "fail"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """0 (passed) … 3 (blocks): higher is worse."""
        return _RANK[self]

    @property
    def passed(self) -> bool:
        """Rank 0: a probe that passed."""
        return self.rank == 0

    @property
    def cautions(self) -> bool:
        """Rank 2, a caveat or a warning: it runs, with a catch."""
        return self.rank == 2

    @property
    def is_problem(self) -> bool:
        """A caveat/warning or worse: ``doctor`` exits 1, ``up`` reports it."""
        return self.rank >= 2

    @property
    def blocks(self) -> bool:
        """A failure/error: the build does not run, the launch stops."""
        return self.rank >= 3


_RANK = {
    Severity.OK: 0,
    Severity.INFO: 1,
    Severity.CAVEAT: 2,
    Severity.WARNING: 2,
    Severity.FAIL: 3,
    Severity.ERROR: 3,
}


def worst(severities: Iterable[Severity], default: Severity = Severity.OK) -> Severity:
    """The highest-ranked severity (the first of equal rank), or ``default`` for none."""
    return max(severities, key=lambda s: s.rank, default=default)


@dataclass(frozen=True)
class Finding:
    """What a diagnostic check returns: ``(id, severity, summary, cause, fix, evidence)``."""

    id: str  # stable, dotted: "driver.missing", "container.no_gpu_access"
    severity: Severity
    summary: str  # one line: what is wrong
    cause: str = ""  # why, in a sentence or two
    fix: tuple[str, ...] = ()  # commands (or steps) that fix it, in order
    evidence: tuple[str, ...] = ()  # the probed facts that show it


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first; within a severity, the order the checks ran (root causes are checked first)."""
    return sorted(findings, key=lambda f: -f.severity.rank)
