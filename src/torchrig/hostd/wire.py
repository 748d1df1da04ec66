"""Records back from JSON: the inverse of :func:`torchrig.report.jsonable` for the frozen dataclasses the
daemon sends (an ``UpResult`` with its plan, ``EnvRecord``, ``Lease``), driven by their type hints."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def from_jsonable(cls: type[T], data: Any) -> T:
    """``cls`` rebuilt from ``jsonable(obj)``; a value of the wrong shape is a ValueError."""
    return typing.cast(T, _build(cls, data))


def _build(tp: Any, data: Any) -> Any:
    if tp is Any or tp is object:
        return data
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if data is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _build(option, data)
            except (ValueError, TypeError, KeyError):
                continue
        raise ValueError(f"{data!r} fits none of {tp}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise ValueError(f"expected a list for {tp}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], x) for x in data)
        if len(args) != len(data):
            raise ValueError(f"expected {len(args)} items for {tp}")
        return tuple(_build(a, x) for a, x in zip(args, data, strict=True))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return [_build(arg, x) for x in data]
    if origin is dict:
        _k, v = typing.get_args(tp)
        if not isinstance(data, dict):
            raise ValueError(f"expected an object for {tp}")
        return {str(k): _build(v, x) for k, x in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"expected an object for {tp.__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _build(hints[f.name], data[f.name]) for f in dataclasses.fields(tp) if f.name in data
        }
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if tp is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    if isinstance(tp, type) and not isinstance(data, tp):
        raise ValueError(f"expected {tp.__name__}, got {type(data).__name__}")
    return data
