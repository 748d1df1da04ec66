"""The one adapter of the compatibility engine: this machine's platform facts (no NVML, no torch).

Equivalent shell: ``uname -sm; cat /proc/version /etc/nv_tegra_release``.
"""

from __future__ import annotations

import platform as _platform
from dataclasses import dataclass

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


@dataclass(frozen=True)
class LocalGpus:
    """The GPUs and driver NVML reports here (``nvidia-smi --query-gpu=name,driver_version``); ``error`` says
    why none could be read (no nvidia-ml-py, no driver)."""

    names: tuple[str, ...] = ()
    driver: str | None = None
    error: str | None = None


def detect_local_gpus() -> LocalGpus:
    """Through torchrig's NVML adapter (torchrig.hw.nvml); pynvml is imported only here, when called."""
    from torchrig.hw.nvml import NvmlError, session

    try:
        with session() as nv:
            names = tuple(d.name for d in nv.devices() if d.name)
            return LocalGpus(names, nv.system().driver_version)
    except NvmlError as err:
        return LocalGpus(error=str(err))
