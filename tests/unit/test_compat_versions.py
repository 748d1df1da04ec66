"""The strict version parser: well-formed versions parse; malformed ones are a one-line UsageError."""

from __future__ import annotations

import pytest

from torchrig.compat import versions as V
from torchrig.errors import InputError, UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("535.104.05", (535, 104, 5)),
        ("570.86", (570, 86)),
        ("580", (580,)),
        (" 550.54.14 ", (550, 54, 14)),
    ],
)
def test_driver_parses(text, expected):
    assert V.parse_driver(text) == expected


def test_driver_order_is_numeric():
    assert V.parse_driver("535.104.05") > V.parse_driver("535.54.03")
    assert V.parse_driver("570.26") < V.parse_driver("570.86.10")


@pytest.mark.parametrize("text", ["", "abc", "535.", "535.104.05.1", "v535", "535,104", "5", "535.1234"])
def test_malformed_driver_is_usage_error(text):
    with pytest.raises(UsageError) as e:
        V.parse_driver(text)
    assert not isinstance(e.value, InputError)
    assert "\n" not in e.value.one_line()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.8.0+cu126", ("2.8.0", "cu126")),
        ("2.8.0", ("2.8.0", None)),
        ("2.8", ("2.8.0", None)),
        ("2.8.0+CPU", ("2.8.0", "cpu")),
        ("torch==2.7.1+cu128", ("2.7.1", "cu128")),
    ],
)
def test_torch_build_parses(text, expected):
    assert V.parse_torch_build(text) == expected


@pytest.mark.parametrize(
    "text", ["2", "2.8.0+", "2.8.0+cuda12", "two.eight", "2.8.0-cu126", "2.08.0", "2.8.0+cu1"]
)
def test_malformed_torch_build(text):
    with pytest.raises(UsageError):
        V.parse_torch_build(text)


def test_arch_parse():
    assert V.parse_arch("sm_86") == V.Arch("sm", 8, 6)
    assert V.parse_arch("compute_120") == V.Arch("compute", 12, 0)
    assert V.parse_arch("sm_90a") == V.Arch("sm", 9, 0, "a")
    assert V.parse_arch("sm_100f").cc == (10, 0)
    with pytest.raises(UsageError):
        V.parse_arch("sm86")


def test_cc_parse():
    assert V.parse_cc("8.6") == (8, 6)
    assert V.parse_cc("12.0") == (12, 0)
    assert V.parse_cc("sm_120") == (12, 0)
    with pytest.raises(UsageError):
        V.parse_cc("8")


@pytest.mark.parametrize(
    ("spec", "yes", "no"),
    [
        (">=2.6", ["2.6.0", "2.10.0"], ["2.5.1"]),
        (">=2.5,<2.8", ["2.5.0", "2.7.1"], ["2.8.0", "2.4.1"]),
        ("==2.7.*", ["2.7.0", "2.7.1"], ["2.8.0"]),
        ("2.7", ["2.7.0", "2.7.1"], ["2.6.0"]),
        ("2.7.1", ["2.7.1"], ["2.7.0"]),
        ("~=2.6", ["2.6.0", "2.9.1"], ["2.5.1", "3.0.0"]),
        ("!=2.7.0", ["2.7.1"], ["2.7.0"]),
    ],
)
def test_spec(spec, yes, no):
    s = V.parse_spec(spec)
    assert all(s.admits(v) for v in yes)
    assert not any(s.admits(v) for v in no)


@pytest.mark.parametrize("spec", [">=", "=>2.6", ">=2.6,", "latest", ">2.6.*", "~=2"])
def test_malformed_spec(spec):
    with pytest.raises(UsageError):
        V.parse_spec(spec)


def test_python():
    assert V.parse_python("3.12") == "3.12"
    assert V.parse_python("3.12.4") == "3.12"
    for bad in ("3", "python3.12", "2.7.x", "3.12.4.1"):
        with pytest.raises(UsageError):
            V.parse_python(bad)
