"""Leases cross-checked with reality: the ledger against the containers' own labels and NVML's processes.

The ledger is what the daemon *meant*; the engine and the driver say what *is*. At every change (each
``up``, ``down``, ``ps``, ``gpus``) the daemon compares them with :func:`unaccounted`, a pure function of
plain records:

* an alive torchrig container whose ``torchrig.gpus`` label names a GPU it holds no lease for (a lease
  deleted by hand, a container made behind the daemon's back) is reported, and the GPU counts as held by
  that container's owner;
* a GPU with a process on it (NVML's compute/graphics process list, ``nvidia-smi``'s process table) and
  no lease at all is reported, and held by that process.

Either way the GPU is not handed out until reality and the ledger agree again (the container or process
ends). :class:`CheckedLedger` is the ledger ``up`` is given: its :meth:`leases` adds these holders, so the
one choice of :func:`torchrig.runtime.lease.choose` sees them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchrig.hw.nvml_records import NvmlProcess
from torchrig.runtime.engine import EnvRecord
from torchrig.runtime.ledger import Lease, Ledger

UNLEASED = "(no lease)"


@dataclass(frozen=True)
class Discrepancy:
    unit_uuid: str
    holder: str  # "container NAME of USER" or "process PID (NAME)"
    summary: str


def unaccounted(
    leases: Sequence[Lease],
    envs: Sequence[EnvRecord],
    processes: Mapping[str, Sequence[NvmlProcess]] | None,
    now_s: float,
) -> tuple[list[Lease], list[Discrepancy]]:
    """The holders the ledger does not know, as leases to count, and a report line for each."""
    leased = {(x.unit_uuid, x.container) for x in leases}
    held = {x.unit_uuid for x in leases}
    extra: list[Lease] = []
    found: list[Discrepancy] = []
    for env in envs:
        if not env.alive:
            continue
        for i, uuid in enumerate(env.gpu_uuids):
            if (uuid, env.name) in leased:
                continue
            label = env.gpu_labels[i] if i < len(env.gpu_labels) else uuid
            extra.append(
                Lease(uuid, int(label) if label.isdigit() else -1, label, f"{env.user} {UNLEASED}", env.name,
                      env.id, False, 0, now_s, now_s)
            )  # fmt: skip
            held.add(uuid)
            found.append(
                Discrepancy(
                    uuid,
                    f"container {env.name} of {env.user}",
                    f"GPU {label} is used by container {env.name} of {env.user}, which holds no lease for it: "
                    "not handed out until it stops",
                )
            )
    for uuid, procs in sorted((processes or {}).items()):
        if uuid in held or not procs:
            continue
        p = procs[0]
        who = f"pid {p.pid} ({p.name or '?'})"
        extra.append(Lease(uuid, -1, uuid, f"process {UNLEASED}", who, None, False, 0, now_s, now_s))
        found.append(
            Discrepancy(
                uuid,
                f"process {p.pid}",
                f"GPU {uuid} runs {who}{f' and {len(procs) - 1} more' if len(procs) > 1 else ''}, "
                "which no lease accounts for: not handed out until it ends",
            )
        )
    return extra, found


def gpu_processes() -> dict[str, list[NvmlProcess]] | None:
    """Each GPU's processes by UUID, from NVML; None where NVML is not there (no driver, no GPU)."""
    try:
        from torchrig.hw import nvml
    except ImportError:
        return None
    try:
        with nvml.session() as s:
            out: dict[str, list[NvmlProcess]] = {}
            for ident in s.identities():
                if ident.uuid:
                    out[ident.uuid] = list(s.health(ident.index).processes)
            return out
    except Exception:  # NvmlError, a missing library: the process check is skipped and said so
        return None


class CheckedLedger(Ledger):
    """The daemon's ledger: :meth:`leases` also counts the holders :func:`unaccounted` finds."""

    def __init__(
        self,
        path: Path,
        envs: Callable[[], Sequence[EnvRecord]],
        processes: Callable[[], Mapping[str, Sequence[NvmlProcess]] | None],
        report: Callable[[Discrepancy], None],
    ) -> None:
        super().__init__(path)
        self._envs, self._processes, self._report = envs, processes, report

    def recorded(self) -> list[Lease]:
        return super().leases()

    def check(self) -> tuple[list[Lease], list[Discrepancy]]:
        extra, found = unaccounted(self.recorded(), self._envs(), self._processes(), time.time())
        for d in found:
            self._report(d)
        return extra, found

    def leases(self) -> list[Lease]:
        extra, _found = self.check()
        return self.recorded() + extra
