"""What ``torchrig train`` will run, and where: ``TrainRequest`` -> ``build_plan`` -> ``TrainPlan``.

Like the launch API (``LaunchRequest`` -> ``build_plan`` -> ``launch``), the request validates itself, the
facts of the host are read by one function (:func:`observe`: the run folder, the GPUs that ``--gpus``
places the run on, whether this process is already one rank of a torchrun job), and the plan is a pure
function of the two (:func:`build_plan`): the same request on the same facts gives the same plan, and
nothing is touched. The plan holds how the run starts in its folder (new, resume, resume-if-possible;
train/runstart.py), decided once, here, and handed to rank 0; and either the launch request that starts
the ranks (several GPUs, one GPU other than CUDA's first, several CPU ranks) or nothing, for a run in this
process. ``run.run(plan)`` carries it out (train/run.py).

    from torchrig.train import TrainRequest, train
    result = train(TrainRequest(TrainConfig(size="tiny", steps=20), gpus="2"))   # -> run.TrainResult
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchrig.errors import TorchrigError, UsageError
from torchrig.train import runstart
from torchrig.train.config import TrainConfig

if TYPE_CHECKING:
    from torchrig.launch.plan import LaunchRequest
    from torchrig.launch.run import GpuChoice

LAUNCH_ID = "torchrig-train"  # the rendezvous id of the ranks train launches


@dataclass(frozen=True)
class TrainRequest:
    """What ``torchrig train`` was asked: the trainer's options, and how to start its ranks. Validated on
    construction (the trainer's own options by :class:`TrainConfig`)."""

    config: TrainConfig
    gpus: str | None = None  # --gpus (runtime.placement's grammar); None: CUDA's first GPU, or the CPU
    force: bool = False  # take GPUs leased to someone else anyway (said out loud)
    nproc_per_node: int | None = None  # CPU ranks (gloo), with --device cpu
    log_dir: str | None = None  # the ranks' logs (None: OUT/logs)
    preflight: bool = True  # the launcher's pre-flight checks
    launch_options: tuple[tuple[str, Any], ...] = ()  # launch.options.FAILURE_OPTIONS' fields and values

    def __post_init__(self) -> None:
        data = self.config.data
        if data not in ("synthetic", "generated") and not Path(data).exists():  # before torch is imported
            raise UsageError(
                f"--data {data!r}: no such file or folder",
                hint="use synthetic, generated, a token file (.bin/.npy) or an image folder",
            )
        if self.gpus is None:
            return
        if self.config.device == "cpu" or self.nproc_per_node is not None:
            raise UsageError(
                "--gpus asks for GPUs, --device cpu and --nproc-per-node for CPU ranks", hint="drop one"
            )
        from torchrig.runtime import placement

        if not placement.parse_gpus(self.gpus).wants_gpus:  # malformed (-1, 0, two): one line, exit 2
            raise UsageError(f"--gpus {self.gpus!r} asks for no GPU", hint="for the CPU use --device cpu")

    @property
    def out(self) -> Path:
        return Path(self.config.out)


@dataclass(frozen=True)
class TrainFacts:
    """What the plan rests on, read by :func:`observe`."""

    folder: runstart.Folder  # what the run folder holds
    under_torchrun: bool  # this process is one rank of a torchrun job: it trains in place
    restart: int  # torchelastic's restart count, under torchrun
    placed: (
        GpuChoice | None
    )  # where --gpus puts the run; without it, the first GPU yours where others hold some
    gpu_refusal: TorchrigError | None  # why --gpus cannot be placed (someone holds it, no GPU visible)
    holder: str  # this process as the folder's lock records it (rundir.holder_token)


@dataclass(frozen=True)
class TrainPlan:
    """What will run, and where. ``launch`` None: in this process (one rank, or one rank of a torchrun job)."""

    config: TrainConfig  # as the ranks get it (``--gpus`` sets device=cuda)
    start: runstart.Start  # how the run starts in its folder: decided once, here
    launch: LaunchRequest | None  # the ranks to start through the launch API
    holds_folder: bool  # this process holds the folder's lock for the run (not as a torchrun rank)
    forced_gpus: tuple[str, ...] = ()  # in place on a GPU leased to someone else (--force)
    preflight: bool = True

    @property
    def out(self) -> Path:
        return Path(self.config.out)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ


def observe(request: TrainRequest) -> TrainFacts:
    """Read the facts of this host for ``request``: the run folder, and the GPUs by the placement rule of
    every command (``launch``'s own choice: free or leased to you). Nothing is changed."""
    from torchrig.train.rundir import holder_token

    torchrun = under_torchrun()
    placed, refusal = None, None
    if not torchrun:
        try:
            placed = _place(request)
        except TorchrigError as e:  # held, none free, none visible: said after the folder's refusals
            refusal = e
    return TrainFacts(
        folder=runstart.observe(request.out),
        under_torchrun=torchrun,
        restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) if torchrun else 0,
        placed=placed,
        gpu_refusal=refusal,
        holder=holder_token(),
    )


def _place(request: TrainRequest) -> GpuChoice | None:
    from torchrig.launch.run import choose_gpus

    if request.gpus is not None:
        return choose_gpus(request.gpus, force=request.force)
    if request.nproc_per_node is None and request.config.device != "cpu" and _others_hold_gpus():
        # one GPU, as without a ledger, but one that is yours to take (None: no GPU visible, the CPU)
        placed = choose_gpus(None, force=request.force)
        return dataclasses.replace(placed, gpus=placed.gpus[:1]) if placed.gpus else None
    return None


def _others_hold_gpus() -> bool:
    """Whether the lease ledger (read-only; none on a personal machine) holds a GPU for someone else: then a
    run without --gpus must not take the first GPU CUDA shows blindly."""
    from torchrig.launch.probe import leases_now
    from torchrig.runtime.ledger import current_user

    return any(x.user != current_user() for x in leases_now() or ())


def build_plan(request: TrainRequest, facts: TrainFacts) -> TrainPlan:
    """The plan for ``request`` on ``facts`` (pure). :class:`UsageError` (exit 2) for a run that must not start:
    an --out that is no folder, a folder that holds another run, --resume with nothing to resume, a GPU
    someone else holds."""
    cfg, out = request.config, request.out
    if facts.folder.not_folder is not None:
        raise UsageError(
            f"--out {str(out)!r}: {facts.folder.not_folder!r} is not a folder",
            hint="give a folder for the run (it is created if missing)",
        )
    start = runstart.decide(
        out,
        facts.folder,
        resume=cfg.resume,
        if_possible=cfg.resume_if_possible,
        overwrite=cfg.overwrite,
        restart=facts.restart,
    )
    if facts.gpu_refusal is not None:
        raise facts.gpu_refusal
    if request.gpus is not None:
        cfg = dataclasses.replace(cfg, device="cuda")  # --gpus means GPUs: no silent fall-back to the CPU
    placed = facts.placed
    if not wants_launch(request, placed, facts.under_torchrun):
        forced = placed.forced if placed is not None else ()
        return TrainPlan(cfg, start, None, not facts.under_torchrun, forced, request.preflight)
    return TrainPlan(cfg, start, _launch_request(request, cfg, facts, start), True, (), request.preflight)


def wants_launch(request: TrainRequest, placed: GpuChoice | None, torchrun: bool) -> bool:
    """Ranks through the launcher: several CPU ranks, several GPUs, or one GPU other than the first one
    CUDA shows (a process training in place uses that one)."""
    if torchrun:
        return False  # already one rank of a torchrun job
    if request.nproc_per_node and request.nproc_per_node > 1:
        return True
    if placed is None:
        return False
    return len(placed.gpus) > 1 or tuple(placed.gpus) != tuple(placed.visible[:1])


def _launch_request(
    request: TrainRequest, cfg: TrainConfig, facts: TrainFacts, start: runstart.Start
) -> LaunchRequest:
    from torchrig.launch.plan import LaunchRequest
    from torchrig.runtime.placement import indices_text
    from torchrig.train.rundir import LOCK_HOLDER_ENV

    gpus = request.gpus
    if gpus is None and facts.placed is not None:
        gpus = indices_text(facts.placed.gpus[:1])  # the first GPU that is yours to take
    cpu = request.nproc_per_node is not None or cfg.device == "cpu"
    return LaunchRequest(
        script="torchrig.train",
        module=True,
        script_args=tuple(cfg.to_argv()),
        gpus=None if cpu else gpus,
        force=request.force,
        cpu=cpu,
        nproc_per_node=request.nproc_per_node if cpu else None,
        log_dir=request.log_dir or str(request.out / "logs"),
        **dict(request.launch_options),
        rdzv_id=LAUNCH_ID,
        # rank 0 runs under this process's lock, and follows this plan's start
        extra_env=((LOCK_HOLDER_ENV, facts.holder), (runstart.START_ENV, start.to_env())),
    )


def plan_for(request: TrainRequest) -> TrainPlan:
    """:func:`build_plan` on this host's facts now."""
    return build_plan(request, observe(request))
