"""The compatibility rules as pure functions: GPU arch vs a build's kernels, driver vs a CUDA runtime, driver
branch vs a GPU architecture. No I/O; doctor calls these with what it finds on the host (the installed
torch's ``torch.cuda.get_arch_list()``, NVML's driver version), check/resolve with knowledge-base builds.

>>> arch_coverage("8.9", arch_list=["sm_80", "sm_86"], ptx=[]).kind
<CoverageKind.CUBIN_FORWARD: 'cubin_forward'>
>>> arch_coverage("12.0", arch_list=["sm_90"], ptx=[]).kind
<CoverageKind.NOT_COVERED: 'not_covered'>
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchrig.compat import versions as V
from torchrig.compat.kb import Branch, Gpu, GpuArch, KnowledgeBase
from torchrig.compat.platforms import JetPack, Platform

# Binary compatibility, from the CUDA C++ Programming Guide, "Binary Compatibility" and "Application
# Compatibility" (https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#binary-compatibility):
#   "a cubin object generated for compute capability X.y will only execute on devices of compute
#    capability X.z where z >= y"  -> sm_86 runs on 8.9, sm_80 on 8.6; sm_90 never on 10.0, sm_100 never on 12.0.
#   "PTX code produced for some specific compute capability can always be compiled to binary code of
#    greater or equal compute capability"  -> compute_90 is JIT-compiled by the driver on 10.0 and 12.0.
#   Arch-specific targets (sm_90a, compute_90a) run only on exactly that compute capability; family-specific
#   targets (sm_100f, CUDA 12.9+) run within the same major. (Blackwell compatibility guide:
#   https://docs.nvidia.com/cuda/blackwell-compatibility-guide/index.html)


class CoverageKind(str, enum.Enum):
    CUBIN_EXACT = "cubin"  # a cubin built for exactly this compute capability
    CUBIN_FORWARD = (
        "cubin_forward"  # a cubin of the same major, lower minor (sm_86 on 8.9): binary compatible
    )
    PTX_JIT = "ptx_jit"  # no usable cubin; the driver JIT-compiles embedded PTX at first use
    NOT_COVERED = "not_covered"  # no kernel image for this GPU: "no kernel image is available for execution"


@dataclass(frozen=True)
class Coverage:
    kind: CoverageKind
    cc: str  # the GPU's compute capability
    via: str | None  # the arch entry used (sm_86 / compute_90), None when not covered
    why: str


def _archs(entries: Sequence[str]) -> list[V.Arch]:
    return [V.parse_arch(e) for e in entries]


def _cubin_runs_on(a: V.Arch, cc: tuple[int, int]) -> bool:
    if a.suffix == "a":
        return a.cc == cc
    return a.major == cc[0] and a.minor <= cc[1]


def _ptx_runs_on(a: V.Arch, cc: tuple[int, int]) -> bool:
    if a.suffix == "a":
        return a.cc == cc
    if a.suffix == "f":
        return a.major == cc[0] and a.minor <= cc[1]
    return a.cc <= cc


def arch_coverage(cc: str, arch_list: Sequence[str], ptx: Sequence[str] = ()) -> Coverage:
    """Whether code built for ``arch_list`` (cubins ``sm_XY``; ``compute_XY`` entries count as PTX) and ``ptx``
    runs on a GPU of compute capability ``cc``, and how: exact cubin, forward cubin, PTX JIT, or not at all.

    ``arch_list`` may be ``torch.cuda.get_arch_list()`` verbatim (it mixes ``sm_`` and ``compute_`` entries).
    """
    target = V.parse_cc(cc)
    entries = _archs(arch_list) + _archs(ptx)
    cubins = sorted({a for a in entries if a.kind == "sm"}, reverse=True)
    ptxs = sorted({a for a in entries if a.kind == "compute"}, reverse=True)
    have = " ".join(str(a) for a in sorted(cubins)) or "no cubins"
    ptx_text = " ".join(str(a) for a in sorted(ptxs)) or "no PTX"
    sm = V.sm_str(target)
    for a in cubins:
        if a.cc == target and _cubin_runs_on(a, target):
            return Coverage(
                CoverageKind.CUBIN_EXACT, cc, str(a), f"{a} cubin matches compute capability {cc}"
            )
    for a in cubins:
        if _cubin_runs_on(a, target):
            return Coverage(
                CoverageKind.CUBIN_FORWARD,
                cc,
                str(a),
                f"no {sm} cubin, but the {a} cubin runs on {cc} (same major {target[0]}, lower minor)",
            )
    for a in ptxs:
        if _ptx_runs_on(a, target):
            return Coverage(
                CoverageKind.PTX_JIT,
                cc,
                str(a),
                f"no cubin runs on {cc} (build has {have}); the driver JIT-compiles the {a} PTX at first use",
            )
    if any(a.cc <= target for a in cubins):
        below = max(a for a in cubins if a.cc <= target)
        why = f"cubins never run across majors ({below} cannot run on {cc})"
    elif cubins:
        why = f"the GPU is older than the oldest cubin ({min(cubins)})"
    else:
        why = "the build carries no cubins"
    if ptxs:
        why += f", and its PTX ({' '.join(str(a) for a in sorted(ptxs))}) cannot be JIT-compiled for {cc}"
    return Coverage(CoverageKind.NOT_COVERED, cc, None, f"the build has {have} and {ptx_text}; {why}")


class DriverSupportKind(str, enum.Enum):
    NATIVE = "native"
    MINOR_COMPAT = "minor_compat"
    UNSUPPORTED = "unsupported"


# CUDA minor version compatibility (https://docs.nvidia.com/deploy/cuda-compatibility/#minor-version-compatibility):
# an application built with any 12.x toolkit runs on a driver >= the 12.x floor (525.60.13 on Linux), with
# limits: "applications that use PTX ... will fail" to JIT PTX newer than the driver
# (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), and features that need the newer driver are unavailable. PyTorch
# wheels bundle their CUDA runtime (the nvidia-* wheels), which is what lets a cu128 wheel run on a 535 driver.
MINOR_COMPAT_CAVEAT = (
    "the wheel bundles its CUDA {cuda} runtime, but the driver natively supports CUDA {max_cuda}: JIT of newer PTX "
    "fails (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), which hits PTX-only GPUs and kernels compiled at run time "
    "(torch.compile/Triton, nvrtc), and features that need a newer driver are unavailable"
)


@dataclass(frozen=True)
class DriverSupport:
    kind: DriverSupportKind
    driver: str
    cuda: str
    min_driver: str | None  # native floor of the toolkit
    min_driver_minor_compat: str | None  # floor under minor-version compatibility, same major
    message: str
    caveat: str | None = None


def _ge(driver: str, floor: str | None) -> bool:
    return floor is not None and V.parse_driver(driver) >= V.parse_driver(floor)


def max_native_cuda(kb: KnowledgeBase, driver: str) -> str | None:
    """The newest CUDA toolkit whose native driver floor ``driver`` meets (nvidia-smi's "CUDA Version")."""
    ok = [t for t in kb.toolkits if _ge(driver, t.min_driver)]
    return max(ok, key=lambda t: V.parse_cuda(t.version)).version if ok else None


@dataclass(frozen=True)
class DriverView:
    """A driver version read in its platform's numbering.

    ``branch``: the desktop (Linux) branch number, None on Jetson; ``native_max_cuda``: the CUDA it runs
    natively when that comes from the platform's data rather than the Linux floors (Windows: the branch's;
    Jetson: the JetPack's); ``note``: how the number was read, for the user.
    """

    driver: str
    branch: int | None
    native_max_cuda: str | None = None
    note: str | None = None


def driver_view(
    kb: KnowledgeBase, driver: str, platform: Platform, jetpack: JetPack | None = None
) -> DriverView:
    """Read ``driver`` as ``platform`` numbers it (platforms.toml: desktop, windows, jetson)."""
    major = V.parse_driver(driver)[0]
    info = kb.platform_info(platform.id)
    numbering = info.driver_numbering if info else "desktop"
    if numbering == "windows":
        b = kb.windows_branch(driver)
        if b is None:
            return DriverView(driver, major)
        return DriverView(
            driver,
            int(b.branch),
            b.max_cuda,
            f"Windows driver {driver} belongs to branch R{b.branch}, which runs CUDA {b.max_cuda} natively",
        )
    if numbering == "jetson":
        jp = jetpack or kb.jetpack_for_driver(driver)
        if jp is None:
            return DriverView(driver, None, None, f"Jetson driver {driver} matches no known JetPack")
        return DriverView(
            driver,
            None,
            jp.max_cuda,
            f"Jetson driver {driver} is JetPack {jp.version}'s (L4T R{jp.l4t}, CUDA {jp.max_cuda}), "
            f"not a desktop branch",
        )
    return DriverView(driver, major)


def driver_cuda_support(
    kb: KnowledgeBase, driver: str, cuda: str, native_max_cuda: str | None = None
) -> DriverSupport:
    """Can driver ``driver`` run a CUDA ``cuda`` runtime: natively, under minor-version compatibility, or not.

    ``native_max_cuda`` (from :func:`driver_view`) replaces the Linux driver floors for Windows and Jetson numbers.
    """
    V.parse_driver(driver)
    tk = kb.toolkit(cuda)
    floor, compat = tk.min_driver, tk.min_driver_minor_compat
    if native_max_cuda is not None:
        return _support_by_cuda(tk, driver, native_max_cuda)
    if _ge(driver, floor):
        return DriverSupport(
            DriverSupportKind.NATIVE,
            driver,
            tk.version,
            floor,
            compat,
            f"driver {driver} supports CUDA {tk.version} natively (needs ≥ {floor})",
        )
    if _ge(driver, compat):
        branch = kb.branch_of(driver)
        native = (branch.max_cuda if branch else max_native_cuda(kb, driver)) or f"{tk.major}.x"
        caveat = MINOR_COMPAT_CAVEAT.format(cuda=tk.version, driver=driver, max_cuda=native)
        return DriverSupport(
            DriverSupportKind.MINOR_COMPAT,
            driver,
            tk.version,
            floor,
            compat,
            f"driver {driver} runs CUDA {tk.version} under minor-version compatibility (native needs ≥ {floor}; "
            f"CUDA {tk.major}.x minor compatibility needs ≥ {compat})",
            caveat,
        )
    why = f"CUDA {tk.version} needs ≥ {floor}" if floor else f"CUDA {tk.version} has no known driver floor"
    if compat and compat != floor:
        why += f" (≥ {compat} with minor-version compatibility)"
    elif compat is None and floor and tk.major < 11:
        # Minor-version compatibility starts with CUDA 11 (cuda.toml lists no floor for it before 11.0): a 10.x
        # runtime needs its own toolkit's driver.
        why += " (there is no minor-version compatibility before CUDA 11)"
    return DriverSupport(
        DriverSupportKind.UNSUPPORTED,
        driver,
        tk.version,
        floor,
        compat,
        f"driver too old: {why}, you have {driver}",
    )


def _support_by_cuda(tk: Any, driver: str, native: str) -> DriverSupport:
    have, want = V.parse_cuda(native), V.parse_cuda(tk.version)
    if want[:2] <= have[:2]:
        return DriverSupport(
            DriverSupportKind.NATIVE,
            driver,
            tk.version,
            tk.min_driver,
            tk.min_driver_minor_compat,
            f"driver {driver} supports CUDA {tk.version} natively (it runs up to CUDA {native})",
        )
    if want[0] == have[0] and tk.min_driver_minor_compat:
        return DriverSupport(
            DriverSupportKind.MINOR_COMPAT,
            driver,
            tk.version,
            tk.min_driver,
            tk.min_driver_minor_compat,
            f"driver {driver} runs CUDA {tk.version} under minor-version compatibility (natively up to CUDA {native})",
            MINOR_COMPAT_CAVEAT.format(cuda=tk.version, driver=driver, max_cuda=native),
        )
    return DriverSupport(
        DriverSupportKind.UNSUPPORTED,
        driver,
        tk.version,
        tk.min_driver,
        tk.min_driver_minor_compat,
        f"driver too old: driver {driver} runs up to CUDA {native}, the build needs CUDA {tk.version}",
    )


@dataclass(frozen=True)
class BranchSupport:
    ok: bool
    code: str  # driver_branch_ok | driver_branch_drops_arch | driver_branch_predates_arch
    message: str
    arch: GpuArch
    branch: Branch | None


def driver_supports_arch(
    kb: KnowledgeBase, driver: str, gpu: Gpu, branch_number: int | None = None
) -> BranchSupport:
    """Does the driver's branch still (or already) support the GPU's architecture?

    Each architecture row carries ``last_driver_branch`` (e.g. Kepler's last is R470) and optionally
    ``min_driver_branch`` (e.g. Blackwell GeForce needs R570); branches compare by number.
    """
    arch = kb.arch(gpu.arch)
    major = branch_number if branch_number is not None else V.parse_driver(driver)[0]
    branch = next((b for b in kb.branches if b.branch == str(major)), None)
    if arch.last_driver_branch and major > int(arch.last_driver_branch):
        return BranchSupport(
            False,
            "driver_branch_drops_arch",
            f"driver {driver} (R{major}) no longer supports {arch.name} GPUs "
            f"({gpu.name}); the last branch that does is R{arch.last_driver_branch}",
            arch,
            branch,
        )
    if arch.min_driver_branch and major < int(arch.min_driver_branch):
        return BranchSupport(
            False,
            "driver_branch_predates_arch",
            f"driver {driver} (R{major}) predates {arch.name} GPUs ({gpu.name}); "
            f"they need R{arch.min_driver_branch} or newer",
            arch,
            branch,
        )
    return BranchSupport(True, "driver_branch_ok", f"driver R{major} supports {arch.name}", arch, branch)
