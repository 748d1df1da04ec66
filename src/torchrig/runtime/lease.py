"""Taking GPU leases: reconcile with the engine, then choose and record units in one transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Set

from torchrig.errors import JobFailed
from torchrig.runtime.inventory import Inventory, Unit
from torchrig.runtime.ledger import Lease, Ledger, stale
from torchrig.runtime.placement import GpuRequest, pick, resolve_named


class NoFreeGpu(JobFailed):
    """The request is valid but the GPUs it needs are held by others (exit 1)."""


def too_few(wanted: int, have: int, source: str) -> NoFreeGpu:
    if have == 0:
        return NoFreeGpu(
            f"--gpus {wanted}: no NVIDIA GPU on this host ({source})",
            hint="check the driver with 'torchrig doctor', or leave --gpus out",
        )
    return NoFreeGpu(
        f"--gpus {wanted}: this host has only {have} whole GPU(s) ({source})", hint="ask for fewer"
    )


def describe_holders(units: tuple[Unit, ...] | list[Unit], held: dict[str, list[Lease]]) -> str:
    parts = []
    for u in units:
        hs = held.get(u.uuid, [])
        if hs:
            who = "+".join(f"{h.user}/{h.container}{' (shared)' if h.shared else ''}" for h in hs)
            parts.append(f"GPU {u.label} held by {who}")
    return "; ".join(parts)


def choose(inv: Inventory, req: GpuRequest, leases: list[Lease], *, share: bool) -> tuple[Unit, ...]:
    """The units ``req`` gets given the current ``leases``: the one choice ``up`` and ``up --dry-run`` make.

    Pure: :class:`NoFreeGpu` names the holders when the GPUs are busy; ``--share`` admits GPUs whose every
    holder shares too, and among those the least-shared win (the tie-break of :func:`pick`)."""
    if not req.wants_gpus:
        return ()
    held: dict[str, list[Lease]] = defaultdict(list)
    for lease in leases:
        held[lease.unit_uuid].append(lease)

    def available(u: Unit) -> bool:
        hs = held.get(u.uuid, [])
        return not hs or (share and all(h.shared for h in hs))

    hint = "wait for one, 'torchrig down NAME' one of yours, or pass --share to share deliberately"
    if req.kind != "count":
        named = resolve_named(req, inv)
        busy = [u for u in named if not available(u)]
        if busy:
            raise NoFreeGpu(f"no free GPU: {describe_holders(busy, held)}", hint=hint)
        return named
    whole = [u for u in inv.units() if not u.is_mig]
    chosen = pick([u for u in whole if available(u)], req.count, {k: len(v) for k, v in held.items()})
    if chosen is None:
        if len(whole) < req.count:
            raise too_few(req.count, len(whole), inv.source)
        free = sum(1 for u in whole if available(u))
        raise NoFreeGpu(
            f"no free GPU: {req.count} wanted, {free} of {len(whole)} free; {describe_holders(whole, held)}",
            hint=hint,
        )
    return chosen


def acquire(
    ledger: Ledger,
    inv: Inventory,
    req: GpuRequest,
    *,
    user: str,
    container: str,
    share: bool,
    live: Set[str] | None,
    listed_at_s: float,
) -> tuple[Unit, ...]:
    """Lease the units ``req`` asks for to ``container``; :class:`NoFreeGpu` names the holders when busy."""
    if not req.wants_gpus:
        return ()
    if req.kind != "count":
        resolve_named(req, inv)  # unknown names fail before the ledger is locked
    with ledger.transaction() as db:
        ledger.reconcile_in(db, live, listed_at_s)
        if ledger.container_taken(db, container):
            from torchrig.errors import InputError

            raise InputError(
                f"an environment named {container!r} is being started or holds GPUs",
                hint="pick another --name",
            )
        chosen = choose(inv, req, ledger.leases(), share=share)
        ledger.insert_in(db, [(u.uuid, u.gpu_index, u.label) for u in chosen], user, container, share)
    return chosen


def preview(
    ledger: Ledger, inv: Inventory, req: GpuRequest, *, share: bool, live: Set[str] | None, listed_at_s: float
) -> tuple[Unit, ...]:
    """For ``up --dry-run``: what :func:`acquire` would lease now, recording nothing."""
    if not req.wants_gpus:
        return ()
    leases = [x for x in ledger.leases() if not stale(x, live, listed_at_s)]
    return choose(inv, req, leases, share=share)


def reconcile(ledger: Ledger, engine: object) -> list[Lease]:
    """Free the leases of containers that died or were removed (``engine``: a connected Engine)."""
    live, listed_at = engine.live_names()  # type: ignore[attr-defined]
    return ledger.reconcile(live, listed_at)
