"""Every numeric option's --help says what its parser enforces.

Each option whose type is one of argtypes' bounded types carries its bounds (``type.bounds``); its help text
must agree: a range it states ("1 to 3600", "0..65535") is the enforced one, a "0: off" or "0 picks" is a
value the type accepts, and its default lies within the bounds. A help that states a range on an option of a
plain type (no bounds) fails too.
"""

from __future__ import annotations

import argparse
import re

import pytest

import torchrig.cli as cli

# "1 to 3600", "0..65535": two plain numbers (a range over a name, "0..nnodes-1", is checked elsewhere)
_RANGE = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)\s*(?:to|\.\.)\s*(-?\d+(?:\.\d+)?)(?![\w.-])")
# "0: off", "0 = CPU", "0 picks a free one", "(0; ...": zero is a documented value
_ZERO = re.compile(r"(?<![\w.])0(?:\s*[:=]|\s+picks|;)")


def _options():
    for name in cli.COMMANDS:
        parser, _ = cli.build_parser(name)
        stack = [(name, parser)]
        while stack:
            prog, p = stack.pop()
            for action in p._actions:
                if isinstance(action, argparse._SubParsersAction):
                    stack.extend((f"{prog} {k}", sub) for k, sub in action.choices.items())
                elif action.option_strings and action.help not in (None, argparse.SUPPRESS):
                    yield f"{prog} {action.option_strings[-1]}", action


OPTIONS = sorted(_options(), key=lambda x: x[0])


def test_numeric_options_are_found():
    interval = dict(OPTIONS)["dashboard --interval"]
    assert _RANGE.findall(interval.help) == [("1", "3600")]  # the range the test compares
    assert _ZERO.search(dict(OPTIONS)["dashboard --port"].help)
    assert sum(1 for _, a in OPTIONS if hasattr(a.type, "bounds")) > 40


@pytest.mark.parametrize("label,action", OPTIONS, ids=[label for label, _ in OPTIONS])
def test_help_states_the_enforced_bounds(label, action):
    bounds = getattr(action.type, "bounds", None)
    stated = _RANGE.findall(action.help)
    if bounds is None:
        assert not stated, f"{label}: help states {stated} but the option's type enforces no bounds"
        return
    lo, hi = bounds
    for a, b in stated:
        assert (float(a), float(b)) == (lo, hi), (
            f"{label}: help says {a} to {b}, the parser enforces {lo} to {hi}"
        )
    if _ZERO.search(action.help):
        assert lo <= 0 <= hi, f"{label}: help documents 0, the parser refuses it (bounds {lo} to {hi})"
    default = action.default
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        assert lo <= default <= hi, f"{label}: default {default} outside the enforced {lo} to {hi}"


@pytest.mark.parametrize("value", ["0.5", "3601", "nan", "-inf", "1" + "0" * 400])
def test_dashboard_interval_outside_its_documented_range_is_exit_2(value, capsys):
    assert cli.main(["dashboard", "--once", f"--interval={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchrig: error: ") and "--interval must" in err and err.count("\n") == 1, err
