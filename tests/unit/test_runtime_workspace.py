"""The environment's own workspace volume and its kept host ports: pure choices, no engine."""

from __future__ import annotations

from torchrig.runtime import ports
from torchrig.runtime.options import Volume
from torchrig.runtime.placement import NO_GPUS
from torchrig.runtime.plan import (
    HostFacts,
    ImageFacts,
    UpRequest,
    make_plan,
    volume_labels,
    workspace_volume_name,
)

IMAGE = ImageFacts(
    "t:1", "sha256:abc", {"org.torchrig.user": "torch:1000:1000"}, "1000:1000", workdir="/workspace"
)
HOST = HostFacts(uid=1000, gid=1000, memory_total_bytes=64 * 2**30, hostname="box", cdi=False)


def plan(image=IMAGE, **kw):
    req = UpRequest(image="t:1", name="exp1", user="alice", gpus=NO_GPUS, owner_uid=1000, **kw)
    return req, make_plan(req, image, HOST, ())


def test_every_environment_gets_its_own_workspace_volume():
    req, p = plan()
    assert p.workspace is not None
    assert (p.workspace.source, p.workspace.target, p.workspace.type) == (
        "torchrig-alice-exp1-workspace",
        "/workspace",
        "volume",
    )
    assert p.mounts[0] == p.workspace and not p.workspace.read_only
    assert "--mount=type=volume,source=torchrig-alice-exp1-workspace,target=/workspace" in p.docker_run()
    assert any("kept across down/up" in s for s in p.steps)
    # another owner's environment of the same name has another volume
    assert workspace_volume_name("exp1", "bob") != p.workspace.source
    labels = volume_labels(req, workspace=True)
    assert labels["torchrig.workspace"] == "exp1" and labels["torchrig.uid"] == "1000"
    assert labels["torchrig.user"] == "alice" and labels["torchrig.volume"] == "1"
    assert "torchrig.workspace" not in volume_labels(req, workspace=False)


def test_a_volume_on_the_workdir_replaces_the_default_one():
    _, p = plan(volumes=(Volume("/home/alice/proj", "/workspace"),))
    assert p.workspace is None and [m.source for m in p.mounts] == ["/home/alice/proj"]
    # one below it mounts over the default volume: both, the workspace first
    _, p = plan(volumes=(Volume("/data", "/workspace/data", True),))
    assert [m.target for m in p.mounts] == ["/workspace", "/workspace/data"]


def test_the_workspace_follows_the_image_workdir():
    other = ImageFacts("t:1", "sha256:abc", {}, None, workdir="/home/dev/work")
    assert plan(image=other)[1].workspace.target == "/home/dev/work"
    bare = ImageFacts("t:1", "sha256:abc", {}, None, workdir="/")
    assert plan(image=bare)[1].workspace.target == "/workspace"


def test_user_names_make_valid_volume_names():
    name = workspace_volume_name("a" * 63, "DOMAIN\\carol smith")
    from torchrig.runtime.options import VOLUME_NAME_RE

    assert VOLUME_NAME_RE.fullmatch(name), name


def test_kept_ports_are_asked_for_again(tmp_path):
    assert ports.remembered("exp1", tmp_path) == {}
    ports.remember("exp1", {"jupyter": 49153, "ssh": 49154}, tmp_path)
    assert ports.remembered("exp1", tmp_path) == {"jupyter": 49153, "ssh": 49154}
    _, p = plan(host_ports=(("jupyter", 49153), ("ssh", 49154)))
    assert {x.service: x.host_port for x in p.ports} == {"jupyter": 49153, "ssh": 49154}
    assert "--publish=127.0.0.1:49154:2222" in p.docker_run()


def test_a_damaged_port_record_costs_only_the_stable_ports(tmp_path):
    (tmp_path / "ports").mkdir()
    for text in ("{", "[]", '{"ports": {"ssh": "22"}}', '{"ports": {"ssh": true, "jupyter": 70000}}'):
        (tmp_path / "ports" / "x.json").write_text(text)
        assert ports.remembered("x", tmp_path) == {}


def test_a_taken_port_is_given_up_with_its_holder_named():
    rec = {"jupyter": 49153, "ssh": 49154}
    c = ports.choose("exp1", rec, ("jupyter", "ssh"), {49154: "bob's environment bob-x"}, {49153, 49154})
    assert c.ask == {"jupyter": 49153}
    (note,) = c.notes
    assert "port 49154" in note and "bob's environment bob-x" in note and "exp1" in note
    c = ports.choose("exp1", rec, ("ssh",), {}, set())
    assert c.ask == {} and "another program" in c.notes[0]


def test_can_bind_sees_a_listener():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not ports.can_bind("127.0.0.1", s.getsockname()[1])


def test_down_says_what_it_deleted_and_what_it_kept():
    from torchrig.cli.cmd_down import _line

    kept = _line(
        {
            "name": "e",
            "user": "u",
            "freed_gpus": [],
            "volumes_deleted": [],
            "volumes_kept": ["torchrig-u-e-workspace"],
        }
    )
    assert "kept volume torchrig-u-e-workspace" in kept and "down --volumes e" in kept
    gone = _line(
        {"name": "e", "user": "u", "freed_gpus": ["0"], "volumes_deleted": ["v"], "volumes_kept": []}
    )
    assert gone.splitlines() == ["removed e; freed GPU 0", "deleted volume v (the files of its /workspace)"]


def test_up_says_which_volume_holds_the_workspace():
    from torchrig.cli.cmd_up import UpReport
    from torchrig.runtime.up import UpResult

    _, p = plan()
    text = UpReport(UpResult(p, "running", (), workspace_new=False)).render_text()
    assert "workspace /workspace is volume torchrig-alice-exp1-workspace (kept from before)" in text
    assert "down --volumes exp1" in text
    doc = UpReport(UpResult(p, "running", (), workspace_new=True)).to_json()["workspace"]
    assert doc == {"volume": "torchrig-alice-exp1-workspace", "path": "/workspace", "new": True}


def test_the_dry_run_shows_the_kept_ports():
    from torchrig.cli.cmd_up import UpReport
    from torchrig.runtime.up import UpResult

    _, p = plan(host_ports=(("ssh", 49154),))
    text = UpReport(UpResult(p, "planned", ())).render_text()
    assert "jupyter 127.0.0.1:auto->8888, ssh 127.0.0.1:49154->2222" in text
