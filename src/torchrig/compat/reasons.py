"""The records a compatibility judgment is made of: a :class:`Reason` per finding, the :class:`Verdict` they
add up to, and the :class:`Fix` es offered. Pure data, imported by ``check``, ``resolve``, ``matrix`` and ``fixes``
alike (keeping it apart from ``check`` keeps the compat package free of import circles).

Severities are the compatibility words of the one shared scale (:class:`torchrig.findings.Severity`):
``info``, ``caveat`` and ``fail``; ``check --json`` prints them as they are.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from torchrig.findings import Severity, worst

__all__ = ["Fix", "Reason", "Severity", "Verdict", "verdict_of"]


class Verdict(str, enum.Enum):
    WORKS = "works"
    WORKS_WITH_CAVEATS = "works_with_caveats"
    FAILS = "fails"


@dataclass(frozen=True)
class Reason:
    """One finding. ``code`` is stable (tests and scripts match on it); ``gpu`` is None for driver-wide findings."""

    code: str
    severity: Severity  # Severity.INFO, CAVEAT or FAIL
    message: str
    gpu: str | None = None


@dataclass(frozen=True)
class Fix:
    kind: str  # "variant" (same release, other CUDA) | "release" (another release) | "driver" | "platform"
    pip_command: str | None
    summary: str


def verdict_of(reasons: Sequence[Reason]) -> Verdict:
    """``fails`` if any reason blocks, ``works_with_caveats`` if any is a problem, else ``works``."""
    top = worst((r.severity for r in reasons), default=Severity.INFO)
    if top.blocks:
        return Verdict.FAILS
    return Verdict.WORKS_WITH_CAVEATS if top.is_problem else Verdict.WORKS
