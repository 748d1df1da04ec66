"""``check`` for a torch version as the user gave it, with the source it came from: the one place that picks
between an NGC container's or conda-forge's build (:mod:`compat.channels`), NVIDIA's JetPack wheels or a Jetson
AI Lab index (:mod:`compat.sources`) and PyPI's or download.pytorch.org's (:func:`compat.check.check`). Those
modules build a :class:`~torchrig.compat.check.CheckResult`; this one sits above them all."""

from __future__ import annotations

from collections.abc import Sequence

from torchrig.compat import channels, sources
from torchrig.compat.check import CheckResult, check
from torchrig.compat.kb import Gpu, KnowledgeBase
from torchrig.compat.platforms import Platform


def check_text(
    kb: KnowledgeBase,
    gpus: Sequence[Gpu],
    driver: str | None,
    torch: str,
    index: str | None = None,
    platform: Platform | None = None,
) -> CheckResult:
    """``check`` for a version as the user gave it (``--torch``) and where it came from (``--index``, else
    inferred where certain): an NGC container's or conda-forge's build (``compat.channels``), NVIDIA's JetPack
    wheels or a Jetson AI Lab index (``compat.sources``), else PyPI's or download.pytorch.org's."""
    plat = platform or Platform()
    channel = channels.infer(torch, index, gpus, plat)
    if channel is not None:
        return channels.check_channel(kb, channel, gpus, driver, plat)
    sourced = sources.infer(kb, torch, index, gpus, driver, plat)
    if sourced is not None:
        return sources.check_sourced(kb, sourced, gpus, driver, plat)
    return check(kb, gpus=gpus, driver=driver, build=kb.find_build(torch, plat), platform=plat)
