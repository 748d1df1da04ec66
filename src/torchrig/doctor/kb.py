"""doctor's bridge to the compatibility engine (``torchrig.compat``): what the knowledge base says about the
probed driver, GPUs and installed build. Every call degrades to ``None`` when the KB cannot answer (an unknown
GPU name, a CUDA version the KB does not list), so a gap in the data never hides a finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Suggestion:
    label: str  # "2.9.1+cu128"
    pip_command: str
    why: str
    verdict: str  # "works" | "works_with_caveats"


def load() -> Any | None:
    try:
        from torchrig.compat import load_kb

        return load_kb()
    except Exception:  # a missing or broken KB must not stop the diagnosis
        return None


def find_gpus(kb: Any, names: list[str]) -> list[Any]:
    """The KB's records for these GPU names (as NVML/torch report them); unknown names are skipped."""
    found = []
    for name in names:
        try:
            found.append(kb.find_gpu(name))
        except Exception:
            continue
    return found


def driver_support(kb: Any, driver: str, cuda: str) -> Any | None:
    """``compat.rules.driver_cuda_support``: NATIVE / MINOR_COMPAT / UNSUPPORTED, with the floors."""
    try:
        from torchrig.compat.rules import driver_cuda_support

        return driver_cuda_support(kb, driver, cuda)
    except Exception:
        return None


def coverage(cc: str, arch_list: tuple[str, ...]) -> Any | None:
    """``compat.rules.arch_coverage``: CUBIN_EXACT / CUBIN_FORWARD / PTX_JIT / NOT_COVERED."""
    try:
        from torchrig.compat.rules import arch_coverage

        return arch_coverage(cc, list(arch_list))
    except Exception:
        return None


def suggest(
    kb: Any, gpu_names: list[str], driver: str | None, python: str | None = None
) -> Suggestion | None:
    """The build ``torchrig resolve`` picks for these GPUs and this driver (and Python), with its pip command."""
    if kb is None:
        return None
    gpus = find_gpus(kb, gpu_names)
    if not gpus:
        return None
    py = ".".join(python.split(".")[:2]) if python else None
    for attempt in (py, None):  # a Python the KB does not list must not lose the suggestion
        try:
            from torchrig.compat import resolve

            res = resolve(kb, gpus=gpus, driver=driver, python=attempt)
        except Exception:
            continue
        label = getattr(res.build, "label", str(res.build))
        verdict = getattr(res.verdict, "value", str(res.verdict))
        names = ", ".join(sorted({g.name for g in gpus}))
        why = f"torchrig resolve picks {label} for {names}" + (f" with driver {driver}" if driver else "")
        if verdict != "works":
            why += " (with caveats: run torchrig resolve for them)"
        return Suggestion(label, res.pip_command, why, verdict)
    return None
