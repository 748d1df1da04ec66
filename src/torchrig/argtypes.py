"""Bounded argparse types: every number a user types is finite and within a sane range, or a usage error.

``type=int`` accepts 10**30 (which overflows a C long in torch, Docker or a syscall later) and ``type=float``
accepts nan and inf (``nan <= 0`` is False, so ``--timeout nan`` passes every range check). These types
refuse such values where they enter, with argparse's one-line message (exit 2):

    parser.add_argument("--steps", type=int_in(1, MAX_COUNT))        # torchrig train: --steps must be 1 or
    parser.add_argument("--timeout", type=float_in(0.001, MAX_SECONDS))  #   more, got 0

``bound_numbers(parser)`` gives every remaining plain ``int``/``float`` option the default bounds, so an
option added later without a bound is still finite and fits a signed 64-bit integer.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import NoReturn

from torchrig.errors import UsageError

# Sane limits, far above any real use and far below what overflows a C integer or a timer.
MAX_SECONDS = 30 * 24 * 3600  # a timeout or wait of a month
MAX_PROCS = 4096  # ranks per node / GPUs per node
MAX_NODES = 100_000
MAX_COUNT = 10**9  # steps, batches, sizes, restarts
MAX_SEED = 2**32 - 1  # numpy's seeds are 32-bit; torch.manual_seed takes 64
INT64 = 2**63 - 1


def _int_text(text: str) -> int:
    return int(text.strip())  # over 4300 digits: Python's ValueError


def _num(x: float) -> str:
    if isinstance(x, int) and abs(x) >= 10**12:  # a 400-digit int: its digit count, never float(x) (overflow)
        digits = len(str(abs(x)))
        return f"a {digits}-digit number" if digits > 15 else f"{x:g}"
    return str(x) if isinstance(x, int) else f"{x:g}"


def _out_of_range(lo: float, hi: float, value: float, lo_open: bool = False) -> str:
    if value > hi:
        return f"must be at most {_num(hi)}, got {_num(value)}"
    if lo_open and lo == 0:
        return f"must be positive, got {_num(value)}"
    at_least = f"{_num(lo)} or more" if lo == 0 else f"at least {_num(lo)}"
    return f"must be {at_least}, got {_num(value)}"


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An integer ``lo <= n <= hi``."""

    def parse(text: str) -> int:
        n = _int_text(text)  # a ValueError: argparse's "invalid int value: 'x'"
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(_out_of_range(lo, hi, n))
        return n

    parse.__name__ = "int"
    parse.bounds = lo, hi  # type: ignore[attr-defined]  # a function attribute, read beside --help
    return parse


def float_in(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """A finite number ``lo <= x <= hi`` (``lo < x`` with ``lo_open``), never nan or inf."""

    def parse(text: str) -> float:
        x = float(text)  # a ValueError: argparse's "invalid float value: 'x'"
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text.strip()}")
        if not lo <= x <= hi or (lo_open and x == lo):
            raise argparse.ArgumentTypeError(_out_of_range(lo, hi, x, lo_open))
        return x

    parse.__name__ = "float"
    parse.bounds = lo, hi  # type: ignore[attr-defined]  # a function attribute, read beside --help
    return parse


def bound_numbers(parser: argparse.ArgumentParser) -> None:
    """Replace every plain ``type=int`` / ``type=float`` of ``parser`` (and its sub-commands) with the
    default bounds: an int that fits in 64 bits, a finite float."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                bound_numbers(sub)
        elif action.type is int:
            action.type = int_in(-INT64, INT64)
        elif action.type is float:
            action.type = float_in(-1e300, 1e300)


class TorchrigParser(argparse.ArgumentParser):
    """argparse that raises a one-line UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        # "argument --gpus/--nproc-per-node: must be 1 or more" reads better as "--gpus must be 1 or more"
        m = re.fullmatch(r"argument ([^\s:/]+)(?:/\S+)?: (must .*)", message)
        if m:
            message = f"{m.group(1)} {m.group(2)}"
        raise UsageError(f"{self.prog}: {message}", hint=f"see '{self.prog} --help'")
