"""Builds whose CUDA comes from where they were installed, not from a ``+cuXYZ`` tag: NVIDIA's NGC PyTorch
containers and conda-forge (``data/wheel_sources.toml``'s ``[[container]]`` and ``[[conda_forge]]`` rows).

- ``--index ngc`` (or ``nvcr.io``), or inferred: a version whose local part ends in ``nvYY.MM``
  (``2.5.0a0+e000cf0ad9.nv24.10``) off a Jetson is the NGC container YY.MM (on a Jetson the same tag is NVIDIA's
  JetPack wheel, ``torchrig.compat.sources``). Judged by the container's CUDA (its driver floor, minor-version
  and data center forward compatibility as for any build) and, its kernels unlisted, by what that CUDA can
  build for. A container whose CUDA the data does not give is a caveat that says so, never a guess.
- ``--index conda-forge``: the versions and CUDA variants the feedstock built. ``2.5.1+cu126`` names the
  variant; a bare version is the newest variant the driver runs natively (conda's ``__cuda`` virtual package
  steers the solver to it), else the oldest.

>>> by_name("conda-forge")
'conda-forge'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchrig.compat import versions as V
from torchrig.compat.kb import Build, Gpu, KnowledgeBase, Release, Variant
from torchrig.compat.platforms import Platform
from torchrig.compat.reasons import Reason, Severity
from torchrig.errors import UsageError

if TYPE_CHECKING:
    from torchrig.compat.check import CheckResult

NGC_NAMES = ("ngc", "nvcr.io", "nvcr.io/nvidia/pytorch", "https://catalog.ngc.nvidia.com")
CONDA_NAMES = (
    "conda-forge",
    "conda",
    "https://conda.anaconda.org/conda-forge",
    "https://anaconda.org/conda-forge",
)
NGC_URL = "https://catalog.ngc.nvidia.com/orgs/nvidia/containers/pytorch"
CONDA_URL = "https://anaconda.org/conda-forge/pytorch"
_NV_TAG = re.compile(r"(?:[0-9a-f]+\.)?nv(\d{2})\.(\d{1,2})(?:\.\d+)?")
_CONDA_VARIANT = re.compile(r"cu(?:da)?(\d+)(\d)")


@dataclass(frozen=True)
class Container:
    release: str  # "24.10"
    torch: str  # "2.5.0a0+e000cf0ad9"
    cuda: str | None  # None: the cited page does not say
    source: str
    verified: str
    cuda_source: str | None = None  # the page giving the CUDA, when it is not `source`


@dataclass(frozen=True)
class CondaForge:
    version: str
    cuda_by_platform: dict[str, tuple[str, ...]]  # "linux-x86_64" -> ("12.6",)
    source: str
    verified: str
    arch_by_platform: dict[str, dict[str, str]] = field(
        default_factory=dict
    )  # -> {"12.6": "5.0;...;9.0+PTX"}
    arch_source: str | None = None

    def kernels(self, platform: str, cuda: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(cubins, PTX) of the ``cuda`` build on ``platform`` from its TORCH_CUDA_ARCH_LIST; None: not known."""
        text = self.arch_by_platform.get(platform, {}).get(cuda)
        if not text:
            return None
        cubins, ptx = [], []
        for entry in text.split(";"):
            cc, _, plus = entry.partition("+")
            sm = cc.replace(".", "")
            cubins.append(f"sm_{sm}")
            if plus == "PTX":
                ptx.append(f"compute_{sm}")
        return tuple(cubins), tuple(ptx)


@functools.lru_cache(maxsize=1)
def load_containers() -> tuple[Container, ...]:
    from torchrig import data

    return tuple(
        Container(
            r["release"], r["torch"], r.get("cuda"), r["source"], str(r["verified"]), r.get("cuda_source")
        )
        for r in data.load("wheel_sources").get("container", [])
    )


@functools.lru_cache(maxsize=1)
def load_conda_forge() -> tuple[CondaForge, ...]:
    from torchrig import data

    return tuple(_conda_row(r) for r in data.load("wheel_sources").get("conda_forge", []))


def _conda_row(r: dict[str, Any]) -> CondaForge:
    cudas = {"linux-x86_64": tuple(r["linux_x86_64"]), "linux-aarch64": tuple(r["linux_aarch64"])}
    arch = {
        "linux-x86_64": dict(r.get("arch_linux_x86_64", {})),
        "linux-aarch64": dict(r.get("arch_linux_aarch64", {})),
    }
    return CondaForge(r["version"], cudas, r["source"], str(r["verified"]), arch, r.get("arch_source"))


def by_name(index: str) -> str | None:
    """``"ngc"`` or ``"conda-forge"`` when ``--index`` names one of them (a name or a URL), else None."""
    low = index.strip().rstrip("/").lower()
    if any(low == n or (n.startswith("https://") and low.startswith(n)) for n in NGC_NAMES):
        return "ngc"
    if low.startswith("nvcr.io/"):
        return "ngc"
    if any(low == n or (n.startswith("https://") and low.startswith(n)) for n in CONDA_NAMES):
        return "conda-forge"
    return None


@dataclass(frozen=True)
class ChannelBuild:
    """A build from NGC or conda-forge, and how that was known."""

    channel: str  # "ngc" | "conda-forge"
    text: str  # as given
    release: str  # the release line, 2.5.0
    how: str
    container: Container | None = None
    container_tag: str | None = None  # "24.10" from the version's nvYY.MM, known or not
    conda: CondaForge | None = None
    conda_cuda: str | None = None  # the variant named (+cu126), None: chosen by the driver


def _parse(text: str) -> tuple[str, str | None]:
    """The release line and the local part (lower case) of a version as torch prints it."""
    t = text.strip().removeprefix("torch==").strip()
    v = V.pep440_torch(t, "2.5.0a0+e000cf0ad9.nv24.10 (NGC) or 2.5.1 / 2.5.1+cu126 (conda-forge)", "2.5.1")
    return V.normalise_release(v.base_version), v.local


def _container_tag(local: str | None) -> str | None:
    m = _NV_TAG.search(local or "")
    return f"{m.group(1)}.{int(m.group(2)):02d}" if m else None


def infer(text: str, index: str | None, gpus: Sequence[Gpu], platform: Platform) -> ChannelBuild | None:
    """The NGC or conda-forge build ``text`` names (``--index``, or an ``nvYY.MM`` tag off a Jetson), else None."""
    from torchrig.compat.evaluate import platform_for

    chosen = by_name(index) if index is not None else None
    if index is not None and chosen is None:
        return None
    if chosen is None and platform_for(gpus, platform)[0].id == "jetson":
        return None  # on a Jetson the nvYY.MM tag is NVIDIA's JetPack wheel (sources.py)
    release, local = _parse(text)
    if chosen == "conda-forge":
        return _conda(text, release, local)
    tag = _container_tag(local)
    if chosen is None and tag is None:
        return None
    how = f"--index {index}" if index is not None else f"inferred from its nv{tag} tag off a Jetson"
    container = _container_for(tag, text, release)
    return ChannelBuild(
        "ngc", text, release, how, container, tag or (container.release if container else None)
    )


def _container_for(tag: str | None, text: str, release: str) -> Container | None:
    rows = load_containers()
    if tag is not None:
        return next((c for c in rows if c.release == tag), None)
    # --index ngc without a tag: the version string itself, when exactly one container has it (25.05 and 25.06
    # both give 2.8.0a0+5228986c39: then which one is not known)
    t = text.strip().removeprefix("torch==")
    exact = [c for c in rows if t.startswith(c.torch)]
    return exact[0] if len(exact) == 1 else None


def _conda(text: str, release: str, local: str | None) -> ChannelBuild:
    row = next((r for r in load_conda_forge() if r.version == release), None)
    cuda = None
    if local:
        m = _CONDA_VARIANT.fullmatch(local)
        if not m:
            raise UsageError(
                f"malformed conda-forge build {text.strip()!r}: {local!r} is not a CUDA variant",
                hint="expected VERSION or VERSION+cuXYZ, e.g. 2.5.1+cu126",
            )
        cuda = f"{int(m.group(1))}.{m.group(2)}"
    return ChannelBuild("conda-forge", text, release, "--index conda-forge", conda=row, conda_cuda=cuda)


def _release(kb: KnowledgeBase, version: str, name: str) -> Release:
    return next((r for r in kb.releases if r.version == version), None) or Release(
        version, None, (), None, None, name, ()
    )


def _build(kb: KnowledgeBase, cb: ChannelBuild, cuda: str | None, plat: Platform) -> Build:
    name = (
        f"ngc{cb.container_tag or ''}"
        if cb.channel == "ngc"
        else f"conda-forge-cu{(cuda or '').replace('.', '')}"
    )
    kernels = cb.conda.kernels(plat.id, cuda) if cb.conda and cuda else None
    variant = Variant(
        name=name,
        cuda=cuda,
        index_url=NGC_URL if cb.channel == "ngc" else CONDA_URL,
        arch_list=kernels[0] if kernels else (),
        ptx=kernels[1] if kernels else (),
        confirmed=kernels is not None,
        source=(cb.container.source if cb.container else cb.conda.source if cb.conda else ""),
    )
    build = Build(_release(kb, cb.release, name), variant, plat.id, arch_confirmed=kernels is not None)
    return build


def _conda_cuda(kb: KnowledgeBase, cb: ChannelBuild, driver: str | None, plat: Platform) -> tuple[str, str]:
    """The conda-forge variant to judge and why."""
    listed = cb.conda.cuda_by_platform.get(plat.id, ()) if cb.conda else ()
    if cb.conda_cuda:
        return cb.conda_cuda, "the variant given"
    if not listed:
        raise UsageError(
            f"conda-forge's CUDA builds of torch {cb.release} on {plat.label} are not in torchrig's data",
            hint="name the variant, e.g. --torch 2.5.1+cu126 (conda list pytorch shows cudaXYZ in the build)",
        )
    if driver is not None:
        from torchrig.compat.rules import DriverSupportKind, driver_cuda_support

        native = [c for c in listed if driver_cuda_support(kb, driver, c).kind is DriverSupportKind.NATIVE]
        if native:
            return native[-1], f"the newest variant driver {driver} runs natively: conda's __cuda picks it"
    why = "no --driver given" if driver is None else f"driver {driver} runs none of them natively"
    return listed[0], f"the oldest variant conda-forge built: {why}"


def check_channel(
    kb: KnowledgeBase, cb: ChannelBuild, gpus: Sequence[Gpu], driver: str | None, platform: Platform
) -> CheckResult:
    """``check``'s answer for an NGC container's or conda-forge's build."""
    from torchrig.compat.check import CheckResult
    from torchrig.compat.evaluate import evaluate, platform_for
    from torchrig.compat.reasons import verdict_of

    plat, switched = platform_for(gpus, platform)
    notes = [switched] if switched else []
    if not cb.how.startswith("--index"):
        notes.append(f"source {cb.how}; pass --index to say otherwise")
    if cb.channel == "ngc":
        cuda = cb.container.cuda if cb.container else None
        head = _ngc_head(cb)
    elif plat.id == "jetson":
        cuda = cb.conda_cuda
        head = [Reason("wheel_source", Severity.INFO, f"torch {cb.text} from conda-forge ({cb.how})")]
    else:
        cuda, why = _conda_cuda(kb, cb, driver, plat)
        head = _conda_head(cb, cuda, why, plat)
    build = _build(kb, cb, cuda, plat)
    if cuda is None or plat.id == "jetson":
        reasons = [*head, _unknown_cuda(cb) if plat.id != "jetson" else _not_for_jetson(cb)]
        return CheckResult(
            verdict_of(reasons), reasons, [], build, list(gpus), driver, None, notes, plat.label
        )
    kb.toolkit(cuda)  # a CUDA torchrig does not know cannot be judged: the error names those it knows
    reasons, driver_kind = evaluate(kb, gpus, driver, build, plat)
    reasons = [*head, *reasons]
    if not driver:
        notes.append("no --driver given: only the GPU architecture was checked")
    return CheckResult(
        verdict_of(reasons), reasons, [], build, list(gpus), driver, driver_kind, notes, plat.label
    )


def _ngc_head(cb: ChannelBuild) -> list[Reason]:
    c = cb.container
    if c is None:
        return [
            Reason(
                "wheel_source", Severity.INFO, f"torch {cb.text}: NVIDIA's NGC PyTorch container ({cb.how})"
            )
        ]
    cuda = f", CUDA {c.cuda}" if c.cuda else ""
    if c.cuda and c.cuda_source:
        cuda += f" per {c.cuda_source}"
    reasons = [
        Reason(
            "wheel_source",
            Severity.INFO,
            f"torch {cb.text}: NGC container nvcr.io/nvidia/pytorch:{c.release}-py3 (torch {c.torch}{cuda}; "
            f"{c.source}): {cb.how}",
        )
    ]
    if not cb.text.strip().removeprefix("torch==").startswith(c.torch):
        reasons.append(
            Reason(
                "source_version_not_confirmed",
                Severity.CAVEAT,
                f"container {c.release}'s release notes give torch {c.torch}, not {cb.text}",
            )
        )
    return reasons


def _unknown_cuda(cb: ChannelBuild) -> Reason:
    which = f"NGC container {cb.container_tag}" if cb.container_tag else "this NGC container"
    return Reason(
        "channel_cuda_unknown",
        Severity.CAVEAT,
        f"torchrig's data does not give the CUDA of {which}, so the driver and the GPUs' kernels are not "
        "judged: inside it, python -c 'import torch; print(torch.version.cuda, torch.cuda.get_arch_list())' "
        "says both; its release notes give the driver it needs",
    )


def _not_for_jetson(cb: ChannelBuild) -> Reason:
    return Reason(
        "channel_platform_unknown",
        Severity.CAVEAT,
        f"torchrig's data has no {'NGC container' if cb.channel == 'ngc' else 'conda-forge build'} for Jetson "
        "modules, so this one is not judged there: NVIDIA's JetPack wheels are what it knows on a Jetson "
        "(check --index nvidia-jetpack6 or jetson-ai-lab-jp6)",
    )


def _conda_head(cb: ChannelBuild, cuda: str, why: str, plat: Platform) -> list[Reason]:
    row = cb.conda
    reasons = [
        Reason(
            "wheel_source",
            Severity.INFO,
            f"torch {cb.release} from conda-forge, its CUDA {cuda} build ({why})"
            + (f"; {row.source}" if row else ""),
        )
    ]
    listed = row.cuda_by_platform.get(plat.id, ()) if row else ()
    if row is None or cuda not in listed:
        said = f"built CUDA {', '.join(listed)} for {plat.label}" if listed else "is not in torchrig's data"
        reasons.append(
            Reason(
                "source_version_not_confirmed",
                Severity.CAVEAT,
                f"conda-forge's torch {cb.release} {said}: a CUDA {cuda} build is not confirmed",
            )
        )
    return reasons
