"""Atomic, verified, resharding checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under ``OUT/checkpoints/``::

    step-000200/      a complete DCP checkpoint (.metadata + the shard files) and meta.json
    step-000300.tmp/  a save in progress (never read; removed on the next start)
    latest            the name of the newest complete checkpoint, replaced atomically

A save writes into ``step-N.tmp/`` (DCP fsyncs each file). When every rank has finished, the ranks hash the
files (SHA-256, each rank a share of them) and rank 0 writes ``meta.json`` with the digests (a temporary
file, fsynced, renamed), renames the folder to ``step-N/`` (atomic on one filesystem), fsyncs the folder,
and replaces ``latest`` the same way. A crash at any moment leaves ``latest`` on the previous complete
checkpoint. Loading verifies the digests first and reads DCP's ``.metadata`` (a pickle) with an unpickler
that admits only DCP's metadata records, so a crafted checkpoint cannot run code. DCP stores each tensor
with its global shape, so a checkpoint saved by N ranks (DDP or FSDP2 shards) loads on M ranks, or in one
process. Every rank must see the same ``OUT`` (one filesystem, shared across nodes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from torchrig import inputfiles, safepickle
from torchrig.errors import InputError, JobFailed
from torchrig.train import rundir
from torchrig.train.rundir import LATEST, META, DiskFull, latest, read_meta, step_name

__all__ = ["LATEST", "META", "latest", "load", "load_model_only", "read_meta", "resolve", "save", "step_name"]

try:  # a BaseException: DCP raises it on every rank when any rank's save or load failed
    from torch.distributed.checkpoint.api import CheckpointException
except ImportError:  # pragma: no cover
    CheckpointException = RuntimeError  # type: ignore[misc,assignment,unused-ignore]  # only with torch installed


# DCP's warning when no process group runs (one process): that is this module's intent, not a mistake.
_ONE_PROCESS = ".*assuming the intent is to (load|save) in a single process.*"


# ---------------------------------------------------------------- reading .metadata safely

# Where DCP's metadata records live (torch 2.x; the sharded-tensor module held TensorProperties before 2.2).
# Only dataclasses and enums of these modules are admitted, so a renamed record still loads.
_DCP_MODULES = frozenset(
    {
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem",
        "torch.distributed._shard.sharded_tensor.metadata",
    }
)
_PLAIN = frozenset(
    {
        (
            "torch.serialization",
            "_get_layout",
        ),  # a layout by name (torch's own weights-only loader admits it)
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("pathlib._local", "PosixPath"),  # Python 3.13's module for them
        ("pathlib._local", "WindowsPath"),
        ("collections", "OrderedDict"),
    }
)


def _admit_dcp(module: str, name: str, resolve: Any) -> bool:
    if module in _DCP_MODULES:
        obj = resolve()
        return isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
    if module == "torch" and name.isidentifier():
        obj = resolve()
        return obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format))
    return (module, name) in _PLAIN


# DCP's .metadata lists each tensor's chunks: tens of MiB for the largest sharded models; a bigger file is
# refused before it is read into memory
MAX_DCP_METADATA_BYTES = 1 << 30


def read_dcp_metadata(path: Path) -> Any:
    """DCP's ``.metadata`` through the restricted unpickler; :class:`InputError` naming the file otherwise."""
    try:  # a regular file of at most the bound, or refused before a byte is read (a FIFO, /dev/zero)
        data = inputfiles.read_bytes(path, "DCP metadata", max_bytes=MAX_DCP_METADATA_BYTES)
    except InputError as e:
        raise InputError(
            e.message, hint="the checkpoint is incomplete, damaged or not a torchrig one"
        ) from None
    what = "a checkpoint's .metadata holds DCP's metadata records only"
    try:
        return safepickle.loads(data, _admit_dcp, what)
    except safepickle.RefusedPickle as e:
        raise InputError(
            f"{path} refused: {e}", hint="a checkpoint from an untrusted source; nothing in it was run"
        ) from None
    except Exception as e:  # a truncated or foreign file: any unpickling error
        raise InputError(
            f"{path} is not DCP metadata ({type(e).__name__})", hint="the checkpoint is damaged"
        ) from None


def check_storage(md: Any, folder: Path) -> None:
    """DCP's storage records (which bytes of which file hold each tensor) point into this folder's own
    files, within their sizes: a crafted ``.metadata`` cannot make DCP read ``/dev/zero``, another
    folder's files or past a file's end. :class:`InputError` naming ``.metadata`` otherwise."""
    where = folder / ".metadata"
    storage, tensors = getattr(md, "storage_data", None), getattr(md, "state_dict_metadata", None)
    if not isinstance(storage, dict) or not isinstance(tensors, dict):
        raise InputError(
            f"{where} is not DCP metadata (no storage records)", hint="the checkpoint is damaged"
        )
    sizes: dict[str, int] = {}
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(name, str) or not rundir.is_plain_name(name):
            raise InputError(
                f"{where} points at {name!r:.80}, not a file of {folder}",
                hint="the checkpoint is damaged or crafted; nothing was read from that path",
            )
        if name not in sizes:
            sizes[name] = rundir.regular_size(folder / name)
            if sizes[name] < 0:
                raise InputError(
                    f"{where} points at {name}, which is missing or not a regular file in {folder}",
                    hint="the checkpoint is incomplete or damaged",
                )
        start = offset if isinstance(offset, int) and not isinstance(offset, bool) else -1
        count = length if isinstance(length, int) and not isinstance(length, bool) else -1
        if start < 0 or count < 0 or start + count > sizes[name]:
            raise InputError(
                f"{where} records bytes {offset!r:.30}..+{length!r:.30} of {name}, outside its {sizes[name]} "
                "bytes",
                hint="the checkpoint is damaged or crafted",
            )


class SafeReader(FileSystemReader):
    """DCP's file reader, with ``.metadata`` read by :func:`read_dcp_metadata` instead of ``pickle.load`` and
    its storage records checked (:func:`check_storage`). Given ``checked``, the metadata already read and
    checked, DCP gets that very object: a file replaced between the check and the load changes nothing."""

    def __init__(self, path: str, checked: Any = None) -> None:
        super().__init__(path)
        self.checked = checked

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        rank = kwargs.get("rank")  # set when each rank wrote its own metadata (DCP without collectives)
        if rank is None and self.checked is not None:
            md = self.checked
        else:
            md = read_dcp_metadata(Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata"))
            check_storage(md, Path(self.path))
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        if hasattr(self, "load_id"):
            md.storage_meta.load_id = self.load_id
        return md


# ---------------------------------------------------------------- the ranks agree


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _is_main() -> bool:
    return _rank_world()[0] == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (one small collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agree(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    return _gather(obj)[0]


def _say(line: str) -> None:
    print(f"torchrig train: {line}", file=sys.stderr, flush=True)


def verify(folder: Path, meta: dict[str, Any]) -> list[str]:
    """Problems with a checkpoint's files (every rank checks a share; all ranks get the same list)."""
    files = rundir.recorded_files(folder, meta)
    if files is None:
        return []
    rank, world = _rank_world()
    names = sorted(files)
    mine = rundir.check_files(folder, files, names[rank::world])
    return sorted(p for part in _gather(mine) for p in part)


resolve = rundir.resolve  # a checkpoint folder from a run, checkpoints or checkpoint folder (no torch there)


def clean_partial(root: Path) -> None:
    """Remove unfinished saves (``*.tmp``) left by a crash; rank 0 only, before training starts."""
    if _is_main() and root.is_dir():
        for p in root.glob("step-*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
    _barrier()


# ---------------------------------------------------------------- saving


def _portable(osd: dict[str, Any]) -> dict[str, Any]:
    """The optimizer's state as every run saves it: the step graph (train/stepgraph.py) holds the learning rate
    as a GPU tensor and sets ``capturable``, run-time settings that are not state. Saved as they are, a run
    with --step-graph and one without could not resume each other's checkpoints (DCP matches the saved
    entries' kinds: a tensor against a float). The state dict's groups are copies; the optimizer keeps its own."""
    groups = osd.get("param_groups")
    if not isinstance(groups, list):
        return osd
    out = []
    for g in groups:
        g = dict(g)
        if isinstance(g.get("lr"), torch.Tensor):
            g["lr"] = float(g["lr"].item())
            g["capturable"] = False
        out.append(g)
    return {**osd, "param_groups": out}


def save(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optim: torch.optim.Optimizer,
    meta: dict[str, Any],
    *,
    keep: int,
    run_id: str,
    before_commit: Any = None,
) -> Path:
    """Save a checkpoint atomically and durably; every rank calls this. Returns the final folder."""
    tmp, final = root / f"{step_name(step)}.tmp", root / step_name(step)
    rank, world = _rank_world()
    try:
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        _barrier()
        msd, osd = get_state_dict(model, optim)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_ONE_PROCESS)
            dcp.save({"model": msd, "optim": _portable(osd)}, checkpoint_id=str(tmp))
        _barrier()  # every rank's shard is on disk (DCP fsynced each file)
    except (Exception, CheckpointException) as e:  # DCP raises on every rank when one rank's write failed
        _failed(root, tmp, step, e)
    names = rundir.data_files(tmp)
    local: OSError | None = None
    try:
        mine = rundir.record_files(tmp, names[rank::world])
    except OSError as e:
        mine, local = {}, e
    parts = _gather((mine, _brief(local)))
    _raise_any(root, tmp, step, local, [p[1] for p in parts])
    if before_commit is not None:
        before_commit()  # a test hook: a crash here must leave the last good checkpoint intact
    local = None
    if rank == 0:
        try:
            files = {k: v for part, _ in parts for k, v in part.items()}
            _commit(root, tmp, final, {**meta, "step": step, "run_id": run_id, "files": files})
            for old in rundir.to_prune(rundir.checkpoints(root), run_id, keep, step, final.name):
                shutil.rmtree(old.path, ignore_errors=True)
        except OSError as e:
            local = e
    _raise_any(root, tmp, step, local, _gather(_brief(local)))
    return final


def _brief(err: OSError | None) -> tuple[int | None, str] | None:
    return (err.errno, str(err)) if err is not None else None


def _raise_any(root: Path, tmp: Path, step: int, local: OSError | None, briefs: list[Any]) -> None:
    """When any rank's part of a save failed, every rank reports it (the same error on each)."""
    first = next((b for b in briefs if b), None)
    if first is not None:
        _failed(root, tmp, step, local or OSError(first[0], first[1]))


def _commit(root: Path, tmp: Path, final: Path, meta: dict[str, Any]) -> None:
    rundir.atomic_write(tmp / META, json.dumps(meta, indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)  # this run's own checkpoint of the same step (one a resume went back from)
    os.replace(tmp, final)
    rundir.fsync_dir(root)
    rundir.atomic_write(root / LATEST, final.name + "\n")


def _failed(root: Path, tmp: Path, step: int, err: BaseException) -> None:
    """A save failed on every rank: free its partial folder, say why in one line, keep ``latest``."""
    free = rundir.free_bytes(root)
    _barrier_quiet()
    if _is_main():
        shutil.rmtree(
            tmp, ignore_errors=True
        )  # frees the space, so the logs and metrics can still be written
    good = rundir.latest_or_none(root)
    last = f"the last good checkpoint is {good}" if good else "no checkpoint of this run was completed"
    if rundir.is_disk_full(err):
        need = (
            sum(int(f.get("bytes", 0)) for f in (read_meta(good).get("files") or {}).values()) if good else 0
        )
        raise DiskFull(
            f"disk full: saving {step_name(step)} to {root} failed with {rundir.size_text(free)} left on that "
            f"filesystem"
            + (f" (a checkpoint takes about {rundir.size_text(need)})" if need else "")
            + f"; {last}",
            hint="free space or give --out on a larger disk, then continue with --resume",
        ) from None
    raise JobFailed(f"saving {step_name(step)} to {root} failed: {_first_line(err)}; {last}") from None


def _first_line(err: BaseException) -> str:
    """One line for an error; for DCP's ``CheckpointException``, the first failed rank's error."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, pair = next(iter(failures.items()))
        inner = pair[0] if isinstance(pair, tuple) and pair else pair
        return f"rank {rank}: {_first_line(inner)}"
    try:
        text = str(err).strip()
    except Exception:
        text = ""
    first = (text.splitlines() or [""])[0][:300]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _barrier_quiet() -> None:
    with contextlib.suppress(Exception):  # a rank already gone: the error still gets reported
        _barrier()


# ---------------------------------------------------------------- loading


def _dcp_load(state: dict[str, Any], ckpt: Path, **kwargs: Any) -> None:
    md = read_dcp_metadata(ckpt / ".metadata")
    check_storage(md, ckpt)  # refuse a crafted file before DCP reads a byte of the shards
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_ONE_PROCESS)
            dcp.load(state, storage_reader=SafeReader(str(ckpt), checked=md), **kwargs)
    except (Exception, CheckpointException) as e:
        causes = (
            [e, *getattr(e, "failures", {}).values()]
            if isinstance(getattr(e, "failures", None), dict)
            else [e]
        )
        for c in causes:
            inner = c[0] if isinstance(c, tuple) and c else c  # DCP's (exception, stack) per rank
            if isinstance(inner, InputError):
                raise inner from None
        raise InputError(
            f"cannot load {ckpt}: {_first_line(e)}", hint="the checkpoint is damaged or from another model"
        ) from None


def load(ckpt: Path, model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """Load model and optimizer state (resharded to this run's layout); returns the checkpoint's meta.
    The caller verified the files (:func:`verify`)."""
    msd, osd = get_state_dict(model, optim)
    _dcp_load({"model": msd, "optim": osd}, ckpt)  # fills msd and osd in place
    set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd)
    return read_meta(ckpt)


def load_model_only(ckpt: Path, model: torch.nn.Module) -> None:
    """Load just the weights into an unsharded model in a single process (no process group needed)."""
    msd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    state = {"model": msd}
    _dcp_load(state, ckpt)
    model.load_state_dict(state["model"])


# ---------------------------------------------------------------- resuming


def _find_intact(root: Path) -> tuple[Path | None, list[str]]:
    skipped: list[str] = []
    name = rundir.pointer(root)
    if name and latest(root) is None:
        skipped.append(f"latest names {name}, which is not a complete checkpoint")
    for cand in rundir.resume_order(root):
        meta = read_meta(cand.path)
        problems = verify(cand.path, meta)
        if not problems:
            try:
                check_storage(read_dcp_metadata(cand.path / ".metadata"), cand.path)
            except InputError as e:
                problems = [e.one_line()]
        if not problems:
            if rundir.recorded_files(cand.path, meta) is None:
                _say(f"{cand.path} was saved without checksums: resuming from it unverified")
            return cand.path, skipped
        skipped.append(f"{cand.name}: {'; '.join(problems)}")
    return None, skipped


def find_intact(root: Path) -> tuple[Path | None, list[str]]:
    """The newest intact checkpoint to resume from (``latest`` first) and what was wrong with each newer
    one, a folder whose ``meta.json`` is damaged included; every rank calls this and gets the same answer."""
    found, skipped = _find_intact(root)
    step = read_meta(found)["step"] if found is not None else None
    newer = [f"{step_name(n)}: {why}" for n, why in rundir.unreadable(root) if step is None or n > step]
    return found, newer + skipped
