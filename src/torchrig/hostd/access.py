"""Bind mounts checked against the caller's own permissions, as the caller.

The daemon runs as root and Docker mounts whatever it is told, so a host path a user asks for is first
resolved and checked *by a child process running as that user* (their UID, primary GID and supplementary
groups, from the account database): ``os.path.realpath`` follows links with the user's rights, then
``os.access`` asks the kernel whether the user may read (and, for a writable mount, write) the resolved
directory or file. The mount then uses the resolved path, so a link the user planted cannot point Docker
anywhere the check did not look. Shell equivalent: ``setpriv --reuid U --regid G --init-groups
test -r PATH``.

Left to the kernel's timing: a user who owns a folder on the resolved path can swap a component for a
link between the check and the engine's mount; the resolved path is re-checked for links by the daemon
just before the mount, which narrows but does not close that window (docs/threat-model.md).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from torchrig.hostd.policy import Caller, Refused


def _child(caller: Caller, path: str, write: bool) -> dict[str, object]:
    """In the forked child, as the caller: resolve ``path`` and ask the kernel for access."""
    os.setgroups([g for g in caller.groups if g != caller.gid])
    os.setgid(caller.gid)
    os.setuid(caller.uid)
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as err:
        return {"real": real, "error": err.strerror or str(err)}
    is_dir = stat.S_ISDIR(st.st_mode)
    mode = os.R_OK | (os.W_OK if write else 0) | (os.X_OK if is_dir else 0)
    return {"real": real, "ok": os.access(real, mode), "dir": is_dir}


def _as_caller(caller: Caller, path: str, write: bool) -> dict[str, object]:
    """Run :func:`_child` in a forked process (syscalls only, then ``_exit``) and read its answer."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the daemon's code
        code = 0
        try:
            os.close(r)
            os.write(w, json.dumps(_child(caller, path, write)).encode()[:65536])
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
    finally:
        os.close(r)
        _pid, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise Refused(f"--volume {path}: could not check your access to it")
    answer = json.loads(data)
    assert isinstance(answer, dict)
    return answer


def resolve_as(caller: Caller, path: str, *, write: bool) -> str:
    """The resolved ``path`` when ``caller`` may read it (and write it, for ``write``); :class:`Refused`
    otherwise, naming the path and what was missing."""
    want = "read and write" if write else "read"
    answer = _as_caller(caller, path, write)
    if "error" in answer:
        raise Refused(
            f"--volume {path}: {answer['error']} (as {caller.name})", hint="give a path you can read"
        )
    if not answer.get("ok"):
        raise Refused(
            f"--volume {path}: you ({caller.describe()}) may not {want} {answer['real']}",
            hint="mount only what you can use yourself" + ("" if not write else ", or add :ro"),
        )
    real = str(answer["real"])
    _no_links(real)
    return real


def _no_links(real: str) -> None:
    """Every component of the resolved path is still what the check saw: no link swapped in since."""
    here = Path("/")
    for part in Path(real).parts[1:]:
        here = here / part
        st = os.lstat(here)
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"--volume {real}: {here} became a symbolic link during the check: refused")
