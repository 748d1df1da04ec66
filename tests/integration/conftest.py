"""Fixtures for the real-engine tests.

``test_image`` (session scope) builds a real torchrig image once per test session, through the CLI as a
user would: a spec with JupyterLab and SSH, CPU torch from a local wheelhouse, the local base image
``torchrig-test/debian:bookworm`` (no registry is reachable in CI). It returns the image's tag. It is
built once per test run, whatever the number of xdist workers (``runwide.once``), and removed when the run
ends; the engine's layer cache makes a rebuild with unchanged inputs take seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import runwide  # tests/runwide.py (tests/conftest.py puts tests/ on sys.path)

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("TORCHRIG_TEST_BASE", "torchrig-test/debian:bookworm")
WHEELHOUSE = ROOT / ".ci-work" / "wheelhouse"
TORCH_VERSION = "2.13.0"  # the CPU build on this machine's disk
JUPYTERLAB = "jupyterlab==4.6.6"  # as pinned in src/torchrig/data/bases.toml

# Every container, volume and image this run's tests make carries the run's labels (tests/runwide.py):
# 'torchrig up' and 'torchrig image build' add $TORCHRIG_LABELS to what they create (the CLI subprocesses
# inherit it; tests/conftest.py sets it in every process of the run), and tests that call the engine directly
# pass the `test_labels` fixture. When the run ends, the controller runs the leak check: anything still
# carrying the run's id is a leak, reported, removed, and the run fails. The owner label (host:pid of the
# run's controller) lets a later run remove what a run killed outright (SIGKILL: no teardown) left behind.
TEST_LABEL = runwide.TEST_LABEL
OWNER_LABEL = runwide.OWNER_LABEL


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

        client = docker.from_env(timeout=120)  # a busy engine (another run committing a GB layer) is slow
        client.ping()
    except Exception as err:
        return f"no Docker engine ({type(err).__name__}); run tools/ci/start-dockerd.sh"
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        return f"no base image {BASE_IMAGE}; run tools/ci/make-base-image.sh"
    return None


def make_wheelhouse(path: Path = WHEELHOUSE) -> Path:
    """CPU torch + NumPy + JupyterLab and their dependencies, tqdm (a small package the layer test adds) and
    cattrs (torchrig's own dependency, which the images install), as cp311 manylinux wheels (cached between
    sessions)."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.parent / f"{path.name}.lock")):  # one download, however many workers ask
        return _download_wheelhouse(path)


def _download_wheelhouse(path: Path) -> Path:
    stamp = path / ".complete-3"  # -2: numpy and tqdm added; -3: cattrs
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
        "cattrs>=26.2,<27",  # as pyproject's dependencies
        JUPYTERLAB,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed: {proc.stderr[-2000:]}")
    stamp.write_text("ok\n")
    return path


@pytest.fixture(scope="session")
def run_identity(request) -> runwide.RunIdentity:
    """The test run's id, owner and shared folder (the same in every xdist worker)."""
    return runwide.identity_of(request.config)


@pytest.fixture(scope="session")
def engine(run_identity):
    why = engine_ready()
    if why:
        pytest.skip(why)
    import docker

    client = docker.from_env(timeout=600)
    runwide.note_swept(run_identity, sweep_ended_sessions(client))
    return client


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    return make_wheelhouse()


def _stand_in_torch_wheel(folder: Path, version: str) -> Path:
    """A pure-Python wheel named ``torch==version`` of a few hundred bytes (``import torch`` gives its
    ``__version__``): what an image test installs when the question is not torch (a proxy's CA, the classic
    builder's equivalence) and torch's ~800 MB would only cost minutes. Valid by the wheel spec: WHEEL,
    METADATA and a RECORD with each file's sha256."""
    import base64
    import hashlib
    import zipfile

    dist = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f'__version__ = "{version}"  # a stand-in for image tests\n',
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: torchrig-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), text)
    return path


@pytest.fixture(scope="session")
def stand_in_torch_wheel():
    """:func:`_stand_in_torch_wheel` (folder, version) -> the wheel's path, for the test modules."""
    return _stand_in_torch_wheel


@pytest.fixture(scope="session")
def stand_in_wheelhouse(tmp_path_factory, wheelhouse) -> Path:
    """A wheelhouse with a stand-in torch (:func:`_stand_in_torch_wheel`) and the real wheelhouse's NumPy
    (the image installs it beside torch) and torchrig's dependencies in the image (packaging, and cattrs
    with attrs and typing_extensions). Byte-identical in every worker (the builder's cache is shared)."""
    import shutil

    folder = tmp_path_factory.mktemp("stand-in-wheelhouse")
    _stand_in_torch_wheel(folder, f"{TORCH_VERSION}+cpu")
    for name in ("numpy", "packaging", "cattrs", "attrs", "typing_extensions"):
        for wheel in wheelhouse.glob(f"{name}-*.whl"):
            shutil.copy2(wheel, folder / wheel.name)
    return folder


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


def build_test_image(run: runwide.RunIdentity) -> dict:
    """The test spec's ``torchrig image build --json`` result, built once for the run (every process of
    the run that calls this gets the one result; the first builds, under a file lock, the others wait)."""

    def build() -> dict:
        wheelhouse = make_wheelhouse()
        spec = run.shared_dir / "image-spec" / "torchrig.toml"
        spec.parent.mkdir(exist_ok=True)
        spec.write_text(TEST_SPEC)
        proc = run_image_build(spec, "--wheelhouse", str(wheelhouse), "--json", timeout=1500)
        if proc.returncode != 0:
            raise RuntimeError(f"test image build failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
        result = json.loads(proc.stdout)
        result["spec_path"] = str(spec)
        # the run's image goes with the run (the builder's cache keeps its layers for the next build): by
        # its ID, so every tag on it goes, and a stack tag another run's build has since taken stays
        runwide.at_end(run, "image", result["image_id"])
        return result

    return runwide.once(run, "test-image-build", build)


def _needs_test_image(item) -> bool:
    return "test_image_build" in getattr(item, "fixturenames", ())


# The modules that take longest in a whole run (`--durations` of `.ci/run`, 2 cores, 4 workers, 2026-12-03:
# 80 to 360 s each, a grouped module on one worker): they start first, in their random order, so that none of
# them starts near the end and runs on alone while the other workers idle.
LONG_FIRST = frozenset(
    {
        "test_cluster_slurm.py",
        "test_train_ddp.py",
        "test_cluster_netns.py",
        "test_journey.py",
        "test_launch_thirdparty.py",
        "test_train_checkpoints.py",
        "test_image_build.py",
        "test_image_buildkit.py",
        "test_launch_run.py",
        "test_bench_gloo.py",
        "test_train_faults.py",
        "test_docs_tutorials.py",
        "test_launch_nodes.py",
    }
)


def _order(item) -> tuple[bool, bool]:
    return _needs_test_image(item), Path(str(item.fspath)).name not in LONG_FIRST


def pytest_collection_modifyitems(config, items):
    """The test image takes minutes to build: the tests that need it run after the others, while it builds
    (below); of the others, the long modules start first. A stable sort: within each part the random order
    stays, reproducible from its seed."""
    items.sort(key=_order)


def _starts_test_image(item) -> bool:
    """The test needs the test image, or builds on its build cache later on (marked ``session_image_cache``:
    it asks for the image mid-test, after work of its own, so it is not sorted after the others)."""
    return _needs_test_image(item) or item.get_closest_marker("session_image_cache") is not None


def pytest_collection_finish(session):
    """When the run's tests (after -m and -k) include some that need the test image, its
    build starts now, in the background: the other tests run while it builds instead of waiting for it."""
    if not any(_starts_test_image(i) for i in session.items) or engine_ready() is not None:
        return
    run = runwide.identity_of(session.config)
    threading.Thread(target=_build_quietly, args=(run,), name="test-image-build", daemon=True).start()


def _build_quietly(run: runwide.RunIdentity) -> None:
    """(background) a failure is recorded by runwide.once; the tests that need the image report it."""
    with contextlib.suppress(Exception):
        build_test_image(run)


@pytest.fixture(scope="session")
def test_image_build(engine, wheelhouse, run_identity) -> dict:
    """The ``torchrig image build --json`` result for the test spec (built once per test run)."""
    return build_test_image(run_identity)


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
def test_labels(run_identity) -> dict[str, str]:
    """Labels for containers and volumes a test makes through the engine directly (see :data:`TEST_LABEL`)."""
    return run_identity.labels()


sweep_ended_sessions = runwide.sweep_ended_sessions


@pytest.fixture(scope="session")
def leak_check() -> SimpleNamespace:
    """The leak check's parts, for the tests that check it (test modules cannot import this conftest)."""
    return SimpleNamespace(
        labelled=runwide.labelled, sweep=sweep_ended_sessions, test_label=TEST_LABEL, owner_label=OWNER_LABEL
    )
