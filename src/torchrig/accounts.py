"""This host's account database, read one way: the name of a user ID (``id -nu UID``).

>>> account_name(0)
'root'

``None`` when the host has no account with that ID (a container's user mapped through, a user removed since):
each caller says what stands in its place (the number, ``UID N``, ``?``).
"""

from __future__ import annotations


def account_name(uid: int) -> str | None:
    """The account name of ``uid``; None when this host's account database has none."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
