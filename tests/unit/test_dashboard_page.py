"""The dashboard's page is rendered from data that users and files control: everything is escaped, and a
bench report that is not one is said so, not crashed on."""

from __future__ import annotations

import json
from pathlib import Path

from torchrig.dashboard import page, state

EVIL = '<script>alert(1)</script>"&'


def _state(**over):
    s = {
        "viewer": EVIL,
        "at_s": 1764600000.0,
        "driver": "580.95.05",
        "cuda": "13.0",
        "inventory": EVIL,
        "gpus": [
            {
                "index": 0,
                "name": EVIL,
                "memory_used_mib": 1,
                "memory_total_mib": 2,
                "utilization_gpu_pct": None,
                "temperature_c": 40,
                "power_w": None,
                "processes": [{"pid": 7, "user": EVIL, "memory_mib": 3, "name": EVIL}],
                "mig": [],
                "holders": [
                    {"user": EVIL, "environment": EVIL, "since_s": 1764600000.0, "shared": True, "unit": "0"}
                ],
            }
        ],
        "environments": [
            {
                "name": EVIL,
                "owner": EVIL,
                "state": "running",
                "status": EVIL,
                "gpus": [EVIL],
                "image": EVIL,
                "created": "",
                "mine": True,
                "access": {"jupyter": "http://127.0.0.1:1/lab?token=" + EVIL, "ssh": EVIL},
            },
        ],
        "bench": {"verdict": EVIL, "summary": {}, "failed": [EVIL], "command": EVIL, "has_plot": True},
        "doctor": {"verdict": EVIL, "findings": [{"severity": EVIL, "summary": EVIL, "id": EVIL}]},
        "notes": [EVIL],
    }
    s.update(over)
    return s


def test_every_value_is_escaped():
    html = page.page(_state(), 5)
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script>") == 1  # the refresh, and nothing else


def test_the_refresh_interval_and_the_empty_server():
    html = page.page(_state(gpus=[], environments=[], bench=None, doctor=None), 7.5)
    assert "7500" in html and "no GPU on this host" in html and "no torchrig environments" in html


def test_a_bench_folder_without_a_report(tmp_path):
    assert state.bench_summary(None) is None
    assert "no readable bench report" in state.bench_summary(str(tmp_path))["verdict"]
    (tmp_path / "bench.json").write_bytes(b"\xff\xfe not json")
    assert "no readable bench report" in state.bench_summary(str(tmp_path))["verdict"]
    (tmp_path / "bench.json").write_text(
        json.dumps({"measurements": {"meta": {"date_utc": "d"}}, "verdict": "ok"})
    )
    assert "no readable bench report" in state.bench_summary(str(tmp_path))["verdict"]


def test_the_bench_panel_reads_the_report_bench_wrote(tmp_path):
    """bench.json is read back as the report it was (bench.run.read_report, through jsonrecords): the panel
    shows its verdict and counts, the figures that failed by their grade, and a damaged one names its key."""
    from torchrig.bench import render
    from torchrig.bench.records import Grade, GradedFigure, measurements_from_json
    from torchrig.bench.run import BenchReport, build_report
    from torchrig.report import dump_json

    fixture = Path(__file__).parents[1] / "fixtures/bench/cpu-gloo-2proc-torch2.13.json"
    m = measurements_from_json(json.loads(fixture.read_text()))
    written = build_report(m, {}, str(tmp_path), plots=False)
    got = state.bench_summary(str(tmp_path))
    assert got is not None and got["verdict"] == render.verdict(written.counts, m)
    assert (got["summary"], got["date_utc"], got["failed"]) == (written.counts, m.meta.date_utc, [])
    slow = GradedFigure("gemm.bf16.rank0", "GEMM", 1.0, "TFLOP/s", 100.0, "peak", 0.01, Grade.FAIL)
    (tmp_path / "bench.json").write_text(dump_json("bench", BenchReport(m, (*written.findings, slow))))
    assert state.bench_summary(str(tmp_path))["failed"] == ["gemm.bf16.rank0"]
    data = json.loads((tmp_path / "bench.json").read_text())
    data["findings"][-1]["grade"] = "great"
    (tmp_path / "bench.json").write_text(json.dumps(data))
    assert "bench.json.findings[" in state.bench_summary(str(tmp_path))["verdict"]


def test_the_doctor_panel_leaves_out_passed_checks_by_their_rank(monkeypatch):
    """The panel keeps every finding that did not pass (Severity.passed: ranks, not words), in doctor's order."""
    import torchrig.doctor
    import torchrig.doctor.probes
    from torchrig.dashboard.state import doctor_verdict
    from torchrig.doctor.facts import load_facts
    from torchrig.doctor.report import DoctorReport
    from torchrig.findings import Finding, Severity

    facts = load_facts(Path(__file__).parents[1] / "fixtures/doctor/container-without-gpus-h200.json")
    found = tuple(Finding(f"x.{s.value}", s, f"{s.value} summary") for s in Severity)
    monkeypatch.setattr(torchrig.doctor.probes, "collect", lambda options: facts)
    monkeypatch.setattr(torchrig.doctor, "diagnose", lambda facts, areas: DoctorReport(facts, found, 1.0))
    got = doctor_verdict()["findings"]
    assert [f["id"] for f in got] == ["x.info", "x.caveat", "x.warning", "x.fail", "x.error"]
    assert got[-1] == {"severity": "error", "summary": "error summary", "id": "x.error"}
