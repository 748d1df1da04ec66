"""The knowledge base as typed, frozen records, loaded from ``torchrig/data/*.toml`` (see docs/knowledge-base.md).

>>> kb = load_kb()
>>> kb.find_gpu("RTX 3090").compute_capability
'8.6'
>>> kb.find_build("2.8.0+cu126").label
'2.8.0+cu126'

Lookups of things that do not exist raise :class:`~torchrig.errors.InputError` naming the closest valid
choices; malformed text raises :class:`~torchrig.errors.UsageError` (``torchrig.compat.versions``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchrig.compat import gpunames
from torchrig.compat import versions as V
from torchrig.compat.kbrows import FILES, kb_fields
from torchrig.compat.platforms import (
    DEFAULT_PLATFORM,
    ArchOverride,
    JetPack,
    Platform,
    PlatformInfo,
    PtxasGap,
    PypiDefault,
    TritonPin,
    TritonPtxas,
)
from torchrig.compat.records import (
    PYTORCH_INDEX,
    Branch,
    Build,
    Gpu,
    GpuArch,
    LibraryFloor,
    Peaks,
    Release,
    Toolkit,
    Variant,
    _closest_versions,
    closest,
)
from torchrig.errors import InputError

__all__ = [
    "PYTORCH_INDEX",
    "Branch",
    "Build",
    "Gpu",
    "GpuArch",
    "KnowledgeBase",
    "LibraryFloor",
    "Peaks",
    "Release",
    "Toolkit",
    "Variant",
    "build_kb",
    "load_kb",
]


@dataclass(frozen=True)
class KnowledgeBase:
    gpus: tuple[Gpu, ...]
    archs: tuple[GpuArch, ...]
    toolkits: tuple[Toolkit, ...]
    branches: tuple[Branch, ...]
    releases: tuple[Release, ...]  # newest first
    _gpu_index: Mapping[str, Gpu] = field(default_factory=dict, repr=False, compare=False)
    platforms: tuple[PlatformInfo, ...] = ()
    pypi_defaults: tuple[PypiDefault, ...] = ()
    arch_overrides: tuple[ArchOverride, ...] = ()
    jetpacks: tuple[JetPack, ...] = ()
    triton_pins: tuple[TritonPin, ...] = ()
    triton_ptxas: tuple[TritonPtxas, ...] = ()
    library_floors: tuple[LibraryFloor, ...] = ()

    # ---- GPUs
    def find_gpu(self, name: str) -> Gpu:
        """The GPU called ``name`` (any listed spelling, case/space/prefix-insensitive), else InputError."""
        if not name or not name.strip():
            raise InputError("empty GPU name", hint="e.g. --gpu 'RTX 4090' or --gpu 'NVIDIA H100 80GB HBM3'")
        name = gpunames.marketing_name(name)
        keys = gpunames.lookup_keys(name)
        for key in keys:
            if key in self._gpu_index:
                return self._gpu_index[key]
        listed = gpunames.pci_gpus()
        for key in keys:
            if key in listed:
                return listed[key]
        short = gpunames.strip_prefixes(name)
        family = list(
            dict.fromkeys(g for k, g in self._gpu_index.items() if len(short) >= 3 and k.startswith(short))
        )
        if family and len({(g.arch, g.compute_capability) for g in family}) == 1:
            # "V100" or "H100": every board it can mean has the same architecture and compute capability,
            # which is all check/resolve use; the first listed board stands for them.
            return family[0]
        if family:
            raise InputError(
                f"GPU {name.strip()!r} is ambiguous",
                hint=f"it matches {', '.join(g.name for g in family[:4])}; pass the full name",
            )
        laptop = gpunames.laptop_part(name, self._gpu_index)
        if laptop is not None:
            return laptop
        near = closest(gpunames.strip_prefixes(name), list(self._gpu_index), n=6, cutoff=0.6)
        names = list(dict.fromkeys(self._gpu_index[k].name for k in near))[:3]
        hint = (
            f"did you mean: {', '.join(names)}?"
            if names
            else "see 'torchrig matrix' for the GPUs torchrig knows"
        )
        raise InputError(f"unknown GPU {name.strip()!r}", hint=hint)

    def arch(self, name: str) -> GpuArch:
        for a in self.archs:
            if a.name == name:
                return a
        raise InputError(
            f"unknown GPU architecture {name!r}",
            hint=f"did you mean: {', '.join(closest(name, [a.name for a in self.archs]))}?",
        )

    # ---- CUDA and drivers
    def toolkit(self, version: str) -> Toolkit:
        mm = V.cuda_major_minor(version)
        for t in self.toolkits:
            if t.version == mm:
                return t
        choices = _closest_versions(mm, [t.version for t in self.toolkits])
        raise InputError(f"unknown CUDA toolkit {version!r}", hint=f"known: {', '.join(choices)}")

    def branch_of(self, driver: str) -> Branch | None:
        """The driver branch that ``driver`` (``"570.86.10"``) belongs to, or None if the KB does not list it."""
        major = V.driver_branch(driver)
        for b in self.branches:
            if b.branch == major:
                return b
        return None

    # ---- torch
    def release(self, version: str) -> Release:
        norm = V.normalise_release(version)
        for r in self.releases:
            if r.version == norm:
                return r
        choices = _closest_versions(norm, [r.version for r in self.releases])
        oldest = self.releases[-1].version if self.releases else None
        if oldest is not None and V.parse_release(norm) < V.parse_release(oldest):
            raise InputError(
                f"torch {norm} is older than torchrig's knowledge base, which starts at torch {oldest}",
                hint=f"its builds cannot be judged; the oldest releases it knows: {', '.join(choices)}",
            )
        raise InputError(
            f"torch {norm} was never published (or is newer than torchrig's knowledge base)",
            hint=f"closest releases: {', '.join(choices)}",
        )

    def find_build(self, text: str, platform: Platform | None = None) -> Build:
        """``"2.8.0+cu126"`` -> that build; ``"2.8.0"`` -> the build PyPI serves on ``platform``; ``"2.8.0+cpu"``
        -> CPU-only. A nightly (``2.10.0.dev20250915+cu128``) is read as its release line, with a remark."""
        parsed = V.parse_torch_build_text(text)
        plat = platform or Platform()
        if parsed.prerelease and parsed.variant and not self._has_build(parsed.release, parsed.variant):
            from torchrig.compat.nightly import nightly_by_cuda

            return nightly_by_cuda(self.releases, self.toolkits, parsed, plat)
        rel = self.release(parsed.release)
        name = parsed.variant or self.pypi_default(rel, plat)[0]
        build = self.build(rel, rel.variant(name), plat)
        if parsed.prerelease:
            remark = (
                f"{parsed.prerelease} is a nightly or pre-release build, read as the {rel.version} release line: "
                f"nightlies move from day to day (kernels, CUDA, pins), so this verdict is the release's"
            )
            remarks = (*build.remarks, ("prerelease_build", remark), *_channel(parsed.prerelease, name))
            build = dataclasses.replace(build, prerelease=parsed.prerelease, remarks=remarks)
        return build

    def _has_build(self, version: str, variant: str) -> bool:
        norm = V.normalise_release(version)
        return any(r.version == norm and any(v.name == variant for v in r.variants) for r in self.releases)

    # ---- platforms
    def platform_info(self, platform_id: str) -> PlatformInfo | None:
        return next((p for p in self.platforms if p.id == platform_id), None)

    def pypi_default(self, release: Release, platform: Platform) -> tuple[str, bool]:
        """The variant PyPI serves for ``release`` on ``platform``, and whether that is confirmed."""
        for row in self.pypi_defaults:
            if row.platform == platform.id and V.parse_spec(row.releases).admits(release.version):
                name = release.pypi_variant if row.variant == "release" else row.variant
                return name, row.confirmed
        return release.pypi_variant, platform.id in (DEFAULT_PLATFORM, "wsl")

    def build(self, release: Release, variant: Variant, platform: Platform | None = None) -> Build:
        """``release`` + ``variant`` as the wheel for ``platform``: its kernels and its PyPI default."""
        plat = platform or Platform()
        pypi, pypi_ok = self.pypi_default(release, plat)
        remarks: list[tuple[str, str]] = []
        if not variant.confirmed:
            remarks.append(
                (
                    "build_not_confirmed",
                    f"torch {release.version}+{variant.name} is not confirmed: reported, not read from its wheel "
                    f"or index ({variant.source})",
                )
            )
        variant, arch_ok, arch_remark = self._kernels(release, variant, plat)
        remarks.extend(arch_remark)
        if not pypi_ok and variant.name == pypi:
            remarks.append(
                (
                    "pypi_default_not_confirmed",
                    f"that PyPI serves {plat.label} the {pypi} build of torch {release.version} is not confirmed",
                )
            )
        return Build(release, variant, plat.id, pypi, pypi_ok, arch_ok, remarks=tuple(remarks))

    def _kernels(
        self, release: Release, variant: Variant, plat: Platform
    ) -> tuple[Variant, bool, tuple[tuple[str, str], ...]]:
        """The kernels of ``variant``'s wheel for ``plat``: the variant (with another platform's arch list where
        the knowledge base has one), whether they are confirmed, and the remark when they are not."""
        arch_platform = plat.arch_platform
        if variant.is_cpu or (arch_platform == DEFAULT_PLATFORM and plat.id != "windows"):
            return variant, arch_platform == DEFAULT_PLATFORM and plat.id != "windows", ()
        if arch_platform != DEFAULT_PLATFORM:
            row = next(
                (
                    a
                    for a in self.arch_overrides
                    if a.platform == arch_platform
                    and a.variant == variant.name
                    and V.parse_spec(a.releases).admits(release.version)
                ),
                None,
            )
            if row is not None:
                replaced = dataclasses.replace(
                    variant, arch_list=row.arch_list, ptx=row.ptx, source=row.source, verified=row.verified
                )
                return replaced, True, ()
        wheel = arch_platform if arch_platform != DEFAULT_PLATFORM else "Windows"
        remark = (
            f"the kernels of torch {release.version}+{variant.name}'s {wheel} wheel are not confirmed: "
            f"the Linux x86_64 wheel's arch list was used"
        )
        return variant, False, (("arch_list_not_confirmed", remark),)

    def jetpack(self, version: str | None) -> JetPack | None:
        return next((j for j in self.jetpacks if j.version == version), None)

    def jetpack_for_driver(self, driver: str) -> JetPack | None:
        """The JetPack whose driver number this is (exact, else the same major: 580.x -> JetPack 7)."""
        exact = next((j for j in self.jetpacks if j.driver == driver), None)
        if exact:
            return exact
        major = V.parse_driver(driver)[0]
        return next((j for j in self.jetpacks if j.driver and V.parse_driver(j.driver)[0] == major), None)

    def windows_branch(self, driver: str) -> Branch | None:
        """The Linux branch a Windows driver number belongs to: the newest listed branch not above it."""
        major = V.parse_driver(driver)[0]
        below = [b for b in self.branches if int(b.branch) <= major]
        return max(below, key=lambda b: int(b.branch)) if below else None

    def triton_of(self, release: Release) -> TritonPtxas | None:
        """The Triton a release's wheels require and what it bundles (None: not in the data)."""
        pin = next((p for p in self.triton_pins if p.torch == release.version), None)
        return next((t for t in self.triton_ptxas if pin and t.version == pin.triton), None)

    def ptxas_gap(self, gpu: Gpu, release: Release, prerelease: bool = False) -> PtxasGap | None:
        """The GPU's target when the ptxas of the release's Triton does not know it (torch.compile fails);
        see :func:`torchrig.compat.ptxas.gap`."""
        from torchrig.compat import ptxas

        return ptxas.gap(self, gpu, release, prerelease)

    def builds_for_release(self, version: str, platform: Platform | None = None) -> list[Build]:
        rel = self.release(version)
        return [self.build(rel, v, platform) for v in rel.variants]

    def all_builds(self, platform: Platform | None = None) -> list[Build]:
        return [self.build(r, v, platform) for r in self.releases for v in r.variants]

    def other_builds_with_native_cubin(self, build: Build, gpu: Gpu) -> list[Build]:
        """Variants of ``build``'s release that carry an exact cubin for ``gpu`` (used to flag forward runs)."""
        want = gpu.sm
        plat = Platform(build.platform)
        return [
            b
            for b in self.builds_for_release(build.release.version, plat)
            if b.variant.name != build.variant.name and want in b.variant.arch_list
        ]


# ---------------------------------------------------------------- loading


def build_kb(
    gpus: Mapping[str, Any],
    cuda: Mapping[str, Any],
    drivers: Mapping[str, Any],
    torch: Mapping[str, Any],
    platforms: Mapping[str, Any] | None = None,
) -> KnowledgeBase:
    """Build a KnowledgeBase from the parsed data files (tests pass small in-memory ones; platforms optional).
    A malformed file or row is an InputError naming it (``torchrig.compat.kbrows``)."""
    docs = {"gpus": gpus, "cuda": cuda, "drivers": drivers, "torch": torch}
    return KnowledgeBase(**kb_fields(docs if platforms is None else {**docs, "platforms": platforms}))


@functools.lru_cache(maxsize=1)
def load_kb() -> KnowledgeBase:
    """The knowledge base from the package's data files (loaded once per process).

    Parsed on every start, no cache on disk: tomllib and the records take ~40 ms in a fresh process (the
    fastest of ten runs; 2026-12), a cache would save ~30 ms of that and is one more file read back at start.
    """
    from torchrig import data

    return KnowledgeBase(**kb_fields({name: data.load(name) for name in FILES}))


def _channel(prerelease: str, variant: str) -> tuple[tuple[str, str], ...]:
    """The nightly channel's word on ``variant`` on the nightly's date (``torchrig.compat.nightly``), if any."""
    from torchrig.compat.nightly import channel_remark

    remark = channel_remark(prerelease, variant)
    return (remark,) if remark else ()
