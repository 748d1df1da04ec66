"""Records back from JSON: the inverse of :func:`torchrig.report.jsonable` for the frozen dataclasses the
daemon sends (an ``UpResult`` with its plan, ``EnvRecord``, ``Lease``), read through
:mod:`torchrig.jsonrecords` (the one JSON-to-record reader)."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def from_jsonable(cls: type[T], data: Any) -> T:
    """``cls`` rebuilt from ``jsonable(obj)``; a value of the wrong shape is a ValueError (a
    :class:`~torchrig.jsonrecords.RecordError` naming the key)."""
    from torchrig.jsonrecords import structure

    return structure(data, cls, cls.__name__)
