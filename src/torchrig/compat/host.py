"""The one adapter of the compatibility engine: this machine's platform facts (no NVML, no torch).

Equivalent shell: ``uname -sm; cat /proc/version /etc/nv_tegra_release``.
"""

from __future__ import annotations

import platform as _platform

from torchrig.compat.platforms import HostFacts, Platform, detect_platform


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096)
    except OSError:
        return None


def read_host_facts() -> HostFacts:
    return HostFacts(
        system=_platform.system() or None,
        machine=_platform.machine() or None,
        proc_version=_read("/proc/version"),
        tegra_release=_read("/etc/nv_tegra_release"),
    )


def host_platform() -> Platform:
    """This machine's platform (what ``--platform`` defaults to)."""
    return detect_platform(read_host_facts())
