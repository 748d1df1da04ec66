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
import os
import re
import sys
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchrig.compat import versions as V
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


_PREFIXES = ("nvidia", "geforce", "tesla", "quadro")
# NVML names carry the board's form factor and memory ("Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3");
# when the exact spelling is not listed, these tokens are dropped and the name is looked up again.
_BOARD_TOKENS = re.compile(r"[\s_-]+(sxm\d?|pcie|\d+gb|hbm\d?e?|nvl|mig|\d+g)\b", re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def pci_gpus() -> dict[str, Gpu]:
    """The PCI ID database's NVIDIA GPUs of compute capability >= 3.5 (``data/pci_gpus.json``, written by
    tools/gen_pci_gpus.py), by normalised name: the fallback for names gpus.toml does not list. A name two
    entries give different capabilities is left out (it cannot say which GPU it is)."""
    import json

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "pci_gpus.json")
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    sources = {r["compute_capability"] + r["arch"]: r["source"] for r in doc["rules"]}
    found: dict[str, Gpu] = {}
    clash: set[str] = set()
    for row in doc["gpu"]:
        for spelling in row["names"]:
            gpu = Gpu(
                id=f"pci-{row['device_id'].replace(':', '-')}",
                name=spelling,
                arch=row["arch"],
                compute_capability=row["compute_capability"],
                segment=row["segment"],
                family=row["arch"],
                memory_gb=None,
                memory_type=None,
                aliases=(),
                peaks=Peaks(),
                source=f"{doc['source']}; compute capability: {sources[row['compute_capability'] + row['arch']]}",
                verified=doc["verified"],
            )
            for key in (_norm(spelling), _strip_prefixes(spelling)):
                have = found.get(key)
                if have is not None and have.compute_capability != gpu.compute_capability:
                    clash.add(key)
                found.setdefault(key, gpu)
    return {k: g for k, g in found.items() if k not in clash}


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.lower())


def _strip_prefixes(name: str) -> str:
    words = name.lower().replace("_", " ").replace("-", " ").split()
    while words and words[0] in _PREFIXES:
        words.pop(0)
    return "".join(words)


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
        pci = re.fullmatch(
            r"\s*[A-Z]{2}\d{3}[A-Z]*\s*\[(.+)\]\s*", name
        )  # pci.ids' "GA102 [GeForce RTX 3090]"
        name = pci.group(1) if pci else name
        keys = (_norm(name), _strip_prefixes(name), _strip_prefixes(_BOARD_TOKENS.sub("", name)))
        for key in keys:
            if key in self._gpu_index:
                return self._gpu_index[key]
        listed = pci_gpus()
        for key in keys:
            if key in listed:
                return listed[key]
        short = _strip_prefixes(name)
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
        laptop = self._laptop_part(name)
        if laptop is not None:
            return laptop
        near = closest(_strip_prefixes(name), list(self._gpu_index), n=6, cutoff=0.6)
        names = list(dict.fromkeys(self._gpu_index[k].name for k in near))[:3]
        hint = (
            f"did you mean: {', '.join(names)}?"
            if names
            else "see 'torchrig matrix' for the GPUs torchrig knows"
        )
        raise InputError(f"unknown GPU {name.strip()!r}", hint=hint)

    def _laptop_part(self, name: str) -> Gpu | None:
        """``NVIDIA GeForce RTX 4080 Laptop GPU`` (as nvidia-smi prints a laptop part) not listed: its desktop
        namesake's architecture and compute capability, which NVIDIA's CUDA GPU list gives laptop GeForce parts
        (https://developer.nvidia.com/cuda-gpus); memory and peaks unknown."""
        m = re.fullmatch(r"(.+?)\s+(?:laptop(?:\s+gpu)?|max-q)(?:\s+gpu)?", name.strip(), re.IGNORECASE)
        if not m:
            return None
        base = self._gpu_index.get(_norm(m.group(1))) or self._gpu_index.get(_strip_prefixes(m.group(1)))
        if base is None or base.segment not in ("consumer", "workstation"):
            return None
        return Gpu(
            id=f"{base.id}-laptop",
            name=name.strip(),
            arch=base.arch,
            compute_capability=base.compute_capability,
            segment=base.segment,
            family=base.family,
            memory_gb=None,
            memory_type=None,
            aliases=(),
            peaks=Peaks(),
            source="https://developer.nvidia.com/cuda-gpus",
            verified=base.verified,
        )

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
            return self._nightly_by_cuda(parsed, plat)
        rel = self.release(parsed.release)
        name = parsed.variant or self.pypi_default(rel, plat)[0]
        build = self.build(rel, rel.variant(name), plat)
        if parsed.prerelease:
            remark = (
                f"{parsed.prerelease} is a nightly or pre-release build, read as the {rel.version} release line: "
                f"nightlies move from day to day (kernels, CUDA, pins), so this verdict is the release's"
            )
            build = dataclasses.replace(
                build, prerelease=parsed.prerelease, remarks=(*build.remarks, ("prerelease_build", remark))
            )
        return build

    def _has_build(self, version: str, variant: str) -> bool:
        norm = V.normalise_release(version)
        return any(r.version == norm and any(v.name == variant for v in r.variants) for r in self.releases)

    def _nightly_by_cuda(self, parsed: V.TorchBuildText, plat: Platform) -> Build:
        """A nightly whose variant its release line does not list (nightly channels carried CUDA variants the
        release dropped, and run ahead of the knowledge base): judged by its CUDA version itself. Its kernels
        are unknown, so a GPU that CUDA cannot build for fails, and any other is a caveat to verify."""
        variant_name = parsed.variant or ""
        m = re.fullmatch(r"cu(\d+)(\d)", variant_name)
        if not m:
            raise InputError(
                f"torch {parsed.prerelease}+{variant_name}: only a CUDA nightly (+cuXYZ) can be judged without its "
                "release's data",
                hint="pass the CUDA variant, e.g. +cu128",
            )
        cuda = f"{int(m.group(1))}.{m.group(2)}"
        self.toolkit(cuda)  # a CUDA torchrig does not know cannot be judged: the error says which it knows
        norm = V.normalise_release(parsed.release)
        rel = next((r for r in self.releases if r.version == norm), None) or Release(
            norm, None, (), None, None, variant_name, ()
        )
        variant = Variant(
            name=variant_name,
            cuda=cuda,
            index_url=f"{PYTORCH_INDEX}/nightly/{variant_name}",
            arch_list=(),
            ptx=(),
            confirmed=False,
            source="https://download.pytorch.org/whl/nightly/",
        )
        remark = (
            f"{parsed.prerelease}+{variant_name} is a nightly whose kernels torchrig does not know: judged by CUDA "
            f"{cuda} itself (which GPUs it can build for); check torch.cuda.get_arch_list() after installing"
        )
        return Build(
            rel,
            variant,
            plat.id,
            arch_confirmed=False,
            prerelease=parsed.prerelease,
            remarks=(("prerelease_build", remark),),
        )

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
        arch_platform = plat.arch_platform
        arch_ok = arch_platform == DEFAULT_PLATFORM and plat.id != "windows"
        remarks: list[tuple[str, str]] = []
        if not variant.confirmed:
            remarks.append(
                (
                    "build_not_confirmed",
                    f"torch {release.version}+{variant.name} is not confirmed: reported, not read from its wheel "
                    f"or index ({variant.source})",
                )
            )
        if arch_platform != DEFAULT_PLATFORM and not variant.is_cpu:
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
                variant = dataclasses.replace(
                    variant, arch_list=row.arch_list, ptx=row.ptx, source=row.source, verified=row.verified
                )
                arch_ok = True
            else:
                remarks.append(
                    (
                        "arch_list_not_confirmed",
                        f"the kernels of torch {release.version}+{variant.name}'s {arch_platform} wheel are not "
                        f"confirmed: the Linux x86_64 wheel's arch list was used",
                    )
                )
        elif plat.id == "windows" and not variant.is_cpu:
            remarks.append(
                (
                    "arch_list_not_confirmed",
                    f"the kernels of torch {release.version}+{variant.name}'s Windows wheel are not confirmed: "
                    f"the Linux x86_64 wheel's arch list was used",
                )
            )
        if not pypi_ok and variant.name == pypi:
            remarks.append(
                (
                    "pypi_default_not_confirmed",
                    f"that PyPI serves {plat.label} the {pypi} build of torch {release.version} is not confirmed",
                )
            )
        return Build(release, variant, plat.id, pypi, pypi_ok, arch_ok, remarks=tuple(remarks))

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
        """The GPU's target when the ptxas of the release's Triton does not know it (torch.compile fails).

        A nightly or source build (``prerelease``) may carry a Triton without the separate Blackwell ptxas (the
        nightlies' pytorch-triton before it was added, a Triton built from source): it is judged by the ptxas
        for every target too, and the gap is not certain."""
        cc = gpu.compute_capability
        if V.parse_cc(cc) < (7, 0):  # Triton itself refuses these GPUs ("Triton only supports ... >= 7.0")
            return None
        triton = self.triton_of(release)
        if triton is None:
            return None
        ptxas, override = triton.ptxas_for(cc)
        certain = True
        if prerelease and self._knows(ptxas, cc):
            # a nightly carries the previous release line's Triton until its own pin lands (2.7.0.dev20250305
            # with pytorch-triton 3.2.0, 2.10.0.dev20251024 with 3.5.0), and a source build may lack the
            # separate Blackwell ptxas
            earlier = [
                r for r in self.releases if V.parse_release(r.version) < V.parse_release(release.version)
            ]
            previous = (
                self.triton_of(max(earlier, key=lambda r: V.parse_release(r.version))) if earlier else None
            )
            if previous is not None and not self._knows(previous.ptxas_for(cc)[0], cc):
                triton, (ptxas, override), certain = previous, previous.ptxas_for(cc), False
            elif ptxas != triton.ptxas and not self._knows(triton.ptxas, cc):
                ptxas, override, certain = triton.ptxas, "TRITON_PTXAS_PATH", False
        if ptxas is None or self._knows(ptxas, cc):
            return None
        first = next(
            (
                t.version
                for t in sorted(self.toolkits, key=lambda t: V.parse_cuda(t.version))
                if cc in t.compute_capabilities
            ),
            None,
        )
        if first is None:
            return None
        fixed = next(
            (
                r.version
                for r in sorted(self.releases, key=lambda r: V.parse_release(r.version))
                if V.parse_release(r.version) > V.parse_release(release.version)
                and (t := self.triton_of(r)) is not None
                and (p := t.ptxas_for(cc)[0]) is not None
                and self._knows(p, cc)
            ),
            None,
        )
        toolkit_ptxas = f"the ptxas of a CUDA {first} or newer toolkit"
        if override:
            workaround = f"{override}=/usr/local/cuda/bin/ptxas ({toolkit_ptxas})"
        else:
            workaround = (
                f"TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas ({toolkit_ptxas}); a Triton {triton.version} that "
                "ignores it for sm_100 and newer needs triton/backends/nvidia/bin/ptxas-blackwell replaced by that "
                "ptxas"
            )
        if fixed:
            workaround += f"; or torch {fixed} or newer, whose Triton's ptxas knows it"
        major, minor = cc.split(".")
        return PtxasGap(
            cc,
            f"sm_{major}{minor}{'a' if int(major) >= 9 else ''}",
            triton.version,
            ptxas,
            workaround,
            triton.source,
            triton.verified,
            certain,
        )

    def _knows(self, ptxas: str | None, cc: str) -> bool:
        if ptxas is None:
            return True  # not in the data: no claim
        try:
            return cc in self.toolkit(ptxas).compute_capabilities
        except InputError:
            return True

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


def _tuple(row: Mapping[str, Any], key: str) -> tuple[str, ...]:
    return tuple(str(x) for x in row.get(key, ()))


def _opt(row: Mapping[str, Any], key: str) -> Any:
    value = row.get(key)
    return None if value in (None, "") else value


def _row(kind: str, row: Mapping[str, Any], build: Any) -> Any:
    try:
        return build(row)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"knowledge base: bad {kind} row {dict(row).get('name') or dict(row)!r}: {err!r}"
        ) from err


def _gpu(row: Mapping[str, Any]) -> Gpu:
    peaks = row.get("peaks") or {}
    return Gpu(
        id=row["id"],
        name=row["name"],
        arch=row["arch"],
        compute_capability=row["compute_capability"],
        segment=row.get("segment", ""),
        family=row.get("family", row["arch"]),
        memory_gb=_opt(row, "memory_gb"),
        memory_type=_opt(row, "memory_type"),
        aliases=_tuple(row, "aliases"),
        peaks=Peaks(**{k: v for k, v in peaks.items() if k in Peaks.__dataclass_fields__}),
        source=row.get("source", ""),
        verified=str(row.get("verified", "")),
        host_platform=row.get("host_platform"),
    )


def _variant(row: Mapping[str, Any]) -> Variant:
    name = row["name"]
    return Variant(
        name=name,
        cuda=_opt(row, "cuda"),
        index_url=row.get("index_url", f"{PYTORCH_INDEX}/{name}"),
        arch_list=_tuple(row, "arch_list"),
        ptx=_tuple(row, "ptx"),
        cudnn=_opt(row, "cudnn"),
        nccl=_opt(row, "nccl"),
        source=row.get("source", ""),
        verified=str(row.get("verified", "")),
        confirmed=bool(row.get("confirmed", True)),
    )


def _release(row: Mapping[str, Any]) -> Release:
    return Release(
        version=row["version"],
        released=str(row["released"]) if row.get("released") else None,
        python=_tuple(row, "python"),
        torchvision=_opt(row, "torchvision"),
        torchaudio=_opt(row, "torchaudio"),
        pypi_variant=row["pypi_variant"],
        variants=tuple(_row("variant", v, _variant) for v in row.get("variant", ())),
        source=row.get("source", ""),
        verified=str(row.get("verified", "")),
    )


def _index_gpus(gpus: Iterable[Gpu]) -> dict[str, Gpu]:
    index: dict[str, Gpu] = {}
    for g in gpus:
        for spelling in (g.name, g.id, *g.aliases):
            for key in (_norm(spelling), _strip_prefixes(spelling)):
                index.setdefault(key, g)
    return index


def _sourced(r: Mapping[str, Any]) -> dict[str, str]:
    return {"source": r.get("source", ""), "verified": str(r.get("verified", ""))}


def _date(r: Mapping[str, Any]) -> str | None:
    return str(r["released"]) if r.get("released") else None


def _arch(r: Mapping[str, Any]) -> GpuArch:
    return GpuArch(
        name=r["name"],
        compute_capabilities=_tuple(r, "compute_capabilities"),
        last_driver_branch=_opt(r, "last_driver_branch"),
        min_driver_branch=_opt(r, "min_driver_branch"),
        **_sourced(r),
    )


def _toolkit(r: Mapping[str, Any]) -> Toolkit:
    return Toolkit(
        version=r["version"],
        min_driver=_opt(r, "min_driver"),
        min_driver_minor_compat=_opt(r, "min_driver_minor_compat"),
        compute_capabilities=_tuple(r, "compute_capabilities"),
        released=_date(r),
        **_sourced(r),
    )


def _library_floor(r: Mapping[str, Any]) -> LibraryFloor:
    return LibraryFloor(
        r["library"], r["versions"], r["min_compute_capability"], r.get("workaround", ""), **_sourced(r)
    )


def _branch(r: Mapping[str, Any]) -> Branch:
    return Branch(
        branch=str(r["branch"]),
        max_cuda=r["max_cuda"],
        first_release=_opt(r, "first_release"),
        released=_date(r),
        lts=bool(r.get("lts", False)),
        **_sourced(r),
    )


def _platform_rows(doc: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    def rows(key: str, make: Any) -> tuple[Any, ...]:
        return tuple(_row(key, r, make) for r in doc.get(key, ()))

    return {
        "platforms": rows(
            "platform",
            lambda r: PlatformInfo(r["id"], r["name"], r["wheel_tag"], r["driver_numbering"], **_sourced(r)),
        ),
        "pypi_defaults": rows(
            "pypi_default",
            lambda r: PypiDefault(
                r["platform"], r["releases"], r["variant"], bool(r.get("confirmed", True)), **_sourced(r)
            ),
        ),
        "arch_overrides": rows(
            "arch_list",
            lambda r: ArchOverride(
                r["platform"],
                r["releases"],
                r["variant"],
                _tuple(r, "arch_list"),
                _tuple(r, "ptx"),
                r.get("evidence", ""),
                **_sourced(r),
            ),
        ),
        "jetpacks": rows(
            "jetpack",
            lambda r: JetPack(
                str(r["version"]), str(r["l4t"]), r["max_cuda"], r["torch"], _opt(r, "driver"), **_sourced(r)
            ),
        ),
        "triton_pins": rows(
            "triton_pin", lambda r: TritonPin(str(r["torch"]), str(r["triton"]), **_sourced(r))
        ),
        "triton_ptxas": rows(
            "triton",
            lambda r: TritonPtxas(
                str(r["version"]),
                _opt(r, "ptxas"),
                _opt(r, "ptxas_blackwell"),
                _opt(r, "blackwell_override"),
                **_sourced(r),
            ),
        ),
    }


def build_kb(
    gpus: Mapping[str, Any],
    cuda: Mapping[str, Any],
    drivers: Mapping[str, Any],
    torch: Mapping[str, Any],
    platforms: Mapping[str, Any] | None = None,
) -> KnowledgeBase:
    """Build a KnowledgeBase from the parsed data files (tests pass small in-memory ones; platforms optional)."""
    platforms = platforms if platforms is not None else {"schema_version": 1}
    for name, doc in (
        ("gpus", gpus),
        ("cuda", cuda),
        ("drivers", drivers),
        ("torch", torch),
        ("platforms", platforms),
    ):
        if doc.get("schema_version") != 1:
            raise ValueError(
                f"knowledge base: {name}.toml has schema_version {doc.get('schema_version')!r}, expected 1"
            )
    gpu_rows = tuple(_row("gpu", r, _gpu) for r in gpus.get("gpu", ()))
    releases = sorted(
        (_row("release", r, _release) for r in torch.get("release", ())),
        key=lambda r: V.parse_release(r.version),
        reverse=True,
    )
    return KnowledgeBase(
        gpus=gpu_rows,
        archs=tuple(_row("arch", r, _arch) for r in gpus.get("arch", ())),
        toolkits=tuple(_row("toolkit", r, _toolkit) for r in cuda.get("toolkit", ())),
        branches=tuple(_row("branch", r, _branch) for r in drivers.get("branch", ())),
        releases=tuple(releases),
        _gpu_index=_index_gpus(gpu_rows),
        library_floors=tuple(_row("library_floor", r, _library_floor) for r in cuda.get("library_floor", ())),
        **_platform_rows(platforms),
    )


_KB_FILES = ("gpus", "cuda", "drivers", "torch", "platforms")


def _cache_dir() -> str:
    return os.environ.get("TORCHRIG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torchrig"
    )


def _sources() -> tuple[list[bytes], str]:
    """The data files' bytes, and a cache key: their checksums, this module's and the Python version."""
    here = os.path.abspath(__file__)
    data_dir = os.path.join(os.path.dirname(os.path.dirname(here)), "data")
    raws = []
    for name in _KB_FILES:
        with open(os.path.join(data_dir, f"{name}.toml"), "rb") as fh:
            raws.append(fh.read())
    code = b""
    for module in (here, *(os.path.join(os.path.dirname(here), m) for m in ("records.py", "platforms.py"))):
        with open(module, "rb") as fh:
            code += fh.read()
    key = "-".join(f"{zlib.crc32(r):08x}" for r in (*raws, code))
    return raws, f"kb-py{sys.version_info[0]}{sys.version_info[1]}-{key}.pickle"


def _load_docs() -> dict[str, Any]:
    """The four data files, parsed (tomllib)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    raws, _ = _sources()
    return {name: tomllib.loads(raw.decode("utf-8")) for name, raw in zip(_KB_FILES, raws, strict=True)}


@functools.lru_cache(maxsize=1)
def load_kb() -> KnowledgeBase:
    """The knowledge base from the package's data files (loaded once per process).

    Parsing the TOML (tomllib is pure Python) and building the records takes ~70 ms, a third of `torchrig check`'s
    budget, so the built knowledge base is cached with pickle under ~/.cache/torchrig (or $TORCHRIG_CACHE_DIR),
    keyed by the data files' and this module's checksums: any change to either rebuilds it.
    """
    import pickle

    _raws, name = _sources()
    cache = os.path.join(_cache_dir(), name)
    try:
        with open(cache, "rb") as fh:
            cached = pickle.load(fh)
        if isinstance(cached, KnowledgeBase):
            return cached
    except Exception:  # a missing, partial or stale cache only costs the parse
        pass
    docs = _load_docs()
    kb = build_kb(docs["gpus"], docs["cuda"], docs["drivers"], docs["torch"], docs["platforms"])
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = f"{cache}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(kb, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, cache)
    except OSError:
        pass
    return kb
