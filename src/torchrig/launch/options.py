"""``torchrig launch``'s numeric options, each declared once: flag, request field, bounds, default, help.

``launch``, ``train`` and ``cluster`` add them to their parsers from here (:meth:`IntOption.add_to`, with the
bounded type of :mod:`torchrig.argtypes`), :class:`~torchrig.launch.plan.LaunchRequest` and
:class:`~torchrig.cluster.job.ClusterJob` check a value given through the API against the same bounds
(:func:`check`), and ``cluster`` renders the per-node ``torchrig launch`` command line from them
(:func:`argv`), so a launch option a parser takes is one cluster can pass on.

>>> MAX_RESTARTS.check(-1)
Traceback (most recent call last):
...
torchrig.errors.UsageError: --max-restarts must be 0 or more, got -1
>>> argv({"collective_timeout_s": 60, "hang_timeout_s": None})
['--collective-timeout', '60']
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchrig.argtypes import MAX_SECONDS, int_in
from torchrig.errors import UsageError


@dataclass(frozen=True)
class IntOption:
    """One integer option of ``torchrig launch``: ``--flag`` sets the request's ``field``."""

    flag: str
    field: str  # LaunchRequest's (and ClusterJob's) field, and the argparse dest
    lo: int
    hi: int
    default: int
    help: str  # ends with the default in parentheses, as every help line says it
    metavar: str | None = "S"

    def check(self, value: int) -> None:
        """A one-line :class:`UsageError` when ``value`` is outside the bounds (argparse's wording)."""
        try:
            int_in(self.lo, self.hi)(str(value))
        except (argparse.ArgumentTypeError, ValueError) as err:
            raise UsageError(
                f"{self.flag} {err}", hint=f"see '{self.flag}' in 'torchrig launch --help'"
            ) from None

    def add_to(self, group: Any, *, default: bool = True) -> None:
        """Add ``--flag`` (dest ``field``); ``default=False``: left unset (None) when not given."""
        group.add_argument(
            self.flag,
            dest=self.field,
            type=int_in(self.lo, self.hi),
            default=self.default if default else None,
            metavar=self.metavar,
            help=self.help,
        )


RDZV_TIMEOUT = IntOption(
    "--rdzv-timeout", "rdzv_timeout_s", 1, MAX_SECONDS, 300, "seconds to wait for all nodes (300)"
)
MAX_RESTARTS = IntOption(
    "--max-restarts", "max_restarts", 0, 1000, 0, "restart the worker group this many times (0)", metavar="N"
)
COLLECTIVE_TIMEOUT = IntOption(
    "--collective-timeout",
    "collective_timeout_s",
    1,
    MAX_SECONDS,
    600,
    "process-group timeout for torchrig's trainer and pre-flight (600)",
)
HANG_TIMEOUT = IntOption(
    "--hang-timeout",
    "hang_timeout_s",
    0,
    MAX_SECONDS,
    0,
    "only if you ask: no rank output for S seconds = hang: dump stacks and flight records, stop, "
    "summarise (0: off; a job that logs only to TensorBoard is silent)",
)
NCCL_TIMEOUT_GRACE = IntOption(
    "--nccl-timeout-grace",
    "nccl_timeout_grace_s",
    0,
    MAX_SECONDS,
    30,
    "a rank's NCCL watchdog logged a collective timeout and the job still runs S s later = hang: "
    "dump stacks and flight records, stop, summarise (30; 0: leave it to PyTorch)",
)
STOPPED_GRACE = IntOption(
    "--stopped-grace",
    "stopped_grace_s",
    0,
    MAX_SECONDS,
    30,
    "a rank stopped by a signal (state T) for S s while another waits in a collective = hang: "
    "stop and summarise (30; 0: never)",
)

# Restarts and the options that decide when a job counts as hung: launch's "failures" group, train's too.
FAILURE_OPTIONS = (MAX_RESTARTS, COLLECTIVE_TIMEOUT, HANG_TIMEOUT, NCCL_TIMEOUT_GRACE, STOPPED_GRACE)
# Every option ``cluster`` passes on to ``torchrig launch`` on each node, in the order rendered.
LAUNCH_OPTIONS = (RDZV_TIMEOUT, *FAILURE_OPTIONS)


def check(values: Mapping[str, int | None], options: tuple[IntOption, ...] = LAUNCH_OPTIONS) -> None:
    """Check each option's value in ``values`` (by field; None: not given, launch's own default)."""
    for o in options:
        value = values.get(o.field)
        if value is not None:
            o.check(value)


def argv(values: Mapping[str, int | None], options: tuple[IntOption, ...] = LAUNCH_OPTIONS) -> list[str]:
    """``--flag VALUE`` for each option given in ``values`` (by field), in declaration order."""
    out: list[str] = []
    for o in options:
        value = values.get(o.field)
        if value is not None:
            out += [o.flag, str(value)]
    return out


def from_args(args: argparse.Namespace, options: tuple[IntOption, ...] = LAUNCH_OPTIONS) -> dict[str, Any]:
    """The request's keyword arguments for the options a parser took (its dests are the fields)."""
    return {o.field: getattr(args, o.field) for o in options if hasattr(args, o.field)}
