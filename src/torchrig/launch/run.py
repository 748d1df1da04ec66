"""The launch API: ``launch(LaunchRequest) -> LaunchReport``. Every front end calls this one function
(``torchrig launch``, ``torchrig train`` with several ranks); nothing here imports the CLI.

>>> from torchrig.launch import LaunchRequest, launch
>>> report = launch(LaunchRequest(script="train.py", cpu=True, nproc_per_node=2))   # doctest: +SKIP
>>> report.exit_code, report.result.summary                                          # doctest: +SKIP

Steps: the plan for this host (``plan_for``: GPUs, ports, every path absolute), the quick pre-flight checks
(GPUs, port, P2P), then the job. The process-group check (a real all_reduce on every rank) runs *beside* the
job on a node of its own, through a second torchrun on another port, starting once every rank's shim is
about to run the script, so the script's first line runs about as soon as under plain torchrun; when it
fails, the job is stopped and the report says why. With several nodes it runs before the job, as the nodes
share one rendezvous port.

The GPUs come from torch's probe (``probe.probe_gpus_cached``) when its answer is cached. Otherwise, on one
node with the pre-flight on, NVML answers for the plan in milliseconds and the torch probe becomes the
``cuda`` check, run beside the job before the process-group check (``gpuplan``): if torch cannot use the
GPUs the job was given, the job is stopped with that finding; if it agrees, its answer is kept.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torchrig.errors import UsageError
from torchrig.findings import Finding, Severity
from torchrig.launch import preflight as pf
from torchrig.launch import probe
from torchrig.launch.plan import HostFacts, LaunchPlan, LaunchRequest, build_plan
from torchrig.report import jsonable, table

Progress = Callable[[str], None]


class Echo(Protocol):
    """Where the job's output is copied, line by line: a text stream, or a reader of the lines."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class LaunchReport:
    """What a launch did: the plan, the pre-flight findings, and the job's result (None: not run)."""

    plan: LaunchPlan
    findings: tuple[Finding, ...]
    result: Any | None  # supervise.LaunchResult
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "plan": jsonable(self.plan),
            "preflight": [pf.finding_json(f) for f in self.findings],
            "result": jsonable(self.result),
        }

    @property
    def exit_code(self) -> int:
        if any(f.severity.blocks for f in self.findings):
            return 1
        if self.result is not None and self.result.cancelled_by:
            return int(
                self.result.exit_code
            )  # 128 + the signal's number, as the shell reports a killed process
        return 0 if self.result is None else (0 if self.result.exit_code == 0 else 1)

    def render_text(self) -> str:
        """The human view. Pre-flight checks that passed were shown while the job started; only the others
        appear here (and every one in a dry run's plan)."""
        out = _render_plan(self.plan) if self.dry_run else []
        for f in self.findings:
            if f.severity.passed and not self.dry_run:
                continue
            out.append(
                f"pre-flight {f.id}: {f.severity.value}: {f.summary}"
                + (f" — fix: {'; '.join(f.fix)}" if not f.severity.passed and f.fix else "")
            )
            if f.severity.blocks and f.evidence:
                out.append("  " + "\n".join(f.evidence).replace("\n", "\n  "))
        if self.result is not None:
            out += _render_result(self.result)
        return "\n".join(out)


def _render_plan(p: LaunchPlan) -> list[str]:
    out = [
        f"plan: {p.nnodes} node(s) x {p.nproc_per_node} rank(s) = world {p.world_size} ({p.backend}), "
        f"node rank {p.node_rank}, rendezvous {p.rdzv_host}:{p.rdzv_port} id {p.rdzv_id}",
        "argv: " + " ".join(p.argv),
        "ranks:",
        table(
            ["local", "global", "device", "physical GPU"],
            [[r.local_rank, r.global_rank, r.device, r.physical_gpu] for r in p.ranks],
            indent="  ",
        ),
        "environment:",
    ]
    for e in p.env_settings:
        mark = " (yours kept)" if e.overridden_by_user else ""
        out.append(f"  {e.name}={e.value}{mark}  # {e.reason}")
    out += [f"forced (--force): {line}" for line in p.forced_gpus]
    return out


def _render_result(r: Any) -> list[str]:
    from torchrig.launch.flightrec import PREFIX
    from torchrig.launch.flightrec import render as render_flight
    from torchrig.launch.summary import render

    out = [f"restarted after attempt {s.attempt}: {s.headline}" for s in r.earlier_failures]
    logs = f"logs: {r.run_dir}" + (f" (torchrun's own report: {r.agent_log})" if r.agent_log else "")
    if r.cancelled_by:
        out.append(
            f"job cancelled after {r.elapsed_s:.1f} s: {r.stop_reason}; torchrun and the ranks stopped"
        )
        out.append(logs)
    elif r.stopped_by == "preflight":
        out.append(f"job stopped after {r.elapsed_s:.1f} s: {r.stop_reason}")
        out.append(logs)
    elif r.exit_code == 0:
        out.append(f"job finished in {r.elapsed_s:.1f} s ({r.attempts} attempt(s)); logs: {r.run_dir}")
    elif r.summary is not None:
        if r.stop_reason:
            out.append(f"stopped by torchrig: {r.stop_reason}")
        out.append(render(r.summary))
        out.append(logs)
    else:
        out.append(f"job failed: torchrun exit {r.exit_code}; {logs}")
    if r.flight is not None:
        out += render_flight(r.flight)
    if r.flight_records:
        folder = str(Path(r.flight_records[0]).parent)
        out.append(
            f"flight records: {', '.join(Path(f).name for f in r.flight_records)} in {folder} "
            f"(PyTorch's analyser reads them too: torchfrtrace {folder} --prefix {PREFIX})"
        )
    return out


def absolute(req: LaunchRequest) -> LaunchRequest:
    """The request with its log folder absolute: every path the ranks get (logs, flight records, the
    launcher's requests) is then absolute, as torchrun's own are, and a script that changes directory
    changes nothing."""
    return dataclasses.replace(req, log_dir=os.path.abspath(req.log_dir))


def beside(req: LaunchRequest) -> bool:
    """Whether the process-group check runs beside the job: one node (the others would need the port too)."""
    return req.nnodes == 1


def plan_for(req: LaunchRequest) -> tuple[LaunchPlan, tuple[str, ...]]:
    """The plan for this host, and the GPU names (probing CUDA only when GPUs may be used)."""
    plan, names, _answer = _plan(req, nvml_first=False)
    return plan, names


@dataclass(frozen=True)
class GpuChoice:
    """What ``--gpus`` gets on this host, by the launch plan's own choice (for ``train`` and ``bench``, which
    decide how to start their processes from it): the physical GPUs, the visible ones, what --force took."""

    gpus: tuple[int, ...]
    visible: tuple[int, ...]
    forced: tuple[str, ...]


def choose_gpus(gpus: str | None, *, force: bool = False) -> GpuChoice:
    """The GPUs a launch with ``--gpus gpus`` would run on (NVML's answer where torch's is not cached: no
    CUDA initialised); the same refusals as the launch itself, before any process starts."""
    req = LaunchRequest(script="-", gpus=gpus, force=force)
    host = _host(req, nvml_first=True)[0]
    plan = build_plan(req, host)
    chosen = tuple(r.physical_gpu for r in plan.ranks if r.physical_gpu is not None)
    return GpuChoice(chosen, host.visible_gpus, plan.forced_gpus)


def _plan(
    req: LaunchRequest, *, nvml_first: bool
) -> tuple[LaunchPlan, tuple[str, ...], probe.GpuAnswer | None]:
    """``plan_for``, and the GPU answer it used when torch has yet to confirm it (``nvml_first``: NVML may
    stand in for torch's probe when its answer is not cached)."""
    req = absolute(req)
    host, answer = _host(req, nvml_first=nvml_first)
    gpu = answer.gpus if answer else None
    port = None if req.rdzv_endpoint else probe.free_port()
    pre_port = probe.free_port() if beside(req) else None
    while pre_port is not None and pre_port == port:
        pre_port = probe.free_port()
    plan = build_plan(req, host, free_port=port, preflight_port=pre_port)
    # Only a plan on GPUs needs torch's word: with no GPU, or none chosen, there is nothing to check.
    pending = answer if answer and answer.unconfirmed and plan.backend == "nccl" else None
    return plan, (gpu.names if gpu else ()), pending


def _host(req: LaunchRequest, *, nvml_first: bool) -> tuple[HostFacts, probe.GpuAnswer | None]:
    """The host's facts for the plan: the GPUs (torch's answer, or NVML's), P2P, and the lease ledger's."""
    answer = None
    if not req.cpu:
        answer = probe.gpu_answer(nvml_first=nvml_first)
        if answer.gpus.error and req.gpus is not None:
            raise UsageError(
                f"cannot see the GPUs: {answer.gpus.error}", hint="run 'torchrig doctor', or use --cpu"
            )
    gpu = answer.gpus if answer else None
    host = probe.host_facts(gpu)
    if gpu:
        # P2P pairs come back in torch's numbering; map them to the physical ids the plan uses.
        ids = host.visible_gpus
        host = dataclasses.replace(host, no_p2p=tuple((ids[i], ids[j]) for i, j in gpu.no_p2p))
    if not req.cpu:  # who holds which GPU, read before any rank starts (read-only; nothing without a ledger)
        host = dataclasses.replace(host, **probe.lease_facts(req.gpus, host.visible_gpus))  # type: ignore[arg-type]
    return host, answer


def _stderr(line: str) -> None:
    print(f"torchrig launch: {line}", file=sys.stderr, flush=True)


def launch(
    req: LaunchRequest,
    *,
    dry_run: bool = False,
    preflight: bool = True,
    preflight_timeout_s: int = 60,
    progress: Progress | None = _stderr,
    checks_beside: bool = True,
    echo: Echo | None = None,
) -> LaunchReport:
    """Plan, check and run the job; ``progress`` gets one line per step (None: silent). ``checks_beside``
    False runs the process-group check before the job even on one node (a benchmark must not share its GPUs
    and CPUs with it); ``echo`` gets torchrun's and the ranks' output (default stderr)."""
    from torchrig.launch.supervise import execute

    say = progress or (lambda _line: None)
    beside_job = checks_beside and beside(req)
    # NVML may stand in for torch's GPU probe where that probe can then run beside the job: one node, with
    # the pre-flight on (it is one of its checks).
    plan, names, pending = _plan(req, nvml_first=preflight and beside_job)
    for line in plan.forced_gpus:  # out loud, whatever the progress callback: someone else's GPU
        print(f"torchrig launch: warning: --force: taking {line}", file=sys.stderr, flush=True)
    if dry_run:
        return LaunchReport(plan, (), None, True)
    _check_target(req)
    findings = [pf.check_gpus(plan, names), pf.check_port(plan), pf.check_p2p(plan)]
    for f in findings:
        say(f"pre-flight {f.id}: {f.severity.value}: {f.summary}")
    if any(f.severity.blocks for f in findings):
        return LaunchReport(plan, tuple(findings), None, False)
    run = functools.partial(execute, plan, echo=echo or sys.stderr)
    if not preflight:
        return LaunchReport(plan, tuple(findings), run(), False)
    if not beside_job:
        say(f"pre-flight process-group: all_reduce on {plan.world_size} rank(s) before the job...")
        found = pf.check_process_group(plan, preflight_timeout_s)
        say(f"pre-flight {found.id}: {found.severity.value}: {found.summary}")
        findings.append(found)
        if found.severity.blocks:
            return LaunchReport(plan, tuple(findings), None, False)
        return LaunchReport(plan, tuple(findings), run(), False)
    # The checks start once the job's ranks are about to run the script: started with the job, they compete
    # with its start-up for the CPU (on a 2-core machine the script's first line came up to 2 s later).
    side = _Beside(_checks_beside(plan, pending, preflight_timeout_s, say), say, RANKS_UP_WAIT_S)
    result = run(abort=side.failure, started=side.ranks_started)
    side.job_ended()
    findings += side.wait()
    return LaunchReport(plan, tuple(findings), result, False)


def _check_target(req: LaunchRequest) -> None:
    """Say so now, not after a rendezvous: every rank would fail the same way."""
    if not req.module and not Path(req.script).is_file():
        raise UsageError(f"no script at {req.script}", hint="check the path, or pass -m for a module name")
    if req.module and not _module_exists(req.script):
        raise UsageError(
            f"no module named {req.script}", hint="check the name and that its package is installed"
        )


def _checks_beside(
    plan: LaunchPlan, pending: probe.GpuAnswer | None, timeout_s: int, say: Progress
) -> list[Check]:
    """The checks that run beside the job: torch's word on GPUs NVML chose, then the process group."""
    checks: list[Check] = []
    if pending is not None:
        answer = pending
        say("pre-flight cuda: the plan's GPUs came from NVML; torch checks them beside the job")
        checks.append(Check("cuda", lambda: pf.check_cuda(plan, answer, dict(os.environ), timeout_s)))
    say(f"pre-flight process-group: all_reduce on {plan.world_size} rank(s), beside the job")
    checks.append(Check("process-group", lambda: pf.check_process_group(plan, timeout_s)))
    return checks


@dataclass(frozen=True)
class Check:
    """A pre-flight check that runs beside the job: its finding's id, and the call that returns it."""

    id: str
    run: Callable[[], Finding]


RANKS_UP_WAIT_S = 60.0  # the checks beside the job start by then even if no rank has reported


class _Beside:
    """Pre-flight checks in a thread of their own, one after the other, while the job starts. After an error
    the later checks are skipped: they would fail for the same cause (the process group needs the GPUs torch
    could not use). With ``ranks_up_wait_s``, the first check waits until the job's ranks are about to run
    the script (``ranks_started``), at most that long. Once the job has ended, a check not yet started is not
    started."""

    def __init__(self, checks: list[Check], say: Progress, ranks_up_wait_s: float = 0.0) -> None:
        self._checks = checks
        self._found: list[Finding] = []
        self._say = say
        self._ended = threading.Event()
        self._up = threading.Event()
        self._wait_s = ranks_up_wait_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def ranks_started(self) -> None:
        self._up.set()

    def job_ended(self) -> None:
        self._ended.set()

    def _run(self) -> None:
        deadline = time.monotonic() + self._wait_s
        while not (self._up.is_set() or self._ended.is_set()) and time.monotonic() < deadline:
            self._up.wait(0.05)
        for check in self._checks:
            if self._ended.is_set():
                return
            try:
                found = check.run()
            except Exception as e:  # a check must never take the job down with it
                found = Finding(
                    check.id, Severity.WARNING, f"the pre-flight {check.id} check could not run: {e}"
                )
            self._found.append(found)
            self._say(f"pre-flight {found.id}: {found.severity.value}: {found.summary}")
            if found.severity.blocks:
                return

    def failure(self) -> str | None:
        """Why the job must stop (a check failed), or None."""
        f = next((f for f in list(self._found) if f.severity.blocks), None)
        if f is not None:
            return f"the pre-flight {f.id} check failed beside the job: {f.summary}"
        return None

    def wait(self) -> list[Finding]:
        self._thread.join()
        done = {f.id for f in self._found}
        skipped = [c.id for c in self._checks if c.id not in done]

        def why(i: str) -> Finding:
            if self.failure() is not None:
                return Finding(i, Severity.WARNING, "skipped: an earlier pre-flight check failed")
            if self._ended.is_set():
                return Finding(i, Severity.INFO, "not run: the job ended before it was due")
            return Finding(i, Severity.WARNING, f"the pre-flight {i} check gave no answer")

        return self._found + [why(i) for i in skipped]


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or an empty/relative name
        return False
