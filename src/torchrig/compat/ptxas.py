"""Triton's bundled ptxas against a GPU's target: the caveat ``torch.compile`` meets when the ptxas inside the
Triton a torch release pins does not know the GPU (facts: ``[[triton_pin]]`` and ``[[triton]]`` in
``data/platforms.toml``, the targets each CUDA toolkit knows in ``data/cuda.toml``)."""

from __future__ import annotations

from typing import Protocol

from torchrig.compat import versions as V
from torchrig.compat.platforms import PtxasGap, TritonPtxas
from torchrig.compat.records import Gpu, Release, Toolkit
from torchrig.errors import InputError


class KnowledgeBase(Protocol):
    """What the rule reads of :class:`torchrig.compat.kb.KnowledgeBase` (which calls it: no import back)."""

    @property
    def releases(self) -> tuple[Release, ...]: ...

    @property
    def toolkits(self) -> tuple[Toolkit, ...]: ...

    def toolkit(self, version: str) -> Toolkit: ...

    def triton_of(self, release: Release) -> TritonPtxas | None: ...


def knows(kb: KnowledgeBase, ptxas: str | None, cc: str) -> bool:
    """Whether the ptxas of CUDA ``ptxas`` compiles for compute capability ``cc`` (True: no claim)."""
    if ptxas is None:
        return True  # not in the data: no claim
    try:
        return cc in kb.toolkit(ptxas).compute_capabilities
    except InputError:
        return True


def _bundled(
    kb: KnowledgeBase, cc: str, release: Release, prerelease: bool
) -> tuple[TritonPtxas, str | None, str | None, bool] | None:
    """The Triton the release runs, the ptxas it uses for ``cc``, the variable that overrides that ptxas,
    and whether that is certain. A nightly or source build may carry the previous release line's Triton
    (2.7.0.dev20250305 with pytorch-triton 3.2.0, 2.10.0.dev20251024 with 3.5.0) or one without the separate
    Blackwell ptxas: it is judged by those too, and the gap is then not certain."""
    triton = kb.triton_of(release)
    if triton is None:
        return None
    ptxas, override = triton.ptxas_for(cc)
    if not (prerelease and knows(kb, ptxas, cc)):
        return triton, ptxas, override, True
    earlier = [r for r in kb.releases if V.parse_release(r.version) < V.parse_release(release.version)]
    previous = kb.triton_of(max(earlier, key=lambda r: V.parse_release(r.version))) if earlier else None
    if previous is not None and not knows(kb, previous.ptxas_for(cc)[0], cc):
        return (previous, *previous.ptxas_for(cc), False)
    if ptxas != triton.ptxas and not knows(kb, triton.ptxas, cc):
        return triton, triton.ptxas, "TRITON_PTXAS_PATH", False
    return triton, ptxas, override, True


def _first_toolkit(kb: KnowledgeBase, cc: str) -> str | None:
    """The oldest CUDA toolkit whose ptxas knows ``cc``."""
    return next(
        (
            t.version
            for t in sorted(kb.toolkits, key=lambda t: V.parse_cuda(t.version))
            if cc in t.compute_capabilities
        ),
        None,
    )


def _first_fixed_release(kb: KnowledgeBase, cc: str, release: Release) -> str | None:
    """The oldest torch release after ``release`` whose Triton's ptxas knows ``cc``."""
    for r in sorted(kb.releases, key=lambda r: V.parse_release(r.version)):
        if V.parse_release(r.version) <= V.parse_release(release.version):
            continue
        t = kb.triton_of(r)
        p = t.ptxas_for(cc)[0] if t is not None else None
        if p is not None and knows(kb, p, cc):
            return r.version
    return None


def _workaround(triton: TritonPtxas, override: str | None, first: str, fixed: str | None) -> str:
    toolkit_ptxas = f"the ptxas of a CUDA {first} or newer toolkit"
    if override:
        text = f"{override}=/usr/local/cuda/bin/ptxas ({toolkit_ptxas})"
    else:
        text = (
            f"TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas ({toolkit_ptxas}); a Triton {triton.version} that "
            "ignores it for sm_100 and newer needs triton/backends/nvidia/bin/ptxas-blackwell replaced by that "
            "ptxas"
        )
    return text + (f"; or torch {fixed} or newer, whose Triton's ptxas knows it" if fixed else "")


def gap(kb: KnowledgeBase, gpu: Gpu, release: Release, prerelease: bool = False) -> PtxasGap | None:
    """The GPU's target when the ptxas of the release's Triton does not know it (torch.compile fails), with
    the way around it; None when it knows it, or the data makes no claim."""
    cc = gpu.compute_capability
    if V.parse_cc(cc) < (7, 0):  # Triton itself refuses these GPUs ("Triton only supports ... >= 7.0")
        return None
    bundled = _bundled(kb, cc, release, prerelease)
    if bundled is None:
        return None
    triton, ptxas, override, certain = bundled
    if ptxas is None or knows(kb, ptxas, cc):
        return None
    first = _first_toolkit(kb, cc)
    if first is None:
        return None
    major, minor = cc.split(".")
    return PtxasGap(
        cc,
        f"sm_{major}{minor}{'a' if int(major) >= 9 else ''}",
        triton.version,
        ptxas,
        _workaround(triton, override, first, _first_fixed_release(kb, cc, release)),
        triton.source,
        triton.verified,
        certain,
    )
