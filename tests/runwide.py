"""What one test run shares across its processes: its identity, the things built once, the leak check.

``python3 -m pytest tests`` runs the tests in pytest-xdist workers (``-n`` in pyproject's addopts); the
process that started them (the controller) collects and runs nothing itself. A run is still one session
for the engine and for its expensive fixtures:

- **One identity.** The controller draws the run's id and passes it to every worker (``workerinput``), with
  its own ``host:pid`` as the owner: every container, volume and image a test makes carries
  ``torchrig.test=<run id>`` and ``torchrig.test.owner=<host:pid of the controller>`` (``$TORCHRIG_LABELS``
  for the CLI subprocesses, :func:`labels` for tests that call the engine directly). With ``-n 0`` (or
  ``-p no:xdist``) the one process is controller and worker at once.
- **Built once.** :func:`once` runs a build under a file lock in the run's shared folder and keeps its JSON
  result there: the first worker that needs the test image (or a wheelhouse, a venv, a compiled model)
  builds it, the others wait and read the result. A failed build is recorded too, so the others fail at
  once with its message instead of building it again.
- **Cleaned once, then checked.** What such a build made for the whole run is registered with
  :func:`at_end` and removed by the controller when every worker has finished; then the controller runs
  the leak check: anything still labelled with the run's id is a leak, reported, removed, and the run
  fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TEST_LABEL = "torchrig.test"
OWNER_LABEL = "torchrig.test.owner"
_WORKERINPUT_KEY = "torchrig_run"


@dataclass(frozen=True)
class RunIdentity:
    session_id: str  # the run's id: the value of TEST_LABEL on what its tests make
    owner: str  # host:pid of the controller: the value of OWNER_LABEL (alive while the run runs)
    shared_dir: Path  # one folder for the whole run: locks, built-once results, the clean-up list

    def labels(self) -> dict[str, str]:
        return {TEST_LABEL: self.session_id, OWNER_LABEL: self.owner}

    def as_workerinput(self) -> dict[str, str]:
        return {"session_id": self.session_id, "owner": self.owner, "shared_dir": str(self.shared_dir)}


def new_identity(basetemp: Path) -> RunIdentity:
    """The controller's: a fresh id, this process as the owner, a folder in the run's base temp."""
    shared = basetemp / "run-shared"
    shared.mkdir(parents=True, exist_ok=True)
    return RunIdentity(uuid.uuid4().hex[:12], f"{socket.gethostname()}:{os.getpid()}", shared)


def identity_of(config) -> RunIdentity | None:
    """The run's identity in this process (set by ``tests/conftest.py``'s pytest_configure)."""
    return getattr(config, "_torchrig_run", None)


def set_identity(config) -> RunIdentity | None:
    """Controller: draw the identity; worker: take the one the controller passed. Exported to the CLI
    subprocesses as $TORCHRIG_LABELS. None for a pytest that runs no tests (--help, --version)."""
    given = getattr(config, "workerinput", {}).get(_WORKERINPUT_KEY)
    if given:
        run = RunIdentity(given["session_id"], given["owner"], Path(given["shared_dir"]))
    elif hasattr(config, "_tmp_path_factory"):
        run = new_identity(config._tmp_path_factory.getbasetemp())
    else:
        return None
    config._torchrig_run = run
    os.environ["TORCHRIG_LABELS"] = ",".join(f"{k}={v}" for k, v in run.labels().items())
    return run


def pass_to_worker(config, node) -> None:
    node.workerinput[_WORKERINPUT_KEY] = identity_of(config).as_workerinput()


def is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


# -- built once per run ---------------------------------------------------------------------------------


def once(run: RunIdentity, key: str, build: Callable[[], dict]) -> dict:
    """``build()``'s JSON result, built by the first process of the run that asks, read by the others."""
    from filelock import FileLock

    result = run.shared_dir / f"{key}.json"
    with FileLock(str(run.shared_dir / f"{key}.lock")):
        if result.exists():
            data = json.loads(result.read_text())
            if "__failed__" in data:
                raise RuntimeError(f"{key}: built once for the run and failed there: {data['__failed__']}")
            return data
        try:
            data = build()
        except Exception as err:  # a skip or an interrupt is not recorded: the next one tries again
            result.write_text(json.dumps({"__failed__": f"{type(err).__name__}: {str(err)[-6000:]}"}))
            raise
        result.write_text(json.dumps(data))
        return data


def at_end(run: RunIdentity, kind: str, value: str) -> None:
    """Register a run-wide thing for removal when the run ends: ``image`` (an engine ID) or ``path``."""
    from filelock import FileLock

    with FileLock(str(run.shared_dir / "at-end.lock")), open(run.shared_dir / "at-end.jsonl", "a") as f:
        f.write(json.dumps({"kind": kind, "value": value}) + "\n")


def run_at_end(run: RunIdentity) -> set[str]:
    """(controller) remove what :func:`at_end` registered, newest first; the image IDs that could not be
    removed yet (a leaked container still uses them: the leak check names the container, and removes both)."""
    path = run.shared_dir / "at-end.jsonl"
    if not path.exists():
        return set()
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    client, kept = None, set()
    for entry in reversed(entries):
        if entry["kind"] == "path":
            shutil.rmtree(entry["value"], ignore_errors=True)
        elif entry["kind"] == "image":
            client = client or engine_client()
            if client is None:
                continue
            from docker.errors import APIError, NotFound

            try:
                client.images.remove(entry["value"], force=True)
            except NotFound:
                pass
            except APIError:
                kept.add(entry["value"])
    path.unlink()
    return kept


def note_swept(run: RunIdentity, names: list[str]) -> None:
    """What a worker's sweep removed (ended runs' leftovers), for the controller's report."""
    if names:
        with open(run.shared_dir / "swept.txt", "a") as f:
            f.writelines(f"{n}\n" for n in names)


def swept(run: RunIdentity) -> list[str]:
    path = run.shared_dir / "swept.txt"
    return path.read_text().splitlines() if path.exists() else []


# -- the leak check ---------------------------------------------------------------------------------------


def engine_client():
    """A Docker client when an engine answers, else None (no docker package, no daemon)."""
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
    except Exception:
        return None
    return client


def labelled(client, selector: str) -> dict[str, list]:
    """Containers, volumes and images (tagged, dangling or intermediate) matching a label selector."""
    sel = {"label": selector}
    return {
        "containers": client.containers.list(all=True, filters=sel, ignore_removed=True),
        "volumes": client.volumes.list(filters=sel),
        "images": client.images.list(all=True, filters=sel),
    }


def name_of(kind: str, obj) -> str:
    if kind == "images":
        return obj.tags[0] if obj.tags else obj.short_id
    return str(obj.name)


def remove(client, found: dict[str, list]) -> None:
    """Containers first (they hold images and volumes), then volumes, then images: by ID, forced, children
    before parents (an image with a child cannot be removed, so each pass removes what it can)."""
    from docker.errors import APIError, NotFound

    for c in found.get("containers", []):
        with contextlib.suppress(NotFound, APIError):
            c.remove(force=True)
    for v in found.get("volumes", []):
        with contextlib.suppress(NotFound, APIError):
            v.remove(force=True)
    images = list(found.get("images", []))
    while images:
        left = []
        for i in images:
            try:
                client.images.remove(i.id, force=True)
            except NotFound:
                continue
            except APIError:
                left.append(i)
        if len(left) == len(images):
            break
        images = left


def leftovers(run: RunIdentity, expected: set[str] = frozenset()) -> dict[str, list[str]] | None:
    """Containers, volumes and images still labelled with this run's id, removed; their names (None when
    no engine answers), less the ``expected`` image IDs (the run's own, held by a leaked container)."""
    client = engine_client()
    if client is None:
        return None
    found = labelled(client, f"{TEST_LABEL}={run.session_id}")
    shown = {
        kind: [o for o in objs if kind != "images" or o.id not in expected] for kind, objs in found.items()
    }
    names = {kind: [name_of(kind, o) for o in objs] for kind, objs in shown.items() if objs}
    remove(client, found)
    return names


def session_alive(owner: str) -> bool:
    """Whether the pytest of an owner label (``host:pid``) still runs; another host's counts as alive."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"pytest" in f.read()
    except OSError:
        return False


def labels_of(kind: str, obj) -> dict[str, str]:
    if kind == "volumes":
        return obj.attrs.get("Labels") or {}
    return obj.labels or {}


def sweep_ended_sessions(client) -> list[str]:
    """Remove what test runs on this host that no longer run left behind (killed before their teardown);
    the names removed. Runs that still run, and other hosts', are left alone."""
    found = labelled(client, OWNER_LABEL)
    dead = {
        kind: [o for o in objs if not session_alive(labels_of(kind, o).get(OWNER_LABEL, ""))]
        for kind, objs in found.items()
    }
    names = [f"{kind[:-1]} {name_of(kind, o)}" for kind, objs in dead.items() for o in objs]
    remove(client, dead)
    return names
