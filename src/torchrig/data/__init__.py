"""The knowledge base: facts as data files with sources (TOML, and JSON for generated tables), loaded on demand.

Each file has a top-level ``schema_version`` and every row a ``source`` URL and a ``verified`` date.
``tests/unit/test_data_files.py`` loads every file and checks cross-references.

Every data file torchrig ships (here, and ``doctor/data``) is read by :func:`packaged`, through the same
bounded TOML and JSON readers as the files users hand torchrig (``torchrig.inputfiles``), so a damaged
installation is one line naming the file, not a traceback.

>>> load("gpus")["schema_version"]
1
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any


def packaged(package: str, path: str) -> Any:
    """``path`` (``"data/fixes.toml"``) inside ``package`` (``"torchrig.doctor"``), parsed as TOML or JSON by
    its suffix; a missing, unreadable or malformed file is an InputError that names it."""
    from torchrig.errors import InputError
    from torchrig.inputfiles import decode_text, loads_json, loads_toml

    what, where = "torchrig's data file", f"{package}/{path}"
    try:
        raw = resources.files(package).joinpath(path).read_bytes()  # raw-read: package data
    except OSError as err:
        raise InputError(
            f"cannot read {what} {where!r}: {err.strerror or err}", hint="reinstall torchrig"
        ) from None
    text = decode_text(raw, what, where)
    return loads_json(text, what, where) if path.endswith(".json") else loads_toml(text, what, where)


@functools.cache
def load(name: str) -> dict[str, Any]:
    """``torchrig/data/<name>.toml``, parsed (once per process)."""
    doc: dict[str, Any] = packaged(__package__, f"{name}.toml")
    return doc


@functools.cache
def load_json(name: str) -> dict[str, Any]:
    """``torchrig/data/<name>.json``, parsed (once per process)."""
    doc: dict[str, Any] = packaged(__package__, f"{name}.json")
    return doc
