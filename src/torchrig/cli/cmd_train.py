"""Train a GPT language model or a ResNet classifier the right way, on 1..N GPUs (or CPU ranks).

DDP or FSDP2 (fully_shard); bf16 or fp16 autocast (GradScaler for fp16); torch.compile; gradient
accumulation that synchronises gradients only on the last micro-step; DistributedSampler with DataLoader
workers and pinned memory; warm-up + cosine learning rate; gradient clipping; atomic DCP checkpoints that
resume on any number of GPUs with no lost or repeated steps; metrics as JSONL and TensorBoard with
tokens/s (images/s) and MFU. --gpus is launch's (all, N, 0,2, device=1, GPU-UUID; a GPU that someone else
leased is refused unless --force); with more than one GPU, one GPU other than CUDA's first,
or --nproc-per-node N, the ranks are started through 'torchrig launch' (torchrun underneath); under torchrun
it trains in place.

examples:
  torchrig train --model gpt --size tiny --steps 200                 # CPU or one GPU, learnable data
  torchrig train --gpus 2 --model gpt --size small --data synthetic --micro-batch 16 --compile
  torchrig train --gpus all --parallel fsdp --size medium --precision bf16 --ckpt-every 500
  torchrig train --gpus 2 --out run1 --resume                        # continue from run1/checkpoints/latest
  torchrig train --out run1 --overwrite                              # a new run in place of run1's
  torchrig train --model resnet --size resnet18 --data ./images --micro-batch 128
  torchrig train --model gpt --data tokens.bin --size mini           # a uint16 token file (nanoGPT's .bin)
  torchrig train --gpus 2 --size small --compile --steps 60 --profile-steps 5   # where the step time goes
  torchrig train --size small --compile --precision fp8 --fp8-recipe tensorwise  # torchao float8 (sm_89+)

outputs under --out: run.json (the run's id), metrics.jsonl, tensorboard/, checkpoints/step-N/ (+ latest),
summary.json, profile/rankR.trace.json.gz (with --profile-steps; open in Perfetto or chrome://tracing).
An --out belongs to one run: a new run there is refused unless --resume, --resume-if-possible or
--overwrite says what to do with the one it holds. Checkpoints carry SHA-256 checksums; a damaged newest
one is skipped for the newest intact one (docs/checkpoints.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.argtypes import MAX_PROCS, int_in
from torchrig.cli.cmd_launch import add_failure_options, add_gpu_options
from torchrig.errors import JobFailed, UsageError
from torchrig.launch.options import FAILURE_OPTIONS, from_args
from torchrig.train.gpuwatch import render as render_gpus
from torchrig.train.options import add_train_options, config_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_train_options(parser)
    g = parser.add_argument_group("ranks (started through torchrig launch)")
    add_gpu_options(g, "(more than one starts one rank per GPU)")
    g.add_argument(
        "--nproc-per-node", type=int_in(1, MAX_PROCS), help="CPU ranks (gloo) to start, with --device cpu"
    )
    add_failure_options(g)
    g.add_argument("--log-dir", default=None, help="per-rank logs (default OUT/logs)")
    g.add_argument("--no-preflight", action="store_true", help="skip the launcher's pre-flight checks")


@dataclass(frozen=True)
class TrainReport:
    summary: dict[str, Any] | None
    launch: Any | None
    out: str | None = None  # the run folder (metrics, checkpoints, summary)
    forced_gpus: tuple[str, ...] = ()  # trained in place on a GPU leased to someone else (--force)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": self.summary, "out": self.out}
        if self.launch is not None:
            out["launch"] = self.launch.to_json()
        if self.forced_gpus:
            out["forced_gpus"] = list(self.forced_gpus)
        return out

    @property
    def exit_code(self) -> int:
        return self.launch.exit_code if self.launch is not None else 0

    def render_text(self) -> str:
        lines = []
        if self.launch is not None:
            lines.append(self.launch.render_text())
        s = self.summary
        if s:
            unit = "tokens" if "tokens_per_s" in s else "images"
            rate, mfu = s.get(f"{unit}_per_s"), s.get("mfu")
            lines.append(
                f"trained {s['steps']} steps on {s['world_size']} rank(s) ({s['parallel']}, {s['precision']}"
                + (f" {s['fp8']['recipe']}: {s['fp8']['layers']} Linear layers" if s.get("fp8") else "")
                + f"{', compiled' if s['compile'] else ''}): final loss "
                + (f"{s['final_loss']:.4f}" if isinstance(s.get("final_loss"), float) else "none")
                + (f", {len(s['skipped_steps'])} NaN/inf step(s) skipped" if s.get("skipped_steps") else "")
                + (f", {rate:,.0f} {unit}/s" if rate else "")
                + (f", MFU {mfu * 100:.1f}%" if mfu is not None else "")
            )
            if s.get("profile"):
                lines.append(render_profile(s["profile"]))
            clocks = render_gpus(s.get("gpus") or [])
            if clocks:
                lines.append(clocks)
        if self.out is not None:
            lines.append(f"the run is in {self.out} (metrics.jsonl, checkpoints/, summary.json)")
        return "\n".join(lines)


def _read_summary(path: Path) -> dict[str, Any] | None:
    """The ranks' summary.json; None (the launch report still printed) when it is missing or unreadable."""
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_json

    try:  # bounded, a regular file only: a FIFO or /dev/zero in its place is no summary, not a hang
        data = read_json(path, "run summary", max_bytes=16 * 2**20)
    except InputError:
        return None
    return data if isinstance(data, dict) else None


def render_profile(p: dict[str, Any]) -> str:
    """One line of ``--profile-steps``' breakdown (rank 0's GPU), and where its trace is."""
    head = f"profile, {p['steps']} step(s) on rank 0: {p['step_ms']:.2f} ms/step"
    if not p.get("device_events"):
        return head + " (no GPU kernels recorded)" + (f"; trace {p['trace']}" if p.get("trace") else "")
    return (
        f"{head}: compute {p['compute_ms']:.2f} ms, communication {p['comm_ms']:.2f} ms "
        f"({p['comm_exposed_ms']:.2f} ms of it not hidden behind compute), GPU idle {p['idle_ms']:.2f} ms"
        + (f"; trace {p['trace']}" if p.get("trace") else "")
    )


def _check_out(out: Path) -> None:
    """--out must be a folder, or a path where one can be made: not a file or a device."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                raise UsageError(
                    f"--out {str(out)!r}: {str(path)!r} is not a folder",
                    hint="give a folder for the run (it is created if missing)",
                )
            return


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


def _placed(args: argparse.Namespace) -> Any | None:
    """Where ``--gpus`` puts the run, by the placement rule of every command (``launch``'s own choice: free
    or leased to you, refused when someone else holds a GPU you name); None without ``--gpus`` or when this
    process is already one rank of a torchrun job."""
    from torchrig.runtime import placement

    request = placement.parse_gpus(args.gpus)  # malformed (-1, 0, two): one line, exit 2
    if not request.wants_gpus:
        raise UsageError(f"--gpus {args.gpus!r} asks for no GPU", hint="for the CPU use --device cpu")
    if _under_torchrun():
        return None
    from torchrig.launch.run import choose_gpus

    return choose_gpus(args.gpus, force=args.force)


def _others_hold_gpus() -> bool:
    """Whether the lease ledger (read-only; none on a personal machine) holds a GPU for someone else: then a
    run without --gpus must not take the first GPU CUDA shows blindly."""
    if _under_torchrun():
        return False
    from torchrig.launch.probe import leases_now
    from torchrig.runtime.ledger import current_user

    return any(x.user != current_user() for x in leases_now() or ())


def _first_yours(args: argparse.Namespace) -> Any | None:
    """The first visible GPU that is yours to take (None: no GPU visible, the CPU as before)."""
    import dataclasses as dc

    from torchrig.launch.run import choose_gpus

    placed = choose_gpus(None, force=args.force)
    return dc.replace(placed, gpus=placed.gpus[:1]) if placed.gpus else None


def _wants_launch(args: argparse.Namespace, placed: Any | None) -> bool:
    """Ranks through the launcher: several CPU ranks, several GPUs, or one GPU other than the first one
    CUDA shows (a process training in place uses that one)."""
    if _under_torchrun():
        return False  # already one rank of a torchrun job
    if args.nproc_per_node and args.nproc_per_node > 1:
        return True
    if placed is None:
        return False
    return len(placed.gpus) > 1 or tuple(placed.gpus) != tuple(placed.visible[:1])


def run(args: argparse.Namespace) -> TrainReport:
    cfg = config_from_args(args)
    # the launcher's options were checked by their parser (launch.options' bounds), run in place or not
    _check_out(Path(cfg.out))
    if cfg.precision == "fp8":  # before any rank starts (the ranks check the GPU's compute capability)
        from torchrig.train.fp8 import require_torchao

        require_torchao()
    from torchrig.train.rundir import hold, plan_start

    # refused here, before any rank starts: a run folder that holds another run, --resume with nothing there
    plan_start(Path(cfg.out), resume=cfg.resume, if_possible=cfg.resume_if_possible, overwrite=cfg.overwrite)
    # one run per folder: a second one (even two --resume-if-possible) is refused. Run as one rank of a
    # torchrun job, rank 0 takes it in the loop instead (every rank runs this command).
    is_rank = "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ
    with contextlib.nullcontext() if is_rank else hold(Path(cfg.out)):
        return _run(args, cfg)


def _run(args: argparse.Namespace, cfg: Any) -> TrainReport:
    placed, gpus = None, args.gpus
    if args.gpus is not None:
        if cfg.device == "cpu" or args.nproc_per_node is not None:
            raise UsageError(
                "--gpus asks for GPUs, --device cpu and --nproc-per-node for CPU ranks", hint="drop one"
            )
        cfg = dataclasses.replace(cfg, device="cuda")  # --gpus means GPUs: no silent fall-back to the CPU
        placed = _placed(args)
    elif args.nproc_per_node is None and cfg.device != "cpu" and _others_hold_gpus():
        placed = _first_yours(args)  # one GPU, as without a ledger, but one that is yours to take
        gpus = f"{placed.gpus[0]}," if placed is not None else None
    if not _wants_launch(args, placed):
        from torchrig.train.loop import train

        forced = placed.forced if placed is not None else ()
        for line in forced:
            print(f"torchrig train: warning: --force: taking {line}", file=sys.stderr, flush=True)
        return TrainReport(train(cfg), None, str(cfg.out), forced)
    from torchrig.launch import launch
    from torchrig.launch.plan import LaunchRequest
    from torchrig.train.rundir import LOCK_HOLDER_ENV, holder_token

    cpu = args.nproc_per_node is not None or cfg.device == "cpu"
    req = LaunchRequest(
        script="torchrig.train",
        module=True,
        script_args=tuple(cfg.to_argv()),
        gpus=None if cpu else gpus,
        force=args.force,
        cpu=cpu,
        nproc_per_node=args.nproc_per_node if cpu else None,
        log_dir=args.log_dir or str(Path(cfg.out) / "logs"),
        **from_args(args, FAILURE_OPTIONS),
        rdzv_id="torchrig-train",
        extra_env=((LOCK_HOLDER_ENV, holder_token()),),  # rank 0 runs under this process's lock
    )
    report = launch(req, preflight=not args.no_preflight, preflight_timeout_s=60)
    summary = _read_summary(Path(cfg.out) / "summary.json") if report.exit_code == 0 else None
    if report.exit_code != 0 and report.result is None:
        raise JobFailed(
            "pre-flight failed: " + "; ".join(f.summary for f in report.findings if f.severity.is_problem)
        )
    return TrainReport(summary, report, str(cfg.out))
