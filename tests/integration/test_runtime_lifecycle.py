"""up → ps → logs → exec → down on the real engine with a real torchrig image; the printed Jupyter URL and
ssh command are used with real clients (HTTP, OpenSSH); a volume's data survives down and up."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def user_env(tmp_path):
    """A user with a fresh ed25519 key in ~/.ssh and a private ledger."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh/id_ed25519")], check=True
    )
    return {"HOME": str(home), "TORCHRIG_STATE_DIR": str(tmp_path / "state")}


def _ssh(printed: str, home, remote: str) -> subprocess.CompletedProcess:
    """The printed ssh command, run by the real client with strict host-key checking (no prompt)."""
    argv = shlex.split(printed)
    extra = [
        "-i",
        f"{home}/.ssh/id_ed25519",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "ConnectTimeout=10",
    ]
    return subprocess.run([argv[0], *extra, *argv[1:], remote], capture_output=True, text=True, timeout=60)


def _non_loopback_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


@pytest.fixture
def image(request) -> str:
    """The session's real torchrig image (``test_image``), or ``$TORCHRIG_TEST_IMAGE`` when set (a prebuilt one)."""
    import os

    return os.environ.get("TORCHRIG_TEST_IMAGE") or request.getfixturevalue("test_image")


def test_lifecycle(cli, engine, image, user_env, tmp_path, test_labels):
    import requests

    test_image = image
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)  # the image's user (UID 1000) writes here; this test runs as root
    name = "trt-life"
    from torchrig.runtime.engine import Engine
    from torchrig.runtime.plan import Ulimit

    memlock = (Engine(engine).ulimit_max(image, (Ulimit("memlock", -1, -1),), test_labels) or {}).get(
        "memlock", -1
    )
    up = cli(
        "up",
        "--image",
        test_image,
        "--name",
        name,
        "--volume",
        f"{work}:/home/torch/work",
        "--memory",
        "2g",
        "--cpus",
        "1",
        "--json",
        env=user_env,
        timeout=300,
    )
    try:
        assert up.code == 0, up.err
        res = up.json()
        assert res["state"] == "running"
        url, ssh = res["jupyter_url"], res["ssh_command"]
        assert url.startswith("http://127.0.0.1:") and "token=" in url
        assert ssh.startswith("ssh -p ") and "torch@127.0.0.1" in ssh

        # Jupyter: the token works, and no token is refused
        base, token = url.split("/lab?token=")
        assert requests.get(f"{base}/api/status", params={"token": token}, timeout=10).status_code == 200
        assert requests.get(f"{base}/api/status", timeout=10).status_code == 403

        # SSH with the printed command: writes into the volume
        r = _ssh(ssh, user_env["HOME"], "echo from-ssh > ~/work/kept.txt && id -un")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "torch"

        # the engine's own inspection: limits, ulimits, shm, ports on 127.0.0.1 only
        info = engine.api.inspect_container(name)
        hc = info["HostConfig"]
        assert hc["Memory"] == 2 * 2**30 and hc["NanoCpus"] == 10**9
        assert hc["ShmSize"] == 2**30
        assert {(u["Name"], u["Soft"], u["Hard"]) for u in hc["Ulimits"]} == {
            ("memlock", memlock, memlock),
            ("stack", 67108864, 67108864),
        }
        bindings = [b for bs in info["NetworkSettings"]["Ports"].values() if bs for b in bs]
        assert bindings and {b["HostIp"] for b in bindings} == {"127.0.0.1"}
        ip = _non_loopback_ip()
        if ip:
            port = int(bindings[0]["HostPort"])
            with pytest.raises(OSError):
                socket.create_connection((ip, port), timeout=3).close()

        ps = cli("ps", "--json", env=user_env)
        assert ps.code == 0 and name in [e["name"] for e in ps.json()["environments"]]
        logs = cli("logs", name, env=user_env)
        assert logs.code == 0 and "jupyter" in logs.out.lower()
        ex = cli(
            "exec", name, "--", "sh", "-c", "ulimit -l; ulimit -s; cat ~/work/kept.txt; exit 3", env=user_env
        )
        assert ex.code == 3
        assert ex.out.split() == ["unlimited" if memlock == -1 else str(memlock // 1024), "65536", "from-ssh"]
    finally:
        down = cli("down", "--volumes", name, env=user_env)
    assert down.code == 0, down.err
    # other tests run as the same Unix user at the same time: this environment is gone, theirs may not be
    assert name not in [e["name"] for e in cli("ps", "--json", env=user_env).json()["environments"]]
    assert (work / "kept.txt").read_text() == "from-ssh\n"

    # up again on the same volume: the data is there
    again = cli(
        "up",
        "--image",
        test_image,
        "--name",
        name,
        "--volume",
        f"{work}:/home/torch/work",
        "--no-jupyter",
        env=user_env,
        timeout=300,
    )
    try:
        assert again.code == 0, again.err
        assert "Jupyter" not in again.out and "ssh -p" in again.out
        r = cli("exec", name, "--", "cat", "/home/torch/work/kept.txt", env=user_env)
        assert r.code == 0 and r.out == "from-ssh\n", (r.code, r.out, r.err)
    finally:
        assert cli("down", "--volumes", name, env=user_env).code == 0


def test_files_on_volumes_belong_to_the_user(cli, engine, image, user_env, tmp_path):
    """As 'sudo torchrig up' by UID 4321: the image's user runs as 4321:4322; SSH and Jupyter still work."""
    import requests

    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, 4321, 4322)
    env = {**user_env, "SUDO_UID": "4321", "SUDO_GID": "4322", "SUDO_USER": "carol"}
    name = "trt-uid"
    r = cli(
        "up",
        "--image",
        image,
        "--name",
        name,
        "--volume",
        f"{work}:/home/torch/work",
        "--json",
        env=env,
        timeout=300,
    )
    try:
        assert r.code == 0, r.err
        res = r.json()
        assert engine.api.inspect_container(name)["Config"]["User"] == "4321:4322"
        ssh = _ssh(res["ssh_command"], user_env["HOME"], "id -u; id -un; touch ~/work/mine && touch ~/.probe")
        assert ssh.returncode == 0, ssh.stderr
        assert ssh.stdout.split() == ["4321", "torch"]
        base, token = res["jupyter_url"].split("/lab?token=")
        assert requests.get(f"{base}/api/status", params={"token": token}, timeout=10).status_code == 200
        st = (work / "mine").stat()
        assert (st.st_uid, st.st_gid) == (4321, 4322)
        # the owner is the UID (4321 has no account here), not SUDO_USER
        envs = cli("ps", "--json", env=env).json()["environments"]  # other tests' run beside it: this one's
        assert [e["user"] for e in envs if e["name"] == name] == ["4321"]
    finally:
        assert cli("down", "--volumes", name, env=env).code == 0


def test_host_key_survives_down_and_up(cli, engine, image, user_env):
    """down then up of the same name: the printed ssh command still works with StrictHostKeyChecking=yes,
    and the environment's log has one init (no "Tini is not running as PID 1")."""
    name = "trt-hostkey"
    lines = []
    for _ in range(2):
        r = cli("up", "--image", image, "--name", name, "--no-jupyter", "--json", env=user_env, timeout=300)
        try:
            assert r.code == 0, r.err
            res = r.json()
            assert (
                "UserKnownHostsFile=" in res["ssh_command"]
                and "StrictHostKeyChecking" not in res["ssh_command"]
            )
            ssh = _ssh(res["ssh_command"], user_env["HOME"], "id -un")
            assert ssh.returncode == 0 and ssh.stdout.strip() == "torch", ssh.stderr
            lines.append(res["known_hosts_line"])
            logs = cli("logs", name, env=user_env).out
            assert "Tini is not running as PID 1" not in logs, logs
            top = engine.api.top(name, ps_args="-eo pid,comm")["Processes"]
            assert [p[1] for p in top if p[1] in ("tini", "docker-init")] == ["tini"], top
        finally:
            assert cli("down", "--volumes", name, env=user_env).code == 0
    assert lines[0] == lines[1] and lines[0].startswith(f"{name} ssh-ed25519 ")


def test_workspace_is_writable_by_default(cli, engine, image, user_env, tmp_path):
    """As plain root: a root-owned host directory (with a root-owned file in it) and a new named volume are
    both writable by the environment's user; the volume keeps its files across down and up."""
    import secrets

    work = tmp_path / "rootwork"
    work.mkdir(mode=0o755)
    (work / "old.txt").write_text("root's\n")
    assert work.stat().st_uid == 0 == os.getuid(), "this test runs as root, like CI"
    vol = f"trt-ws-{secrets.token_hex(3)}"
    env = {k: v for k, v in user_env.items()}
    args = ["--image", image, "--name", "trt-ws", "--no-jupyter", "--no-ssh"]
    args += ["--volume", f"{work}:/workspace/host", "--volume", f"{vol}:/workspace/vol"]
    write = "touch /workspace/host/new /workspace/vol/new && echo more >> /workspace/host/old.txt && id -un"
    try:
        for _ in range(2):
            r = cli("up", *args, env=env, timeout=300)
            try:
                assert r.code == 0, r.err
                ex = cli("exec", "trt-ws", "--", "sh", "-c", write, env=env)
                assert ex.code == 0 and ex.out.strip() == "torch" and "Permission denied" not in ex.err, (
                    ex.err
                )
                assert cli("exec", "trt-ws", "--", "ls", "/workspace/vol", env=env).out.split() == ["new"]
            finally:
                assert cli("down", "--volumes", "trt-ws", env=env).code == 0
        assert (work / "old.txt").read_text() == "root's\nmore\nmore\n"
        assert engine.volumes.get(vol).attrs["Labels"].get("torchrig.volume") == "1"
    finally:
        for v in engine.volumes.list(filters={"name": vol}):
            v.remove(force=True)


def test_ctrl_c_during_start_leaves_nothing(engine, image, user_env):
    """SIGINT (as a terminal's Ctrl-C) while up waits for the services: container and lease are removed.

    Passes under a runner that ignores SIGINT too (tests/conftest.py gives children the default back)."""
    import signal
    import sys
    import time

    name = "trt-ctrlc"
    env = {**os.environ, **user_env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchrig", "up", "--image", image, "--name", name, "--wait", "120"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not engine.containers.list(all=True, filters={"name": f"^{name}$"}, ignore_removed=True):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.stderr else ""
            )
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "interrupted" in err, err
        deadline = time.monotonic() + 30  # the engine may still be finishing the removal up asked for
        while (
            engine.containers.list(all=True, filters={"name": f"^{name}$"}, ignore_removed=True)
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        assert not engine.containers.list(all=True, filters={"name": f"^{name}$"}, ignore_removed=True)
        from torchrig.runtime.ledger import Ledger

        assert Ledger.open(Path(user_env["TORCHRIG_STATE_DIR"])).leases() == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in engine.containers.list(all=True, filters={"name": f"^{name}$"}, ignore_removed=True):
            c.remove(force=True)
