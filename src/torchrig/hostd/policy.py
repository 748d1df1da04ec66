"""Who is asking, and may they: the host daemon's decisions, as pure functions of plain records.

The caller is who the kernel says is at the other end of the socket (``SO_PEERCRED``: pid, uid, gid;
the shell equivalent is ``ss -xp``); their groups come from the account database (``id -G USER``), never
from the request. An *admin* is root or a member of the admin group (``torchrig-admin`` unless the
daemon is started with ``--admin-group``): admins see and stop everything, and each time they act on
someone else's environment the audit log says so.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import dataclass

from torchrig.errors import UsageError

DEFAULT_ADMIN_GROUP = "torchrig-admin"


class Refused(UsageError):
    """The caller may not do this (exit 2); the daemon logs it as refused."""


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    name: str
    groups: tuple[int, ...]  # every group of the account, the primary one included
    admin: bool

    def describe(self) -> str:
        return f"{self.name} (UID {self.uid})"


def peer_ids(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, from the kernel."""
    fmt = "3i"
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
    pid, uid, gid = struct.unpack(fmt, raw)
    return pid, uid, gid


def caller_of(pid: int, uid: int, gid: int, admin_gid: int | None) -> Caller:
    """The :class:`Caller` for kernel-given ids: name and groups from the account database."""
    import os
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
        groups = tuple(sorted(set(os.getgrouplist(name, gid))))
    except KeyError:  # a UID with no account (a container's user mapped through): no groups but its own
        name, groups = str(uid), (gid,)
    admin = uid == 0 or (admin_gid is not None and admin_gid in groups)
    return Caller(pid, uid, gid, name, groups, admin)


def admin_gid_of(group: str) -> int | None:
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def may_act_on(caller: Caller, owner_uid: int | None, *, force: bool = False) -> str | None:
    """Whether ``caller`` may act on something owned by ``owner_uid``: None when refused, else why allowed
    ("owner", or "admin" for an admin acting on another's; an admin's ``down`` needs ``force``)."""
    if owner_uid is not None and owner_uid == caller.uid:
        return "owner"
    if caller.admin and force:
        return "admin"
    return None


def refusal(caller: Caller, what: str, owner: str, *, admin_hint: bool = True) -> Refused:
    hint = (
        "only its owner may; an admin (group torchrig-admin) can with --force"
        if admin_hint
        else "only its owner may"
    )
    return Refused(f"{what} belongs to {owner}, not you ({caller.describe()})", hint=hint)


def audit_line(
    caller: Caller, verb: str, target: str, outcome: str, reason: str, at_s: float | None = None
) -> str:
    """One audit record as a JSON line: who (kernel ids and name), what, on what, when, and the outcome."""
    return json.dumps(
        {
            "time": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(at_s if at_s is not None else time.time())
            ),
            "uid": caller.uid,
            "gid": caller.gid,
            "pid": caller.pid,
            "user": caller.name,
            "admin": caller.admin,
            "verb": verb,
            "target": target,
            "outcome": outcome,  # allowed | refused | failed | report
            "reason": " ".join(reason.split())[:500],
        },
        ensure_ascii=True,
        sort_keys=False,
    )
