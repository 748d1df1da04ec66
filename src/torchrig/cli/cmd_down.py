"""Stop and remove an environment and free its GPU leases. Its work is kept: the volume that holds its
/workspace stays for the next 'torchrig up --name NAME' (and your host directories are never touched);
'--volumes' deletes the environment's workspace volume too, and says which.

Only the environment's owner (the real UID that started it) may take it down; root may with --force
(an admin freeing a GPU). USER, SUDO_USER and the like do not count.

examples:
  torchrig down alice-1a2b
  torchrig down alice-1a2b bob-7f3e --force
  torchrig down --volumes alice-1a2b            # and delete its /workspace volume (its files are gone)
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
        "--volumes",
        action="store_true",
        help="also delete the environment's workspace volume (the files in its /workspace); named "
        "volumes given with -v and host directories are kept",
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
    from torchrig.runtime.workspace import take_down, volumes_left

    sock = daemon_socket()
    if sock is not None:  # the daemon checks ownership (an admin's --force) against the kernel's UID
        args_ = {
            "names": list(args.names),
            "force": bool(args.force),
            "timeout_s": int(args.timeout),
            "volumes": bool(args.volumes),
        }
        return _report(call(sock, "down", args_)["removed"])
    ledger = Ledger.open()
    engine = Engine.connect()
    me = owner_uid()
    admin = os.getuid() == 0
    envs, gone = [], []  # every name checked before anything is removed
    for n in args.names:
        try:
            envs.append(engine.find(n))
        except InputError:  # down --volumes of an environment already down: its kept workspace volume
            if not (args.volumes and volumes_left(engine, n, None if admin and args.force else me)):
                raise
            gone.append(n)
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
        done.append(take_down(engine, ledger, env, timeout_s=args.timeout, delete_volumes=args.volumes))
    for n in gone:
        deleted = [
            v
            for v in volumes_left(engine, n, None if admin and args.force else me)
            if engine.remove_volume(v)
        ]
        done.append(
            {"name": n, "user": None, "freed_gpus": [], "volumes_deleted": deleted, "volumes_kept": []}
        )
    reconcile(ledger, engine)
    return _report(done)


def _report(done: list[dict[str, Any]]) -> SimpleReport:
    return SimpleReport({"removed": done}, "\n".join(_line(d) for d in done))


def _line(d: dict[str, Any]) -> str:
    if d["user"] is None:  # only its kept volume was left
        return "\n".join(
            f"deleted volume {v} (the files of {d['name']}'s /workspace)" for v in d["volumes_deleted"]
        )
    text = f"removed {d['name']}" + (f"; freed GPU {', '.join(d['freed_gpus'])}" if d["freed_gpus"] else "")
    for v in d.get("volumes_deleted", []):
        text += f"\ndeleted volume {v} (the files of its /workspace)"
    for v in d.get("volumes_kept", []):
        text += (
            f"\nkept volume {v} (its /workspace): 'torchrig up --name {d['name']}' mounts it again; "
            f"'torchrig down --volumes {d['name']}' deletes it"
        )
    return text
