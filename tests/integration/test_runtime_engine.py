"""The environment lifecycle on the real engine with the plain base image (no services): limits, ulimits
and port bindings in the engine's inspection, exec exit codes, and a volume that survives down and up."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

BASE = "torchrig-test/debian:bookworm"
HARDENED_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
CAP_BITS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
}  # capability.h
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runtime"


def engine_memlock_max(engine, test_labels) -> int:
    """The most memlock this engine lets a container have (-1: unlimited), read as 'up' reads it."""
    from torchrig.runtime.engine import Engine
    from torchrig.runtime.plan import Ulimit

    got = Engine(engine).ulimit_max(BASE, (Ulimit("memlock", -1, -1),), test_labels)
    assert got is not None
    return got.get("memlock", -1)


@pytest.fixture
def env(tmp_path):
    return {"TORCHRIG_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}


def test_defaults_in_engine_inspection(cli, engine, env, test_labels):
    """Created (not started): the engine records the ulimits, shm and 127.0.0.1-only port bindings."""
    memlock = engine_memlock_max(engine, test_labels)
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
            ("memlock", memlock, memlock),
            ("stack", 67108864, 67108864),
        }
        assert hc["ShmSize"] == 2 * 2**30 and hc["Memory"] == 4 * 2**30 and not hc.get("Init")
        assert {b["HostIp"] for bs in hc["PortBindings"].values() for b in bs} == {"127.0.0.1"}
        # hardened: no-new-privileges, seven capabilities kept of Docker's default fourteen, a pids limit
        assert hc["SecurityOpt"] == ["no-new-privileges"] and hc["CapDrop"] == ["ALL"]
        assert set(hc["CapAdd"]) == {f"CAP_{c}" for c in HARDENED_CAPS} and hc["PidsLimit"] == 16384
        labels = engine.api.inspect_container("trt-defaults")["Config"]["Labels"]
        assert labels["torchrig.managed"] == "1" and labels["torchrig.user"]
        assert not any(
            "token" in v.lower() for v in engine.api.inspect_container("trt-defaults")["Config"]["Env"] or []
        )
    finally:
        assert cli("down", "--volumes", "trt-defaults", env=env).code == 0


def test_public_binds_every_interface(cli, engine, env):
    r = cli("up", "--image", BASE, "--name", "trt-public", "--create-only", "--no-ssh", "--public", env=env)
    try:
        assert r.code == 0, r.err
        hc = engine.api.inspect_container("trt-public")["HostConfig"]
        assert {b["HostIp"] for bs in hc["PortBindings"].values() for b in bs} == {"0.0.0.0"}
    finally:
        cli("down", "--volumes", "trt-public", env=env)


def test_plain_lifecycle_and_volume_survives(cli, engine, env, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
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
    ]
    r = cli("up", *args, env=env)
    try:
        assert r.code == 0, r.err
        assert "environment trt-plain is up" in r.out
        ps = cli("ps", "--json", env=env).json()["environments"]
        assert [(e["name"], e["state"]) for e in ps if e["name"] == "trt-plain"] == [("trt-plain", "running")]
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
        # what the kernel enforces inside: no new privileges, the bounding set of the seven kept
        status = cli("exec", "trt-plain", "--", "cat", "/proc/self/status", env=env).out
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        assert fields["NoNewPrivs"].strip() == "1"
        assert int(fields["CapBnd"], 16) == sum(1 << CAP_BITS[c] for c in HARDENED_CAPS)
        hc = engine.api.inspect_container("trt-plain")["HostConfig"]
        assert hc["NanoCpus"] == 10**9 and hc["Memory"] == 512 * 2**20 and hc["ShmSize"] == 256 * 2**20
    finally:
        down = cli("down", "--volumes", "trt-plain", env=env)
    assert down.code == 0 and "removed trt-plain" in down.out
    assert not engine.containers.list(all=True, filters={"name": "^trt-plain$"}, ignore_removed=True)
    assert (data / "f").read_text() == "kept\n"
    r = cli("up", *args, env=env)
    try:
        assert r.code == 0, r.err
        assert cli("exec", "trt-plain", "--", "cat", "/data/f", env=env).out == "kept\n"
    finally:
        cli("down", "--volumes", "trt-plain", env=env)


def test_unknown_names_and_images(cli, engine, env):
    r = cli("logs", "trt-nope", env=env)
    assert r.code == 2 and "no torchrig environment named" in r.err and r.err.count("\n") == 1
    r = cli("up", "--image", "torchrig-test/absent:none", "--no-ssh", env=env)
    assert r.code == 2 and "is not on this host" in r.err and "torchrig image build" in r.err


def test_duplicate_name_is_refused_untouched(cli, engine, env):
    assert cli("up", "--image", BASE, "--name", "trt-dup", "--no-jupyter", "--no-ssh", env=env).code == 0
    try:
        dup = cli("up", "--image", BASE, "--name", "trt-dup", "--no-jupyter", "--no-ssh", env=env)
        assert dup.code == 2 and "already exists" in dup.err and dup.err.count("\n") == 1
        assert engine.containers.get("trt-dup").status == "running"
    finally:
        cli("down", "--volumes", "trt-dup", env=env)


def test_up_with_no_flags_takes_what_the_engine_allows(cli, engine, env, test_labels):
    """Stock dockerd (Debian's, without CAP_SYS_RESOURCE, 8 MiB memlock) refuses memlock=-1: up takes the
    engine's most, says so, and leaves no probe container behind."""
    memlock = engine_memlock_max(engine, test_labels)
    # a label of this test's own on its probe: other tests' ups probe at the same time
    case = secrets.token_hex(6)
    labels_env = {**env, "TORCHRIG_LABELS": ",".join([os.environ["TORCHRIG_LABELS"], f"trt.case={case}"])}
    r = cli("up", "--image", BASE, "--name", "trt-stock", "--no-jupyter", "--no-ssh", env=labels_env)
    try:
        assert r.code == 0, r.err
        if memlock != -1:
            assert "memlock: this Docker engine allows at most" in r.out and f"took {memlock}" in r.out
        ex = cli("exec", "trt-stock", "--", "sh", "-c", "ulimit -H -l", env=env)
        assert ex.out.strip() == ("unlimited" if memlock == -1 else str(memlock // 1024))
    finally:
        assert cli("down", "--volumes", "trt-stock", env=env).code == 0
    assert not engine.containers.list(
        all=True, filters={"label": ["torchrig.probe", f"trt.case={case}"]}, ignore_removed=True
    )


def test_an_explicit_ulimit_the_engine_cannot_give_is_explained(cli, engine, env, test_labels):
    if engine_memlock_max(engine, test_labels) == -1:
        pytest.skip("this engine may set memlock=-1")
    r = cli(
        "up",
        "--image",
        BASE,
        "--name",
        "trt-memlock",
        "--no-jupyter",
        "--no-ssh",
        "--ulimit",
        "memlock=-1",
        env=env,
    )
    assert r.code == 2 and "LimitMEMLOCK=infinity" in r.err and r.err.count("\n") == 1
    assert not engine.containers.list(all=True, filters={"name": "^trt-memlock$"}, ignore_removed=True)


INSPECTED = (
    ("Config", ("Image", "Hostname", "User", "Env", "Cmd", "Entrypoint", "Labels", "ExposedPorts")),
    (
        "HostConfig",
        (
            "ShmSize",
            "Ulimits",
            "Memory",
            "NanoCpus",
            "PortBindings",
            "Mounts",
            "SecurityOpt",
            "CapAdd",
            "CapDrop",
            "PidsLimit",
            "Init",
            "DeviceRequests",
            "Binds",
        ),
    ),
)


def test_dry_run_docker_run_line_is_the_create_call(cli, engine, env, tmp_path):
    """The dry run's 'docker run' line, given to the real docker CLI, makes the container up makes."""
    import shlex

    data = tmp_path / "data"
    data.mkdir()
    args = [
        "--image",
        BASE,
        "--name",
        "trt-same",
        "--volume",
        f"{data}:/data:ro",
        "--memory",
        "1g",
        "--no-ssh",
    ]
    dry = cli("up", *args, "--cpus", "1", "--dry-run", "--json", env=env)
    assert dry.code == 0, dry.err
    argv = shlex.split(dry.json()["docker_run"])
    assert argv[:3] == ["docker", "run", "-d"] and "--init" not in argv
    argv[argv.index("--name") + 1] = "trt-same-cli"
    made = subprocess.run(["docker", "create", *argv[3:]], capture_output=True, text=True, timeout=120)
    try:
        assert made.returncode == 0, made.stderr
        assert cli("up", *args, "--cpus", "1", "--create-only", env=env).code == 0
        real, by_cli = (engine.api.inspect_container(n) for n in ("trt-same", "trt-same-cli"))
        for section, keys in INSPECTED:
            for key in keys:
                mine, theirs = real[section].get(key) or None, by_cli[section].get(key) or None  # [] = unset
                if key == "Env":  # the same variables; the engine keeps the order each client sent
                    mine, theirs = sorted(mine), sorted(theirs)
                assert mine == theirs, (section, key)
    finally:
        subprocess.run(["docker", "rm", "-f", "trt-same-cli"], capture_output=True, timeout=120)
        cli("down", "--volumes", "trt-same", env=env)
        # 'docker create' made the workspace volume the line names before 'up' could (unlabelled, so
        # 'down --volumes' does not know it as the environment's): removed here by its name
        for v in engine.volumes.list(filters={"name": "trt-same-workspace"}):
            v.remove(force=True)


def test_dry_run_leases_what_a_real_up_would(cli, engine, env, tmp_path):
    """--share and the least-shared tie-break: the dry run shows the GPU a real up then takes."""
    inv = tmp_path / "inv.json"
    inv.write_text((FIXTURES / "driver-535-2xa100-pcie.json").read_text())
    common = ["--image", BASE, "--no-jupyter", "--no-ssh", "--inventory", str(inv), "--create-only"]
    names = []
    try:
        for name in ("trt-dry-sh1", "trt-dry-sh2"):
            r = cli("up", *common, "--name", name, "--gpus", "1", "--share", env=env)
            assert r.code == 0, r.err
            names.append(name)
        # both GPUs held by one sharer each; a third sharer may take either: the dry run names it
        dry = cli(
            "up", *common, "--name", "trt-dry-sh3", "--gpus", "1", "--share", "--dry-run", "--json", env=env
        )
        assert dry.code == 0, dry.err
        planned = [g["uuid"] for g in dry.json()["plan"]["gpus"]]
        alone = cli("up", *common, "--name", "trt-dry-sh4", "--gpus", "1", "--dry-run", env=env)
        assert alone.code == 1 and "no free GPU" in alone.err
        r = cli("up", *common, "--name", "trt-dry-sh3", "--gpus", "1", "--share", "--json", env=env)
        assert r.code == 0, r.err
        names.append("trt-dry-sh3")
        assert [g["uuid"] for g in r.json()["plan"]["gpus"]] == planned
    finally:
        for name in names:
            cli("down", "--volumes", name, env=env)


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
            env=env,
        )
        assert r.code == 1 and "exited during start" in r.err and r.err.count("\n") == 1, r.err
        assert not engine.containers.list(all=True, filters={"name": "^trt-dies$"}, ignore_removed=True)
    finally:
        for c in engine.containers.list(all=True, filters={"name": "^trt-dies$"}, ignore_removed=True):
            c.remove(force=True)


def test_down_of_another_users_environment_needs_force(cli, engine, env):
    """Ownership is the real UID recorded at creation: USER/SUDO_USER do not count; root needs --force."""
    assert cli("up", "--image", BASE, "--name", "trt-own", "--no-jupyter", "--no-ssh", env=env).code == 0
    try:
        labels = engine.api.inspect_container("trt-own")["Config"]["Labels"]
        assert labels["torchrig.uid"] == "0" and labels["torchrig.user"] == "root"
        other = {**env, "SUDO_UID": "4242", "SUDO_GID": "4242", "USER": "root", "SUDO_USER": "root"}
        r = cli("down", "--volumes", "trt-own", env=other)
        assert (
            r.code == 2
            and "belongs to root (UID 0), not you (4242, UID 4242)" in r.err
            and "--force" in r.err
        )
        assert engine.containers.get("trt-own").status == "running"
        assert cli("down", "--volumes", "trt-own", "--force", env=other).code == 0  # root (sudo) is the admin
    finally:
        cli("down", "--volumes", "trt-own", "--force", env=env)
