"""Show an environment's logs (its entrypoint's stdout and stderr: JupyterLab, sshd).

examples:
  torchrig logs alice-1a2b
  torchrig logs alice-1a2b --tail 50
  torchrig logs alice-1a2b --follow        # until Ctrl-C
"""

from __future__ import annotations

import argparse
import sys

from torchrig.argtypes import int_in
from torchrig.report import SimpleReport


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the environment (see 'torchrig ps')")
    parser.add_argument("--tail", metavar="N", type=int_in(0, 2**31 - 1), help="only the last N lines")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new output")
    parser.add_argument("--timestamps", "-t", action="store_true", help="prefix each line with its time")


def run(args: argparse.Namespace) -> SimpleReport:
    from torchrig.errors import UsageError
    from torchrig.runtime.engine import Engine

    if args.tail is not None and args.tail < 0:
        raise UsageError("--tail must be ≥ 0")
    from torchrig.hostd.client import daemon_socket

    sock = daemon_socket()
    if sock is not None:
        return _via_daemon(sock, args)
    engine = Engine.connect()
    env = engine.find(args.name)
    stream = engine.logs(env.id, tail=args.tail, follow=args.follow, timestamps=args.timestamps)
    if args.json:
        text = b"".join(stream).decode(errors="replace")
        return SimpleReport({"name": env.name, "state": env.state, "logs": text}, "")
    out = sys.stdout.buffer
    for chunk in stream:
        out.write(chunk)
        out.flush()
    return SimpleReport({"name": env.name}, "")


def _via_daemon(sock: object, args: argparse.Namespace) -> SimpleReport:
    """Through the host daemon (your own environments only); --follow streams until Ctrl-C."""
    from pathlib import Path

    from torchrig.hostd.client import call, to_terminal

    chunks: list[bytes] = []
    request = {
        "name": args.name,
        "tail": args.tail,
        "follow": bool(args.follow),
        "timestamps": bool(args.timestamps),
    }
    assert isinstance(sock, Path)
    data = call(sock, "logs", request, (lambda _s, b: chunks.append(b)) if args.json else to_terminal)
    if args.json:
        return SimpleReport(
            {"name": data["name"], "state": data["state"], "logs": b"".join(chunks).decode(errors="replace")},
            "",
        )
    return SimpleReport({"name": data["name"]}, "")
