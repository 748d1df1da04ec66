"""Environment defaults every launched rank gets, each with its reason and source.

A value the user already exported wins: the launcher only fills what is unset (see ``plan.build_plan``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvDefault:
    name: str
    value: str
    reason: str
    source: str
    nccl_only: bool = False  # only meaningful when the ranks use NCCL (GPUs)


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
        "https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html",
        nccl_only=True,
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


def defaults_for(*, uses_nccl: bool, omp_threads: int) -> list[EnvDefault]:
    """The defaults that apply to a job, with ``{omp_threads}`` filled in."""
    out = []
    for d in ENV_DEFAULTS:
        if d.nccl_only and not uses_nccl:
            continue
        out.append(
            EnvDefault(d.name, d.value.format(omp_threads=omp_threads), d.reason, d.source, d.nccl_only)
        )
    return out
