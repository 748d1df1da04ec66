"""What a check returns: findings with a severity, the cause in words, the exact fix, and the evidence."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(str, enum.Enum):
    """``error`` blocks CUDA; ``warning`` bites later; ``info`` is worth knowing; ``ok`` is a passed check."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    OK = "ok"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "info": 2, "ok": 3}[self.value]

    @property
    def is_problem(self) -> bool:
        """Errors and warnings make ``torchrig doctor`` exit 1."""
        return self in (Severity.ERROR, Severity.WARNING)


@dataclass(frozen=True)
class Finding:
    id: str  # stable, dotted: "driver.missing", "container.no_gpu_access"
    severity: Severity
    summary: str  # one line: what is wrong
    cause: str = ""  # why, in a sentence or two
    fix: tuple[str, ...] = ()  # commands (or steps) that fix it, in order
    evidence: tuple[str, ...] = ()  # the probed facts that show it


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, the order the checks ran (root causes are checked first)."""
    return sorted(findings, key=lambda f: f.severity.rank)
