"""The probed facts: one frozen record per area, gathered into :class:`Facts`.

Probes (``torchrig.doctor.probes``) are the only code that touches the host; they return these records.
Checks (``torchrig.doctor.checks``) are pure functions of them. A ``Facts`` record round-trips through
JSON (:func:`facts_to_json` / :func:`facts_from_json`): that JSON is what ``torchrig doctor --record FILE``
writes, what ``--facts FILE`` replays, and the fixture format of the tests.

``None`` always means "unknown / not probed", never zero or "no".
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

FACTS_SCHEMA_VERSION = 1
AREAS = ("nvml", "kernel", "torch", "env", "container", "docker")  # the probed parts of Facts


class ProbeStatus(str, enum.Enum):
    OK = "ok"
    MISSING = "missing"  # the tool/library/package is not installed
    FAILED = "failed"  # it is there but returned an error (the error text is kept)
    DENIED = "denied"  # permission denied
    TIMEOUT = "timeout"
    SKIPPED = "skipped"  # not run (--only) or not applicable


# ---------------------------------------------------------------- NVML (nvidia-ml-py)
@dataclass(frozen=True)
class MigInstance:
    uuid: str | None
    name: str | None  # e.g. "NVIDIA H200 MIG 1g.18gb"
    memory_total_mib: int | None


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


@dataclass(frozen=True)
class P2PPair:
    a: int
    b: int
    read: (
        str | None
    )  # ok | chipset_not_supported | gpu_not_supported | topology_not_supported | disabled_by_regkey | not_supported | unknown
    write: str | None
    nvlink: str | None  # same vocabulary, NVML_P2P_CAPS_INDEX_NVLINK
    topology: (
        str | None
    )  # internal | single | multiple | hostbridge | node | system (nvidia-smi topo -m: PIX PXB PHB NODE SYS)


@dataclass(frozen=True)
class NvmlFacts:
    status: ProbeStatus
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the newest CUDA the driver supports ("13.0")
    nvml_version: str | None = None
    gpus: tuple[GpuFacts, ...] = ()
    p2p: tuple[P2PPair, ...] = ()


# ---------------------------------------------------------------- kernel side
@dataclass(frozen=True)
class DeviceNode:
    path: str
    accessible: bool  # read+write for this user


@dataclass(frozen=True)
class PciDevice:
    bus_id: str  # "0000:18:00.0"
    device_id: str  # "0x2335"
    class_code: str  # "0x030200"


@dataclass(frozen=True)
class DriverLibrary:
    """A copy of the driver's user-space library (``libcuda.so.1``, ``libnvidia-ml.so.1``) where the dynamic
    loader looks, in its search order (ld.so(8)): ``LD_LIBRARY_PATH``, then ``/etc/ld.so.cache``, then the
    default directories; and the CUDA forward-compatibility package's (``origin`` "compat"), which loads only
    when one of those points at it."""

    soname: str  # libcuda.so.1 | libnvidia-ml.so.1
    path: str  # where the loader finds the soname (often a symlink)
    real_path: str  # the file it resolves to
    version: str | None  # from the real file's name (libcuda.so.580.95.05); None: the name says none
    origin: str  # ld_library_path | ld_cache | default_dir | compat
    size_bytes: int | None = None  # a driver's libcuda is tens of MB; the toolkit's link-time stub is small
    stub: bool = False  # a link-time stub (CUDA toolkit's lib64/stubs): it cannot run anything


@dataclass(frozen=True)
class KernelFacts:
    status: ProbeStatus
    kernel_release: str | None = None
    module_version: str | None = None  # /proc/driver/nvidia/version
    module_flavor: str | None = None  # open | proprietary
    modules_loaded: tuple[
        str, ...
    ] = ()  # nvidia, nvidia_uvm, nvidia_modeset, nvidia_drm, nvidia_peermem, nouveau
    module_installed_version: str | None = None  # modinfo -F version nvidia
    device_nodes: tuple[DeviceNode, ...] = ()
    nvml_library: str | None = None  # resolved path of libnvidia-ml.so.1
    nvml_library_version: str | None = None  # from its file name
    cuda_library: str | None = None  # libcuda.so.1
    cuda_library_version: str | None = None
    pci_gpus: tuple[PciDevice, ...] = ()
    pci_nvswitches: tuple[PciDevice, ...] = ()
    fabric_manager: str | None = None  # active | inactive | failed | not_installed | None (unknown)
    wsl: bool = False
    wsl_driver_libs: bool | None = None  # /usr/lib/wsl/lib/libcuda.so.1 present
    secure_boot: bool | None = None
    os_id: str | None = None  # /etc/os-release ID
    os_version_id: str | None = None
    os_like: tuple[str, ...] = ()
    os_pretty: str | None = None
    # platform.machine() and /etc/nv_tegra_release's first line: they name the platform (torchrig.compat.platforms).
    # Added after the recorded fixtures: their absence from an older record is an unknown platform, not a gap.
    machine: str | None = field(default=None, metadata={"added_later": True})
    tegra_release: str | None = field(default=None, metadata={"added_later": True})
    driver_libraries: tuple[DriverLibrary, ...] = ()  # in the loader's search order
    # the kernel log (dmesg / /dev/kmsg): None unreadable or not tried; () read, no Xid
    xid_events: tuple[str, ...] | None = None
    kernel_log_error: str | None = None  # why the kernel log could not be read


# ---------------------------------------------------------------- the installed PyTorch
@dataclass(frozen=True)
class TorchDevice:
    index: int
    name: str | None
    compute_capability: str | None
    kernel_ok: bool | None  # a tiny kernel ran
    kernel_error: str | None


@dataclass(frozen=True)
class PeerAccess:
    a: int
    b: int
    can_access: bool


@dataclass(frozen=True)
class NcclDeviceCheck:
    index: int  # the CUDA device (after CUDA_VISIBLE_DEVICES)
    ok: bool
    error: str | None = None  # the text init_process_group / all_reduce raised
    elapsed_ms: float | None = None


@dataclass(frozen=True)
class NcclPairCheck:
    """``--deep``: two ranks (one process per GPU) all-reduce over GPUs ``a`` and ``b``."""

    a: int
    b: int
    ok: bool
    error: str | None = None
    elapsed_ms: float | None = None


@dataclass(frozen=True)
class NcclFacts:
    """``init_process_group("nccl", world_size=1)`` over a FileStore, one all_reduce, destroy: per GPU."""

    status: str  # ok | failed | timeout | crashed | skipped
    error: str | None = None  # why skipped, or the crash/timeout text
    devices: tuple[NcclDeviceCheck, ...] = ()
    env_used: tuple[str, ...] = ()  # the NCCL_*/GLOO_* variables set when it ran
    pairs: tuple[NcclPairCheck, ...] = ()  # --deep only


@dataclass(frozen=True)
class CrashTrace:
    """The failed torch probe run again: with only the essential variables, then bisecting the user's others
    (delta debugging) down to the one or two without which it works."""

    failure: str  # what the first run ended with ("killed by SIGSEGV", "exited with status 1: ...")
    clean_ok: (
        bool | None
    )  # the probe with the essentials only: works (True), fails too (False), unknown (None)
    clean_failure: str | None = None
    culprits: tuple[str, ...] = ()  # NAME=value of the variables that make it fail (one, or a pair)
    essentials: tuple[str, ...] = ()  # the names kept in the clean run
    runs: int = 0
    elapsed_ms: float | None = None
    note: str | None = None  # why the bisection stopped short (run or time budget)


@dataclass(frozen=True)
class TorchFacts:
    status: ProbeStatus
    error: str | None = None
    python_executable: str | None = None  # the child's sys.executable
    python_version: str | None = None
    # the interpreter doctor ran: --python as given, made absolute (not resolved: a venv's python is a symlink
    # whose target is outside the venv); None: doctor's own
    python_requested: str | None = None
    # the probe child's pid (it holds a CUDA context while it runs: not someone else on the GPU)
    pid: int | None = field(default=None, metadata={"bookkeeping": True})
    origin: str | None = None  # where "import torch" found it (importlib.util.find_spec("torch").origin)
    version: str | None = None  # torch.__version__
    cuda_version: str | None = None  # torch.version.cuda
    hip_version: str | None = None
    arch_list: tuple[str, ...] = ()
    cudnn_version: str | None = None
    nccl_version: str | None = None
    is_available: bool | None = None
    device_count: int | None = None
    init_error: str | None = None  # the text CUDA initialisation raised
    warnings: tuple[str, ...] = ()
    devices: tuple[TorchDevice, ...] = ()
    peer_access: tuple[PeerAccess, ...] = ()
    loaded_libraries: tuple[str, ...] = ()  # CUDA libraries mapped into the process, from /proc/self/maps
    wheel_libraries: tuple[str, ...] = ()  # site-packages/nvidia/*/lib/*.so* of that interpreter
    import_ms: float | None = None
    # torch's own parser on PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF (the error it raised; None: accepted or
    # not asked)
    alloc_conf_error: str | None = field(default=None, metadata={"added_later": True})
    # a one-process NCCL communicator on each visible GPU (None: not run)
    nccl: NcclFacts | None = field(default=None, metadata={"added_later": True})
    # a probe that failed, re-run with the environment reduced and bisected (None: not traced)
    trace: CrashTrace | None = field(default=None, metadata={"added_later": True})
    # where the child's time went: import, versions, cuda_init (is_available + init), devices (a kernel on
    # each GPU), peers (can_device_access_peer per pair), maps (/proc/self/maps); absent from facts recorded before it was added
    steps_ms: dict[str, float] = field(default_factory=dict, metadata={"bookkeeping": True})


# ---------------------------------------------------------------- environment
@dataclass(frozen=True)
class EnvVar:
    """A variable that torch, NCCL, gloo, the CUDA runtime or the loader reads, as this process has it, and
    where it is probably set: ``file:line`` of a shell profile or /etc/environment that assigns it, or
    ``container`` (it is in the environment the container started with: the image's ENV or ``docker run -e``)."""

    name: str
    value: str
    set_in: tuple[str, ...] = ()


@dataclass(frozen=True)
class IbDevice:
    """An RDMA device of /sys/class/infiniband and its port numbers (``ibstat``'s CA list)."""

    name: str  # mlx5_0
    ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class EnvFacts:
    status: ProbeStatus
    cuda_visible_devices: str | None = None  # None: unset
    nvidia_visible_devices: str | None = None
    ld_library_path: tuple[str, ...] = ()
    ld_library_libs: tuple[str, ...] = ()  # CUDA libraries found in LD_LIBRARY_PATH dirs, full paths
    ld_preload: str | None = None
    nvcc_path: str | None = None
    nvcc_version: str | None = None  # "13.0"
    cuda_home: str | None = None
    # the CUDA/NCCL/torch/gloo variables of the process (names in torchrig/doctor/data/env_vars.toml, and every
    # NCCL_*, TORCH_NCCL_*, PYTORCH_*, CUDA_*); None: not probed (facts recorded before they were)
    variables: tuple[EnvVar, ...] | None = field(default=None, metadata={"added_later": True})
    net_interfaces: tuple[str, ...] | None = field(
        default=None, metadata={"added_later": True}
    )  # /sys/class/net
    ib_devices: tuple[IbDevice, ...] | None = field(default=None, metadata={"added_later": True})


# ---------------------------------------------------------------- container, limits, Docker
@dataclass(frozen=True)
class ContainerFacts:
    status: ProbeStatus
    in_container: bool | None = None
    runtime: str | None = None  # docker | podman | kubernetes | containerd | lxc | ...
    evidence: tuple[str, ...] = ()
    shm_bytes: int | None = None
    memlock_bytes: int | None = None  # soft limit; None with memlock_unlimited=True means unlimited
    memlock_unlimited: bool | None = None
    stack_bytes: int | None = None
    stack_unlimited: bool | None = None
    cgroup_version: int | None = None
    cgroup_cpu_limit: float | None = None  # cores; None: no limit or unknown
    cgroup_memory_limit_bytes: int | None = None
    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    rdma_devices: tuple[str, ...] = ()  # /dev/infiniband/uverbs*


@dataclass(frozen=True)
class DockerFacts:
    status: ProbeStatus  # MISSING: no engine socket
    error: str | None = None
    server_version: str | None = None
    runtimes: tuple[str, ...] = ()
    default_runtime: str | None = None
    cdi_spec_dirs: tuple[str, ...] = ()
    cdi_specs: tuple[str, ...] = ()  # spec files that declare nvidia.com/gpu devices
    toolkit_binaries: tuple[
        str, ...
    ] = ()  # nvidia-ctk, nvidia-container-runtime(-hook), nvidia-container-cli on PATH


@dataclass(frozen=True)
class Facts:
    """Everything doctor knows about one machine, as data."""

    nvml: NvmlFacts
    kernel: KernelFacts
    torch: TorchFacts
    env: EnvFacts
    container: ContainerFacts
    docker: DockerFacts
    schema_version: int = FACTS_SCHEMA_VERSION
    recorded_at: str | None = field(default=None, metadata={"bookkeeping": True})
    torchrig_version: str | None = field(default=None, metadata={"bookkeeping": True})
    # "probed" | "recorded on ..." | "derived from X: ..."
    source: str = field(default="probed", metadata={"bookkeeping": True})
    probe_ms: dict[str, float] = field(default_factory=dict, metadata={"bookkeeping": True})
    # what the JSON this record was read from lacked (an older probe wrote it): read as unknown or empty
    absent: tuple[str, ...] = field(default=(), metadata={"bookkeeping": True})


# ---------------------------------------------------------------- JSON codec
def facts_to_json(facts: Facts) -> dict[str, Any]:
    from torchrig.report import jsonable

    data = typing.cast(dict[str, Any], jsonable(facts))
    data.pop("absent", None)  # a property of the file it was read from, not a fact about the machine
    for area, kind in (("kernel", KernelFacts), ("torch", TorchFacts), ("env", EnvFacts)):
        for f in dataclasses.fields(kind):  # fields added later are written only when known
            if f.metadata.get("added_later") and data.get(area, {}).get(f.name) is None:
                data.get(area, {}).pop(f.name, None)
    return data


def _convert(tp: Any, value: Any, where: str, absent: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, where, absent)
    if value is None:  # a JSON null where the record has no None: named, not a crash in a check later
        raise ValueError(f"{where}: null where {getattr(tp, '__name__', 'a value')} belongs")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        return _build(tp, value, where, absent)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        return tuple(_convert(inner, v, f"{where}[{i}]", absent) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise ValueError(f"{where}: expected {tp.__name__}, got {value!r:.60}")
    if (
        tp is int
        and not (0 if where.endswith("count") else -(2**53)) <= value <= _MAX_INT[where.endswith("count")]
    ):
        # a count sizes loops and tables (device_count: one entry per GPU): bounded, so a file cannot
        # make doctor allocate without end
        raise ValueError(f"{where}: {value} is out of range")
    return value


_MAX_INT = {False: 2**53, True: 65536}  # any integer fact; a count (GPUs, CPUs, links)


def _accepts_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _build(cls: type, data: dict[str, Any], where: str, absent: list[str]) -> Any:
    """One record from its JSON object. A key the record lacks (written by an older probe) is unknown: its
    default, or None for the few fields without one; only a key that cannot be unknown fails, by name."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}", absent)
            continue
        if not f.metadata.get("bookkeeping") and not f.metadata.get("added_later"):
            absent.append(f"{where}.{f.name}")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if hints[f.name] is ProbeStatus:
                kwargs[f.name] = ProbeStatus.SKIPPED  # an area without a status was not probed
            elif _accepts_none(hints[f.name]):
                kwargs[f.name] = None
            else:
                raise ValueError(f"{where}.{f.name}: missing")
    return cls(**kwargs)


def facts_from_json(data: dict[str, Any], *, where: str = "facts") -> Facts:
    """Rebuild :class:`Facts` from its JSON form; unknown keys are ignored, missing ones take defaults.

    Facts recorded by an older probe load: a missing field is unknown (None or empty), a missing area is
    ``skipped`` (as with ``--only``). Raises ``ValueError`` with the path of the offending key when a value
    has the wrong type.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object")
    if "schema_version" not in data or not any(part in data for part in AREAS):
        raise ValueError(f"{where}: not a doctor facts record (it needs schema_version and the probed areas)")
    version = data["schema_version"]
    if version != FACTS_SCHEMA_VERSION:
        raise ValueError(f"{where}: facts schema_version {version} is not {FACTS_SCHEMA_VERSION}")
    data = dict(data)
    absent: list[str] = [part for part in AREAS if data.get(part) is None]  # a null area: not probed
    for part in absent:
        data[part] = {"status": ProbeStatus.SKIPPED.value}
    facts = _build(Facts, data, where, absent)
    if not absent:
        return typing.cast(Facts, facts)
    whole = [f"{where}.{part}." for part in AREAS if part in absent]  # listed once, not field by field
    relative = tuple(a.removeprefix(f"{where}.") for a in absent if not a.startswith(tuple(whole)))
    return typing.cast(Facts, dataclasses.replace(facts, absent=relative))


def load_facts(path: str | Path) -> Facts:
    """Read a facts snapshot; UsageError (exit 2) with a one-line message when it is unreadable or malformed."""
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_json

    p = Path(path)
    try:
        data = read_json(p, "facts file")  # bounded size and depth, UTF-8, no NaN
    except InputError as err:
        raise InputError(err.message, hint="record one with 'torchrig doctor --record FILE'") from None
    try:
        return facts_from_json(data, where=p.name)
    except (ValueError, TypeError) as err:
        raise InputError(
            f"facts file {str(p)!r} is malformed: {err}",
            hint="record one with 'torchrig doctor --record FILE'",
        ) from None
