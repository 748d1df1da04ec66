"""This user's own torchrig folders, in one place: where it keeps what it can rebuild (the cache) and what it
must keep between runs (the state: SSH host keys, the ports of an environment), by the XDG Base Directory
specification (https://specifications.freedesktop.org/basedir-spec/latest/). The server's shared lease
ledger is not here: it is the server's, not a user's (``torchrig.runtime.ledger``, ``$TORCHRIG_STATE_DIR``).

>>> cache_dir()        # doctest: +SKIP
PosixPath('/home/ada/.cache/torchrig')
>>> state_dir()        # doctest: +SKIP
PosixPath('/home/ada/.local/state/torchrig')

Nothing is created here: the caller makes the folder it writes to, with the mode it needs.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TORCHRIG_CACHE_DIR"  # the cache folder itself, for tests and users who want it elsewhere


def _xdg(variable: str, default: tuple[str, ...]) -> Path:
    """``$variable``/torchrig, else ``~/<default>``/torchrig. The specification says a relative path in these
    variables is invalid and is to be ignored, so it is (never a folder relative to the working directory)."""
    value = os.environ.get(variable, "")
    base = Path(value) if os.path.isabs(value) else Path.home().joinpath(*default)
    return base / "torchrig"


def cache_dir() -> Path:
    """``$TORCHRIG_CACHE_DIR``, else ``$XDG_CACHE_HOME/torchrig``, else ``~/.cache/torchrig``."""
    own = os.environ.get(CACHE_ENV)
    return Path(own).expanduser() if own else _xdg("XDG_CACHE_HOME", (".cache",))


def state_dir() -> Path:
    """``$XDG_STATE_HOME/torchrig``, else ``~/.local/state/torchrig``."""
    return _xdg("XDG_STATE_HOME", (".local", "state"))
