"""NVML's answers replayed at the pynvml boundary, from the NVML facts doctor recorded on real machines
(tests/fixtures/doctor/*.json): the real pynvml module (constants, structures, NVMLError and its texts) with
only its functions replaced by ones answering what the recorded machine answered.

    monkeypatch.setitem(sys.modules, "pynvml", replay(recorded("h200x2-driver580-cu130")))

``install(case)`` does the same for a whole process (a launcher started by an integration test).
"""

from __future__ import annotations

import ctypes
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from torchrig.hw import nvml

FIX = Path(__file__).resolve().parent / "fixtures"
CODE = {text: code for code, text in pynvml.NVMLError._errcode_to_string.items()}


def recorded(name: str) -> dict[str, Any]:
    return json.loads((FIX / "doctor" / f"{name}.json").read_text())["nvml"]  # type: ignore[no-any-return]


def fail(code: int) -> Callable[..., Any]:
    def f(*_a: Any) -> Any:
        raise pynvml.NVMLError(code)

    return f


def written_by_nvml(ref: Any) -> Any:
    """The structure NVML's C function fills: the one a pointer (ctypes.byref) points to. A structure passed
    by value reaches C as a copy, so the caller's stays all zeros: what the real library does (tried with a
    C function of the same signature through ctypes)."""
    if isinstance(ref, ctypes.Structure):
        return type(ref)()
    return ref._obj  # the structure ctypes.byref points to


def value(v: Any, to: Callable[[Any], Any] = lambda x: x) -> Any:
    """NVML's answer for a recorded value: None was a query NVML did not answer."""
    if v is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return to(v)


def mib(n: int) -> int:
    return n * 2**20


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


class Recorded:
    """NVML's answers on the machine whose NVML facts doctor recorded: one method per pynvml function.

    Handles are ("gpu", i) and ("mig", i, k); a recorded None is a query NVML did not answer.
    """

    def __init__(self, nv_facts: dict[str, Any]) -> None:
        self.facts, self.gpus, self.pairs = nv_facts, nv_facts.get("gpus") or [], nv_facts.get("p2p") or []

    def g(self, h: Any) -> dict[str, Any]:
        return self.gpus[h[1]]  # type: ignore[no-any-return]

    def item(self, h: Any) -> dict[str, Any]:
        return self.g(h)["mig_instances"][h[2]] if h[0] == "mig" else self.g(h)  # type: ignore[no-any-return]

    # --- init and system
    def nvmlInit(self) -> None:
        if self.facts["status"] != "ok":
            raise pynvml.NVMLError(CODE[self.facts["error"].removeprefix("nvmlInit: ")])

    def nvmlShutdown(self) -> None:
        pass

    def nvmlErrorString(self, code: int) -> Any:
        return b"Success" if code == 0 else pynvml.NVMLError._errcode_to_string[code]

    def nvmlSystemGetDriverVersion(self) -> Any:
        return value(self.facts["driver_version"])

    def nvmlSystemGetNVMLVersion(self) -> Any:
        return value(self.facts["nvml_version"])

    def nvmlSystemGetCudaDriverVersion_v2(self) -> Any:
        major_minor = lambda v: int(v.split(".")[0]) * 1000 + int(v.split(".")[1]) * 10  # noqa: E731
        return value(self.facts["cuda_driver_version"], major_minor)  # "13.0" -> 13000

    # --- identity, memory, MIG
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h: Any) -> Any:
        return value(self.item(h)["uuid"])

    def nvmlDeviceGetName(self, h: Any) -> Any:
        return value(self.item(h)["name"], str.encode)

    def nvmlDeviceGetCudaComputeCapability(self, h: Any) -> Any:
        return value(self.g(h)["compute_capability"], lambda v: tuple(int(x) for x in v.split(".")))

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        used = 0 if h[0] == "mig" else mib(self.g(h)["memory_used_mib"])
        return value(self.item(h)["memory_total_mib"], lambda v: ns(total=mib(v), used=used))

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return value(self.g(h)["pci_bus_id"], lambda v: ns(busId=v.encode()))

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        return value(self.g(h)["utilization_pct"], lambda v: ns(gpu=v, memory=0))

    def nvmlDeviceGetMigMode(self, h: Any) -> Any:
        return value(self.g(h)["mig_mode"], lambda v: [int(v), int(self.g(h)["mig_pending"])])

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, k: int) -> Any:
        if k >= len(self.g(h)["mig_instances"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], k)

    # --- health
    def nvmlDeviceGetPersistenceMode(self, h: Any) -> Any:
        return value(self.g(h)["persistence_mode"], int)

    def nvmlDeviceGetEccMode(self, h: Any) -> Any:
        return value(self.g(h)["ecc_enabled"], lambda v: [int(v), int(v)])

    def nvmlDeviceGetTotalEccErrors(self, h: Any, _kind: int, counter: int) -> Any:
        volatile = counter == pynvml.NVML_VOLATILE_ECC
        return value(self.g(h)["ecc_uncorrected_volatile" if volatile else "ecc_uncorrected_aggregate"])

    def nvmlDeviceGetRemappedRows(self, h: Any) -> Any:
        g = self.g(h)
        return value(
            g["remapped_rows_uncorrectable"],
            lambda v: (0, v, int(g["remapped_rows_pending"]), int(g["remapped_rows_failed"])),
        )

    def nvmlDeviceGetRetiredPages(self, h: Any, _cause: int) -> Any:
        return value(self.g(h)["retired_pages"], lambda n: [0x1000] * n)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> Any:
        return value(self.g(h)["retired_pages_pending"], int)

    def nvmlDeviceGetTemperature(self, h: Any, _sensor: int) -> Any:
        return value(self.g(h)["temperature_c"])

    def nvmlDeviceGetPowerUsage(self, h: Any) -> Any:
        return value(self.g(h)["power_draw_w"], lambda w: round(w * 1000))  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> Any:
        return value(self.g(h)["power_limit_w"], lambda w: round(w * 1000))

    def nvmlDeviceGetClockInfo(self, h: Any, _clock: int) -> Any:
        return value(self.g(h)["sm_clock_mhz"])

    def nvmlDeviceGetMaxClockInfo(self, h: Any, _clock: int) -> Any:
        return value(self.g(h)["sm_clock_max_mhz"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        bits = {name: bit for bit, name in nvml.THROTTLE_REASONS.items()}
        return sum(bits[r] for r in self.g(h)["throttle_reasons"])

    def _running(self, h: Any, kind: str) -> list[Any]:
        procs = [p for p in self.g(h)["processes"] if p.get("kind", "compute") == kind]
        mem = [None if p["used_memory_mib"] is None else mib(p["used_memory_mib"]) for p in procs]
        return [ns(pid=p["pid"], usedGpuMemory=m) for p, m in zip(procs, mem, strict=True)]

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return self._running(h, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        return self._running(h, "graphics")

    def nvmlDeviceGetProcessUtilization(self, h: Any, _since: int) -> list[Any]:
        samples = [ns(pid=p["pid"], smUtil=p.get("sm_util_pct"), timeStamp=1) for p in self.g(h)["processes"]]
        if not any(s.smUtil is not None for s in samples):  # NVML keeps no samples
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [s for s in samples if s.smUtil is not None]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> Any:
        return value(self.g(h).get("pcie_gen_current"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> Any:
        return value(self.g(h).get("pcie_gen_max"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> Any:
        return value(self.g(h).get("pcie_width_current"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> Any:
        return value(self.g(h).get("pcie_width_max"))

    def nvmlSystemGetProcessName(self, pid: int) -> Any:
        names = {p["pid"]: p["name"] for gpu in self.gpus for p in gpu["processes"]}
        return value(names[pid], str.encode)

    # --- links, fabric, pairs
    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        active, inactive = value(self.g(h)["nvlink_active"]), self.g(h)["nvlink_inactive"]
        if link >= active + inactive:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link < active else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Any, link: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # not recorded by doctor

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Any, link: int) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # not recorded by doctor

    def nvmlDeviceGetGpuFabricInfo(self, h: Any, ref: Any) -> int:
        g = self.g(h)
        state = value(g["fabric_state"], {v: k for k, v in nvml.FABRIC_STATE.items()}.get)
        info = written_by_nvml(ref)
        info.state, info.status = state, 0 if g["fabric_status"] == "Success" else CODE[g["fabric_status"]]
        return 0

    def pair(self, a: Any, b: Any) -> dict[str, Any]:
        return next(p for p in self.pairs if (p["a"], p["b"]) == (a[1], b[1]))

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, cap: int) -> Any:
        caps = {
            pynvml.NVML_P2P_CAPS_INDEX_READ: "read",
            pynvml.NVML_P2P_CAPS_INDEX_WRITE: "write",
            pynvml.NVML_P2P_CAPS_INDEX_NVLINK: "nvlink",
        }
        return value(self.pair(a, b)[caps[cap]], {v: k for k, v in nvml.P2P_STATUS.items()}.get)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any) -> Any:
        return value(self.pair(a, b)["topology"], {v: k for k, v in nvml.TOPOLOGY.items()}.get)


def replay(nv_facts: dict[str, Any], **override: Any) -> types.ModuleType:
    """A pynvml whose functions answer what the machine of ``nv_facts`` (doctor's recorded NVML facts) did."""
    nv = types.ModuleType("pynvml")
    for name in dir(pynvml):  # constants, structures, NVMLError and its subclasses: the real ones
        if not name.startswith("nvml"):
            setattr(nv, name, getattr(pynvml, name))
    answers = Recorded(nv_facts)
    for name in dir(answers):
        if name.startswith("nvml"):
            setattr(nv, name, getattr(answers, name))
    for name, fn in override.items():
        setattr(nv, name, fn)
    return nv


def install(case: str) -> None:
    """This process's pynvml answers as the machine of doctor's recorded ``case`` did."""
    sys.modules["pynvml"] = replay(recorded(case))
