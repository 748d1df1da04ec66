"""The NVML probe: what the driver's management library says about the driver and each GPU, as
:class:`~torchrig.doctor.facts.NvmlFacts` (``nvidia-smi -q`` plus ``nvidia-smi topo -m/-p2p``).

NVML is read through :mod:`torchrig.hw.nvml`, the one adapter over nvidia-ml-py; this module only turns its
records into facts. A query the GPU or driver does not support leaves its field ``None``. A missing binding,
a missing library or a failed ``nvmlInit`` is recorded in ``NvmlFacts.status``/``error`` (a finding later,
never a crash).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from torchrig.doctor.facts import GpuFacts, GpuProcess, MigInstance, NvmlFacts, P2PPair, ProbeStatus
from torchrig.hw import nvml

# How each reason NVML cannot be used shows in the facts (the checks read status and error).
STATUS = {
    nvml.NvmlErrorKind.BINDINGS_MISSING: ProbeStatus.MISSING,
    nvml.NvmlErrorKind.LIBRARY_MISSING: ProbeStatus.MISSING,
    nvml.NvmlErrorKind.NO_PERMISSION: ProbeStatus.DENIED,
}


Identify = Callable[[Iterable[int]], dict[int, tuple[str | None, str | None]]]


def gpu_facts(
    device: nvml.NvmlDevice,
    health: nvml.NvmlHealth,
    who: dict[int, tuple[str | None, str | None]] | None = None,
) -> GpuFacts:
    """One GPU's facts from the adapter's records and who each process is (pid -> user, container) (pure)."""
    who = who or {}
    links = device.nvlinks
    fabric = device.fabric
    readings = {f.name: getattr(health, f.name) for f in dataclasses.fields(health) if f.name != "processes"}
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
        mig_instances=tuple(MigInstance(m.uuid, m.name, m.memory_total_mib) for m in device.mig_instances),
        utilization_pct=device.utilization_gpu_pct,
        # no link answered: NVLink unknown (None), not "0 links"
        nvlink_active=sum(link.active for link in links) if links else None,
        nvlink_inactive=sum(not link.active for link in links) if links else None,
        fabric_state=None if fabric is None else fabric.state,
        fabric_status=None if fabric is None else fabric.status,
        processes=tuple(
            GpuProcess(p.pid, p.used_memory_mib, p.name, p.sm_util_pct, *who.get(p.pid, (None, None)), p.kind)
            for p in health.processes
        ),
        **readings,
    )


def p2p_pair(pair: nvml.NvmlPair) -> P2PPair:
    return P2PPair(pair.a, pair.b, pair.read, pair.write, pair.nvlink, pair.topology)


def _identify(pids: Iterable[int]) -> dict[int, tuple[str | None, str | None]]:
    from torchrig.doctor.probes.container import docker_socket
    from torchrig.doctor.probes.processes import identify

    return identify(pids, docker_socket())


def probe_nvml(identify: Identify | None = _identify) -> NvmlFacts:
    """Everything NVML says about the driver and each GPU; ``nvidia-smi -q`` plus ``nvidia-smi topo -m/-p2p``.
    ``identify`` says who each GPU process is (user, container); None leaves them unknown."""
    try:
        with nvml.session() as gpus:
            system = gpus.system()
            devices = gpus.devices()
            healths = [gpus.health(d.index) for d in devices]
            pids = {p.pid for h in healths for p in h.processes}
            who = identify(pids) if identify and pids else {}
            facts = tuple(gpu_facts(d, h, who) for d, h in zip(devices, healths, strict=True))
            pairs = gpus.pairs()
    except nvml.NvmlError as err:
        if err.step == "import":
            return NvmlFacts(ProbeStatus.MISSING, error=err.message)
        if err.step == "nvmlInit":
            return NvmlFacts(STATUS.get(err.kind, ProbeStatus.FAILED), error=f"nvmlInit: {err.message}")
        return NvmlFacts(ProbeStatus.FAILED, error=f"NVML: {err.message}")
    return NvmlFacts(
        ProbeStatus.OK,
        driver_version=system.driver_version,
        cuda_driver_version=system.cuda_driver_version,
        nvml_version=system.nvml_version,
        gpus=facts,
        p2p=tuple(p2p_pair(p) for p in pairs),
    )
