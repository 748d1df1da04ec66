"""The GPU inventory from NVML: the records of :mod:`torchrig.hw.nvml` (the one adapter over nvidia-ml-py)
turned into :class:`Inventory` records, plus each GPU's NUMA node from sysfs.

Shell equivalents: ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,
utilization.gpu --format=csv``, ``nvidia-smi -L`` (MIG instances), ``nvidia-smi topo -m`` (NVLink, NUMA).
Every query that a GPU or driver does not support yields ``None``; no NVML at all (no driver, no GPU, or a
GPU whose handle NVML refuses) yields an empty inventory, never an exception.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from torchrig.hw import nvml
from torchrig.hw.nvml import NvlinkRemote, NvmlDevice, NvmlFabric, NvmlLink, NvmlSystem
from torchrig.inputfiles import read_proc
from torchrig.runtime.inventory import INVENTORY_ENV, GpuRecord, Inventory, MigRecord, load_snapshot


def numa_node_of(pci_bus_id: str | None) -> int | None:
    """NUMA node from sysfs (NVML's bus id ``00000000:18:00.0`` is ``0000:18:00.0`` there); -1 means none."""
    if not pci_bus_id:
        return None
    domain, _, rest = pci_bus_id.lower().partition(":")
    path = Path("/sys/bus/pci/devices") / f"{domain[-4:]}:{rest}" / "numa_node"
    try:
        node = int((read_proc(path, max_bytes=64) or "").strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def fabric_clique(fabric: NvmlFabric | None) -> str | None:
    """NVSwitch systems (Hopper+ with Fabric Manager): GPUs of one NVLink domain share cluster UUID + clique."""
    if fabric is None or fabric.state != "completed" or fabric.status_code != 0:
        return None
    return f"fabric-{fabric.cluster_uuid_hex[:12]}-{fabric.clique_id}"


def nvlink_peers(links: tuple[NvmlLink, ...]) -> tuple[set[str], bool]:
    """Bus ids of GPUs this GPU reaches over active NVLinks, and whether any link goes to an NVSwitch."""
    peers: set[str] = set()
    switch = False
    for link in links:
        if not link.active:
            continue
        if link.remote is NvlinkRemote.SWITCH:
            switch = True
        elif link.remote_pci_bus_id is not None:
            peers.add(link.remote_pci_bus_id.lower())
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


def mig_records(device: NvmlDevice, parent_uuid: str) -> tuple[MigRecord, ...]:
    """The device's MIG instances; one without a UUID from NVML cannot be leased and is left out."""
    return tuple(
        MigRecord(
            uuid=m.uuid,
            parent_uuid=parent_uuid,
            parent_index=device.index,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            name=m.name or "MIG",
            memory_total_mib=m.memory_total_mib,
        )
        for m in device.mig_instances
        if m.uuid is not None
    )


def inventory(
    system: NvmlSystem, devices: tuple[NvmlDevice, ...], numa_of: Callable[[str | None], int | None]
) -> Inventory:
    """The inventory from NVML's records (pure but for ``numa_of``).

    A GPU without a UUID or name from NVML (a GPU fallen off the bus answers neither) cannot be leased
    (leases, ``docker --gpus device=`` and ``CUDA_VISIBLE_DEVICES`` name GPUs by UUID): it is left out,
    and the source says so.
    """
    usable = [d for d in devices if d.uuid is not None and d.name is not None]
    domains = _domains(
        [d.pci_bus_id for d in usable],
        [nvlink_peers(d.nvlinks) for d in usable],
        [fabric_clique(d.fabric) for d in usable],
    )
    gpus = tuple(
        GpuRecord(
            index=d.index,
            uuid=str(d.uuid),
            name=str(d.name),
            pci_bus_id=d.pci_bus_id,
            compute_capability=d.compute_capability,
            memory_total_mib=d.memory_total_mib,
            memory_used_mib=d.memory_used_mib,
            utilization_gpu_pct=d.utilization_gpu_pct,
            numa_node=numa_of(d.pci_bus_id),
            nvlink_domain=domain,
            mig_enabled=bool(d.mig_mode),
            mig=mig_records(d, str(d.uuid)) if d.mig_mode else (),
        )
        for d, domain in zip(usable, domains, strict=True)
    )
    left_out = [str(d.index) for d in devices if d.uuid is None or d.name is None]
    source = f"nvml (GPU {', '.join(left_out)} left out: no UUID or name from NVML)" if left_out else "nvml"
    return Inventory(source, system.driver_version, system.cuda_driver_version, gpus)


def probe(numa_of: Callable[[str | None], int | None] = numa_node_of) -> Inventory:
    """Ask NVML for every GPU; an empty inventory when NVML, the driver or a GPU handle is not there."""
    try:
        with nvml.session() as gpus:
            system = gpus.system()
            devices = gpus.devices()
    except nvml.NvmlError as err:
        if err.kind is nvml.NvmlErrorKind.BINDINGS_MISSING:
            return Inventory("nvml (nvidia-ml-py not installed)", None, None, ())
        return Inventory(f"nvml ({err.message})", None, None, ())
    return inventory(system, devices, numa_of)


def current(path: str | None = None) -> Inventory:
    """The inventory to use: ``path``, else ``$TORCHRIG_GPU_INVENTORY``, else NVML (an empty one without GPUs).

    It lives beside the NVML probe (not in ``inventory``, which only holds the records) so that the records
    module imports nothing of the adapter."""
    chosen = path or os.environ.get(INVENTORY_ENV)
    if chosen:
        return load_snapshot(chosen)
    return probe()
