"""How a run starts in its folder (``--out``), without torch: what the folder holds, read once (:func:`observe`),
and the decision, a pure function of it (:func:`decide`): a new run, ``--resume`` or ``--resume-if-possible``.

The rules (train/rundir.py's module text gives the folder's layout):

- a new run (no ``--resume``) in a folder that already holds a run is refused: continue it with
  ``--resume``, replace it with ``--overwrite``, or give a fresh ``--out``;
- ``--resume`` needs a checkpoint to resume from; ``--resume-if-possible`` starts at step 0 when there is
  none; an elastic restart (``--max-restarts``) always continues the run (:func:`restarted`).

The decision is made once, by whoever starts the run: ``torchrig train``'s plan (train/plan.py), which hands
it to rank 0 (in the same process, or through :data:`START_ENV` for the ranks it launches while holding the
folder's lock); rank 0 decides itself only when no such plan started it (plain ``torchrun``, or
``torchrig launch -m torchrig.train``). A decision made before the folder's lock was taken is checked
against the folder under the lock (:func:`confirm`): another run may have changed it in between.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchrig import inputfiles
from torchrig.errors import InputError, UsageError
from torchrig.train.rundir import (
    CHECKPOINTS,
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    RUN_OUTPUTS,
    Saved,
    atomic_write,
    checkpoints,
    step_name,
    unreadable,
)

MODES = ("new", "resume", "resume-if-possible")
# the decision that `torchrig train` hands to the ranks it launches (JSON: mode, run_id, remove)
START_ENV = "TORCHRIG_TRAIN_START"
# what --overwrite removes: the previous run's outputs, by name under OUT (never logs/: the current job's)
REPLACED = (RUN_FILE, CHECKPOINTS, *RUN_OUTPUTS)


@dataclass(frozen=True)
class Folder:
    """What a run folder holds, as :func:`observe` read it: the facts every start decision rests on."""

    not_folder: str | None  # out, or the first of its parents that exists, when that is no folder
    problem: tuple[str, str] | None  # (message, hint): out is no folder, or none can be made or written
    run_id: str | None  # OUT/run.json's run (None: none, or unreadable as JSON)
    run_file_error: tuple[str, str | None] | None  # run.json is no small regular file: (message, hint)
    saved: tuple[Saved, ...]  # the complete checkpoints, by step
    damaged: tuple[tuple[int, str], ...]  # checkpoint folders whose meta.json is missing or damaged
    metrics: bool  # OUT/metrics.jsonl exists
    step_folders: bool  # OUT/checkpoints/step-* folders exist (complete or not)
    outputs: tuple[str, ...]  # which of REPLACED exist (a link counts)


@dataclass(frozen=True)
class Start:
    """How a run starts in its folder: decided by :func:`decide` (which changes nothing)."""

    mode: str  # "new" | "resume" (a checkpoint must be found) | "resume-if-possible"
    run_id: str | None  # the folder's run (None: a new run gets a new id)
    remove: tuple[Path, ...] = ()  # what --overwrite removes: the previous run's outputs
    seen: Folder | None = field(default=None, compare=False)  # the facts it was decided on (None: unknown)

    def to_env(self) -> str:
        """The decision as :data:`START_ENV`'s value, for the ranks a launcher starts (names, not paths)."""
        return json.dumps({"mode": self.mode, "run_id": self.run_id, "remove": [p.name for p in self.remove]})


def run_id_of(out: Path) -> str | None:
    """``run.json``'s run id; None when it is missing or holds none. :class:`InputError` when it is no small
    regular file (a FIFO, a device, over :data:`MAX_RUN_FILE_BYTES`)."""
    path = out / RUN_FILE
    if not os.path.lexists(path):
        return None
    try:
        data = inputfiles.read_bytes(path, "run file", max_bytes=MAX_RUN_FILE_BYTES)
    except InputError as e:
        raise InputError(e.message, hint="it must be the small file torchrig wrote: remove it") from None
    try:
        rid = inputfiles.loads_json(data.decode("utf-8"), "run file", str(path)).get("run_id")
    except (InputError, UnicodeDecodeError, AttributeError):
        return None
    return rid if isinstance(rid, str) and rid.isprintable() and len(rid) <= 200 else None


def _base(out: Path) -> Path | None:
    """Where ``out`` is, or would be made: ``out`` or the first of its parents that exists."""
    return next((p for p in (out, *out.parents) if p.exists()), None)


def _problem(out: Path, base: Path | None) -> tuple[str, str] | None:
    if out.exists() and not out.is_dir():
        return f"--out {out} is not a folder", "give a folder for the run's outputs"
    if base is not None and (not base.is_dir() or not os.access(base, os.W_OK | os.X_OK)):
        return f"--out {out}: cannot create or write in {base}", "give a folder you can write to"
    return None


def observe(out: Path) -> Folder:
    """Read what ``out`` holds (nothing is changed; a damaged run.json is a fact, raised by the decision)."""
    root = out / CHECKPOINTS
    base = _base(out)
    run_id, run_file_error = None, None
    try:
        run_id = run_id_of(out)
    except InputError as e:
        run_file_error = (e.message, e.hint)
    return Folder(
        not_folder=str(base) if base is not None and not base.is_dir() else None,
        problem=_problem(out, base),
        run_id=run_id,
        run_file_error=run_file_error,
        saved=tuple(checkpoints(root)),
        damaged=tuple(unreadable(root)),
        metrics=(out / "metrics.jsonl").exists(),
        step_folders=root.is_dir() and any(root.glob("step-*")),
        outputs=tuple(n for n in REPLACED if (out / n).exists() or (out / n).is_symlink()),
    )


def describe(folder: Folder) -> str | None:
    """What earlier run the folder holds, in a few words; None when it holds none."""
    parts = []
    if folder.run_id:
        parts.append(f"run {folder.run_id}")
    if folder.saved:
        parts.append(f"checkpoints up to {folder.saved[-1].name}")
    elif folder.metrics:
        parts.append("a metrics.jsonl")
    if not parts and folder.step_folders:
        parts.append("checkpoint folders")
    return ", ".join(parts) or None


def _run_id(folder: Folder) -> str | None:
    if folder.run_file_error is not None:
        message, hint = folder.run_file_error
        raise InputError(message, hint=hint)
    return folder.run_id


def decide(
    out: Path, folder: Folder, *, resume: bool, if_possible: bool, overwrite: bool, restart: int = 0
) -> Start:
    """How a run starts in ``out`` holding ``folder``; :class:`UsageError` (exit 2) when it must not start."""
    if overwrite and (resume or if_possible):
        raise UsageError("--overwrite replaces the folder's run; --resume continues it", hint="choose one")
    if folder.problem is not None:
        raise UsageError(folder.problem[0], hint=folder.problem[1])
    if restart > 0 or if_possible:
        return Start("resume-if-possible", _run_id(folder), seen=folder)
    if resume:
        _require_checkpoint(out, folder)
        return Start("resume", _run_id(folder), seen=folder)
    _run_id(folder)
    held = describe(folder)
    if held and not overwrite:
        raise UsageError(
            f"{out} already holds another run ({held})",
            hint="continue it with --resume, replace it with --overwrite, or give this run a fresh --out",
        )
    return Start("new", None, tuple(out / n for n in folder.outputs), seen=folder)


def _require_checkpoint(out: Path, folder: Folder) -> None:
    if not folder.saved and folder.damaged:
        raise UsageError(
            f"--resume: no intact checkpoint in {out / CHECKPOINTS}: "
            + "; ".join(f"{step_name(n)}: {why}" for n, why in folder.damaged[-3:]),
            hint="restore the files, or start a new run with --overwrite or a fresh --out",
        )
    if not folder.saved:
        raise UsageError(
            f"--resume: no checkpoint to resume from in {out / CHECKPOINTS}",
            hint=f"check --out (is {out} the run's folder?); --resume-if-possible starts at step 0 "
            "when there is none",
        )


def plan_start(out: Path, *, resume: bool, if_possible: bool, overwrite: bool, restart: int = 0) -> Start:
    """:func:`decide` on what ``out`` holds now."""
    return decide(
        out, observe(out), resume=resume, if_possible=if_possible, overwrite=overwrite, restart=restart
    )


def restarted(out: Path) -> Start:
    """How an elastic restart (attempt 1, 2, ...) starts: it continues the folder's run, from its newest
    intact checkpoint or from step 0, whatever the first attempt was asked (it may have saved since)."""
    return Start("resume-if-possible", run_id_of(out))


def confirm(out: Path, start: Start) -> Start:
    """``start`` once ``out``'s lock is held: :class:`UsageError` when the folder no longer holds what it was
    decided on (another run changed it between the decision and the lock)."""
    if start.seen is not None and observe(out) != start.seen:
        raise UsageError(
            f"{out} changed while this run was starting (another run wrote to it)",
            hint="run the command again: it decides on what the folder holds then",
        )
    return start


def from_env(out: Path, value: str) -> Start:
    """The decision a launcher handed over in :data:`START_ENV` (:meth:`Start.to_env`); :class:`UsageError` when
    it is not what ``torchrig train`` writes."""
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not _valid_start(data):
        raise UsageError(
            f"{START_ENV} is not what torchrig train sets for its ranks",
            hint=f"unset {START_ENV}; torchrig train sets it itself",
        )
    mode, run_id, names = data["mode"], data["run_id"], data["remove"]
    return Start(mode, run_id, tuple(out / n for n in names))


def _valid_start(data: dict[str, Any]) -> bool:
    if set(data) != {"mode", "run_id", "remove"}:
        return False
    mode, run_id, names = data["mode"], data["run_id"], data["remove"]
    if mode not in MODES or not isinstance(names, list) or not all(n in REPLACED for n in names):
        return False
    return run_id is None or (isinstance(run_id, str) and run_id.isprintable() and len(run_id) <= 200)


def claim(out: Path, start: Start, run_id: str) -> list[str]:
    """Carry out a start in the folder (rank 0 only): remove what ``--overwrite`` replaces, write
    ``run.json``. Returns one line per thing removed, for the log."""
    said = []
    for p in start.remove:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        said.append(f"--overwrite: removed the previous run's {p}")
    out.mkdir(parents=True, exist_ok=True)
    if run_id_of(out) != run_id:
        atomic_write(out / RUN_FILE, json.dumps({"schema_version": 1, "run_id": run_id}, indent=2) + "\n")
    return said
