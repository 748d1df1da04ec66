"""Run a training script on 1..N GPUs (or CPU ranks) and nodes through PyTorch's elastic launcher.

torchrig launch builds a plan (torchrun argv, environment, per-rank devices), runs pre-flight checks
(GPUs visible, rendezvous port free, P2P between the chosen GPUs, every rank can create a process group
and finish an all_reduce), then runs the plan with torch.distributed.run. Each rank logs to its own file
under --log-dir; when a rank fails or the job hangs, a summary names the rank, its last log lines and the
likely cause. A rank whose NCCL watchdog logs a collective timeout ends the job --nccl-timeout-grace
seconds later if PyTorch leaves it running. Before a hung job is stopped, every rank writes its flight
record next to the logs, and the summary says which rank never called which collective (or a desync).
Environment defaults (NCCL async error handling, flight recorder, unbuffered output, ...)
are set only where you have not set them; --dry-run lists each with its reason.

examples:
  torchrig launch --gpus all train.py --epochs 3          # every visible GPU, one rank each
  torchrig launch --gpus 0,1 --max-restarts 2 train.py    # GPUs 0 and 1; restart the group up to twice
  torchrig launch --cpu --nproc-per-node 2 train.py       # two gloo ranks on the CPU
  torchrig launch --gpus 8 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500 train.py   # on node0
  torchrig launch --gpus 8 --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29500 train.py   # on node1
  torchrig launch --dry-run --json --gpus 2 -m torchrig.train --model gpt --size tiny
  torchrig launch --hang-timeout 120 --collective-timeout 60 train.py   # hang summary after 2 min of silence

In your script, read the collective timeout the launcher chose:
  dist.init_process_group(timeout=timedelta(seconds=int(os.environ["TORCHRIG_COLLECTIVE_TIMEOUT_S"])))
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.cli.argtypes import MAX_NODES, MAX_PROCS, MAX_SECONDS, int_in
from torchrig.errors import UsageError
from torchrig.report import jsonable, table


def configure(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("devices")
    g.add_argument(
        "--gpus", help="all, a count (2) or a list (0,1) of the visible GPUs (default: all, or CPU if none)"
    )
    g.add_argument("--cpu", action="store_true", help="CPU ranks with gloo (no GPU)")
    g.add_argument(
        "--nproc-per-node", type=int_in(1, MAX_PROCS), help="CPU ranks per node with --cpu (default 1)"
    )
    n = parser.add_argument_group("nodes and rendezvous")
    n.add_argument("--nnodes", type=int_in(1, MAX_NODES), default=1, help="number of nodes (default 1)")
    n.add_argument(
        "--node-rank",
        type=int_in(0, MAX_NODES - 1),
        default=0,
        help="this node's rank, 0..nnodes-1 (default 0)",
    )
    n.add_argument(
        "--rdzv-endpoint", help="HOST:PORT of node 0's rendezvous store (default localhost, a free port)"
    )
    n.add_argument("--rdzv-id", default="torchrig", help="job id shared by all nodes (default torchrig)")
    n.add_argument(
        "--rdzv-backend", default="c10d", choices=("c10d", "static"), help="rendezvous backend (c10d)"
    )
    n.add_argument(
        "--rdzv-timeout",
        type=int_in(1, MAX_SECONDS),
        default=300,
        metavar="S",
        help="seconds to wait for all nodes (300)",
    )
    f = parser.add_argument_group("failures")
    f.add_argument(
        "--max-restarts", type=int_in(0, 1000), default=0, help="restart the worker group this many times (0)"
    )
    f.add_argument(
        "--collective-timeout",
        type=int_in(1, MAX_SECONDS),
        default=600,
        metavar="S",
        help="process-group timeout for torchrig's trainer and pre-flight (600)",
    )
    f.add_argument(
        "--hang-timeout",
        type=int_in(0, MAX_SECONDS),
        default=0,
        metavar="S",
        help="no rank output for S seconds = hang: dump stacks and flight records, stop, summarise (0: off)",
    )
    f.add_argument(
        "--nccl-timeout-grace",
        type=int_in(0, MAX_SECONDS),
        default=30,
        metavar="S",
        help="a rank's NCCL watchdog logged a collective timeout and the job still runs S s later = hang: "
        "dump stacks and flight records, stop, summarise (30; 0: leave it to PyTorch)",
    )
    f.add_argument("--log-dir", default="torchrig-logs", help="per-rank logs go under here (torchrig-logs)")
    r = parser.add_argument_group("plan")
    r.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="extra environment for every rank"
    )
    r.add_argument(
        "--dry-run", action="store_true", help="print the plan (argv, environment, devices) and stop"
    )
    r.add_argument("--no-preflight", action="store_true", help="skip the pre-flight checks")
    r.add_argument(
        "--preflight-timeout",
        type=int_in(1, MAX_SECONDS),
        default=60,
        metavar="S",
        help="pre-flight all_reduce deadline (60)",
    )
    r.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name, run as python -m")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def request_from_args(
    args: argparse.Namespace,
    *,
    script: str | None = None,
    script_args: tuple[str, ...] | None = None,
    module: bool | None = None,
) -> Any:
    from torchrig.launch.plan import LaunchRequest

    extra = []
    for kv in args.env:
        if "=" not in kv or not kv.split("=", 1)[0]:
            raise UsageError(f"malformed --env {kv!r}", hint="expected NAME=VALUE")
        k, v = kv.split("=", 1)
        extra.append((k, v))
    sargs = tuple(args.script_args) if script_args is None else script_args
    if sargs and sargs[0] == "--":
        sargs = sargs[1:]
    return LaunchRequest(
        script=args.script if script is None else script,
        script_args=sargs,
        module=args.module if module is None else module,
        gpus=args.gpus,
        cpu=args.cpu,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        rdzv_backend=args.rdzv_backend,
        rdzv_timeout_s=args.rdzv_timeout,
        max_restarts=args.max_restarts,
        log_dir=args.log_dir,
        collective_timeout_s=args.collective_timeout,
        hang_timeout_s=args.hang_timeout,
        nccl_timeout_grace_s=args.nccl_timeout_grace,
        extra_env=tuple(extra),
    )


@dataclass(frozen=True)
class LaunchReport:
    plan: Any
    findings: tuple[Any, ...]
    result: Any | None
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "plan": jsonable(self.plan),
            "preflight": jsonable(self.findings),
            "result": jsonable(self.result),
        }

    @property
    def exit_code(self) -> int:
        if any(f.severity.value == "error" for f in self.findings):
            return 1
        return 0 if self.result is None else (0 if self.result.exit_code == 0 else 1)

    def render_text(self) -> str:
        from torchrig.launch.flightrec import PREFIX
        from torchrig.launch.summary import render

        out = []
        if self.dry_run:
            p = self.plan
            out.append(
                f"plan: {p.nnodes} node(s) x {p.nproc_per_node} rank(s) = world {p.world_size} ({p.backend}), "
                f"node rank {p.node_rank}, rendezvous {p.rdzv_host}:{p.rdzv_port} id {p.rdzv_id}"
            )
            out.append("argv: " + " ".join(p.argv))
            out.append("ranks:")
            out.append(
                table(
                    ["local", "global", "device", "physical GPU"],
                    [[r.local_rank, r.global_rank, r.device, r.physical_gpu] for r in p.ranks],
                    indent="  ",
                )
            )
            out.append("environment:")
            for e in p.env_settings:
                mark = " (yours kept)" if e.overridden_by_user else ""
                out.append(f"  {e.name}={e.value}{mark}  # {e.reason}")
        for f in self.findings:
            out.append(
                f"pre-flight {f.id}: {f.severity.value}: {f.summary}"
                + (f" — fix: {f.fix}" if f.severity.value != "ok" and f.fix else "")
            )
            if f.severity.value == "error" and f.evidence:
                out.append("  " + f.evidence.replace("\n", "\n  "))
        r = self.result
        if r is not None:
            for s in r.earlier_failures:
                out.append(f"restarted after attempt {s.attempt}: {s.headline}")
            if r.exit_code == 0:
                out.append(
                    f"job finished in {r.elapsed_s:.1f} s ({r.attempts} attempt(s)); logs: {r.run_dir}"
                )
            elif r.summary is not None:
                if r.stop_reason:
                    out.append(f"stopped by torchrig: {r.stop_reason}")
                out.append(render(r.summary))
                out.append(f"logs: {r.run_dir}")
            else:
                out.append(f"job failed: torchrun exit {r.exit_code}; logs: {r.run_dir}")
            if r.flight is not None:
                from torchrig.launch.flightrec import render as render_flight

                out += render_flight(r.flight)
            if r.flight_records:
                folder = str(Path(r.flight_records[0]).parent)
                out.append(
                    f"flight records: {', '.join(Path(f).name for f in r.flight_records)} in {folder} "
                    f"(PyTorch's analyser reads them too: torchfrtrace {folder} --prefix {PREFIX})"
                )
        return "\n".join(out)


def plan_for(req: Any) -> tuple[Any, tuple[str, ...]]:
    """The plan for this host, and the GPU names (probing CUDA only when GPUs may be used)."""
    from torchrig.launch import probe
    from torchrig.launch.plan import build_plan

    gpu = None
    if not req.cpu:
        gpu = probe.probe_gpus()
        if gpu.error and req.gpus is not None:
            raise UsageError(f"cannot see the GPUs: {gpu.error}", hint="run 'torchrig doctor', or use --cpu")
    host = probe.host_facts(gpu)
    if gpu:
        # P2P pairs come back in torch's numbering; map them to the physical ids the plan uses.
        ids = host.visible_gpus
        host = type(host)(**{**host.__dict__, "no_p2p": tuple((ids[i], ids[j]) for i, j in gpu.no_p2p)})
    port = None if req.rdzv_endpoint else probe.free_port()
    return build_plan(req, host, free_port=port), (gpu.names if gpu else ())


def launch(req: Any, *, dry_run: bool, preflight: bool, preflight_timeout_s: int) -> LaunchReport:
    from torchrig.launch import preflight as pf
    from torchrig.launch.supervise import execute

    plan, names = plan_for(req)
    if dry_run:
        return LaunchReport(plan, (), None, True)
    # Say so now, not after the pre-flight and a rendezvous: every rank would fail the same way.
    if not req.module and not Path(req.script).is_file():
        raise UsageError(f"no script at {req.script}", hint="check the path, or pass -m for a module name")
    if req.module and not _module_exists(req.script):
        raise UsageError(
            f"no module named {req.script}", hint="check the name and that its package is installed"
        )
    findings = [pf.check_gpus(plan, names), pf.check_port(plan), pf.check_p2p(plan)]
    if preflight and not any(f.severity.value == "error" for f in findings):
        print(f"torchrig launch: pre-flight all_reduce on {plan.world_size} rank(s)...", file=sys.stderr)
        findings.append(pf.check_process_group(plan, preflight_timeout_s))
    for f in findings:
        print(f"torchrig launch: pre-flight {f.id}: {f.severity.value}: {f.summary}", file=sys.stderr)
    if any(f.severity.value == "error" for f in findings):
        return LaunchReport(plan, tuple(findings), None, False)
    result = execute(plan)
    return LaunchReport(plan, tuple(findings), result, False)


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or an empty/relative name
        return False


def run(args: argparse.Namespace) -> LaunchReport:
    req = request_from_args(args)
    return launch(
        req, dry_run=args.dry_run, preflight=not args.no_preflight, preflight_timeout_s=args.preflight_timeout
    )
