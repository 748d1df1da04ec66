"""One severity scale for every subsystem (torchrig.findings), and no string comparisons of it."""

from __future__ import annotations

import re
from pathlib import Path

from torchrig.findings import Finding, Severity, sort_findings, worst

SRC = Path(__file__).resolve().parents[2] / "src" / "torchrig"


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))]


def test_exactly_one_severity_class_in_src() -> None:
    found = [str(p.relative_to(SRC)) for p, text in _sources() if re.search(r"^class Severity\b", text, re.M)]
    assert found == ["findings.py"]


def test_no_severity_compared_as_a_string() -> None:
    pattern = re.compile(r"severity\.value\s*(==|!=|in\b)|severity\s*(==|!=)\s*['\"]")
    hits = [f"{p.relative_to(SRC)}:{m.group(0)}" for p, text in _sources() for m in pattern.finditer(text)]
    assert hits == []


def test_every_subsystem_uses_the_shared_enum() -> None:
    from torchrig.compat import Severity as compat_severity
    from torchrig.doctor.findings import Severity as doctor_severity
    from torchrig.launch.preflight import Severity as launch_severity
    from torchrig.runtime.preflight import Severity as runtime_severity

    assert compat_severity is doctor_severity is launch_severity is runtime_severity is Severity


def test_ranks_put_each_vocabulary_in_order_and_synonyms_level() -> None:
    assert [s.rank for s in (Severity.OK, Severity.INFO, Severity.WARNING, Severity.ERROR)] == [0, 1, 2, 3]
    assert [s.rank for s in (Severity.INFO, Severity.CAVEAT, Severity.FAIL)] == [1, 2, 3]
    assert Severity.CAVEAT.rank == Severity.WARNING.rank and Severity.FAIL.rank == Severity.ERROR.rank
    assert [s for s in Severity if s.is_problem] == [
        Severity.CAVEAT,
        Severity.WARNING,
        Severity.FAIL,
        Severity.ERROR,
    ]
    assert [s for s in Severity if s.blocks] == [Severity.FAIL, Severity.ERROR]
    assert (
        worst([]) is Severity.OK and worst([Severity.INFO, Severity.FAIL, Severity.CAVEAT]) is Severity.FAIL
    )


def test_sort_findings_most_severe_first_stable_within_a_level() -> None:
    fs = [
        Finding("a.x", Severity.OK, "a"),
        Finding("b.x", Severity.WARNING, "b"),
        Finding("c.x", Severity.ERROR, "c"),
    ]
    fs.append(Finding("d.x", Severity.WARNING, "d"))
    assert [f.id for f in sort_findings(fs)] == ["c.x", "b.x", "d.x", "a.x"]


def test_json_words_unchanged() -> None:
    """``check --json`` reasons print info/caveat/fail; ``doctor``'s schema has error/warning/info/ok."""
    import json

    schema = json.loads((SRC / "doctor" / "schema" / "report.schema.json").read_text())
    finding = schema["properties"]["findings"]["items"]["properties"]["severity"]["enum"]
    from torchrig.doctor.findings import LEVELS

    assert finding == [s.value for s in LEVELS]
    assert {s.value for s in Severity} == {"ok", "info", "caveat", "warning", "fail", "error"}


def test_check_json_keeps_the_compatibility_words() -> None:
    """``check --json`` reasons say info/caveat/fail (scripts match on them), for a pass, a caveat and a fail."""
    from torchrig.compat import check, load_kb

    kb = load_kb()
    seen: set[str] = set()
    for gpu, driver, build in [
        ("RTX 5090", "570.86.10", "2.7.0+cu128"),  # works
        ("RTX 5090", "570.86.10", "2.6.0+cu124"),  # fails
        ("A100-SXM4-80GB", "535.104.05", "2.8.0+cu128"),  # minor-version compatibility: a caveat
    ]:
        result = check(kb, [kb.find_gpu(gpu)], driver, kb.find_build(build)).to_json()
        seen |= {r["severity"] for r in result["reasons"]}
    assert seen == {"info", "caveat", "fail"}
