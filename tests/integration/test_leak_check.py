"""The suite's leak check (``tests/runwide.py``, run by ``tests/conftest.py``) on the real engine: it finds
images by the run's labels, a run stopped with SIGTERM still tears its fixtures down and runs the check, and
what a run killed outright left is removed by the next one, never what a running run owns. The child runs
are made both ways the suite runs: one process (``-n 0``) and a controller with an xdist worker (``-n 1``),
where the worker's leak reaches the controller's check and the controller passes SIGTERM on."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

BASE = os.environ.get("TORCHRIG_TEST_BASE", "torchrig-test/debian:bookworm")
CHILD_ENV = "TORCHRIG_LEAK_CHECK_CHILD"  # set: the child session's test below runs, and writes here
LEAK_ENV = "TORCHRIG_LEAK_CHECK_LEAK"  # likewise for the child that leaves an image


def _small_image(engine, labels: dict[str, str]) -> str:
    """A one-LABEL image on the base (seconds with the classic builder); its ID."""
    dockerfile = f"FROM {BASE}\nLABEL org.example.leak-check={uuid.uuid4().hex}\n"
    image, _ = engine.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), labels=labels, rm=True, forcerm=True
    )
    return str(image.id)


def _exists(engine, image_id: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        engine.images.get(image_id)
    except ImageNotFound:
        return False
    return True


def test_images_of_this_session_are_found_by_its_label(engine, test_labels, leak_check):
    image_id = _small_image(engine, test_labels)
    try:
        sel = f"{leak_check.test_label}={test_labels[leak_check.test_label]}"
        assert image_id in [i.id for i in leak_check.labelled(engine, sel)["images"]]
    finally:
        engine.images.remove(image_id, force=True)


def test_what_an_ended_session_left_is_swept_and_a_running_ones_is_not(engine, test_labels, leak_check):
    ended = subprocess.Popen(["true"])  # a pid that no longer runs (reaped below)
    ended.wait()
    host = socket.gethostname()
    owner = leak_check.owner_label
    dead = {leak_check.test_label: "ended-session", owner: f"{host}:{ended.pid}"}
    live = {leak_check.test_label: "running-session", owner: test_labels[owner]}  # this run's controller runs
    other_host = {leak_check.test_label: "elsewhere", owner: f"not-{host}:{ended.pid}"}
    made = [_small_image(engine, labels) for labels in (dead, live, other_host)]
    volume = engine.volumes.create(name=f"trt-leak-{uuid.uuid4().hex[:8]}", labels=dead)
    try:
        swept = leak_check.sweep(engine)
        assert not _exists(engine, made[0]) and f"volume {volume.name}" in swept
        assert _exists(engine, made[1]) and _exists(engine, made[2])
        assert volume.name not in [v.name for v in engine.volumes.list()]
    finally:
        for image_id in made:
            with contextlib.suppress(Exception):
                engine.images.remove(image_id, force=True)
        with contextlib.suppress(Exception):
            volume.remove(force=True)


@pytest.fixture
def child_image(engine, test_labels):
    """(child session only) an image with the child session's labels, removed at teardown."""
    image_id = _small_image(engine, test_labels)
    yield image_id
    engine.images.remove(image_id, force=True)


@pytest.mark.skipif(not os.environ.get(CHILD_ENV), reason="runs only inside the SIGTERM test's child session")
def test_child_session_waits_for_sigterm(child_image, test_labels):
    Path(os.environ[CHILD_ENV]).write_text(json.dumps({"image": child_image, "labels": test_labels}))
    time.sleep(600)


@pytest.mark.skipif(not os.environ.get(LEAK_ENV), reason="runs only inside the leaking test's child session")
def test_child_session_leaves_an_image(engine, test_labels):
    image_id = _small_image(engine, test_labels)  # and no clean-up: a leak
    Path(os.environ[LEAK_ENV]).write_text(json.dumps({"image": image_id}))


WAYS = pytest.mark.parametrize("workers", ["0", "1"], ids=["one-process", "xdist-worker"])


def _child_session(test: str, env: dict[str, str], workers: str, tmp_path: Path) -> subprocess.Popen:
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")
    }  # we may be a worker
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            f"{Path(__file__).resolve()}::{test}",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            workers,
            f"--basetemp={tmp_path / 'child-basetemp'}",
        ],
        env={**inherited, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


@WAYS
def test_an_image_a_test_left_fails_the_session_and_is_removed(engine, tmp_path, workers):
    note = tmp_path / "leak.json"
    proc = _child_session("test_child_session_leaves_an_image", {LEAK_ENV: str(note)}, workers, tmp_path)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert note.exists(), f"the child session left no note (exit {proc.returncode}):\n{out[-3000:]}"
    image_id = json.loads(note.read_text())["image"]
    try:
        assert "1 passed" in out and proc.returncode == 1, out[-3000:]
        # the classic builder adds one LABEL step per build label, so the step that added the session's
        # label leaves an intermediate image with it too: both are listed, in no fixed order
        failed = [ln for ln in out.splitlines() if ln.startswith("LEAK CHECK FAILED: tests left images: ")]
        assert failed and image_id[:17] in failed[0], out[-3000:]
        assert not _exists(engine, image_id)
    finally:
        with contextlib.suppress(Exception):
            engine.images.remove(image_id, force=True)


@WAYS
def test_sigterm_tears_the_session_down_and_runs_the_leak_check(engine, tmp_path, workers):
    """A session stopped with SIGTERM (a CI time limit, ``timeout``) used to die with its images in place:
    now its fixtures are torn down (the child's image removed), the check runs, and it exits 143. Under
    xdist the SIGTERM goes to the controller, which passes it on to its workers."""
    note = tmp_path / "child.json"
    proc = _child_session("test_child_session_waits_for_sigterm", {CHILD_ENV: str(note)}, workers, tmp_path)
    try:
        deadline = time.monotonic() + 180
        while not note.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert note.exists(), (
            proc.communicate(timeout=60)[0][-3000:] if proc.poll() is not None else "no start"
        )
        child = json.loads(note.read_text())
        assert _exists(engine, child["image"])
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
        assert not _exists(engine, child["image"]), out[-3000:]  # the fixture's teardown ran
        assert "LEAK CHECK FAILED" not in out, out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if note.exists():
            with contextlib.suppress(Exception):
                engine.images.remove(json.loads(note.read_text())["image"], force=True)
