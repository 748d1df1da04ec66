"""What a check returns: findings with a severity, the cause in words, the exact fix, and the evidence.

The records live in :mod:`torchrig.findings` (one vocabulary for every subsystem); the doctor uses the
probe words of that scale, ``error``, ``warning``, ``info`` and ``ok`` (``schema/report.schema.json``).
"""

from __future__ import annotations

from torchrig.findings import Finding, Severity, sort_findings

# The doctor's words, most severe first (its JSON verdict counts each of them).
LEVELS = (Severity.ERROR, Severity.WARNING, Severity.INFO, Severity.OK)

__all__ = ["LEVELS", "Finding", "Severity", "sort_findings"]
