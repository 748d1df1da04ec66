"""From a spec to pinned versions: the PyTorch build (via the compatibility engine), its CUDA stack, the
base image and the tag. Pure functions of the spec, the knowledge base and the build options.

The resolved record is what the Dockerfile is rendered from and what the image's labels record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchrig.errors import InputError, SpecError
from torchrig.image.spec import AUTO, ImageSpec

if TYPE_CHECKING:
    from torchrig.compat.kb import Build, KnowledgeBase

_WHEEL_RE = re.compile(r"torch-(\d+\.\d+\.\d+)(?:\+([a-z0-9.]+))?-cp(\d)(\d+)-")


@dataclass(frozen=True)
class ResolvedStack:
    """The PyTorch build and what comes with it; ``None`` is unknown (never guessed)."""

    torch: str  # "2.8.0"
    variant: str  # "cu128" | "cpu"
    python: str  # "3.11"
    cuda: str | None = None
    arch_list: tuple[str, ...] = ()
    ptx: tuple[str, ...] = ()
    cudnn: str | None = None
    nccl: str | None = None
    min_driver: str | None = None  # the native floor of the build's CUDA
    min_driver_minor_compat: str | None = None  # the floor under CUDA minor-version compatibility
    index_url: str | None = None  # None: PyPI serves this build
    pypi_default: bool = False  # PyPI's wheel carries no local version label (torch==2.8.0, not +cu128)
    source: str = "knowledge base"  # or "wheelhouse" when the build came from a wheel the KB does not list

    @property
    def label(self) -> str:
        return f"{self.torch}+{self.variant}"

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch}" if self.pypi_default else f"torch=={self.label}"

    @property
    def is_cpu(self) -> bool:
        return self.variant == "cpu"


@dataclass(frozen=True)
class BaseChoice:
    image: str
    python_from: str  # "base" | "os" | "auto" (a --base of unknown make: use its pythonX.Y, else the OS's)
    source: str


@dataclass(frozen=True)
class LockPins:
    """What an earlier build recorded (``torchrig.lock.json``), to build the same again (``--locked``)."""

    pip: tuple[str, ...]  # "name==version" lines: a constraint file for every pip install
    apt: tuple[tuple[str, str], ...]  # (package, version) of the installed Debian/Ubuntu packages
    base: str | None = None  # "repo@sha256:..." when the base came from a registry


@dataclass(frozen=True)
class ImagePlan:
    """Everything the Dockerfile and the build context are rendered from."""

    spec: ImageSpec
    stack: ResolvedStack
    base: BaseChoice
    jupyterlab: str  # pinned version
    wheelhouse: bool = False  # install from the context's wheelhouse/ with --no-index
    ca_cert: bool = False  # trust the context's build-ca.crt during the build
    pip_index_url: str | None = None  # overrides PyPI for everything but a torch from the PyTorch index
    # torchrig's own run-time requirements (installed with the extras)
    torchrig_requires: tuple[str, ...] = ()
    # --locked: the pip/apt versions and the base digest an earlier build recorded
    locked: LockPins | None = None

    @property
    def repository(self) -> str:
        return self.spec.name

    @property
    def stack_tag(self) -> str:
        """``torchrig/pytorch:2.8.0-cu128-py3.11-runtime``: the tag named after the resolved stack."""
        s = self.stack
        return f"{self.repository}:{s.torch}-{s.variant}-py{s.python}-{self.spec.variant}"


def content_tag(plan: ImagePlan, context_digest: str) -> str:
    """The stack tag plus a short digest of the build context: the same inputs give the same tag."""
    return f"{plan.stack_tag}-{context_digest[:10]}"


# ---------------------------------------------------------------- the torch build


def _stack_from_build(build: Build, kb: KnowledgeBase, python: str) -> ResolvedStack:
    v = build.variant
    toolkit = kb.toolkit(v.cuda) if v.cuda else None
    index = None if build.is_pypi_default else v.index_url
    return ResolvedStack(
        torch=build.release.version,
        variant=v.name,
        python=python,
        cuda=v.cuda,
        arch_list=tuple(v.arch_list),
        ptx=tuple(v.ptx),
        cudnn=v.cudnn,
        nccl=v.nccl,
        min_driver=toolkit.min_driver if toolkit else None,
        min_driver_minor_compat=toolkit.min_driver_minor_compat if toolkit else None,
        index_url=index,
        pypi_default=build.is_pypi_default,
    )


def _check_python(spec: ImageSpec, build: Build) -> None:
    if spec.python not in build.release.python:
        raise SpecError(
            f"{spec.path}: [python] version = {spec.python!r}: allowed for torch {build.release.version}: "
            f"{', '.join(build.release.python)}"
        )


def _pick_build(spec: ImageSpec, kb: KnowledgeBase) -> Build:
    from torchrig.compat.kb import Build
    from torchrig.compat.resolve import resolve

    t = spec.torch
    if t.version != AUTO and t.variant != AUTO:
        return kb.find_build(f"{t.version}+{t.variant}")
    if t.variant != AUTO:  # newest release with this variant for this Python
        for rel in kb.releases:
            if spec.python in rel.python and any(v.name == t.variant for v in rel.variants):
                return Build(rel, rel.variant(t.variant))
        raise SpecError(
            f"{spec.path}: [torch] variant = {t.variant!r}: no release for Python {spec.python} has it"
        )
    gpus = [kb.find_gpu(g) for g in t.gpus]
    torch_spec = None if t.version == AUTO else f"=={t.version}"
    return resolve(kb, gpus, driver=t.min_driver, torch_spec=torch_spec, python=spec.python).build


def stack_from_wheelhouse(spec: ImageSpec, wheelhouse: Path) -> ResolvedStack | None:
    """The torch build a wheelhouse holds for the spec's Python (for builds newer than the knowledge base)."""
    tag = spec.python.replace(".", "")
    for wheel in sorted(wheelhouse.glob("torch-*.whl")):
        m = _WHEEL_RE.match(wheel.name)
        if not m or f"{m.group(3)}{m.group(4)}" != tag:
            continue
        version, local = m.group(1), m.group(2) or ""
        variant = local or (spec.torch.variant if spec.torch.variant != AUTO else "")
        if spec.torch.version not in (AUTO, version) or (spec.torch.variant not in (AUTO, variant)):
            continue
        if variant == "cpu":
            return ResolvedStack(torch=version, variant="cpu", python=spec.python, source="wheelhouse")
        if variant:
            return ResolvedStack(
                torch=version,
                variant=variant,
                python=spec.python,
                pypi_default=not local,
                source="wheelhouse",
            )
    return None


def resolve_stack(spec: ImageSpec, kb: KnowledgeBase | None, wheelhouse: Path | None = None) -> ResolvedStack:
    """The pinned stack for ``spec``; with a wheelhouse, a torch wheel the knowledge base does not know yet
    is accepted (its cuDNN/NCCL/arch facts are then recorded as unknown)."""
    try:
        if kb is None:
            raise InputError("torchrig's knowledge base is not available", hint="reinstall torchrig")
        build = _pick_build(spec, kb)
    except InputError:
        found = stack_from_wheelhouse(spec, wheelhouse) if wheelhouse else None
        if found is None:
            raise
        return found
    _check_python(spec, build)
    return _stack_from_build(build, kb, spec.python)


# ---------------------------------------------------------------- the base image


def choose_base(
    spec: ImageSpec, stack: ResolvedStack, rows: list[dict[str, Any]], override: str | None
) -> BaseChoice:
    """The pinned base for the spec's variant and Python (devel: also the CUDA minor), or the override."""
    if override or spec.base:
        image = override or spec.base or ""
        return BaseChoice(
            image=image, python_from="auto", source="--base" if override else f"{spec.path} [image] base"
        )
    want_cuda = None if spec.variant == "runtime" else stack.cuda
    if spec.variant == "devel" and stack.is_cpu:
        want_cuda = None
    for row in rows:
        if (
            row["variant"] == ("devel" if want_cuda else "runtime")
            and row.get("cuda") == want_cuda
            and row["python"] == spec.python
        ):
            return BaseChoice(image=row["image"], python_from=row["python_from"], source=row["source"])
    if spec.variant == "devel" and want_cuda:
        pythons = sorted({r["python"] for r in rows if r.get("cuda") == want_cuda})
        if pythons:
            raise SpecError(
                f"{spec.path}: [python] version = {spec.python!r}: the CUDA {want_cuda} devel base has "
                f"Python {', '.join(pythons)}",
                hint="set that version, or pass --base IMAGE",
            )
        cudas = sorted({r["cuda"] for r in rows if r.get("cuda")})
        raise SpecError(
            f"{spec.path}: no pinned CUDA {want_cuda} devel base (torchrig has {', '.join(cudas)})",
            hint="pass --base nvidia/cuda:<version>-devel-<os> or set [image] base",
        )
    pythons = sorted({r["python"] for r in rows if r["variant"] == "runtime"})
    raise SpecError(
        f"{spec.path}: [python] version = {spec.python!r}: allowed: {', '.join(pythons)}",
        hint="or pass --base IMAGE with that Python",
    )


def load_bases() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows of ``data/bases.toml`` and the pinned component versions."""
    from torchrig import data

    doc = data.load("bases")
    return list(doc["base"]), {c["name"]: c["version"] for c in doc.get("component", [])}
