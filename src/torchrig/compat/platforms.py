"""Platforms: Linux x86_64, Linux aarch64 (Grace, DGX Spark), Jetson (JetPack 5/6/7), Windows and WSL.

A platform decides three things the Linux x86_64 rules take for granted (``torchrig/data/platforms.toml``):

* which wheel ``pip install torch==X`` gets from PyPI (aarch64: CPU-only up to 2.10; Windows: CPU-only);
* which kernels a build carries (aarch64 CUDA wheels start at sm_80);
* how the driver is numbered (Windows 566.36 is branch R565; Jetson 540.4.0 and 580.00 are JetPack numbers).

Detection is a pure function of recorded facts (:func:`detect_platform`); ``torchrig.compat.host`` reads them.

>>> detect_platform(HostFacts(system="Linux", machine="aarch64")).id
'linux-aarch64'
>>> detect_platform(HostFacts(system="Linux", machine="aarch64", tegra_release="# R38 (release), REVISION: 2.0")).label
'jetson (JetPack 7)'
>>> parse_platform("jetson6").jetpack
'6'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchrig.errors import UsageError

PLATFORM_IDS = ("linux-x86_64", "linux-aarch64", "jetson", "windows", "wsl")
DEFAULT_PLATFORM = "linux-x86_64"
JETPACKS = ("5", "6", "7")
# /etc/nv_tegra_release: "# R38 (release), REVISION: 2.0, ..." -> L4T major 38 (JetPack 7), see platforms.toml.
_TEGRA_RE = re.compile(r"#\s*R(\d+)\s*\(release\)")
_JETSON_RE = re.compile(r"jetson[-_ ]?(?:jp|jetpack)?[-_ ]?(\d)?")


@dataclass(frozen=True)
class PlatformInfo:
    id: str
    name: str
    wheel_tag: str
    driver_numbering: str  # desktop | windows | jetson
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class PypiDefault:
    platform: str
    releases: str  # a specifier, e.g. "<2.11"
    variant: str  # "release": the release's own pypi_variant
    confirmed: bool = True
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class ArchOverride:
    platform: str
    releases: str
    variant: str
    arch_list: tuple[str, ...]
    ptx: tuple[str, ...]
    evidence: str = ""
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class JetPack:
    version: str
    l4t: str
    max_cuda: str
    torch: str  # jetson-wheels | sbsa
    driver: str | None = None
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class TritonPin:
    """The Triton a torch release's Linux wheels require (``Requires-Dist: triton==X``)."""

    torch: str
    triton: str
    source: str = ""
    verified: str = ""


@dataclass(frozen=True)
class TritonPtxas:
    """The ptxas a Triton release bundles: ``ptxas`` (the CUDA release it comes from) for every target, or, where
    ``ptxas_blackwell`` is set, for targets below sm_100 only; ``blackwell_override`` is the variable that points
    Triton at another ptxas for sm_100 and newer (None: the release has none that works)."""

    version: str
    ptxas: str | None
    ptxas_blackwell: str | None = None
    blackwell_override: str | None = None
    source: str = ""
    verified: str = ""

    def ptxas_for(self, compute_capability: str) -> tuple[str | None, str]:
        """(the CUDA release of the ptxas Triton runs for that GPU, the variable that overrides it)."""
        if self.ptxas_blackwell and int(compute_capability.split(".")[0]) >= 10:
            return self.ptxas_blackwell, self.blackwell_override or ""
        return self.ptxas, "TRITON_PTXAS_PATH"


@dataclass(frozen=True)
class PtxasGap:
    """A GPU target the ptxas of a build's Triton does not know: eager runs, torch.compile fails."""

    compute_capability: str
    target: str
    triton: str
    ptxas: str
    workaround: str
    source: str = ""
    verified: str = ""
    certain: bool = True


@dataclass(frozen=True)
class Platform:
    """The platform a question is asked for: an id and, for Jetson, the JetPack major (None: not known)."""

    id: str = DEFAULT_PLATFORM
    jetpack: str | None = None

    @property
    def label(self) -> str:
        return f"jetson (JetPack {self.jetpack})" if self.id == "jetson" and self.jetpack else self.id

    @property
    def arch_platform(self) -> str:
        """Whose kernels the platform's wheels carry: WSL runs the x86_64 wheels, Jetson (JetPack 7) the aarch64 ones."""
        return {"wsl": "linux-x86_64", "jetson": "linux-aarch64", "windows": "linux-x86_64"}.get(
            self.id, self.id
        )


def parse_platform(text: str | None) -> Platform:
    """``linux-x86_64 | linux-aarch64 | jetson | jetson5 | jetson6 | jetson7 | windows | wsl`` (case-insensitive)."""
    if text is None:
        return Platform()
    t = text.strip().lower().replace("_", "-")
    aliases = {
        "x86_64": "linux-x86_64",
        "linux": "linux-x86_64",
        "aarch64": "linux-aarch64",
        "arm64": "linux-aarch64",
        "sbsa": "linux-aarch64",
        "linux-arm64": "linux-aarch64",
        "win": "windows",
        "win-amd64": "windows",
        "linux-x86-64": "linux-x86_64",
        "wsl2": "wsl",
    }
    t = aliases.get(t, t)
    if t in PLATFORM_IDS:
        return Platform(t)
    m = _JETSON_RE.fullmatch(t)
    if m and (m.group(1) is None or m.group(1) in JETPACKS):
        return Platform("jetson", m.group(1))
    raise UsageError(
        f"unknown platform {text!r}",
        hint="use linux-x86_64, linux-aarch64, jetson (or jetson5, jetson6, jetson7 for a JetPack), windows or wsl",
    )


@dataclass(frozen=True)
class HostFacts:
    """What detection needs, as recorded: ``platform.system()``, ``platform.machine()``, /proc/version and
    /etc/nv_tegra_release (None where absent)."""

    system: str | None = None
    machine: str | None = None
    proc_version: str | None = None
    tegra_release: str | None = None


def jetpack_of_l4t(tegra_release: str | None) -> str | None:
    """JetPack major from /etc/nv_tegra_release: R35 -> 5, R36 -> 6, R38 -> 7 (platforms.toml [[jetpack]])."""
    m = _TEGRA_RE.search(tegra_release or "")
    if not m:
        return None
    return {"35": "5", "36": "6", "38": "7"}.get(m.group(1))


def detect_platform(facts: HostFacts) -> Platform:
    """The platform these recorded facts describe (a pure function; unknown facts default to linux-x86_64)."""
    system = (facts.system or "").lower()
    machine = (facts.machine or "").lower()
    if system.startswith("win"):
        return Platform("windows")
    proc = (facts.proc_version or "").lower()
    if "microsoft" in proc or "wsl" in proc:
        return Platform("wsl")
    if facts.tegra_release or "tegra" in proc:
        return Platform("jetson", jetpack_of_l4t(facts.tegra_release))
    if machine in ("aarch64", "arm64"):
        return Platform("linux-aarch64")
    return Platform()


def platform_of_kernel(
    machine: str | None, kernel_release: str | None, wsl: bool, tegra_release: str | None
) -> Platform | None:
    """The platform of doctor's recorded kernel facts; None when they do not say (facts recorded before the
    machine was). The kernel release stands in for /proc/version: it names "-tegra" and "-microsoft-standard-WSL2"."""
    if machine is None and not wsl and not tegra_release:
        return None
    proc = " ".join(x for x in (kernel_release, "microsoft" if wsl else None) if x)
    return detect_platform(
        HostFacts(system="Linux", machine=machine, proc_version=proc, tegra_release=tegra_release)
    )
