"""The client side: when a host daemon's socket is there, environment commands go through it.

``$TORCHRIG_HOST_SOCKET`` names the socket (set but empty: no daemon, single-user mode); otherwise the
default ``/run/torchrig/torchrig.sock`` is used when it exists. Without a daemon, commands talk to the
engine and the ledger themselves, as on a single-user machine.
"""

from __future__ import annotations

import base64
import os
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchrig.errors import EngineUnavailable, TorchrigError

SOCKET_ENV = "TORCHRIG_HOST_SOCKET"
DEFAULT_SOCKET = "/run/torchrig/torchrig.sock"


class RemoteError(TorchrigError):
    """An error the daemon answered with: its one line and exit code, as if raised here."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def daemon_socket() -> Path | None:
    """The daemon's socket when one is configured or present at the default path; else None."""
    env = os.environ.get(SOCKET_ENV)
    if env is not None:
        return Path(env) if env.strip() else None
    try:
        if stat.S_ISSOCK(os.stat(DEFAULT_SOCKET).st_mode):
            return Path(DEFAULT_SOCKET)
    except OSError:
        pass
    return None


def call(
    path: Path, verb: str, args: dict[str, Any], on_chunk: Callable[[str, bytes], None] | None = None
) -> dict[str, Any]:
    """Send one request, stream its output chunks to ``on_chunk``, and return the final data (or raise
    the daemon's error as :class:`RemoteError` with its exit code)."""
    from torchrig.hostd import protocol

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.settimeout(10)
            sock.connect(str(path))
            sock.settimeout(None)
        except OSError as err:
            raise EngineUnavailable(
                f"cannot reach the torchrig host daemon at {path} ({err.strerror or err})",
                hint="ask an admin to start it (systemctl start torchrig-host), or unset "
                f"{SOCKET_ENV} (set it empty for single-user mode)",
            ) from None
        sock.sendall(protocol.encode({"v": protocol.VERSION, "verb": verb, "args": args}))
        for frame in protocol.frames(sock):
            if "ok" in frame:
                if frame["ok"]:
                    data = frame.get("data")
                    return data if isinstance(data, dict) else {}
                problem = frame.get("error") or {}
                raise RemoteError(
                    str(problem.get("message", "the host daemon refused")), int(problem.get("exit_code", 2))
                )
            for stream in ("out", "err"):
                if stream in frame and on_chunk is not None:
                    on_chunk(stream, base64.b64decode(frame[stream]))
        raise EngineUnavailable("the host daemon closed the connection without an answer", hint="see its log")
    finally:
        sock.close()


def to_terminal(stream: str, data: bytes) -> None:
    out = sys.stdout.buffer if stream == "out" else sys.stderr.buffer
    out.write(data)
    out.flush()
