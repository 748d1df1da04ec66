"""A run folder and its checkpoints, without torch: who owns the folder, which checkpoints are intact, what
to prune, and durable writes.

A run folder (``--out``) belongs to one run. ``OUT/run.json`` holds the run's id; every checkpoint's
``meta.json`` repeats it and records the size and SHA-256 of each file DCP wrote. How a run starts in a
folder (new, ``--resume``, ``--overwrite``) is train/runstart.py's; here:

- pruning keeps the ``--keep-ckpts`` newest checkpoints of this run by step, never the one ``latest``
  names and never one another run wrote.

``sha256sum OUT/checkpoints/step-000200/*`` prints the same digests ``meta.json`` holds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig import inputfiles
from torchrig.accounts import account_name
from torchrig.argtypes import MAX_COUNT
from torchrig.errors import InputError, JobFailed, UsageError

RUN_FILE = "run.json"
LATEST = "latest"
META = "meta.json"
CHECKPOINTS = "checkpoints"
# What a run writes into OUT besides checkpoints/ (the launcher's logs/ are the current job's: never removed).
RUN_OUTPUTS = ("metrics.jsonl", "summary.json", "tensorboard", "profile")
# What the small files of a run folder may weigh, far above what torchrig writes: a bigger one is refused
# before it is read (a sparse 8 GB meta.json, a link to /dev/zero).
MAX_POINTER_BYTES = 4096  # "step-000200\n"
MAX_RUN_FILE_BYTES = 64 * 1024  # {"schema_version": 1, "run_id": ...}
MAX_META_BYTES = 64 * 2**20  # the config, the model spec and one digest per DCP file (~150 B each)
MAX_STEP = MAX_COUNT  # train --steps' own bound


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-", time.gmtime()) + uuid.uuid4().hex[:8]


# ---------------------------------------------------------------- durable writes


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably: a temporary file, fsynced, renamed over it,
    then the directory fsynced. A reader sees the old content or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ---------------------------------------------------------------- the checkpoints of a folder


@dataclass(frozen=True)
class Saved:
    """A complete checkpoint folder (``step-N/`` with a readable ``meta.json``)."""

    path: Path
    step: int
    run_id: str | None  # None: saved before run ids existed
    finite: bool = False  # its meta.json says its weights were checked finite (NaN/inf never saved)

    @property
    def name(self) -> str:
        return self.path.name


def read_meta(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json``; :class:`InputError` naming the file when it is missing, not a regular
    file, over :data:`MAX_META_BYTES`, malformed, or its ``step`` is not an integer in 0..MAX_STEP."""
    path = ckpt / META
    try:
        meta = inputfiles.read_json(path, "checkpoint meta.json", max_bytes=MAX_META_BYTES)
    except InputError as e:
        raise InputError(f"{path} is unreadable: {e.message}", hint="the checkpoint is damaged") from None
    step = meta.get("step") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or type(step) is not int:
        raise InputError(f"{path} is not a torchrig checkpoint's meta.json (no integer 'step')")
    if not 0 <= step <= MAX_STEP:
        raise InputError(
            f"{path} records step {str(step)[:40]}, outside 0..{MAX_STEP}",
            hint="the checkpoint is damaged",
        )
    return meta


def checkpoints(root: Path) -> list[Saved]:
    """The complete checkpoints under ``root`` (``OUT/checkpoints``), by step."""
    found = []
    if root.is_dir():
        for p in root.glob("step-*"):
            if not p.is_dir() or p.name.endswith(".tmp") or not (p / META).is_file():
                continue
            try:
                meta = read_meta(p)
            except InputError:
                continue
            rid = meta.get("run_id")
            found.append(
                Saved(p, int(meta["step"]), rid if isinstance(rid, str) else None, meta.get("finite") is True)
            )
    return sorted(found, key=lambda s: (s.step, s.name))


def unreadable(root: Path) -> list[tuple[int, str]]:
    """The checkpoint folders under ``root`` whose ``meta.json`` is missing or damaged, as (the step in the
    folder's name, what is wrong), so a resume that passes over them can say so."""
    found = []
    if root.is_dir():
        for p in root.glob("step-*"):
            digits = p.name[5:]
            if p.name.endswith(".tmp") or not p.is_dir() or not digits.isdigit() or len(digits) > 18:
                continue
            try:
                read_meta(p)
            except InputError as e:
                found.append((int(digits), e.one_line()))
    return sorted(found)


def pointer(root: Path) -> str | None:
    """What ``latest`` names (a folder name), or None without one (missing, or not a name). :class:`InputError`
    when ``latest`` is no small regular file (a FIFO, a device such as ``/dev/zero``, a folder, over
    :data:`MAX_POINTER_BYTES`): a hostile run folder is refused at once, never waited on or read without end."""
    path = root / LATEST
    if not os.path.lexists(path):
        return None
    try:
        data = inputfiles.read_bytes(path, "checkpoint pointer", max_bytes=MAX_POINTER_BYTES)
    except InputError as e:
        raise InputError(
            e.message, hint="it must be a small file naming a checkpoint folder: remove it"
        ) from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    return text if is_plain_name(text) else None


def latest(root: Path) -> Path | None:
    """The checkpoint ``latest`` names when it is complete, else None."""
    name = pointer(root)
    return root / name if name and (root / name / META).is_file() else None


def resume_order(root: Path) -> list[Saved]:
    """Where a resume looks, in order: the checkpoint ``latest`` names, then the same run's others, newest
    step first. (``latest`` dangling: the newest checkpoint's run.)"""
    saved = checkpoints(root)
    if not saved:
        return []
    name = pointer(root)
    head = next((s for s in saved if s.name == name), None) or saved[-1]
    rest = [s for s in reversed(saved) if s is not head and s.run_id == head.run_id]
    return [head, *rest]


# ---------------------------------------------------------------- checksums


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with inputfiles.open_regular(path, "checkpoint file") as f:  # streamed: a shard is GBs; a FIFO refused
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def data_files(folder: Path) -> list[str]:
    """The files DCP wrote into a checkpoint folder (``.metadata`` and the shards), sorted."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.is_file() and p.name != META and not p.name.startswith(".meta.json")
    )


def record_files(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes": n, "sha256": hex}}`` for ``names`` in ``folder``."""
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": digest(folder / n)} for n in names}


def is_plain_name(name: Any) -> bool:
    """A file name inside one folder: no path separator, not ``.`` or ``..``, printable."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and name.isprintable()
        and len(name) <= 255
    )


def regular_size(path: Path) -> int:
    """The size of a regular file (symbolic links followed); -1 for anything else or nothing."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


def check_files(folder: Path, recorded: dict[str, Any], names: list[str]) -> list[str]:
    """Problems with ``names`` against ``meta.json``'s record, one phrase each naming the file."""
    problems = []
    for n in names:
        want, path = recorded.get(n), folder / str(n)
        if not is_plain_name(n):  # never hash a path outside the checkpoint (a device, another file)
            problems.append(f"{folder / META} records {n!r:.80}, not a file of the checkpoint")
            continue
        if not isinstance(want, dict):
            continue
        try:
            if path.exists() and regular_size(path) < 0:
                problems.append(f"{path} is not a regular file")
                continue
            size = path.stat().st_size
            if size != want.get("bytes"):
                problems.append(f"{path} has {size} bytes, {want.get('bytes')} were saved")
            elif digest(path) != want.get("sha256"):
                problems.append(f"{path} is damaged (its SHA-256 differs from the one saved)")
        except FileNotFoundError:
            problems.append(f"{path} is missing")
        except OSError as e:
            problems.append(f"{path} is unreadable ({e.strerror or e})")
    return problems


def recorded_files(folder: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
    """``meta.json``'s file record, or None for a checkpoint saved before checksums existed."""
    files = meta.get("files")
    return files if isinstance(files, dict) and files else None


def verify(folder: Path, meta: dict[str, Any] | None = None) -> list[str]:
    """Every problem with a checkpoint's files (empty: intact, or saved before checksums)."""
    meta = meta if meta is not None else read_meta(folder)
    files = recorded_files(folder, meta)
    return check_files(folder, files, sorted(files)) if files else []


# ---------------------------------------------------------------- one run holds a folder

# OUT/.torchrig.lock: an advisory lock (flock) held by the run that writes OUT, for as long as it lives. The
# kernel drops it when the holder exits, however it exits (kill -9 included): nothing to clean up. Its bytes
# say who holds it (host, pid, user, since), for the refusal message only.
LOCK_FILE = ".torchrig.lock"
# set by `torchrig train` for the ranks it starts: "PID@HOST" of the launcher holding OUT's lock for them
LOCK_HOLDER_ENV = "TORCHRIG_RUN_LOCK_HOLDER"
_MAX_LOCK_INFO_BYTES = 4096
_held: dict[str, list[int]] = {}  # this process's locks: real path of OUT -> [fd, how many holds]


class FolderBusy(UsageError):
    """Another live run holds the run folder (exit 2: nothing was touched)."""


def holder_token() -> str:
    """This process as the lock records it: the value :data:`LOCK_HOLDER_ENV` gives its ranks."""
    return f"{os.getpid()}@{socket.gethostname()}"


def _lock_info(fd: int) -> dict[str, Any]:
    """What the holder wrote into the lock file (bounded: a few hundred bytes), or {} while it starts."""
    for _ in range(20):  # the holder writes right after it locks: wait a moment for it
        try:
            data = os.pread(fd, _MAX_LOCK_INFO_BYTES, 0)
            info = json.loads(data.decode("utf-8"))
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict):
            return info
        time.sleep(0.025)
    return {}


def _busy(out: Path, info: dict[str, Any]) -> FolderBusy:
    def show(key: str) -> str:
        v = info.get(key)
        return str(v)[:64].encode("ascii", "replace").decode() if isinstance(v, (str, int)) else "?"

    who = (
        f"pid {show('pid')} on {show('host')}, user {show('user')}, since {show('since')}"
        if info
        else "a process that is just starting"
    )
    return FolderBusy(
        f"{out} is in use by another run ({who})",
        hint="wait for it to end or stop it, or give this run another --out (the lock ends with its process)",
    )


def _open_lock(path: Path) -> int:
    flags = (
        os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise UsageError(
            f"cannot open the run folder's lock {path} ({e.strerror or e})",
            hint="remove it if it is a link or not a file; give an --out you can write to",
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(
            f"{path} is not a regular file", hint="remove it: torchrig creates its own lock file"
        )
    return fd


def _take(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(out / LOCK_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        info = _lock_info(fd)
        os.close(fd)
        if info and os.environ.get(LOCK_HOLDER_ENV) == f"{info.get('pid')}@{info.get('host')}":
            return -1  # our launcher holds it for its ranks
        raise _busy(out, info) from None
    except OSError as e:
        os.close(fd)
        raise UsageError(
            f"cannot lock the run folder {out} ({e.strerror or e})",
            hint="its filesystem has no working file locks (NFS mounted with 'nolock'?); see docs/training.md",
        ) from None
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "user": _user(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(OSError):  # who holds it is for messages only: a full disk does not stop the run
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    return fd


def _user() -> str:
    return account_name(os.getuid()) or str(os.getuid())


def launcher_holds(out: Path) -> bool:
    """Whether this process holds ``out`` through its launcher's lock (:data:`LOCK_HOLDER_ENV`): then the
    launcher decided how the run starts, and rank 0 follows that decision."""
    entry = _held.get(os.path.realpath(out))
    return entry is not None and entry[0] < 0


@contextlib.contextmanager
def hold(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock while the block runs (re-entrant in one process); :class:`FolderBusy` (exit 2) when
    another live process holds it, naming it. Only one process per run takes it: ``torchrig train`` (the
    launcher) or rank 0; ranks started by a launcher that holds it pass (:data:`LOCK_HOLDER_ENV`)."""
    key = os.path.realpath(out)
    if key in _held:
        _held[key][1] += 1
    else:
        _held[key] = [_take(out), 1]
    try:
        yield
    finally:
        entry = _held[key]
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            if entry[0] >= 0:
                os.close(entry[0])  # the lock ends with its last descriptor


# ---------------------------------------------------------------- pruning


def to_prune(
    saved: list[Saved], run_id: str, keep: int, saved_step: int, latest_name: str | None
) -> list[Saved]:
    """Which checkpoints a save of ``saved_step`` makes old: this run's, at or below that step, beyond the
    ``keep`` newest by step; never the one ``latest`` names. (0 keeps all. A checkpoint of this run above
    the step is one a resume went back from: it is replaced when the run reaches its step again.) Never
    the newest checkpoint recorded finite either: a run that diverged resumes from it."""
    if not keep:
        return []
    mine = [s for s in saved if s.run_id == run_id and s.step <= saved_step]
    old = sorted(mine, key=lambda s: s.step)[:-keep]
    finite = [s for s in saved if s.finite]
    newest_finite = max(finite, key=lambda s: s.step).name if finite else None
    return [s for s in old if s.name not in (latest_name, newest_finite)]


# ---------------------------------------------------------------- a full disk


class DiskFull(JobFailed):
    """The filesystem under ``--out`` filled up (exit 1: the run stopped; its last good checkpoint stays)."""


def resolve(path: Path) -> Path:
    """A checkpoint folder from a run folder, a checkpoints folder or a checkpoint folder itself."""
    for cand in (path, path / CHECKPOINTS):
        if (cand / META).is_file():
            return cand
        found = latest(cand)
        if found:
            return found
    raise FileNotFoundError(path)


def latest_or_none(root: Path) -> Path | None:
    """:func:`latest` for a message about another failure: a hostile ``latest`` is not that failure."""
    try:
        return latest(root)
    except InputError:
        return None


def disk_full_writing(path: Path, out: Path) -> DiskFull:
    """The error for a run output (metrics, summary) that no longer fits on its filesystem."""
    good = latest_or_none(out / CHECKPOINTS)
    return DiskFull(
        f"disk full: writing {path} failed with {size_text(free_bytes(path))} left on that filesystem; "
        + (f"the last good checkpoint is {good}" if good else "no checkpoint of this run was completed"),
        hint="free space or give --out on a larger disk, then continue with --resume",
    )


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an exception inside it: DCP's ``CheckpointException`` gathers each rank's) is
    a full filesystem or quota. torch's zip writer turns ENOSPC into ``unexpected pos``."""
    seen: set[int] = set()
    todo: list[Any] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, tuple):  # DCP's (exception, stack summary) per failed rank
            todo += [x for x in e if isinstance(x, BaseException)]
            continue
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        try:
            text = str(e)
        except Exception:  # a malformed exception's own __str__
            text = ""
        if "No space left" in text or "unexpected pos" in text or "Disk quota exceeded" in text:
            return True
        todo += [getattr(e, "__cause__", None), getattr(e, "__context__", None)]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += list(failures.values())
    return False


def free_bytes(path: Path) -> int | None:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def size_text(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
