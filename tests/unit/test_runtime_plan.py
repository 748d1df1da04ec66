"""The plan: safe defaults as data, device requests, labels — a pure function, no engine."""

from __future__ import annotations

from torchrig.runtime.inventory import Unit
from torchrig.runtime.options import Volume
from torchrig.runtime.placement import NO_GPUS, parse_gpus
from torchrig.runtime.plan import HostFacts, ImageFacts, UpRequest, default_shm_bytes, make_plan

IMAGE = ImageFacts("torchrig/pytorch:t", "sha256:abc", {"org.torchrig.user": "torch:1000:1000"}, "1000:1000")
HOST = HostFacts(uid=1000, gid=1000, memory_total_bytes=64 * 2**30, hostname="box", cdi=False)
UNITS = (Unit("GPU-aaaa", 0, "0", False, 0, "nv"), Unit("GPU-bbbb", 1, "1", False, 0, "nv"))


def plan(**kw):
    host, units = kw.pop("host", HOST), kw.pop("units", ())
    req = UpRequest(
        image="torchrig/pytorch:t", name="alice-1", user="alice", gpus=kw.pop("gpus", NO_GPUS), **kw
    )
    return make_plan(req, IMAGE, host, units)


def test_defaults_are_safe():
    p = plan()
    assert {x.host_ip for x in p.ports} == {"127.0.0.1"} and all(x.host_port is None for x in p.ports)
    assert {(u.name, u.soft, u.hard) for u in p.ulimits} == {
        ("memlock", -1, -1),
        ("stack", 67108864, 67108864),
    }
    assert p.shm_size_bytes == 16 * 2**30  # a quarter of 64 GiB
    assert p.env["TORCHRIG_SERVICES"] == "jupyter,ssh" and p.command is None
    assert p.container_user == "torch" and p.container_uid == 1000
    assert p.labels["torchrig.user"] == "alice" and p.labels["torchrig.managed"] == "1"
    assert "TOKEN" not in " ".join(p.env.values()) and not any("token" in v for v in p.labels.values())


def test_public_binds_all_interfaces_and_warns():
    p = plan(public=True)
    assert {x.host_ip for x in p.ports} == {"0.0.0.0"} and any("ufw" in n for n in p.notes)


def test_gpus_become_device_requests_by_uuid():
    req = UpRequest(image="i", name="n", user="u", gpus=parse_gpus("2"))
    p = make_plan(req, IMAGE, HOST, UNITS)
    (d,) = p.device_requests
    assert (
        d.driver == "nvidia"
        and d.device_ids == ("GPU-aaaa", "GPU-bbbb")
        and ("gpu", "compute", "utility") in d.capabilities
    )
    p = make_plan(req, IMAGE, HostFacts(1000, 1000, 2**36, "box", cdi=True), UNITS)
    assert (
        p.device_requests[0].driver == "cdi"
        and p.device_requests[0].device_ids[0] == "nvidia.com/gpu=GPU-aaaa"
    )
    assert p.labels["torchrig.gpus"] == "GPU-aaaa,GPU-bbbb"
    assert "--device=nvidia.com/gpu=GPU-bbbb" in p.docker_run()


def test_no_services_keeps_container_idle_for_exec():
    p = plan(jupyter=False, ssh=False)
    assert p.ports == () and p.command == ("sleep", "infinity") and p.env == {}


def test_shm_follows_memory_limit_and_bounds():
    assert default_shm_bytes(8 * 2**30, 2**40) == 4 * 2**30
    assert default_shm_bytes(None, 2**40) == 64 * 2**30
    assert default_shm_bytes(None, 2 * 2**30) == 2**30
    assert plan(memory_bytes=8 * 2**30).shm_size_bytes == 4 * 2**30


def test_image_user_runs_as_the_host_uid():
    p = plan(volumes=(Volume("/data", "/home/torch/data"),), host=HostFacts(1001, 1002, 2**36, "box", False))
    assert p.run_as == (1001, 1002) and p.container_uid == 1001 and p.image_gid == 1000
    assert any("runs as your UID 1001:1002" in n for n in p.notes)
    assert plan().run_as is None  # same UID: nothing to do
    assert (
        plan(host=HostFacts(None, None, 2**36, "box", False)).run_as is None
    )  # plain root: the image's user


def test_services_the_image_lacks_are_dropped_with_a_note():
    from torchrig.runtime.up import services_of_image

    req = UpRequest(image="i", name="n", user="u", gpus=NO_GPUS)
    got, notes = services_of_image(req, {"org.torchrig.services": "jupyter"})
    assert (got.jupyter, got.ssh) == (True, False) and "no ssh" in notes[0]
    got, notes = services_of_image(req, {})
    assert (got.jupyter, got.ssh, notes) == (True, True, [])
