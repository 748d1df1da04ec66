"""Bad input to the environment commands: exit 2 and one line on stderr, before any engine is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures/runtime"
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_ed25519.pub").write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForArgumentTests test\n"
    )
    return {"HOME": str(home), "TORCHRIG_STATE_DIR": str(tmp_path / "state"), **NO_ENGINE}


def one_line_error(r, *needles):
    assert r.code == 2, (r.code, r.err)
    assert r.err.startswith("torchrig: error: ") and r.err.count("\n") == 1, r.err
    assert "Traceback" not in r.err
    for n in needles:
        assert n in r.err, r.err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpus", "two"], "malformed --gpus"),
        (["--gpus", "0"], "device=0"),
        (["--volume", "/nonexistent-dir-xyz:/data"], "does not exist"),
        (["--volume", "relative-only"], "malformed --volume"),
        (["--volume", "bad!name:/data"], "not a valid volume name"),
        (["--user", "no-such-account-xyz"], "no such account"),
        (["--pids-limit", "3"], "--pids-limit 3 is too small"),
        (["--memory", "lots"], "malformed --memory"),
        (["--cpus", "100000"], "CPUs"),
        (["--shm-size", "-1g"], "--shm-size"),
        (["--name", "bad name!"], "invalid environment name"),
        (["--gpus", "7,9", "--inventory", str(FIX / "inventory-8xh200.json")], "no GPU 9"),
        (["--gpus", "1", "--inventory", "/nonexistent.json"], "does not exist"),
    ],
)
def test_up_bad_input(cli, env, args, needle):
    one_line_error(cli("up", "--image", "x:y", *args, env=env), needle)


def test_up_without_image(cli, env):
    one_line_error(cli("up", env=env), "no image given")


def test_up_without_ssh_key_says_how_to_make_one(cli, env, tmp_path):
    (Path(env["HOME"]) / ".ssh/id_ed25519.pub").unlink()
    one_line_error(cli("up", "--image", "x:y", env=env), "ssh-keygen -t ed25519", "--no-ssh")


@pytest.mark.parametrize(
    "argv", [["up", "--image", "x:y"], ["ps"], ["logs", "a"], ["exec", "a", "--", "true"], ["down", "a"]]
)
def test_engine_not_running_says_how_to_start_it(cli, env, argv):
    r = cli(*argv, env=env)
    one_line_error(r, "cannot reach the Docker engine", "systemctl start docker")


def test_engine_not_running_json(cli, env):
    r = cli("ps", "--json", env=env)
    assert r.code == 2 and r.json()["error"]["type"] == "EngineUnavailable"


def test_exec_needs_a_command(cli, env):
    one_line_error(cli("exec", "a", env=env), "no command given")


def test_gpus_board_from_recorded_inventory_without_engine(cli, env):
    r = cli("gpus", "--inventory", str(FIX / "inventory-8xh200.json"), "--json", env=env)
    assert r.code == 0
    data = r.json()
    assert len(data["gpus"]) == 8 and all(g["holders"] == [] for g in data["gpus"])
    assert "not reconciled" in data["notes"][0]


def test_up_dry_run_is_light_on_bad_engine(cli, env):
    # even a dry run needs the image's labels, so no engine is a clear exit 2
    one_line_error(cli("up", "--image", "x:y", "--dry-run", env=env), "Docker engine")


def test_up_spec_not_built_yet(cli, env, tmp_path):
    spec = tmp_path / "torchrig.toml"
    spec.write_text('schema_version = 1\n[torch]\nversion = "2.13.0"\nvariant = "cpu"\n')
    one_line_error(cli("up", "--spec", str(spec), env=env), "has not been built yet", "torchrig image build")


def test_up_spec_missing(cli, env, tmp_path):
    one_line_error(cli("up", "--spec", str(tmp_path / "nope.toml"), env=env), "no such spec file")


@pytest.mark.parametrize("name", ["up", "ps", "logs", "exec", "down", "gpus"])
def test_help_is_light_and_has_examples(cli, name):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torchrig", name, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "examples:" in proc.stdout
    mods = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert not mods & {"docker", "pynvml", "torch", "sqlite3"}


@pytest.mark.parametrize("labels", ["nokey", "Bad Key=1", "=v", "a=1,,b"])
def test_up_bad_labels_env(cli, env, labels):
    r = cli("up", "--image", "x:y", env={**env, "TORCHRIG_LABELS": labels})
    if labels == "a=1,,b":
        one_line_error(r, "malformed TORCHRIG_LABELS entry 'b'")
    else:
        one_line_error(r, "malformed TORCHRIG_LABELS")


def test_empty_state_dir_is_a_one_line_error(cli, env):
    one_line_error(cli("ps", env={**env, "TORCHRIG_STATE_DIR": ""}), "TORCHRIG_STATE_DIR is set but empty")
