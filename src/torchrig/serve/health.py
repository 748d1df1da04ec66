"""``torchrig serve --check``: the image's HEALTHCHECK. Each started service answers on its port, or the
check fails with one line naming the service (Docker shows it in ``docker inspect``).

Quiet by design: the check runs every 10 s, so it must not write to the services' logs. JupyterLab logs a
successful request at debug level only, so ``/api`` is asked; sshd logs every connection ("Connection closed
by 127.0.0.1 [preauth]"), so SSH is checked without connecting: the sshd that serve started is alive and a
socket listens on its port (``/proc/net/tcp``, what ``ss -ltn`` reads)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from torchrig.contract import SERVE_STATE_FILE
from torchrig.errors import InputError
from torchrig.inputfiles import field, read_json, read_proc
from torchrig.serve.config import ServeConfig

TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Probe:
    service: str
    ok: bool
    detail: str


def probe_jupyter(port: int) -> Probe:
    # /api answers without a token (it gives the server version only); anything else needs the token.
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=TIMEOUT_S) as resp:
            version = json.loads(resp.read() or b"{}").get("version", "?")
            return Probe("jupyter", resp.status == 200, f"jupyter_server {version} on :{port}")
    except (urllib.error.URLError, OSError, ValueError) as err:
        return Probe("jupyter", False, f"no answer on :{port} ({err})")


_MAX_PROC_NET_BYTES = 64 * 2**20  # /proc/net/tcp: ~150 bytes a socket
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def listening_ports(proc_net: Path = Path("/proc/net")) -> set[int]:
    """The TCP ports with a listening socket in this network namespace (IPv4 and IPv6)."""
    ports: set[int] = set()
    for name in ("tcp", "tcp6"):
        text = read_proc(proc_net / name, max_bytes=_MAX_PROC_NET_BYTES)
        if text is None:
            continue
        lines = text.splitlines()[1:]
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def pid_alive(pid: int) -> bool:
    try:
        return (read_proc(f"/proc/{pid}/stat", max_bytes=4096) or "").rsplit(")", 1)[1].split()[0] != "Z"
    except IndexError:  # gone (nothing read) or not a stat line
        return False


def probe_ssh(port: int, pid: int | None, proc_net: Path = Path("/proc/net")) -> Probe:
    if pid is not None and not pid_alive(pid):
        return Probe("ssh", False, f"sshd (pid {pid}) is gone")
    if port not in listening_ports(proc_net):
        return Probe("ssh", False, f"nothing listens on :{port}")
    return Probe("ssh", True, f"sshd (pid {pid}) listens on :{port}")


def check(cfg: ServeConfig) -> list[Probe]:
    """Probe the services serve started (from its state file), else those the config names."""
    state = cfg.state_dir / SERVE_STATE_FILE
    if not os.path.lexists(state):
        return [Probe("serve", False, f"{state} missing: torchrig serve is not running (yet)")]
    try:  # serve writes a few hundred bytes; a FIFO, a device or a runaway file there is said, not read
        data = read_json(state, "serve state file", max_bytes=2**20)
        started = field(data, "services", dict, f"serve state file {str(state)!r}")
    except InputError as err:
        return [Probe("serve", False, err.one_line())]
    probes = []
    for name, pid in started.items():
        if name == "jupyter":
            probes.append(probe_jupyter(cfg.jupyter_port))
        else:
            probes.append(probe_ssh(cfg.ssh_port, pid if isinstance(pid, int) else None))
    return probes or [Probe("serve", True, "no services configured")]
