"""The GPU lease ledger: which user and container hold which GPU, in SQLite (WAL, ``BEGIN IMMEDIATE``).

One ledger per host, in the state directory (:func:`state_dir`), shared by every user of the host. Each
acquisition runs in one ``BEGIN IMMEDIATE`` transaction (a write lock taken before reading), so two ``up``
started at the same moment serialise and never get the same GPU. A lease is *pending* from acquisition
until its container exists, then *bound* to the container id. Reconciliation with the engine frees:

* bound leases whose container is gone or no longer alive (exited, dead) — checked against a list of live
  containers taken *before* the transaction, and only for leases bound before that list was taken;
* pending leases whose owning process no longer runs (an ``up`` that crashed between lease and create).
"""

from __future__ import annotations

import getpass
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torchrig.errors import EngineUnavailable

STATE_ENV = "TORCHRIG_STATE_DIR"
SYSTEM_STATE_DIR = Path("/var/lib/torchrig")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    unit_uuid    TEXT NOT NULL,
    gpu_index    INTEGER NOT NULL,
    unit_label   TEXT NOT NULL,
    user         TEXT NOT NULL,
    container    TEXT NOT NULL,
    container_id TEXT,
    shared       INTEGER NOT NULL DEFAULT 0,
    owner_pid    INTEGER NOT NULL,
    acquired_at  REAL NOT NULL,
    bound_at     REAL,
    PRIMARY KEY (unit_uuid, container)
);
CREATE INDEX IF NOT EXISTS leases_container ON leases(container);
"""


@dataclass(frozen=True)
class Lease:
    unit_uuid: str
    gpu_index: int
    unit_label: str
    user: str
    container: str
    container_id: str | None
    shared: bool
    owner_pid: int
    acquired_at_s: float
    bound_at_s: float | None


def current_user() -> str:
    """The human behind this command (``sudo`` keeps the invoking user's name)."""
    return os.environ.get("SUDO_USER") or getpass.getuser()


def state_dir() -> Path:
    """``$TORCHRIG_STATE_DIR``, else ``/var/lib/torchrig`` when it is writable (or we are root), else
    ``$XDG_STATE_HOME/torchrig`` (``~/.local/state/torchrig``): a per-user ledger, which cannot see
    other users' leases — shared servers should create the system directory (see docs/environments.md)."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    if (SYSTEM_STATE_DIR.is_dir() and os.access(SYSTEM_STATE_DIR, os.W_OK)) or os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "torchrig"


def _row(r: sqlite3.Row) -> Lease:
    return Lease(
        r["unit_uuid"],
        r["gpu_index"],
        r["unit_label"],
        r["user"],
        r["container"],
        r["container_id"],
        bool(r["shared"]),
        r["owner_pid"],
        r["acquired_at"],
        r["bound_at"],
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def stale(lease: Lease, live: Set[str] | None, listed_at_s: float) -> bool:
    """Whether reconciliation frees ``lease``: its container is gone or dead, or its pending owner died."""
    if lease.bound_at_s is None:
        return not _pid_alive(lease.owner_pid)
    return live is not None and lease.bound_at_s < listed_at_s and lease.container not in live


class Ledger:
    """The SQLite ledger. Open with :meth:`open`; every method is one transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA busy_timeout=30000")
            self.db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise EngineUnavailable(
                f"cannot open the GPU lease ledger {path}: {err}",
                hint=f"make its directory writable, or set {STATE_ENV} to a writable directory",
            ) from None
        self._share_mode()

    @classmethod
    def open(cls, directory: Path | None = None) -> Ledger:
        return cls((directory or state_dir()) / "leases.sqlite3")

    def _share_mode(self) -> None:
        """In a group-writable (shared) state directory, keep the ledger files writable by that group."""
        try:
            if self.path.parent.stat().st_mode & 0o020:
                for suffix in ("", "-wal", "-shm"):
                    p = Path(str(self.path) + suffix)
                    if p.exists() and p.stat().st_uid == os.geteuid():
                        p.chmod(0o664)
        except OSError:
            pass

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``: the write lock is taken before the first read."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def leases(self) -> list[Lease]:
        return [
            _row(r)
            for r in self.db.execute("SELECT * FROM leases ORDER BY gpu_index, unit_uuid, acquired_at")
        ]

    def reconcile_in(self, db: sqlite3.Connection, live: Set[str] | None, listed_at_s: float) -> list[Lease]:
        """Delete leases whose container is gone (``live``: names of alive containers, listed at
        ``listed_at_s``; ``None`` when the engine could not be asked) or whose pending owner died."""
        freed = []
        for r in db.execute("SELECT * FROM leases").fetchall():
            lease = _row(r)
            if stale(lease, live, listed_at_s):
                db.execute(
                    "DELETE FROM leases WHERE unit_uuid=? AND container=?", (lease.unit_uuid, lease.container)
                )
                freed.append(lease)
        return freed

    def reconcile(self, live: Set[str] | None, listed_at_s: float) -> list[Lease]:
        with self.transaction() as db:
            return self.reconcile_in(db, live, listed_at_s)

    def insert_in(
        self,
        db: sqlite3.Connection,
        units: Iterable[tuple[str, int, str]],
        user: str,
        container: str,
        shared: bool,
    ) -> None:
        now = time.time()
        db.executemany(
            "INSERT INTO leases (unit_uuid, gpu_index, unit_label, user, container, shared, owner_pid, acquired_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (uuid, idx, label, user, container, int(shared), os.getpid(), now)
                for uuid, idx, label in units
            ],
        )

    def bind(self, container: str, container_id: str) -> None:
        """The container exists: its leases now live and die with it."""
        with self.transaction() as db:
            db.execute(
                "UPDATE leases SET container_id=?, bound_at=? WHERE container=?",
                (container_id, time.time(), container),
            )

    def release(self, container: str) -> list[Lease]:
        with self.transaction() as db:
            rows = [_row(r) for r in db.execute("SELECT * FROM leases WHERE container=?", (container,))]
            db.execute("DELETE FROM leases WHERE container=?", (container,))
            return rows

    def container_taken(self, db: sqlite3.Connection, container: str) -> bool:
        return (
            db.execute("SELECT 1 FROM leases WHERE container=? LIMIT 1", (container,)).fetchone() is not None
        )
