"""The built image, run for real: JupyterLab's REST API with and without the token, ssh with the right key,
a password, and as root, the non-root user, the health check, signals and a dying service."""

from __future__ import annotations

import io
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

TOKEN = "integration-token-7f3a9c"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ssh-keys")
    for name in ("good", "other"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    token = d / "jupyter_token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o644)
    return {"good": d / "good", "other": d / "other", "token": token}


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            got = predicate()
            if got:
                return got
        except Exception as err:  # not up yet
            last = err
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last})")


def host_port(container, port: str) -> int:
    container.reload()
    return int(container.ports[port][0]["HostPort"])


@pytest.fixture(scope="module")
def running(engine, test_image, keys):
    """One container of the test image with both services, ports published on loopback only, and a fresh
    named volume on /workspace/data (as in `docker run -v data:/workspace/data`)."""
    volume = engine.volumes.create(f"torchrig-test-data-{uuid.uuid4().hex[:8]}")
    container = engine.containers.run(
        test_image,
        detach=True,
        ports={"8888/tcp": ("127.0.0.1", None), "22/tcp": ("127.0.0.1", None)},
        environment={"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0", "NCCL_SOCKET_IFNAME": "eth0"},
        volumes={
            str(keys["good"]) + ".pub": {"bind": "/run/secrets/authorized_keys", "mode": "ro"},
            str(keys["token"]): {"bind": "/run/secrets/jupyter_token", "mode": "ro"},
            volume.name: {"bind": "/workspace/data", "mode": "rw"},
        },
    )
    try:
        ports = {"jupyter": host_port(container, "8888/tcp"), "ssh": host_port(container, "22/tcp")}
        wait_for(lambda: http_status(ports["jupyter"], "/api") == 200, 90, "JupyterLab to answer")
        yield container, ports
    finally:
        container.remove(force=True)
        volume.remove(force=True)


def http_status(port: int, path: str, token: str | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def ssh(port: int, key: Path, user: str, command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        "ssh",
        "-p",
        str(port),
        "-i",
        str(key),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "LogLevel=ERROR",
        *extra,
        f"{user}@127.0.0.1",
        command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_jupyter_needs_the_token(running):
    _, ports = running
    assert http_status(ports["jupyter"], "/api/contents") == 403
    assert http_status(ports["jupyter"], "/api/contents", token="wrong-token") == 403
    assert http_status(ports["jupyter"], "/api/contents", token=TOKEN) == 200


def test_ssh_with_the_right_key_gets_torch_and_the_container_env(running, keys):
    _, ports = running
    probe = (
        'id -un; id -u; python -c "import torch; print(torch.__version__)"; '
        'echo "nccl=$NCCL_DEBUG cuda=$CUDA_VISIBLE_DEVICES path=$PATH"'
    )
    r = ssh(ports["ssh"], keys["good"], "torch", probe)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "torch" and lines[1] == "1000" and lines[2].startswith("2.13.0")
    assert "nccl=INFO cuda=0" in lines[3] and "path=/opt/venv/bin:" in lines[3]
    # a login shell (what an interactive ssh gets) too: Debian's /etc/profile resets PATH
    login = ssh(
        ports["ssh"], keys["good"], "torch", "bash -lc 'echo $NCCL_DEBUG $CUDA_VISIBLE_DEVICES; which python'"
    )
    assert login.returncode == 0 and login.stdout.split() == ["INFO", "0", "/opt/venv/bin/python"], login


def test_wrong_key_password_and_root_are_refused(running, keys):
    _, ports = running
    wrong = ssh(ports["ssh"], keys["other"], "torch", "true")
    assert wrong.returncode == 255 and "Permission denied (publickey)" in wrong.stderr
    pw = ssh(
        ports["ssh"],
        keys["good"],
        "torch",
        "true",
        "-o",
        "PubkeyAuthentication=no",
        "-o",
        "PreferredAuthentications=password,keyboard-interactive",
    )
    assert pw.returncode == 255 and "Permission denied (publickey)" in pw.stderr
    root = ssh(ports["ssh"], keys["good"], "root", "true")
    assert root.returncode == 255 and "Permission denied" in root.stderr


def test_everything_runs_as_the_non_root_user(running):
    container, _ = running
    assert container.attrs["Config"]["User"] == "1000:1000"
    top = container.top(ps_args="-eo pid,uid,args")
    uids = {row[1] for row in top["Processes"]}
    assert uids == {"1000"}, top["Processes"]
    code, out = container.exec_run(["id", "-u"])
    assert code == 0 and out.decode().strip() == "1000"


def test_health_check_turns_healthy(running):
    container, _ = running

    def healthy():
        container.reload()
        return container.attrs["State"]["Health"]["Status"] == "healthy"

    wait_for(healthy, 90, "the HEALTHCHECK to report healthy")
    logs = container.attrs["State"]["Health"]["Log"]
    assert logs and logs[-1]["ExitCode"] == 0 and "ok   jupyter" in logs[-1]["Output"]


def test_pip_cannot_replace_torch(running):
    container, _ = running
    code, out = container.exec_run(["pip", "install", "--no-index", "torch==2.12.0"])
    assert code != 0 and b"The user requested (constraint) torch==2.13.0+cpu" in out, out
    code, out = container.exec_run(["cat", "/etc/torchrig/constraints.txt"])
    assert b"torch==2.13.0+cpu" in out


def test_torch_has_numpy_and_the_user_can_pip_install_under_the_constraints(running):
    container, _ = running
    code, out = container.exec_run(
        ["python", "-W", "error", "-c", "import torch, numpy; print(torch.ones(2).numpy().sum())"]
    )
    assert code == 0 and out.decode().strip() == "2.0", out  # -W error: torch's NumPy warning would fail
    # the user (uid 1000, not root) installs a small package into the image's venv: no network here, so
    # from a wheel copied in; the constraints still hold torch
    wheel = next((ROOT / ".ci-work" / "wheelhouse").glob("tqdm-*.whl"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(wheel, arcname=wheel.name)
    container.exec_run(["mkdir", "-p", "/tmp/wh"])
    assert container.put_archive("/tmp/wh", buf.getvalue())
    code, out = container.exec_run(["pip", "install", "--no-index", "--find-links", "/tmp/wh", "tqdm"])
    assert code == 0, out
    code, out = container.exec_run(["python", "-c", "import tqdm, torch; print(torch.__version__)"])
    assert code == 0 and out.decode().strip() == "2.13.0+cpu", out
    code, out = container.exec_run(["pip", "uninstall", "-y", "tqdm"])
    assert code == 0, out


def test_tini_is_pid_1_and_the_health_check_is_quiet(running):
    """One init: the image's tini is PID 1 (no Docker --init). The health check probes every 10 s without a
    line in sshd's log; a second `torchrig serve` is refused and the check keeps probing SSH."""
    container, _ = running
    _code, out = container.exec_run(["cat", "/proc/1/cmdline"])
    assert out.split(b"\0")[0] == b"/usr/bin/tini", out
    assert b"Tini is not running as PID 1" not in container.logs()

    def health():
        container.reload()
        return container.attrs["State"]["Health"]

    wait_for(lambda: health()["Status"] == "healthy", 90, "the HEALTHCHECK to report healthy")
    ssh_lines = container.logs().decode().count("[ssh]")
    second = container.exec_run(["torchrig", "serve"])
    assert second.exit_code == 2 and b"already running in this container" in second.output, second.output
    since = health()["Log"][-1]["Start"]

    def two_more_checks() -> list[dict] | None:
        new = [e for e in health()["Log"] if e["Start"] > since]
        return new if len(new) >= 2 else None

    # two more checks (interval 10 s): as soon as they are there, not after a fixed 23 s
    new = wait_for(two_more_checks, 40, "two more health checks")
    for entry in new:
        assert entry["ExitCode"] == 0 and "ok   ssh" in entry["Output"] and "ok   jupyter" in entry["Output"]
    assert container.logs().decode().count("[ssh]") == ssh_lines  # not a line from the checks


def test_docker_stop_is_forwarded_and_clean(engine, test_image, keys):
    c = engine.containers.run(
        test_image,
        detach=True,
        environment={"TORCHRIG_SERVICES": "jupyter"},
        volumes={str(keys["token"]): {"bind": "/run/secrets/jupyter_token", "mode": "ro"}},
    )
    try:
        wait_for(lambda: b"started jupyter" in c.logs(), 60, "serve to start jupyter")
        time.sleep(3)
        started = time.monotonic()
        c.stop(timeout=20)
        elapsed = time.monotonic() - started
        c.reload()
        logs = c.logs().decode()
        assert c.attrs["State"]["ExitCode"] == 0, logs[-2000:]
        assert elapsed < 15 and "received SIGTERM" in logs and "all services stopped" in logs
        assert TOKEN not in logs  # a token from a file is never printed
    finally:
        c.remove(force=True)


def test_a_dying_service_stops_the_container_non_zero(engine, test_image, keys):
    c = engine.containers.run(
        test_image,
        detach=True,
        volumes={
            str(keys["good"]) + ".pub": {"bind": "/run/secrets/authorized_keys", "mode": "ro"},
            str(keys["token"]): {"bind": "/run/secrets/jupyter_token", "mode": "ro"},
        },
    )
    try:
        wait_for(lambda: b"started ssh" in c.logs(), 60, "serve to start ssh")
        code, _ = c.exec_run(["pkill", "-KILL", "-x", "sshd"])
        assert code == 0
        result = c.wait(timeout=30)
        logs = c.logs().decode()
        assert result["StatusCode"] == 137 and "ssh exited with status -9; stopping the others" in logs
    finally:
        c.remove(force=True)


def test_generated_token_is_printed_and_works(engine, test_image):
    c = engine.containers.run(
        test_image,
        detach=True,
        environment={"TORCHRIG_SERVICES": "jupyter"},
        ports={"8888/tcp": ("127.0.0.1", None)},
    )
    try:
        logs = wait_for(
            lambda: (b"jupyter token (generated): " in c.logs()) and c.logs().decode(), 60, "the token"
        )
        token = logs.split("jupyter token (generated): ")[1].split()[0]
        port = host_port(c, "8888/tcp")
        wait_for(lambda: http_status(port, "/api") == 200, 90, "JupyterLab")
        assert len(token) >= 32
        assert (
            http_status(port, "/api/contents") == 403
            and http_status(port, "/api/contents", token=token) == 200
        )
    finally:
        c.remove(force=True)


def test_empty_token_refused_at_start(engine, test_image):
    out = engine.containers.run(
        test_image,
        environment={"JUPYTER_TOKEN": "", "TORCHRIG_SERVICES": "jupyter"},
        remove=False,
        detach=True,
    )
    try:
        result = out.wait(timeout=60)
        assert result["StatusCode"] == 2 and "JUPYTER_TOKEN is empty" in out.logs().decode()
    finally:
        out.remove(force=True)


def test_the_user_can_write_to_a_fresh_named_volume(running, keys):
    _, ports = running
    r = ssh(ports["ssh"], keys["good"], "torch", "touch /workspace/data/x && stat -c %U /workspace/data/x")
    assert r.returncode == 0 and r.stdout.strip() == "torch", r
