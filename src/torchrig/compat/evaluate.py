"""The reasons (no fixes) one build gets for some GPUs, a driver and a platform: the building block of ``check``,
``resolve``, ``matrix`` and ``fixes``. Pure: a function of the knowledge base's records.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchrig.compat import versions as V
from torchrig.compat.kb import Build, Gpu, KnowledgeBase
from torchrig.compat.platforms import JetPack, Platform
from torchrig.compat.reasons import Reason, Severity
from torchrig.compat.rules import (
    Coverage,
    CoverageKind,
    DriverSupportKind,
    arch_coverage,
    driver_cuda_support,
    driver_supports_arch,
    driver_view,
)


def _forward_reason(kb: KnowledgeBase, gpu: Gpu, build: Build, cov: Coverage) -> Reason:
    label = f"torch {build.label}"
    better = kb.other_builds_with_native_cubin(build, gpu)
    if better:
        return Reason(
            "arch_forward_cubin",
            Severity.CAVEAT,
            f"{gpu.name} ({gpu.compute_capability}) runs {label}'s {cov.via} kernels (binary compatible, "
            f"not tuned for {gpu.sm}); {', '.join(b.label for b in better)} has native {gpu.sm} kernels",
            gpu.name,
        )
    return Reason(
        "arch_forward_cubin",
        Severity.INFO,
        f"{gpu.name} ({gpu.compute_capability}) runs {label}'s {cov.via} kernels: {cov.why}",
        gpu.name,
    )


def _ptx_reason(
    kb: KnowledgeBase, gpu: Gpu, build: Build, cov: Coverage, driver_kind: DriverSupportKind | None
) -> Reason:
    v, label, cc = build.variant, f"torch {build.label}", gpu.compute_capability
    known = kb.toolkit(v.cuda).compute_capabilities if v.cuda else ()
    if known and cc not in known:
        # PTX JIT covers torch's own kernels only; the CUDA libraries in the wheel (cuBLAS, cuDNN) come from a
        # toolkit that predates the GPU. Maintainers: A100 needs binaries "built with CUDA > 11.0"
        # (https://github.com/pytorch/pytorch/issues/57922), H100 "CUDA11.8 or newer"
        # (https://github.com/pytorch/pytorch/issues/110153).
        return Reason(
            "toolkit_predates_gpu",
            Severity.FAIL,
            f"{gpu.name} ({cc}) has no cubin in {label}, and CUDA {v.cuda} predates compute capability "
            f"{cc}: its PTX ({cov.via}) would JIT, but the bundled CUDA libraries (cuBLAS, cuDNN) have "
            f"no kernels for it",
            gpu.name,
        )
    if driver_kind is DriverSupportKind.MINOR_COMPAT:
        return Reason(
            "arch_ptx_jit_driver_too_old",
            Severity.FAIL,
            f"{gpu.name} ({cc}) has no cubin in {label}; its {cov.via} PTX was built with CUDA {v.cuda}, "
            f"newer than the driver supports natively, so JIT fails (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            gpu.name,
        )
    extra = "" if driver_kind else f" (the driver must support CUDA {v.cuda} natively)"
    return Reason(
        "arch_ptx_jit",
        Severity.CAVEAT,
        f"{gpu.name} ({cc}): {cov.why}{extra}: slow first start (minutes), cached in ~/.nv/ComputeCache "
        f"(CUDA_CACHE_MAXSIZE)",
        gpu.name,
    )


def _arch_reason(kb: KnowledgeBase, gpu: Gpu, build: Build, driver_kind: DriverSupportKind | None) -> Reason:
    v = build.variant
    cov = arch_coverage(gpu.compute_capability, v.arch_list, v.ptx)
    if cov.kind is CoverageKind.CUBIN_EXACT:
        return Reason(
            "arch_native",
            Severity.INFO,
            f"torch {build.label} has native {cov.via} kernels for {gpu.name}",
            gpu.name,
        )
    if cov.kind is CoverageKind.CUBIN_FORWARD:
        return _forward_reason(kb, gpu, build, cov)
    if cov.kind is CoverageKind.PTX_JIT:
        return _ptx_reason(kb, gpu, build, cov, driver_kind)
    return Reason(
        "arch_not_covered",
        Severity.FAIL,
        f"{gpu.name} with CUDA capability {gpu.sm} is not compatible with torch {build.label}: {cov.why} "
        f'("no kernel image is available for execution on the device")',
        gpu.name,
    )


def _driver_reasons(
    kb: KnowledgeBase,
    gpus: Sequence[Gpu],
    driver: str,
    build: Build,
    platform: Platform,
    jetpack: JetPack | None,
) -> tuple[list[Reason], DriverSupportKind | None]:
    reasons: list[Reason] = []
    view = driver_view(kb, driver, platform, jetpack)
    if view.note:
        reasons.append(Reason("driver_numbering", Severity.INFO, view.note))
    if view.branch is not None:
        for gpu in gpus:
            bs = driver_supports_arch(kb, driver, gpu, view.branch)
            if not bs.ok:
                reasons.append(Reason(bs.code, Severity.FAIL, bs.message, gpu.name))
    if build.cuda is None:
        return reasons, None
    ds = driver_cuda_support(kb, driver, build.cuda, view.native_max_cuda)
    if ds.kind is DriverSupportKind.NATIVE:
        reasons.append(Reason("driver_native", Severity.INFO, ds.message))
    elif ds.kind is DriverSupportKind.MINOR_COMPAT:
        reasons.append(Reason("driver_minor_compat", Severity.CAVEAT, f"{ds.message}; {ds.caveat}"))
    elif any(code == "cuda_older_than_data" for code, _ in build.remarks):
        # judged with a newer CUDA's floor, an upper bound: below it is unknown, not a sure failure
        reasons.append(
            Reason(
                "driver_floor_unknown",
                Severity.CAVEAT,
                f"driver {driver} is below CUDA {build.cuda}'s floor ({ds.min_driver}), which is higher than the "
                f"floor of the build's own older CUDA; check that nvidia-smi's CUDA version is at least the build's",
            )
        )
    else:
        reasons.append(
            _forward_compat(kb, gpus, driver, build, platform)
            or Reason("driver_too_old", Severity.FAIL, ds.message)
        )
    return reasons, ds.kind


# NVIDIA's CUDA forward compatibility (https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html):
# on data center GPUs, a driver of a Long Term Support Branch runs a newer CUDA with the cuda-compat-<major>-<minor>
# package, "generated from the NVIDIA driver that matches with the CUDA release" (its own floor: that driver).
_FORWARD_COMPAT_PLATFORMS = ("linux-x86_64", "linux-aarch64")


def _forward_compat(
    kb: KnowledgeBase, gpus: Sequence[Gpu], driver: str, build: Build, platform: Platform
) -> Reason | None:
    branch = kb.branch_of(driver)
    if (
        build.cuda is None
        or platform.id not in _FORWARD_COMPAT_PLATFORMS
        or branch is None
        or not branch.lts
        or not gpus
        or any(g.segment != "datacenter" for g in gpus)
    ):
        return None
    tk = kb.toolkit(build.cuda)
    major, minor = [*build.cuda.split("."), "0"][:2]
    return Reason(
        "driver_forward_compat",
        Severity.CAVEAT,
        f"driver {driver} (R{branch.branch}, a Long Term Support Branch) is older than CUDA {build.cuda} needs "
        f"({tk.min_driver}); on data center GPUs NVIDIA's forward compatibility runs it with the "
        f"cuda-compat-{major}-{minor} package, whose libcuda comes from driver {tk.min_driver} (put "
        f"/usr/local/cuda/compat on LD_LIBRARY_PATH): install it, or upgrade the driver to {tk.min_driver} or newer",
    )


def jetpack_for(
    kb: KnowledgeBase, gpus: Sequence[Gpu], driver: str | None, platform: Platform
) -> JetPack | None:
    """The JetPack asked for, else the one the driver number names, else JetPack 7 for a Thor (it runs no other)."""
    if platform.jetpack:
        return kb.jetpack(platform.jetpack)
    if driver is not None:
        found = kb.jetpack_for_driver(driver)
        if found:
            return found
    if gpus and all(g.compute_capability == "11.0" for g in gpus):
        return kb.jetpack("7")
    return None


def _jetson_wheels_reasons(gpus: Sequence[Gpu], build: Build, jetpack: JetPack | None) -> list[Reason]:
    which = (
        f"JetPack {jetpack.version} (CUDA {jetpack.max_cuda})"
        if jetpack
        else "this JetPack (pass --platform jetson7 for JetPack 7)"
    )
    return [
        Reason(
            "embedded_platform",
            Severity.FAIL,
            f"{gpu.name} on {which}: PyTorch comes from NVIDIA's JetPack builds, not torch {build.label} "
            f"(download.pytorch.org has no wheel for the Jetson's integrated GPU before JetPack 7)",
            gpu.name,
        )
        for gpu in gpus
    ]


def _remark_reasons(build: Build) -> list[Reason]:
    out = []
    for code, text in build.remarks:
        if code in ("pypi_default_not_confirmed", "nightly_channel"):
            out.append(Reason(code, Severity.INFO, text))
        elif code == "arch_list_not_confirmed" and build.variant.is_cpu:
            continue
        else:  # a pre-release, or kernels taken from another platform's wheel: a caveat until confirmed
            out.append(Reason(code, Severity.CAVEAT, text))
    return out


def _ptxas_reason(kb: KnowledgeBase, gpu: Gpu, build: Build) -> Reason | None:
    gap = kb.ptxas_gap(gpu, build.release, prerelease=bool(build.prerelease)) if build.cuda else None
    if gap is None:
        return None
    which = (
        f"torch {build.release.version}'s Triton ({gap.triton}) bundles the ptxas of CUDA {gap.ptxas}"
        if gap.certain
        else f"a {build.prerelease} build may carry an older Triton than the release's, or one without its "
        f"Blackwell ptxas (Triton {gap.triton}, ptxas of CUDA {gap.ptxas})"
    )
    fails = "torch.compile fails" if gap.certain else "torch.compile may fail"
    return Reason(
        "compile_ptxas_unsupported",
        Severity.CAVEAT,
        f"{gpu.name} ({gpu.compute_capability}): eager mode runs, but {fails}: {which}, which does not know "
        f"{gap.target} (\"ptxas fatal : Value '{gap.target}' is not defined for option 'gpu-name'\"); "
        f"workaround: {gap.workaround}",
        gpu.name,
    )


def _unconfirmed_kernels(kb: KnowledgeBase, gpu: Gpu, build: Build, arch: Reason) -> Reason:
    """A missing kernel in a stand-in arch list (another platform's wheel) is not a confirmed failure when the
    build's CUDA can build for the GPU: say so instead of failing. When it cannot (CUDA 12.x and Thor's 11.0),
    no wheel of that CUDA has the kernels, and the failure stands."""
    if arch.code != "arch_not_covered" or build.arch_confirmed or build.cuda is None:
        return arch
    if gpu.compute_capability not in kb.toolkit(build.cuda).compute_capabilities:
        if build.variant.arch_list:
            return arch
        return Reason(
            "arch_not_covered",
            Severity.FAIL,
            f"{gpu.name} ({gpu.sm}) cannot run torch {build.label}: CUDA {build.cuda} cannot build kernels for "
            f"compute capability {gpu.compute_capability}",
            gpu.name,
        )
    return Reason(
        "arch_not_confirmed",
        Severity.CAVEAT,
        f"{gpu.name} ({gpu.compute_capability}): the kernels of torch {build.label}'s {build.platform} wheel are "
        + (
            f"not confirmed and the Linux x86_64 list standing in for them has none for {gpu.sm}; "
            if build.variant.arch_list
            else "not in torchrig's data; "
        )
        + f"CUDA {build.cuda} can build for it: after installing, check that torch.cuda.get_arch_list() lists "
        f"{gpu.sm}",
        gpu.name,
    )


def _cpu_reason(gpu: Gpu, build: Build, platform: Platform) -> Reason:
    why = ""
    if build.is_pypi_default and platform.id != "linux-x86_64":
        why = f" (it is what PyPI serves {platform.label} for torch {build.release.version})"
    return Reason(
        "cpu_only_build",
        Severity.FAIL,
        f"torch {build.label} is a CPU-only build{why}: it runs on the CPU only "
        f"(torch.cuda.is_available() is False), {gpu.name} goes unused",
        gpu.name,
    )


def evaluate(
    kb: KnowledgeBase,
    gpus: Sequence[Gpu],
    driver: str | None,
    build: Build,
    platform: Platform | None = None,
) -> tuple[list[Reason], DriverSupportKind | None]:
    """The reasons (no fixes) for one build on ``platform`` (default: the build's): the building block of
    check, resolve and matrix."""
    plat = platform or Platform(build.platform)
    reasons: list[Reason] = []
    jetpack = jetpack_for(kb, gpus, driver, plat) if plat.id == "jetson" else None
    if plat.id == "jetson" and (jetpack is None or jetpack.torch != "sbsa"):
        # JetPack 5/6: Jetson modules run NVIDIA's JetPack wheels
        # (https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-platform/), not these.
        return _jetson_wheels_reasons(gpus, build, jetpack), None
    driver_kind = None
    if driver is not None:
        reasons, driver_kind = _driver_reasons(kb, gpus, driver, build, plat, jetpack)
    else:
        reasons.append(
            Reason(
                "driver_not_checked",
                Severity.INFO,
                "no --driver given: only the GPU architecture was checked against the build",
            )
        )
    if jetpack is not None and any(g.compute_capability != "11.0" for g in gpus):
        # The cited JetPack 7 reports are all Thor's; that other modules run the SBSA wheels there is not confirmed.
        reasons.append(
            Reason(
                "jetpack_support_not_confirmed",
                Severity.CAVEAT,
                f"that {', '.join(g.name for g in gpus if g.compute_capability != '11.0')} runs the aarch64 (SBSA) "
                f"wheels on JetPack {jetpack.version} is not confirmed (the reports behind JetPack 7 are Thor's)",
            )
        )
    reasons += _remark_reasons(build)
    for gpu in gpus:
        if build.variant.is_cpu:
            reasons.append(_cpu_reason(gpu, build, plat))
            continue
        arch = _unconfirmed_kernels(kb, gpu, build, _arch_reason(kb, gpu, build, driver_kind))
        reasons.append(arch)
        if not arch.severity.blocks:
            reasons += _library_floor_reasons(kb, gpu, build)
        ptxas = _ptxas_reason(kb, gpu, build) if not arch.severity.blocks else None
        if ptxas:
            reasons.append(ptxas)
    return reasons, driver_kind


def platform_for(gpus: Sequence[Gpu], platform: Platform | None) -> tuple[Platform, str | None]:
    """The platform to judge on: a Jetson GPU means Jetson whatever the host; else ``platform`` (default x86_64)."""
    plat = platform or Platform()
    if gpus and any(g.segment == "embedded" for g in gpus) and plat.id != "jetson":
        return Platform(
            "jetson"
        ), f"{gpus[0].name} is a Jetson module: judged for --platform jetson, not {plat.label}"
    return plat, None


def infer_platform(
    gpus: Sequence[Gpu], given: Platform | None, here: Platform
) -> tuple[Platform, str | None]:
    """``--platform`` when given; else, when every GPU that exists on one kind of host only (Grace Hopper, Grace
    Blackwell, DGX Spark: ``host_platform`` in gpus.toml) names the same one and this machine is not of that
    kind, that platform, with a note saying it was inferred; else this machine's."""
    if given is not None:
        return given, None
    hosts = {g.host_platform for g in gpus if g.host_platform}
    if len(hosts) != 1:
        return here, None
    (only,) = hosts
    if here.id == only or here.arch_platform == only:
        return here, None
    gpu = next(g for g in gpus if g.host_platform == only)
    return Platform(only), (
        f"{gpu.name} exists only on {only} hosts: judged for --platform {only} (inferred, not this machine's "
        f"{here.label}; pass --platform to say otherwise)"
    )


def _library_floor_reasons(kb: KnowledgeBase, gpu: Gpu, build: Build) -> list[Reason]:
    """A library the wheel bundles (cuDNN 9) supports fewer GPUs than the wheel's kernels (cuda.toml
    [[library_floor]]): the GPU runs torch's kernels, and that library's calls fail on it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    out = []
    for floor in kb.library_floors:
        bundled = build.variant.cudnn if floor.library == "cuDNN" else None
        if bundled is None:
            continue
        try:
            within = Version(bundled) in SpecifierSet(floor.versions)
        except InvalidVersion:
            continue
        if within and gpu.cc < V.parse_cc(floor.min_compute_capability):
            out.append(
                Reason(
                    "library_floor",
                    Severity.CAVEAT,
                    f"{gpu.name} ({gpu.compute_capability}) runs torch {build.label}'s kernels, but the {floor.library} "
                    f"{bundled} it bundles needs compute capability {floor.min_compute_capability} or newer: "
                    f"{floor.library} calls (convolutions, attention) fail; {floor.workaround}",
                    gpu.name,
                )
            )
    return out
