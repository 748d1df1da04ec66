"""Parsing ``torchrig up`` values (sizes, CPUs, volumes, names) into checked records; pure functions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from torchrig.errors import InputError, UsageError

NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}")


def parse_cpus(text: str, host_cpus: int) -> int:
    """``"8"`` or ``"1.5"`` CPUs -> nano-CPUs (Docker's ``NanoCpus``); more than the host has is an error."""
    try:
        cpus = float(text)
    except ValueError:
        raise UsageError(
            f"malformed --cpus {text!r}", hint="expected a number of CPUs, e.g. 8 or 1.5"
        ) from None
    if not 0.01 <= cpus <= host_cpus:
        raise InputError(
            f"--cpus {text}: this host has {host_cpus} CPUs", hint=f"pick a number from 0.01 to {host_cpus}"
        )
    return int(cpus * 1e9)


@dataclass(frozen=True)
class Volume:
    host_path: str  # an absolute host path (bind), or a Docker volume's name (volume)
    container_path: str
    read_only: bool = False
    kind: str = "bind"  # "bind" | "volume"


VOLUME_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")


def parse_volume(text: str, cwd: Path) -> Volume:
    """``HOST:CONTAINER[:ro|rw]`` or ``NAME:CONTAINER[:ro|rw]``, as ``docker run -v`` reads them.

    A source with no ``/`` that does not start with ``.`` or ``~`` is a named volume (created if missing);
    anything else is a host directory, which must exist (Docker would create it as root otherwise)."""
    parts = text.split(":")
    mode = "rw"
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        mode = parts.pop()
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise UsageError(f"malformed --volume {text!r}", hint="expected HOST:CONTAINER or HOST:CONTAINER:ro")
    if not PurePosixPath(parts[1]).is_absolute():
        raise UsageError(
            f"--volume {text!r}: the container path must be absolute", hint="e.g. /home/dev/work"
        )
    target = str(PurePosixPath(parts[1]))
    source = parts[0]
    if "/" not in source and not source.startswith((".", "~")):
        if not VOLUME_NAME_RE.fullmatch(source):
            raise UsageError(
                f"--volume {text!r}: {source!r} is not a valid volume name",
                hint="letters, digits, '_', '.', '-'; or give a host path (./dir, /abs/dir)",
            )
        return Volume(source, target, mode == "ro", "volume")
    host = (cwd / Path(source).expanduser()).resolve()
    if not host.exists():
        raise InputError(
            f"--volume {text!r}: {host} does not exist", hint=f"create it first: mkdir -p {host}"
        )
    return Volume(str(host), target, mode == "ro")


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise UsageError(
            f"invalid environment name {name!r}",
            hint="use letters, digits, '_', '.', '-' (up to 63), starting with a letter or digit",
        )
    return name


ULIMIT_NAMES = (
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
)


def parse_ulimit(text: str) -> tuple[str, int, int]:
    """``memlock=-1`` or ``nofile=1024:4096`` -> (name, soft, hard), as ``docker run --ulimit`` reads it."""
    name, eq, value = text.partition("=")
    soft_s, _, hard_s = value.partition(":")
    try:
        soft = int(soft_s)
        hard = int(hard_s) if hard_s else soft
    except ValueError:
        soft = hard = -2
    if not eq or name not in ULIMIT_NAMES or soft < -1 or hard < -1:
        from torchrig.fuzzy import did_you_mean

        raise UsageError(
            f"malformed --ulimit {text!r}",
            hint=did_you_mean(name, ULIMIT_NAMES)
            or "expected NAME=SOFT[:HARD] in bytes/counts, e.g. memlock=-1",
        )
    return name, soft, hard
