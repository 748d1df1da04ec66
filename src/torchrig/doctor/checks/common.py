"""What several checks need to know about the facts, computed once."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchrig.doctor.facts import Facts, ProbeStatus
from torchrig.doctor.findings import Finding

_GPU_NODE = re.compile(r"/dev/nvidia\d+")


@dataclass
class Context:
    facts: Facts
    kb_loader: Callable[[], Any] | None = None  # the knowledge base, loaded on first use (it costs ~0.1 s)
    found: list[Finding] = field(default_factory=list)  # every finding so far
    shown: list[Finding] = field(default_factory=list)  # those of the selected areas
    kb_state: str = "not needed"  # "not needed" | "loaded" | "unavailable"
    _kb: Any = None

    @property
    def kb(self) -> Any:
        if self.kb_state == "not needed" and self.kb_loader is not None:
            self._kb = self.kb_loader()
            self.kb_state = "loaded" if self._kb is not None else "unavailable"
        return self._kb

    # ---- what earlier checks concluded
    def has(self, *ids: str) -> bool:
        return any(f.id in ids or any(f.id.startswith(i + ".") for i in ids) for f in self.found)

    def blocking(self) -> list[Finding]:
        return [f for f in self.found if f.severity.blocks]

    # ---- the host
    @property
    def in_container(self) -> bool:
        return bool(self.facts.container.in_container)

    @property
    def gpu_nodes(self) -> list[str]:
        return [n.path for n in self.facts.kernel.device_nodes if _GPU_NODE.fullmatch(n.path)]

    @property
    def node_paths(self) -> set[str]:
        return {n.path for n in self.facts.kernel.device_nodes}

    @property
    def driver_version(self) -> str | None:
        k = self.facts.kernel
        return (
            self.facts.nvml.driver_version
            or k.module_version
            or k.nvml_library_version
            or k.cuda_library_version
        )

    @property
    def driver_loaded(self) -> bool:
        k = self.facts.kernel
        if k.wsl:
            return bool(k.wsl_driver_libs)
        return k.module_version is not None or self.facts.nvml.status is ProbeStatus.OK

    @property
    def driver_libs(self) -> bool:
        k = self.facts.kernel
        return bool(k.nvml_library or k.cuda_library)

    @property
    def gpu_names(self) -> list[str]:
        names = [g.name for g in self.facts.nvml.gpus if g.name]
        return names or [d.name for d in self.facts.torch.devices if d.name]

    @property
    def gpu_count(self) -> int | None:
        """GPUs this process could see (NVML ignores CUDA_VISIBLE_DEVICES); None when unknown."""
        if self.facts.nvml.status is ProbeStatus.OK:
            return len(self.facts.nvml.gpus)
        if self.in_container:
            return len(self.gpu_nodes) if self.facts.kernel.device_nodes else None
        if self.facts.kernel.pci_gpus:
            return len(self.facts.kernel.pci_gpus)
        return None

    @property
    def has_gpu_hardware(self) -> bool:
        return bool(
            self.facts.kernel.pci_gpus or self.facts.nvml.gpus or self.gpu_nodes or self.driver_loaded
        )

    @property
    def torch_cuda_build(self) -> bool:
        t = self.facts.torch
        return t.status is ProbeStatus.OK and t.cuda_version is not None

    def os_args(self) -> dict[str, Any]:
        k = self.facts.kernel
        return {"os_id": k.os_id, "os_like": k.os_like, "version_id": k.os_version_id}


def branch(driver: str | None) -> str | None:
    return driver.split(".")[0] if driver else None


def gib(n_bytes: int | None) -> str:
    if n_bytes is None:
        return "unknown"
    if n_bytes < 1024**3:
        return f"{n_bytes / 1024**2:.0f} MiB"
    return f"{n_bytes / 1024**3:.1f} GiB"
