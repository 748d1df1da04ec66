"""The GPU inventory: what GPUs (and MIG instances) this host has, as the one record of a GPU
(:class:`torchrig.hw.record.GpuFacts`, the record doctor, bench and the dashboard read too).

Two sources, one shape:

* :func:`torchrig.runtime.nvml.probe` asks NVML (``nvidia-smi -q`` is the shell equivalent);
* :func:`load_snapshot` reads a recording (the JSON ``torchrig gpus --record FILE`` or ``torchrig doctor
  --record FILE`` writes; :mod:`torchrig.hw.record` describes the format).

The recording is the hardware boundary's test hook: ``TORCHRIG_GPU_INVENTORY=FILE`` (or ``--inventory FILE``)
makes every environment command use that recorded inventory instead of NVML, so leases, placement and
pre-flight can be exercised on a host without GPUs. The leasable *units* are whole GPUs (MIG off) and MIG
instances (MIG on): a MIG-enabled GPU is never leased whole. A GPU or MIG instance without a UUID (or a GPU
without a name) cannot be leased (leases, ``docker --gpus device=`` and ``CUDA_VISIBLE_DEVICES`` name GPUs by
UUID): it is left out, and the source says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.errors import InputError
from torchrig.hw.record import GpuFacts, NvmlFacts, ProbeStatus

INVENTORY_ENV = "TORCHRIG_GPU_INVENTORY"


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
    source: str  # "nvml" or the recording's path
    driver_version: str | None
    cuda_driver_version: str | None  # the highest CUDA the driver supports, e.g. "13.0"
    gpus: tuple[GpuFacts, ...]  # each with a UUID and a name
    nvml_version: str | None = None

    def units(self) -> tuple[Unit, ...]:
        out: list[Unit] = []
        for g in self.gpus:
            if g.mig_mode:
                for m in g.mig_instances:
                    if m.uuid is None:
                        continue
                    kind = (m.name or "").rsplit("MIG", 1)[-1].strip() or "MIG"
                    label = f"{g.index}/{kind}#{m.gpu_instance_id}"
                    out.append(Unit(m.uuid, g.index, label, True, g.numa_node, g.nvlink_domain))
            else:
                out.append(Unit(str(g.uuid), g.index, str(g.index), False, g.numa_node, g.nvlink_domain))
        return tuple(out)

    def gpu(self, index: int) -> GpuFacts | None:
        return next((g for g in self.gpus if g.index == index), None)


def from_nvml(facts: NvmlFacts, source: str = "nvml") -> Inventory:
    """The inventory of NVML's answer (probed, or read from a recording named ``source``). NVML that could
    not be used is an empty inventory whose source says why; a GPU without a UUID or name is left out."""
    if facts.status is not ProbeStatus.OK:
        why = (facts.error or facts.status.value).removeprefix("nvmlInit: ").removeprefix("NVML: ")
        if facts.status is ProbeStatus.MISSING and "nvidia-ml-py" in why:
            why = "nvidia-ml-py not installed"
        return Inventory(f"{source} ({why})", None, None, ())
    usable = tuple(g for g in facts.gpus if g.uuid is not None and g.name is not None)
    left_out = [str(g.index) for g in facts.gpus if g.uuid is None or g.name is None]
    if left_out:
        source = f"{source} (GPU {', '.join(left_out)} left out: no UUID or name from NVML)"
    return Inventory(source, facts.driver_version, facts.cuda_driver_version, usable, facts.nvml_version)


def to_dict(inv: Inventory) -> dict[str, Any]:
    """The inventory as a recording (the one format: :func:`torchrig.hw.record.recording`)."""
    from torchrig import __version__
    from torchrig.hw.record import recording

    nvml = NvmlFacts(
        ProbeStatus.OK, None, inv.driver_version, inv.cuda_driver_version, inv.nvml_version, inv.gpus
    )
    return recording(nvml, source=inv.source, recorded_at=None, torchrig_version=__version__)


def from_dict(data: dict[str, Any], source: str) -> Inventory:
    """An inventory from a recording's JSON object; a malformed one is an :class:`InputError`."""
    from torchrig.hw.record import is_old_inventory, nvml_from_json

    old = is_old_inventory(data) or (isinstance(data, dict) and "upgraded_from" in data)
    try:
        facts = nvml_from_json(data, source)
    except (ValueError, TypeError) as err:
        raise InputError(
            f"GPU inventory {source}: {err}", hint="record a fresh one with 'torchrig gpus --record FILE'"
        ) from None
    if facts.status is ProbeStatus.SKIPPED:
        raise InputError(
            f"GPU inventory {source}: the recording has no NVML facts",
            hint="record one with 'torchrig gpus --record FILE' (doctor --only leaves NVML out)",
        )
    if old:
        source += " (an old inventory snapshot: record it again with 'torchrig gpus --record FILE')"
    return from_nvml(facts, source)


def load_snapshot(path: str | os.PathLike[str]) -> Inventory:
    from torchrig.hw.record import read_recording

    p = Path(path)
    data = read_recording(
        p, "GPU inventory file", hint=f"unset {INVENTORY_ENV} to use NVML, or point it at a recording"
    )
    return from_dict(data, str(p))
