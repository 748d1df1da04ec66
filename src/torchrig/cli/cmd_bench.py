"""Measure this machine's GPUs and links the way the reference tools do, and grade every figure.

Per GPU: GEMM TFLOP/s (fp32, tf32, bf16, fp16, fp8 where the GPU has it), device memory bandwidth (copy,
triad: bytes read + written), host<->device bandwidth (pinned, pageable). Between GPUs: P2P bandwidth one way
and both ways, and latency, for every pair; NCCL collectives (all_reduce, all_gather, reduce_scatter,
broadcast, all_to_all, sendrecv) over a size sweep with algbw and busbw as nccl-tests defines them
(doc/PERFORMANCE.md), every result checked. Training scaling: 'torchrig train' itself (GPT-2 small,
bf16, compiled) on 1, 2, 4 ... N GPUs and the scaling efficiency, so the figure is the trainer's own.

Workers start through torchrun (torch.distributed.run), one process per GPU, by the launcher of 'torchrig
launch': its pre-flight checks run first, and a worker that dies is named with its cause and last lines.
Every figure is shown as a percentage of the GPU's datasheet peak from the knowledge base and graded
pass / warn / fail; a GPU pair far below its link is flagged and points to 'torchrig doctor'. Without a
GPU the same code runs on the CPU with gloo at small sizes and the grading says 'no GPU'.

Exit status: 0 when nothing failed, 1 when a figure failed its grade or a result was wrong, 2 on bad usage.

examples:
  torchrig bench --quick                          # under a minute on one GPU
  torchrig bench --out bench-results              # full run: bench.json, bench.md, bench.png in the folder
  torchrig bench --only collectives --max-size 1GiB --collectives all_reduce,all_gather
  torchrig bench --cpu --nproc-per-node 2         # the CPU/gloo path (what CI runs)
  torchrig bench --from-json bench-results/bench.json --out again   # re-grade and re-render a saved run
  torchrig bench --dry-run                        # print the torchrun command, run nothing
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from typing import Any

from torchrig.argtypes import MAX_PROCS, int_in
from torchrig.cli.cmd_launch import add_gpu_options
from torchrig.errors import EngineUnavailable, UsageError
from torchrig.fuzzy import did_you_mean


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and few repeats (under a minute on one GPU)"
    )
    parser.add_argument(
        "--nproc-per-node",
        dest="nproc",
        type=int_in(1, MAX_PROCS),
        default=None,
        metavar="N",
        help="worker processes: with GPUs the same as --gpus N; 2 on the CPU path by default",
    )
    add_gpu_options(parser, "(default: every visible GPU that is yours to take)")
    parser.add_argument("--cpu", action="store_true", help="run the CPU/gloo path even if GPUs are present")
    parser.add_argument(
        "--only",
        default=None,
        metavar="PARTS",
        help="comma list of parts: gemm, memory, host, p2p, collectives, scaling (default: all)",
    )
    parser.add_argument(
        "--collectives",
        default=None,
        metavar="OPS",
        help="comma list: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, sendrecv",
    )
    parser.add_argument(
        "--dtypes", default=None, metavar="DTYPES", help="GEMM dtypes: fp32, tf32, bf16, fp16, fp8"
    )
    parser.add_argument(
        "--min-size", default=None, metavar="SIZE", help="smallest collective message, e.g. 1KiB"
    )
    parser.add_argument(
        "--max-size", default=None, metavar="SIZE", help="largest collective message, e.g. 4GiB"
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write bench.json, bench.md and bench.png here"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument(
        "--from-json",
        default=None,
        metavar="FILE",
        help="grade and render a saved bench.json instead of measuring",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the torchrun plan and exit")


def _choices(text: str | None, valid: tuple[str, ...], option: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise UsageError(f"{option} is empty", hint=f"choose from {', '.join(valid)}")
    for item in items:
        if item not in valid:
            hint = did_you_mean(item, valid) or f"choose from {', '.join(valid)}"
            raise UsageError(f"unknown {option} value {item!r}", hint=hint)
    return items


def _device(args: argparse.Namespace) -> tuple[str, int]:
    """('cuda' | 'cpu', visible GPU count)."""
    if args.cpu and args.dry_run:
        return "cpu", 0  # a plan on CPU needs no torch in this process (the workers import it)
    try:
        import torch
    except ImportError:
        raise EngineUnavailable(
            "PyTorch is not installed", hint="install the build 'torchrig resolve' names"
        ) from None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ("cpu" if args.cpu or count == 0 else "cuda"), count


# A sanity bound, not a fact about any GPU: a collective's message (and all_gather's world-size multiple of
# it) must fit in one GPU's memory, so a larger request is a typo (a missing unit, a power too many).
MAX_MESSAGE_BYTES = 256 * 2**30


def _message_size(text: str, flag: str) -> int:
    from torchrig.bench.busbw import format_size
    from torchrig.sizes import parse_size

    n = parse_size(text, flag)
    if not 1 <= n <= MAX_MESSAGE_BYTES:
        raise UsageError(
            f"{flag} {text}: a collective message is 1 byte to {format_size(MAX_MESSAGE_BYTES)}",
            hint="e.g. --min-size 1KiB --max-size 4GiB",
        )
    return n


def _choices_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The user's selections, validated before anything heavy is imported."""
    from torchrig.bench.busbw import Collective, size_sweep
    from torchrig.bench.config import GEMM_DTYPES, Part

    chosen: dict[str, Any] = dict(
        parts=_choices(args.only, tuple(p.value for p in Part), "--only"),
        collectives=_choices(args.collectives, tuple(c.value for c in Collective), "--collectives"),
        gemm_dtypes=_choices(args.dtypes, GEMM_DTYPES, "--dtypes"),
        min_size=_message_size(args.min_size, "--min-size") if args.min_size else None,
        max_size=_message_size(args.max_size, "--max-size") if args.max_size else None,
    )
    if chosen["min_size"] and chosen["max_size"]:
        size_sweep(chosen["min_size"], chosen["max_size"])  # raises the one-line error for a reversed range
    return chosen


def run(args: argparse.Namespace) -> Any:
    from torchrig.bench import grading
    from torchrig.bench.run import ProgressDisplay, build_report, load_measurements

    if args.nproc is not None and args.nproc < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, got {args.nproc}")
    if args.from_json:
        m = load_measurements(args.from_json)
        return build_report(m, grading.kb_peaks(m), args.out, plots=not args.no_plots)
    chosen = _choices_from_args(args)  # the cheap checks first: matplotlib's import takes seconds
    if not args.no_plots and args.out:
        from torchrig.bench.plots import _pyplot

        _pyplot()  # fail now, not after minutes of measuring
    placed = _placed(args)  # refused here, before torch is imported, if someone else holds a GPU you name
    kind, count = _device(args)
    if placed is not None and kind == "cpu":
        raise UsageError("--gpus given but torch sees no GPU", hint="run 'torchrig doctor', or use --cpu")
    from torchrig.bench.config import make_config

    command_line = (
        shlex.join(["torchrig", *sys.argv[1:]]) if sys.argv[0].endswith(("torchrig", "__main__.py")) else ""
    )
    cfg = make_config(device_kind=kind, quick=args.quick, command_line=command_line, **chosen)
    nproc = len(placed.gpus) if placed is not None else (args.nproc or (count if kind == "cuda" else 2))
    from torchrig.bench.config import Part
    from torchrig.bench.launch import run_workers, worker_job
    from torchrig.runtime.placement import indices_text

    gpus = indices_text(placed.gpus) if placed is not None else None
    with tempfile.TemporaryDirectory(prefix="torchrig-bench-") as work:
        job = worker_job(cfg, nproc, work, gpus=gpus, force=bool(args.force))
        if args.dry_run:
            return _dry_run(job, cfg)
        if kind == "cpu":
            print("torchrig: no GPU in use: running the CPU/gloo path at small sizes", file=sys.stderr)
        on_line = (lambda line: print(line, file=sys.stderr)) if args.debug else None
        with ProgressDisplay() as display:
            m = run_workers(job, cfg, display.update, on_line)
            if Part.SCALING.value in cfg.parts:
                env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, placed.gpus))} if placed is not None else {}
                m = _scaling(m, cfg, nproc, work, display, on_line, env, bool(args.force))
    return build_report(m, grading.kb_peaks(m), args.out, plots=not args.no_plots)


def _dry_run(job: Any, cfg: Any) -> Any:
    """The workers' plan, by the launch API's own dry run (the same function, stopped before acting)."""
    import json

    from torchrig.launch import launch
    from torchrig.report import SimpleReport

    plan = launch(job.request, dry_run=True, progress=None).plan
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env.items())
    return SimpleReport(
        {
            "plan": {"argv": list(plan.argv), "env": plan.env, "nproc": plan.nproc_per_node},
            "forced_gpus": list(plan.forced_gpus),
            "config": json.loads(cfg.to_json()),
        },
        f"{env} {shlex.join(plan.argv)}",
    )


def _placed(args: argparse.Namespace) -> Any | None:
    """The GPUs the workers get, by the placement rule of every command (launch's own choice: free or
    leased to you); None on the CPU path."""
    if args.cpu:
        if args.gpus is not None:
            raise UsageError("--cpu and --gpus exclude each other", hint="drop one of them")
        return None
    if args.gpus is not None and args.nproc is not None:
        raise UsageError("--gpus and --nproc-per-node both say how many GPUs", hint="give one of them")
    from torchrig.launch.run import choose_gpus
    from torchrig.runtime import placement

    if args.gpus is not None and not placement.parse_gpus(args.gpus).wants_gpus:
        raise UsageError(f"--gpus {args.gpus!r} asks for no GPU", hint="for the CPU path use --cpu")
    if args.gpus is None:  # every GPU that is yours; none visible: the CPU path (--nproc-per-node ranks)
        placed = choose_gpus(None, force=args.force)
        if not placed.gpus or not args.nproc:
            return placed if placed.gpus else None
    return choose_gpus(args.gpus or str(args.nproc), force=args.force)


def _scaling(
    m: Any, cfg: Any, nproc: int, work: str, display: Any, on_line: Any, env: dict[str, str], force: bool
) -> Any:
    """The training-scaling rows, from ``torchrig train`` runs on 1, 2, 4 ... ``nproc`` GPUs."""
    import dataclasses

    from torchrig.bench.scaling import group_sizes, measure_scaling

    total, done = len(group_sizes(nproc)), [0]

    def progress(label: str) -> None:
        display.update(done[0], total, label)
        done[0] += 1

    rows, command = measure_scaling(
        cfg.device_kind,
        cfg.quick,
        nproc,
        cfg.scaling_steps,
        cfg.scaling_warmup,
        work,
        progress,
        on_line,
        env,
        force,
    )
    return dataclasses.replace(
        m, scaling=tuple(rows), meta=dataclasses.replace(m.meta, scaling_model=command)
    )
