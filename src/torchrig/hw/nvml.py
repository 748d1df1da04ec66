"""The one boundary to NVML, through nvidia-ml-py (module ``pynvml``), imported only inside :func:`session`.

Doctor (``torchrig.doctor.probes.nvml``), the environments' GPU inventory (``torchrig.runtime.nvml``) and the
benchmark's clock, temperature and power samples (``torchrig.bench.device``) read the GPUs through this module
and keep their own logic over the records it returns::

    from torchrig.hw import nvml

    try:
        with nvml.session() as gpus:          # nvmlInit ... nvmlShutdown
            system = gpus.system()            # nvidia-smi -q: Driver Version, CUDA Version
            devices = gpus.devices()          # nvidia-smi -L / -q, nvidia-smi nvlink -s, -q "Fabric"
            names = gpus.identities()         # nvidia-smi -L: index, UUID, name, MIG mode (cheap)
            pairs = gpus.pairs()              # nvidia-smi topo -p2p r/w/n and topo -m
            now = gpus.sensors(gpus.index_of(uuid))  # nvidia-smi -q -d CLOCK,TEMPERATURE,POWER
    except nvml.NvmlError as err:             # err.kind: bindings/library missing, driver not loaded, ...
        ...

Two kinds of failure, kept apart:

* what makes NVML unusable (no bindings, no library, ``nvmlInit`` refused, the device count or a device
  handle refused) raises :class:`NvmlError`, whose ``kind`` says which (:class:`NvmlErrorKind`);
* a single query the GPU, driver or binding does not answer (not supported, no permission, a function an
  old binding lacks) leaves its field ``None`` and never raises.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torchrig.hw.nvml_records import (
    FABRIC_STATE,
    P2P_STATUS,
    REMOTE,
    THROTTLE_REASONS,
    TOPOLOGY,
    NvlinkRemote,
    NvmlDevice,
    NvmlFabric,
    NvmlHealth,
    NvmlIdentity,
    NvmlLink,
    NvmlMig,
    NvmlPair,
    NvmlProcess,
    NvmlSensors,
    NvmlSystem,
)

__all__ = [
    "FABRIC_STATE",
    "P2P_STATUS",
    "THROTTLE_REASONS",
    "TOPOLOGY",
    "NvlinkRemote",
    "Nvml",
    "NvmlDevice",
    "NvmlError",
    "NvmlErrorKind",
    "NvmlFabric",
    "NvmlHealth",
    "NvmlIdentity",
    "NvmlLink",
    "NvmlMig",
    "NvmlPair",
    "NvmlProcess",
    "NvmlSensors",
    "NvmlSystem",
    "open_for_cuda",
    "open_session",
    "session",
]

MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of bindings too old to define it (Hopper has 18 links)


class NvmlErrorKind(str, enum.Enum):
    BINDINGS_MISSING = "bindings_missing"  # nvidia-ml-py is not installed (import pynvml fails)
    LIBRARY_MISSING = "library_missing"  # libnvidia-ml.so.1 not found (NVML_ERROR_LIBRARY_NOT_FOUND)
    DRIVER_NOT_LOADED = "driver_not_loaded"  # the kernel module is not loaded (NVML_ERROR_DRIVER_NOT_LOADED)
    NO_PERMISSION = "no_permission"  # NVML_ERROR_NO_PERMISSION (device nodes not accessible)
    # the library and the kernel module are of different driver versions (NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    VERSION_MISMATCH = "version_mismatch"
    OTHER = "other"  # any other NVML error


class NvmlError(Exception):
    """NVML cannot be used: ``step`` is "import", "nvmlInit" or "enumerate"; ``message`` is NVML's own text."""

    def __init__(self, kind: NvmlErrorKind, message: str, *, step: str, code: int | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.step, self.code = kind, message, step, code


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_bytes(struct: Any, name: str) -> bytes:
    """A structure field's raw bytes. Bindings declare the fabric's cluster UUID as ``c_uint8 * 16``, ``c_uint8
    * 80`` or ``c_char * 80`` (nvidia-ml-py 13.615, 13.580, 12.570); a ``c_char`` field reads back as bytes cut
    at the first zero, so the memory is read directly."""
    field = getattr(type(struct), name)
    return ctypes.string_at(ctypes.addressof(struct) + field.offset, field.size)


def _mib(n_bytes: Any) -> int | None:
    return None if n_bytes is None else int(n_bytes) // (1024 * 1024)


def _try(fn: Callable[[], Any]) -> Any:
    """One NVML query; not supported / not permitted / any other failure -> None.

    Any exception, not only NVMLError: an old binding lacks functions or constants (AttributeError), and an
    odd answer must cost one field, not the whole probe.
    """
    try:
        return fn()
    except Exception:
        return None


def _query(nv: Any, function: str, *args: Any) -> Any:
    """``_try`` of ``nv.<function>(*args)``, the function looked up inside (a binding may lack it)."""
    return _try(lambda: getattr(nv, function)(*args))


def _query_text(nv: Any, function: str, *args: Any) -> str | None:
    value = _query(nv, function, *args)
    return None if value is None else _text(value)


def _kind(nv: Any, code: int | None) -> NvmlErrorKind:
    kinds = {
        "NVML_ERROR_LIBRARY_NOT_FOUND": NvmlErrorKind.LIBRARY_MISSING,
        "NVML_ERROR_DRIVER_NOT_LOADED": NvmlErrorKind.DRIVER_NOT_LOADED,
        "NVML_ERROR_NO_PERMISSION": NvmlErrorKind.NO_PERMISSION,
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH": NvmlErrorKind.VERSION_MISMATCH,
    }
    return next((k for name, k in kinds.items() if getattr(nv, name, None) == code), NvmlErrorKind.OTHER)


def _error(nv: Any, err: Exception, step: str) -> NvmlError:
    code = getattr(err, "value", None)
    return NvmlError(_kind(nv, code), str(err), step=step, code=code)


def open_session() -> Nvml:
    """``nvmlInit``, for a reader that lives as long as its process (a benchmark sampling its GPU); the caller
    may end it with :meth:`Nvml.close`. :class:`NvmlError` when NVML cannot start."""
    try:
        import pynvml as nv
    except ImportError:
        raise NvmlError(
            NvmlErrorKind.BINDINGS_MISSING, "nvidia-ml-py (module pynvml) is not installed", step="import"
        ) from None
    try:
        nv.nvmlInit()
    except nv.NVMLError as err:
        raise _error(nv, err, "nvmlInit") from None
    return Nvml(nv)


def open_for_cuda(torch: Any, device: Any) -> tuple[Nvml, int] | None:
    """An open session and the NVML index of CUDA ``device``, for a reader that samples one GPU while it
    works; None for a CPU device, without NVML (no nvidia-ml-py, no driver) or for a GPU NVML does not list.
    The GPU is found by its UUID: ``CUDA_VISIBLE_DEVICES`` renumbers CUDA's devices, not NVML's."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):  # an older torch without the UUID
        return None
    try:
        gpus = open_session()
    except NvmlError:
        return None
    try:
        index = gpus.index_of(uuid)
    except NvmlError:  # NVML refused the device list
        index = None
    if index is None:
        gpus.close()
        return None
    return gpus, index


@contextmanager
def session() -> Iterator[Nvml]:
    """``nvmlInit`` ... ``nvmlShutdown`` around the block; :class:`NvmlError` when NVML cannot start."""
    gpus = open_session()
    try:
        yield gpus
    finally:
        gpus.close()


class Nvml:
    """An initialised NVML; obtained from :func:`session`, valid inside its block only."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self._handles: list[Any] | None = None

    def close(self) -> None:
        """``nvmlShutdown``; a refusal is ignored."""
        _query(self._nv, "nvmlShutdown")

    def _device_handles(self) -> list[Any]:
        """Every GPU's handle; NvmlError when NVML refuses the count or a handle (e.g. a GPU lost)."""
        if self._handles is None:
            nv = self._nv
            try:
                self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            except nv.NVMLError as err:
                raise _error(nv, err, "enumerate") from None
        return self._handles

    def system(self) -> NvmlSystem:
        nv = self._nv
        cuda = _try(lambda: int(nv.nvmlSystemGetCudaDriverVersion_v2()))
        return NvmlSystem(
            driver_version=_query_text(nv, "nvmlSystemGetDriverVersion"),
            # 13000 -> "13.0"; 0 is no version (unknown), not "0.0"
            cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None,
            nvml_version=_query_text(nv, "nvmlSystemGetNVMLVersion"),
        )

    def devices(self) -> tuple[NvmlDevice, ...]:
        return tuple(self._device(i, h) for i, h in enumerate(self._device_handles()))

    def identities(self) -> tuple[NvmlIdentity, ...]:
        """Each GPU's index, UUID, name and MIG mode: four queries a GPU, for a caller that must answer in
        milliseconds (``torchrig launch`` plans with it before CUDA is touched)."""
        nv = self._nv
        out = []
        for i, h in enumerate(self._device_handles()):
            modes = _query(nv, "nvmlDeviceGetMigMode", h)
            out.append(
                NvmlIdentity(
                    index=i,
                    uuid=_query_text(nv, "nvmlDeviceGetUUID", h),
                    name=_query_text(nv, "nvmlDeviceGetName", h),
                    mig_mode=None if modes is None else bool(modes[0]),
                )
            )
        return tuple(out)

    def _device(self, index: int, h: Any) -> NvmlDevice:
        nv = self._nv
        cc = _query(nv, "nvmlDeviceGetCudaComputeCapability", h)
        mem = _query(nv, "nvmlDeviceGetMemoryInfo", h)
        pci = _query(nv, "nvmlDeviceGetPciInfo", h)
        util = _query(nv, "nvmlDeviceGetUtilizationRates", h)
        modes = _query(nv, "nvmlDeviceGetMigMode", h)  # nvidia-smi -q: MIG Mode Current/Pending
        mig_on = None if modes is None else bool(modes[0])
        return NvmlDevice(
            index=index,
            uuid=_query_text(nv, "nvmlDeviceGetUUID", h),
            name=_query_text(nv, "nvmlDeviceGetName", h),
            compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
            memory_total_mib=_mib(mem.total) if mem else None,
            memory_used_mib=_mib(mem.used) if mem else None,
            pci_bus_id=_text(pci.busId) if pci else None,
            utilization_gpu_pct=int(util.gpu) if util else None,
            mig_mode=mig_on,
            mig_pending=None if modes is None else bool(modes[1]),
            mig_instances=self._migs(h) if mig_on else (),
            nvlinks=self._links(h),
            fabric=self._fabric(h),
        )

    def _migs(self, h: Any) -> tuple[NvmlMig, ...]:
        nv = self._nv
        out = []
        for k in range(_query(nv, "nvmlDeviceGetMaxMigDeviceCount", h) or 0):
            mh = _query(nv, "nvmlDeviceGetMigDeviceHandleByIndex", h, k)
            if mh is None:  # no MIG device in this slot
                continue
            mem = _query(nv, "nvmlDeviceGetMemoryInfo", mh)
            out.append(
                NvmlMig(
                    uuid=_query_text(nv, "nvmlDeviceGetUUID", mh),
                    name=_query_text(nv, "nvmlDeviceGetName", mh),
                    memory_total_mib=_mib(mem.total) if mem else None,
                    gpu_instance_id=_query(nv, "nvmlDeviceGetGpuInstanceId", mh),
                    compute_instance_id=_query(nv, "nvmlDeviceGetComputeInstanceId", mh),
                )
            )
        return tuple(out)

    def _links(self, h: Any) -> tuple[NvmlLink, ...]:
        nv = self._nv
        out = []
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", MAX_LINKS)):
            state = _query(nv, "nvmlDeviceGetNvLinkState", h, link)  # nvidia-smi nvlink -s
            if state is None:  # no such link, or NVLink not supported
                continue
            if not state:
                out.append(NvmlLink(link, active=False))
                continue
            kind = _query(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            remote = None if kind is None else REMOTE.get(int(kind), NvlinkRemote.UNKNOWN)
            peer = (
                None
                if remote is NvlinkRemote.SWITCH
                else _query(nv, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            )
            out.append(NvmlLink(link, True, remote, None if peer is None else _text(peer.busId)))
        return tuple(out)

    def _fabric(self, h: Any) -> NvmlFabric | None:
        nv = self._nv
        if not hasattr(nv, "c_nvmlGpuFabricInfo_t"):
            return None
        info = nv.c_nvmlGpuFabricInfo_t()
        # By reference: the binding passes its argument through to C unchanged, and a structure passed by
        # value is a copy NVML never fills (read back as all zeros).
        if _query(nv, "nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info)) is None:
            return None
        return NvmlFabric(
            state=FABRIC_STATE.get(int(info.state), str(info.state)),
            status_code=int(info.status),
            status=_query_text(nv, "nvmlErrorString", info.status),
            cluster_uuid_hex=_field_bytes(info, "clusterUuid").hex(),
            # nvidia-ml-py 12.535 names the same field partitionId
            clique_id=int(getattr(info, "cliqueId", None) or getattr(info, "partitionId", None) or 0),
        )

    def index_of(self, uuid: str) -> int | None:
        """The NVML index of the GPU with this UUID (``GPU-`` prefix optional, as torch reports it without), or
        None. ``CUDA_VISIBLE_DEVICES`` renumbers CUDA's devices but not NVML's: the UUID is what they share."""
        want = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        for i, h in enumerate(self._device_handles()):
            if _query_text(self._nv, "nvmlDeviceGetUUID", h) == want:
                return i
        return None

    def sensors(self, index: int) -> NvmlSensors:
        """SM clock, temperature and power draw of GPU ``index`` now; a field NVML does not answer is None."""
        nv, h = self._nv, self._device_handles()[index]
        power = _query(nv, "nvmlDeviceGetPowerUsage", h)  # milliwatts
        return NvmlSensors(
            sm_clock_mhz=_try(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            temperature_c=_try(lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            power_draw_w=None if power is None else power / 1000.0,
        )

    def clocks_held_down_s(self, index: int) -> dict[str, float | None]:
        """How long, in seconds since the driver loaded, NVML has held GPU ``index``'s clocks down because of
        its power limit (``power``) or its temperature (``thermal``): NVML's violation counters
        (``nvmlDeviceGetViolationStatus``, nanoseconds), which ``nvidia-smi -q -d PERFORMANCE`` lists as
        "Clocks Event Reasons Counters". Counters only grow: the caller takes differences."""
        nv, h = self._nv, self._device_handles()[index]
        out: dict[str, float | None] = {}
        for name, policy in (("power", "NVML_PERF_POLICY_POWER"), ("thermal", "NVML_PERF_POLICY_THERMAL")):
            v = _query(nv, "nvmlDeviceGetViolationStatus", h, getattr(nv, policy, -1))
            out[name] = None if v is None else int(v.violationTime) / 1e9
        return out

    def limits(self, index: int) -> tuple[int | None, float | None]:
        """GPU ``index``'s highest SM clock (MHz) and enforced power limit (W); None where NVML does not say."""
        nv, h = self._nv, self._device_handles()[index]
        limit = _query(nv, "nvmlDeviceGetEnforcedPowerLimit", h)
        top = _try(lambda: int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)))
        return top, None if limit is None else limit / 1000.0

    def health(self, index: int) -> NvmlHealth:
        """ECC, row remapping, power, clocks, throttling and processes of GPU ``index``."""
        nv, h = self._nv, self._device_handles()[index]
        now = self.sensors(index)
        top, limit_w = self.limits(index)
        return NvmlHealth(
            persistence_mode=_try(lambda: bool(nv.nvmlDeviceGetPersistenceMode(h))),
            temperature_c=now.temperature_c,
            power_draw_w=now.power_draw_w,
            power_limit_w=limit_w,
            sm_clock_mhz=now.sm_clock_mhz,
            sm_clock_max_mhz=top,
            throttle_reasons=self._throttle(h),
            processes=self._processes(h),
            **self._pcie(h),
            **self._ecc(h),
        )

    def _pcie(self, h: Any) -> dict[str, Any]:
        """``nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,...``"""
        nv = self._nv

        def value(function: str) -> int | None:
            v = _query(nv, function, h)
            return None if v is None else int(v)

        return {
            "pcie_gen_current": value("nvmlDeviceGetCurrPcieLinkGeneration"),
            "pcie_gen_max": value("nvmlDeviceGetMaxPcieLinkGeneration"),
            "pcie_width_current": value("nvmlDeviceGetCurrPcieLinkWidth"),
            "pcie_width_max": value("nvmlDeviceGetMaxPcieLinkWidth"),
        }

    def _ecc(self, h: Any) -> dict[str, Any]:
        nv = self._nv
        out: dict[str, Any] = {}
        mode = _query(nv, "nvmlDeviceGetEccMode", h)  # nvidia-smi -q: ECC Mode
        out["ecc_enabled"] = None if mode is None else bool(mode[0])
        if out["ecc_enabled"]:

            def uncorrected(counter: str) -> int | None:
                unc = "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"
                return _try(
                    lambda: int(nv.nvmlDeviceGetTotalEccErrors(h, getattr(nv, unc), getattr(nv, counter)))
                )

            out["ecc_uncorrected_volatile"] = uncorrected("NVML_VOLATILE_ECC")
            out["ecc_uncorrected_aggregate"] = uncorrected("NVML_AGGREGATE_ECC")
        rows = _query(nv, "nvmlDeviceGetRemappedRows", h)  # nvidia-smi -q: Remapped Rows (Ampere+)
        if rows is not None:
            out["remapped_rows_uncorrectable"] = int(rows[1])
            out["remapped_rows_pending"] = bool(rows[2])
            out["remapped_rows_failed"] = bool(rows[3])
        else:  # pre-Ampere: Retired Pages
            pages = _try(
                lambda: nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
            )
            out["retired_pages"] = None if pages is None else len(pages)
            pending = _query(nv, "nvmlDeviceGetRetiredPagesPendingStatus", h)
            out["retired_pages_pending"] = None if pending is None else bool(pending)
        return out

    def _throttle(self, h: Any) -> tuple[str, ...]:
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        mask = None if fn is None else _try(lambda: int(fn(h)))
        if mask is None:
            return ()
        return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)

    def _sm_use(self, h: Any) -> dict[int, int]:
        """pid -> SM utilisation (%) of its latest sample (``nvidia-smi pmon -c 1``); empty when NVML keeps no
        samples (no process ran lately, or the GPU does not support it)."""
        latest: dict[int, tuple[int, int]] = {}
        for s in _query(self._nv, "nvmlDeviceGetProcessUtilization", h, 0) or []:
            pid, stamp = int(s.pid), int(getattr(s, "timeStamp", 0))
            if pid not in latest or stamp >= latest[pid][0]:
                latest[pid] = (stamp, int(s.smUtil))
        return {pid: util for pid, (_stamp, util) in latest.items()}

    def _processes(self, h: Any) -> tuple[NvmlProcess, ...]:
        nv = self._nv
        out: dict[int, NvmlProcess] = {}
        sm = None
        for kind, function in (
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
        ):
            for p in _query(nv, function, h) or []:
                if int(p.pid) in out:
                    continue
                if sm is None:
                    sm = self._sm_use(h)
                used = getattr(p, "usedGpuMemory", None)  # None: NVML_VALUE_NOT_AVAILABLE
                out[int(p.pid)] = NvmlProcess(
                    pid=int(p.pid),
                    used_memory_mib=_mib(used) if isinstance(used, int) else None,
                    name=_query_text(nv, "nvmlSystemGetProcessName", p.pid),
                    sm_util_pct=(sm or {}).get(int(p.pid)),
                    kind=kind,
                )
        return tuple(out.values())

    def pairs(self) -> tuple[NvmlPair, ...]:
        """Every GPU pair: ``nvidia-smi topo -p2p r`` / ``w`` / ``n`` and the PCIe common ancestor (``topo -m``)."""
        nv, handles = self._nv, self._device_handles()

        def status(a: Any, b: Any, cap: str) -> str | None:
            s = _try(lambda: int(nv.nvmlDeviceGetP2PStatus(a, b, getattr(nv, cap))))
            return None if s is None else P2P_STATUS.get(s, str(s))

        out = []
        for i, j in itertools.combinations(range(len(handles)), 2):
            a, b = handles[i], handles[j]
            topo = _query(nv, "nvmlDeviceGetTopologyCommonAncestor", a, b)
            out.append(
                NvmlPair(
                    a=i,
                    b=j,
                    read=status(a, b, "NVML_P2P_CAPS_INDEX_READ"),
                    write=status(a, b, "NVML_P2P_CAPS_INDEX_WRITE"),
                    nvlink=status(a, b, "NVML_P2P_CAPS_INDEX_NVLINK"),
                    topology=None if topo is None else TOPOLOGY.get(int(topo), str(topo)),
                )
            )
        return tuple(out)
