"""What ``torchrig serve`` (the image's entrypoint) expects from the container it runs in.

Kept in one place so that ``up`` and the image agree: the ports it listens on, where it reads the Jupyter
token and the authorized SSH keys (files in a read-only secrets mount, never in the container's
environment or labels, where ``docker inspect`` would show them), and the host UID/GID to take on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeContract:
    jupyter_port: int = 8888
    ssh_port: int = 2222
    secrets_dir: str = "/run/torchrig"
    token_file: str = "jupyter_token"
    authorized_keys_file: str = "authorized_keys"

    def secret_files(self, jupyter: bool, ssh: bool) -> tuple[str, ...]:
        return tuple(f"{self.secrets_dir}/{f}" for f, on in ((self.token_file, jupyter), (self.authorized_keys_file, ssh)) if on)

    def env(self, *, jupyter: bool, ssh: bool, uid: int | None, gid: int | None) -> dict[str, str]:
        env = {
            "TORCHRIG_JUPYTER": "1" if jupyter else "0",
            "TORCHRIG_SSH": "1" if ssh else "0",
        }
        if jupyter:
            env["TORCHRIG_JUPYTER_TOKEN_FILE"] = f"{self.secrets_dir}/{self.token_file}"
        if ssh:
            env["TORCHRIG_SSH_AUTHORIZED_KEYS_FILE"] = f"{self.secrets_dir}/{self.authorized_keys_file}"
        if uid is not None and gid is not None:
            env["TORCHRIG_UID"] = str(uid)
            env["TORCHRIG_GID"] = str(gid)
        return env


SERVE = ServeContract()
