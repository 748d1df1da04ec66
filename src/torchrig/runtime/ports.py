"""Each environment's host ports, kept across ``down``/``up`` of the same name.

The engine picks free host ports the first time; ``up`` records them in the user's own state directory
(``ports/NAME.json`` in ``torchrig.userdirs.state_dir()``, beside the kept SSH host keys) and asks for the same ones
the next time, so an ``~/.ssh/config`` entry (``Port 49153``) and a bookmarked Jupyter URL keep working.
A recorded port that something else holds now is not fought for: the engine picks another and ``up``
says which port changed and who holds the old one. Shell equivalent: ``docker run -p 127.0.0.1:PORT:8888``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from torchrig import userdirs
from torchrig.errors import InputError
from torchrig.inputfiles import read_json

_MAX_FILE_BYTES = 4096


def _path(name: str, base: Path | None) -> Path:
    return (base or userdirs.state_dir()) / "ports" / f"{name}.json"


def remembered(name: str, base: Path | None = None) -> dict[str, int]:
    """The host ports ``name`` had (service -> port); {} when none were recorded or the file is damaged
    (a damaged record costs the stable ports, never the ``up``)."""
    path = _path(name, base)
    if not os.path.lexists(path):
        return {}
    try:
        data = read_json(path, "ports record", max_bytes=_MAX_FILE_BYTES, follow=False)
    except InputError as err:
        print(f"torchrig: warning: {err.message}; the ports are picked afresh", file=sys.stderr)
        return {}
    ports = data.get("ports") if isinstance(data, dict) else None
    if not isinstance(ports, dict):
        return {}
    return {
        str(k): v
        for k, v in ports.items()
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536
    }


def remember(name: str, ports: dict[str, int], base: Path | None = None) -> None:
    """Record ``name``'s host ports (atomically; a failure to write costs only the stable ports)."""
    path = _path(name, base)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ports": ports}) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


@dataclass(frozen=True)
class PortChoice:
    ask: dict[str, int]  # service -> the recorded host port to ask the engine for
    notes: tuple[str, ...]  # one per recorded port that is taken now, naming its holder


def choose(
    name: str, recorded: dict[str, int], services: tuple[str, ...], holders: dict[int, str], free: set[int]
) -> PortChoice:
    """Which recorded ports to ask for again: those no one holds now (pure).

    ``holders``: host port -> who holds it ("bob's environment bob-exp1"), from the engine's containers;
    ``free``: the recorded ports this host could bind just now."""
    ask, notes = {}, []
    for service in services:
        port = recorded.get(service)
        if port is None:
            continue
        if port in holders or port not in free:
            who = holders.get(port, "another program on this host")
            notes.append(
                f"{service}: port {port}, which {name} had before, is taken by {who}: the engine picked a "
                "new one (update your ~/.ssh/config or bookmark)"
            )
            continue
        ask[service] = port
    return PortChoice(ask, tuple(notes))


def can_bind(host_ip: str, port: int) -> bool:
    """Whether ``host_ip:port`` is free for a listener now: what docker-proxy will need for ``up``'s ports,
    and what the rendezvous store will need on node 0 of ``launch`` (``host_ip`` "": every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host_ip, port))
        except OSError:
            return False
    return True
