"""doctor's bridge to the compatibility engine (``torchrig.compat``): what the knowledge base says about the
probed driver, GPUs and installed build. A question the knowledge base cannot answer from its data (an
unknown GPU name, a CUDA version it does not list, a malformed version in the facts, a damaged data file)
degrades to ``None``: ``torchrig.compat`` says so with a :class:`~torchrig.errors.TorchrigError`, and a gap in
the data never hides a finding. Any other exception is a bug in torchrig and is not caught here: it reaches
the CLI's internal-error handler (exit 3, "rerun with --debug and report it") through ``run_checks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchrig.errors import TorchrigError


@dataclass(frozen=True)
class Suggestion:
    label: str  # "2.9.1+cu128"
    pip_command: str
    why: str
    verdict: str  # "works" | "works_with_caveats"


def load() -> Any | None:
    """The knowledge base, or None when its data files are damaged (the report then says so)."""
    from torchrig.compat import load_kb

    try:
        return load_kb()
    except TorchrigError:  # a damaged installation must not stop the diagnosis
        return None


def preload() -> None:
    """:func:`load`, for a background thread that warms the per-process cache while the probes run. What it
    raises is dropped there (a thread's exception would print a traceback and reach no handler); a check that
    needs the knowledge base calls :func:`load` again on the main thread, where the same error is raised."""
    try:
        load()
    except Exception:  # raised again on the main thread by the check that needs the KB
        return


def find_gpus(kb: Any, names: list[str]) -> list[Any]:
    """The KB's records for these GPU names (as NVML/torch report them); unknown names are skipped."""
    found = []
    for name in names:
        try:
            found.append(kb.find_gpu(name))
        except TorchrigError:  # unknown or ambiguous name
            continue
    return found


def driver_support(kb: Any, driver: str, cuda: str) -> Any | None:
    """``compat.rules.driver_cuda_support``: NATIVE / MINOR_COMPAT / UNSUPPORTED, with the floors."""
    from torchrig.compat.rules import driver_cuda_support

    try:
        return driver_cuda_support(kb, driver, cuda)
    except TorchrigError:  # a CUDA the KB does not list, a malformed version
        return None


def coverage(cc: str, arch_list: tuple[str, ...]) -> Any | None:
    """``compat.rules.arch_coverage``: CUBIN_EXACT / CUBIN_FORWARD / PTX_JIT / NOT_COVERED."""
    from torchrig.compat.rules import arch_coverage

    try:
        return arch_coverage(cc, list(arch_list))
    except TorchrigError:  # a malformed compute capability or arch name
        return None


def suggest(
    kb: Any, gpu_names: list[str], driver: str | None, python: str | None = None
) -> Suggestion | None:
    """The build ``torchrig resolve`` picks for these GPUs and this driver (and Python), with its pip command."""
    from torchrig.compat import resolve

    if kb is None:
        return None
    gpus = find_gpus(kb, gpu_names)
    if not gpus:
        return None
    py = ".".join(python.split(".")[:2]) if python else None
    for attempt in (py, None):  # a Python the KB does not list must not lose the suggestion
        try:
            res = resolve(kb, gpus=gpus, driver=driver, python=attempt)
        except TorchrigError:  # no build fits, a Python or driver the KB cannot read
            continue
        label = getattr(res.build, "label", str(res.build))
        verdict = getattr(res.verdict, "value", str(res.verdict))
        names = ", ".join(sorted({g.name for g in gpus}))
        why = f"torchrig resolve picks {label} for {names}" + (f" with driver {driver}" if driver else "")
        if verdict != "works":
            why += " (with caveats: run torchrig resolve for them)"
        return Suggestion(label, res.pip_command, why, verdict)
    return None
