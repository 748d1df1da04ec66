"""What an image spec targets when ``torchrig init`` is not told: the GPUs and driver given, else the ones found
here, else the CPU build. A pure function of the arguments and of what detection found, with the reason.

>>> choose_target([], None, "auto", LocalGpus(error="NVML: driver not loaded")).variant
'cpu'
>>> choose_target([], None, "auto", LocalGpus(("NVIDIA H100 80GB HBM3",) * 8, "550.54.15")).gpus
('NVIDIA H100 80GB HBM3',)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from torchrig.compat.host import LocalGpus


@dataclass(frozen=True)
class Target:
    gpus: tuple[str, ...]
    driver: str | None
    variant: str
    why: str


def choose_target(gpus: Sequence[str], driver: str | None, variant: str, local: LocalGpus | None) -> Target:
    """``gpus``/``driver``/``variant`` as given (``--gpu``, ``--driver``, ``--variant``); ``local``: what NVML
    found here (None: not looked, because the answer was given)."""
    if variant == "cpu":
        return Target((), None, "cpu", "--variant cpu: the CPU build (no GPU needed)")
    if gpus:
        said = f"--gpu {', '.join(gpus)}" + (
            f" and --driver {driver}" if driver else " (no --driver: any driver)"
        )
        return Target(tuple(gpus), driver, variant, f"from {said}")
    if local is not None and local.names:
        counts = Counter(local.names)
        found = ", ".join(f"{n}x {name}" for name, n in counts.items())
        chosen_driver = driver or local.driver
        return Target(
            tuple(counts),
            chosen_driver,
            variant,
            f"detected here with NVML: {found}, driver {local.driver}"
            + (f" (--driver {driver} used)" if driver else ""),
        )
    why = local.error if local is not None and local.error else "no NVIDIA GPU found"
    if variant != "auto":
        return Target(
            (), driver, variant, f"--variant {variant}, but no GPU given or found ({why}): pass --gpu"
        )
    return Target(
        (),
        None,
        "cpu",
        f"no GPU given and none found here ({why}): the CPU build; pass --gpu NAME --driver VERSION to target GPUs",
    )
