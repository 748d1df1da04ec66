"""Run a script on 1..N GPUs and nodes through ``torch.distributed.run``: plan, pre-flight, run, summary.

The API every front end calls (``torchrig launch``, ``torchrig train``, ``torchrig bench``'s workers)::

    from torchrig.launch import LaunchRequest, launch
    report = launch(LaunchRequest(script="train.py", gpus="all"))   # -> run.LaunchReport
    report.exit_code, report.result.summary                        # the failure summary, if any

The pieces, each usable on its own (``torchrig cluster`` calls the plan's):

- ``plan.build_plan(LaunchRequest, HostFacts, free_port=None) -> LaunchPlan`` — pure: the torchrun argv,
  the environment added to the parent's (each variable with its reason in ``env_settings``), the device of
  every local rank (``ranks``), and ``preflight_argv`` (the same topology running the pre-flight probe).
  Invalid requests raise ``UsageError`` with a one-line message.
- ``probe.host_facts(probe.probe_gpus())`` — the host's GPUs (physical ids), P2P pairs, CPU count.
- ``preflight.check_*`` — findings ``(id, severity, summary, cause, fix, evidence)``: gpus, port, p2p,
  process-group (a real all_reduce on every rank through torchrun).
- ``supervise.execute(plan) -> LaunchResult`` — runs torchrun with the plan, watches for hangs
  (``plan.hang_timeout_s``), and on failure reads the rank logs into ``summary.FailureSummary``: who failed
  first and what the others were doing (``summary``), why each rank ended (``causes``, one small rule per kind
  of ending), from what each rank's log says (``ranklog``).
- ``worker`` — the shim each rank starts in (header line, stack dumps on SIGUSR1/SIGTERM, error file).
- ``guard`` — the process between the launcher and torchrun: one SIGTERM for torchrun however many stops
  come, SIGKILL for what is left after the grace, no orphaned rank (also around bench's scaling runs).

- ``run.launch(LaunchRequest) -> LaunchReport`` — the steps above in order; the process-group check runs
  beside the job on one node.

See docs/training.md for the options and an example.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchrig.launch.plan import LaunchRequest
    from torchrig.launch.run import LaunchReport


def launch(request: LaunchRequest, **options: Any) -> LaunchReport:
    """``run.launch``: plan, pre-flight and run ``request``; imported only when called (the rank shim imports
    this package before the script runs, so it stays light)."""
    from torchrig.launch.run import launch as run_launch

    return run_launch(request, **options)


def __getattr__(name: str) -> Any:
    if name == "LaunchRequest":
        from torchrig.launch.plan import LaunchRequest

        return LaunchRequest
    if name == "LaunchReport":
        from torchrig.launch.run import LaunchReport

        return LaunchReport
    raise AttributeError(f"module 'torchrig.launch' has no attribute {name!r}")
