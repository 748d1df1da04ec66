"""The nightly channel's CUDA variants by date (``data/wheel_sources.toml``'s ``[[nightly]]`` rows): whether the
channel built ``cuXYZ`` on the day a nightly (``2.9.0.dev20250720+cu129``) names. A nightly is never refused for
it: in the channel that day is said, out of it is a caveat (a build from another channel, or a typo).

A nightly whose release line does not list its variant (the channel carried CUDA variants its release dropped, ran
ahead of the data, or predates it) is built here by :func:`nightly_by_cuda`: judged by its CUDA version itself, or as
a CPU build.

>>> channel_remark("2.9.0.dev20250720", "cu129")[0]
'nightly_channel'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from torchrig.compat import versions as V
from torchrig.compat.platforms import Platform
from torchrig.compat.records import PYTORCH_INDEX, Build, Release, Toolkit, Variant
from torchrig.errors import InputError


@dataclass(frozen=True)
class NightlyVariant:
    variant: str
    listed_from: str  # ISO date
    dropped: str | None  # ISO date; None: still listed when verified
    source: str
    dropped_source: str | None
    verified: str
    earlier_unknown: bool = False  # listed_from is the first date the source can tell, not the first listing


@functools.lru_cache(maxsize=1)
def load_nightly() -> tuple[NightlyVariant, ...]:
    from torchrig import data

    return tuple(
        NightlyVariant(
            r["variant"],
            str(r["listed_from"]),
            str(r["dropped"]) if "dropped" in r else None,
            r["source"],
            r.get("dropped_source"),
            str(r["verified"]),
            bool(r.get("earlier_unknown", False)),
        )
        for r in data.load("wheel_sources").get("nightly", [])
    )


def nightly_date(prerelease: str) -> str | None:
    """``"2.9.0.dev20250720"`` -> ``"2025-07-20"``; None when the version is not a dated nightly."""
    m = re.search(r"\.dev(\d{4})(\d{2})(\d{2})$", prerelease)
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}" if m else None


def channel_remark(prerelease: str, variant: str) -> tuple[str, str] | None:
    """A (code, text) remark on ``variant`` in the nightly channel on the nightly's date; None when the date or
    the variant is not in the data."""
    day = nightly_date(prerelease)
    row = next((r for r in load_nightly() if r.variant == variant), None)
    if day is None or row is None:
        return None
    until = f" until {row.dropped}" if row.dropped else ""
    if row.listed_from <= day and (row.dropped is None or day < row.dropped):
        return (
            "nightly_channel",
            f"the nightly channel built {variant} on {day} (listed from {row.listed_from}{until}; {row.source})",
        )
    if day < row.listed_from:
        if row.earlier_unknown:
            return None
        return (
            "nightly_channel_not_listed",
            f"the nightly channel's matrix did not list {variant} on {day} yet (from {row.listed_from}; "
            f"{row.source}): check where this build came from",
        )
    return (
        "nightly_channel_not_listed",
        f"the nightly channel dropped {variant} on {row.dropped}, before {day} ({row.dropped_source}): "
        "check where this build came from",
    )


def _channel_remarks(prerelease: str, variant: str) -> tuple[tuple[str, str], ...]:
    remark = channel_remark(prerelease, variant)
    return (remark,) if remark else ()


# ---------------------------------------------------------------- nightlies the release data does not cover


def nightly_by_cuda(
    releases: Sequence[Release], toolkits: Sequence[Toolkit], parsed: V.TorchBuildText, plat: Platform
) -> Build:
    """A nightly whose variant its release line does not list (nightly channels carried CUDA variants the
    release dropped, and run ahead of the knowledge base): judged by its CUDA version itself. Its kernels
    are unknown, so a GPU that CUDA cannot build for fails, and any other is a caveat to verify."""
    variant_name = parsed.variant or ""
    norm = V.normalise_release(parsed.release)
    # a line the data does not list has no PyPI build torchrig knows of (nightlies are not on PyPI)
    rel = next((r for r in releases if r.version == norm), None) or Release(
        norm, None, (), None, None, "", ()
    )
    if variant_name == "cpu":  # a CPU nightly of a line the data does not list: CPU-only all the same
        return _nightly_cpu(parsed, rel, plat)
    m = re.fullmatch(r"cu(\d+)(\d)", variant_name)
    if not m:
        raise InputError(
            f"torch {parsed.prerelease}+{variant_name}: only a CUDA nightly (+cuXYZ) can be judged without its "
            "release's data",
            hint="pass the CUDA variant, e.g. +cu128",
        )
    cuda = f"{int(m.group(1))}.{m.group(2)}"
    judged_cuda, newer = _cuda_or_newest_below(toolkits, cuda)
    variant = Variant(
        name=variant_name,
        cuda=judged_cuda,
        index_url=f"{PYTORCH_INDEX}/nightly/{variant_name}",
        arch_list=(),
        ptx=(),
        confirmed=False,
        source="https://download.pytorch.org/whl/nightly/",
    )
    remark = (
        f"{parsed.prerelease}+{variant_name} is a nightly whose kernels torchrig does not know: judged by CUDA "
        f"{cuda} itself (which GPUs it can build for); check torch.cuda.get_arch_list() after installing"
    )
    return Build(
        rel,
        variant,
        plat.id,
        arch_confirmed=False,
        prerelease=parsed.prerelease,
        remarks=(
            ("prerelease_build", remark),
            *newer,
            *_channel_remarks(parsed.prerelease or "", variant_name),
        ),
    )


def _nightly_cpu(parsed: V.TorchBuildText, rel: Release, plat: Platform) -> Build:
    variant = Variant(
        name="cpu",
        cuda=None,
        index_url=f"{PYTORCH_INDEX}/nightly/cpu",
        arch_list=(),
        ptx=(),
        confirmed=False,
        source="https://download.pytorch.org/whl/nightly/",
    )
    remark = (
        f"{parsed.prerelease}+cpu is a nightly of a release line torchrig's data does not list: a CPU-only "
        f"build all the same"
    )
    return Build(
        rel,
        variant,
        plat.id,
        arch_confirmed=False,
        prerelease=parsed.prerelease,
        remarks=(("prerelease_build", remark), *_channel_remarks(parsed.prerelease or "", "cpu")),
    )


def _cuda_or_newest_below(toolkits: Sequence[Toolkit], cuda: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``cuda`` when torchrig knows it; else (a nightly ahead of the data) the newest CUDA it knows below it,
    whose driver floor is a lower bound (floors grow with the version), with a remark saying so. A CUDA older
    than every one it knows is judged with the oldest it knows: its GPUs are an upper bound (an older nvcc
    builds for no newer GPU) and its driver floor too, so a driver below that floor is not a sure failure
    (``cuda_older_than_data``, which evaluate turns into a caveat)."""
    if any(t.version == cuda for t in toolkits):
        return cuda, ()
    below = [t for t in toolkits if V.parse_cuda(t.version) < V.parse_cuda(cuda)]
    if not below:
        oldest = min(toolkits, key=lambda t: V.parse_cuda(t.version)).version
        return oldest, (
            (
                "cuda_older_than_data",
                f"CUDA {cuda} is older than torchrig's data (which starts at CUDA {oldest}): judged with CUDA "
                f"{oldest}'s GPUs, an upper bound (CUDA {cuda} builds for no newer GPU); its driver floor is "
                f"not known, at most CUDA {oldest}'s",
            ),
        )
    stand_in = max(below, key=lambda t: V.parse_cuda(t.version)).version
    return stand_in, (
        (
            "cuda_not_in_data",
            f"CUDA {cuda} is newer than torchrig's data: judged with CUDA {stand_in}'s driver floor and "
            f"GPUs, a lower bound (CUDA {cuda} needs at least that driver); check nvidia-smi's CUDA version "
            f"is {cuda} or newer",
        ),
    )
