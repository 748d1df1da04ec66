"""Fuzz the argv of every torchrig command: exit 0, 1 or 2, never an internal error or a traceback, within a
bounded time and memory per call.

The commands, their options and the types of their values come from the argparse parsers themselves, and
the seeds from the examples in each command's --help: an option added tomorrow is fuzzed tomorrow.
Profiles: ``TORCHRIG_FUZZ_PROFILE=ci`` (the default: fixed examples, derandomized) or ``long`` (random, 1000
examples per command; ``TORCHRIG_FUZZ_EXAMPLES=N`` changes either count).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuzzkit  # noqa: E402
from torchrig.cli import COMMANDS  # noqa: E402

fuzzkit.register_profiles()
fuzzkit.preload()
SHAPES = fuzzkit.command_shapes()
PATHS = fuzzkit.corpus_paths()


def test_every_command_has_a_parser_and_examples():
    assert set(SHAPES) == set(COMMANDS)
    for name, shape in SHAPES.items():
        assert shape.options or shape.subparsers, name
    # the seeds are the --help examples: a command without any is fuzzed from its options alone
    with_examples = {
        n for n, s in SHAPES.items() if s.examples or any(x.examples for x in s.subparsers.values())
    }
    assert len(with_examples) >= len(COMMANDS) - 2, set(COMMANDS) - with_examples


@pytest.mark.parametrize("name", list(COMMANDS))
@given(data=st.data())
def test_argv_fuzz(name, data):
    argv = data.draw(fuzzkit.argv_strategy(name, SHAPES[name], PATHS), label="argv")
    fuzzkit.check(fuzzkit.call(argv))
