"""The host daemon of a shared GPU server: one root process owns Docker and the GPU leases; users' commands
ask it over a Unix socket, and it checks who asks (the kernel's SO_PEERCRED) before each action.

actions:
  serve     run the daemon in the foreground (containers, tests; the systemd unit runs this)
  install   write the systemd unit torchrig-host.service and enable it (--dry-run prints it)
  whoami    who the daemon says you are (UID, admin or not)
  volumes   the named volumes you own (an admin: all of them)

With the daemon running, 'torchrig up/ps/down/exec/logs/gpus' go through it when its socket exists
(/run/torchrig/torchrig.sock, or $TORCHRIG_HOST_SOCKET; set it empty to use the engine directly). Members
need no docker group. Admins (group torchrig-admin, or --admin-group) see and stop everything; every
decision is appended to STATE_DIR/audit.log (JSON lines: who, what, when, allowed or refused).

examples:
  sudo torchrig host install --dry-run            # print the unit and the commands, change nothing
  sudo torchrig host install                      # write it, systemctl enable --now torchrig-host
  sudo torchrig host serve --socket /tmp/t/torchrig.sock --state-dir /var/lib/trt-test
  torchrig host whoami
  torchrig host volumes --json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from torchrig.report import SimpleReport, table


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["serve", "install", "whoami", "volumes"], help="what to do")
    parser.add_argument(
        "--socket", metavar="PATH", help="the daemon's socket (default /run/torchrig/torchrig.sock)"
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="root-only folder of the ledger and audit log (default /var/lib/torchrig-host)",
    )
    parser.add_argument(
        "--admin-group",
        metavar="GROUP",
        default="torchrig-admin",
        help="members see and stop everything (default torchrig-admin)",
    )
    parser.add_argument("--inventory", metavar="FILE", help="serve: a recorded GPU inventory (testing hook)")
    parser.add_argument("--dry-run", action="store_true", help="install: print the unit and commands only")
    parser.add_argument("--no-enable", action="store_true", help="install: write the unit, do not enable it")


def run(args: argparse.Namespace) -> SimpleReport:
    from torchrig.errors import UsageError
    from torchrig.hostd.server import DEFAULT_SOCKET, DEFAULT_STATE_DIR

    socket_path = Path(args.socket) if args.socket else DEFAULT_SOCKET
    state_dir = Path(args.state_dir) if args.state_dir else DEFAULT_STATE_DIR
    if not socket_path.is_absolute() or not state_dir.is_absolute():
        raise UsageError("--socket and --state-dir must be absolute paths")
    if args.action == "serve":
        return _serve(socket_path, state_dir, args)
    if args.action == "install":
        return _install(socket_path, state_dir, args)
    return _ask(args)


def _serve(socket_path: Path, state_dir: Path, args: argparse.Namespace) -> SimpleReport:
    import os

    from torchrig.errors import UsageError
    from torchrig.hostd.policy import admin_gid_of
    from torchrig.hostd.server import serve

    if os.geteuid() != 0:
        raise UsageError(
            "the host daemon runs as root (it alone uses the Docker engine)", hint="sudo torchrig host serve"
        )
    admin_gid = admin_gid_of(args.admin_group)
    if admin_gid is None:
        print(f"torchrig host: note: no group {args.admin_group}: only root is an admin", flush=True)
    serve(socket_path, state_dir, admin_gid, args.inventory)
    return SimpleReport({"stopped": str(socket_path)}, "torchrig host daemon stopped")


def _install(socket_path: Path, state_dir: Path, args: argparse.Namespace) -> SimpleReport:
    import shlex

    from torchrig.hostd.unit import install, plan_install

    plan = plan_install(socket_path, state_dir, args.admin_group)
    commands = [shlex.join(c) for c in plan.commands] if not args.no_enable else []
    if args.dry_run:
        text = f"# {plan.path}\n{plan.text}\n# then:\n" + "\n".join(commands)
        return SimpleReport(
            {"unit_path": str(plan.path), "unit": plan.text, "commands": commands}, text.rstrip()
        )
    done = install(plan, enable=not args.no_enable)
    note = f"admins: members of {args.admin_group} (sudo groupadd {args.admin_group}; sudo usermod -aG {args.admin_group} USER)"
    return SimpleReport({"unit_path": str(plan.path), "done": done}, "\n".join([*done, note]))


def _ask(args: argparse.Namespace) -> SimpleReport:
    from torchrig.errors import UsageError
    from torchrig.hostd.client import call, daemon_socket

    sock = Path(args.socket) if args.socket else daemon_socket()
    if sock is None:
        raise UsageError("no host daemon here", hint="an admin starts one: sudo torchrig host install")
    data = call(sock, args.action, {})
    if args.action == "whoami":
        role = "an admin" if data["admin"] else "a member"
        return SimpleReport(data, f"{data['user']} (UID {data['uid']}), {role}")
    rows = [[v["name"], v["user"], v["created"] or "?"] for v in data["volumes"]]
    return SimpleReport(data, table(["VOLUME", "OWNER", "CREATED"], rows) if rows else "no volumes of yours")
