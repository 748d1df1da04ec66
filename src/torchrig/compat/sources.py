"""Where a wheel comes from, when it is not PyPI's or download.pytorch.org's: NVIDIA's JetPack wheels and the
Jetson AI Lab indexes (``data/wheel_sources.toml``). ``check`` takes the source (``--index URL`` or a name) and
infers it where the version string or the platform makes it certain:

- a local part ``nvYY.MM`` (``2.0.0+nv23.05``, ``2.1.0a0+41361538.nv23.06``) on a Jetson: NVIDIA's JetPack wheel;
- a bare version on a Jetson with JetPack 6: the Jetson AI Lab index (download.pytorch.org has no wheel for
  the Jetson's integrated GPU before JetPack 7, and PyPI's aarch64 wheel is not what Jetson users run).

A pure module: the data comes in through ``load_sources``; the judgement is a function of records.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchrig.compat.kb import Build, Gpu, KnowledgeBase, Release, Variant
from torchrig.compat.platforms import JetPack, Platform
from torchrig.compat.reasons import Reason, Severity
from torchrig.errors import UsageError

if TYPE_CHECKING:
    from torchrig.compat.check import CheckResult

NAMES_OF_STANDARD = ("pypi", "pytorch", "download.pytorch.org")


@dataclass(frozen=True)
class WheelSource:
    id: str
    name: str
    family: str
    index_urls: tuple[str, ...]
    platform: str
    jetpack: str | None
    cuda: str | None
    compute_capabilities: tuple[str, ...]
    versions: tuple[str, ...]
    local_pattern: str | None = None
    caveat: str | None = None
    source: str = ""
    verified: str = ""

    @property
    def index_url(self) -> str:
        return self.index_urls[0]


@functools.lru_cache(maxsize=1)
def load_sources() -> tuple[WheelSource, ...]:
    """``data/wheel_sources.toml`` as records (read once per process)."""
    from torchrig import data

    return tuple(_source(row) for row in data.load("wheel_sources")["source"])


def _source(row: dict[str, Any]) -> WheelSource:
    return WheelSource(
        id=row["id"],
        name=row["name"],
        family=row["family"],
        index_urls=tuple(row["index_urls"]),
        platform=row["platform"],
        jetpack=row.get("jetpack"),
        cuda=row.get("cuda"),
        compute_capabilities=tuple(row["compute_capabilities"]),
        versions=tuple(row["versions"]),
        local_pattern=row.get("local_pattern"),
        caveat=row.get("caveat"),
        source=row["source"],
        verified=str(row["verified"]),
    )


@dataclass(frozen=True)
class SourcedBuild:
    """A version from a non-standard source: the source, the release line, and how the source was known."""

    source: WheelSource
    version: str  # the release line, 2.1.0
    text: str  # as given, 2.1.0a0+41361538.nv23.06
    how: str  # "--index ..." or the inference, in words


def _split(text: str) -> tuple[str, str | None]:
    from packaging.version import InvalidVersion, Version

    t = text.strip().removeprefix("torch==")
    try:
        v = Version(t)
    except InvalidVersion:
        raise UsageError(
            f"malformed torch version {t!r}", hint="expected e.g. 2.5.0 or 2.0.0+nv23.05"
        ) from None
    return ".".join(str(p) for p in (*v.release, 0, 0)[:3]), v.local


def by_index(index: str) -> WheelSource | None:
    """``--index``: a source's id or family, or a URL one of its index URLs starts; None for PyPI and
    download.pytorch.org (the standard builds)."""
    low = index.strip().rstrip("/").lower()
    if not low:
        raise UsageError("empty --index", hint="give an index URL or a name such as pypi, ngc or conda-forge")
    # a URL names the source whose index URL it starts, or (a shorter path) begins: at least a host and a path,
    # so that "h" or "https://" names nothing
    partial = "://" in low and low.split("://", 1)[1].count("/") >= 1
    if low in NAMES_OF_STANDARD or low.startswith(("https://pypi.org", "https://download.pytorch.org")):
        return None
    for s in load_sources():
        if low == s.id or any(
            low.startswith(u.lower()) or (partial and u.lower().startswith(low)) for u in s.index_urls
        ):
            return s
    known = ", ".join(["pypi", "pytorch", *(s.id for s in load_sources()), "ngc", "conda-forge"])
    raise UsageError(f"unknown --index {index!r}", hint=f"give an index URL or one of: {known}")


def infer(
    kb: KnowledgeBase,
    text: str,
    index: str | None,
    gpus: Sequence[Gpu],
    driver: str | None,
    platform: Platform,
) -> SourcedBuild | None:
    """The non-standard source of ``text`` (``--index``, or inferred where certain), None: a standard build."""
    from torchrig.compat.evaluate import jetpack_for, platform_for

    plat, _ = platform_for(gpus, platform)
    jetpack = jetpack_for(kb, gpus, driver, plat) if plat.id == "jetson" else None
    if index is not None:
        chosen = by_index(index)
        if chosen is None:
            return None
        version, _local = _split(text)
        return SourcedBuild(chosen, version, text, f"--index {index}")
    if plat.id != "jetson":
        return None
    version, local = _split(text)
    suffixed = [
        s for s in load_sources() if s.local_pattern and local and re.fullmatch(s.local_pattern, local)
    ]
    if suffixed:
        pick = next((s for s in suffixed if version in s.versions), suffixed[0])
        return SourcedBuild(
            pick, version, text, f"inferred from its nvYY.MM suffix ({pick.name}, JetPack {pick.jetpack})"
        )
    if local is None and jetpack is not None and jetpack.version == "6":
        lab = next(s for s in load_sources() if s.id == "jetson-ai-lab-jp6")
        return SourcedBuild(
            lab,
            version,
            text,
            "inferred: a bare version on a JetPack 6 Jetson comes from the Jetson AI Lab index",
        )
    return None


def judge(
    kb: KnowledgeBase, sb: SourcedBuild, gpus: Sequence[Gpu], driver: str | None, platform: Platform
) -> tuple[Build, list[Reason], Platform]:
    """The reasons for a sourced build: the JetPack it was built for, the GPUs' kernels, the versions known."""
    from torchrig.compat.evaluate import jetpack_for, platform_for

    s = sb.source
    plat, _ = platform_for(gpus, platform)
    jetpack = jetpack_for(kb, gpus, driver, plat) if plat.id == "jetson" else None
    if plat.id == "jetson" and not plat.jetpack and jetpack is not None:
        plat = Platform("jetson", jetpack.version)
    reasons = [
        Reason("wheel_source", Severity.INFO, f"torch {sb.text} from {s.name} ({s.index_url}): {sb.how}"),
        *_platform_reasons(s, plat, jetpack),
        *_gpu_reasons(s, gpus),
    ]
    if sb.version not in s.versions:
        reasons.append(
            Reason(
                "source_version_not_confirmed",
                Severity.CAVEAT,
                f"torch {sb.version} from {s.name} is not confirmed: the cited page lists {', '.join(s.versions)} "
                f"({s.source})",
            )
        )
    if s.caveat:
        reasons.append(Reason("wheel_source_caveat", Severity.CAVEAT, s.caveat))
    return _build(kb, sb, plat), reasons, plat


def _platform_reasons(s: WheelSource, plat: Platform, jetpack: JetPack | None) -> list[Reason]:
    """Whether the source serves this platform and JetPack."""
    reasons: list[Reason] = []
    if s.platform != plat.id:
        reasons.append(
            Reason(
                "wheel_source_platform",
                Severity.FAIL,
                f"{s.name} serves {s.platform} only, not {plat.label}",
            )
        )
    elif s.jetpack and jetpack is not None and jetpack.version != s.jetpack:
        reasons.append(
            Reason(
                "wheel_source_jetpack",
                Severity.FAIL,
                f"{s.name} is built for JetPack {s.jetpack}, this is JetPack {jetpack.version} "
                f"(CUDA {jetpack.max_cuda}): its CUDA libraries do not match",
            )
        )
    elif s.jetpack and jetpack is None:
        reasons.append(
            Reason(
                "jetpack_unknown",
                Severity.CAVEAT,
                f"{s.name} needs JetPack {s.jetpack}: pass --platform jetson{s.jetpack} or --driver to check it",
            )
        )
    return reasons


def _gpu_reasons(s: WheelSource, gpus: Sequence[Gpu]) -> list[Reason]:
    """Whether the source's kernels cover each GPU."""
    reasons: list[Reason] = []
    for gpu in gpus:
        if gpu.compute_capability in s.compute_capabilities:
            reasons.append(
                Reason(
                    "arch_native_cubin",
                    Severity.INFO,
                    f"{gpu.name} ({gpu.sm}) is a target of {s.name}",
                    gpu.name,
                )
            )
        else:
            reasons.append(
                Reason(
                    "arch_not_in_source",
                    Severity.FAIL,
                    f"{s.name} carries kernels for compute capability {', '.join(s.compute_capabilities)}, "
                    f"not {gpu.name}'s {gpu.compute_capability}",
                    gpu.name,
                )
            )
    return reasons


def _build(kb: KnowledgeBase, sb: SourcedBuild, plat: Platform) -> Build:
    s = sb.source
    try:
        release = kb.release(sb.version)
    except UsageError:
        release = Release(sb.version, None, (), None, None, s.id, ())
    variant = Variant(
        name=s.id,
        cuda=s.cuda,
        index_url=s.index_url,
        arch_list=tuple("sm_" + cc.replace(".", "") for cc in s.compute_capabilities),
        ptx=(),
        source=s.source,
        verified=s.verified,
    )
    return Build(release, variant, plat.id, pypi_variant=None)


def check_sourced(
    kb: KnowledgeBase, sourced: SourcedBuild, gpus: Sequence[Gpu], driver: str | None, platform: Platform
) -> CheckResult:
    """``check``'s answer for a build from NVIDIA's JetPack wheels or a Jetson AI Lab index."""
    from torchrig.compat.check import CheckResult
    from torchrig.compat.reasons import verdict_of

    build, reasons, judged = judge(kb, sourced, gpus, driver, platform)
    notes = (
        []
        if sourced.how.startswith("--index")
        else [f"wheel source {sourced.how}; pass --index to say otherwise"]
    )
    return CheckResult(verdict_of(reasons), reasons, [], build, list(gpus), driver, None, notes, judged.label)
