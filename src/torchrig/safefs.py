"""State files opened without following links: the lease ledger, the host daemon's state and audit log.

A folder that someone else can write is a place where a file can be swapped for a symbolic link between
two commands; a root process that then opens the name writes wherever the link points. Every state file
torchrig keeps is therefore opened here: ``O_NOFOLLOW`` (a link in the last component fails with ``ELOOP``),
``fstat`` on the opened descriptor (a regular file, one hard link, the expected owner), modes set with
``fchmod`` on that descriptor rather than on the name. Folders are checked with ``lstat``: a link is refused,
and a private folder must belong to this process's user with no access for group or others.

Each refusal is an :class:`UnsafePath` (exit 2) whose one line says what was found and how to fix it.
Shell equivalent of the checks: ``stat -c '%F %U %a' PATH``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from torchrig.accounts import account_name
from torchrig.errors import InputError


class UnsafePath(InputError):
    """A state path that is a link, not the expected kind of file, or owned or writable by someone else."""


def _who(uid: int) -> str:
    return account_name(uid) or f"UID {uid}"


def refuse_link(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(
            f"{path} is a symbolic link (to {os.readlink(path)!r}): refused, torchrig does not follow links "
            "in its state folders",
            hint=f"remove the link (rm {path}) and check who planted it; {_who(st.st_uid)} owns it",
        )


def check_dir(path: Path, *, private: bool) -> os.stat_result:
    """``path`` is a real directory (not a link); ``private``: owned by this user, no group/other access."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePath(f"{path} does not exist", hint="create it, or let torchrig create it") from None
    refuse_link(path, st)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory", hint="move it away; torchrig keeps its state there")
    if private and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
        raise UnsafePath(
            f"{path} must be private to {_who(os.geteuid())} (mode 0700), but is owned by "
            f"{_who(st.st_uid)} with mode {st.st_mode & 0o7777:o}",
            hint=f"chown {_who(os.geteuid())} {path} && chmod 700 {path}, or give another folder",
        )
    return st


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) when missing, then :func:`check_dir` it as private. Parents that others
    could write without the sticky bit are refused too: a link could be swapped in above the folder."""
    path = Path(os.path.abspath(path))
    for parent in reversed(path.parents):
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            continue  # /var/run -> /run and the like: owned by root, checked through their target below
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX and st.st_uid != os.geteuid():
            raise UnsafePath(
                f"{parent} (above {path}) may be written by others (mode {st.st_mode & 0o7777:o}, no sticky bit)",
                hint="keep torchrig's state under a folder only root can write, e.g. /var/lib/torchrig-host",
            )
    with contextlib.suppress(FileExistsError):
        os.makedirs(path, mode=0o700, exist_ok=True)
    check_dir(path, private=True)
    return path


def open_nofollow(path: Path, flags: int, mode: int = 0o600, *, owners: tuple[int, ...] | None = None) -> int:
    """``os.open`` that refuses a link, a non-regular file, a file with other hard links and (with
    ``owners``) a file owned by anyone else; returns the descriptor (the caller closes it)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as err:
        # ELOOP: O_NOFOLLOW met a link; EACCES: the kernel's protected_symlinks/protected_regular refused it
        if err.errno in (errno.ELOOP, errno.EACCES) and os.path.islink(path):
            refuse_link(path, os.lstat(path))
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path} is not a regular file", hint=f"move it away (mv {path} {path}.bad)")
        if st.st_nlink > 1:
            raise UnsafePath(
                f"{path} has {st.st_nlink} hard links: refused (it may be another file under this name)",
                hint=f"move it away (mv {path} {path}.bad) and check who made the link",
            )
        if owners is not None and st.st_uid not in owners:
            raise UnsafePath(
                f"{path} belongs to {_who(st.st_uid)}, not to {' or '.join(_who(u) for u in owners)}: refused",
                hint=f"move it away (mv {path} {path}.bad) and check who made it",
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_file(path: Path) -> None:
    """An existing ``path`` must be a regular file with one link (absent is fine)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    refuse_link(path, st)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        raise UnsafePath(
            f"{path} is not a plain file (or has other hard links): refused",
            hint=f"move it away (mv {path} {path}.bad) and check who made it",
        )


def append_line(path: Path, line: str) -> None:
    """Append one line to a root-owned log (created 0600): ``O_APPEND``, no link followed."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600, owners=(os.geteuid(),))
    try:
        os.write(fd, line.encode("utf-8", "replace") + b"\n")
    finally:
        os.close(fd)
