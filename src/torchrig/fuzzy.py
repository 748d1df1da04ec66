"""Closest valid choices for an unknown name, for one-line error messages."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.5) -> list[str]:
    """Return up to ``n`` choices closest to ``word`` (case-insensitive), best first.

    >>> closest("rtx 3909", ["RTX 3090", "RTX 3080", "A100"])
    ['RTX 3090', 'RTX 3080']
    """
    pool = list(dict.fromkeys(choices))
    lowered = {c.lower(): c for c in pool}
    hits = difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=cutoff)
    if not hits:  # substring fallback: "3090" -> "RTX 3090"
        hits = [c for c in lowered if word.lower() in c][:n]
    return [lowered[h] for h in hits]


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """``"did you mean: a, b?"`` or an empty string when nothing is close."""
    hits = closest(word, choices, n=n)
    return f"did you mean: {', '.join(hits)}?" if hits else ""
