"""torchrig's built-in trainer: GPT or ResNet, DDP or FSDP2, AMP, torch.compile, accumulation, DCP checkpoints.

The API ``torchrig train`` calls, like the launch API (request -> plan -> run -> typed result)::

    from torchrig.train import TrainRequest, train
    from torchrig.train.config import TrainConfig
    result = train(TrainRequest(TrainConfig(size="tiny", steps=20), gpus="2"))   # -> run.TrainResult
    result.exit_code, result.summary, result.to_json()    # summary: record.TrainSummary (typed)

The pieces: ``plan`` (``TrainRequest``, ``observe`` -> ``TrainFacts``, the pure ``build_plan`` ->
``TrainPlan``: what runs where, and how the run starts in its folder, decided once), ``run`` (``run(plan)``:
in this process or through the launch API; ``TrainResult``).

Modules of the trainer itself: ``config`` (options, sizes), ``models``, ``data`` (datasets, resumable
sampler), ``setup`` (process group, wrapping), ``loop`` (the steps), ``resume`` (where a rank's run starts),
``summary`` (the run's summary, built once as ``record.TrainSummary``: typed, torch-free, read back from
``summary.json`` by ``record.read_summary``), ``checkpoint`` (atomic, verified, resharding DCP), ``rundir``
(a run folder's lock, checksums, pruning; no torch), ``runstart`` (how a run starts in its folder; no
torch), ``metrics`` (JSONL, TensorBoard, MFU). Nothing here is imported by ``torchrig --help``; this package's own import is light (the
ranks import it first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchrig.train.plan import TrainRequest
    from torchrig.train.run import TrainResult


def train(request: TrainRequest) -> TrainResult:
    """``run.train``: plan ``request`` on this host and run it; imported only when called."""
    from torchrig.train.run import train as run_train

    return run_train(request)


def __getattr__(name: str) -> Any:
    if name in ("TrainRequest", "TrainPlan", "TrainFacts", "build_plan", "plan_for"):
        from torchrig.train import plan

        return getattr(plan, name)
    if name == "TrainResult":
        from torchrig.train.run import TrainResult

        return TrainResult
    raise AttributeError(f"module 'torchrig.train' has no attribute {name!r}")
