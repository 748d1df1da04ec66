"""Fixtures for the real-engine tests.

``test_image`` (session scope) builds a real torchrig image once per test session, through the CLI as a
user would: a spec with JupyterLab and SSH, CPU torch from a local wheelhouse, the local base image
``torchrig-test/debian:bookworm`` (no registry is reachable in CI). It returns the image's tag. The
engine's layer cache makes a rebuild with unchanged inputs take seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("TORCHRIG_TEST_BASE", "torchrig-test/debian:bookworm")
WHEELHOUSE = ROOT / ".ci-work" / "wheelhouse"
TORCH_VERSION = "2.13.0"  # the CPU build on this machine's disk
JUPYTERLAB = "jupyterlab==4.6.6"  # as pinned in src/torchrig/data/bases.toml

# Every container, volume and image this session's tests make carries these labels: 'torchrig up' and
# 'torchrig image build' add $TORCHRIG_LABELS to what they create (the CLI subprocesses inherit it), and tests
# that call the engine directly pass TEST_LABELS. At the session's end, anything still carrying this
# session's id is a leak: reported, removed, and the session fails. The session's own id keeps other test
# runs on the same engine out of the count; the owner label (host:pid of this pytest) lets a later session
# remove what a session killed outright (SIGKILL: no teardown at all) left behind.
TEST_LABEL = "torchrig.test"
OWNER_LABEL = "torchrig.test.owner"
SESSION_ID = uuid.uuid4().hex[:12]
SESSION_PID = os.getpid()
TEST_LABELS = {TEST_LABEL: SESSION_ID, OWNER_LABEL: f"{socket.gethostname()}:{SESSION_PID}"}
os.environ["TORCHRIG_LABELS"] = ",".join(f"{k}={v}" for k, v in TEST_LABELS.items())
# what earlier, ended sessions left and this one removed (reported at the end; not this session's failure)
SWEPT: list[str] = []


def _terminated(signum, frame):
    """SIGTERM (a CI time limit, `timeout`, a job stop) ends the session like Ctrl-C: pytest then tears
    the fixtures down and runs the leak check, instead of dying with every image and container in place."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    if os.getpid() != SESSION_PID:  # a forked child of a test: die as it would have
        os.kill(os.getpid(), signal.SIGTERM)
        return
    global TERMINATED
    TERMINATED = True
    raise KeyboardInterrupt("SIGTERM")


TERMINATED = False
if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _terminated)

TEST_SPEC = f"""\
schema_version = 1

[torch]
version = "{TORCH_VERSION}"
variant = "cpu"

[python]
version = "3.11"

[services]
jupyter = true
ssh = true

[user]
name = "torch"
uid = 1000
gid = 1000

[image]
variant = "runtime"
name = "torchrig-test/pytorch"
"""


def engine_ready() -> str | None:
    """None when dockerd answers and the base image is there, else why not."""
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as err:
        return f"no Docker engine ({type(err).__name__}); run tools/ci/start-dockerd.sh"
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        return f"no base image {BASE_IMAGE}; run tools/ci/make-base-image.sh"
    return None


def make_wheelhouse(path: Path = WHEELHOUSE) -> Path:
    """CPU torch + NumPy + JupyterLab and their dependencies, and tqdm (a small package the layer test adds),
    as cp311 manylinux wheels (cached between sessions)."""
    stamp = path / ".complete-2"  # -2: numpy and tqdm added
    if stamp.exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
        "--platform",
        "manylinux_2_17_x86_64",
        "--platform",
        "manylinux2014_x86_64",
        "--platform",
        "linux_x86_64",
        "-d",
        str(path),
        f"torch=={TORCH_VERSION}",
        "numpy",
        "tqdm",
        JUPYTERLAB,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed: {proc.stderr[-2000:]}")
    stamp.write_text("ok\n")
    return path


@pytest.fixture(scope="session")
def engine():
    why = engine_ready()
    if why:
        pytest.skip(why)
    import docker

    client = docker.from_env(timeout=600)
    SWEPT.extend(sweep_ended_sessions(client))
    return client


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    return make_wheelhouse()


def run_image_build(spec: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """``torchrig image build SPEC --base <the local base image> ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "torchrig", "image", "build", str(spec), "--base", BASE_IMAGE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture(scope="session")
def image_build_cli():
    """:func:`run_image_build`, for the test modules (they cannot import this conftest)."""
    return run_image_build


@pytest.fixture(scope="session")
def test_image_build(engine, wheelhouse, tmp_path_factory) -> dict:
    """The ``torchrig image build --json`` result for the test spec (built once per session)."""
    spec = tmp_path_factory.mktemp("image-spec") / "torchrig.toml"
    spec.write_text(TEST_SPEC)
    proc = run_image_build(spec, "--wheelhouse", str(wheelhouse), "--json", timeout=1500)
    if proc.returncode != 0:
        raise RuntimeError(f"test image build failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    result = json.loads(proc.stdout)
    result["spec_path"] = str(spec)
    yield result
    # the session's image goes with the session (the builder's cache keeps its layers for the next build):
    # by its ID, so every tag on it goes, and a stack tag another session's build has since taken stays
    with contextlib.suppress(Exception):
        engine.images.remove(result["image_id"], force=True)


@pytest.fixture(scope="session")
def test_image(test_image_build) -> str:
    """The tag of a real torchrig image (CPU torch 2.13.0, Python 3.11, jupyter + ssh, user torch 1000:1000):
    its content tag, which names this session's image alone (the session's label is in its digest; the
    stack tag moves to the image of whichever session built last)."""
    return test_image_build["tags"][-1]


# the classic builder's " ---> 0123456789ab" log line: the image a step made (or reused)
_CLASSIC_LAYER_RE = re.compile(r"^\s*---> ([0-9a-f]{12})\s*$")


def remove_classic_intermediates(engine, log_lines: list[str]) -> None:
    """The classic builder's untagged intermediate images that a build's log names (an unused stage's, or
    the steps' before a failed one: without a tag they carry no build label, so the leak check cannot find
    them), newest first; tagged images (the base) and images another build has since built on stay."""
    from docker.errors import APIError

    ids = [m.group(1) for line in log_lines if (m := _CLASSIC_LAYER_RE.match(line))]
    for short_id in reversed(dict.fromkeys(ids)):
        try:
            if engine.images.get(short_id).tags:
                continue
            engine.images.remove(short_id, noprune=False)
        except APIError:  # gone already, or a parent of someone else's image
            continue


@pytest.fixture(scope="session", name="remove_classic_intermediates")
def _remove_classic_intermediates():
    """:func:`remove_classic_intermediates`, for the test modules."""
    return remove_classic_intermediates


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, state Z in ``/proc/<pid>/stat``, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def alive():
    """:func:`pid_alive`, for tests that check what a stop left running."""
    return pid_alive


@pytest.fixture(scope="session")
def test_labels() -> dict[str, str]:
    """Labels for containers and volumes a test makes through the engine directly (see :data:`TEST_LABEL`)."""
    return dict(TEST_LABELS)


def _client():
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
    except Exception:
        return None
    return client


def _labelled(client, selector: str) -> dict[str, list]:
    """Containers, volumes and images (tagged, dangling or intermediate) matching a label selector."""
    sel = {"label": selector}
    return {
        "containers": client.containers.list(all=True, filters=sel, ignore_removed=True),
        "volumes": client.volumes.list(filters=sel),
        "images": client.images.list(all=True, filters=sel),
    }


def _name(kind: str, obj) -> str:
    if kind == "images":
        return obj.tags[0] if obj.tags else obj.short_id
    return str(obj.name)


def _remove(client, found: dict[str, list]) -> None:
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


def leftovers() -> dict[str, list[str]] | None:
    """Containers, volumes and images still labelled with this session's id, removed; their names (None
    when no engine answers)."""
    client = _client()
    if client is None:
        return None
    found = _labelled(client, f"{TEST_LABEL}={SESSION_ID}")
    names = {kind: [_name(kind, o) for o in objs] for kind, objs in found.items() if objs}
    _remove(client, found)
    return names


def _session_alive(owner: str) -> bool:
    """Whether the pytest of an owner label (``host:pid``) still runs; another host's counts as alive."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"pytest" in f.read()
    except OSError:
        return False


def sweep_ended_sessions(client) -> list[str]:
    """Remove what test sessions on this host that no longer run left behind (killed before their
    teardown); the names removed. Sessions that still run, and other hosts', are left alone."""
    found = _labelled(client, OWNER_LABEL)
    dead = {
        kind: [o for o in objs if not _session_alive(_labels_of(kind, o).get(OWNER_LABEL, ""))]
        for kind, objs in found.items()
    }
    names = [f"{kind[:-1]} {_name(kind, o)}" for kind, objs in dead.items() for o in objs]
    _remove(client, dead)
    return names


def _labels_of(kind: str, obj) -> dict[str, str]:
    if kind == "volumes":
        return obj.attrs.get("Labels") or {}
    return obj.labels or {}


@pytest.fixture(scope="session")
def leak_check() -> SimpleNamespace:
    """The leak check's parts, for the tests that check it (test modules cannot import this conftest)."""
    return SimpleNamespace(
        labelled=_labelled, sweep=sweep_ended_sessions, test_label=TEST_LABEL, owner_label=OWNER_LABEL
    )


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down, also when it was interrupted
def pytest_sessionfinish(session, exitstatus):
    """The leak check: the session fails when a test left a container, volume or image behind."""
    out = session.config.get_terminal_writer()
    out.line()  # the progress line (dots, [100%]) has no end of line yet
    line = out.line
    if SWEPT:
        line(f"leak check: removed what ended test sessions left: {', '.join(SWEPT)}", yellow=True)
    left = leftovers()
    if left:
        what = "; ".join(f"{k}: {', '.join(v)}" for k, v in left.items())
        line(f"LEAK CHECK FAILED: tests left {what}", red=True)
        session.exitstatus = 1
    elif left is not None:
        line(f"leak check: no container, volume or image labelled {TEST_LABEL}={SESSION_ID} left")
    if TERMINATED:
        session.exitstatus = 128 + signal.SIGTERM
