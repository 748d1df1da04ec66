"""``check``: will these GPUs, with this driver, run this PyTorch build? A verdict, every reason, and the fixes.

>>> kb = load_kb()                                                    # doctest: +SKIP
>>> check(kb, gpus=[kb.find_gpu("RTX 5090")], driver="570.86.10", build=kb.find_build("2.6.0+cu124")).verdict
<Verdict.FAILS: 'fails'>
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torchrig.compat import versions as V
from torchrig.compat.evaluate import evaluate, jetpack_for, platform_for
from torchrig.compat.fixes import nearest_fixes
from torchrig.compat.kb import Build, Gpu, KnowledgeBase
from torchrig.compat.platforms import Platform
from torchrig.compat.reasons import Fix, Reason, Severity, Verdict, verdict_of
from torchrig.compat.rules import DriverSupportKind

# Re-exported: the records' old home (``from torchrig.compat.check import Reason`` keeps working).
__all__ = [
    "CheckResult",
    "Fix",
    "Reason",
    "Severity",
    "Verdict",
    "check",
    "evaluate",
    "platform_for",
    "verdict_of",
]


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    reasons: list[Reason]
    fixes: list[Fix]
    build: Build
    gpus: list[Gpu]
    driver: str | None
    driver_support: DriverSupportKind | None = None
    notes: list[str] = field(default_factory=list)
    platform: str = "linux-x86_64"

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reasons": [
                {"code": r.code, "severity": r.severity.value, "gpu": r.gpu, "message": r.message}
                for r in self.reasons
            ],
            "fixes": [
                {"kind": f.kind, "pip_command": f.pip_command, "summary": f.summary} for f in self.fixes
            ],
            "build": self.build.to_json(),
            "gpus": [
                {"name": g.name, "id": g.id, "arch": g.arch, "compute_capability": g.compute_capability}
                for g in self.gpus
            ],
            "driver": self.driver,
            "driver_support": self.driver_support.value if self.driver_support else None,
            "notes": self.notes,
            "platform": self.platform,
        }


def check(
    kb: KnowledgeBase, gpus: Sequence[Gpu], driver: str | None, build: Build, platform: Platform | None = None
) -> CheckResult:
    """Verdict for ``build`` on all ``gpus`` with ``driver`` (None: architecture only) on ``platform``
    (default: the build's), with the nearest fixes."""
    if not gpus:
        from torchrig.errors import UsageError

        raise UsageError("no GPU given", hint="pass --gpu at least once, e.g. --gpu 'RTX 4090'")
    if driver is not None:
        V.parse_driver(driver)
    plat, switched = platform_for(gpus, platform or Platform(build.platform))
    if plat.id == "jetson" and not plat.jetpack:
        found = jetpack_for(kb, gpus, driver, plat)
        plat = Platform("jetson", found.version) if found else plat
    if plat.id != build.platform:
        build = (
            kb.find_build(f"{build.prerelease or build.release.version}+{build.variant.name}", plat)
            if build.prerelease
            else kb.build(build.release, build.release.variant(build.variant.name), plat)
        )
    reasons, driver_kind = evaluate(kb, gpus, driver, build, plat)
    verdict = verdict_of(reasons)
    fixes: list[Fix] = []
    if verdict is Verdict.FAILS:
        fixes = nearest_fixes(kb, gpus, driver, build, reasons, plat)
    notes = [switched] if switched else []
    if not driver:
        notes.append(
            "no --driver given: only the GPU architecture was checked; pass --driver "
            "(nvidia-smi's first line) to check the driver too"
        )
    return CheckResult(verdict, reasons, fixes, build, list(gpus), driver, driver_kind, notes, plat.label)
