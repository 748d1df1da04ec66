"""Taking GPU leases: reconcile with the engine, then choose and record units in one transaction."""

from __future__ import annotations

from collections.abc import Set

from torchrig.runtime import placement
from torchrig.runtime.inventory import Inventory, Unit
from torchrig.runtime.ledger import Lease, Ledger, stale
from torchrig.runtime.placement import GpuRequest, NoFreeGpu, resolve_named

__all__ = ["NoFreeGpu", "acquire", "choose", "preview", "reconcile"]


def choose(inv: Inventory, req: GpuRequest, leases: list[Lease], *, share: bool) -> tuple[Unit, ...]:
    """The units ``req`` gets given the current ``leases``: the one choice ``up`` and ``up --dry-run`` make.

    The placement rule of every command (:func:`torchrig.runtime.placement.place`), for a new environment:
    its lease is its own, so a GPU is free to it only when nobody holds it, or (``--share``) when every holder
    shares too; among those the least-shared win (the tie-break of :func:`pick`)."""
    return placement.place(req, inv.units(), leases, share=share, inventory=inv).units


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
