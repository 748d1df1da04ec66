"""``torchrig doctor`` inside a container started without GPUs, on the real Docker engine: it must say exactly
that (and notice Docker's 64 MB /dev/shm), not "no driver"."""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = "torchrig-test/debian:bookworm"
DOCKERFILE = f"""FROM {BASE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
"""


@dataclass(frozen=True)
class PyImage:
    client: Any
    tag: str
    labels: dict[str, str]


@pytest.fixture(scope="session")
def py_image(test_labels):
    """The local Debian base plus python3 (the checkout is bind-mounted, so no torchrig install), built for
    this session under its own tag with the session's labels and removed with it, intermediate image too
    (one apt-get install per session; a shared tag that one session kept and another removed was a leak).
    """
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=120)
        client.ping()
        client.images.get(BASE)
    except Exception as err:
        pytest.skip(
            f"needs dockerd and {BASE} (tools/ci/start-dockerd.sh, tools/ci/make-base-image.sh): {err}"
        )
    tag = f"torchrig-test/py:bookworm-{uuid.uuid4().hex[:10]}"
    try:
        client.images.build(
            fileobj=io.BytesIO(DOCKERFILE.encode()), tag=tag, rm=True, forcerm=True, labels=test_labels
        )
        yield PyImage(client, tag, test_labels)
    finally:  # also when the build failed after tagging, or a test interrupted the session
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(tag, force=True)


def doctor_in_container(
    py: PyImage, *args: str, environment: dict | None = None, **run_options
) -> tuple[int, dict]:
    container = py.client.containers.run(
        py.tag,
        ["python3", "-m", "torchrig", "doctor", "--json", *args],
        **run_options,
        detach=True,
        labels=py.labels,
        environment={"PYTHONPATH": "/src/src", **(environment or {})},
        volumes={str(ROOT): {"bind": "/src", "mode": "ro"}},
        working_dir="/tmp",
    )
    try:
        code = container.wait(timeout=120)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
    finally:
        container.remove(force=True)
    return code, json.loads(out)


def test_container_without_gpus(py_image):
    code, data = doctor_in_container(py_image)
    assert code == 1
    first = data["findings"][0]
    assert (first["id"], first["severity"]) == ("container.no_gpu_access", "error")
    assert first["summary"] == "container started without GPU access"
    assert "NVIDIA_VISIBLE_DEVICES is unset" in first["cause"]
    fixes = "\n".join(first["fix"])
    assert "docker run --gpus all" in fixes and "--device nvidia.com/gpu=all" in fixes
    assert "nvidia-container-toolkit" in fixes
    found = [f["id"] for f in data["findings"]]
    assert "driver.missing" not in found  # the host may well have a driver; the container just has no access
    assert (
        data["facts"]["container"]["in_container"] is True
        and data["facts"]["container"]["runtime"] == "docker"
    )
    shm = next(f for f in data["findings"] if f["id"] == "limits.shm")
    assert shm["severity"] == "warning" and data["facts"]["container"]["shm_bytes"] == 64 * 1024 * 1024


def test_cuda_image_started_without_gpus(py_image):
    """CUDA images set NVIDIA_VISIBLE_DEVICES=all; without --gpus the request is silently ignored."""
    code, data = doctor_in_container(py_image, environment={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert code == 1
    first = data["findings"][0]
    assert first["id"] == "container.no_gpu_access" and "NVIDIA_VISIBLE_DEVICES=all" in first["cause"]


def test_limits_of_the_container_are_reported(py_image):
    import docker

    code, data = doctor_in_container(
        py_image,
        "--only",
        "container",
        nano_cpus=1_000_000_000,
        mem_limit="512m",
        shm_size="2g",
        ulimits=[docker.types.Ulimit(name="stack", soft=67108864, hard=67108864)],
    )
    c = data["facts"]["container"]
    assert c["cgroup_cpu_limit"] == 1.0 and c["cgroup_memory_limit_bytes"] == 512 * 1024 * 1024
    assert c["shm_bytes"] == 2 * 1024**3 and c["stack_bytes"] == 67108864
    found = {f["id"]: f for f in data["findings"]}
    assert found["limits.cgroup"]["summary"].startswith("cgroup limits: 1 CPUs")
    assert found["limits.shm"]["severity"] == "ok" and "limits.stack" not in found
    # the limits are fine (memlock is a note without RDMA devices); the one problem is still the missing GPUs
    assert code == 1 and [f["id"] for f in data["findings"] if f["severity"] in ("error", "warning")] == [
        "container.no_gpu_access"
    ]
