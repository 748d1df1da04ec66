"""Pre-flight checks run before the user's code: each returns a finding; errors stop the launch.

- ``gpus``: the requested GPUs are visible (decided by ``plan.select_gpus``; reported here);
- ``port``: node 0 can bind the rendezvous port;
- ``p2p``: every pair of chosen GPUs can reach each other's memory, or NCCL is told not to use P2P;
- ``cuda``: when the plan came from NVML (torch's answer was not cached), the ranks' torch can use the GPUs
  it was given (``torchrig.launch.gpuplan.judge``); its answer is then kept for the next launch;
- ``process-group``: every rank creates the process group and finishes one all_reduce in time, run through
  torchrun with the job's own topology (``torchrig.launch.pgprobe``).
"""

from __future__ import annotations

import dataclasses
import io

from torchrig.findings import Finding, Severity  # probe words: ok, warning, error
from torchrig.launch import probe
from torchrig.launch.plan import LaunchPlan
from torchrig.launch.summary import render
from torchrig.runtime.ports import can_bind


def finding_json(f: Finding) -> dict[str, str | None]:
    """``launch --json``'s pre-flight entry: ``{id, severity, summary, cause, fix, evidence}``, each text or
    null (its fields since the start; the shared record keeps ``fix`` and ``evidence`` as tuples)."""
    return {
        "id": f.id,
        "severity": f.severity.value,
        "summary": f.summary,
        "cause": f.cause or None,
        "fix": "; ".join(f.fix) or None,
        "evidence": "\n".join(f.evidence) or None,
    }


def check_gpus(plan: LaunchPlan, names: tuple[str, ...]) -> Finding:
    if plan.backend == "gloo":
        return Finding("gpus", Severity.OK, f"CPU ranks (gloo): {plan.nproc_per_node} per node")
    ids = [r.physical_gpu for r in plan.ranks]
    name = names[0] if names else "GPU"
    return Finding("gpus", Severity.OK, f"{len(ids)} GPU(s) selected: {','.join(map(str, ids))} ({name})")


def check_port(plan: LaunchPlan) -> Finding:
    if plan.node_rank != 0:
        return Finding(
            "port", Severity.OK, f"rendezvous at {plan.rdzv_host}:{plan.rdzv_port} is hosted by node 0"
        )
    if can_bind("", plan.rdzv_port):  # what the rendezvous store will do on node 0
        return Finding("port", Severity.OK, f"rendezvous port {plan.rdzv_port} is free")
    return Finding(
        "port",
        Severity.ERROR,
        f"rendezvous port {plan.rdzv_port} is already in use",
        cause="another job (or a leftover torchrun) holds it",
        fix=("pick another port in --rdzv-endpoint, or leave it out on one node to get a free one",),
        evidence=(f"bind(('', {plan.rdzv_port})) failed",),
    )


def check_p2p(plan: LaunchPlan) -> Finding:
    s = next((e for e in plan.env_settings if e.name == "NCCL_P2P_DISABLE"), None)
    if plan.backend == "gloo" or plan.nproc_per_node < 2:
        return Finding("p2p", Severity.OK, "P2P not needed")
    if s is None:
        return Finding("p2p", Severity.OK, "P2P access works between every pair of chosen GPUs")
    return Finding(
        "p2p",
        Severity.WARNING,
        "P2P is not available between the chosen GPUs: NCCL_P2P_DISABLE=1",
        cause=s.reason,
        fix=("expect lower all_reduce bandwidth; check IOMMU/ACS settings ('torchrig doctor')",),
    )


def check_cuda(plan: LaunchPlan, answer: probe.GpuAnswer, env: dict[str, str], timeout_s: float) -> Finding:
    """Ask torch (``probe.probe_gpus``) what NVML answered for the plan, and judge the two; an answer that
    does not stop the job is kept for the next launch, which then plans with torch's answer."""
    from torchrig.launch.gpuplan import judge

    found = probe.probe_gpus(timeout_s)
    verdict = judge(answer.gpus, found, plan, env)
    if not verdict.severity.blocks:
        probe.remember(answer.key, found)
    return verdict


def check_process_group(plan: LaunchPlan, timeout_s: int) -> Finding:
    """Run ``torchrig.launch.pgprobe`` on every rank through torchrun, with the job's own topology."""
    from torchrig.launch.supervise import execute

    env = {
        **plan.env,
        "TORCHRIG_COLLECTIVE_TIMEOUT_S": str(timeout_s),
        "TORCHRIG_PREFLIGHT_BACKEND": plan.backend,
    }
    probe_plan = dataclasses.replace(
        plan, argv=plan.preflight_argv, env=env, rdzv_id=f"{plan.rdzv_id}-preflight", hang_timeout_s=timeout_s
    )
    sink = io.StringIO()
    res = execute(probe_plan, wall_timeout_s=timeout_s + 30, echo=sink)
    if res.exit_code == 0:
        return Finding(
            "process-group",
            Severity.OK,
            f"{plan.world_size} rank(s) created a {plan.backend} process group and finished an all_reduce "
            f"({res.elapsed_s:.1f} s)",
        )
    detail = render(res.summary) if res.summary else sink.getvalue()[-2000:]
    return Finding(
        "process-group",
        Severity.ERROR,
        f"pre-flight all_reduce failed{' (hang)' if res.hung else ''}: "
        + (res.summary.headline if res.summary else f"torchrun exit {res.exit_code}"),
        cause=(res.summary.likely_cause if res.summary else None) or "",
        fix=(res.summary.fix if res.summary else "read the evidence",),
        evidence=(detail,),
    )
