"""Pre-flight: can the image's PyTorch build run on this host's driver and the leased GPUs?

A pure function of the image's labels (written by ``torchrig image build``), the GPU inventory and the
knowledge base; it uses the compatibility engine's rules (``torchrig.compat.rules``), so ``up`` refuses
exactly what ``torchrig check`` would call a failure, with the reason and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchrig.contract import (
    LABEL_ARCH_LIST,
    LABEL_CUDA,
    LABEL_MIN_DRIVER,
    LABEL_NONE,
    LABEL_PTX,
    LABEL_TORCH,
    LABEL_UNKNOWN,
)
from torchrig.findings import Finding, Severity  # compatibility words: info, caveat, fail
from torchrig.runtime.inventory import Inventory, Unit

UNKNOWN = ("", LABEL_UNKNOWN, LABEL_NONE)  # label values that carry no fact


def _finding(code: str, severity: Severity, summary: str, fix: str | None = None) -> Finding:
    """The shared record (:class:`torchrig.findings.Finding`) with pre-flight's one-line fix."""
    return Finding(code, severity, summary, fix=(fix,) if fix else ())


def finding_json(f: Finding) -> dict[str, str | None]:
    """``up --json``'s pre-flight entry: ``{code, severity, summary, fix}`` (its fields since the start)."""
    return {"code": f.id, "severity": f.severity.value, "summary": f.summary, "fix": "; ".join(f.fix) or None}


@dataclass(frozen=True)
class Preflight:
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not any(f.severity.blocks for f in self.findings)

    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.severity.blocks]


def _split_archs(text: str) -> tuple[list[str], list[str]]:
    """``"sm_80 sm_90 compute_90"`` / ``"8.0;9.0+PTX"`` -> (cubins, ptx)."""
    cubins: list[str] = []
    ptx: list[str] = []
    for raw in text.replace(";", " ").replace(",", " ").split():
        item = raw.strip()
        if item.startswith("compute_"):
            ptx.append(item)
        elif item.startswith("sm_"):
            cubins.append(item)
        else:  # TORCH_CUDA_ARCH_LIST form: 9.0 or 9.0+PTX
            base, _, plus = item.partition("+")
            sm = "sm_" + base.replace(".", "")
            cubins.append(sm)
            if plus.upper() == "PTX":
                ptx.append(sm.replace("sm_", "compute_"))
    return cubins, ptx


def _driver_findings(kb: Any, driver: str, cuda: str, min_driver: str | None) -> list[Finding]:
    from torchrig.compat import versions as V
    from torchrig.compat.rules import DriverSupportKind, driver_cuda_support, max_native_cuda

    out: list[Finding] = []
    newest = max_native_cuda(kb, driver)
    other_tag = (
        f"use an image built for CUDA ≤ {newest} (torchrig image build with that CUDA, or another tag)"
        if newest
        else None
    )
    if min_driver and V.parse_driver(driver) < V.parse_driver(min_driver):
        out.append(
            _finding(
                "image_needs_newer_driver",
                Severity.FAIL,
                f"the image needs NVIDIA driver ≥ {min_driver} (its label {LABEL_MIN_DRIVER}); this host has {driver}",
                f"upgrade the host driver to ≥ {min_driver}" + (f", or {other_tag}" if other_tag else ""),
            )
        )
    ds = driver_cuda_support(kb, driver, cuda)
    if ds.kind is DriverSupportKind.UNSUPPORTED:
        if not out:
            out.append(
                _finding(
                    "driver_too_old",
                    Severity.FAIL,
                    f"the image's CUDA {cuda}: {ds.message}",
                    f"upgrade the host driver to ≥ {ds.min_driver}"
                    + (f", or {other_tag}" if other_tag else ""),
                )
            )
    elif ds.kind is DriverSupportKind.MINOR_COMPAT:
        out.append(
            _finding(
                "driver_minor_compat",
                Severity.CAVEAT,
                f"{ds.message}; {ds.caveat}",
                f"for full support upgrade the driver to ≥ {ds.min_driver}",
            )
        )
    else:
        out.append(_finding("driver_native", Severity.INFO, ds.message))
    return out


def _gpu_findings(
    kb: Any, inv: Inventory, units: tuple[Unit, ...], driver: str, archs: str | None
) -> list[Finding]:
    from torchrig.compat.rules import CoverageKind, arch_coverage, driver_supports_arch
    from torchrig.errors import InputError

    out: list[Finding] = []
    seen: set[str] = set()
    for u in units:
        gpu = inv.gpu(u.gpu_index)
        if gpu is None or gpu.name is None or gpu.name in seen:  # the inventory holds named GPUs only
            continue
        seen.add(gpu.name)
        try:
            known = kb.find_gpu(gpu.name)
        except InputError:
            known = None
        if known is not None:
            bs = driver_supports_arch(kb, driver, known)
            if not bs.ok:
                out.append(
                    _finding(
                        bs.code, Severity.FAIL, bs.message, "install a driver branch that supports this GPU"
                    )
                )
        cc = gpu.compute_capability or (known.compute_capability if known else None)
        if not archs or not cc:
            continue
        cubins, ptx = _split_archs(archs)
        cov = arch_coverage(cc, cubins, ptx)
        if cov.kind is CoverageKind.NOT_COVERED:
            out.append(
                _finding(
                    "arch_not_covered",
                    Severity.FAIL,
                    f"{gpu.name} (compute capability {cc}) has no kernels in the image: {cov.why}",
                    f"rebuild the image with sm_{cc.replace('.', '')} in its arch list, or use a build that has it",
                )
            )
        elif cov.kind is CoverageKind.PTX_JIT:
            out.append(_finding("arch_ptx_jit", Severity.CAVEAT, f"{gpu.name}: {cov.why} (slow first start)"))
    return out


def preflight(
    labels: Mapping[str, str], inv: Inventory, units: tuple[Unit, ...], kb_loader: Callable[[], Any]
) -> Preflight:
    """Findings for running an image with ``labels`` on ``units`` of ``inv``; FAIL findings refuse the start.

    ``kb_loader`` returns the knowledge base (``torchrig.compat.load_kb``); it is called only when needed."""
    if not units:
        return Preflight(())
    torch, cuda = labels.get(LABEL_TORCH), labels.get(LABEL_CUDA)
    if not torch and not cuda:
        return Preflight(
            (
                _finding(
                    "image_unlabelled",
                    Severity.CAVEAT,
                    f"the image has no {LABEL_TORCH}/{LABEL_CUDA} labels: its build was not checked "
                    "against this host",
                    "build it with 'torchrig image build' to get the labels",
                ),
            )
        )
    if cuda == "unknown":
        return Preflight(
            (
                _finding(
                    "image_cuda_unknown",
                    Severity.CAVEAT,
                    f"the image's torch {torch or '?'} has no known CUDA version: not checked",
                    None,
                ),
            )
        )
    if not cuda or cuda in ("cpu", "none"):
        return Preflight(
            (
                _finding(
                    "cpu_only_image",
                    Severity.FAIL,
                    f"the image's torch {torch or ''} is a CPU-only build: the GPUs would go unused",
                    "build the image with a CUDA variant (torchrig resolve names one)",
                ),
            )
        )
    driver = inv.driver_version
    if not driver:
        return Preflight(
            (
                _finding(
                    "no_driver",
                    Severity.FAIL,
                    f"no NVIDIA driver answered on this host ({inv.source})",
                    "install the NVIDIA driver (torchrig doctor says which), or leave --gpus out",
                ),
            )
        )
    kb = kb_loader()
    min_driver = labels.get(LABEL_MIN_DRIVER)
    findings = _driver_findings(kb, driver, cuda, None if min_driver in UNKNOWN else min_driver)
    archs = " ".join(
        v for v in (labels.get(LABEL_ARCH_LIST), labels.get(LABEL_PTX)) if v and v not in UNKNOWN
    )
    findings += _gpu_findings(kb, inv, units, driver, archs or None)
    return Preflight(tuple(findings))
