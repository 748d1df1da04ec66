"""The nightly channel's CUDA variants by date (``data/wheel_sources.toml``'s ``[[nightly]]`` rows): whether the
channel built ``cuXYZ`` on the day a nightly (``2.9.0.dev20250720+cu129``) names. A nightly is never refused for
it: in the channel that day is said, out of it is a caveat (a build from another channel, or a typo).

>>> channel_remark("2.9.0.dev20250720", "cu129")[0]
'nightly_channel'
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


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
