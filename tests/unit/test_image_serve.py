"""torchrig serve's decisions: secrets, the sshd config, the session environment, the build-stream parser."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from torchrig.errors import UsageError
from torchrig.image.build import BuildFailed, follow
from torchrig.serve import config as C
from torchrig.serve import plan as P

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "image"
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl you@host"


def cfg(tmp_path: Path, services=("jupyter", "ssh")) -> C.ServeConfig:
    return C.make_config({"services": list(services), "workdir": "/workspace"}, {}, tmp_path, "torch")


def test_token_from_file_env_or_generated(tmp_path):
    f = tmp_path / "token"
    f.write_text("s3cret-token\n")
    assert C.jupyter_token({"JUPYTER_TOKEN_FILE": str(f)}) == C.Secret("s3cret-token", f"file:{f}")
    missing = str(tmp_path / "none")
    assert (
        C.jupyter_token({"JUPYTER_TOKEN_FILE": missing, "JUPYTER_TOKEN": "abc"}).source == "env:JUPYTER_TOKEN"
    )
    a, b = C.jupyter_token({"JUPYTER_TOKEN_FILE": missing}), C.jupyter_token({"JUPYTER_TOKEN_FILE": missing})
    assert a.source == "generated" and len(a.value) >= 32 and a.value != b.value


@pytest.mark.parametrize("env", [{"JUPYTER_TOKEN": ""}, {"JUPYTER_TOKEN": "   "}])
def test_empty_token_is_refused(tmp_path, env):
    with pytest.raises(UsageError, match="empty"):
        C.jupyter_token({"JUPYTER_TOKEN_FILE": str(tmp_path / "none"), **env})
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(UsageError, match="token file is empty"):
        C.jupyter_token({"JUPYTER_TOKEN_FILE": str(empty)})


def test_keys_from_file_env_or_home(tmp_path):
    none = {"SSH_AUTHORIZED_KEYS_FILE": str(tmp_path / "none")}
    assert C.authorized_keys(none, tmp_path) is None
    got = C.authorized_keys({**none, "SSH_AUTHORIZED_KEYS": ED25519}, tmp_path)
    assert got is not None and got.value == ED25519 + "\n" and got.source == "env:SSH_AUTHORIZED_KEYS"
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "authorized_keys").write_text(f"# mine\n{ED25519}\n")
    assert C.authorized_keys(none, tmp_path).source == "~/.ssh/authorized_keys"
    f = tmp_path / "ak"
    f.write_text(ED25519)
    assert C.authorized_keys({"SSH_AUTHORIZED_KEYS_FILE": str(f)}, tmp_path).source == f"file:{f}"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----", "PRIVATE key"),
        ("hunter2", "not an OpenSSH public key"),
    ],
)
def test_bad_keys_are_refused(tmp_path, text, fragment):
    with pytest.raises(UsageError, match=fragment):
        C.authorized_keys(
            {"SSH_AUTHORIZED_KEYS_FILE": str(tmp_path / "none"), "SSH_AUTHORIZED_KEYS": text}, tmp_path
        )


def test_session_env_keeps_cuda_nccl_path_and_drops_secrets():
    env = {
        "PATH": "/opt/venv/bin:/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64",
        "JUPYTER_TOKEN": "secret",
        "HOME": "/root",
        "HOSTNAME": "abc",
        "SSH_AUTHORIZED_KEYS": ED25519,
        "MULTI": "a\nb",
    }
    out = C.session_env(env)
    assert set(out) == {
        "PATH",
        "CUDA_VISIBLE_DEVICES",
        "NCCL_DEBUG",
        "NVIDIA_DRIVER_CAPABILITIES",
        "LD_LIBRARY_PATH",
    }


def test_sshd_config_is_key_only_non_root_with_one_setenv(tmp_path):
    c = cfg(tmp_path)
    text = P.sshd_config(c, {"PATH": "/opt/venv/bin:/usr/bin", "NCCL_DEBUG": "INFO", "Q": 'say "hi"'}, None)
    for line in (
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin no",
        "AuthenticationMethods publickey",
        "UsePAM no",
        "AllowUsers torch",
        "PermitEmptyPasswords no",
    ):
        assert line in text.splitlines()
    setenv = [ln for ln in text.splitlines() if ln.startswith("SetEnv")]
    assert setenv == ['SetEnv "PATH=/opt/venv/bin:/usr/bin" "NCCL_DEBUG=INFO" "Q=say \\"hi\\""']


def test_sshd_accepts_the_config(tmp_path):
    """sshd's own parser (-t) accepts what we write, when OpenSSH is installed here."""
    if not Path(P.SSHD).exists():
        pytest.skip("no sshd on this machine")
    if (
        os.getuid() == 0
    ):  # as root, sshd -t insists on its privilege-separation directory (made by its service)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    c = cfg(tmp_path)
    key = P.ssh_paths(c)["host_key"]
    key.parent.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    conf = P.ssh_paths(c)["config"]
    conf.write_text(P.sshd_config(c, {"PATH": "/usr/bin", "X": "a b"}, None))
    proc = subprocess.run([P.SSHD, "-t", "-f", str(conf)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_jupyter_plan_keeps_token_off_the_command_line(tmp_path):
    p = P.jupyter_plan(cfg(tmp_path), "/opt/venv/bin/python", "tok123", {"PATH": "/usr/bin"})
    assert "tok123" not in " ".join(p.argv) and p.env["JUPYTER_TOKEN"] == "tok123"
    assert (
        "--ip=0.0.0.0" in p.argv and "--port=8888" in p.argv and "--ServerApp.root_dir=/workspace" in p.argv
    )


def test_env_sh_quotes_values():
    text = P.env_sh({"A": "x y", "B": "it's"})
    assert "export A='x y'\n" in text and "export B='it'\"'\"'s'\n" in text


def test_services_override_and_bad_names(tmp_path):
    assert C.make_config({}, {"TORCHRIG_SERVICES": "ssh"}, tmp_path, "u").services == ("ssh",)
    assert C.make_config({"services": ["jupyter"]}, {}, tmp_path, "u", "jupyter,ssh").services == (
        "jupyter",
        "ssh",
    )
    with pytest.raises(UsageError, match="unknown service 'sshd'"):
        C.parse_services("jupyter,sshd")


def test_cli_serve_bad_services_exit_2(cli):
    r = cli("serve", "--services", "jupyter,vnc", "--dry-run")
    assert r.code == 2 and r.err.count("\n") == 1 and "unknown service 'vnc'" in r.err


def test_cli_serve_dry_run_redacts_the_token(cli, tmp_path):
    r = cli("serve", "--services", "jupyter", "--dry-run", "--json", env={"JUPYTER_TOKEN": "do-not-print-me"})
    assert r.code == 0 and "do-not-print-me" not in r.out
    doc = r.json()
    assert (
        doc["services"][0]["name"] == "jupyter"
        and doc["notes"]["jupyter_token_source"] == "env:JUPYTER_TOKEN"
    )


def test_cli_health_check_fails_when_serve_is_not_running(cli, tmp_path):
    r = cli("serve", "--check", env={"HOME": str(tmp_path)})
    assert r.code == 1 and "FAIL" in r.out


def test_build_stream_failure_names_the_step_and_keeps_its_log():
    chunks = [
        json.loads(line) for line in (FIX / "build-stream-apt-missing-package.jsonl").read_text().splitlines()
    ]

    class Quiet:
        def step(self, *a): ...
        def log(self, line): ...
        def close(self): ...

    with pytest.raises(BuildFailed) as err:
        follow(chunks, Quiet())
    f = err.value.failure
    assert f.step.startswith("Step 3/26 : RUN") and "apt-get" in f.step
    assert any("Unable to locate package" in line for line in f.log_tail)
    assert "the step exited with status 100" in err.value.one_line() and err.value.exit_code == 1


def test_health_check_and_image_help_stay_light():
    """The HEALTHCHECK runs every 10 s: it must not import docker, torch or rich."""
    import sys as _sys

    for args in (["serve", "--check"], ["image", "--help"], ["init", "--help"]):
        proc = subprocess.run(
            [_sys.executable, "-X", "importtime", "-m", "torchrig", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        mods = {
            line.rsplit("|", 1)[1].strip().split(".")[0]
            for line in proc.stderr.splitlines()
            if line.startswith("import time:") and "|" in line
        }
        assert "torchrig" in mods and not mods & {"torch", "docker", "rich", "numpy", "jupyterlab"}, (
            args,
            mods,
        )


def test_the_ssh_probe_reads_listening_sockets_without_connecting(tmp_path):
    """The health check must not connect to sshd (each connection is two log lines); it reads the kernel's
    socket table. A real listening socket on this machine, then the same port closed."""
    import os
    import socket

    from torchrig.serve.health import listening_ports, probe_ssh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port in listening_ports()
        assert probe_ssh(port, os.getpid()).ok
        assert not probe_ssh(port, 2**22 + 7).ok  # no such process: sshd is gone
    assert port not in listening_ports() and not probe_ssh(port, os.getpid()).ok


def test_a_second_serve_is_refused_and_the_first_ones_state_stays(tmp_path):
    import json
    import subprocess
    import sys

    import pytest

    from torchrig.errors import UsageError
    from torchrig.serve.supervisor import hold_serve_lock

    state = tmp_path / ".torchrig"
    state.mkdir()
    (state / "serve.json").write_text(json.dumps({"services": {"jupyter": 7, "ssh": 8}}))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from torchrig.serve.supervisor import hold_serve_lock; hold_serve_lock(Path(sys.argv[1])); "
         "print('held', flush=True); time.sleep(60)", str(state)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError) as err:
            hold_serve_lock(state)
        assert "already running in this container (jupyter, ssh)" in err.value.one_line()
        assert json.loads((state / "serve.json").read_text())["services"] == {"jupyter": 7, "ssh": 8}
    finally:
        holder.kill()
        holder.wait()
    os_fd = hold_serve_lock(state)  # the holder is gone: the kernel dropped its lock
    assert os_fd >= 0
