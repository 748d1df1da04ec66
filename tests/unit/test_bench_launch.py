"""bench's workers through the launch API: their output feeds the progress display, and a failed run is
reported by launch's failure summary (the rank, its cause), never as a bare exit status."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from torchrig.bench.config import make_config
from torchrig.bench.launch import _Console, _raise_unless_done, worker_job
from torchrig.bench.worker import PROGRESS_TAG
from torchrig.errors import JobFailed
from torchrig.findings import Finding, Severity
from torchrig.launch.plan import HostFacts, build_plan
from torchrig.launch.run import LaunchReport
from torchrig.launch.summary import FailureSummary, RankVerdict


def test_progress_lines_drive_the_display_and_the_rest_goes_to_on_line():
    steps, lines = [], []
    console = _Console(lambda d, t, label: steps.append((d, t, label)), lines.append)
    event = json.dumps({"done": 2, "total": 5, "label": "all_reduce 1024 B"})
    console.write(f"[default0]:{PROGRESS_TAG}{event}\n")
    console.write(f"[rank0]:{PROGRESS_TAG}{event[:10]}\n")  # cut short: shown as a line, not a crash
    console.write("[default1]:hello\n\n")
    console.flush()
    assert steps == [(2, 5, "all_reduce 1024 B")]
    assert lines == [f"[rank0]:{PROGRESS_TAG}{event[:10]}", "[default1]:hello"]
    _Console(lambda *a: None, None).write("dropped without --debug\n")


def _job(tmp_path):
    return worker_job(make_config(device_kind="cpu", quick=True), 2, str(tmp_path))


def _report(tmp_path, findings=(), result=None) -> LaunchReport:
    host = HostFacts(visible_gpus=(), cpu_count=2, python="python3", env={})
    return LaunchReport(build_plan(_job(tmp_path).request, host, free_port=29999), findings, result, False)


def _result(**kw):
    base = dict(
        exit_code=1, summary=None, cancelled_by=None, stop_reason=None, earlier_failures=(), run_dir="/x",
        agent_log=None, stopped_by=None, elapsed_s=1.0, attempts=1, flight=None, flight_records=(),
    )  # fmt: skip
    return SimpleNamespace(**(base | kw))


def test_a_dead_rank_is_named_with_its_cause(tmp_path, capsys):
    verdict = RankVerdict(1, 1, "vm", "culprit", "killed by SIGKILL", "OOM", None, ("12:00:00.000 step 3",))
    summary = FailureSummary(
        "failed", "rank 1 failed (killed by SIGKILL)", "the host ran out of memory", "lower it", (verdict,), 0
    )
    with pytest.raises(JobFailed) as err:
        _raise_unless_done(_report(tmp_path, result=_result(summary=summary)), _job(tmp_path))
    assert err.value.message == (
        "bench workers failed: rank 1 failed (killed by SIGKILL); likely cause: the host ran out of memory"
    )
    shown = capsys.readouterr().err  # launch's own rendering: the rank, its status and its last lines
    assert "rank 1 (local 1, vm) — culprit: killed by SIGKILL" in shown and "| 12:00:00.000 step 3" in shown


def test_a_failed_preflight_and_a_missing_result_are_said(tmp_path, capsys):
    bad = Finding("port", Severity.ERROR, "port 29999 is taken", fix=("pick another",))
    with pytest.raises(JobFailed, match="not started: the pre-flight port check failed: port 29999 is taken"):
        _raise_unless_done(_report(tmp_path, findings=(bad,)), _job(tmp_path))
    assert "pre-flight port: error: port 29999 is taken — fix: pick another" in capsys.readouterr().err
    with pytest.raises(JobFailed, match="bench workers failed: rank 0 wrote no result"):
        _raise_unless_done(_report(tmp_path, result=_result(exit_code=0)), _job(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        _raise_unless_done(_report(tmp_path, result=_result(cancelled_by="SIGINT")), _job(tmp_path))
    (tmp_path / "measurements.json").write_text("{}")
    _raise_unless_done(_report(tmp_path, result=_result(exit_code=0)), _job(tmp_path))  # done: no error
