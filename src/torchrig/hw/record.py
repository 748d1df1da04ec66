"""One GPU's facts, as every area reads them, and the one recording format they are kept in.

:class:`GpuFacts` is the one record of a GPU: what it is (index, UUID, name, compute capability, memory, MIG
instances), where it sits (PCI bus id, NUMA node, NVLink domain), how it is (utilization, ECC, clocks,
throttling, processes). :class:`NvmlFacts` is NVML's whole answer: the driver, every GPU, every pair.
They are built from the NVML adapter's records by :mod:`torchrig.hw.gpus` alone, and read by doctor's
checks, ``torchrig gpus``, the environments' placement and pre-flight, the launcher (``bench`` and
``launch``) and the dashboard. Plain data: nothing is imported here that touches the host.

The recording format is doctor's facts document, versioned by ``schema_version``: a JSON object with the
probed areas, of which ``nvml`` holds :class:`NvmlFacts`. ``torchrig doctor --record FILE`` writes every
area; ``torchrig gpus --record FILE`` writes the ``nvml`` area (the other areas are then not probed). Either
file is read by ``torchrig doctor --facts FILE``, ``torchrig gpus --inventory FILE`` and
``TORCHRIG_GPU_INVENTORY=FILE``. :func:`read_recording` is the one reader (bounded by
:mod:`torchrig.inputfiles`); :func:`build` turns its JSON into records through :mod:`torchrig.jsonrecords`
(the one JSON-to-record reader), naming the key that is wrong.

An inventory snapshot written by ``torchrig gpus --record`` before this format (``{"schema_version": 1,
"gpus": [...]}`` with ``mig_enabled``/``mig``/``utilization_gpu_pct``) is still read: :func:`upgrade`
turns it into a recording, and ``tools/convert_gpu_recordings.py`` rewrites such a file in place.

``None`` always means "unknown / not probed", never zero or "no".
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

RECORDING_SCHEMA_VERSION = 1  # doctor's facts schema: the recording is that document
AREAS = ("nvml", "kernel", "torch", "env", "container", "docker")  # the probed parts of a recording
RECORD_HINT = (
    "record one with 'torchrig gpus --record FILE' or 'torchrig doctor --record FILE' on the GPU host"
)


class ProbeStatus(str, enum.Enum):
    OK = "ok"
    MISSING = "missing"  # the tool/library/package is not installed
    FAILED = "failed"  # it is there but returned an error (the error text is kept)
    DENIED = "denied"  # permission denied
    TIMEOUT = "timeout"
    SKIPPED = "skipped"  # not run (--only) or not applicable


@dataclass(frozen=True)
class MigInstance:
    """One MIG device (``nvidia-smi -L``: ``MIG 1g.18gb Device 0: (UUID: MIG-...)``); a leasable unit."""

    uuid: str | None
    name: str | None  # e.g. "NVIDIA H200 MIG 1g.18gb"
    memory_total_mib: int | None
    gpu_instance_id: int | None = field(default=None, metadata={"added_later": True})
    compute_instance_id: int | None = field(default=None, metadata={"added_later": True})


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML lists on a GPU (``nvidia-smi``'s process table). ``user`` comes from /proc/PID/status
    and ``container`` from the Docker Engine API where the process runs in a Docker container; the pid is the
    host's, so inside a container both stay unknown."""

    pid: int
    used_memory_mib: int | None
    name: str | None
    sm_util_pct: int | None = None  # nvmlDeviceGetProcessUtilization over the last samples
    user: str | None = None
    container: str | None = None  # the Docker container's name (or its short id when the API does not say)
    kind: str = "compute"  # compute | graphics


@dataclass(frozen=True)
class GpuFacts:
    """One GPU (``nvidia-smi -q``; ``--query-gpu=index,uuid,name,pci.bus_id,memory.total,...``)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    compute_capability: str | None = None  # "9.0"
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    pci_bus_id: str | None = None  # "00000000:18:00.0"
    persistence_mode: bool | None = None
    mig_mode: bool | None = None  # current MIG mode
    mig_pending: bool | None = None  # pending MIG mode (differs until reset)
    mig_instances: tuple[MigInstance, ...] = ()
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_pages: int | None = None  # pre-Ampere dynamic page retirement
    retired_pages_pending: bool | None = None
    remapped_rows_uncorrectable: int | None = None  # Ampere+ row remapping
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()  # names, see torchrig.hw.nvml_records.THROTTLE_REASONS
    nvlink_active: int | None = None
    nvlink_inactive: int | None = None
    fabric_state: str | None = None  # not_supported | not_started | in_progress | completed
    fabric_status: str | None = None  # NVML return text of the fabric status ("Success")
    processes: tuple[GpuProcess, ...] = ()
    # PCIe link (nvidia-smi -q "GPU Link Info"): current and the most the GPU and its slot both support
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    # sysfs /sys/bus/pci/devices/BUS/numa_node (nvidia-smi topo -m "NUMA Affinity")
    numa_node: int | None = field(default=None, metadata={"added_later": True})
    # GPUs with the same value share an NVLink/NVSwitch domain (NVML fabric clique, or NVLink peers)
    nvlink_domain: str | None = field(default=None, metadata={"added_later": True})
    # CUDA's device properties (torch.cuda.get_device_properties(i).L2_cache_size, as bench's ranks read
    # them); NVML does not report it, so a recording leaves it unknown
    l2_cache_bytes: int | None = field(default=None, metadata={"added_later": True})


@dataclass(frozen=True)
class P2PPair:
    a: int
    b: int
    # ok | chipset_not_supported | gpu_not_supported | topology_not_supported | disabled_by_regkey |
    # not_supported | unknown (NVML_P2P_STATUS_*)
    read: str | None
    write: str | None
    nvlink: str | None  # same vocabulary, NVML_P2P_CAPS_INDEX_NVLINK
    # internal | single | multiple | hostbridge | node | system (nvidia-smi topo -m: PIX PXB PHB NODE SYS)
    topology: str | None


@dataclass(frozen=True)
class NvmlFacts:
    """What NVML says about the driver and each GPU (the ``nvml`` area of a recording)."""

    status: ProbeStatus
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the newest CUDA the driver supports ("13.0")
    nvml_version: str | None = None
    gpus: tuple[GpuFacts, ...] = ()
    p2p: tuple[P2PPair, ...] = ()


# ---------------------------------------------------------------- JSON codec
def to_json(record: Any) -> Any:
    """A record as JSON-ready data; a field added after the recorded fixtures, or marked ``when_known``, is
    written only when known."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if (f.metadata.get("added_later") or f.metadata.get("when_known")) and value is None:
                continue
            out[f.name] = to_json(value)
        return out
    if isinstance(record, enum.Enum):
        return record.value
    if isinstance(record, dict):
        return {str(k): to_json(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [to_json(v) for v in record]
    return record


def build(cls: type[T], data: Any, where: str, absent: list[str]) -> T:
    """One record from its JSON object, read by :func:`torchrig.jsonrecords.structure` (a ``RecordError``,
    a ``ValueError``, naming the key that does not fit). A key the record lacks (written by an older probe) is
    unknown: its default, None, or ``skipped`` for a status; only a key that cannot be unknown fails, by name.
    The keys that were missing are appended to ``absent``."""
    from torchrig.jsonrecords import structure

    record = structure(data, cls, where, unknown={ProbeStatus: ProbeStatus.SKIPPED})
    _lacked(record, data, where, absent)
    return record


def _lacked(record: Any, data: Any, where: str, absent: list[str]) -> None:
    """What ``data`` lacked of ``record`` (read from it): the keys of fields it did not write, by path;
    bookkeeping and fields added after the recorded fixtures are no fact of the machine and not listed."""
    if dataclasses.is_dataclass(record) and isinstance(data, dict):
        for f in dataclasses.fields(record):
            if f.name in data:
                _lacked(getattr(record, f.name), data[f.name], f"{where}.{f.name}", absent)
            elif not f.metadata.get("bookkeeping") and not f.metadata.get("added_later"):
                absent.append(f"{where}.{f.name}")
    elif isinstance(record, tuple) and isinstance(data, list):
        for i, (item, raw) in enumerate(zip(record, data, strict=False)):
            _lacked(item, raw, f"{where}[{i}]", absent)


# ---------------------------------------------------------------- the recording format
def recording(
    nvml: NvmlFacts, *, source: str, recorded_at: str | None, torchrig_version: str | None
) -> dict[str, Any]:
    """A recording of NVML's answer alone (what ``torchrig gpus --record`` writes): doctor's facts document
    whose other areas say ``skipped`` (not probed, as with ``doctor --only``), so doctor reads it too."""
    return {
        "schema_version": RECORDING_SCHEMA_VERSION,
        "recorded_at": recorded_at,
        "torchrig_version": torchrig_version,
        "source": source,
        "nvml": to_json(nvml),
        **{area: {"status": ProbeStatus.SKIPPED.value} for area in AREAS if area != "nvml"},
    }


def is_old_inventory(data: Any) -> bool:
    """An inventory snapshot of the format ``torchrig gpus --record`` wrote before the recording format."""
    return (
        isinstance(data, dict)
        and data.get("schema_version") == 1
        and isinstance(data.get("gpus"), list)
        and not any(area in data for area in AREAS)
    )


def _old_gpu(g: Any) -> Any:
    if not isinstance(g, dict):
        return g  # refused by the codec, by name
    new = {k: v for k, v in g.items() if k not in ("utilization_gpu_pct", "mig_enabled", "mig")}
    new["utilization_pct"] = g.get("utilization_gpu_pct")
    new["mig_mode"] = g.get("mig_enabled", False)
    migs = g.get("mig", [])
    new["mig_instances"] = (
        [
            {k: v for k, v in m.items() if k not in ("parent_uuid", "parent_index")}
            if isinstance(m, dict)
            else m
            for m in migs
        ]
        if isinstance(migs, list)
        else migs
    )
    return new


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """An old inventory snapshot as a recording: the same facts under the record's names (``mig_enabled`` is
    ``mig_mode``, ``mig`` is ``mig_instances``, ``utilization_gpu_pct`` is ``utilization_pct``)."""
    out: dict[str, Any] = {
        "schema_version": RECORDING_SCHEMA_VERSION,
        "source": "an inventory snapshot of the format torchrig gpus --record wrote before the recording",
        "upgraded_from": "inventory snapshot",
        "nvml": {
            "status": ProbeStatus.OK.value,
            "driver_version": data.get("driver_version"),
            "cuda_driver_version": data.get("cuda_driver_version"),
            "gpus": [_old_gpu(g) for g in data["gpus"]],
        },
    }
    for key in ("note", "_comment"):
        if key in data:
            out[key] = data[key]
    return out


def check_document(data: Any, where: str) -> dict[str, Any]:
    """The recording's JSON object, an old inventory snapshot upgraded; ``ValueError`` naming what is wrong."""
    if is_old_inventory(data):
        return upgrade(data)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object")
    if "schema_version" not in data or not any(part in data for part in AREAS):
        raise ValueError(
            f"{where}: not a torchrig recording (it needs schema_version and the probed areas, e.g. 'nvml')"
        )
    version = data["schema_version"]
    if version != RECORDING_SCHEMA_VERSION:
        raise ValueError(f"{where}: schema_version {version!r:.30} is not {RECORDING_SCHEMA_VERSION}")
    return data


def nvml_from_json(data: Any, where: str) -> NvmlFacts:
    """The ``nvml`` area of a recording (a ``ValueError`` naming what is wrong); a recording without it
    (doctor's ``--only`` left NVML out) is NVML not probed."""
    doc = check_document(data, where)
    area = doc.get("nvml")
    if area is None:
        return NvmlFacts(ProbeStatus.SKIPPED)
    if not isinstance(area, dict):
        raise ValueError(f"{where}.nvml: expected an object, got {type(area).__name__}")
    return build(NvmlFacts, area, f"{where}.nvml", [])


def read_recording(path: str | Path, what: str, hint: str = RECORD_HINT) -> dict[str, Any]:
    """A recording's JSON object, read through :mod:`torchrig.inputfiles` (bounded size and depth, UTF-8, no
    NaN, a regular file) and checked to be one (an old inventory snapshot upgraded). Anything wrong is an
    :class:`~torchrig.errors.InputError` (exit 2) of one line that names the file."""
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_json

    p = Path(path)
    try:
        data = read_json(p, what)
    except InputError as err:
        raise InputError(err.message, hint=hint) from None
    try:
        return check_document(data, p.name)
    except ValueError as err:
        raise InputError(f"{what} {str(p)!r} is malformed: {err}", hint=hint) from None
