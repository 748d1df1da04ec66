"""Run a training script on 1..N GPUs (or CPU ranks) and nodes through PyTorch's elastic launcher.

torchrig launch builds a plan (torchrun argv, environment, per-rank devices), runs pre-flight checks
(GPUs visible, rendezvous port free, P2P between the chosen GPUs) and runs the plan with
torch.distributed.run; on one node the last check (every rank creates a process group and finishes an
all_reduce) runs beside the job, which it stops if the check fails. Where torch's view of the GPUs is not
cached yet, the plan comes from NVML and torch checks it beside the job the same way. Each rank logs to its
own files under --log-dir (output.log: stdout and stderr merged in the order written, timestamped). When a rank fails, the
summary names it, the signal or exception, the script's FILE:LINE and its last lines. A job is stopped as
hung only on evidence: a rank's NCCL watchdog logged a collective timeout and the job still runs
--nccl-timeout-grace seconds later; a rank stopped by a signal for --stopped-grace seconds while another
waits in a collective; or, if you ask for it, --hang-timeout seconds without output. Before a hung job is
stopped, every rank writes its flight record next to the logs, and the summary says which rank never
called which collective (or a desync), and what the verdict rests on.
On a shared server, the GPUs leased with 'torchrig up' are respected: a GPU is yours to take when it is free
or leased to you; --gpus all means all of those; naming a GPU someone else holds is refused (exit 2) with
who holds it and since when, unless --force (which says so). The ledger is only read: launch takes no lease.
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
from typing import Any

from torchrig.argtypes import MAX_NODES, MAX_PROCS, MAX_SECONDS, int_in
from torchrig.errors import UsageError
from torchrig.launch.options import FAILURE_OPTIONS, RDZV_TIMEOUT, from_args


def configure(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("devices")
    add_gpu_options(g, "(default: all that are yours to take, or CPU if none is visible)")
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
    RDZV_TIMEOUT.add_to(n)
    f = parser.add_argument_group("failures")
    add_failure_options(f)
    f.add_argument(
        "--log-dir",
        default="torchrig-logs",
        help="per-rank logs go under here, made absolute (torchrig-logs)",
    )
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
        help="deadline of each pre-flight check beside the job: the all_reduce, torch's GPU check (60)",
    )
    r.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module name, run as python -m")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def add_gpu_options(g: Any, default: str) -> None:
    """``--gpus`` and ``--force``: one wording for launch, train and bench (the grammar and the placement
    rule are :mod:`torchrig.runtime.placement`'s)."""
    g.add_argument(
        "--gpus",
        metavar="WHICH",
        help=f"all | N | 0,2 (device=1 or 1, for one index) | GPU-UUID,... of the visible GPUs {default}; "
        "a GPU leased to someone else (see 'torchrig gpus') is refused",
    )
    g.add_argument(
        "--force",
        action="store_true",
        help="take GPUs leased to someone else anyway (a warning names whose)",
    )


def add_failure_options(g: Any) -> None:
    """Restarts, and the options that decide when a job counts as hung: declared once
    (:mod:`torchrig.launch.options`), one wording for launch and train."""
    for option in FAILURE_OPTIONS:
        option.add_to(g)


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
        force=args.force,
        cpu=args.cpu,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        rdzv_backend=args.rdzv_backend,
        log_dir=args.log_dir,
        **from_args(args),
        extra_env=tuple(extra),
    )


def run(args: argparse.Namespace) -> Any:
    from torchrig.launch import launch

    return launch(
        request_from_args(args),
        dry_run=args.dry_run,
        preflight=not args.no_preflight,
        preflight_timeout_s=args.preflight_timeout,
    )
