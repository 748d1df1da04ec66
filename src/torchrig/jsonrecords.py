"""The one way JSON becomes typed records: :func:`structure` reads parsed JSON into a frozen dataclass (nested
records, tuples, enums, ``X | None``, ``int | float``, string tables) through cattrs, and a value of the wrong shape is one
:class:`RecordError` naming where it is (``bench.json.meta.world_size: expected int, got '2'``).

The files themselves are read by :mod:`torchrig.inputfiles` alone (bounded size and depth, UTF-8, no NaN, a
regular file); this module turns what it parsed into records. The rules are stricter than cattrs' defaults,
because a file is input: a number is never a string or a bool, a list is never a string or an object, a float
is finite, an integer fits in 64 bits (and a ``Count`` in 0..65536: it sizes loops and tables). Keys a record
does not know are ignored (a newer writer). A missing key is refused, unless the record has a default; with
``unknown=`` (records of probed facts, written by older probes) a missing key is unknown instead: ``None``
where the field takes it, or the value ``unknown`` gives for its type. A record whose file format differs
from its fields declares the format as a dataclass in ``JSON_SHAPE`` (a ClassVar) and converts it in
``from_shape``: the format is read, then converted.

cattrs is imported by the first call only: ``torchrig --help`` and ``check`` never read a record file.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

T = TypeVar("T")

MAX_INT = 2**63  # no count, size or id torchrig writes is larger; past it a float overflows later
COUNT = "count"  # Annotated[int, COUNT]: a count that sizes loops and tables
Count = Annotated[int, COUNT]
MAX_COUNT = 65536


class RecordError(ValueError):
    """A JSON value that does not fit the record: one line, with the path of the first offending key."""


def structure(data: Any, cls: type[T], where: str, *, unknown: Mapping[type, Any] | None = None) -> T:
    """``data`` (parsed JSON) as a ``cls``; a :class:`RecordError` naming ``where``'s offending key otherwise.

    ``unknown``: a missing key (one an older writer did not know) is unknown rather than an error: ``None``
    where the field accepts it, else ``unknown[its type]``."""
    import cattrs

    conv = _converter(tuple((unknown or {}).items()) if unknown is not None else None)
    try:
        return typing.cast(T, conv.structure(data, cls))
    except cattrs.BaseValidationError as err:
        raise RecordError(_one_line(err, where)) from None
    except (ValueError, TypeError, KeyError) as err:  # a record's own __post_init__ refusing a value
        raise RecordError(f"{where}: {_reason(err)}") from None


def _one_line(err: Exception, where: str) -> str:
    import cattrs

    lines = cattrs.transform_error(err, path=where, format_exception=lambda e, _t: _reason(e))
    first, rest = lines[0], len(lines) - 1
    reason, _, path = first.rpartition(" @ ")
    return f"{path}: {reason}" + (f" (and {rest} more)" if rest else "")


def _reason(err: BaseException) -> str:
    if isinstance(err, KeyError):
        return "missing"
    return str(err) or type(err).__name__


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"{value!r:.40}"
    )


def _expected(what: str, value: Any) -> TypeError:
    return TypeError(f"expected {what}, got {_kind(value)}")


def _enum(value: Any, tp: Any) -> Any:
    try:
        return tp(value)
    except ValueError:
        known = ", ".join(repr(m.value) for m in tp)
        raise ValueError(f"{value!r:.40} is not one of {known}") from None


def _int(value: Any, tp: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _expected("an integer", value)
    if abs(value) > MAX_INT:
        raise ValueError(f"{value:.3g} is out of range")
    return _enum(value, tp) if isinstance(tp, type) and issubclass(tp, enum.Enum) else value


def _count(value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{value} is out of range (0 to {MAX_COUNT})")


def _float(value: Any, _: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _expected("a number", value)
    if (isinstance(value, int) and abs(value) > MAX_INT) or not math.isfinite(value):
        raise ValueError(f"{value!r:.40} is out of range")
    return float(value)


def _str(value: Any, tp: Any) -> str:
    if not isinstance(value, str):
        raise _expected("a string", value)
    return value if tp is str else _enum(value, tp)  # a str-valued enum (its value checked)


def _is_number(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and set(typing.get_args(tp)) == {
        int,
        float,
    }


def _number(value: Any, _: Any) -> int | float:
    """``int | float``: a JSON number as written (an integer stays one), with the rules of each."""
    return (
        _int(value, int) if isinstance(value, int) and not isinstance(value, bool) else _float(value, float)
    )


def _bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise _expected("true or false", value)
    return value


def _is_sequence(tp: Any) -> bool:
    return typing.get_origin(tp) in (tuple, list)


def _is_mapping(tp: Any) -> bool:
    return typing.get_origin(tp) is dict


def _sequence_hook(conv: Any, tp: Any) -> Callable[[Any, Any], Any]:
    from cattrs import BaseValidationError, IterableValidationError
    from cattrs.errors import IterableValidationNote

    args = typing.get_args(tp)
    homogeneous = typing.get_origin(tp) is list or (len(args) == 2 and args[1] is Ellipsis)
    make = tuple if typing.get_origin(tp) is tuple else list

    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, list):
            raise _expected("a list", value)
        if not homogeneous and len(value) != len(args):
            raise ValueError(f"expected a list of {len(args)}, got {len(value)} item(s)")
        out: list[Any] = []
        errors: list[Exception] = []
        for i, item in enumerate(value):
            inner = args[0] if homogeneous else args[i]
            try:
                out.append(conv.structure(item, inner))
            except (ValueError, TypeError, KeyError, BaseValidationError) as err:
                errors.append(_noted(err, IterableValidationNote(f"@ index {i}", i, inner)))
        if errors:
            raise IterableValidationError(f"while reading {tp}", errors, tp)
        return make(out)

    return hook


def _mapping_hook(conv: Any, tp: Any) -> Callable[[Any, Any], Any]:
    from cattrs import BaseValidationError, IterableValidationError
    from cattrs.errors import IterableValidationNote

    _key, inner = typing.get_args(tp) or (str, Any)

    def hook(value: Any, _: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _expected("an object", value)
        out: dict[str, Any] = {}
        errors: list[Exception] = []
        for k, item in value.items():
            try:
                out[k] = item if inner in (Any, object) else conv.structure(item, inner)
            except (ValueError, TypeError, KeyError, BaseValidationError) as err:
                errors.append(_noted(err, IterableValidationNote(f"@ {k!r}", k, inner)))
        if errors:
            raise IterableValidationError(f"while reading {tp}", errors, tp)
        return out

    return hook


def _noted(err: Exception, note: str) -> Exception:
    """``err`` with a note saying where it was (cattrs' validation notes: ``transform_error`` reads them)."""
    err.__notes__ = [*getattr(err, "__notes__", []), note]  # type: ignore[attr-defined]  # add_note on 3.10 too
    return err


def _accepts_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _record_hook(conv: Any, cls: type, unknown: dict[type, Any] | None) -> Callable[[Any, Any], Any]:
    shape = getattr(cls, "JSON_SHAPE", None)
    if shape is not None:  # a record written in another shape (a format kept stable): read as that, converted
        read = conv.get_structure_hook(shape)
        return lambda value, _: cls.from_shape(read(value, shape))  # type: ignore[attr-defined]
    from cattrs.errors import AttributeValidationNote, ClassValidationError
    from cattrs.gen import make_dict_structure_fn

    base: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, conv)
    hints = typing.get_type_hints(cls, include_extras=True)
    # cattrs reads the fields' types without Annotated: the counts are checked here, by name
    counts = [f.name for f in dataclasses.fields(cls) if hints[f.name] in (Count, Count | None)]
    fill: dict[str, Any] = {}
    if unknown is not None:
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if _accepts_none(hints[f.name]):
                    fill[f.name] = None
                elif hints[f.name] in unknown:
                    fill[f.name] = unknown[hints[f.name]]

    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise _expected("an object", value)
        for name in counts:
            try:
                _count(value.get(name))
            except ValueError as err:
                note = AttributeValidationNote(f"@ attribute {name}", name, hints[name])
                raise ClassValidationError(
                    f"while reading {cls.__name__}", [_noted(err, note)], cls
                ) from None
        missing = {k: v for k, v in fill.items() if k not in value}
        return base({**value, **missing} if missing else value, cls)

    return hook


@functools.lru_cache(maxsize=8)
def _converter(unknown: tuple[tuple[type, Any], ...] | None) -> Any:
    import cattrs

    conv = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    # by class (singledispatch): a str- or int-valued enum reaches its base's hook, which checks the kind
    for tp, hook in ((int, _int), (float, _float), (str, _str), (bool, _bool), (enum.Enum, _enum)):
        conv.register_structure_hook(tp, hook)
    conv.register_structure_hook_func(lambda t: t is Any or t is object, lambda v, _: v)
    conv.register_structure_hook_func(_is_number, _number)
    conv.register_structure_hook_factory(_is_sequence, lambda tp: _sequence_hook(conv, tp))
    conv.register_structure_hook_factory(_is_mapping, lambda tp: _mapping_hook(conv, tp))
    table = dict(unknown) if unknown is not None else None
    conv.register_structure_hook_factory(
        lambda t: isinstance(t, type) and dataclasses.is_dataclass(t),
        lambda cls: _record_hook(conv, cls, table),
    )
    return conv
