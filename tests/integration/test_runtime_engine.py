"""The environment lifecycle on the real engine with the plain base image (no services): limits, ulimits
and port bindings in the engine's inspection, exec exit codes, and a volume that survives down and up."""

from __future__ import annotations

import json

import pytest

BASE = "torchrig-test/debian:bookworm"


def memlock_override(engine) -> list[str]:
    """[] where dockerd may set memlock=-1; else the --ulimit that fits under its own hard limit.

    dockerd without CAP_SYS_RESOURCE (e.g. itself in a container) cannot raise a container's memlock above
    its own; 'torchrig up' then fails with the fix, and this test asks for what the engine can give."""
    import docker

    try:
        engine.containers.run(
            BASE, ["true"], remove=True, ulimits=[docker.types.Ulimit(name="memlock", soft=-1, hard=-1)]
        )
        return []
    except docker.errors.APIError:
        out = engine.containers.run(BASE, ["sh", "-c", "ulimit -H -l"], remove=True).decode().strip()
        return ["--ulimit", f"memlock={int(out) * 1024}"]


@pytest.fixture
def env(tmp_path):
    return {"TORCHRIG_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}


def test_defaults_in_engine_inspection(cli, engine, env):
    """Created (not started): the engine records the default ulimits, shm and 127.0.0.1-only port bindings."""
    r = cli(
        "up",
        "--image",
        BASE,
        "--name",
        "trt-defaults",
        "--create-only",
        "--no-ssh",
        "--memory",
        "4g",
        env=env,
    )
    try:
        assert r.code == 0, r.err
        hc = engine.api.inspect_container("trt-defaults")["HostConfig"]
        assert {(u["Name"], u["Soft"], u["Hard"]) for u in hc["Ulimits"]} == {
            ("memlock", -1, -1),
            ("stack", 67108864, 67108864),
        }
        assert hc["ShmSize"] == 2 * 2**30 and hc["Memory"] == 4 * 2**30 and hc["Init"] is True
        assert {b["HostIp"] for bs in hc["PortBindings"].values() for b in bs} == {"127.0.0.1"}
        labels = engine.api.inspect_container("trt-defaults")["Config"]["Labels"]
        assert labels["torchrig.managed"] == "1" and labels["torchrig.user"]
        assert not any(
            "token" in v.lower() for v in engine.api.inspect_container("trt-defaults")["Config"]["Env"] or []
        )
    finally:
        assert cli("down", "trt-defaults", env=env).code == 0


def test_public_binds_every_interface(cli, engine, env):
    r = cli("up", "--image", BASE, "--name", "trt-public", "--create-only", "--no-ssh", "--public", env=env)
    try:
        assert r.code == 0, r.err
        hc = engine.api.inspect_container("trt-public")["HostConfig"]
        assert {b["HostIp"] for bs in hc["PortBindings"].values() for b in bs} == {"0.0.0.0"}
    finally:
        cli("down", "trt-public", env=env)


def test_plain_lifecycle_and_volume_survives(cli, engine, env, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    extra = memlock_override(engine)
    args = [
        "--image",
        BASE,
        "--name",
        "trt-plain",
        "--no-jupyter",
        "--no-ssh",
        "--volume",
        f"{data}:/data",
        "--memory",
        "512m",
        "--cpus",
        "1",
        *extra,
    ]
    r = cli("up", *args, env=env)
    try:
        assert r.code == 0, r.err
        assert "environment trt-plain is up" in r.out
        ps = cli("ps", "--json", env=env).json()["environments"]
        assert [(e["name"], e["state"]) for e in ps] == [("trt-plain", "running")]
        ex = cli(
            "exec",
            "trt-plain",
            "--",
            "sh",
            "-c",
            "ulimit -s; echo kept > /data/f; echo err >&2; exit 7",
            env=env,
        )
        assert (ex.code, ex.out, ex.err) == (7, "65536\n", "err\n")
        assert cli("logs", "trt-plain", "--tail", "5", env=env).code == 0
        hc = engine.api.inspect_container("trt-plain")["HostConfig"]
        assert hc["NanoCpus"] == 10**9 and hc["Memory"] == 512 * 2**20 and hc["ShmSize"] == 256 * 2**20
    finally:
        down = cli("down", "trt-plain", env=env)
    assert down.code == 0 and "removed trt-plain" in down.out
    assert not [c for c in engine.containers.list(all=True) if c.name == "trt-plain"]
    assert (data / "f").read_text() == "kept\n"
    r = cli("up", *args, env=env)
    try:
        assert r.code == 0, r.err
        assert cli("exec", "trt-plain", "--", "cat", "/data/f", env=env).out == "kept\n"
    finally:
        cli("down", "trt-plain", env=env)


def test_unknown_names_and_images(cli, engine, env):
    r = cli("logs", "trt-nope", env=env)
    assert r.code == 2 and "no torchrig environment named" in r.err and r.err.count("\n") == 1
    r = cli("up", "--image", "torchrig-test/absent:none", "--no-ssh", env=env)
    assert r.code == 2 and "is not on this host" in r.err and "torchrig image build" in r.err


def test_duplicate_name_is_refused_untouched(cli, engine, env):
    extra = memlock_override(engine)
    assert (
        cli("up", "--image", BASE, "--name", "trt-dup", "--no-jupyter", "--no-ssh", *extra, env=env).code == 0
    )
    try:
        dup = cli("up", "--image", BASE, "--name", "trt-dup", "--no-jupyter", "--no-ssh", env=env)
        assert dup.code == 2 and "already exists" in dup.err and dup.err.count("\n") == 1
        assert engine.containers.get("trt-dup").status == "running"
    finally:
        cli("down", "trt-dup", env=env)


def test_unlimited_memlock_refused_by_engine_is_explained(cli, engine, env):
    if not memlock_override(engine):
        pytest.skip("this engine may set memlock=-1")
    r = cli("up", "--image", BASE, "--name", "trt-memlock", "--no-jupyter", "--no-ssh", env=env)
    assert r.code == 2 and "LimitMEMLOCK=infinity" in r.err and r.err.count("\n") == 1
    assert not [c for c in engine.containers.list(all=True) if c.name == "trt-memlock"]


def test_spec_runs_the_image_its_lock_names(cli, engine, env, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('schema_version = 1\n[torch]\nversion = "2.13.0"\nvariant = "cpu"\n')
    (tmp_path / "torchrig.lock.json").write_text(json.dumps({"tags": [BASE]}))
    r = cli("up", "--spec", str(spec), "--no-ssh", "--dry-run", "--json", env=env)
    assert r.code == 0, r.err
    assert r.json()["plan"]["image"] == BASE and r.json()["state"] == "planned"


def test_environment_dying_at_start_leaves_nothing(cli, engine, env):
    """The base image's CMD (bash) exits at once: up reports it (exit 1) and removes container and lease."""
    try:
        r = cli(
            "up",
            "--image",
            BASE,
            "--name",
            "trt-dies",
            "--no-ssh",
            "--wait",
            "30",
            *memlock_override(engine),
            env=env,
        )
        assert r.code == 1 and "exited during start" in r.err and r.err.count("\n") == 1, r.err
        assert not [c for c in engine.containers.list(all=True) if c.name == "trt-dies"]
    finally:
        for c in engine.containers.list(all=True, filters={"name": "^trt-dies$"}):
            c.remove(force=True)


def test_down_of_another_users_environment_needs_force(cli, engine, env):
    extra = memlock_override(engine)
    assert (
        cli("up", "--image", BASE, "--name", "trt-own", "--no-jupyter", "--no-ssh", *extra, env=env).code == 0
    )
    try:
        other = {**env, "SUDO_USER": "mallory"}
        r = cli("down", "trt-own", env=other)
        assert r.code == 2 and "belongs to" in r.err and "--force" in r.err
        assert engine.containers.get("trt-own").status == "running"
        assert cli("down", "trt-own", "--force", env=other).code == 0
    finally:
        cli("down", "trt-own", "--force", env=env)
