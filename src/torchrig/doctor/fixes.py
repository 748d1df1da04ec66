"""Fix commands that depend on the distribution, and the thresholds of doctor's warnings (``data/fixes.toml``)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DATA = Path(__file__).with_name("data") / "fixes.toml"

# NVIDIA's CUDA repository names one directory per distribution release.
_CUDA_DIST = {
    "debian": "debian{major}",
    "ubuntu": "ubuntu{nodot}",
    "rhel": "rhel{major}",
    "rocky": "rhel{major}",
    "almalinux": "rhel{major}",
    "centos": "rhel{major}",
    "fedora": "fedora{major}",
}


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    return tomllib.loads(DATA.read_text())  # raw-read: package data


def thresholds() -> dict[str, Any]:
    return dict(load()["thresholds"])


def _cuda_dist(os_id: str | None, version_id: str | None) -> str:
    if not os_id or not version_id or os_id not in _CUDA_DIST:
        return "<distro>"
    return _CUDA_DIST[os_id].format(major=version_id.split(".")[0], nodot=version_id.replace(".", ""))


def steps(
    kind: str,
    os_id: str | None,
    os_like: tuple[str, ...] = (),
    version_id: str | None = None,
    branch: str | None = None,
) -> tuple[tuple[str, ...], str]:
    """The steps of ``kind`` (driver_install, container_toolkit_install) for this distribution, and their source."""
    ids = [i for i in (os_id, *os_like) if i]
    rows = load()[kind]
    row = next((r for i in ids for r in rows if i in r["os_id"]), None) or next(
        r for r in rows if "*" in r["os_id"]
    )
    fmt = {
        "branch": branch or "<branch>",
        "cuda_dist": _cuda_dist(row["os_id"][0] if row["os_id"][0] != "*" else None, version_id),
    }
    out = [s.format(**fmt) for s in row["steps"]]
    if row.get("alternative"):
        out.append("or " + row["alternative"].format(**fmt))
    return tuple(out), row["source"]
