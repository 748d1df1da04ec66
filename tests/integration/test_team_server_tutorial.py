"""docs/tutorials/team-server.md end to end, as two real Unix users of one server (useradd, removed after):
each starts the team's image, saves work in /workspace over ssh (strict host-key checking, the command as
``up`` printed it), takes the environment down and up again and finds the work and the ports unchanged; the
dashboard's ssh command logs in the same way, its Jupyter link answers, and its one ``ssh -L`` line names
every port its links use; ``down --volumes`` deletes the work and says so.

Step 1's build runs as printed (:func:`test_the_team_server_tutorial_builds_the_image`), in a scratch folder
after step 1's ``init``: the names the server would pull or download are made here. Its wheelhouse
``wheels/`` holds a stand-in torch named like the render's pin (a few hundred bytes, instead of PyPI's CUDA
torch; nothing about torch is asserted beyond what the build prints) and the session wheelhouse's other
wheels; its base, the render's ``FROM`` (Docker Hub's ``python:...-slim-bookworm``), is the local base image
tagged with that name (the engine uses a local image without pulling), untagged after. Those names, and
``team/pytorch:latest`` and the stack tag the build sets, are fixed by the page, so one test at a time on
this host uses them (a host-wide file lock; an image under one of them that no test made skips the test
rather than being moved or removed).

Step 2 and after, and why not as written: the image step 1 builds holds a stand-in torch, so the
environments run the session's test image (a CPU build, made by the same ``image build`` from a local base
and wheelhouse), tagged ``team/pytorch:<unique>`` instead of ``:latest``, and each user's environment name
is unique (tests run in parallel). Step 2's ``up --gpus 2``
runs as printed with the GPUs at the hardware boundary replaced by a recorded 8x H200 inventory
(``TORCHRIG_GPU_INVENTORY``): its dry run leases two GPUs of one NVLink domain and NUMA node; the real one
refuses the CPU image in one line before the engine is asked (the GPUs would go unused), leaving no
container, volume or lease behind (an engine without the NVIDIA runtime is test_runtime_gpus' case). The
environments that then start, go down and come back are the ones without ``--gpus``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py
import userpython  # tests/userpython.py

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tutorials" / "team-server.md"


def _run_as(
    user: str, argv: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _python_for(user: str, scratch: Path) -> tuple[str, str]:
    """(python, PYTHONPATH) the user can run torchrig and the Docker SDK with (tests/userpython.py)."""
    path, probe = str(ROOT / "src"), userpython.probe_code()
    if _run_as(user, [sys.executable, "-c", probe], {"PYTHONPATH": path}).returncode == 0:
        return sys.executable, path
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip("no python the test users can run")
    deps = scratch / "deps"
    userpython.copy_packages([*userpython.DOCKER_SDK, *userpython.runtime_modules()], deps)
    subprocess.run(["chmod", "a+rX", str(scratch)], check=True)
    path = f"{path}:{deps}"
    r = _run_as(user, [system, "-c", probe], {"PYTHONPATH": path})
    if r.returncode != 0:
        pytest.skip(f"the system python cannot import the copied packages: {r.stderr.strip()[-200:]}")
    return system, path


@pytest.fixture
def server(engine, request):
    """Two users of the server (group docker), each with an SSH key; the team's image under a unique tag."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser")
    image = os.environ.get("TORCHRIG_TEST_IMAGE") or request.getfixturevalue("test_image")
    tag = secrets.token_hex(3)
    team_tag = f"team/pytorch:t-{tag}"
    engine.images.get(image).tag("team/pytorch", f"t-{tag}")
    scratch = Path(tempfile.mkdtemp(prefix="trt-team-"))
    os.chmod(scratch, 0o755)
    users = {who: f"trt-{who[0]}{tag}" for who in ("alice", "bob")}
    made: list[str] = []
    try:
        for who, name in users.items():
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", "-G", "docker", name], check=True)
            made.append(name)
            home = scratch / who
            (home / ".ssh").mkdir(parents=True)
            subprocess.run(["chown", "-R", name, str(home)], check=True)
            key = _run_as(
                name, ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{home}/.ssh/id_ed25519"], {}
            )
            assert key.returncode == 0, key.stderr
        from torchrig.runtime.ledger import Ledger

        Ledger.open(scratch / "state").close()  # the server's shared ledger, made once by root
        python, pypath = _python_for(users["alice"], scratch)
        for who in users:  # _python_for may have opened the scratch tree to all
            os.chmod(scratch / who / ".ssh" / "id_ed25519", 0o600)
        yield {"users": users, "scratch": scratch, "image": team_tag, "python": python, "pythonpath": pypath}
    finally:
        for name in made:
            for c in engine.containers.list(
                all=True, filters={"label": f"torchrig.user={name}"}, ignore_removed=True
            ):
                c.remove(force=True)
            for v in engine.volumes.list(filters={"label": f"torchrig.user={name}"}):
                v.remove(force=True)
            subprocess.run(["userdel", name], capture_output=True)
        engine.images.remove(team_tag)
        shutil.rmtree(scratch, ignore_errors=True)


INVENTORY = ROOT / "tests" / "fixtures" / "runtime" / "inventory-8xh200.json"
BASE_IMAGE = os.environ.get("TORCHRIG_TEST_BASE", "torchrig-test/debian:bookworm")
BUILD = "tests/integration/test_team_server_tutorial.py::test_the_team_server_tutorial_builds_the_image"
# the page's fixed names (the build's base, its tags) are used by one test at a time on this host
FIXED_NAMES_LOCK = Path(tempfile.gettempdir()) / "torchrig-tests-team-tutorial-build.lock"


def _image_or_none(engine, name: str):
    from docker.errors import ImageNotFound

    try:
        return engine.images.get(name)
    except ImageNotFound:
        return None


def test_the_team_server_tutorial_builds_the_image(
    engine, tmp_path, wheelhouse, stand_in_torch_wheel, remove_classic_intermediates, run_identity
):
    from filelock import FileLock

    (init_block,) = [b for b in docblocks.shell_blocks(DOC) if b.kind == "doctest" and "init" in b.body]
    for command, _ in init_block.steps():  # step 1's init and render, as printed
        r = docblocks.run(command, tmp_path)
        assert r.returncode == 0, r.stderr
    (block,) = docblocks.tested_by(DOC, BUILD)
    ((printed, shown),) = block.steps()
    assert printed == "torchrig image build team.toml --tag team/pytorch:latest --wheelhouse wheels"
    render = json.loads(docblocks.run("torchrig image render team.toml --json", tmp_path).stdout)
    base, stack_tag = render["base"], render["tag"]
    pin = re.search(r"pip install [^;\n]*\btorch==(\S+);", render["dockerfile"])
    assert pin, render["dockerfile"]
    # the wheelhouse the page names: a stand-in torch as pinned, the session wheelhouse's other wheels
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    stand_in_torch_wheel(wheels, pin.group(1))
    for wheel in wheelhouse.glob("*.whl"):
        if not wheel.name.startswith("torch-"):
            try:  # ~70 MB: linked where the file system allows
                os.link(wheel.resolve(), wheels / wheel.name)
            except OSError:
                shutil.copy2(wheel, wheels / wheel.name)

    local_base = engine.images.get(BASE_IMAGE)
    built_id = None
    with FileLock(str(FIXED_NAMES_LOCK)):
        for name in ("team/pytorch:latest", stack_tag):
            held = _image_or_none(engine, name)
            if held is not None and "torchrig.test" not in (held.labels or {}):
                pytest.skip(f"{name} is an image no test made; the page's build would move its tag")
        present = _image_or_none(engine, base)
        tagged = present is None or present.id == local_base.id  # ours, or a killed run's tag of it
        if present is None:
            repo, _, tag = base.rpartition(":")
            assert local_base.tag(repo, tag)
        try:
            r = docblocks.run(printed, tmp_path, timeout=1200)
            held = _image_or_none(engine, "team/pytorch:latest")
            built_id = held.id if held is not None and "torchrig.test" in (held.labels or {}) else None
            remove_classic_intermediates(engine, r.stderr.splitlines())
            assert r.returncode == 0, r.stderr[-4000:]
            gone = docblocks.missing(r.stdout + r.stderr, shown, {re.escape(f"{tmp_path}/"): ""})
            assert not gone, f"the build did not print {gone}:\n{r.stdout}{r.stderr[-3000:]}"
            lock = json.loads((tmp_path / "team.lock.json").read_text())
            assert lock["image_id"] == built_id and "team/pytorch:latest" in lock["tags"]
            assert lock["base"] == base and lock["base_reference"] == local_base.id
            assert engine.images.get(built_id).labels["torchrig.test"] == run_identity.session_id
        finally:
            if built_id is not None:
                engine.images.remove(built_id, force=True)  # every tag the build set: :latest, the stack's
            if tagged:
                engine.images.remove(base)  # the name only; the local base keeps its own
    assert _image_or_none(engine, "team/pytorch:latest") is None


def _env(server, who: str) -> dict[str, str]:
    return {
        "HOME": str(server["scratch"] / who),
        "PATH": "/usr/bin:/bin",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": server["pythonpath"],
        "TORCHRIG_STATE_DIR": str(server["scratch"] / "state"),
        "TORCHRIG_LABELS": os.environ.get("TORCHRIG_LABELS", ""),
    }


def torchrig(server, who: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**_env(server, who), **(env or {})}
    return _run_as(server["users"][who], [server["python"], "-m", "torchrig", *args], full)


def ssh(server, who: str, printed: str, remote: str) -> subprocess.CompletedProcess:
    """The printed ssh command, run by that user with strict host-key checking (no prompt, no TOFU)."""
    argv = shlex.split(printed)
    key = f"{server['scratch'] / who}/.ssh/id_ed25519"
    strict = ["-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10"]
    return _run_as(server["users"][who], [argv[0], *strict, *argv[1:], remote], _env(server, who), timeout=60)


def test_the_team_server_tutorial_as_two_users(server, engine):
    text = DOC.read_text()
    # step 1 makes what step 2 runs
    assert "torchrig image build team.toml --tag team/pytorch:latest --wheelhouse wheels" in text
    assert "torchrig up --image team/pytorch:latest --gpus 2 --name alice-exp" in text
    # step 2 as printed (`--gpus 2`), on the recorded 8x H200 inventory: the plan, then the refusal
    node = "tests/integration/test_team_server_tutorial.py::test_the_team_server_tutorial_as_two_users"
    (step2,) = docblocks.tested_by(DOC, node)
    ((printed, _),) = step2.steps()
    assert printed == "torchrig up --image team/pytorch:latest --gpus 2 --name alice-exp"
    name = f"{server['users']['alice']}-gpus"
    argv = shlex.split(printed)[1:]
    argv[argv.index("team/pytorch:latest")] = server["image"]
    argv[argv.index("alice-exp")] = name
    fake_gpus = {"TORCHRIG_GPU_INVENTORY": str(INVENTORY)}
    plan = torchrig(server, "alice", *argv, "--dry-run", env=fake_gpus)
    assert plan.returncode == 0, plan.stderr
    picked = re.search(r"^  GPUs +(\d+), (\d+)$", plan.stdout, re.M)
    assert picked, plan.stdout
    gpus = json.loads(torchrig(server, "alice", "gpus", "--json", env=fake_gpus).stdout)["gpus"]
    two = [g for g in gpus if g["gpu"] in picked.groups()]
    assert len(two) == 2 and len({(g["nvlink_domain"], g["numa_node"]) for g in two}) == 1, two
    refused = torchrig(server, "alice", *argv, env=fake_gpus)  # the test image is a CPU build
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("torchrig: error: pre-flight refused the image: ")
    assert "CPU-only build: the GPUs would go unused" in refused.stderr and refused.stderr.count("\n") == 1
    assert not engine.containers.list(all=True, filters={"name": name}, ignore_removed=True)
    assert not engine.volumes.list(filters={"label": f"torchrig.workspace={name}"})
    after = json.loads(torchrig(server, "alice", "gpus", "--json", env=fake_gpus).stdout)["gpus"]
    assert all(not g["holders"] for g in after), "the refused up holds no lease"

    results = {}
    for who in ("alice", "bob"):
        name = f"{server['users'][who]}-exp"
        r = torchrig(server, who, "up", "--image", server["image"], "--name", name, "--json")
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["workspace"]["path"] == "/workspace" and res["workspace"]["new"] is True
        said = ssh(server, who, res["ssh_command"], f"echo {who}-work > /workspace/notes.txt && id -un")
        assert said.returncode == 0 and said.stdout.strip() == "torch", said.stderr
        results[who] = (name, res)

    # bob cannot take alice's down, nor delete her work
    alice_env = results["alice"][0]
    refused = torchrig(server, "bob", "down", "--volumes", alice_env)
    assert refused.returncode == 2 and "belongs to" in refused.stderr, refused.stderr

    # down and up again: the work and the ports are still there
    for who, (name, first) in results.items():
        down = torchrig(server, who, "down", name)
        assert down.returncode == 0 and f"kept volume {first['workspace']['volume']}" in down.stdout, (
            down.stderr
        )
        again = torchrig(server, who, "up", "--image", server["image"], "--name", name)
        assert again.returncode == 0, again.stderr
        assert (
            f"workspace /workspace is volume {first['workspace']['volume']} (kept from before)"
            in again.stdout
        )
        printed = re.search(r"^  SSH      (.+)$", again.stdout, re.M).group(1)
        assert printed == first["ssh_command"], "the same ssh command works across down/up (same port)"
        said = ssh(server, who, printed, "cat /workspace/notes.txt")
        assert said.returncode == 0 and said.stdout.strip() == f"{who}-work", said.stderr

    # the dashboard, as alice: its ssh command logs in as printed; its Jupyter link answers; one ssh -L
    board = _dashboard(server, "alice")
    try:
        import requests

        url = board[0]
        web = requests.Session()  # the key moves into a cookie at the first request
        page = web.get(url, timeout=30)
        assert page.status_code == 200
        state = web.get(url.split("?")[0] + "state.json", timeout=30)
        envs = {e["name"]: e for e in state.json()["environments"]}
        mine = envs[alice_env]
        assert mine["mine"] and not envs[results["bob"][0]]["mine"] and not envs[results["bob"][0]]["access"]
        said = ssh(server, "alice", mine["access"]["ssh"], "cat /workspace/notes.txt")
        assert said.returncode == 0 and said.stdout.strip() == "alice-work", said.stderr
        jupyter = mine["access"]["jupyter"]
        base, token = jupyter.split("/lab?token=")
        assert requests.get(f"{base}/api/status", params={"token": token}, timeout=10).status_code == 200
        forward = re.search(r'<code id="forward">([^<]+)</code>', page.text).group(1)
        port = base.rsplit(":", 1)[1]
        assert f"-L {port}:127.0.0.1:{port}" in forward.replace("&#x27;", "'")
    finally:
        board[1].terminate()
        board[1].wait(timeout=30)

    for who, (name, first) in results.items():
        gone = torchrig(server, who, "down", "--volumes", name)
        assert gone.returncode == 0 and f"deleted volume {first['workspace']['volume']}" in gone.stdout, (
            gone.stderr
        )
        assert not engine.volumes.list(filters={"name": first["workspace"]["volume"]})


def _dashboard(server, who: str) -> tuple[str, subprocess.Popen]:
    env = _env(server, who)
    argv = ["runuser", "-u", server["users"][who], "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
            server["python"], "-m", "torchrig", "dashboard", "--port", "0", "--no-doctor"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"(http://127\.0\.0\.1:\d+/)\?key=(\S+)", line)
    if not m or time.monotonic() > deadline:
        proc.kill()
        pytest.fail(f"the dashboard printed no URL: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return f"{m.group(1)}?key={m.group(2)}", proc
