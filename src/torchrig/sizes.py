"""Sizes as people type them (``512m``, ``16g``, ``4GiB``, ``4096``) read into bytes: one parser for every option
that takes a size (``up --memory``/``--shm-size``, ``bench --min-size``/``--max-size``).

Units are binary (powers of 1024) whether or not the ``i`` is written, as Docker reads ``--memory 16g``
(docker/go-units ``RAMInBytes``) and nccl-tests reads ``-b 1K``; case does not matter, the ``b`` is optional.
"""

from __future__ import annotations

import re

from torchrig.errors import UsageError

_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)", re.IGNORECASE)
_UNIT_BYTES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# a pebibyte: above any memory, shared memory or message size, far below a 64-bit overflow
MAX_SIZE_BYTES = 1 << 50


def parse_size(text: str, what: str = "size") -> int:
    """``"32g"``, ``"512m"``, ``"16GiB"``, ``"1.5K"``, ``"4096"`` -> bytes; ``what`` (the option) names the
    value in the one-line error.

    >>> parse_size("16GiB"), parse_size("512m", "--shm-size")
    (17179869184, 536870912)
    """
    m = _SIZE_RE.fullmatch((text or "").strip())
    if not m:
        raise UsageError(
            f"malformed {what} {text!r}",
            hint="expected a number of bytes with an optional binary unit, e.g. 4096, 512m, 16g or 4GiB",
        )
    number = m.group(1)
    if len(number.split(".")[0]) > 20:  # float() of 400 digits is inf: refuse before converting
        size_bytes = MAX_SIZE_BYTES + 1
    else:
        size_bytes = int(float(number) * _UNIT_BYTES[m.group(2).lower()])
    if size_bytes > MAX_SIZE_BYTES:
        raise UsageError(
            f"{what} {text[:40]!r} is more than {MAX_SIZE_BYTES >> 50} PiB", hint="use e.g. 1KiB, 512m or 16g"
        )
    if size_bytes < 1:
        raise UsageError(f"{what} {text!r} is below one byte", hint="use e.g. 1KiB, 512m or 16g")
    return size_bytes
