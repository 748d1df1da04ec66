"""The probed facts: one frozen record per area, gathered into :class:`Facts`.

Probes (``torchrig.doctor.probes``) are the only code that touches the host; they return these records.
Checks (``torchrig.doctor.checks``) are pure functions of them. A ``Facts`` record round-trips through
JSON (:func:`facts_to_json` / :func:`facts_from_json`): that JSON is the one recording format
(:mod:`torchrig.hw.record`), what ``torchrig doctor --record FILE`` writes, what ``--facts FILE`` replays
(a recording of ``torchrig gpus --record`` too: its other areas read as not probed), and the fixture format of
the tests. The GPUs' records (``nvml``: :class:`NvmlFacts`, :class:`GpuFacts`) are the one record of a GPU
that every area reads; they live in :mod:`torchrig.hw.record`.

``None`` always means "unknown / not probed", never zero or "no".
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The GPUs' records are torchrig.hw.record's (the one record of a GPU); named here too, for the probes and checks.
from torchrig.hw.record import AREAS as AREAS
from torchrig.hw.record import RECORDING_SCHEMA_VERSION as RECORDING_SCHEMA_VERSION
from torchrig.hw.record import GpuFacts as GpuFacts
from torchrig.hw.record import GpuProcess as GpuProcess
from torchrig.hw.record import MigInstance as MigInstance
from torchrig.hw.record import NvmlFacts as NvmlFacts
from torchrig.hw.record import P2PPair as P2PPair
from torchrig.hw.record import ProbeStatus as ProbeStatus
from torchrig.hw.record import build, check_document, to_json
from torchrig.jsonrecords import Count


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


_DRIVER_VERSION_RE = re.compile(r"\b(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b")


def driver_version_in(text: str) -> str | None:
    """The driver version a library's file name (``libcuda.so.580.95.05``) or the kernel module's banner
    (``NVRM version: ... 580.95.05 ...``) carries; None when it carries none."""
    m = _DRIVER_VERSION_RE.search(text)
    return m.group(1) if m else None


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
    # listed before any probe starts: CUDA's first use (the torch probe) recreates a missing /dev/nvidia-uvm
    # through nvidia-modprobe where it can, and would hide that it was gone
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
    # why /dev/nvidia-uvm, though listed, is no use to CUDA: refused when opened read-write ("Operation not
    # permitted": a container's device cgroup) or another device than nvidia-uvm (its major number is not the
    # one /proc/devices gives); None: it opened as nvidia-uvm, or there was none to open
    uvm_node_error: str | None = field(default=None, metadata={"added_later": True})


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
    device_count: Count | None = None  # bounded when read: one entry per GPU
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
    cpu_count: Count | None = None
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
    schema_version: int = RECORDING_SCHEMA_VERSION
    recorded_at: str | None = field(default=None, metadata={"bookkeeping": True})
    torchrig_version: str | None = field(default=None, metadata={"bookkeeping": True})
    # "probed" | "recorded on ..." | "derived from X: ..."
    source: str = field(default="probed", metadata={"bookkeeping": True})
    probe_ms: dict[str, float] = field(default_factory=dict, metadata={"bookkeeping": True})
    # what the JSON this record was read from lacked (an older probe wrote it): read as unknown or empty
    absent: tuple[str, ...] = field(default=(), metadata={"bookkeeping": True})


# ---------------------------------------------------------------- JSON codec
def facts_to_json(facts: Facts) -> dict[str, Any]:
    """The recording of these facts; fields added after the recorded fixtures are written only when known."""
    data = typing.cast(dict[str, Any], to_json(facts))
    data.pop("absent", None)  # a property of the file it was read from, not a fact about the machine
    return data


def facts_from_json(data: dict[str, Any], *, where: str = "facts") -> Facts:
    """Rebuild :class:`Facts` from a recording; unknown keys are ignored, missing ones take defaults.

    Facts recorded by an older probe load: a missing field is unknown (None or empty), a missing area is
    ``skipped`` (as with ``--only``; a ``torchrig gpus --record`` recording has the ``nvml`` area alone).
    Raises ``ValueError`` with the path of the offending key when a value has the wrong type.
    """
    data = dict(check_document(data, where))
    absent: list[str] = [part for part in AREAS if data.get(part) is None]  # a null area: not probed
    for part in absent:
        data[part] = {"status": ProbeStatus.SKIPPED.value}
    # an area recorded as not probed (doctor --only, or the areas of a gpus --record recording) lacks nothing
    skipped = [p for p in AREAS if p not in absent and data[p] == {"status": ProbeStatus.SKIPPED.value}]
    facts = build(Facts, data, where, absent)
    if not absent:
        return facts
    whole = [f"{where}.{part}." for part in AREAS if part in absent]  # listed once, not field by field
    quiet = tuple(whole + [f"{where}.{part}." for part in skipped])
    relative = tuple(a.removeprefix(f"{where}.") for a in absent if not a.startswith(quiet))
    return dataclasses.replace(facts, absent=relative)


def load_facts(path: str | Path) -> Facts:
    """Read a recording; InputError (exit 2) with a one-line message when it is unreadable or malformed."""
    from torchrig.errors import InputError
    from torchrig.hw.record import read_recording

    p = Path(path)
    hint = "record one with 'torchrig doctor --record FILE'"
    data = read_recording(p, "facts file", hint=hint)  # bounded size and depth, UTF-8, no NaN
    try:
        return facts_from_json(data, where=p.name)
    except (ValueError, TypeError) as err:
        raise InputError(f"facts file {str(p)!r} is malformed: {err}", hint=hint) from None
