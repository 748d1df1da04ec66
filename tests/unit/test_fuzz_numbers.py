"""Every numeric option of every command, found in the parsers themselves (an option added tomorrow is
checked tomorrow), given numbers no one should type: 400 digits, its negative, 1e400, nan, 2**63. Its type
either takes the value (then finite and within 64 bits) or refuses it with argparse's one-line message; the
whole command, run in a bounded child (tests/fuzzkit.py) with its --help example and a 400-digit value, ends
with exit 2 in one line, within the time limit, growing its memory by less than GROWTH_LIMIT_MIB and reading
less than READ_LIMIT_MIB."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit
from torchrig.argtypes import INT64
from torchrig.errors import UsageError

fuzzkit.preload()
SHAPES = fuzzkit.command_shapes()
HOSTILE = [
    "9" * 400,
    "-" + "9" * 400,
    "1e400",
    "-1e400",
    "nan",
    "inf",
    str(2**63),
    str(-(2**63) - 1),
    "1e-400",
]
GROWTH_LIMIT_MIB = 256
READ_LIMIT_MIB = 64
SIZE_OPTIONS = {("bench", "--max-size"), ("bench", "--min-size"), ("up", "--memory"), ("up", "--shm-size")}


def _numeric(prefix: tuple[str, ...], shape: fuzzkit.Shape):
    for act in shape.options:
        if getattr(act.type, "__name__", None) in ("int", "float"):
            yield prefix, act, shape
    for name, sub in shape.subparsers.items():
        yield from _numeric((*prefix, name), sub)


NUMERIC = [case for name, shape in SHAPES.items() for case in _numeric((name,), shape)]
IDS = [f"{' '.join(p)} {a.option_strings[-1]}" for p, a, _ in NUMERIC]


def test_the_commands_have_numeric_options():
    assert len(NUMERIC) > 50, IDS


@pytest.mark.parametrize("prefix,act,shape", NUMERIC, ids=IDS)
def test_a_numeric_option_takes_a_bounded_value_or_refuses_in_one_line(prefix, act, shape):
    for text in HOSTILE:
        try:
            value = act.type(text)
        except (ValueError, argparse.ArgumentTypeError, UsageError) as e:
            assert "\n" not in str(e)
            continue
        assert isinstance(value, (int, float)), (text, value)
        assert math.isfinite(value), (act.option_strings, text, value)
        if isinstance(value, int):
            assert abs(value) <= INT64, (act.option_strings, text, value)


def _argv(prefix: tuple[str, ...], shape: fuzzkit.Shape, flag: str, value: str) -> list[str]:
    # the option first: an example may end in "-- SCRIPT ARGS", which would make it the script's
    example = list(shape.examples[0]) if shape.examples else []
    return [*prefix, flag, value, *example]


FULL = [(p, a.option_strings[-1], s) for p, a, s in NUMERIC]
FULL += [((cmd,), flag, SHAPES[cmd]) for cmd, flag in sorted(SIZE_OPTIONS)]
NAMES = {(p, a.option_strings[-1]): a.option_strings for p, a, _ in NUMERIC}  # an alias's message: any name


@pytest.mark.parametrize("prefix,flag,shape", FULL, ids=[f"{' '.join(p)} {f}" for p, f, _ in FULL])
def test_a_400_digit_number_is_exit_2_in_one_line_within_bounds(prefix, flag, shape):
    out = fuzzkit.call(_argv(prefix, shape, flag, "9" * 400))
    fuzzkit.check(out)  # no exit 3, no traceback, no signal (time limit)
    assert out.code == 2, out.describe()
    names = NAMES.get((prefix, flag), [flag])
    assert out.err.count("\n") == 1 and any(n in out.err for n in names), out.describe()
    assert out.grew_kib is not None and out.grew_kib < GROWTH_LIMIT_MIB * 1024, out.describe()
    assert out.read_bytes is not None and out.read_bytes < READ_LIMIT_MIB << 20, out.describe()
