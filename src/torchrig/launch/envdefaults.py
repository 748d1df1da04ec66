"""Environment defaults every launched rank gets, each with its reason and source.

A value the user already exported wins: the launcher only fills what is unset (see ``plan.build_plan``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EnvDefault:
    name: str
    value: str
    reason: str
    source: str
    nccl_only: bool = False  # only meaningful when the ranks use NCCL (GPUs)
    # PyTorch renamed some settings: (the new name, the first torch release known to read it). From that release
    # on the launcher sets the new name (the old one still works there but logs a deprecation warning per rank)
    renamed: tuple[str, tuple[int, int]] | None = None

    def names(self) -> tuple[str, ...]:
        """Every name PyTorch reads this setting under."""
        return (self.name, self.renamed[0]) if self.renamed else (self.name,)

    def set_by(self, env: Mapping[str, str]) -> bool:
        """Whether ``env`` already holds this setting, under either name: then the user's value wins."""
        return any(n in env for n in self.names())


ENV_DEFAULTS: tuple[EnvDefault, ...] = (
    EnvDefault(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "1",
        "a failed or timed-out collective aborts the NCCL communicator and ends the process, so torchrun "
        "sees the failure (and can restart) instead of a silent hang",
        "https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html",
        nccl_only=True,
    ),
    EnvDefault(
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "2000",
        "keep the flight recorder of the last collectives so a timeout names the collective and sequence number",
        "https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html; the new name: torch 2.11 on "
        "2x H200 logged 'TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use TORCH_FR_BUFFER_SIZE instead' "
        "(tests/fixtures/launch/nccl-2rank-h200-rank1-sleeps-hang-watchdog), and torch 2.13's "
        "torch/csrc/distributed/c10d/FlightRecorder.hpp reads TORCH_FR_BUFFER_SIZE first",
        nccl_only=True,
        renamed=("TORCH_FR_BUFFER_SIZE", (2, 11)),
    ),
    EnvDefault(
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "1",
        "dump that flight record when the watchdog fires (torchrig launch puts it next to the rank logs)",
        "https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html",
        nccl_only=True,
    ),
    EnvDefault(
        "NCCL_DEBUG",
        "WARN",
        "NCCL prints its warnings (a transport fallback, a lost peer) into the rank logs, where the summary finds them",
        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-debug",
        nccl_only=True,
    ),
    EnvDefault(
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        "1",
        "after an elastic restart, workers sharing the agent's store can read the previous attempt's "
        "addresses and fail to connect; a fresh store per attempt avoids it",
        "https://github.com/pytorch/pytorch/issues/135712",
    ),
    EnvDefault(
        "PYTHONUNBUFFERED",
        "1",
        "rank output reaches its log file at once, so the last lines of a hung or killed rank are really its last",
        "https://docs.python.org/3/using/cmdline.html#envvar-PYTHONUNBUFFERED",
    ),
    EnvDefault(
        "PYTHONFAULTHANDLER",
        "1",
        "a rank that dies of SIGSEGV/SIGABRT prints its Python stack into its log",
        "https://docs.python.org/3/library/faulthandler.html",
    ),
    EnvDefault(
        "OMP_NUM_THREADS",
        "{omp_threads}",
        "one OpenMP pool per rank sized to its share of the cores, instead of every rank using all of them",
        "https://docs.pytorch.org/docs/stable/elastic/run.html",
    ),
)


# The flight record's dump path (set by the launch plan, not a fixed default): (old name, new name, first
# torch release known to read the new one). Source: torch 2.11 on 1x H200 logged "Environment variable
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE is deprecated; use TORCH_FR_DUMP_TEMP_FILE instead"
# (tests/fixtures/launch/nccl-1rank-h200-kernel-ahead-timeout/stderr.log).
FR_DUMP_FILE = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", ("TORCH_FR_DUMP_TEMP_FILE", (2, 11)))


def torch_minor(version: str | None) -> tuple[int, int] | None:
    """``"2.11.0+cu130"`` -> ``(2, 11)``; None when unknown or unreadable."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m[1]), int(m[2])) if m else None


def name_for(name: str, renamed: tuple[str, tuple[int, int]] | None, torch_version: str | None) -> str:
    """The name to set a setting under: the new one when ``torch_version`` is known to read it, else ``name``
    (every release reads the old one)."""
    have = torch_minor(torch_version)
    return renamed[0] if renamed and have is not None and have >= renamed[1] else name


def defaults_for(*, uses_nccl: bool, omp_threads: int, torch_version: str | None = None) -> list[EnvDefault]:
    """The defaults that apply to a job, with ``{omp_threads}`` filled in.

    A renamed setting goes under its new name when ``torch_version`` (the ranks' torch) is known to read it, and
    under the old name otherwise (every release reads that one).
    """
    out = []
    for d in ENV_DEFAULTS:
        if d.nccl_only and not uses_nccl:
            continue
        d = replace(d, value=d.value.format(omp_threads=omp_threads))
        if d.renamed and (new := name_for(d.name, d.renamed, torch_version)) != d.name:
            d = replace(d, name=new, renamed=(d.name, d.renamed[1]))  # names() still gives both
        out.append(d)
    return out
