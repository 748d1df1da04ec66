"""The NVML probe: what the driver's management library says about the driver and each GPU, as
:class:`~torchrig.hw.record.NvmlFacts` (``nvidia-smi -q`` plus ``nvidia-smi topo -m/-p2p``).

It is :func:`torchrig.hw.gpus.probe` (the one probe of the GPUs' facts) with each GPU's health, processes and
every pair's P2P status, and who each process is (user, Docker container). A missing binding, a missing
library or a failed ``nvmlInit`` is recorded in ``NvmlFacts.status``/``error`` (a finding later, never a
crash).
"""

from __future__ import annotations

from collections.abc import Iterable

from torchrig.hw import gpus
from torchrig.hw.record import NvmlFacts


def _identify(pids: Iterable[int]) -> dict[int, tuple[str | None, str | None]]:
    from torchrig.doctor.probes.container import docker_socket
    from torchrig.doctor.probes.processes import identify

    return identify(pids, docker_socket())


def probe_nvml(identify: gpus.Identify | None = _identify) -> NvmlFacts:
    """Everything NVML says about the driver and each GPU; ``nvidia-smi -q`` plus ``nvidia-smi topo -m/-p2p``.
    ``identify`` says who each GPU process is (user, container); None leaves them unknown."""
    return gpus.probe(health=True, identify=identify)
