"""The one adapter of the compatibility engine: this machine's platform facts (no NVML, no torch).

Equivalent shell: ``uname -sm; cat /proc/version /etc/nv_tegra_release``.
"""

from __future__ import annotations

import platform as _platform
from dataclasses import dataclass

from torchrig.compat.platforms import HostFacts, Platform, detect_platform
from torchrig.inputfiles import read_proc


def read_host_facts() -> HostFacts:
    return HostFacts(
        system=_platform.system() or None,
        machine=_platform.machine() or None,
        proc_version=read_proc("/proc/version", max_bytes=4096),
        tegra_release=read_proc("/etc/nv_tegra_release", max_bytes=4096),
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
