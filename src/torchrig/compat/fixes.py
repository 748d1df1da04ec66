"""The nearest fixes for a failing check: another variant of the same release, another release, or a driver.

Nearest means: a variant of the requested release before another release; releases by distance from the
requested one (newer first on a tie); a driver change only to a branch that still supports every GPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torchrig.compat import versions as V
from torchrig.compat.candidates import Candidate, candidates
from torchrig.compat.kb import Build, Gpu, KnowledgeBase, Release
from torchrig.compat.platforms import Platform
from torchrig.compat.reasons import Fix, Reason

_DRIVER_CODES = {"driver_too_old", "arch_ptx_jit_driver_too_old"}
_BRANCH_CODES = {"driver_branch_drops_arch", "driver_branch_predates_arch"}


def _describe(c: Candidate) -> str:
    what = "works" if c.verdict.value == "works" else "works with caveats"
    how = {"native": "natively", "minor_compat": "under minor-version compatibility"}.get(
        c.driver_kind.value if c.driver_kind else "", ""
    )
    return f"torch {c.build.label} {what}" + (f" (driver runs CUDA {c.build.cuda} {how})" if how else "")


def _by_distance(kb: KnowledgeBase, release: Release) -> list[Release]:
    order = list(kb.releases)  # newest first
    if release in order:
        i = order.index(release)
    else:  # a nightly's release line the data does not list: where it would stand among the releases
        key = V.parse_release(release.version)
        i = sum(1 for r in order if V.parse_release(r.version) > key)
    return sorted(
        (r for r in order if r is not release), key=lambda r: (abs(order.index(r) - i), order.index(r))
    )


def _nearest_release(
    kb: KnowledgeBase, gpus: Sequence[Gpu], driver: str | None, build: Build, platform: Platform | None = None
) -> Candidate | None:
    for release in _by_distance(kb, build.release):
        found = candidates(kb, gpus, driver, release, platform)
        if found:
            return found[0]
    return None


def _branch_ceiling(kb: KnowledgeBase, gpus: Sequence[Gpu]) -> int | None:
    lasts = [int(a.last_driver_branch) for a in (kb.arch(g.arch) for g in gpus) if a.last_driver_branch]
    return min(lasts) if lasts else None


def _branch_floor(kb: KnowledgeBase, gpus: Sequence[Gpu]) -> int | None:
    firsts = [int(a.min_driver_branch) for a in (kb.arch(g.arch) for g in gpus) if a.min_driver_branch]
    return max(firsts) if firsts else None


def _driver_fix(
    kb: KnowledgeBase, gpus: Sequence[Gpu], build: Build, codes: set[str], platform: Platform | None = None
) -> Fix | None:
    """Upgrade (or downgrade) the driver so that ``build`` works, if some branch supports every GPU."""
    if build.cuda is None:
        return None
    arch_only = candidates(kb, gpus, None, build.release, platform)
    if not any(c.build == build for c in arch_only):
        return None  # the build's kernels do not run on these GPUs whatever the driver
    tk = kb.toolkit(build.cuda)
    ceiling, floor_branch = _branch_ceiling(kb, gpus), _branch_floor(kb, gpus)
    if codes & _DRIVER_CODES and tk.min_driver:
        need = V.parse_driver(tk.min_driver)[0]
        target = max(need, floor_branch or 0)
        if ceiling is None or target <= ceiling:
            also = (
                f"; ≥ {tk.min_driver_minor_compat} suffices under minor-version compatibility"
                if tk.min_driver_minor_compat
                and "arch_ptx_jit_driver_too_old" not in codes
                and V.parse_driver(tk.min_driver_minor_compat)[0] < need  # another branch, worth naming
                else ""
            )
            return Fix(
                "driver",
                None,
                f"upgrade the NVIDIA driver to ≥ {tk.min_driver} (branch R{target} or newer) "
                f"to run CUDA {tk.version} natively{also}",
            )
    if "driver_branch_predates_arch" in codes and floor_branch:
        return Fix(
            "driver",
            None,
            f"upgrade the NVIDIA driver to branch R{floor_branch} or newer "
            f"(the first that supports {', '.join(sorted({g.arch for g in gpus}))})",
        )
    if "driver_branch_drops_arch" in codes and ceiling:
        floor = tk.min_driver_minor_compat or tk.min_driver
        if floor and V.parse_driver(floor)[0] <= ceiling:
            return Fix(
                "driver",
                None,
                f"install a driver from branch R{ceiling} or older (the last that supports "
                f"{', '.join(sorted({g.arch for g in gpus}))}), ≥ {floor} for CUDA {tk.version}",
            )
    return None


def _fallback(
    kb: KnowledgeBase, gpus: Sequence[Gpu], build: Build, platform: Platform | None = None
) -> Fix | None:
    """No torch change works with this driver: the nearest release whose kernels run, and the driver it needs."""
    found = _nearest_release(kb, gpus, None, build, platform)
    if found is None or found.build.cuda is None:
        return None
    tk = kb.toolkit(found.build.cuda)
    ceiling = _branch_ceiling(kb, gpus)
    floor = tk.min_driver
    if ceiling is not None and floor and V.parse_driver(floor)[0] > ceiling:
        floor = tk.min_driver_minor_compat
    if floor is None or (ceiling is not None and V.parse_driver(floor)[0] > ceiling):
        return None
    branch = f"R{V.parse_driver(floor)[0]}" + (f"..R{ceiling}" if ceiling else "+")
    return Fix(
        "release",
        found.build.pip_command,
        f"torch {found.build.label} has kernels for these GPUs; it needs a driver ≥ {floor} (branch {branch})",
    )


def _in_platform_numbers(kb: KnowledgeBase, fix: Fix | None, platform: Platform | None) -> Fix | None:
    """A driver fix in the numbers the platform's nvidia-smi prints: Windows numbers are read as the newest
    branch not above them, so any driver numbered at or above the branch does; JetPack sets Jetson's."""
    info = kb.platform_info(platform.id) if platform else None
    if fix is None or info is None or info.driver_numbering == "desktop":
        return fix
    if info.driver_numbering == "jetson":
        return Fix("driver", None, f"{fix.summary}; on Jetson the driver comes with JetPack: upgrade JetPack")
    m = re.search(r"branch R(\d+)", fix.summary)
    if not m:
        return fix
    return Fix(
        "driver",
        None,
        f"install a Windows driver numbered {m.group(1)} or higher (branch R{m.group(1)}); in Linux terms: {fix.summary}",
    )


def nearest_fixes(
    kb: KnowledgeBase,
    gpus: Sequence[Gpu],
    driver: str | None,
    build: Build,
    reasons: Sequence[Reason],
    platform: Platform | None = None,
) -> list[Fix]:
    codes = {r.code for r in reasons if r.severity.blocks}
    if "embedded_platform" in codes:
        return [
            Fix(
                "platform",
                None,
                "Jetson before JetPack 7: install NVIDIA's JetPack build of PyTorch "
                "(https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-platform/); on JetPack 7 "
                "(Thor) the aarch64 CUDA wheels apply: pass --platform jetson7",
            )
        ]
    torch_fix: Fix | None = None
    same = [c for c in candidates(kb, gpus, driver, build.release, platform) if c.build != build]
    if same:
        torch_fix = Fix("variant", same[0].build.pip_command, _describe(same[0]))
    else:
        other = _nearest_release(kb, gpus, driver, build, platform)
        if other:
            torch_fix = Fix("release", other.build.pip_command, _describe(other))
    driver_fix = _driver_fix(kb, gpus, build, codes, platform) if driver is not None else None
    driver_fix = _in_platform_numbers(kb, driver_fix, platform)
    fixes = [f for f in (torch_fix, driver_fix) if f]
    driver_only = bool(codes) and codes <= (_DRIVER_CODES | _BRANCH_CODES)
    if driver_only and driver_fix and torch_fix:
        fixes = [driver_fix, torch_fix]
    if not fixes and driver is not None:
        fb = _fallback(kb, gpus, build, platform)
        if fb:
            fixes.append(fb)
    return fixes
