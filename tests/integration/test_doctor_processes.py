"""Who a GPU process is, for real: a process in a Docker container is named by its container (the Engine API),
and by its user (/proc/PID/status), as doctor's gpu.busy evidence says them."""

from __future__ import annotations

import os
import uuid

import pytest

from torchrig.doctor.probes.container import docker_socket
from torchrig.doctor.probes.processes import identify

BASE = "torchrig-test/debian:bookworm"


@pytest.fixture
def sleeping_container():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.images.get(BASE)
    except Exception as err:  # no engine or no base image: say what is missing
        pytest.skip(f"needs dockerd and {BASE}: {err}")
    name = f"torchrig-doctor-who-{uuid.uuid4().hex[:8]}"
    box = client.containers.run(BASE, ["sleep", "120"], name=name, detach=True, user="65534:65534")
    try:
        box.reload()
        yield name, int(box.attrs["State"]["Pid"])
    finally:
        box.remove(force=True)


def test_a_containers_process_is_named_by_its_container_and_user(sleeping_container):
    name, pid = sleeping_container
    socket_path = docker_socket()
    if socket_path is None or not os.path.exists(socket_path):
        pytest.skip("no local Docker engine socket")
    who = identify([pid], socket_path)
    user, container = who[pid]
    assert container == name
    assert user in ("nobody", "uid 65534")
