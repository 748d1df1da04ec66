"""Stop and remove an environment and free its GPU leases. Volumes (your host directories) are kept.

Only the environment's owner (the real UID that started it) may take it down; root may with --force
(an admin freeing a GPU). USER, SUDO_USER and the like do not count.

examples:
  torchrig down alice-1a2b
  torchrig down alice-1a2b bob-7f3e --force
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from torchrig.argtypes import MAX_SECONDS, int_in
from torchrig.report import SimpleReport


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", metavar="NAME", nargs="+", help="the environment(s) (see 'torchrig ps')")
    parser.add_argument(
        "--force", action="store_true", help="root only: also take down other users' environments"
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=int_in(0, MAX_SECONDS),
        default=10,
        help="seconds to wait after SIGTERM before SIGKILL (default 10)",
    )


def run(args: argparse.Namespace) -> SimpleReport:
    from torchrig.errors import InputError
    from torchrig.hostd.client import call, daemon_socket
    from torchrig.runtime.engine import Engine
    from torchrig.runtime.lease import reconcile
    from torchrig.runtime.ledger import Ledger, owner_uid, user_name

    sock = daemon_socket()
    if sock is not None:  # the daemon checks ownership (an admin's --force) against the kernel's UID
        args_ = {"names": list(args.names), "force": bool(args.force), "timeout_s": int(args.timeout)}
        return _report(call(sock, "down", args_)["removed"])
    ledger = Ledger.open()
    engine = Engine.connect()
    me = owner_uid()
    admin = os.getuid() == 0
    envs = [engine.find(n) for n in args.names]  # every name checked before anything is removed
    for env in envs:
        if env.owned_by(me) or (admin and args.force):
            continue
        owner = (
            f"{user_name(env.owner_uid)} (UID {env.owner_uid})"
            if env.owner_uid is not None
            else "no known owner"
        )
        hint = (
            "pass --force to take it down anyway"
            if admin
            else "only its owner may; an admin can: sudo torchrig down --force NAME"
        )
        raise InputError(f"{env.name!r} belongs to {owner}, not you ({user_name(me)}, UID {me})", hint=hint)
    done: list[dict[str, Any]] = []
    for env in envs:
        engine.remove(env.id, stop_timeout_s=args.timeout)
        freed = ledger.release(env.name)
        done.append({"name": env.name, "user": env.user, "freed_gpus": [f.unit_label for f in freed]})
    reconcile(ledger, engine)
    return _report(done)


def _report(done: list[dict[str, Any]]) -> SimpleReport:
    text = "\n".join(
        f"removed {d['name']}" + (f"; freed GPU {', '.join(d['freed_gpus'])}" if d["freed_gpus"] else "")
        for d in done
    )
    return SimpleReport({"removed": done}, text)
