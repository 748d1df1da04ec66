"""The NVML probe against NVML's answers for an H200 pair (the values nvidia-smi -q shows on the H200
machines: 143771 MiB, 700 W, 18 NVLink links, fabric completed, P2P OK over NVLink), served through the real
pynvml module with only its C calls replaced: units, enums and bit masks must come out right, and NVML's
error codes must become statuses."""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

from torchrig.doctor.facts import ProbeStatus
from torchrig.doctor.probes.nvml import probe_nvml

pynvml = pytest.importorskip("pynvml")

UUIDS = ["GPU-3f1c2a9e-5b7d-4e10-9c2f-7a8b6d5e4c3b", "GPU-b2e4d6f8-1a3c-4e5f-8a9b-0c1d2e3f4a5b"]


def fake_nvml(init_error: int | None = None, mig: bool = False) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    for name in dir(pynvml):  # constants, structs, NVMLError and its subclasses: the real ones
        if not name.startswith("nvml") or name.startswith("nvmlClocksEventReason"):
            setattr(nv, name, getattr(pynvml, name))

    def fail(code: int):
        def f(*_a):
            raise pynvml.NVMLError(code)

        return f

    unsupported = fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    nv.nvmlInit = fail(init_error) if init_error is not None else (lambda: None)
    nv.nvmlShutdown = lambda: None
    nv.nvmlErrorString = lambda code: "Success" if code == 0 else "Unknown Error"
    nv.nvmlSystemGetDriverVersion = lambda: "580.95.05"
    nv.nvmlSystemGetCudaDriverVersion_v2 = lambda: 13000
    nv.nvmlSystemGetNVMLVersion = lambda: "13.580.95.05"
    nv.nvmlSystemGetProcessName = lambda pid: b"python3"
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    nv.nvmlDeviceGetUUID = lambda h: UUIDS[h[1]] if h[0] == "gpu" else f"MIG-{h[1]}"
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H200" if h[0] == "gpu" else "NVIDIA H200 MIG 1g.18gb"
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=143771 * 2**20, used=(0 if h[0] == "gpu" else 1) * 2**20
    )
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(
        busId=[b"00000000:19:00.0", b"00000000:3B:00.0"][h[1]]
    )
    nv.nvmlDeviceGetPersistenceMode = lambda h: 1
    nv.nvmlDeviceGetMigMode = lambda h: [int(mig), int(mig)]
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    nv.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, i: (
        ("mig", i) if i == 0 else fail(pynvml.NVML_ERROR_NOT_FOUND)()
    )
    nv.nvmlDeviceGetEccMode = lambda h: [1, 1]
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0
    nv.nvmlDeviceGetRemappedRows = lambda h: (0, 0, 0, 0)
    nv.nvmlDeviceGetRetiredPages = unsupported
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=0, memory=0)
    nv.nvmlDeviceGetTemperature = lambda h, s: 31
    nv.nvmlDeviceGetPowerUsage = lambda h: 76200  # milliwatts
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700000
    nv.nvmlDeviceGetClockInfo = lambda h, c: 345
    nv.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x1  # GPU idle
    nv.nvmlDeviceGetNvLinkState = lambda h, link: (
        1 if link < 18 else fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)()
    )

    def fabric(h, ref):
        info = ctypes.cast(ref, ctypes.POINTER(pynvml.c_nvmlGpuFabricInfo_t)).contents
        info.state, info.status = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0
        return 0

    nv.nvmlDeviceGetGpuFabricInfo = fabric
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [types.SimpleNamespace(pid=4242, usedGpuMemory=2048 * 2**20)] if h[1] == 1 else []
    )
    nv.nvmlDeviceGetP2PStatus = lambda a, b, cap: pynvml.NVML_P2P_STATUS_OK
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: pynvml.NVML_TOPOLOGY_SYSTEM
    return nv


def test_h200_pair(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    f = probe_nvml()
    assert f.status is ProbeStatus.OK and f.error is None
    assert (f.driver_version, f.cuda_driver_version, f.nvml_version) == ("580.95.05", "13.0", "13.580.95.05")
    g0, g1 = f.gpus
    assert (g0.index, g0.uuid, g0.name, g0.compute_capability) == (0, UUIDS[0], "NVIDIA H200", "9.0")
    assert (g0.memory_total_mib, g0.pci_bus_id, g1.pci_bus_id) == (
        143771,
        "00000000:19:00.0",
        "00000000:3B:00.0",
    )
    assert g0.persistence_mode is True and g0.mig_mode is False and g0.mig_instances == ()
    assert (g0.ecc_enabled, g0.ecc_uncorrected_volatile, g0.remapped_rows_pending) == (True, 0, False)
    assert g0.retired_pages is None  # Hopper remaps rows instead
    assert (g0.power_draw_w, g0.power_limit_w, g0.sm_clock_mhz, g0.sm_clock_max_mhz) == (
        76.2,
        700.0,
        345,
        1980,
    )
    assert g0.throttle_reasons == ("gpu_idle",)
    assert (g0.nvlink_active, g0.nvlink_inactive) == (18, 0)
    assert (g0.fabric_state, g0.fabric_status) == ("completed", "Success")
    assert g0.processes == () and g1.processes[0].pid == 4242 and g1.processes[0].used_memory_mib == 2048
    assert g1.processes[0].name == "python3"
    (pair,) = f.p2p
    assert (pair.a, pair.b, pair.read, pair.write, pair.nvlink, pair.topology) == (
        0,
        1,
        "ok",
        "ok",
        "ok",
        "system",
    )


def test_mig_instances(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(mig=True))
    g0 = probe_nvml().gpus[0]
    assert g0.mig_mode is True and len(g0.mig_instances) == 1
    assert g0.mig_instances[0].name == "NVIDIA H200 MIG 1g.18gb" and g0.mig_instances[0].uuid == "MIG-0"


@pytest.mark.parametrize(
    ("code", "status", "text"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, ProbeStatus.MISSING, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, ProbeStatus.FAILED, "Driver Not Loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, ProbeStatus.FAILED, "version mismatch"),
        (pynvml.NVML_ERROR_NO_PERMISSION, ProbeStatus.DENIED, "Insufficient Permissions"),
    ],
)
def test_init_errors_become_statuses(monkeypatch, code, status, text):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error=code))
    f = probe_nvml()
    assert f.status is status and text in (f.error or "") and f.gpus == ()


def test_missing_bindings(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    f = probe_nvml()
    assert f.status is ProbeStatus.MISSING and "nvidia-ml-py" in (f.error or "")
