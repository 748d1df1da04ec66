"""``torchrig doctor`` as a user runs it, on replayed facts: exit codes, the JSON schema, the text report, and
one-line usage errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "doctor"
SCHEMA = json.loads((ROOT / "src" / "torchrig" / "doctor" / "schema" / "report.schema.json").read_text())


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("h200x2-driver580-cu130", 0),
        ("cuda-visible-devices-7-h200x2", 1),
        ("shm-64m-container-h200", 1),
        ("no-driver-debian12-cpu-torch", 0),
        ("driver-not-installed-debian12-h200", 1),
    ],
)
def test_json_matches_the_schema_and_exit_code(cli, name, code):
    r = cli("doctor", "--facts", str(FIX / f"{name}.json"), "--json")
    assert r.code == code, r.err
    data = r.json()
    jsonschema.validate(data, SCHEMA)
    assert data["verdict"]["exit_code"] == code


def test_text_report_groups_by_severity_with_fixes(cli):
    r = cli("doctor", "--facts", str(FIX / "cuda-visible-devices-7-h200x2.json"))
    assert r.code == 1
    assert r.out.startswith("torchrig doctor: Ubuntu 24.04.3 LTS, 2x NVIDIA H200, driver 580.159.04")
    assert "ERROR   CUDA_VISIBLE_DEVICES=7 hides every GPU  [env.cuda_visible_devices]" in r.out
    assert "  fix   $ unset CUDA_VISIBLE_DEVICES" in r.out
    assert r.out.rstrip().splitlines()[-1].startswith("verdict: 1 error(s)")


def test_healthy_text(cli):
    r = cli("doctor", "--facts", str(FIX / "h200x1-driver580-cu130.json"))
    assert r.code == 0 and "healthy" in r.out.splitlines()[-1] and "ERROR" not in r.out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--only", "gpus"], "unknown area 'gpus' for --only; did you mean: gpu?"),
        (["--facts", "/nonexistent/facts.json"], "does not exist"),
        (["--facts", "a.json", "--record", "b.json"], "use one of them"),
        (["--facts", "a.json", "--deep"], "--deep probes the GPUs"),
        (["--python", "/nonexistent/python"], "does not exist"),
        (["--timeout", "0"], "--timeout must be positive"),
        (["--timeout", "soon"], "invalid float value"),
        (["--record", "/nonexistent-dir/facts.json"], "does not exist"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_usage_errors_are_one_line_exit_2(cli, args, needle):
    r = cli("doctor", *args)
    assert r.code == 2, (r.out, r.err)
    assert r.err.count("\n") == 1 and r.err.startswith("torchrig: error: ") and "Traceback" not in r.err
    assert needle in r.err


def test_malformed_facts_file_is_exit_2(cli, tmp_path):
    bad = tmp_path / "facts.json"
    bad.write_text('{"nvml": {}}')
    r = cli("doctor", "--facts", str(bad))
    assert r.code == 2 and "malformed" in r.err and r.err.count("\n") == 1


def test_help_is_the_module_docstring_with_examples(cli):
    r = cli("doctor", "--help")
    assert r.code == 0
    assert (
        "torchrig doctor --record facts.json" in r.out and "CUDA_VISIBLE_DEVICES=7 torchrig doctor" in r.out
    )


def test_replay_imports_nothing_heavy():
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "torchrig",
            "doctor",
            "--facts",
            str(FIX / "h200x1-driver580-cu130.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    mods = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "torchrig" in mods
    assert not mods & {"torch", "pynvml", "docker", "numpy", "rich"}


def test_verdict_claims_cuda_works_only_when_torch_was_probed(cli):
    """The 64 MB /dev/shm run on the 2x H200 (--only container,gpu) had no torch probe: CUDA was not seen."""
    r = cli("doctor", "--facts", str(FIX / "h200x2-driver580-cu130-shm-64m.json"))
    last = r.out.rstrip().splitlines()[-1]
    assert r.code == 1 and last.startswith("verdict: 0 error(s), 1 warning(s)"), r.out
    assert "the warnings will bite later" in last and "CUDA works" not in last
    r = cli("doctor", "--facts", str(FIX / "throttled-at-idle-h200.json"))
    assert "CUDA works; the warnings will bite later" in r.out.rstrip().splitlines()[-1]
