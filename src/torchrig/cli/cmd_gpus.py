"""The GPU board: each GPU (and MIG instance) of this host, who holds it, its memory and utilisation.

Holders come from the lease ledger, reconciled with the engine first (leases of environments that died
or were removed are freed). Memory and utilisation come from NVML ('nvidia-smi' shows the same).

examples:
  torchrig gpus
  torchrig gpus --free                      # only the GPUs nobody holds
  torchrig gpus --json
  torchrig gpus --record host-snapshot.json # record this host's GPU facts (NVML; a test fixture)

testing hook: TORCHRIG_GPU_INVENTORY=FILE (or --inventory FILE) shows a recorded inventory instead: a
recording of 'torchrig gpus --record' or 'torchrig doctor --record' (one format, torchrig.hw.record).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.report import table


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--free", action="store_true", help="only the GPUs nobody holds")
    parser.add_argument("--inventory", metavar="FILE", help="use a recorded GPU inventory (testing hook)")
    parser.add_argument(
        "--record", metavar="FILE", help="write this host's GPU facts (NVML) to FILE and exit"
    )


def _mib(used: int | None, total: int | None) -> str:
    if total is None:
        return "?"
    return f"{'?' if used is None else used}/{total} MiB"


@dataclass(frozen=True)
class Board:
    inventory: Any
    leases: list[Any]
    notes: list[str]
    free_only: bool = False
    exit_code: int = 0

    def rows(self) -> list[dict[str, Any]]:
        held: dict[str, list[Any]] = defaultdict(list)
        for lease in self.leases:
            held[lease.unit_uuid].append(lease)
        out = []
        labels = {u.uuid: u.label for u in self.inventory.units()}
        for g in self.inventory.gpus:
            units = (
                [
                    (m.uuid, labels[m.uuid], m.name, None, m.memory_total_mib)
                    for m in g.mig_instances
                    if m.uuid in labels
                ]
                if g.mig_mode
                else [(g.uuid, str(g.index), g.name, g.memory_used_mib, g.memory_total_mib)]
            )
            for uuid, label, name, used, total in units:
                hs = held.get(uuid, [])
                out.append(
                    {
                        "gpu": label,
                        "uuid": uuid,
                        "name": name,
                        "memory_used_mib": used,
                        "memory_total_mib": total,
                        "utilization_gpu_pct": g.utilization_pct,
                        "numa_node": g.numa_node,
                        "nvlink_domain": g.nvlink_domain,
                        "holders": [
                            {"user": h.user, "container": h.container, "shared": h.shared} for h in hs
                        ],
                    }
                )
        return [r for r in out if not r["holders"]] if self.free_only else out

    def to_json(self) -> dict[str, Any]:
        inv = self.inventory
        return {
            "source": inv.source,
            "driver_version": inv.driver_version,
            "cuda_driver_version": inv.cuda_driver_version,
            "gpus": self.rows(),
            "notes": self.notes,
        }

    def render_text(self) -> str:
        inv = self.inventory
        if not inv.gpus:
            return f"no NVIDIA GPU on this host ({inv.source})"
        rows = []
        for r in self.rows():
            who = (
                ", ".join(
                    f"{h['user']}/{h['container']}{' (shared)' if h['shared'] else ''}" for h in r["holders"]
                )
                or "free"
            )
            util = "?" if r["utilization_gpu_pct"] is None else f"{r['utilization_gpu_pct']}%"
            rows.append(
                [
                    r["gpu"],
                    r["name"],
                    _mib(r["memory_used_mib"], r["memory_total_mib"]),
                    util,
                    "?" if r["numa_node"] is None else r["numa_node"],
                    r["nvlink_domain"] or "-",
                    who,
                ]
            )
        head = (
            f"driver {inv.driver_version or '?'} (CUDA {inv.cuda_driver_version or '?'}), from {inv.source}"
        )
        text = head + "\n" + table(["GPU", "NAME", "MEMORY", "UTIL", "NUMA", "NVLINK", "HELD BY"], rows)
        return text + "".join(f"\nnote: {n}" for n in self.notes)


def run(args: argparse.Namespace) -> Any:
    from torchrig.errors import EngineUnavailable
    from torchrig.report import SimpleReport
    from torchrig.runtime.ledger import Ledger
    from torchrig.runtime.nvml import current

    if args.record:
        count = _record(args.record)
        return SimpleReport(
            {"recorded": args.record, "gpus": count}, f"recorded {count} GPU(s) to {args.record}"
        )
    from torchrig.hostd.client import daemon_socket

    sock = daemon_socket()
    if sock is not None:
        return _via_daemon(sock, args)
    inv = current(args.inventory)
    ledger = Ledger.open()
    notes = []
    try:
        from torchrig.runtime.engine import Engine
        from torchrig.runtime.lease import reconcile

        freed = reconcile(ledger, Engine.connect(timeout_s=5))
        if freed:
            notes.append(
                "freed leases of gone environments: " + ", ".join(sorted({f.container for f in freed}))
            )
    except EngineUnavailable as err:
        notes.append(f"holders not reconciled with the engine: {err.one_line()}")
    return Board(inv, ledger.leases(), notes, args.free)


def _record(path: str) -> int:
    """Write NVML's facts of this host's GPUs (health included, as doctor probes them) to ``path`` as a
    recording (torchrig.hw.record); the number of GPUs recorded."""
    import datetime

    from torchrig import __version__
    from torchrig.errors import InputError
    from torchrig.hw import gpus
    from torchrig.hw.record import ProbeStatus, recording

    facts = gpus.probe(health=True)
    if facts.status is not ProbeStatus.OK or not facts.gpus:
        raise InputError(
            f"no GPU to record: nvml ({facts.error or 'no GPU'})", hint="run this on the GPU host"
        )
    at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data = recording(
        facts,
        source=f"recorded by torchrig gpus --record at {at}",
        recorded_at=at,
        torchrig_version=__version__,
    )
    try:
        Path(path).expanduser().write_text(json.dumps(data, indent=2) + "\n")
    except OSError as err:
        raise InputError(f"cannot write --record {path!r}: {err.strerror or err}") from None
    return len(facts.gpus)


def _via_daemon(sock: Any, args: argparse.Namespace) -> Board:
    """Through the host daemon: its inventory and ledger, checked against the containers and NVML."""
    from torchrig.errors import UsageError
    from torchrig.hostd.client import call
    from torchrig.hostd.wire import from_jsonable
    from torchrig.runtime.inventory import from_dict
    from torchrig.runtime.ledger import Lease

    if args.inventory:
        raise UsageError(
            "--inventory: the host daemon uses its own GPU inventory", hint="leave --inventory out"
        )
    data = call(sock, "gpus", {"free": bool(args.free)})
    leases = [from_jsonable(Lease, x) for x in data["leases"]]
    return Board(from_dict(data["inventory"], data["source"]), leases, list(data["notes"]), args.free)
