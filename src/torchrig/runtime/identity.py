"""Run the image's user under the host user's UID/GID, so files written to volumes belong to the user.

The image's user (``org.torchrig.user`` = ``NAME:UID:GID``) keeps its name and home; before the container
starts, its ``/etc/passwd`` and ``/etc/group`` entries are rewritten to the host UID/GID and its home and
working directory are handed to that UID (not recursively: image files stay readable). The container
then runs as ``UID:GID``. Pure text functions; the engine adapter copies the files in and out.
"""

from __future__ import annotations


class RemapConflict(ValueError):
    """The host UID already names another account in the image (the remap would be ambiguous)."""


def remap_passwd(passwd: str, name: str, uid: int, gid: int) -> tuple[str, str]:
    """``passwd`` with ``name``'s UID/GID replaced; returns (new text, home). Raises on conflicts."""
    out, home = [], None
    for line in passwd.splitlines():
        f = line.split(":")
        if len(f) >= 7 and f[0] == name:
            f[2], f[3], home = str(uid), str(gid), f[5]
            line = ":".join(f)
        elif len(f) >= 7 and f[2] == str(uid):
            raise RemapConflict(f"UID {uid} is already {f[0]!r} in the image")
        out.append(line)
    if home is None:
        raise RemapConflict(f"the image has no user {name!r}")
    return "\n".join(out) + "\n", home


def remap_group(group: str, name: str, old_gid: int | None, gid: int) -> str:
    """``group`` with the user's own group (same name, or the old GID) moved to ``gid``."""
    out = []
    for line in group.splitlines():
        f = line.split(":")
        if len(f) >= 4 and (f[0] == name or (old_gid is not None and f[2] == str(old_gid))):
            f[2] = str(gid)
            line = ":".join(f)
        out.append(line)
    return "\n".join(out) + "\n"
