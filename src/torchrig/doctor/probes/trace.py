"""A failed torch probe traced to its cause: run it again with the environment reduced to the essentials, and,
when that works, bisect the user's other variables (delta debugging) down to the one, or the pair, whose
presence makes it fail. Only "a clean environment fails too" points at the install.

Bounded: at most ``max_runs`` re-runs and ``budget_s`` seconds in all, and it runs only after a failure, so a
healthy machine never pays for it.

>>> fails = lambda env: "BAD" in env          # a stand-in for "the probe fails under env"
>>> culprits(["A", "BAD", "C", "D"], {}, {"A": "1", "BAD": "x", "C": "3", "D": "4"}, fails)
['BAD']
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from torchrig.doctor.facts import CrashTrace

# What a process needs to find its interpreter, home, locale and temporary directory, and doctor's own knobs.
ESSENTIAL = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
)
# Kept only when the clean run needs them (torch installed on PYTHONPATH, CUDA libraries on LD_LIBRARY_PATH).
IF_NEEDED = ("LD_LIBRARY_PATH", "PYTHONPATH")


SUSPECT_PREFIXES = (
    "NCCL_",
    "CUDA_",
    "PYTORCH_",
    "TORCH",
    "GLOO_",
    "LD_",
    "PYTHON",
    "OMP_",
    "KMP_",
    "MKL_",
    "MALLOC_",
    "GLIBC_",
    "NVIDIA_",
    "CUBLAS",
    "CUDNN",
    "TRITON",
)


class Budget(Exception):
    """The run or time budget ran out before the bisection finished."""


def describe(returncode: int | None, text: str | None) -> str:
    """A failed run in words: the signal that killed it, or its status and last line."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}" + (f": {text}" if text else "")
    if returncode not in (None, 0):
        return f"exited with status {returncode}" + (f": {text}" if text else "")
    return text or "failed"


def culprits(
    suspects: list[str],
    base: Mapping[str, str],
    full: Mapping[str, str],
    fails: Callable[[dict[str, str]], bool],
) -> list[str]:
    """The smallest set of ``suspects`` (names in ``full``) that, added to ``base``, makes ``fails`` true;
    ``base`` + all suspects fails and ``base`` alone does not. Binary splitting, the two halves run side by
    side: one culprit costs about log2(n) rounds, a pair about twice that."""

    def env_of(names: list[str], extra: list[str]) -> dict[str, str]:
        return {**base, **{n: full[n] for n in (*extra, *names)}}

    def minimize(cands: list[str], fixed: list[str]) -> list[str]:
        if len(cands) <= 1:
            return cands
        half = len(cands) // 2
        a, b = cands[:half], cands[half:]
        with ThreadPoolExecutor(2) as pool:
            fa, fb = pool.map(fails, (env_of(a, fixed), env_of(b, fixed)))
        if fa:
            return minimize(a, fixed)
        if fb:
            return minimize(b, fixed)
        ra = minimize(a, [*fixed, *b])  # it takes something from each half
        rb = minimize(b, [*fixed, *ra])
        return [*ra, *rb]

    return minimize(list(suspects), [])


def suspicious(name: str) -> bool:
    """Variables that torch, CUDA, NCCL, the loader or the interpreter read: tried first, as a group."""
    return name.startswith(SUSPECT_PREFIXES)


def trace(
    run: Callable[[dict[str, str]], str | None],
    env: Mapping[str, str],
    failure: str,
    *,
    max_runs: int = 16,
    budget_s: float = 90.0,
) -> CrashTrace:
    """Trace ``failure`` (the probe under ``env``). ``run(env)`` runs the probe under ``env`` and returns
    None when it works, or its failure in words."""
    t0 = time.perf_counter()
    runs = 0
    lock = threading.Lock()

    def probe(e: dict[str, str]) -> str | None:
        nonlocal runs
        with lock:
            if runs >= max_runs or time.perf_counter() - t0 > budget_s:
                raise Budget(f"stopped after {runs} runs, {time.perf_counter() - t0:.0f} s (the limit)")
            runs += 1
        return run(e)

    essentials = [n for n in ESSENTIAL if n in env]
    base = {n: env[n] for n in essentials}
    clean_ok: bool | None = None
    try:
        # The clean run and the usual suspects as a group, side by side (the group is needed whenever the
        # clean run works, which is the case worth being quick for).
        others = [n for n in sorted(env) if n not in base]
        group = [n for n in others if suspicious(n)]
        with ThreadPoolExecutor(2) as pool:
            clean_run = pool.submit(probe, dict(base))
            group_run = (
                pool.submit(probe, {**base, **{n: env[n] for n in group}})
                if group and len(group) < len(others)
                else None
            )
            clean = clean_run.result()
            group_fails = group_run is not None and group_run.result() is not None
        for extra in IF_NEEDED:  # the clean run may need the user's library or module path
            if clean is not None and extra in env:
                trial = {**base, extra: env[extra]}
                if probe(trial) is None:
                    base, clean = trial, None
                    essentials.append(extra)
        clean_ok = clean is None
        if not clean_ok:
            return _done(failure, False, clean, [], essentials, runs, t0, None)
        suspects = sorted(n for n in env if n not in base)
        if group_fails:
            suspects = [n for n in suspects if suspicious(n)]  # the usual suspects alone reproduce it
        found = culprits(suspects, base, env, lambda e: probe(e) is not None)
    except Budget as stop:
        return _done(failure, clean_ok, None, [], essentials, runs, t0, str(stop))
    return _done(failure, True, None, [f"{n}={env[n]}" for n in found], essentials, runs, t0, None)


def _done(
    failure: str,
    clean_ok: bool | None,
    clean_failure: str | None,
    found: list[str],
    essentials: list[str],
    runs: int,
    t0: float,
    note: str | None,
) -> CrashTrace:
    return CrashTrace(
        failure=failure,
        clean_ok=clean_ok,
        clean_failure=clean_failure,
        culprits=tuple(found),
        essentials=tuple(essentials),
        runs=runs,
        elapsed_ms=round((time.perf_counter() - t0) * 1000, 1),
        note=note,
    )
