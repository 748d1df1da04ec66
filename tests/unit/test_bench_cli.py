"""torchrig bench's command line: bad input is one line and exit 2; --from-json re-grades; --json follows the schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "bench" / "cpu-gloo-2proc-torch2.13.json"
SCHEMA = ROOT / "src" / "torchrig" / "bench" / "schema.json"


def one_line_usage_error(r, *needles):
    assert r.code == 2, (r.code, r.err)
    assert r.err.startswith("torchrig: error: ") and r.err.strip().count("\n") == 0, r.err
    assert "Traceback" not in r.err
    for n in needles:
        assert n in r.err


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--only", "gemm,colectives"], ["unknown --only value 'colectives'", "did you mean: collectives"]),
        (["--collectives", "all_reduse"], ["did you mean: all_reduce"]),
        (["--dtypes", "int8"], ["unknown --dtypes value 'int8'"]),
        (["--only", ","], ["--only is empty"]),
        (["--max-size", "4XB"], ["malformed --max-size '4XB'"]),
        (["--min-size", "1GiB", "--max-size", "1MiB"], ["--min-size 1 GiB is above --max-size 1 MiB"]),
        (["--nproc-per-node", "0"], ["at least 1"]),
        (["--nproc-per-node", "two"], ["invalid int value"]),
        (["--from-json", "/nonexistent/bench.json"], ["no such file"]),
        (["--frobnicate"], ["unrecognized arguments"]),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, args, needles):
    one_line_usage_error(cli("bench", *args), *needles)


def test_from_json_rejects_files_that_are_not_bench_results(cli, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    one_line_usage_error(cli("bench", "--from-json", str(bad)), "cannot read")
    bad.write_text(json.dumps({"schema_version": 1, "command": "doctor"}))
    one_line_usage_error(cli("bench", "--from-json", str(bad)), "not a torchrig bench result")


def test_from_json_regrades_a_saved_run_and_matches_the_schema(cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    r = cli("bench", "--from-json", str(FIXTURE), "--json", "--out", str(tmp_path), "--no-plots")
    assert r.code == 0, r.err
    data = r.json()
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))
    assert data["summary"]["no GPU"] == len(data["findings"]) > 0
    assert {f["grade"] for f in data["findings"]} == {"no GPU"}
    assert (tmp_path / "bench.md").exists() and (tmp_path / "bench.json").exists()
    # the written bench.json is itself a valid input
    again = cli("bench", "--from-json", str(tmp_path / "bench.json"))
    assert again.code == 0 and "verdict: no GPU" in again.out


def test_schema_rejects_a_broken_report():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    measurements = json.loads(FIXTURE.read_text())
    good = {
        "schema_version": 1,
        "command": "bench",
        "summary": {"pass": 0, "warn": 0, "fail": 0, "no GPU": 0, "unknown": 0},
        "verdict": "",
        "findings": [],
        "measurements": measurements,
        "files": [],
    }
    jsonschema.validate(good, schema)
    broken = json.loads(json.dumps(good))
    broken["measurements"]["collectives"][0]["op"] = "allreduce"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_dry_run_prints_the_torchrun_plan(cli):
    r = cli("bench", "--cpu", "--dry-run", "--json")
    assert r.code == 0, r.err
    plan = r.json()["plan"]
    # the launch API's plan: torchrun, launch's rank shim, then the bench's worker module
    assert plan["argv"][1:4] == ["-m", "torch.distributed.run", "--nnodes=1"]
    assert "--nproc-per-node=2" in plan["argv"] and plan["nproc"] == 2
    shim = plan["argv"].index("torchrig.launch.worker")
    assert plan["argv"][shim : shim + 3] == ["torchrig.launch.worker", "--module", "torchrig.bench.worker"]
    assert plan["env"]["TORCHRIG_LOG_DIR"].endswith("/logs")
    assert r.json()["config"]["device_kind"] == "cpu"
    text = cli("bench", "--cpu", "--dry-run", "--nproc-per-node", "3")
    assert "torch.distributed.run" in text.out and "--nproc-per-node=3" in text.out


def test_help_is_the_manual_and_imports_nothing_heavy(cli):
    r = cli("bench", "--help")
    assert r.code == 0 and "examples:" in r.out and "torchrig bench --quick" in r.out
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torchrig", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    mods = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "torchrig" in mods and not mods & {"torch", "matplotlib", "numpy", "rich"}
