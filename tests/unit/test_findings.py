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


def test_doctor_and_both_pre_flights_return_the_shared_finding() -> None:
    """One record for ``doctor``, ``launch``'s pre-flight and ``up``'s pre-flight; no other class takes the
    name (bench's graded figures, a measured value against a datasheet peak, are ``GradedFigure``)."""
    from torchrig.doctor.findings import Finding as doctor_finding
    from torchrig.launch.preflight import Finding as launch_finding
    from torchrig.runtime.preflight import Finding as runtime_finding

    assert doctor_finding is launch_finding is runtime_finding is Finding
    found = [
        str(p.relative_to(SRC)) for p, text in _sources() if re.search(r"^class \w*Finding\b", text, re.M)
    ]
    assert found == ["findings.py"]


def test_pre_flight_json_keeps_its_fields() -> None:
    """``launch --json`` and ``up --json`` print the fields they always did (text or null, not lists)."""
    from torchrig.launch.preflight import finding_json as launch_json
    from torchrig.runtime.preflight import finding_json as up_json

    port = Finding(
        "port", Severity.ERROR, "port 29500 in use", cause="a leftover torchrun", fix=("pick another",),
        evidence=("bind failed",),
    )  # fmt: skip
    assert launch_json(port) == {
        "id": "port",
        "severity": "error",
        "summary": "port 29500 in use",
        "cause": "a leftover torchrun",
        "fix": "pick another",
        "evidence": "bind failed",
    }
    ok = Finding("gpus", Severity.OK, "2 GPU(s) selected")
    assert launch_json(ok) == {
        "id": "gpus", "severity": "ok", "summary": "2 GPU(s) selected", "cause": None, "fix": None, "evidence": None,
    }  # fmt: skip
    assert up_json(Finding("driver_too_old", Severity.FAIL, "old", fix=("upgrade",))) == {
        "code": "driver_too_old", "severity": "fail", "summary": "old", "fix": "upgrade",
    }  # fmt: skip
    assert up_json(Finding("arch_ptx_jit", Severity.CAVEAT, "jit"))["fix"] is None
