"""One record of a GPU's facts (torchrig.hw.record.GpuFacts) and one recording format, written by both
``doctor --record`` and ``gpus --record`` and read by doctor, gpus, the launcher (bench, launch) and the
dashboard: a recording written by one is read by the others, an inventory snapshot of the old format is
still read (and converted by tools/convert_gpu_recordings.py), and a hostile recording is one line, exit 2,
never an internal error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
pynvml = pytest.importorskip("pynvml")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402
from nvmlreplay import recorded, replay  # noqa: E402
from torchrig.cli import main  # noqa: E402
from torchrig.doctor.facts import facts_from_json, load_facts  # noqa: E402
from torchrig.errors import InputError  # noqa: E402
from torchrig.hw.record import ProbeStatus, recording, to_json  # noqa: E402
from torchrig.runtime.inventory import load_snapshot  # noqa: E402

fuzzkit.register_profiles()
fuzzkit.preload()

FIX = fuzzkit.FIXTURES
ROOT = FIX.parents[1]
# written by 'torchrig doctor --record' on a 2x H200 host (its "source" says so)
DOCTOR_RECORDING = FIX / "doctor" / "h200x2-driver580-cu130.json"
OLD_SNAPSHOT = FIX / "runtime" / "inventory-snapshot-old-format-2xa100.json"


def _gpus_recording() -> bytes:
    """What 'gpus --record' writes (the same writer) for the NVML facts doctor recorded on the 2x H200 host."""
    facts = facts_from_json(json.loads(DOCTOR_RECORDING.read_text()))
    doc = recording(
        facts.nvml,
        source=f"constructed from {DOCTOR_RECORDING.name}'s NVML facts by the writer of gpus --record",
        recorded_at=None,
        torchrig_version=None,
    )
    return json.dumps(doc, indent=2).encode()


def _json_out(argv: list[str], files: dict[str, bytes], env: dict[str, str] | None = None) -> dict:
    outcome = fuzzkit.call(argv, files=files, env=env)
    fuzzkit.check(outcome)
    assert outcome.code in (0, 1), outcome.describe()
    return json.loads(outcome.out)


def test_gpus_record_writes_a_recording_doctor_reads(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", replay(recorded("h200x2-driver580-cu130")))
    path = tmp_path / "host.json"
    assert main(["gpus", "--record", str(path)]) == 0
    written = json.loads(path.read_text())
    assert written["source"].startswith("recorded by torchrig gpus --record at ")
    facts = load_facts(path)
    assert facts.kernel.status is ProbeStatus.SKIPPED and facts.absent == ()  # not probed, not missing
    doctor_facts = facts_from_json(json.loads(DOCTOR_RECORDING.read_text()))
    mine = [to_json(g) | {"processes": []} for g in facts.nvml.gpus]
    theirs = [to_json(g) | {"processes": []} for g in doctor_facts.nvml.gpus]  # who: doctor's alone
    assert mine == theirs and facts.nvml.p2p == doctor_facts.nvml.p2p
    report = _json_out(["doctor", "--json", "--facts", "f.json"], {"f.json": path.read_bytes()})
    assert "NVIDIA H200" in json.dumps(report["findings"])  # the GPUs are judged: their checks ran
    assert any(f["id"] == "gpu.p2p" for f in report["findings"])
    board = _json_out(["gpus", "--json", "--inventory", "f.json"], {"f.json": path.read_bytes()})
    assert [g["uuid"] for g in board["gpus"]] == [g.uuid for g in doctor_facts.nvml.gpus]


def test_a_doctor_recording_is_read_by_gpus_the_launcher_and_the_dashboard(monkeypatch):
    data = DOCTOR_RECORDING.read_bytes()
    nvml = json.loads(data)["nvml"]
    want = [(g["uuid"], g["name"], g["memory_total_mib"]) for g in nvml["gpus"]]
    board = _json_out(["gpus", "--json", "--inventory", "f.json"], {"f.json": data})
    assert [(g["uuid"], g["name"], g["memory_total_mib"]) for g in board["gpus"]] == want
    assert board["driver_version"] == nvml["driver_version"]
    page = _json_out(
        ["dashboard", "--once", "--json", "--no-doctor", "--inventory", "f.json"], {"f.json": data}
    )
    assert [(g["name"], g["memory_total_mib"]) for g in page["gpus"]] == [w[1:] for w in want]
    # the launcher (launch, bench) reads the inventory where --gpus names GPUs by UUID
    from torchrig.launch import probe

    monkeypatch.setenv("TORCHRIG_GPU_INVENTORY", str(DOCTOR_RECORDING))
    monkeypatch.setattr(probe, "leases_now", lambda: [])
    units = probe.lease_facts(want[1][0], (0, 1))["gpu_units"]
    assert [u.uuid for u in units] == [w[0] for w in want]


def test_an_old_inventory_snapshot_is_still_read_and_says_how_to_upgrade(tmp_path):
    inv = load_snapshot(OLD_SNAPSHOT)
    new = load_snapshot(FIX / "runtime" / "driver-535-2xa100-pcie.json")  # the same file, converted
    assert "record it again with 'torchrig gpus --record FILE'" in inv.source
    assert inv.gpus == new.gpus and inv.units() == new.units()
    facts = load_facts(OLD_SNAPSHOT)  # doctor reads it too: NVML's facts, the other areas unknown
    assert facts.nvml.gpus == new.gpus and facts.kernel.status is ProbeStatus.SKIPPED
    copy = tmp_path / "old.json"
    copy.write_bytes(OLD_SNAPSHOT.read_bytes())
    tool = ROOT / "tools" / "convert_gpu_recordings.py"
    check = subprocess.run([sys.executable, str(tool), "--check", str(copy)], capture_output=True, text=True)
    assert check.returncode == 1 and "old format" in check.stderr
    assert subprocess.run([sys.executable, str(tool), str(copy)], capture_output=True).returncode == 0
    assert load_snapshot(copy).gpus == new.gpus and "record it again" not in load_snapshot(copy).source
    assert json.loads(copy.read_text())["note"] == json.loads(OLD_SNAPSHOT.read_text())["note"]


def test_the_converted_fixtures_are_of_the_one_format():
    tool = ROOT / "tools" / "convert_gpu_recordings.py"
    files = sorted(
        str(p) for p in (FIX / "runtime").glob("*.json") if p.name.startswith(("driver", "inv", "mig", "rec"))
    )
    old = [f for f in files if "old-format" in f]
    out = subprocess.run([sys.executable, str(tool), "--check", *files], capture_output=True, text=True)
    assert [line.split(":")[0] for line in out.stderr.splitlines()] == old


@pytest.mark.parametrize(
    "content",
    [
        b"[]",
        b'{"schema_version": 1}',
        b'{"schema_version": 2, "nvml": {}}',
        b'{"schema_version": 1, "nvml": []}',
    ],
)
def test_not_a_recording_is_one_line(tmp_path, content):
    path = tmp_path / "r.json"
    path.write_bytes(content)
    for read in (load_snapshot, load_facts):
        with pytest.raises(InputError) as err:
            read(path)
        assert "\n" not in err.value.one_line() and "r.json" in err.value.one_line()


SEEDS = {
    "doctor-recording": DOCTOR_RECORDING.read_bytes(),
    "gpus-recording": _gpus_recording(),
    "old-snapshot": OLD_SNAPSHOT.read_bytes(),
}
READERS = {
    "doctor": ["doctor", "--json", "--facts", "f.json"],
    "gpus": ["gpus", "--inventory", "f.json"],
    "dashboard": ["dashboard", "--once", "--no-doctor", "--inventory", "f.json"],
}


@pytest.mark.parametrize("seed", sorted(SEEDS))
@pytest.mark.parametrize("reader", sorted(READERS))
@given(data=st.data())
def test_hostile_recordings_are_exit_2_never_3(seed, reader, data):
    content = data.draw(fuzzkit.json_content(SEEDS[seed]), label="content")
    fuzzkit.check(fuzzkit.call(READERS[reader], files={"f.json": content}))


@pytest.mark.parametrize("seed", sorted(SEEDS))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_seed_is_read_by_every_reader(seed, reader):
    outcome = fuzzkit.call(READERS[reader], files={"f.json": SEEDS[seed]})
    fuzzkit.check(outcome)
    assert outcome.code in (0, 1), outcome.describe()
