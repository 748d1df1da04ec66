"""The GPUs' facts from NVML: the adapter's records (:mod:`torchrig.hw.nvml`) turned into the one record of a
GPU (:class:`~torchrig.hw.record.GpuFacts`), plus each GPU's NUMA node (sysfs) and NVLink domain.

Doctor (``torchrig.doctor.probes.nvml``, with each GPU's health and processes), the environments' inventory
(``torchrig.runtime.nvml``, without them: milliseconds) and ``torchrig gpus --record`` all probe here.
Shell equivalents: ``nvidia-smi -q``, ``nvidia-smi -L`` (MIG instances), ``nvidia-smi topo -m`` (NVLink,
NUMA), ``nvidia-smi topo -p2p r/w/n``. A query the GPU or driver does not support leaves its field ``None``;
NVML that cannot be used at all is the record's ``status``/``error``, never an exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from torchrig.hw import nvml
from torchrig.hw.nvml_records import NvlinkRemote, NvmlDevice, NvmlFabric, NvmlHealth, NvmlLink, NvmlPair
from torchrig.hw.record import GpuFacts, GpuProcess, MigInstance, NvmlFacts, P2PPair, ProbeStatus
from torchrig.inputfiles import read_proc

# How each reason NVML cannot be used shows in the facts (doctor's checks read status and error).
STATUS = {
    nvml.NvmlErrorKind.BINDINGS_MISSING: ProbeStatus.MISSING,
    nvml.NvmlErrorKind.LIBRARY_MISSING: ProbeStatus.MISSING,
    nvml.NvmlErrorKind.NO_PERMISSION: ProbeStatus.DENIED,
}

# pid -> (user, container) of the processes on the GPUs
Identify = Callable[[Iterable[int]], dict[int, tuple[str | None, str | None]]]
NumaOf = Callable[[str | None], int | None]


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


def nvlink_domains(devices: tuple[NvmlDevice, ...]) -> list[str | None]:
    """Each device's NVLink domain: GPUs joined by direct NVLinks or a shared NVSwitch fabric, named alike."""
    bus_ids = [d.pci_bus_id for d in devices]
    links = [nvlink_peers(d.nvlinks) for d in devices]
    cliques = [fabric_clique(d.fabric) for d in devices]
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


def gpu_facts(
    device: NvmlDevice,
    health: NvmlHealth | None = None,
    who: dict[int, tuple[str | None, str | None]] | None = None,
    *,
    numa_node: int | None = None,
    nvlink_domain: str | None = None,
) -> GpuFacts:
    """One GPU's facts from the adapter's records (pure). Without ``health`` its readings stay unknown;
    ``who`` says who each process is (pid -> user, container)."""
    who = who or {}
    links = device.nvlinks
    fabric = device.fabric
    readings = (
        {}
        if health is None
        else {f.name: getattr(health, f.name) for f in dataclasses.fields(health) if f.name != "processes"}
    )
    return GpuFacts(
        index=device.index,
        uuid=device.uuid,
        name=device.name,
        compute_capability=device.compute_capability,
        memory_total_mib=device.memory_total_mib,
        memory_used_mib=device.memory_used_mib,
        pci_bus_id=device.pci_bus_id,
        mig_mode=device.mig_mode,
        mig_pending=device.mig_pending,
        mig_instances=tuple(
            MigInstance(m.uuid, m.name, m.memory_total_mib, m.gpu_instance_id, m.compute_instance_id)
            for m in device.mig_instances
        ),
        utilization_pct=device.utilization_gpu_pct,
        # no link answered: NVLink unknown (None), not "0 links"
        nvlink_active=sum(link.active for link in links) if links else None,
        nvlink_inactive=sum(not link.active for link in links) if links else None,
        fabric_state=None if fabric is None else fabric.state,
        fabric_status=None if fabric is None else fabric.status,
        processes=()
        if health is None
        else tuple(
            GpuProcess(p.pid, p.used_memory_mib, p.name, p.sm_util_pct, *who.get(p.pid, (None, None)), p.kind)
            for p in health.processes
        ),
        numa_node=numa_node,
        nvlink_domain=nvlink_domain,
        **readings,
    )


def p2p_pair(pair: NvmlPair) -> P2PPair:
    return P2PPair(pair.a, pair.b, pair.read, pair.write, pair.nvlink, pair.topology)


def probe(*, health: bool, identify: Identify | None = None, numa_of: NumaOf = numa_node_of) -> NvmlFacts:
    """Everything NVML says about the driver and each GPU. ``health`` also reads each GPU's health, its
    processes (``identify`` says who they are; None leaves them unknown) and every pair's P2P status."""
    try:
        with nvml.session() as gpus:
            system = gpus.system()
            devices = gpus.devices()
            healths = [gpus.health(d.index) for d in devices] if health else [None] * len(devices)
            pids = {p.pid for h in healths if h is not None for p in h.processes}
            who = identify(pids) if identify and pids else {}
            pairs = gpus.pairs() if health else ()
    except nvml.NvmlError as err:
        if err.step == "import":
            return NvmlFacts(ProbeStatus.MISSING, error=err.message)
        if err.step == "nvmlInit":
            return NvmlFacts(STATUS.get(err.kind, ProbeStatus.FAILED), error=f"nvmlInit: {err.message}")
        return NvmlFacts(ProbeStatus.FAILED, error=f"NVML: {err.message}")
    domains = nvlink_domains(devices)
    facts = tuple(
        gpu_facts(d, h, who, numa_node=numa_of(d.pci_bus_id), nvlink_domain=domain)
        for d, h, domain in zip(devices, healths, domains, strict=True)
    )
    return NvmlFacts(
        ProbeStatus.OK,
        driver_version=system.driver_version,
        cuda_driver_version=system.cuda_driver_version,
        nvml_version=system.nvml_version,
        gpus=facts,
        p2p=tuple(p2p_pair(p) for p in pairs),
    )
