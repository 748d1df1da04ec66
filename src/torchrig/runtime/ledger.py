"""The GPU lease ledger: which user and container hold which GPU, in SQLite (WAL, ``BEGIN IMMEDIATE``).

One ledger per server at one system location, ``/var/lib/torchrig/leases.sqlite3`` (``$TORCHRIG_STATE_DIR``
moves it, e.g. for a private ledger on a laptop or in tests), shared by every user of the server: the
directory is setgid to the group whose members may take leases (``torchrig``, else ``docker``: who may run
containers) and the database is group-writable (see :func:`ensure_shared_dir`). A user who cannot write
it gets a one-line error that says who can fix it, never a private ledger of their own. Each
acquisition runs in one ``BEGIN IMMEDIATE`` transaction (a write lock taken before reading), so two ``up``
started at the same moment serialise and never get the same GPU. A lease is *pending* from acquisition
until its container exists, then *bound* to the container id. Reconciliation with the engine frees:

* bound leases whose container is gone or no longer alive (exited, dead) — checked against a list of live
  containers taken *before* the transaction, and only for leases bound before that list was taken;
* pending leases whose owning process no longer runs (an ``up`` that crashed between lease and create).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator, Set
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torchrig.accounts import account_name
from torchrig.errors import EngineUnavailable, InputError, UsageError
from torchrig.safefs import UnsafePath, check_dir, check_file, open_nofollow

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


LEDGER_GROUPS = ("torchrig", "docker")  # the first that exists owns a ledger directory root creates


def owner_uid() -> int:
    """The real UID behind this command: who owns what it creates. ``sudo`` (real UID 0 with ``SUDO_UID``)
    acts for the invoking user; environment variables such as USER never decide."""
    uid = os.getuid()
    sudo_uid = os.environ.get("SUDO_UID", "")
    if uid == 0 and sudo_uid.isdigit():
        return int(sudo_uid)
    return uid


def user_name(uid: int) -> str:
    """The account name of ``uid`` (its number when the host has no such account)."""
    return account_name(uid) or str(uid)


def current_user() -> str:
    """The name of :func:`owner_uid` (never read from USER or SUDO_USER)."""
    return user_name(owner_uid())


def state_dir() -> Path:
    """``$TORCHRIG_STATE_DIR`` when set, else the server's ``/var/lib/torchrig``.

    Set but empty is an error rather than "unset": an empty value is almost always a broken script, and
    silently moving to another ledger is how a GPU gets leased twice."""
    env = os.environ.get(STATE_ENV)
    if env is None:
        return SYSTEM_STATE_DIR
    if not env.strip():
        raise UsageError(
            f"{STATE_ENV} is set but empty",
            hint=f"unset it to use the server's ledger in {SYSTEM_STATE_DIR}, or give a directory",
        )
    return Path(env)


def ensure_shared_dir(path: Path) -> None:
    """Create the ledger directory; as root: setgid and sticky, owned by the leasing group, mode 3775.

    A missing system directory is created only by root (a user's command must not invent the server's
    ledger); the error says how an admin makes it once. A user's own ``$TORCHRIG_STATE_DIR`` is theirs."""
    if os.path.lexists(path):
        st = check_dir(path, private=False)  # a link to a directory is refused, not followed
        if os.geteuid() == 0 and st.st_uid == 0 and st.st_mode & 0o020 and not st.st_mode & stat.S_ISVTX:
            # a group-writable ledger folder made before the sticky bit: members could rename root's files
            os.chmod(path, (st.st_mode & 0o7777) | stat.S_ISVTX, follow_symlinks=False)
        return
    if os.geteuid() != 0 and path != SYSTEM_STATE_DIR:  # a user's own $TORCHRIG_STATE_DIR: theirs to make
        path.mkdir(parents=True, exist_ok=True)
        return
    if os.geteuid() != 0:
        raise InputError(
            f"no GPU lease ledger at {path} yet (one is shared by every user of this server)",
            hint=f"an admin creates it once: sudo install -d -m 2775 -g docker {path} (or run any "
            f"'sudo torchrig ps'); for a private ledger set {STATE_ENV}=~/.local/state/torchrig",
        )
    import grp

    gid = 0
    for name in LEDGER_GROUPS:
        try:
            gid = grp.getgrnam(name).gr_gid
            break
        except KeyError:
            continue
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 0, gid)
    os.chmod(path, 0o3775 if gid else 0o755)  # setgid: the group's; sticky: nobody renames others' files


def _refuse_unwritable(path: Path) -> None:
    """A one-line error naming the directory's group when this user may not write the ledger."""
    db = path / "leases.sqlite3"
    if os.access(path, os.W_OK | os.X_OK) and (not db.exists() or os.access(db, os.R_OK | os.W_OK)):
        return
    import grp

    st = path.stat()
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    raise InputError(
        f"you ({current_user()}) may not write the GPU lease ledger in {path} "
        f"(group {group}, mode {st.st_mode & 0o7777:o})",
        hint=f"ask an admin to add you to group {group} (sudo usermod -aG {group} {current_user()}), "
        "then log in again",
    )


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


def read_leases(directory: Path | None = None) -> tuple[Path, list[Lease]] | None:
    """The leases, read without writing anything, for commands that only consult the ledger (``launch``,
    ``train``, ``bench``); None when this host has no ledger (a personal machine: nothing is leased).

    Opened read-only (``mode=ro``), so a user who may not write the ledger still sees who holds what; a
    WAL database whose ``-shm`` file this user cannot create is read as ``immutable`` (a snapshot without
    locks: a lease taken this very moment may be missed, as it would be a moment later anyway)."""
    path = (directory or state_dir()) / "leases.sqlite3"
    if not path.is_file():
        return None
    from urllib.parse import quote

    last: sqlite3.Error | None = None
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        try:
            db = sqlite3.connect(f"file:{quote(str(path))}?{flags}", uri=True, timeout=5.0)
            try:
                db.row_factory = sqlite3.Row
                rows = db.execute(
                    "SELECT * FROM leases ORDER BY gpu_index, unit_uuid, acquired_at"
                ).fetchall()
                return path, [_row(r) for r in rows]
            finally:
                db.close()
        except sqlite3.Error as err:
            last = err
    raise EngineUnavailable(
        f"cannot read the GPU lease ledger {path}: {last}",
        hint=f"ask an admin to make it readable to you, or set {STATE_ENV} to another ledger",
    )


class Ledger:
    """The SQLite ledger. Open with :meth:`open`; every method is one transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._create_file()  # a planted link is an UnsafePath (not an OSError), before SQLite opens it
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
        d = directory or state_dir()
        ensure_shared_dir(d)
        _refuse_unwritable(d)
        return cls(d / "leases.sqlite3")

    def _create_file(self) -> None:
        """The database file, group-writable in a shared (group-writable) directory whatever the umask;
        SQLite gives its -wal and -shm files the database's mode.

        No name is followed: a link planted as the database or its -wal/-shm/-journal (by anyone who may
        write the folder) is refused with :class:`UnsafePath` before SQLite opens anything, and the file
        is created and its mode set through one ``O_NOFOLLOW`` descriptor."""
        for suffix in ("", "-wal", "-shm", "-journal"):
            check_file(Path(str(self.path) + suffix))
        folder = check_dir(self.path.parent, private=False)
        if os.geteuid() == 0 and folder.st_mode & 0o002 and not folder.st_mode & stat.S_ISVTX:
            raise UnsafePath(
                f"the ledger's folder {self.path.parent} may be written by everyone (mode "
                f"{folder.st_mode & 0o7777:o}): root does not use a ledger there",
                hint=f"sudo chmod o-w {self.path.parent} (the shared folder is 3775, group torchrig)",
            )
        shared = folder.st_mode & 0o020
        # An existing database is checked by lstat alone, never opened here: closing any descriptor of a file
        # drops every POSIX lock this process holds on it, SQLite's own included (another Ledger of this
        # process, a thread of the host daemon), and SQLite's locking then breaks (lost commits, SIGBUS).
        try:
            st = os.lstat(self.path)  # check_file above: a regular file, no link
        except FileNotFoundError:
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, 0o664 if shared else 0o644)
            try:
                st = os.fstat(fd)
                if st.st_uid == os.geteuid() and st.st_size == 0:
                    os.fchmod(fd, 0o664 if shared else 0o644)
            finally:
                os.close(fd)
        if st.st_mode & 0o002:
            raise UnsafePath(
                f"the GPU lease ledger {self.path} may be written by everyone (mode {st.st_mode & 0o7777:o})",
                hint=f"sudo chmod o-w {self.path}; anyone could have forged leases: check 'torchrig gpus'",
            )

    def _share_mode(self) -> None:
        """In a group-writable (shared) state directory, keep the ledger files writable by that group."""
        try:
            if os.lstat(self.path.parent).st_mode & 0o020:
                for suffix in ("", "-wal", "-shm"):
                    p = Path(str(self.path) + suffix)
                    # by lstat and path, never by opening: closing a descriptor would drop SQLite's POSIX
                    # locks on the file (see _create_file); the folder is sticky, so no one else can swap
                    # our own file for a link between the two calls
                    try:
                        st = os.lstat(p)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                        os.chmod(p, 0o664)
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
