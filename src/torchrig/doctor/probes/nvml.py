"""The NVML probe, through nvidia-ml-py (``pynvml``): the one boundary to the driver's management library.

Each query is what ``nvidia-smi -q`` shows (named next to each); a query the GPU or driver does not support
leaves its field ``None``. A missing binding, a missing library or a failed ``nvmlInit`` is recorded in
``NvmlFacts.status``/``error`` (a finding later, never a crash).
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

from torchrig.doctor.facts import GpuFacts, GpuProcess, MigInstance, NvmlFacts, P2PPair, ProbeStatus

T = TypeVar("T")

# nvmlClocksEventReason* bits (nvml.h), named as nvidia-smi -q "Clocks Event Reasons" does.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
TOPOLOGY = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
FABRIC_STATE = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Callable[[], T]) -> T | None:
    """Run one NVML query; unsupported / not permitted / any NVML error -> None."""
    try:
        return fn()
    except Exception:  # NVMLError subclasses, and AttributeError for functions an old binding lacks
        return None


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """``_try`` for a call with arguments (keeps loop variables bound without default-argument lambdas)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _call_text(fn: Callable[..., Any], *args: Any) -> str | None:
    value = _call(fn, *args)
    return None if value is None else _text(value)


def _mib(n_bytes: int | None) -> int | None:
    return None if n_bytes is None else int(n_bytes) // (1024 * 1024)


def _mig(nv: Any, h: Any) -> tuple[bool | None, bool | None, tuple[MigInstance, ...]]:
    modes = _try(lambda: nv.nvmlDeviceGetMigMode(h))  # nvidia-smi -q: MIG Mode Current/Pending
    if modes is None:
        return None, None, ()
    current, pending = bool(modes[0]), bool(modes[1])
    instances = []
    if current:
        for i in range(_try(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h)) or 0):
            mh = _call(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if mh is None:
                continue
            mem = _call(nv.nvmlDeviceGetMemoryInfo, mh)
            instances.append(
                MigInstance(
                    uuid=_call_text(nv.nvmlDeviceGetUUID, mh),
                    name=_call_text(nv.nvmlDeviceGetName, mh),
                    memory_total_mib=_mib(mem.total) if mem else None,
                )
            )
    return current, pending, tuple(instances)


def _ecc(nv: Any, h: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mode = _try(lambda: nv.nvmlDeviceGetEccMode(h))  # nvidia-smi -q: ECC Mode
    out["ecc_enabled"] = None if mode is None else bool(mode[0])
    if out["ecc_enabled"]:
        unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        out["ecc_uncorrected_volatile"] = _try(
            lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_VOLATILE_ECC))
        )
        out["ecc_uncorrected_aggregate"] = _try(
            lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_AGGREGATE_ECC))
        )
    rows = _try(lambda: nv.nvmlDeviceGetRemappedRows(h))  # nvidia-smi -q: Remapped Rows (Ampere+)
    if rows is not None:
        out["remapped_rows_uncorrectable"] = int(rows[1])
        out["remapped_rows_pending"] = bool(rows[2])
        out["remapped_rows_failed"] = bool(rows[3])
    else:  # pre-Ampere: Retired Pages
        pages = _try(
            lambda: nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        )
        out["retired_pages"] = None if pages is None else len(pages)
        pending = _try(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
        out["retired_pages_pending"] = None if pending is None else bool(pending)
    return out


def _nvlinks(nv: Any, h: Any) -> tuple[int | None, int | None]:
    active = inactive = 0
    supported = False
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _call(nv.nvmlDeviceGetNvLinkState, h, link)  # nvidia-smi nvlink -s
        if state is None:
            continue
        supported = True
        if state:
            active += 1
        else:
            inactive += 1
    return (active, inactive) if supported else (None, None)


def _fabric(nv: Any, h: Any) -> tuple[str | None, str | None]:
    """GPU fabric registration (NVSwitch systems; nvidia-smi -q "Fabric"): set by Fabric Manager."""
    if not hasattr(nv, "c_nvmlGpuFabricInfo_t"):
        return None, None
    info = nv.c_nvmlGpuFabricInfo_t()
    if _try(lambda: nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))) is None:
        return None, None
    status = _try(lambda: _text(nv.nvmlErrorString(info.status)))
    return FABRIC_STATE.get(int(info.state), str(info.state)), status


def _throttle(nv: Any, h: Any) -> tuple[str, ...]:
    fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    mask = _try(lambda: int(fn(h)))
    if mask is None:
        return ()
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


def _processes(nv: Any, h: Any) -> tuple[GpuProcess, ...]:
    procs = _try(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)) or []
    out = []
    for p in procs:
        name = _call_text(nv.nvmlSystemGetProcessName, p.pid)
        used = getattr(p, "usedGpuMemory", None)
        out.append(
            GpuProcess(
                pid=int(p.pid), used_memory_mib=_mib(used) if isinstance(used, int) else None, name=name
            )
        )
    return tuple(out)


def _gpu(nv: Any, index: int) -> tuple[Any, GpuFacts]:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    cc = _try(lambda: nv.nvmlDeviceGetCudaComputeCapability(h))
    mem = _try(lambda: nv.nvmlDeviceGetMemoryInfo(h))
    pci = _try(lambda: nv.nvmlDeviceGetPciInfo(h))
    mig_mode, mig_pending, instances = _mig(nv, h)
    power = _try(lambda: nv.nvmlDeviceGetPowerUsage(h))  # milliwatts
    limit = _try(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
    util = _try(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    active, inactive = _nvlinks(nv, h)
    fabric_state, fabric_status = _fabric(nv, h)
    gpu = GpuFacts(
        index=index,
        uuid=_try(lambda: _text(nv.nvmlDeviceGetUUID(h))),
        name=_try(lambda: _text(nv.nvmlDeviceGetName(h))),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        memory_total_mib=_mib(mem.total) if mem else None,
        memory_used_mib=_mib(mem.used) if mem else None,
        pci_bus_id=_text(pci.busId) if pci else None,
        persistence_mode=_try(lambda: bool(nv.nvmlDeviceGetPersistenceMode(h))),
        mig_mode=mig_mode,
        mig_pending=mig_pending,
        mig_instances=instances,
        utilization_pct=int(util.gpu) if util else None,
        temperature_c=_try(lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
        power_draw_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        sm_clock_mhz=_try(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
        sm_clock_max_mhz=_try(lambda: int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM))),
        throttle_reasons=_throttle(nv, h),
        nvlink_active=active,
        nvlink_inactive=inactive,
        fabric_state=fabric_state,
        fabric_status=fabric_status,
        processes=_processes(nv, h),
        **_ecc(nv, h),
    )
    return h, gpu


def _p2p(nv: Any, handles: list[Any]) -> tuple[P2PPair, ...]:
    """P2P status for every GPU pair (nvidia-smi topo -p2p r / w / n) and their PCIe common ancestor (topo -m)."""

    def status(a: Any, b: Any, cap: int) -> str | None:
        s = _try(lambda: nv.nvmlDeviceGetP2PStatus(a, b, cap))
        return None if s is None else P2P_STATUS.get(int(s), str(s))

    pairs = []
    for i, j in itertools.combinations(range(len(handles)), 2):
        a, b = handles[i], handles[j]
        topo = _call(nv.nvmlDeviceGetTopologyCommonAncestor, a, b)
        pairs.append(
            P2PPair(
                a=i,
                b=j,
                read=status(a, b, nv.NVML_P2P_CAPS_INDEX_READ),
                write=status(a, b, nv.NVML_P2P_CAPS_INDEX_WRITE),
                nvlink=status(a, b, nv.NVML_P2P_CAPS_INDEX_NVLINK),
                topology=None if topo is None else TOPOLOGY.get(int(topo), str(topo)),
            )
        )
    return tuple(pairs)


def probe_nvml() -> NvmlFacts:
    """Everything NVML says about the driver and each GPU; ``nvidia-smi -q`` plus ``nvidia-smi topo -m/-p2p``."""
    try:
        import pynvml as nv
    except ImportError:
        return NvmlFacts(ProbeStatus.MISSING, error="nvidia-ml-py (module pynvml) is not installed")
    try:
        nv.nvmlInit()
    except nv.NVMLError as err:
        code = getattr(err, "value", None)
        status = (
            ProbeStatus.MISSING
            if code == nv.NVML_ERROR_LIBRARY_NOT_FOUND
            else (ProbeStatus.DENIED if code == nv.NVML_ERROR_NO_PERMISSION else ProbeStatus.FAILED)
        )
        return NvmlFacts(status, error=f"nvmlInit: {err}")
    try:
        cuda = _try(lambda: int(nv.nvmlSystemGetCudaDriverVersion_v2()))
        handles, gpus = [], []
        for i in range(nv.nvmlDeviceGetCount()):
            h, g = _gpu(nv, i)
            handles.append(h)
            gpus.append(g)
        return NvmlFacts(
            ProbeStatus.OK,
            driver_version=_try(lambda: _text(nv.nvmlSystemGetDriverVersion())),
            cuda_driver_version=None if cuda is None else f"{cuda // 1000}.{(cuda % 1000) // 10}",
            nvml_version=_try(lambda: _text(nv.nvmlSystemGetNVMLVersion())),
            gpus=tuple(gpus),
            p2p=_p2p(nv, handles),
        )
    except nv.NVMLError as err:
        return NvmlFacts(ProbeStatus.FAILED, error=f"NVML: {err}")
    finally:
        _try(nv.nvmlShutdown)
