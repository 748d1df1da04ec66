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
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("TORCHRIG_TEST_BASE", "torchrig-test/debian:bookworm")
WHEELHOUSE = ROOT / ".ci-work" / "wheelhouse"
TORCH_VERSION = "2.13.0"  # the CPU build on this machine's disk
JUPYTERLAB = "jupyterlab==4.6.6"  # as pinned in src/torchrig/data/bases.toml

# Every container and volume this session's tests make carries this label: 'torchrig up' adds
# $TORCHRIG_LABELS to what it creates (the CLI subprocesses inherit it), and tests that call the engine
# directly pass TEST_LABELS. At the session's end, anything still carrying it is a leak: reported, removed,
# and the session fails. The session's own id keeps other test runs on the same engine out of the count.
TEST_LABEL = "torchrig.test"
SESSION_ID = uuid.uuid4().hex[:12]
TEST_LABELS = {TEST_LABEL: SESSION_ID}
os.environ["TORCHRIG_LABELS"] = f"{TEST_LABEL}={SESSION_ID}"

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

    return docker.from_env(timeout=600)


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
    # the session's image goes with the session (the builder's cache keeps its layers for the next build)
    for tag in result.get("tags", []):
        with contextlib.suppress(Exception):
            engine.images.remove(tag, force=True)


@pytest.fixture(scope="session")
def test_image(test_image_build) -> str:
    """The tag of a real torchrig image (CPU torch 2.13.0, Python 3.11, jupyter + ssh, user torch 1000:1000)."""
    return test_image_build["tags"][0]


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


def leftovers() -> dict[str, list[str]]:
    """Containers, volumes and images still labelled with this session's id."""
    try:
        import docker

        client = docker.from_env(timeout=60)
        client.ping()
    except Exception:
        return {}
    sel = {"label": f"{TEST_LABEL}={SESSION_ID}"}
    found = {
        "containers": [c.name for c in client.containers.list(all=True, filters=sel, ignore_removed=True)],
        "volumes": [v.name for v in client.volumes.list(filters=sel)],
        "images": [i.short_id for i in client.images.list(filters=sel)],
    }
    for name in found["containers"]:
        with contextlib.suppress(Exception):
            client.containers.get(name).remove(force=True)
    for name in found["volumes"]:
        with contextlib.suppress(Exception):
            client.volumes.get(name).remove(force=True)
    return {k: v for k, v in found.items() if v}


def pytest_sessionfinish(session, exitstatus):
    """The leak check: the session fails when a test left a container, volume or image behind."""
    left = leftovers()
    if left:
        what = "; ".join(f"{k}: {', '.join(v)}" for k, v in left.items())
        session.config.get_terminal_writer().line(f"LEAK CHECK FAILED: tests left {what}", red=True)
        session.exitstatus = 1
