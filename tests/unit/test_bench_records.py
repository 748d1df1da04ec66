"""A bench rank's device is the one record of a GPU (hw.record.GpuFacts) inside a small per-rank record, and
the result format is unchanged: every stored result reads, and writes back the same JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchrig.bench.records import RankGpu, measurements_from_json, measurements_to_json
from torchrig.hw.record import GpuFacts
from torchrig.jsonrecords import RecordError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


def _measurements(path: Path) -> dict:
    data = json.loads(path.read_text())
    return data.get("measurements", data)


# the stored results: a CPU run's worker file, and the full and quick runs of a 1x H200 call (docs/results)
STORED = [
    ("cpu-gloo-2proc", _measurements(FIX / "cpu-gloo-2proc-torch2.13.json")),
    *(
        (
            f"h200x1-{run}",
            json.loads((FIX / "h200x1-run1/bench/bench-1gpu.json").read_text())[run]["measurements"],
        )
        for run in ("full", "quick")
    ),
]


@pytest.mark.parametrize("data", [d for _, d in STORED], ids=[n for n, _ in STORED])
def test_stored_results_read_and_write_back_the_same_gpus(data):
    m = measurements_from_json(data)
    assert m.gpus and all(isinstance(g, RankGpu) for g in m.gpus)
    assert all((g.gpu is None) == (g.name == "cpu") for g in m.gpus)
    written = json.loads(json.dumps(measurements_to_json(m)))  # as the worker and bench.json write it
    assert written["gpus"] == data["gpus"] and measurements_from_json(written) == m
    assert data.keys() <= written.keys()  # newer fields are added, none dropped


def test_a_rank_on_a_gpu_carries_its_facts_and_the_cpu_path_none():
    row = {"rank": 1, "device_index": 3, "name": "NVIDIA H200", "compute_capability": "9.0"}
    row |= {"memory_mib": 143771, "l2_cache_bytes": 52428800}
    m = measurements_from_json(STORED[1][1] | {"gpus": [row]})
    (g,) = m.gpus
    assert g.gpu == GpuFacts(3, name="NVIDIA H200", compute_capability="9.0", memory_total_mib=143771, l2_cache_bytes=52428800)  # fmt: skip
    assert (g.rank, g.name, g.l2_cache_bytes, g.to_json()) == (1, "NVIDIA H200", 52428800, row)
    cpu = RankGpu(0, None)
    assert (cpu.name, cpu.l2_cache_bytes, cpu.to_json()["device_index"]) == ("cpu", None, None)
    with pytest.raises(RecordError, match=r"^measurements.gpus\[0\].memory_mib: expected an integer"):
        measurements_from_json(STORED[1][1] | {"gpus": [row | {"memory_mib": "1"}]})
