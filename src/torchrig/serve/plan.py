"""The services as plans: argv, environment and files (sshd_config, env.sh), pure functions of the config.

sshd runs as the container's non-root user with its own config and per-container host keys: public keys
only, no passwords, no root, no PAM (PAM needs root). SSH sessions get the container's environment back
twice over: ``SetEnv`` lines in sshd_config (commands and non-login shells) and ``~/.torchrig/env.sh``,
which ``/etc/profile.d/torchrig.sh`` sources in login shells (Debian's /etc/profile resets PATH).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchrig.contract import SSH_HOST_KEY_NAME
from torchrig.serve.config import ServeConfig

SSHD = "/usr/sbin/sshd"
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")


@dataclass(frozen=True)
class ServicePlan:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # path -> text, written (mode 600) before start
    cwd: str | None = None


def ssh_paths(cfg: ServeConfig) -> dict[str, Path]:
    d = cfg.state_dir / "ssh"
    return {
        "dir": d,
        "host_key": d / SSH_HOST_KEY_NAME,
        "config": d / "sshd_config",
        "authorized_keys": d / "authorized_keys",
        "env": cfg.state_dir / "env.sh",
    }


def _setenv_arg(name: str, value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{name}={escaped}"'


def sshd_config(cfg: ServeConfig, session_env: Mapping[str, str], sftp_server: str | None) -> str:
    p = ssh_paths(cfg)
    lines = [
        "# Written by torchrig serve at container start; sshd runs as the non-root user.",
        f"Port {cfg.ssh_port}",
        f"HostKey {p['host_key']}",
        f"PidFile {p['dir'] / 'sshd.pid'}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitEmptyPasswords no",
        "PermitRootLogin no",
        "UsePAM no",
        f"AllowUsers {cfg.user}",
        f"AuthorizedKeysFile {p['authorized_keys']} .ssh/authorized_keys",
        "X11Forwarding no",
        "PrintMotd no",
        "LogLevel INFO",
    ]
    if sftp_server:
        lines.append(f"Subsystem sftp {sftp_server}")
    if session_env:  # one line: sshd keeps only the first SetEnv directive it reads
        lines.append("SetEnv " + " ".join(_setenv_arg(k, v) for k, v in session_env.items()))
    return "\n".join(lines) + "\n"


def env_sh(session_env: Mapping[str, str]) -> str:
    body = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in session_env.items())
    return "# The container's environment for SSH login shells (written by torchrig serve).\n" + body


def ssh_plan(
    cfg: ServeConfig, keys: str, session_env: Mapping[str, str], sftp_server: str | None
) -> ServicePlan:
    p = ssh_paths(cfg)
    return ServicePlan(
        name="ssh",
        argv=(SSHD, "-D", "-e", "-f", str(p["config"])),
        env={},
        files={
            str(p["config"]): sshd_config(cfg, session_env, sftp_server),
            str(p["authorized_keys"]): keys,
            str(p["env"]): env_sh(session_env),
        },
    )


def jupyter_plan(cfg: ServeConfig, python: str, token: str, base_env: Mapping[str, str]) -> ServicePlan:
    argv = (
        python,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=0.0.0.0",
        f"--port={cfg.jupyter_port}",
        "--port-retries=0",
        f"--ServerApp.root_dir={cfg.workdir}",
        "--ServerApp.password_required=False",
        "--ServerApp.allow_root=False",
    )
    env = dict(base_env)
    env["JUPYTER_TOKEN"] = token  # read by jupyter_server; not on the command line, so not in `ps`
    return ServicePlan(name="jupyter", argv=argv, env=env, cwd=cfg.workdir)
