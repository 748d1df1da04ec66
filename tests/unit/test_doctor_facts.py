"""The facts record: JSON round trip (the fixture and --record format), and clear errors for bad files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from torchrig.doctor import diagnose
from torchrig.doctor.checks.visibility import visible_prefix
from torchrig.doctor.facts import (
    RECORDING_SCHEMA_VERSION,
    Facts,
    ProbeStatus,
    facts_from_json,
    facts_to_json,
    load_facts,
)
from torchrig.errors import InputError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
# fields added after the 2026-11-30 H200 recordings (PCIe link, driver libraries, Xid, --python as given)
NEWER = {
    "nvml.gpus[0].pcie_gen_current",
    "nvml.gpus[0].pcie_gen_max",
    "nvml.gpus[0].pcie_width_current",
    "nvml.gpus[0].pcie_width_max",
    "kernel.driver_libraries",
    "kernel.xid_events",
    "kernel.kernel_log_error",
    "torch.python_requested",
    "torch.origin",
}


@pytest.mark.parametrize("path", sorted(FIX.glob("*.json")), ids=lambda p: p.stem)
def test_fixtures_round_trip(path):
    facts = load_facts(path)
    assert isinstance(facts, Facts) and facts.schema_version == RECORDING_SCHEMA_VERSION
    again = facts_from_json(json.loads(json.dumps(facts_to_json(facts))))
    assert again == dataclasses.replace(facts, absent=())  # what the file lacked is written now, as unknown


def test_unknown_keys_are_ignored_and_missing_ones_default():
    data = json.loads((FIX / "h200x1-driver580-cu130.json").read_text())
    data["nvml"]["gpus"][0]["future_field"] = 1
    del data["nvml"]["gpus"][0]["temperature_c"]
    facts = facts_from_json(data)
    assert facts.nvml.gpus[0].temperature_c is None and facts.nvml.gpus[0].name == "NVIDIA H200"


def test_facts_from_an_older_probe_load_as_unknown():
    """A recording made before a field or an area existed: the field is unknown, the area was not probed."""
    data = json.loads((FIX / "h200x1-driver580-cu130.json").read_text())
    del data["docker"], data["probe_ms"], data["torchrig_version"]
    del data["torch"]["wheel_libraries"], data["torch"]["devices"][0]["kernel_error"]
    del data["kernel"]["wsl_driver_libs"], data["container"]["status"]
    del data["nvml"]["gpus"][0]["fabric_state"], data["nvml"]["gpus"][0]["processes"]
    facts = facts_from_json(data)
    assert facts.docker.status is ProbeStatus.SKIPPED and facts.container.status is ProbeStatus.SKIPPED
    assert facts.torch.wheel_libraries == () and facts.torch.devices[0].kernel_error is None
    assert facts.kernel.wsl_driver_libs is None and facts.nvml.gpus[0].fabric_state is None
    assert facts.probe_ms == {} and facts.torchrig_version is None
    # What was absent is said, once per area or field; bookkeeping (probe_ms, torchrig_version) is not.
    assert set(facts.absent) - NEWER == {
        "docker",
        "torch.wheel_libraries",
        "torch.devices[0].kernel_error",
        "kernel.wsl_driver_libs",
        "container.status",
        "nvml.gpus[0].fabric_state",
        "nvml.gpus[0].processes",
    }
    report = diagnose(facts)
    assert report.exit_code == 0, [(f.id, f.summary) for f in report.findings]
    assert {"driver.ok", "torch.ok"} <= {f.id for f in report.findings}
    assert any("recorded by an older torchrig and lack docker" in n for n in report.notes), report.notes
    assert "recorded by an older torchrig" in report.render_text()
    assert report.to_json()["notes"] == list(report.notes)
    assert "absent" not in facts_to_json(facts)  # a property of the file, not of the machine


def test_complete_facts_have_nothing_absent():
    facts = load_facts(FIX / "throttled-at-idle-h200.json")  # derived: every field written
    assert facts.absent == () and not diagnose(facts).notes


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(torch=[]), "torch: expected an object"),
        (lambda d: d.pop("schema_version"), "not a torchrig recording"),
        (lambda d: d["kernel"]["device_nodes"][0].pop("path"), "kernel.device_nodes[0].path: missing"),
        (lambda d: d["nvml"].update(status="bogus"), "nvml.status: 'bogus' is not one of 'ok', 'missing'"),
        (
            lambda d: d["nvml"]["gpus"][0].update(index="zero"),
            "nvml.gpus[0].index: expected an integer, got a string",
        ),
        (lambda d: d.update(schema_version=99), "schema_version 99"),
    ],
)
def test_malformed_facts_name_the_key(tmp_path, mutate, message):
    data = json.loads((FIX / "h200x1-driver580-cu130.json").read_text())
    mutate(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_facts(bad)
    assert message in err.value.one_line() and "\n" not in err.value.one_line()


def test_missing_and_non_json_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_facts(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(InputError, match="is not JSON"):
        load_facts(tmp_path / "x.json")


@pytest.mark.parametrize(
    ("value", "count", "seen", "bad"),
    [
        ("0,1", 2, ["0", "1"], None),
        ("7", 2, [], "7"),
        ("-1", 2, [], "-1"),
        ("0,7,1", 2, ["0"], "7"),  # CUDA stops at the first invalid entry
        ("1", None, ["1"], None),  # unknown GPU count: indices cannot be judged
        ("GPU-3f1c", 2, ["GPU-3f1c"], None),
        ("GPU-ffff", 2, [], "GPU-ffff"),
        ("abc", 2, [], "abc"),
    ],
)
def test_visible_prefix_follows_cuda(value, count, seen, bad):
    uuids = ["GPU-3f1c2a9e-5b7d-4e10-9c2f-7a8b6d5e4c3b", "GPU-b2e4d6f8-1a3c-4e5f-8a9b-0c1d2e3f4a5b"]
    assert visible_prefix(value, count, uuids) == (seen, bad)
