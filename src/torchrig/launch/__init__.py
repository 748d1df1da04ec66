"""Run a script on 1..N GPUs and nodes through ``torch.distributed.run``: plan, pre-flight, run, summary.

The pieces, each usable on its own (front ends such as ``torchrig train`` and ``torchrig cluster`` call them):

- ``plan.build_plan(LaunchRequest, HostFacts, free_port=None) -> LaunchPlan`` — pure: the torchrun argv,
  the environment added to the parent's (each variable with its reason in ``env_settings``), the device of
  every local rank (``ranks``), and ``preflight_argv`` (the same topology running the pre-flight probe).
  Invalid requests raise ``UsageError`` with a one-line message.
- ``probe.host_facts(probe.probe_gpus())`` — the host's GPUs (physical ids), P2P pairs, CPU count.
- ``preflight.check_*`` — findings ``(id, severity, summary, cause, fix, evidence)``: gpus, port, p2p,
  process-group (a real all_reduce on every rank through torchrun).
- ``supervise.execute(plan) -> LaunchResult`` — runs torchrun with the plan, watches for hangs
  (``plan.hang_timeout_s``), and on failure reads the rank logs into ``summary.FailureSummary``.
- ``worker`` — the shim each rank starts in (header line, stack dumps on SIGUSR1/SIGTERM, error file).
- ``guard`` — the process between the launcher and torchrun: one SIGTERM for torchrun however many stops
  come, SIGKILL for what is left after the grace, no orphaned rank (also used by ``torchrig bench``).

See docs/training.md for the options and an example.
"""
