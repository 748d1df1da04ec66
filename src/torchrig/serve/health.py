"""``torchrig serve --check``: the image's HEALTHCHECK. Each started service answers on its port, or the
check fails with one line naming the service (Docker shows it in ``docker inspect``)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

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


def probe_ssh(port: int) -> Probe:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
            banner = s.recv(64).decode("ascii", "replace").strip()
    except OSError as err:
        return Probe("ssh", False, f"no answer on :{port} ({err})")
    return Probe("ssh", banner.startswith("SSH-2.0"), banner or "no banner")


def check(cfg: ServeConfig) -> list[Probe]:
    """Probe the services serve started (from its state file), else those the config names."""
    state = cfg.state_dir / "serve.json"
    try:
        started = list(json.loads(Path(state).read_text(encoding="utf-8"))["services"])
    except (OSError, ValueError, KeyError):
        return [Probe("serve", False, f"{state} missing: torchrig serve is not running (yet)")]
    probes = []
    for name in started:
        probes.append(probe_jupyter(cfg.jupyter_port) if name == "jupyter" else probe_ssh(cfg.ssh_port))
    return probes or [Probe("serve", True, "no services configured")]
