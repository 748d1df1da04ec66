"""The knowledge base: facts as data files with sources (TOML), loaded on demand.

Each file has a top-level ``schema_version`` and every row a ``source`` URL and a ``verified`` date.
``tests/unit/test_data_files.py`` loads every file and checks cross-references.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.cache
def load(name: str) -> dict[str, Any]:
    """Load ``torchrig/data/<name>.toml`` (cached)."""
    data_file = resources.files(__package__).joinpath(f"{name}.toml")
    text = data_file.read_text(encoding="utf-8")  # raw-read: package data
    return tomllib.loads(text)
