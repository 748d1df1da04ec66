"""torchrig.train.gpuwatch against NVML's answers recorded on an H200 while torchrig train ran GPT-2 small
(tests/fixtures/train/nvml-clocks-h200-gpt2small.json, tools/gpu/record_clocks.py), replayed at the pynvml
boundary: the real pynvml module (constants, the violation-time structure) with its functions answering what
the recorded GPU answered, one recorded sample at a time."""

from __future__ import annotations

import json
import statistics
import types
from pathlib import Path
from typing import Any

import pytest

from torchrig.train.gpuwatch import GpuWatch
from torchrig.train.record import render_clocks

pynvml = pytest.importorskip("pynvml")

REC = json.loads(
    (
        Path(__file__).resolve().parents[1] / "fixtures" / "train" / "nvml-clocks-h200-gpt2small.json"
    ).read_text()
)
UUID = "GPU-2a8c3f5e-0000-4000-8000-000000000000"


class Replay:
    """The recorded GPU: ``at`` is the sample NVML answers from."""

    def __init__(self) -> None:
        self.at = 0

    def now(self) -> dict[str, Any]:
        return REC["samples"][self.at]  # type: ignore[no-any-return]

    def violation(self, policy: int) -> Any:
        ref, held = self.now()[
            "violation_power" if policy == pynvml.NVML_PERF_POLICY_POWER else "violation_thermal"
        ]
        v = pynvml.c_nvmlViolationTime_t()
        v.referenceTime, v.violationTime = ref, held
        return v

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        answers = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetHandleByIndex": lambda i: ("gpu", i),
            "nvmlDeviceGetUUID": lambda h: UUID,
            "nvmlDeviceGetClockInfo": lambda h, c: self.now()["nvmlDeviceGetClockInfo_SM"],
            "nvmlDeviceGetPowerUsage": lambda h: self.now()["nvmlDeviceGetPowerUsage"],
            "nvmlDeviceGetTemperature": lambda h, s: self.now()["nvmlDeviceGetTemperature"],
            "nvmlDeviceGetViolationStatus": lambda h, p: self.violation(p),
            "nvmlDeviceGetMaxClockInfo": lambda h, c: REC["nvmlDeviceGetMaxClockInfo_SM"],
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: REC["nvmlDeviceGetEnforcedPowerLimit"],
        }
        for name, fn in answers.items():
            monkeypatch.setattr(pynvml, name, fn)


def cuda_device() -> tuple[Any, Any]:
    """torch as far as GpuWatch asks it: the CUDA device and its UUID (torch reports it without 'GPU-')."""
    props = types.SimpleNamespace(uuid=UUID[len("GPU-") :])
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda d: props))
    return torch, types.SimpleNamespace(type="cuda", index=0)


def busy() -> list[int]:
    """The samples taken while the GPU trained (above 400 W)."""
    return [i for i, s in enumerate(REC["samples"]) if s["nvmlDeviceGetPowerUsage"] > 400_000]


def watch_over(samples: list[int], monkeypatch: pytest.MonkeyPatch) -> GpuWatch:
    nv = Replay()
    nv.install(monkeypatch)
    torch, dev = cuda_device()
    w = GpuWatch.open(torch, dev)
    assert w is not None
    w.clock = lambda: REC["samples"][nv.at]["t"]
    for step, i in enumerate(samples, start=1):
        nv.at = i
        w.sample(step)
    return w


def test_a_gpu_at_its_power_limit_is_reported_held_down_all_the_time(monkeypatch):
    idx = busy()
    assert len(idx) >= 20  # the recording holds the training
    w = watch_over(idx, monkeypatch)
    r = w.result(from_step=1)
    clocks = [REC["samples"][i]["nvmlDeviceGetClockInfo_SM"] for i in idx]
    assert r.sm_clock_mhz == (min(clocks), statistics.median(clocks), max(clocks)) == (1665, 1845, 1965)
    assert r.sm_clock_max_mhz == 1980 and r.power_limit_w == 700.0
    temps = [REC["samples"][i]["nvmlDeviceGetTemperature"] for i in idx]
    assert r.temperature_c == (min(temps), statistics.median(temps), max(temps))
    assert r.temperature_c[2] > r.temperature_c[0]  # the GPU warmed up while it trained
    assert r.power_capped_share == 1.0  # NVML counted 13.0719 s held down in 13.0714 s
    assert r.thermal_capped_share == 0.0
    assert r.samples == len(idx)
    line = render_clocks([r])
    assert line is not None
    assert "rank 0 clocks held down (power 100% of the time), SM 1665-1965 MHz of 1980 MHz" in line
    w.close()


def test_the_window_starts_at_from_step(monkeypatch):
    idx = busy()
    w = watch_over(idx, monkeypatch)
    r = w.result(from_step=11)
    assert r.samples == len(idx) - 10
    clocks = [REC["samples"][i]["nvmlDeviceGetClockInfo_SM"] for i in idx[10:]]
    assert r.sm_clock_mhz[0] == min(clocks)


def test_an_idle_gpu_is_not_held_down_and_gets_no_line(monkeypatch):
    idle = list(range(0, 8))  # before the training started: 121 W
    assert all(REC["samples"][i]["nvmlDeviceGetPowerUsage"] < 200_000 for i in idle)
    r = watch_over(idle, monkeypatch).result()
    assert r.power_capped_share == 0.0 and r.thermal_capped_share == 0.0
    assert render_clocks([r]) is None
    assert render_clocks([None, None]) is None


def test_no_watch_on_a_cpu_rank_or_without_nvml(monkeypatch):
    torch, _ = cuda_device()
    assert GpuWatch.open(torch, types.SimpleNamespace(type="cpu")) is None
    from torchrig.hw import nvml

    def missing() -> Any:
        raise nvml.NvmlError(
            nvml.NvmlErrorKind.BINDINGS_MISSING, "nvidia-ml-py is not installed", step="import"
        )

    monkeypatch.setattr(nvml, "open_session", missing)
    assert GpuWatch.open(*cuda_device()) is None


def test_a_gpu_nvml_does_not_list_gets_no_watch(monkeypatch):
    Replay().install(monkeypatch)
    props = types.SimpleNamespace(uuid="another-gpu")
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda d: props))
    assert GpuWatch.open(torch, types.SimpleNamespace(type="cuda", index=0)) is None
