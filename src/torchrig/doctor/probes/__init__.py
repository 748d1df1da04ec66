"""The probes: the only code in doctor that touches the host. :func:`collect` runs them concurrently, each
with a timeout, and returns one :class:`~torchrig.doctor.facts.Facts` record.

A probe that is missing its tool, lacks permission, crashes or times out still yields a record (with a
``status`` and ``error``), so the checks turn it into a finding instead of doctor crashing or hanging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torchrig.doctor.facts import (
    ContainerFacts,
    DockerFacts,
    EnvFacts,
    Facts,
    KernelFacts,
    NvmlFacts,
    ProbeStatus,
    TorchFacts,
)

TRACE_BUDGET_S = 90.0  # probes/trace.py's default budget


@dataclass(frozen=True)
class ProbeOptions:
    python: str | None = None  # interpreter whose torch to inspect (default: this one)
    torch: bool = True  # run the torch probe (the only slow one)
    timeout_s: float = 60.0  # for the torch probe; the others get probe_timeout_s
    probe_timeout_s: float = 15.0
    deep: bool = False  # also a two-rank NCCL all-reduce over each GPU pair (probes/nccl_pairs.py)


class _Jobs:
    """Probes running in daemon threads, each started as soon as it is handed over; a job still running at
    its deadline (counted from its own start) is abandoned (result None)."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.elapsed: dict[str, float] = {}
        self.errors: dict[str, BaseException] = {}
        self.started: dict[str, tuple[threading.Thread, float, float]] = {}  # name: thread, start, deadline_s

    def _work(self, name: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            self.results[name] = fn()
        except BaseException as err:  # a probe bug must become a finding, not kill doctor
            self.errors[name] = err
        self.elapsed[name] = round((time.perf_counter() - t0) * 1000, 1)

    def start(self, name: str, fn: Callable[[], Any], deadline_s: float) -> None:
        t = threading.Thread(target=self._work, args=(name, fn), name=f"probe-{name}", daemon=True)
        self.started[name] = (t, time.perf_counter(), deadline_s)
        t.start()

    def join(self) -> tuple[dict[str, Any], dict[str, float]]:
        for t, t0, deadline_s in self.started.values():
            t.join(max(0.0, deadline_s - (time.perf_counter() - t0)))
        for name, err in self.errors.items():
            self.results[name] = err
        return self.results, self.elapsed


def _run_all(jobs: dict[str, tuple[Callable[[], Any], float]]) -> tuple[dict[str, Any], dict[str, float]]:
    """Run each job in a daemon thread; a job still running at its deadline is abandoned (result None)."""
    pool = _Jobs()
    for name, (fn, deadline_s) in jobs.items():
        pool.start(name, fn, deadline_s)
    return pool.join()


def _assemble(results: dict[str, Any], deadlines_s: dict[str, float], torch: bool) -> dict[str, Any]:
    """Each area's record: the probe's own, or one saying it was skipped, timed out or crashed."""
    kinds = {
        "nvml": NvmlFacts,
        "kernel": KernelFacts,
        "env": EnvFacts,
        "container": ContainerFacts,
        "docker": DockerFacts,
        "torch": TorchFacts,
    }
    parts: dict[str, Any] = {}
    for name, kind in kinds.items():
        value = results.get(name)
        has_error = "error" in {f.name for f in dataclasses.fields(kind)}
        if name == "torch" and not torch:
            parts[name] = kind(ProbeStatus.SKIPPED)
        elif value is None:
            msg = f"the {name} probe did not finish in {deadlines_s[name]:g} s"
            parts[name] = kind(ProbeStatus.TIMEOUT, **({"error": msg} if has_error else {}))
        elif isinstance(value, BaseException):
            msg = f"{type(value).__name__}: {value}"
            parts[name] = kind(ProbeStatus.FAILED, **({"error": msg} if has_error else {}))
        else:
            parts[name] = value
    return parts


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what the probed libraries print (NVML's stub writes to file descriptor 1) to stderr while the probes
    run: stdout carries only doctor's report (``--json`` must stay parseable). Nothing else writes to stdout
    meanwhile."""
    sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no stdout or no stderr: leave them as they are
        if saved is not None:
            os.close(saved)
        yield
        return
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _deep(torch: TorchFacts, opts: ProbeOptions) -> TorchFacts:
    """--deep: after the one-process check passed, each GPU pair through two ranks."""
    from torchrig.doctor.probes.nccl_pairs import probe_pairs

    n = torch.nccl
    if n is None or n.status != "ok" or not torch.python_executable:
        return torch
    t0 = time.perf_counter()
    pairs = probe_pairs(torch.python_executable, torch.device_count or 0, timeout_s=opts.timeout_s * 2)
    steps = {**torch.steps_ms, "nccl_pairs": round((time.perf_counter() - t0) * 1000, 1)}
    return dataclasses.replace(torch, nccl=dataclasses.replace(n, pairs=pairs), steps_ms=steps)


def collect(options: ProbeOptions | None = None, meanwhile: Callable[[], Any] | None = None) -> Facts:
    """Every probe, concurrently; the torch probe's child starts first. ``meanwhile``: the caller's own work
    to do once the probes run (the command loads the knowledge base and the checks then), not before them."""
    opts = options or ProbeOptions()
    t = opts.probe_timeout_s
    deadlines = dict.fromkeys(("nvml", "kernel", "env", "container", "docker"), t)
    pool = _Jobs()
    with _stdout_to_stderr():
        from torchrig.doctor.probes.kernel import device_nodes, probe_kernel

        # /dev/nvidia* before the torch probe's CUDA initialisation can recreate a missing /dev/nvidia-uvm
        # (through nvidia-modprobe): a listing taken beside it races with that (the GPU campaign of 2026-12-03
        # saw the node back and doctor missed the fault)
        nodes = device_nodes()
        if opts.torch:
            from torchrig.doctor.probes.pytorch import probe_torch

            # First, as it is the slow one (import torch), before the other probes' modules load. The child
            # has its own timeout; the thread's deadline is a little later so the child's wins. A failed probe
            # is traced (probes/trace.py): its re-runs get their own bounded time on top.
            deadlines["torch"] = opts.timeout_s + 5 + TRACE_BUDGET_S
            pool.start("torch", lambda: probe_torch(opts.python, opts.timeout_s), deadlines["torch"])
        from torchrig import __version__
        from torchrig.doctor.probes.container import probe_container, probe_docker
        from torchrig.doctor.probes.env import probe_env
        from torchrig.doctor.probes.nvml import probe_nvml

        pool.start("nvml", probe_nvml, t)
        pool.start("kernel", lambda: probe_kernel(nodes), t)
        pool.start("env", probe_env, t)
        pool.start("container", probe_container, t)
        pool.start("docker", probe_docker, t)
        if meanwhile is not None:  # while the probes wait on their files and subprocesses
            meanwhile()
        results, elapsed = pool.join()
    parts = _assemble(results, deadlines, opts.torch)
    if opts.deep:
        parts["torch"] = _deep(parts["torch"], opts)
    return Facts(
        **parts,
        recorded_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torchrig_version=__version__,
        source="probed",
        probe_ms=elapsed,
    )
