"""A release's GPU variants that do not fail, best first: what ``resolve`` picks from and ``fixes`` suggests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torchrig.compat import versions as V
from torchrig.compat.evaluate import evaluate
from torchrig.compat.kb import Build, Gpu, KnowledgeBase, Release
from torchrig.compat.platforms import Platform
from torchrig.compat.reasons import Reason, Verdict, verdict_of
from torchrig.compat.rules import DriverSupportKind


@dataclass(frozen=True)
class Candidate:
    build: Build
    reasons: list[Reason]
    driver_kind: DriverSupportKind | None

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.reasons)

    @property
    def native(self) -> bool:
        return self.driver_kind is DriverSupportKind.NATIVE

    @property
    def pins_known(self) -> bool:
        return self.build.variant.cudnn is not None and self.build.variant.nccl is not None

    def rank(self, with_driver: bool) -> tuple[int, ...]:
        jit = any(r.code == "arch_ptx_jit" for r in self.reasons)
        cuda = V.parse_cuda(self.build.cuda) if self.build.cuda else (0, 0)
        pypi = int(self.build.is_pypi_default)
        if with_driver:
            return (int(self.native), int(not jit), int(self.pins_known), *cuda, pypi)
        return (int(not jit), pypi, *cuda)


def candidates(
    kb: KnowledgeBase,
    gpus: Sequence[Gpu],
    driver: str | None,
    release: Release,
    platform: Platform | None = None,
) -> list[Candidate]:
    """The release's GPU variants that do not fail on ``platform``, best first."""
    out = []
    for variant in release.variants:
        if variant.is_cpu:
            continue
        build = kb.build(release, variant, platform)
        reasons, kind = evaluate(kb, gpus, driver, build, platform)
        cand = Candidate(build, reasons, kind)
        if cand.verdict is not Verdict.FAILS:
            out.append(cand)
    return sorted(out, key=lambda c: c.rank(driver is not None), reverse=True)
