"""``torchrig doctor`` inside a container started without GPUs, on the real Docker engine: it must say exactly
that (and notice Docker's 64 MB /dev/shm), not "no driver"."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = "torchrig-test/debian:bookworm"
IMAGE = "torchrig-test/py:bookworm"
DOCKERFILE = f"""FROM {BASE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
"""


@pytest.fixture(scope="session")
def py_image():
    """The local Debian base plus python3 (built once; the checkout is bind-mounted, so no torchrig install)."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=120)
        client.ping()
        client.images.get(BASE)
    except Exception as err:
        pytest.skip(
            f"needs dockerd and {BASE} (tools/ci/start-dockerd.sh, tools/ci/make-base-image.sh): {err}"
        )
    built = False
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        client.images.build(fileobj=io.BytesIO(DOCKERFILE.encode()), tag=IMAGE, rm=True)
        built = True
    yield client
    if built:  # what this session made, it removes
        with contextlib.suppress(Exception):
            client.images.remove(IMAGE, force=True)


def doctor_in_container(
    client, *args: str, environment: dict | None = None, **run_options
) -> tuple[int, dict]:
    container = client.containers.run(
        IMAGE,
        ["python3", "-m", "torchrig", "doctor", "--json", *args],
        **run_options,
        detach=True,
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
