"""``torchrig doctor``: inspect this machine or container and say, most severe first, what is wrong, why,
and the exact command that fixes it.

Layers: ``probes`` (the only code touching the host; each with a timeout) -> ``facts.Facts`` (one frozen,
JSON-serialisable record) -> ``checks`` (pure functions -> ``findings.Finding``) -> ``report.DoctorReport``.

>>> from torchrig.doctor import diagnose
>>> from torchrig.doctor.facts import load_facts
>>> report = diagnose(load_facts("tests/fixtures/doctor/no-driver-debian12.json"))  # doctest: +SKIP
>>> report.findings[0].id  # doctest: +SKIP
'driver.missing'
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from torchrig.doctor.facts import Facts
from torchrig.doctor.report import DoctorReport


def diagnose(
    facts: Facts,
    areas: Iterable[str] | None = None,
    *,
    use_kb: bool = True,
    started: float | None = None,
    strict: bool = True,
) -> DoctorReport:
    """Run every check on ``facts`` and build the report (pure, apart from loading the knowledge base when a
    check needs it)."""
    from torchrig.doctor import kb as kbmod
    from torchrig.doctor.checks import run_checks

    t0 = time.perf_counter() if started is None else started
    findings, kb_state = run_checks(facts, kbmod.load if use_kb else None, areas, strict=strict)
    notes: tuple[str, ...] = (
        ("the compatibility knowledge base could not be loaded: build suggestions were skipped",)
        if kb_state == "unavailable"
        else ()
    )
    if facts.absent:
        shown = ", ".join(facts.absent[:6]) + (
            f" and {len(facts.absent) - 6} more" if len(facts.absent) > 6 else ""
        )
        notes += (
            f"these facts were recorded by an older torchrig and lack {shown}: read as unknown or empty "
            "(record them again for a full diagnosis)",
        )
    elapsed_ms = (time.perf_counter() - t0) * 1000
    return DoctorReport(facts, tuple(findings), elapsed_ms, tuple(areas or ()), kb_state, notes)


__all__ = ["DoctorReport", "diagnose"]
