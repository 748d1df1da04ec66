"""Who a GPU process is: its user (``ps -o user= -p PID``, from /proc/PID/status) and, when it runs in a Docker
container, the container's name (``docker ps``, through the Engine API). NVML gives the pid in the host's pid
namespace, so inside a container both stay unknown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from torchrig.accounts import account_name
from torchrig.inputfiles import read_proc

# /proc/PID/cgroup of a Docker container's process: ".../docker-<64 hex>.scope" (systemd cgroup driver) or
# ".../docker/<64 hex>" (cgroupfs driver).
_DOCKER_ID = re.compile(r"docker[-/]([0-9a-f]{64})")


def _read(path: str) -> str | None:
    return read_proc(path)


def user_of(pid: int) -> str | None:
    """The real user of ``pid``: its name, or ``uid N`` when the name is not in this machine's passwd."""
    status = _read(f"/proc/{pid}/status")
    line = next((ln for ln in (status or "").splitlines() if ln.startswith("Uid:")), None)
    if line is None:
        return None
    uid = int(line.split()[1])
    return account_name(uid) or f"uid {uid}"


def container_id_of(pid: int) -> str | None:
    m = _DOCKER_ID.search(_read(f"/proc/{pid}/cgroup") or "")
    return m.group(1) if m else None


def container_names(ids: Iterable[str], socket_path: str | None) -> dict[str, str]:
    """Container id -> name (``docker inspect -f '{{.Name}}' ID``); an id the engine does not answer for is
    left out."""
    from torchrig.doctor.probes.container import engine_get

    names: dict[str, str] = {}
    if socket_path is None:
        return names
    for cid in ids:
        try:
            names[cid] = str(engine_get(socket_path, f"/containers/{cid}/json", 2.0).get("Name", "")).lstrip(
                "/"
            )
        except (OSError, ValueError):
            continue
    return names


def identify(
    pids: Iterable[int],
    socket_path: str | None,
    user: Callable[[int], str | None] = user_of,
    container: Callable[[int], str | None] = container_id_of,
) -> dict[int, tuple[str | None, str | None]]:
    """pid -> (user, container name or short id) for each pid."""
    ids = {pid: container(pid) for pid in set(pids)}
    names = container_names({c for c in ids.values() if c}, socket_path)
    return {pid: (user(pid), None if cid is None else names.get(cid) or cid[:12]) for pid, cid in ids.items()}
