"""``resolve``: the PyTorch build (within ``--torch`` and ``--python``) for ALL given GPUs with this driver on this
platform, with the exact pip command and the pins that come with it; without GPUs, the CPU build.

Policy, with a driver (as uv's ``--torch-backend=auto`` picks the newest CUDA the driver runs natively):

1. the newest release that has a confirmed build this driver runs natively ranks first; within a release, a
   build whose cuDNN/NCCL pins are known before one whose pins are unknown (torchrig does not go back whole
   releases for pins: unknown pins are shown as unknown);
2. a newer release that works only with caveats (CUDA minor-version compatibility, a build not confirmed) is
   offered beside it (``newer_alternative``) with its caveats, never instead of it;
3. when no release runs natively, the newest that works under minor-version compatibility.

Ranking of a release's variants that work: a CUDA the driver runs natively before minor-version
compatibility, kernels without PTX JIT before JIT, known pins before unknown, then the newest CUDA, then the
PyPI default. Without a driver: kernels without JIT, then the PyPI default, then the newest CUDA (the driver is
then yours to pick: ``min_driver`` says what it must be).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrig.compat import versions as V
from torchrig.compat.candidates import Candidate, candidates
from torchrig.compat.evaluate import evaluate, platform_for
from torchrig.compat.fixes import nearest_fixes
from torchrig.compat.kb import Build, Gpu, KnowledgeBase, Release
from torchrig.compat.platforms import Platform
from torchrig.compat.reasons import Fix, Reason, Severity, Verdict
from torchrig.errors import InputError, JobFailed


@dataclass(frozen=True)
class Resolution:
    build: Build
    verdict: Verdict
    reasons: list[Reason]
    pip_command: str  # torch alone: plain for the PyPI build, else with --index-url
    pip_command_full: str  # with the matching torchvision and torchaudio
    index_url: str
    cuda: str | None
    torchvision: str | None
    torchaudio: str | None
    cudnn: str | None
    nccl: str | None
    min_driver: str | None  # native floor of the build's CUDA
    min_driver_minor_compat: str | None
    python: str | None
    driver: str | None
    gpus: list[Gpu]
    alternatives: list[Build] = field(
        default_factory=list
    )  # the release's other working variants, best first
    native_alternative: Build | None = (
        None  # when the pick needs minor-version compatibility: the newest native one
    )
    newer_alternative: Build | None = None  # a newer release that needs minor-version compatibility
    newer_caveat: str | None = None
    platform: str = "linux-x86_64"
    why: str | None = None  # one line: why this build was chosen

    def to_json(self) -> dict[str, Any]:
        return {
            "build": self.build.to_json(),
            "verdict": self.verdict.value,
            "pip_command": self.pip_command,
            "pip_command_full": self.pip_command_full,
            "index_url": self.index_url,
            "cuda": self.cuda,
            "torchvision": self.torchvision,
            "torchaudio": self.torchaudio,
            "cudnn": self.cudnn,
            "nccl": self.nccl,
            "min_driver": self.min_driver,
            "min_driver_minor_compat": self.min_driver_minor_compat,
            "python": self.python,
            "driver": self.driver,
            "gpus": [{"name": g.name, "compute_capability": g.compute_capability} for g in self.gpus],
            "reasons": [
                {"code": r.code, "severity": r.severity.value, "gpu": r.gpu, "message": r.message}
                for r in self.reasons
            ],
            "alternatives": [b.label for b in self.alternatives],
            "native_alternative": self.native_alternative.label if self.native_alternative else None,
            "newer_alternative": self.newer_alternative.label if self.newer_alternative else None,
            "newer_caveat": self.newer_caveat,
            "platform": self.platform,
            "why": self.why,
        }


class NoBuildFound(JobFailed):
    """No release in range works on every GPU with this driver; carries the reasons per GPU and what would help."""

    def __init__(self, message: str, *, blockers: list[Reason], suggestions: list[Fix]) -> None:
        super().__init__(message, hint=suggestions[0].summary if suggestions else None)
        self.blockers = blockers
        self.suggestions = suggestions


def _releases_in_range(kb: KnowledgeBase, torch_spec: str | None, python: str | None) -> list[Release]:
    spec = V.parse_spec(torch_spec) if torch_spec else None
    py = V.parse_python(python) if python else None
    if py and not any(py in r.python for r in kb.releases):
        known = sorted({p for r in kb.releases for p in r.python}, key=V.parse_cuda)
        raise InputError(
            f"no PyTorch release in torchrig's knowledge base supports Python {py}",
            hint=f"supported: {', '.join(known)}",
        )
    found = [
        r for r in kb.releases if (spec is None or spec.admits(r.version)) and (py is None or py in r.python)
    ]
    if not found:
        what = " and ".join(
            x for x in (f"torch {spec.text}" if spec else "", f"Python {py}" if py else "") if x
        )
        closest = ", ".join(r.version for r in kb.releases[:3])
        raise InputError(f"no published PyTorch release matches {what}", hint=f"newest releases: {closest}")
    return found


def resolve(
    kb: KnowledgeBase,
    gpus: Sequence[Gpu],
    driver: str | None = None,
    torch_spec: str | None = None,
    python: str | None = None,
    platform: Platform | None = None,
) -> Resolution:
    """The build for all ``gpus`` by the policy above; without GPUs the CPU build for ``platform``;
    NoBuildFound (exit 1) if none works."""
    if driver is not None:
        V.parse_driver(driver)
    plat, _switched = platform_for(gpus, platform)
    releases = _releases_in_range(kb, torch_spec, python)
    if not gpus:
        return _resolve_cpu(kb, releases, python, plat)
    newest: tuple[int, list[Candidate]] | None = None
    for i, release in enumerate(releases):
        found = candidates(kb, gpus, driver, release, plat)
        if not found:
            continue
        if newest is None:
            newest = (i, found)
        if driver is None or (found[0].native and found[0].build.variant.confirmed):
            res = _resolution(kb, found, gpus, driver, python, plat)
            top = newest[1][0]
            if (
                top.build != found[0].build
            ):  # a newer release works only with caveats (minor compat, unconfirmed)
                caveats = [r.message for r in top.reasons if r.severity.cautions]
                res = dataclasses.replace(
                    res,
                    newer_alternative=top.build,
                    newer_caveat="; ".join(caveats) or None,
                    why=f"the newest confirmed build driver {driver} runs natively; torch {top.build.label} is "
                    f"newer but works only with caveats",
                )
            elif driver is not None:
                res = dataclasses.replace(res, why=f"the newest build driver {driver} runs natively")
            return res
    if newest is not None:  # nothing native: the newest that works under minor-version compatibility
        res = _resolution(kb, newest[1], gpus, driver, python, plat)
        return dataclasses.replace(
            res,
            why=f"no release in range runs natively on driver {driver}: the newest under minor-version compatibility",
        )
    raise _no_build(kb, gpus, driver, releases, torch_spec, python, plat)


def _resolve_cpu(
    kb: KnowledgeBase, releases: list[Release], python: str | None, plat: Platform
) -> Resolution:
    """No GPU: the newest release in range with a CPU build for ``plat``."""
    for release in releases:
        cpu = next((v for v in release.variants if v.is_cpu), None)
        if cpu is None:
            continue
        b = kb.build(release, cpu, plat)
        where = "PyPI's default there" if b.is_pypi_default else "from download.pytorch.org/whl/cpu"
        reason = Reason(
            "cpu_build",
            Severity.INFO,
            f"no GPU given: torch {b.label} is the CPU build for {plat.label} ({where}); "
            f"pass --gpu (and --driver) to get a CUDA build",
        )
        return Resolution(
            build=b,
            verdict=Verdict.WORKS,
            reasons=[reason],
            pip_command=b.pip_command,
            pip_command_full=b.pip_command_for(("torch", "torchvision", "torchaudio")),
            index_url=b.variant.index_url,
            cuda=None,
            torchvision=release.torchvision,
            torchaudio=release.torchaudio,
            cudnn=None,
            nccl=None,
            min_driver=None,
            min_driver_minor_compat=None,
            python=V.parse_python(python) if python else None,
            driver=None,
            gpus=[],
            platform=plat.label,
            why=f"no GPU given: the newest CPU build for {plat.label}",
        )
    raise InputError(
        "no release in range has a CPU build in torchrig's knowledge base", hint="widen --torch or --python"
    )


def _resolution(
    kb: KnowledgeBase,
    found: list[Candidate],
    gpus: Sequence[Gpu],
    driver: str | None,
    python: str | None,
    plat: Platform,
) -> Resolution:
    best = found[0]
    b = best.build
    tk = kb.toolkit(b.cuda) if b.cuda else None
    return Resolution(
        build=b,
        verdict=best.verdict,
        reasons=best.reasons,
        pip_command=b.pip_command,
        pip_command_full=b.pip_command_for(("torch", "torchvision", "torchaudio")),
        index_url=b.variant.index_url,
        cuda=b.cuda,
        torchvision=b.release.torchvision,
        torchaudio=b.release.torchaudio,
        cudnn=b.variant.cudnn,
        nccl=b.variant.nccl,
        min_driver=tk.min_driver if tk else None,
        min_driver_minor_compat=tk.min_driver_minor_compat if tk else None,
        python=V.parse_python(python) if python else None,
        driver=driver,
        gpus=list(gpus),
        alternatives=[c.build for c in found[1:]],
        platform=plat.label,
    )


def _no_build(
    kb: KnowledgeBase,
    gpus: Sequence[Gpu],
    driver: str | None,
    releases: list[Release],
    torch_spec: str | None,
    python: str | None,
    plat: Platform,
) -> NoBuildFound:
    newest = releases[0]
    # Why the newest release in range fails, per GPU: its Linux default build's failing reasons.
    pypi = kb.build(newest, newest.variant(newest.pypi_variant), plat)
    reasons, _ = evaluate(kb, gpus, driver, pypi, plat)
    blockers = [r for r in reasons if r.severity.blocks]
    suggestions: list[Fix] = []
    if driver is not None:  # what would change it: a driver branch, another release, or both
        suggestions = nearest_fixes(kb, gpus, driver, pypi, reasons, plat)
    if not suggestions and (torch_spec or python):  # would a wider range help?
        try:
            wider = resolve(kb, gpus, driver, platform=plat)
            suggestions.append(
                Fix(
                    "release",
                    wider.pip_command,
                    f"outside the requested range, torch {wider.build.label} works",
                )
            )
        except NoBuildFound:
            pass
    per_gpu = "; ".join(f"{r.gpu or 'driver'}: {r.code}" for r in blockers)
    return NoBuildFound(
        f"no PyTorch build in range works on {', '.join(g.name for g in gpus)}"
        + (f" with driver {driver}" if driver else "")
        + f" ({per_gpu})",
        blockers=blockers,
        suggestions=suggestions,
    )
