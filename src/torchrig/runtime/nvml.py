"""The GPU inventory from NVML: :func:`torchrig.hw.gpus.probe` (the one probe, over the one adapter to
nvidia-ml-py) without the GPUs' health, turned into an :class:`Inventory`.

Shell equivalents: ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,
utilization.gpu --format=csv``, ``nvidia-smi -L`` (MIG instances), ``nvidia-smi topo -m`` (NVLink, NUMA).
Every query that a GPU or driver does not support yields ``None``; no NVML at all (no driver, no GPU, or a
GPU whose handle NVML refuses) yields an empty inventory, never an exception.
"""

from __future__ import annotations

import os

from torchrig.hw import gpus
from torchrig.runtime.inventory import INVENTORY_ENV, Inventory, from_nvml, load_snapshot


def probe(numa_of: gpus.NumaOf = gpus.numa_node_of) -> Inventory:
    """Ask NVML for every GPU; an empty inventory when NVML, the driver or a GPU handle is not there."""
    return from_nvml(gpus.probe(health=False, numa_of=numa_of))


def current(path: str | None = None) -> Inventory:
    """The inventory to use: ``path``, else ``$TORCHRIG_GPU_INVENTORY``, else NVML (an empty one without GPUs).

    It lives beside the NVML probe (not in ``inventory``, which only holds the records) so that the records
    module imports nothing of the adapter."""
    chosen = path or os.environ.get(INVENTORY_ENV)
    if chosen:
        return load_snapshot(chosen)
    return probe()
