"""The NVML adapter: one narrow boundary that turns NVML answers into :class:`Inventory` records.

Shell equivalents: ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,
utilization.gpu --format=csv``, ``nvidia-smi -L`` (MIG instances), ``nvidia-smi topo -m`` (NVLink, NUMA).
Every query that a GPU or driver does not support yields ``None``; no NVML at all (no driver, no GPU)
yields an empty inventory, never an exception.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchrig.runtime.inventory import GpuRecord, Inventory, MigRecord


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Any, *args: Any) -> Any:
    import pynvml

    try:
        return fn(*args)
    except (pynvml.NVMLError, AttributeError, TypeError):
        return None


def numa_node_of(pci_bus_id: str | None) -> int | None:
    """NUMA node from sysfs (NVML's bus id ``00000000:18:00.0`` is ``0000:18:00.0`` there); -1 means none."""
    if not pci_bus_id:
        return None
    domain, _, rest = pci_bus_id.lower().partition(":")
    path = Path("/sys/bus/pci/devices") / f"{domain[-4:]}:{rest}" / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _fabric_clique(pynvml: Any, handle: Any) -> str | None:
    """NVSwitch systems (Hopper+ with Fabric Manager): GPUs of one NVLink domain share cluster UUID + clique."""
    try:
        info = pynvml.c_nvmlGpuFabricInfo_t()
        pynvml.nvmlDeviceGetGpuFabricInfo(handle, info)
    except (pynvml.NVMLError, AttributeError):
        return None
    if info.state != getattr(pynvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3) or info.status != 0:
        return None
    cluster = bytes(info.clusterUuid).hex()
    return f"fabric-{cluster[:12]}-{info.cliqueId}"


def _nvlink_peers(pynvml: Any, handle: Any) -> tuple[set[str], bool]:
    """Bus ids of GPUs this GPU reaches over active NVLinks, and whether any link goes to an NVSwitch."""
    peers: set[str] = set()
    switch = False
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        if _try(pynvml.nvmlDeviceGetNvLinkState, handle, link) != 1:
            continue
        kind = _try(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        if kind == getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
            switch = True
            continue
        pci = _try(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        if pci is not None:
            peers.add(_text(pci.busId).lower())
    return peers, switch


def _domains(
    bus_ids: list[str | None], links: list[tuple[set[str], bool]], cliques: list[str | None]
) -> list[str | None]:
    """Union GPUs joined by direct NVLinks or a shared NVSwitch fabric into named domains."""
    n = len(bus_ids)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index_of = {(b or "").lower(): i for i, b in enumerate(bus_ids)}
    switched = [i for i, (_, sw) in enumerate(links) if sw]
    for i, (peers, _) in enumerate(links):
        for bus in peers:
            j = index_of.get(bus)
            if j is not None:
                parent[find(i)] = find(j)
    for group_key in {c for c in cliques if c}:
        members = [i for i, c in enumerate(cliques) if c == group_key]
        for j in members[1:]:
            parent[find(members[0])] = find(j)
    if not any(cliques):  # NVSwitch without fabric info: one switch fabric joins every switched GPU
        for j in switched[1:]:
            parent[find(switched[0])] = find(j)
    has_link = [bool(links[i][0]) or links[i][1] or bool(cliques[i]) for i in range(n)]
    return [f"nvlink-{find(i)}" if has_link[i] else None for i in range(n)]


def _mig_records(pynvml: Any, handle: Any, parent_uuid: str, parent_index: int) -> tuple[MigRecord, ...]:
    out = []
    for k in range(_try(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = _try(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, k)
        if mig is None:
            continue
        mem = _try(pynvml.nvmlDeviceGetMemoryInfo, mig)
        out.append(
            MigRecord(
                uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                parent_uuid=parent_uuid,
                parent_index=parent_index,
                gpu_instance_id=_try(pynvml.nvmlDeviceGetGpuInstanceId, mig),
                compute_instance_id=_try(pynvml.nvmlDeviceGetComputeInstanceId, mig),
                name=_text(_try(pynvml.nvmlDeviceGetName, mig) or "MIG"),
                memory_total_mib=(mem.total // 2**20) if mem else None,
            )
        )
    return tuple(out)


def probe() -> Inventory:
    """Ask NVML for every GPU; an empty inventory when NVML or the driver is not there."""
    try:
        import pynvml
    except ImportError:
        return Inventory("nvml (nvidia-ml-py not installed)", None, None, ())
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return Inventory(f"nvml ({err})", None, None, ())
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_int = _try(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        cuda = f"{cuda_int // 1000}.{cuda_int % 1000 // 10}" if cuda_int else None
        count = pynvml.nvmlDeviceGetCount()
        raw: list[dict[str, Any]] = []
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        for i, h in enumerate(handles):
            pci = _try(pynvml.nvmlDeviceGetPciInfo, h)
            mem = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
            util = _try(pynvml.nvmlDeviceGetUtilizationRates, h)
            cc = _try(pynvml.nvmlDeviceGetCudaComputeCapability, h)
            mode = _try(pynvml.nvmlDeviceGetMigMode, h)
            raw.append(
                {
                    "index": i,
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "pci_bus_id": _text(pci.busId) if pci else None,
                    "cc": f"{cc[0]}.{cc[1]}" if cc else None,
                    "mem": mem,
                    "util": util.gpu if util else None,
                    "mig": bool(mode and mode[0] == 1),
                }
            )
        links = [_nvlink_peers(pynvml, h) for h in handles]
        cliques = [_fabric_clique(pynvml, h) for h in handles]
        domains = _domains([r["pci_bus_id"] for r in raw], links, cliques)
        gpus = tuple(
            GpuRecord(
                index=r["index"],
                uuid=r["uuid"],
                name=r["name"],
                pci_bus_id=r["pci_bus_id"],
                compute_capability=r["cc"],
                memory_total_mib=r["mem"].total // 2**20 if r["mem"] else None,
                memory_used_mib=r["mem"].used // 2**20 if r["mem"] else None,
                utilization_gpu_pct=r["util"],
                numa_node=numa_node_of(r["pci_bus_id"]),
                nvlink_domain=domains[i],
                mig_enabled=r["mig"],
                mig=_mig_records(pynvml, handles[i], r["uuid"], i) if r["mig"] else (),
            )
            for i, r in enumerate(raw)
        )
        return Inventory("nvml", driver, cuda, gpus)
    finally:
        _try(pynvml.nvmlShutdown)
