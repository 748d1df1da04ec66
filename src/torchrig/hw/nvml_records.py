"""The records and NVML's enum vocabularies of :mod:`torchrig.hw.nvml` (plain data: no NVML here).

Units are in the field names; ``None`` is a query NVML did not answer, never zero.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
# nvmlGpuP2PStatus_t, nvmlGpuTopologyLevel_t, nvmlGpuFabricState_t (nvml.h)
P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}


def p2p_verdict(read: str | None, write: str | None) -> bool | None:
    """NVML's P2P verdict on a GPU pair from the read and write statuses it gave (P2P_STATUS names): True when
    each it gave is "ok", False when one is not, None when it answered neither. Doctor and the launcher's
    placement both judge a pair by it."""
    known = [s for s in (read, write) if s is not None]
    return all(s == P2P_STATUS[0] for s in known) if known else None


TOPOLOGY = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
FABRIC_STATE = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


class NvlinkRemote(str, enum.Enum):
    """What an NVLink's other end is (nvmlIntNvLinkDeviceType_t)."""

    GPU = "gpu"
    IBMNPU = "ibmnpu"
    SWITCH = "switch"
    UNKNOWN = "unknown"


# NVML_NVLINK_DEVICE_TYPE_GPU, _IBMNPU, _SWITCH, _UNKNOWN (nvml.h)
REMOTE = {0: NvlinkRemote.GPU, 1: NvlinkRemote.IBMNPU, 2: NvlinkRemote.SWITCH, 0xFF: NvlinkRemote.UNKNOWN}


@dataclass(frozen=True)
class NvmlSystem:
    driver_version: str | None  # "580.95.05"
    cuda_driver_version: str | None  # the newest CUDA the driver supports, "13.0"
    nvml_version: str | None


@dataclass(frozen=True)
class NvmlMig:
    """One MIG device (``nvidia-smi -L``: ``MIG 1g.18gb Device 0: (UUID: MIG-...)``)."""

    uuid: str | None
    name: str | None  # "NVIDIA H200 MIG 1g.18gb"
    memory_total_mib: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True)
class NvmlLink:
    """One NVLink that answered ``nvmlDeviceGetNvLinkState`` (``nvidia-smi nvlink -s``)."""

    link: int
    active: bool
    remote: NvlinkRemote | None = None  # read for active links only
    remote_pci_bus_id: str | None = None  # the peer GPU's bus id; read for active links not to a switch


@dataclass(frozen=True)
class NvmlFabric:
    """GPU fabric registration (NVSwitch systems, set by Fabric Manager; ``nvidia-smi -q`` "Fabric")."""

    state: str  # a FABRIC_STATE name, or the raw number
    status_code: int  # an NVML return code: 0 is success
    status: str | None  # NVML's text for status_code ("Success")
    cluster_uuid_hex: str
    clique_id: int


@dataclass(frozen=True)
class NvmlIdentity:
    """What a GPU is, without its health or links: the cheap part of :class:`NvmlDevice` (``nvidia-smi -L``)."""

    index: int
    uuid: str | None
    name: str | None
    mig_mode: bool | None  # current MIG mode


@dataclass(frozen=True)
class NvmlDevice:
    """One GPU's identity, memory, MIG and links (``nvidia-smi --query-gpu=...``, ``-L``, ``nvlink -s``)."""

    index: int
    uuid: str | None
    name: str | None
    compute_capability: str | None  # "9.0"
    memory_total_mib: int | None
    memory_used_mib: int | None
    pci_bus_id: str | None  # "00000000:18:00.0"
    utilization_gpu_pct: int | None
    mig_mode: bool | None  # current MIG mode
    mig_pending: bool | None  # pending MIG mode (differs until the GPU is reset)
    mig_instances: tuple[NvmlMig, ...]  # read only when MIG is on
    nvlinks: tuple[NvmlLink, ...]  # empty when no link answered (no NVLink, or not supported)
    fabric: NvmlFabric | None


@dataclass(frozen=True)
class NvmlProcess:
    """A process on a GPU (``nvidia-smi``'s process table; ``nvidia-smi pmon`` for its SM use). The pid is in
    the host's pid namespace."""

    pid: int
    used_memory_mib: int | None
    name: str | None
    sm_util_pct: int | None = None  # nvmlDeviceGetProcessUtilization: its latest sample, None when none
    kind: str = "compute"  # compute | graphics (a process on both is listed once, as compute)


@dataclass(frozen=True)
class NvmlHealth:
    """One GPU's health readings (``nvidia-smi -q``: ECC, Remapped Rows, Power, Clocks, Processes)."""

    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None  # read only with ECC on
    ecc_uncorrected_aggregate: int | None = None
    retired_pages: int | None = None  # pre-Ampere dynamic page retirement
    retired_pages_pending: bool | None = None
    remapped_rows_uncorrectable: int | None = None  # Ampere+ row remapping
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()  # THROTTLE_REASONS names
    processes: tuple[NvmlProcess, ...] = ()
    # nvidia-smi -q "GPU Link Info": the generation drops at idle to save power; the width should not
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None  # nvmlDeviceGetMaxPcieLinkGeneration: what the GPU and its slot both do
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None


@dataclass(frozen=True)
class NvmlSensors:
    """What changes during a run, cheap to read often (``nvidia-smi -q -d CLOCK,TEMPERATURE,POWER``)."""

    sm_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None


@dataclass(frozen=True)
class NvmlPair:
    """P2P status of one GPU pair (P2P_STATUS names) and their PCIe common ancestor (TOPOLOGY name)."""

    a: int
    b: int
    read: str | None
    write: str | None
    nvlink: str | None
    topology: str | None
