"""The one recording format on real GPUs and real NVML: what ``gpus --record`` writes, ``doctor --facts``,
``gpus --inventory`` and ``dashboard --once --inventory`` read; what ``doctor --record`` writes, ``gpus
--inventory`` reads; both recordings hold the same GPUs (UUID, name, memory) as ``nvidia-smi`` lists and as
each other. Skipped without a CUDA GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


def _torchrig(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrig", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture
def env(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "TORCHRIG_GPU_INVENTORY")}
    out.update(TORCHRIG_STATE_DIR=str(tmp_path / "state"), TORCHRIG_CACHE_DIR=str(tmp_path / "cache"))
    return out


def _smi() -> list[tuple[str, str, int]]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("needs nvidia-smi")
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        (u.strip(), n.strip(), int(m)) for u, n, m in (line.split(",") for line in out.strip().splitlines())
    ]


def test_each_recording_is_read_by_every_reader(env, tmp_path):
    smi = _smi()
    gpus_rec, doctor_rec = tmp_path / "gpus.json", tmp_path / "doctor.json"
    r = _torchrig("gpus", "--record", str(gpus_rec), env=env)
    assert r.returncode == 0, r.stderr
    r = _torchrig("doctor", "--only", "gpu", "--record", str(doctor_rec), env=env)
    assert r.returncode in (0, 1), r.stderr
    for rec in (gpus_rec, doctor_rec):
        gpus = json.loads(rec.read_text())["nvml"]["gpus"]
        assert [(g["uuid"], g["name"], g["memory_total_mib"]) for g in gpus] == smi, rec.name
        board = _torchrig("--json", "gpus", "--inventory", str(rec), env=env)
        assert board.returncode == 0, board.stderr
        if not any(g.get("mig_mode") for g in gpus):  # MIG on: the board lists instances, not GPUs
            assert [g["uuid"] for g in json.loads(board.stdout)["gpus"]] == [u for u, _n, _m in smi]
        page = _torchrig("--json", "dashboard", "--once", "--no-doctor", "--inventory", str(rec), env=env)
        assert page.returncode == 0, page.stderr
        assert [g["name"] for g in json.loads(page.stdout)["gpus"]] == [n for _u, n, _m in smi]
    report = _torchrig("--json", "doctor", "--facts", str(gpus_rec), env=env)
    assert report.returncode in (0, 1), report.stderr
    facts = json.loads(report.stdout)["facts"]
    assert facts["kernel"]["status"] == "skipped" and len(facts["nvml"]["gpus"]) == len(smi)
