"""The GPU inventory: what GPUs (and MIG instances) this host has, as plain frozen records.

Two sources, one shape:

* :func:`torchrig.runtime.nvml.probe` asks NVML (``nvidia-smi -q`` is the shell equivalent);
* :func:`load_snapshot` reads a recorded NVML snapshot (JSON written by ``torchrig gpus --record FILE``).

The snapshot is the hardware boundary's test hook: ``TORCHRIG_GPU_INVENTORY=FILE`` (or ``--inventory FILE``)
makes every environment command use that recorded inventory instead of NVML, so leases, placement and
pre-flight can be exercised on a host without GPUs. The leasable *units* are whole GPUs (MIG off) and MIG
instances (MIG on): a MIG-enabled GPU is never leased whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.errors import InputError

SNAPSHOT_SCHEMA_VERSION = 1
INVENTORY_ENV = "TORCHRIG_GPU_INVENTORY"


@dataclass(frozen=True)
class MigRecord:
    """One MIG instance (``nvidia-smi -L`` lists it as ``MIG 1g.18gb Device 0: (UUID: MIG-...)``)."""

    uuid: str
    parent_uuid: str
    parent_index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    name: str
    memory_total_mib: int | None


@dataclass(frozen=True)
class GpuRecord:
    """One physical GPU as NVML reports it. ``None`` means NVML could not tell."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str | None
    compute_capability: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_gpu_pct: int | None
    numa_node: int | None
    # GPUs with the same value share an NVLink/NVSwitch domain (NVML fabric clique, or NVLink peers).
    nvlink_domain: str | None
    mig_enabled: bool = False
    mig: tuple[MigRecord, ...] = ()


@dataclass(frozen=True)
class Unit:
    """A leasable unit: a whole GPU or one MIG instance."""

    uuid: str
    gpu_index: int
    label: str  # "0", "1" or "0/MIG 1g.18gb#2" for humans
    is_mig: bool
    numa_node: int | None
    nvlink_domain: str | None


@dataclass(frozen=True)
class Inventory:
    source: str  # "nvml" or the snapshot file's path
    driver_version: str | None
    cuda_driver_version: str | None  # the highest CUDA the driver supports, e.g. "13.0"
    gpus: tuple[GpuRecord, ...]

    def units(self) -> tuple[Unit, ...]:
        out: list[Unit] = []
        for g in self.gpus:
            if g.mig_enabled:
                for m in g.mig:
                    label = f"{g.index}/{m.name.rsplit('MIG', 1)[-1].strip() or 'MIG'}#{m.gpu_instance_id}"
                    out.append(Unit(m.uuid, g.index, label, True, g.numa_node, g.nvlink_domain))
            else:
                out.append(Unit(g.uuid, g.index, str(g.index), False, g.numa_node, g.nvlink_domain))
        return tuple(out)

    def gpu(self, index: int) -> GpuRecord | None:
        return next((g for g in self.gpus if g.index == index), None)


def _mig_from(d: dict[str, Any]) -> MigRecord:
    return MigRecord(
        uuid=str(d["uuid"]),
        parent_uuid=str(d["parent_uuid"]),
        parent_index=int(d["parent_index"]),
        gpu_instance_id=d.get("gpu_instance_id"),
        compute_instance_id=d.get("compute_instance_id"),
        name=str(d.get("name", "MIG")),
        memory_total_mib=d.get("memory_total_mib"),
    )


def _gpu_from(d: dict[str, Any]) -> GpuRecord:
    return GpuRecord(
        index=int(d["index"]),
        uuid=str(d["uuid"]),
        name=str(d["name"]),
        pci_bus_id=d.get("pci_bus_id"),
        compute_capability=d.get("compute_capability"),
        memory_total_mib=d.get("memory_total_mib"),
        memory_used_mib=d.get("memory_used_mib"),
        utilization_gpu_pct=d.get("utilization_gpu_pct"),
        numa_node=d.get("numa_node"),
        nvlink_domain=d.get("nvlink_domain"),
        mig_enabled=bool(d.get("mig_enabled", False)),
        mig=tuple(_mig_from(m) for m in d.get("mig", ())),
    )


def from_dict(data: dict[str, Any], source: str) -> Inventory:
    """Build an inventory from a snapshot dictionary; a malformed one is an :class:`InputError`."""
    if data.get("schema_version") != SNAPSHOT_SCHEMA_VERSION:
        raise InputError(
            f"GPU inventory {source}: schema_version must be {SNAPSHOT_SCHEMA_VERSION}",
            hint="record a fresh one with 'torchrig gpus --record FILE' on the GPU host",
        )
    try:
        gpus = tuple(_gpu_from(g) for g in data["gpus"])
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(
            f"GPU inventory {source}: malformed GPU entry ({type(err).__name__}: {err})",
            hint="record a fresh one with 'torchrig gpus --record FILE'",
        ) from None
    return Inventory(
        source=source,
        driver_version=data.get("driver_version"),
        cuda_driver_version=data.get("cuda_driver_version"),
        gpus=gpus,
    )


def to_dict(inv: Inventory) -> dict[str, Any]:
    from torchrig.report import jsonable

    return {
        "schema_version": SNAPSHOT_SCHEMA_VERSION,
        "driver_version": inv.driver_version,
        "cuda_driver_version": inv.cuda_driver_version,
        "gpus": jsonable(list(inv.gpus)),
    }


def load_snapshot(path: str | os.PathLike[str]) -> Inventory:
    from torchrig.inputfiles import read_json

    p = Path(path)
    try:
        data = read_json(p, "GPU inventory file")  # bounded size and depth, UTF-8, no NaN
    except InputError as err:
        raise InputError(
            err.message, hint=f"unset {INVENTORY_ENV} to use NVML, or point it at a recorded snapshot"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"GPU inventory file {p} is not a JSON object")
    return from_dict(data, str(p))
