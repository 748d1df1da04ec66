"""Which GPUs a command gets: one grammar for ``--gpus`` and one placement rule, pure functions of records.

Every command that takes ``--gpus`` (``up``, ``launch``, ``train``, ``bench``) parses it with
:func:`parse_gpus` and chooses its GPUs with :func:`place`.

``--gpus`` forms: ``all`` (every whole GPU that is yours to take), ``N`` (N of them), ``0,2``,
``device=1`` or ``1,`` (by index: a bare number is a count), ``GPU-…,GPU-…`` (by UUID, as
``nvidia-smi -L`` prints them), ``MIG-…`` (a MIG instance). Anything else (``-1``, ``0``, ``two``,
``0,,1``, an empty value) is a one-line usage error.

The placement rule: a GPU is *yours to take* when no lease in the ledger holds it, or every lease on it
is yours (``launch``, ``train`` and ``bench`` run as you, beside or inside your environment; ``up`` makes a
new lease, which is one environment's alone, so for ``up`` only a free GPU is yours, or one every holder
shares when you ``--share`` too). Naming a GPU someone else holds is refused (exit 2) with who holds it and
since when; ``--force`` takes it anyway and says so. Picking N prefers GPUs in one NVLink/NVSwitch domain and
one NUMA node, and among fitting groups the smallest, so large blocks stay free for larger jobs.

>>> from torchrig.runtime.inventory import Unit
>>> units = [Unit(f"GPU-{i}", i, str(i), False, None, None) for i in range(3)]
>>> [u.gpu_index for u in place(parse_gpus("all"), units, ()).units]
[0, 1, 2]
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchrig.errors import InputError, JobFailed, UsageError
from torchrig.runtime.inventory import Inventory, Unit

if TYPE_CHECKING:  # the ledger module imports sqlite3: only the type is needed here
    from torchrig.runtime.ledger import Lease


@dataclass(frozen=True)
class GpuRequest:
    kind: str  # "none" | "all" | "count" | "indices" | "uuids"
    count: int = 0
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()

    @property
    def wants_gpus(self) -> bool:
        return self.kind != "none"

    @property
    def text(self) -> str:
        """The request in ``--gpus`` words (what a command line that passes it on says)."""
        if self.kind == "count":
            return str(self.count)
        if self.kind == "indices":
            return ",".join(map(str, self.indices)) + ("," if len(self.indices) == 1 else "")
        if self.kind == "uuids":
            return ",".join(self.uuids)
        return self.kind


NO_GPUS = GpuRequest("none")


def indices_text(indices: Sequence[int]) -> str:
    """``--gpus`` words for these GPU indices: one index keeps its trailing comma ("0," is GPU 0; "0" would
    be a count, and a count of zero is refused)."""
    return GpuRequest("indices", indices=tuple(indices)).text


_UUID_RE = re.compile(r"(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F-]{7,}|MIG-GPU-[0-9a-fA-F-]{8,}/\d+/\d+")
HINT = "expected all, a count (2), indices (0,2, device=1 or 1,), or UUIDs (GPU-…, MIG-…)"


def parse_gpus(text: str | None) -> GpuRequest:
    """Parse a ``--gpus`` value; malformed text is a one-line :class:`UsageError`.

    ``None`` (the option left out) and ``none`` ask for no GPU; an empty value is a mistake (a script's unset
    variable), not "none"."""
    if text is None:
        return NO_GPUS
    raw = text.strip()
    if raw == "none":
        return NO_GPUS
    if not raw:
        raise UsageError("--gpus is empty", hint=HINT)
    t = raw.removeprefix("device=")
    if t == "all" and t == raw:
        return GpuRequest("all")
    if t.isascii() and t.isdigit() and t == raw:  # str.isdigit alone takes "٣" and "²"
        n = int(t)
        if n < 1:
            raise UsageError(
                f"--gpus {text!r}: a bare number is a count, and it must be at least 1",
                hint="for GPU 0 write device=0 (or 0,); for no GPU leave --gpus out",
            )
        return GpuRequest("count", count=n)
    parts = [p.strip() for p in t.removesuffix(",").split(",")]
    if any(not p for p in parts):
        raise UsageError(f"malformed --gpus {text!r}: an empty entry", hint=HINT)
    if all(p.isascii() and p.isdigit() for p in parts):
        if len(set(parts)) != len(parts):
            raise UsageError(f"--gpus {text!r} names a GPU twice", hint=HINT)
        return GpuRequest("indices", indices=tuple(int(p) for p in parts))
    if all(_UUID_RE.fullmatch(p) for p in parts):
        if len({p.lower() for p in parts}) != len(parts):
            raise UsageError(f"--gpus {text!r} names a GPU twice", hint=HINT)
        return GpuRequest("uuids", uuids=tuple(parts))
    if any(p.startswith("-") for p in parts):
        raise UsageError(f"--gpus {text!r}: a GPU index is 0 or more", hint=HINT)
    raise UsageError(f"malformed --gpus {text!r}", hint=HINT)


class NoFreeGpu(JobFailed):
    """The request is valid but the GPUs it needs are held by others (exit 1)."""


class GpuHeld(InputError):
    """A GPU named by the request is leased to someone else (exit 2): who holds it, since when."""


def too_few(wanted: int, have: int, source: str) -> NoFreeGpu:
    if have == 0:
        return NoFreeGpu(
            f"--gpus {wanted}: no NVIDIA GPU on this host ({source})",
            hint="check the driver with 'torchrig doctor', or leave --gpus out",
        )
    return NoFreeGpu(
        f"--gpus {wanted}: this host has only {have} whole GPU(s) ({source})", hint="ask for fewer"
    )


def held_by(unit: Unit, lease: Lease) -> bool:
    """Whether ``lease`` holds ``unit``: the same UUID, or (for a unit known by index only, or a whole GPU
    one of whose MIG instances is leased) the same GPU index."""
    if unit.uuid and lease.unit_uuid.lower() == unit.uuid.lower():
        return True
    if lease.gpu_index != unit.gpu_index:
        return False
    return not unit.uuid or (not unit.is_mig and lease.unit_uuid.startswith("MIG-"))


def holders(units: Iterable[Unit], leases: Iterable[Lease]) -> dict[str, list[Lease]]:
    """Unit label -> the leases that hold it."""
    all_leases = list(leases)
    out: dict[str, list[Lease]] = defaultdict(list)
    for u in units:
        out[u.label] = [x for x in all_leases if held_by(u, x)]
    return out


def _since(at_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(at_s))


def describe_holders(units: Iterable[Unit], held: Mapping[str, list[Lease]], *, since: bool = False) -> str:
    """``GPU 1 held by bob/bob-env1 since 2026-12-03 09:14 UTC`` for each held unit, joined by ``; ``."""
    parts = []
    for u in units:
        hs = held.get(u.label, [])
        if hs:
            who = "+".join(f"{h.user}/{h.container}{' (shared)' if h.shared else ''}" for h in hs)
            when = f" since {_since(min(h.acquired_at_s for h in hs))}" if since else ""
            parts.append(f"GPU {u.label} held by {who}{when}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Placement:
    """The units a request gets, and the lines that say what ``--force`` took from whom."""

    units: tuple[Unit, ...]
    forced: tuple[str, ...] = ()  # "GPU 1 held by bob/bob-env1 since …": taken anyway (--force)


def _never(_lease: Lease) -> bool:
    return False


def place(
    req: GpuRequest,
    units: Sequence[Unit],
    leases: Iterable[Lease],
    *,
    mine: Callable[[Lease], bool] = _never,
    share: bool = False,
    force: bool = False,
    locality: bool = True,
    inventory: Inventory | None = None,
) -> Placement:
    """The one placement rule: the units ``req`` gets among ``units`` given the current ``leases``.

    A unit is yours to take when every lease on it is yours (``mine``), or, with ``share``, every holder
    shares. ``all`` is every whole unit yours to take; ``N`` picks N of them (``locality``: NVLink/NUMA first,
    else in the order given); named units held by someone else are refused (:class:`GpuHeld`, exit 2) unless
    ``force``, which takes them and lists them in :attr:`Placement.forced`. Too few units yours for a count is
    :class:`NoFreeGpu` (exit 1: valid, busy now). ``inventory`` explains unknown names (MIG mode).
    """
    if not req.wants_gpus:
        return Placement(())
    ls = list(leases)
    held = holders(units, ls)

    def yours(u: Unit) -> bool:
        hs = held.get(u.label, [])
        return all(mine(h) for h in hs) or (share and all(h.shared for h in hs))

    def forced(taken: Iterable[Unit]) -> tuple[str, ...]:
        return tuple(describe_holders([u], held, since=True) for u in taken if not yours(u))

    whole = [u for u in units if not u.is_mig]
    hint = "pick a free GPU ('torchrig gpus' shows who holds what), or pass --force to take it anyway"
    if req.kind in ("indices", "uuids"):
        named = _resolve(req, units, inventory)
        busy = [u for u in named if not yours(u)]
        if busy and not force:
            raise GpuHeld(
                f"GPU leased to someone else: {describe_holders(busy, held, since=True)}", hint=hint
            )
        return Placement(named, forced(named))
    if req.kind == "all":
        if not whole:
            raise InputError(
                f"--gpus all: no whole GPU here ({inventory.source if inventory else 'none visible'})",
                hint="check 'torchrig gpus'; MIG instances are named by their MIG-UUID",
            )
        take = tuple(whole) if force else tuple(u for u in whole if yours(u))
        if not take:
            raise NoFreeGpu(
                f"--gpus all: none of the {len(whole)} GPU(s) is yours to take; "
                f"{describe_holders(whole, held, since=True)}",
                hint="wait for one, or name one with --force to take it anyway",
            )
        return Placement(take, forced(take))
    pool = whole if force else [u for u in whole if yours(u)]
    if locality:
        counts = {u.uuid: len(held.get(u.label, [])) for u in whole}
        chosen = pick(sorted(pool, key=lambda u: not yours(u)) if force else pool, req.count, counts)
    else:
        ordered = sorted(pool, key=lambda u: not yours(u)) if force else pool
        chosen = tuple(ordered[: req.count]) if len(ordered) >= req.count else None
    if chosen is None:
        if len(whole) < req.count:
            raise too_few(req.count, len(whole), inventory.source if inventory else "visible GPUs")
        raise NoFreeGpu(
            f"no free GPU: {req.count} wanted, {len(pool)} of {len(whole)} yours to take; "
            f"{describe_holders(whole, held, since=True)}",
            hint="wait for one, 'torchrig down NAME' one of yours, or pass --share to share deliberately",
        )
    return Placement(chosen, forced(chosen))


def _resolve(req: GpuRequest, units: Sequence[Unit], inventory: Inventory | None) -> tuple[Unit, ...]:
    if inventory is not None:
        return resolve_named(req, inventory, units)
    by_index = {u.gpu_index: u for u in units if not u.is_mig}
    by_uuid = {u.uuid.lower(): u for u in units if u.uuid}
    out = []
    for i in req.indices:
        if i not in by_index:
            raise InputError(
                f"--gpus names GPU {i}, which is not visible",
                hint=f"visible: {','.join(map(str, sorted(by_index))) or 'none'}; check CUDA_VISIBLE_DEVICES",
            )
        out.append(by_index[i])
    for raw in req.uuids:
        if raw.lower() not in by_uuid:
            raise InputError(f"no visible GPU {raw}", hint="see 'torchrig gpus' (nvidia-smi -L) for UUIDs")
        out.append(by_uuid[raw.lower()])
    return tuple(out)


def resolve_named(req: GpuRequest, inv: Inventory, among: Sequence[Unit] | None = None) -> tuple[Unit, ...]:
    """The units an ``all``/indices/UUID request names (``among``: the candidates, default every unit of
    ``inv``); unknown names are an :class:`InputError`."""
    units = tuple(inv.units() if among is None else among)
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
            if gpu is not None and gpu.mig_mode:
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
                gpu = next((g for g in inv.gpus if (g.uuid or "").lower() == raw.lower()), None)
                if gpu is not None and gpu.mig_mode:
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
