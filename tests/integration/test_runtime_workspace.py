"""No work lost at ``down``: /workspace is the environment's own volume, kept across down/up of the same
name with its host ports; ``down --volumes`` deletes it and says so. The real engine and image."""

from __future__ import annotations

import secrets
import socket
import subprocess

import pytest


@pytest.fixture
def user_env(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh/id_ed25519")], check=True
    )
    return {"HOME": str(home), "TORCHRIG_STATE_DIR": str(tmp_path / "state")}


@pytest.fixture
def image(request) -> str:
    import os

    return os.environ.get("TORCHRIG_TEST_IMAGE") or request.getfixturevalue("test_image")


@pytest.fixture
def name(engine):
    """A unique environment name; its container and workspace volume are removed whatever happens."""
    n = f"trt-ws-{secrets.token_hex(3)}"
    yield n
    for c in engine.containers.list(all=True, filters={"name": f"^{n}$"}, ignore_removed=True):
        c.remove(force=True)
    for v in engine.volumes.list(filters={"label": f"torchrig.workspace={n}"}):
        v.remove(force=True)


def test_work_in_workspace_survives_down_and_up(cli, engine, image, user_env, name):
    up = ["up", "--image", image, "--name", name, "--no-jupyter", "--json"]
    r = cli(*up, env=user_env, timeout=300)
    assert r.code == 0, r.err
    ws = r.json()["workspace"]
    vol = ws["volume"]
    assert ws["path"] == "/workspace" and ws["new"] is True and name in vol
    labels = engine.volumes.get(vol).attrs["Labels"]
    assert labels["torchrig.workspace"] == name and labels["torchrig.uid"] == "0"
    ssh_port = r.json()["host_ports"]["ssh"]
    # the image's non-root user saves a file there
    ex = cli("exec", name, "--", "sh", "-c", "echo kept > /workspace/note.txt && id -un", env=user_env)
    assert ex.code == 0 and ex.out.strip() == "torch", ex.err

    down = cli("down", name, env=user_env)
    assert down.code == 0, down.err
    assert f"kept volume {vol}" in down.out and f"down --volumes {name}" in down.out

    text = cli(*up[:-1], env=user_env, timeout=300)  # the human view says which volume holds /workspace
    assert text.code == 0, text.err
    assert f"workspace /workspace is volume {vol} (kept from before)" in text.out
    ex = cli("exec", name, "--", "cat", "/workspace/note.txt", env=user_env)
    assert ex.code == 0 and ex.out.strip() == "kept", ex.err
    assert int(engine.api.port(name, 2222)[0]["HostPort"]) == ssh_port, "the ssh port is kept"
    assert cli("down", name, env=user_env).code == 0

    # the kept port, taken meanwhile by another program: a new one, and up says so
    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", ssh_port))
        holder.listen()
        r = cli(*up, env=user_env, timeout=300)
        assert r.code == 0, r.err
        assert r.json()["host_ports"]["ssh"] != ssh_port
        assert any(f"port {ssh_port}" in n and "taken" in n for n in r.json()["plan"]["notes"])
    finally:
        holder.close()

    gone = cli("down", "--volumes", name, env=user_env)
    assert gone.code == 0, gone.err
    assert f"deleted volume {vol}" in gone.out
    assert not engine.volumes.list(filters={"name": vol})


def test_down_volumes_after_down_deletes_the_kept_volume(cli, engine, image, user_env, name):
    r = cli(
        "up",
        "--image",
        image,
        "--name",
        name,
        "--no-jupyter",
        "--no-ssh",
        "--json",
        env=user_env,
        timeout=300,
    )
    assert r.code == 0, r.err
    vol = r.json()["workspace"]["volume"]
    assert cli("down", name, env=user_env).code == 0
    assert engine.volumes.get(vol)
    again = cli("down", "--volumes", name, env=user_env)
    assert again.code == 0 and f"deleted volume {vol}" in again.out, again.err
    assert cli("down", "--volumes", name, env=user_env).code == 2  # nothing left: no such environment


def test_a_volume_on_workspace_replaces_the_default(cli, engine, image, user_env, name, tmp_path):
    work = tmp_path / "proj"
    work.mkdir()
    r = cli(
        "up", "--image", image, "--name", name, "--no-jupyter", "--no-ssh", "-v", f"{work}:/workspace",
        "--json", env=user_env, timeout=300,
    )  # fmt: skip
    assert r.code == 0, r.err
    assert r.json()["workspace"] is None
    assert not engine.volumes.list(filters={"label": f"torchrig.workspace={name}"})
    assert cli("down", "--volumes", name, env=user_env).code == 0
