"""The knowledge base's records: typed, frozen, units in names, ``None`` for unknown (docs/knowledge-base.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torchrig.compat import versions as V
from torchrig.errors import InputError

PYTORCH_INDEX = "https://download.pytorch.org/whl"


def closest(word: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.5) -> list[str]:
    from torchrig.fuzzy import closest as _closest  # difflib only on the error path

    return _closest(word, choices, n=n, cutoff=cutoff)


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def _closest_versions(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Closest versions by number (2.9.5 -> 2.9.1, 2.9.0), falling back to spelling for non-numeric words."""
    pool = list(dict.fromkeys(choices))
    target = _numbers(word)
    if not target:
        return closest(word, pool, n=n) or pool[:n]

    def distance(choice: str) -> tuple[int, ...]:
        got = _numbers(choice) or (10**6,)
        width = max(len(got), len(target))
        a, b = target + (0,) * (width - len(target)), got + (0,) * (width - len(got))
        return tuple(abs(x - y) for x, y in zip(a, b, strict=True))

    return sorted(pool, key=distance)[:n]


@dataclass(frozen=True)
class GpuArch:
    name: str
    compute_capabilities: tuple[str, ...]
    last_driver_branch: str | None = None
    min_driver_branch: str | None = None
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class Peaks:
    """Datasheet peaks, dense; ``None`` where the datasheet does not state the figure."""

    fp32_tflops: float | None = None
    tf32_tflops: float | None = None
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    fp8_tflops: float | None = None
    memory_bandwidth_gbps: float | None = None
    nvlink_bandwidth_gbps: float | None = None
    pcie_gen: int | None = None
    pcie_bandwidth_gbps: float | None = None
    source: str | None = None


@dataclass(frozen=True)
class Gpu:
    id: str
    name: str
    arch: str
    compute_capability: str
    segment: str
    family: str
    memory_gb: float | None
    memory_type: str | None
    aliases: tuple[str, ...]
    peaks: Peaks
    source: str = ""
    verified: str = ""
    host_platform: str | None = (
        None  # the only platform it exists on (GH200, GB200, GB300, GB10: linux-aarch64)
    )

    @property
    def cc(self) -> tuple[int, int]:
        return V.parse_cc(self.compute_capability)

    @property
    def sm(self) -> str:
        return V.sm_str(self.cc)


@dataclass(frozen=True)
class Toolkit:
    version: str
    min_driver: str | None
    min_driver_minor_compat: str | None
    compute_capabilities: tuple[str, ...]
    released: str | None = None
    source: str = ""
    verified: str = ""

    @property
    def major(self) -> int:
        return V.parse_cuda(self.version)[0]


@dataclass(frozen=True)
class LibraryFloor:
    """A library the wheel bundles (cuDNN) and the lowest compute capability its ``versions`` support."""

    library: str
    versions: str  # PEP 440 specifier on the bundled version
    min_compute_capability: str
    workaround: str = ""
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class Branch:
    branch: str
    max_cuda: str
    first_release: str | None = None
    released: str | None = None
    lts: bool = False
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class Variant:
    name: str
    cuda: str | None
    index_url: str
    arch_list: tuple[str, ...]
    ptx: tuple[str, ...]
    cudnn: str | None = None
    nccl: str | None = None
    source: str = ""
    verified: str = ""
    confirmed: bool = True  # False: reported, not read from the wheel or the index
    # the find-links page pytorch.org installs it from (releases before 1.11: ``pip install torch==X+cu111 -f URL``)
    find_links: str | None = None

    @property
    def is_cpu(self) -> bool:
        return self.cuda is None


@dataclass(frozen=True)
class Release:
    version: str
    released: str | None
    python: tuple[str, ...]
    torchvision: str | None
    torchaudio: str | None
    pypi_variant: str
    variants: tuple[Variant, ...]
    source: str = ""
    verified: str = ""

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        known = ", ".join(_closest_versions(name, [v.name for v in self.variants], n=8))
        raise InputError(
            f"torch {self.version} has no {name} build in torchrig's knowledge base (not confirmed either way)",
            hint=f"known builds: {known}; 'torchrig matrix --torch {self.version}' lists them",
        )


@dataclass(frozen=True)
class Build:
    """One installable wheel: a release and one of its variants, on a platform.

    ``variant`` carries the platform's kernels (``KnowledgeBase.build`` swaps in platforms.toml's arch list);
    ``pypi_variant`` is what PyPI serves on the platform for this release (None: the release's own).
    ``prerelease`` is the nightly or pre-release version the user gave (``2.10.0.dev20250915``), understood as
    this release line; ``remarks`` say what about this build is not confirmed. Neither takes part in equality.
    """

    release: Release
    variant: Variant
    platform: str = "linux-x86_64"
    pypi_variant: str | None = None
    pypi_confirmed: bool = True
    arch_confirmed: bool = True
    prerelease: str | None = field(default=None, compare=False)
    remarks: tuple[tuple[str, str], ...] = field(default=(), compare=False)  # (reason code, text)

    @property
    def label(self) -> str:
        return f"{self.release.version}+{self.variant.name}"

    @property
    def is_pypi_default(self) -> bool:
        return self.variant.name == (self.pypi_variant or self.release.pypi_variant)

    @property
    def cuda(self) -> str | None:
        return self.variant.cuda

    @property
    def pip_command(self) -> str:
        """``pip install torch==X``: plain for the PyPI build, else from the variant's index."""
        return self.pip_command_for(("torch",))

    def pip_command_for(self, packages: Iterable[str]) -> str:
        pins = {
            "torch": self.release.version,
            "torchvision": self.release.torchvision,
            "torchaudio": self.release.torchaudio,
        }
        reqs = " ".join(f"{p}=={pins[p]}" for p in packages if pins.get(p))
        if self.is_pypi_default and self.pypi_confirmed:  # an unconfirmed default: name the index to be sure
            return f"pip install {reqs}"
        if self.variant.find_links:
            # a find-links page lists every variant of a version, so the variant is named on torch and torchvision;
            # torchaudio is pinned without one, as pytorch.org's previous-versions page writes these commands
            local = {"torch", "torchvision"}
            reqs = " ".join(
                f"{p}=={pins[p]}" + (f"+{self.variant.name}" if p in local else "")
                for p in packages
                if pins.get(p)
            )
            return f"pip install {reqs} -f {self.variant.find_links}"
        return f"pip install {reqs} --index-url {self.variant.index_url}"

    def to_json(self) -> dict[str, Any]:
        v = self.variant
        return {
            "label": self.label,
            "release": self.release.version,
            "variant": v.name,
            "cuda": v.cuda,
            "pypi_default": self.is_pypi_default,
            "index_url": v.index_url,
            "find_links": v.find_links,
            "arch_list": list(v.arch_list),
            "ptx": list(v.ptx),
            "cudnn": v.cudnn,
            "nccl": v.nccl,
            "pip_command": self.pip_command,
            "platform": self.platform,
            "pypi_confirmed": self.pypi_confirmed,
            "arch_confirmed": self.arch_confirmed,
            "prerelease": self.prerelease,
            "remarks": [{"code": c, "message": m} for c, m in self.remarks],
        }
