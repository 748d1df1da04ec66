"""Which GPUs an environment gets: parse ``--gpus`` and pick free units, pure functions of records.

``--gpus`` forms: ``all`` (every whole GPU), ``N`` (N free whole GPUs, picked for locality), ``0,2`` or
``device=1`` (by index), ``GPU-…,GPU-…`` (by UUID), ``MIG-…`` (a MIG instance). Picking N prefers GPUs in
one NVLink/NVSwitch domain and one NUMA node, and among fitting groups the smallest, so large blocks stay
free for larger jobs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torchrig.errors import InputError, UsageError
from torchrig.runtime.inventory import Inventory, Unit


@dataclass(frozen=True)
class GpuRequest:
    kind: str  # "none" | "all" | "count" | "indices" | "uuids"
    count: int = 0
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()

    @property
    def wants_gpus(self) -> bool:
        return self.kind != "none"


NO_GPUS = GpuRequest("none")
_UUID_RE = re.compile(r"(GPU|MIG)-[0-9a-fA-F-]{8,}")


def parse_gpus(text: str | None) -> GpuRequest:
    """Parse a ``--gpus`` value; malformed text is a one-line :class:`UsageError`."""
    if text is None or text.strip() in ("", "none"):
        return NO_GPUS
    t = text.strip().removeprefix("device=")
    hint = "expected all, a count (2), indices (0,2 or device=1), or UUIDs (GPU-…, MIG-…)"
    if t == "all":
        return GpuRequest("all")
    if t.isdigit() and not text.strip().startswith("device="):
        n = int(t)
        if n < 1:
            raise UsageError(
                f"--gpus {text!r}: a bare number is a count, and it must be at least 1",
                hint="for GPU 0 write device=0; for no GPUs leave --gpus out",
            )
        return GpuRequest("count", count=n)
    parts = [p.strip() for p in t.split(",") if p.strip()]
    if parts and all(p.isdigit() for p in parts):
        if len(set(parts)) != len(parts):
            raise UsageError(f"--gpus {text!r} names a GPU twice", hint=hint)
        return GpuRequest("indices", indices=tuple(int(p) for p in parts))
    if parts and all(_UUID_RE.fullmatch(p) for p in parts):
        if len(set(parts)) != len(parts):
            raise UsageError(f"--gpus {text!r} names a GPU twice", hint=hint)
        return GpuRequest("uuids", uuids=tuple(parts))
    raise UsageError(f"malformed --gpus {text!r}", hint=hint)


def resolve_named(req: GpuRequest, inv: Inventory) -> tuple[Unit, ...]:
    """The units an ``all``/indices/UUID request names; unknown names are an :class:`InputError`."""
    units = inv.units()
    whole = {u.gpu_index: u for u in units if not u.is_mig}
    by_uuid = {u.uuid.lower(): u for u in units}
    if req.kind == "all":
        if not whole:
            raise InputError(
                f"--gpus all: no whole GPU in the inventory ({inv.source})",
                hint="check 'torchrig gpus'; MIG instances are leased by their MIG-UUID",
            )
        return tuple(whole.values())
    if req.kind == "indices":
        out = []
        for i in req.indices:
            if i in whole:
                out.append(whole[i])
                continue
            gpu = inv.gpu(i)
            if gpu is not None and gpu.mig_enabled:
                raise InputError(
                    f"GPU {i} is in MIG mode and cannot be leased whole",
                    hint="lease one of its instances by MIG-UUID (see 'torchrig gpus')",
                )
            raise InputError(
                f"no GPU {i} on this host (have {', '.join(map(str, sorted(whole))) or 'none'})",
                hint="see 'torchrig gpus'",
            )
        return tuple(out)
    if req.kind == "uuids":
        out = []
        for raw in req.uuids:
            u = by_uuid.get(raw.lower())
            if u is None:
                gpu = next((g for g in inv.gpus if g.uuid.lower() == raw.lower()), None)
                if gpu is not None and gpu.mig_enabled:
                    raise InputError(
                        f"{raw} is in MIG mode and cannot be leased whole",
                        hint="lease one of its instances by MIG-UUID (see 'torchrig gpus')",
                    )
                raise InputError(
                    f"no GPU or MIG instance {raw} on this host", hint="see 'torchrig gpus' for UUIDs"
                )
            out.append(u)
        return tuple(out)
    raise ValueError(f"not a named request: {req.kind}")


def pick(free: Iterable[Unit], n: int, holders: Mapping[str, int] | None = None) -> tuple[Unit, ...] | None:
    """Choose ``n`` whole GPUs from ``free``, best locality first; ``None`` when fewer than ``n`` are free.

    Order of preference: one (NVLink domain, NUMA node) group; else one NVLink domain; else the largest
    groups first. Among fitting groups the smallest wins (best fit). ``holders`` (unit uuid -> number of
    current sharers) makes shared picks prefer the least-shared GPUs.
    """
    held = holders or {}
    pool = sorted((u for u in free if not u.is_mig), key=lambda u: (held.get(u.uuid, 0), u.gpu_index))
    if len(pool) < n:
        return None

    def domain_key(u: Unit) -> str:
        return u.nvlink_domain or f"pcie-{u.gpu_index}"  # no NVLink: every GPU is its own domain

    by_domain_numa: dict[tuple[str, int | None], list[Unit]] = defaultdict(list)
    by_domain: dict[str, list[Unit]] = defaultdict(list)
    by_numa: dict[int | None, list[Unit]] = defaultdict(list)
    for u in pool:
        by_domain_numa[(domain_key(u), u.numa_node)].append(u)
        by_domain[domain_key(u)].append(u)
        by_numa[u.numa_node].append(u)
    for groups in (by_domain_numa, by_domain, by_numa):
        fitting = [g for g in groups.values() if len(g) >= n]
        if fitting:
            # the least-shared first (a free GPU before a shared one), then best fit, then the lowest index
            best = min(
                fitting, key=lambda g: (sum(held.get(u.uuid, 0) for u in g[:n]), len(g), g[0].gpu_index)
            )
            return tuple(best[:n])
    # Spread across groups: take from the largest NVLink domains first, NUMA-grouped inside each.
    chosen: list[Unit] = []
    for group in sorted(by_domain.values(), key=lambda g: (-len(g), g[0].gpu_index)):
        for u in sorted(group, key=lambda u: (u.numa_node if u.numa_node is not None else -1, u.gpu_index)):
            if len(chosen) < n:
                chosen.append(u)
    return tuple(chosen)
