"""The one JSON-to-record reader (torchrig/jsonrecords.py): strict about kinds, one line naming the key."""

from __future__ import annotations

import dataclasses
import enum
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchrig.jsonrecords import Count, RecordError, structure


class Kind(str, enum.Enum):
    A = "a"
    B = "b"


@dataclasses.dataclass(frozen=True)
class Inner:
    x: int
    n: Count | None = None


@dataclasses.dataclass(frozen=True)
class Outer:
    a: int
    kind: Kind
    f: float
    s: str | None
    inner: tuple[Inner, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    pair: tuple[int, int] | None = None
    free: dict[str, object] | None = None


GOOD = {"a": 1, "kind": "a", "f": 2, "s": None}


def test_a_good_object_becomes_the_record_and_unknown_keys_are_ignored():
    data = GOOD | {
        "inner": [{"x": 1, "n": 3}],
        "env": {"K": "v"},
        "pair": [1, 2],
        "free": {"q": [1]},
        "new": 1,
    }
    got = structure(data, Outer, "o")
    assert got == Outer(1, Kind.A, 2.0, None, (Inner(1, 3),), {"K": "v"}, (1, 2), {"q": [1]})
    assert isinstance(got.f, float)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"a": "1"}, "o.a: expected an integer, got a string"),
        ({"a": True}, "o.a: expected an integer, got a boolean"),
        ({"a": 2**70}, "o.a: 1.18e+21 is out of range"),
        ({"kind": "c"}, "o.kind: 'c' is not one of 'a', 'b'"),
        ({"kind": 1}, "o.kind: expected a string, got 1"),
        ({"f": float("inf")}, "o.f: inf is out of range"),
        ({"inner": [{"x": 1}, {"x": "2"}]}, "o.inner[1].x: expected an integer, got a string"),
        ({"inner": "ab"}, "o.inner: expected a list, got a string"),
        ({"inner": [{"x": 1, "n": 70000}]}, "o.inner[0].n: 70000 is out of range (0 to 65536)"),
        ({"inner": [{"x": 1, "n": -1}]}, "o.inner[0].n: -1 is out of range (0 to 65536)"),
        ({"env": {"K": 3}}, "o.env['K']: expected a string, got 3"),
        ({"env": ["K"]}, "o.env: expected an object, got a list"),
        ({"pair": [1]}, "o.pair: expected a list of 2, got 1 item(s)"),
        ({"a": "1", "f": "2"}, "o.a: expected an integer, got a string (and 1 more)"),
    ],
)
def test_a_value_that_does_not_fit_is_one_line_naming_its_key(change, message):
    with pytest.raises(RecordError) as e:
        structure(GOOD | change, Outer, "o")
    assert str(e.value) == message


def test_a_missing_key_is_refused_unless_it_is_unknown_by_choice():
    with pytest.raises(RecordError, match=r"^o.a: missing$"):
        structure({k: v for k, v in GOOD.items() if k != "a"}, Outer, "o")
    with pytest.raises(RecordError, match=r"^o: expected an object, got a list$"):
        structure([GOOD], Outer, "o")
    lenient = structure({"a": 1, "f": 1.5}, Outer, "o", unknown={Kind: Kind.B})
    assert (lenient.kind, lenient.s) == (Kind.B, None)  # s takes None: unknown


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from([*GOOD, "inner", "env", "pair", "free"]), JSON))
def test_any_json_is_the_record_or_a_record_error(data):
    try:
        structure(data, Outer, "o")
    except RecordError as err:
        assert "\n" not in str(err) and str(err).startswith("o")


@dataclasses.dataclass(frozen=True)
class Spread:
    values: tuple[int | float, ...]


def test_a_number_field_keeps_an_integer_an_integer_and_refuses_what_is_no_number():
    got = structure({"values": [1665, 1845.5]}, Spread, "s")
    assert got.values == (1665, 1845.5) and type(got.values[0]) is int
    for bad, message in (
        (True, "s.values[0]: expected a number, got a boolean"),
        ("1", "s.values[0]: expected a number, got a string"),
        (2**70, "s.values[0]: 1.18e+21 is out of range"),
        (1e309, "s.values[0]: inf is out of range"),
    ):
        with pytest.raises(RecordError, match="^" + re.escape(message)):
            structure({"values": [bad]}, Spread, "s")
