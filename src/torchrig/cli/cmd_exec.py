"""Run a command inside an environment, as its user, and exit with the command's exit status.

Output streams as it comes (stdout to stdout, stderr to stderr). For an interactive shell use the ssh
command 'torchrig up' printed.

examples:
  torchrig exec alice-1a2b -- nvidia-smi
  torchrig exec alice-1a2b -- python -c 'import torch; print(torch.cuda.device_count())'
  torchrig exec alice-1a2b --workdir /home/dev/work -- ls -la
"""

from __future__ import annotations

import argparse
import sys

from torchrig.report import SimpleReport


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the environment (see 'torchrig ps')")
    parser.add_argument("command", metavar="CMD", nargs=argparse.REMAINDER, help="the command, after '--'")
    parser.add_argument("--root", action="store_true", help="run as root instead of the environment's user")
    parser.add_argument("--workdir", metavar="DIR", help="working directory inside the container")


def run(args: argparse.Namespace) -> SimpleReport:
    from torchrig.errors import InputError, UsageError
    from torchrig.runtime.engine import Engine

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("no command given", hint=f"e.g. torchrig exec {args.name} -- nvidia-smi")
    from torchrig.hostd.client import daemon_socket

    sock = daemon_socket()
    if sock is not None:
        return _via_daemon(sock, args, argv)
    engine = Engine.connect()
    env = engine.find(args.name)
    if env.state != "running":
        raise InputError(
            f"environment {env.name!r} is {env.state}, not running", hint=f"see 'torchrig logs {env.name}'"
        )
    user = "root" if args.root else (env.container_user or "")
    exec_id, stream = engine.exec(env.id, argv, user, args.workdir)
    out: list[bytes] = []
    err: list[bytes] = []
    for o, e in stream:
        if args.json:
            out.append(o or b"")
            err.append(e or b"")
            continue
        if o:
            sys.stdout.buffer.write(o)
            sys.stdout.buffer.flush()
        if e:
            sys.stderr.buffer.write(e)
            sys.stderr.buffer.flush()
    code = engine.exec_exit_code(exec_id)
    data = {"name": env.name, "argv": argv, "exit_code": code}
    if args.json:
        data.update(
            stdout=b"".join(out).decode(errors="replace"), stderr=b"".join(err).decode(errors="replace")
        )
    return SimpleReport(data, "", code)


def _via_daemon(sock: object, args: argparse.Namespace, argv: list[str]) -> SimpleReport:
    """Through the host daemon (your own environments only): output streams back as it comes. No
    terminal is attached (no TTY, no stdin): for an interactive shell use ssh."""
    from pathlib import Path

    from torchrig.hostd.client import call, to_terminal

    out: list[bytes] = []
    err: list[bytes] = []

    def keep(stream: str, data: bytes) -> None:
        (out if stream == "out" else err).append(data)

    request = {"name": args.name, "argv": argv, "root": bool(args.root), "workdir": args.workdir}
    assert isinstance(sock, Path)
    data = call(sock, "exec", request, keep if args.json else to_terminal)
    code = int(data["exit_code"])
    result = {"name": data["name"], "argv": argv, "exit_code": code}
    if args.json:
        result.update(
            stdout=b"".join(out).decode(errors="replace"), stderr=b"".join(err).decode(errors="replace")
        )
    return SimpleReport(result, "", code)
