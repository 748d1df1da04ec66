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


ROOT_HOST = HostFacts(None, None, 2**36, "box", False)


def test_plain_root_works_on_someone_elses_directory_as_its_owner():
    host = HostFacts(None, None, 2**36, "box", False, path_owners={"/home/bob/w": (1500, 1501)})
    p = plan(volumes=(Volume("/home/bob/w", "/workspace"),), host=host)
    assert p.run_as == (1500, 1501) and p.handover == ()
    assert any("works as its owner, UID 1500" in n for n in p.notes)


def test_plain_root_hands_a_root_owned_directory_to_the_environment():
    host = HostFacts(None, None, 2**36, "box", False, path_owners={"/root/w": (0, 0)})
    p = plan(volumes=(Volume("/root/w", "/workspace"), Volume("/ro", "/ro", read_only=True)), host=host)
    assert p.run_as is None and p.handover == ("/root/w",)
    assert any("hand /root/w" in s for s in p.steps)


def test_a_users_foreign_directory_is_only_noted():
    host = HostFacts(1000, 1000, 2**36, "box", False, path_owners={"/srv/x": (0, 0)})
    p = plan(volumes=(Volume("/srv/x", "/workspace"),), host=host)
    assert p.handover == () and any("may not write it" in n for n in p.notes)


def test_named_volumes_are_mounted_and_their_roots_owned():
    p = plan(volumes=(Volume("ws", "/workspace", kind="volume"),))
    (m,) = p.mounts
    assert (m.type, m.source) == (
        "volume",
        "ws",
    ) and "--mount=type=volume,source=ws,target=/workspace" in p.docker_run()
    assert any("create volume ws" in s for s in p.steps) and any("volumes' roots" in s for s in p.steps)


def test_ulimits_are_fitted_to_the_engine_with_a_note():
    host = HostFacts(1000, 1000, 2**36, "box", False, ulimit_max={"memlock": 8 * 2**20, "stack": -1})
    p = plan(host=host)
    assert {(u.name, u.soft, u.hard) for u in p.ulimits} == {
        ("memlock", 8 * 2**20, 8 * 2**20),
        ("stack", 2**26, 2**26),
    }
    assert any("allows at most 8 MiB" in n and "LimitMEMLOCK" in n for n in p.notes)
    # an explicit --ulimit is the user's: kept as asked
    p = plan(host=host, ulimits=(("memlock", -1, -1),))
    assert ("memlock", -1, -1) in {(u.name, u.soft, u.hard) for u in p.ulimits}


def test_hardened_by_default_without_docker_init():
    p = plan()
    assert p.security_opt == ("no-new-privileges",) and p.cap_drop == ("ALL",) and p.pids_limit == 16384
    assert "CAP_NET_RAW" not in p.cap_add and "CAP_SYS_ADMIN" not in p.cap_add
    line = p.docker_run()
    assert "--init" not in line and "--cap-drop=ALL" in line and "--pids-limit=16384" in line
    assert plan(pids_limit=500).pids_limit == 500


def test_services_the_image_lacks_are_dropped_with_a_note():
    from torchrig.runtime.up import services_of_image

    req = UpRequest(image="i", name="n", user="u", gpus=NO_GPUS)
    got, notes = services_of_image(req, {"org.torchrig.services": "jupyter"})
    assert (got.jupyter, got.ssh) == (True, False) and "no ssh" in notes[0]
    got, notes = services_of_image(req, {})
    assert (got.jupyter, got.ssh, notes) == (True, True, [])
