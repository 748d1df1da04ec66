"""List torchrig environments on this host: name, user, state, GPUs, ports.

Leases of environments that died or were removed are freed as a side effect (every environment command
reconciles the GPU ledger with the engine). The Jupyter token is not shown again: it was printed once
by 'torchrig up'.

examples:
  torchrig ps
  torchrig ps --mine
  torchrig ps --json | jq '.environments[] | {name, gpus}'
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from torchrig.report import jsonable, table


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mine", action="store_true", help="only your environments")


@dataclass(frozen=True)
class PsReport:
    envs: list[Any]
    freed: list[Any]
    exit_code: int = 0
    notes: list[str] = field(default_factory=list)  # what the host daemon's reality check found

    def to_json(self) -> dict[str, Any]:
        return {
            "environments": [dict(jsonable(e), alive=e.alive) for e in self.envs],
            "freed_leases": jsonable(self.freed),
            "notes": self.notes,
        }

    def render_text(self) -> str:
        notes = "".join(f"\nnote: {n}" for n in self.notes)
        if not self.envs:
            return "no torchrig environments (start one with 'torchrig up')" + notes
        rows = []
        for e in self.envs:
            ports = " ".join(f"{s}={ip}:{port}" for s, (ip, port) in sorted(e.ports.items()))
            rows.append([e.name, e.user, e.status, ",".join(e.gpu_labels) or "-", ports or "-", e.image])
        text = table(["NAME", "USER", "STATE", "GPUS", "PORTS", "IMAGE"], rows)
        if self.freed:
            text += "\nfreed leases of gone environments: " + ", ".join(
                sorted({f.container for f in self.freed})
            )
        return text + notes


def run(args: argparse.Namespace) -> PsReport:
    from torchrig.hostd.client import daemon_socket

    sock = daemon_socket()
    if sock is not None:
        return _via_daemon(sock, args)
    from torchrig.runtime.engine import Engine
    from torchrig.runtime.lease import reconcile
    from torchrig.runtime.ledger import Ledger, owner_uid

    ledger = Ledger.open()  # a ledger the user cannot write is said before the engine is asked
    engine = Engine.connect()
    freed = reconcile(ledger, engine)
    envs = engine.environments()
    if args.mine:
        envs = [e for e in envs if e.owned_by(owner_uid())]
    return PsReport(envs, freed)


def _via_daemon(sock: Any, args: argparse.Namespace) -> PsReport:
    """Through the host daemon: your environments (an admin's: everyone's unless --mine)."""
    from torchrig.hostd.client import call
    from torchrig.hostd.wire import from_jsonable
    from torchrig.runtime.engine import EnvRecord
    from torchrig.runtime.ledger import Lease

    data = call(sock, "ps", {"mine": bool(args.mine)})
    envs = [
        from_jsonable(EnvRecord, {k: v for k, v in e.items() if k != "alive"}) for e in data["environments"]
    ]
    return PsReport(
        envs, [from_jsonable(Lease, f) for f in data["freed_leases"]], notes=list(data.get("notes", []))
    )
