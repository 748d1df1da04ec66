"""What ``torchrig serve`` (the image's entrypoint, ``torchrig.serve``) expects from the container it runs in.

Kept in one place so that ``up`` and the image agree: the services to start (``TORCHRIG_SERVICES``), the
ports (``TORCHRIG_JUPYTER_PORT``, ``TORCHRIG_SSH_PORT``: sshd runs as the non-root user, so not 22), and the
secrets serve reads from ``/run/secrets`` — the Jupyter token and the authorized SSH keys are copied there
before the container starts, never put in its environment or labels, where ``docker inspect`` shows them.
The image records its user as the label ``org.torchrig.user`` = ``NAME:UID:GID``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

LABEL_USER = "org.torchrig.user"
LABEL_SERVICES = "org.torchrig.services"  # "jupyter ssh", "jupyter", "none"


@dataclass(frozen=True)
class ImageUser:
    name: str | None
    uid: int | None
    gid: int | None


@dataclass(frozen=True)
class ServeContract:
    jupyter_port: int = 8888
    ssh_port: int = 2222
    secrets_dir: str = "/run/secrets"
    token_file: str = "jupyter_token"
    authorized_keys_file: str = "authorized_keys"
    idle_command: tuple[str, ...] = (
        "sleep",
        "infinity",
    )  # no service asked for: keep the container up for exec

    def secret_files(self, jupyter: bool, ssh: bool) -> tuple[str, ...]:
        return tuple(
            f"{self.secrets_dir}/{f}"
            for f, on in ((self.token_file, jupyter), (self.authorized_keys_file, ssh))
            if on
        )

    def env(self, *, jupyter: bool, ssh: bool) -> dict[str, str]:
        services = [s for s, on in (("jupyter", jupyter), ("ssh", ssh)) if on]
        if not services:
            return {}
        return {
            "TORCHRIG_SERVICES": ",".join(services),
            "TORCHRIG_JUPYTER_PORT": str(self.jupyter_port),
            "TORCHRIG_SSH_PORT": str(self.ssh_port),
        }

    def command(self, *, jupyter: bool, ssh: bool) -> tuple[str, ...] | None:
        """None: the image's own CMD (``torchrig serve``)."""
        return None if (jupyter or ssh) else self.idle_command


def image_user(labels: Mapping[str, str], config_user: str | None) -> ImageUser:
    """The image's user from its ``org.torchrig.user`` label, else its ``USER`` (``NAME`` or ``UID[:GID]``)."""
    raw = labels.get(LABEL_USER)
    if raw and raw.count(":") == 2:
        name, uid, gid = raw.split(":")
        if uid.isdigit() and gid.isdigit():
            return ImageUser(name or None, int(uid), int(gid))
    if config_user:
        head, _, tail = config_user.partition(":")
        if head.isdigit():
            return ImageUser(None, int(head), int(tail) if tail.isdigit() else None)
        return ImageUser(head, None, None)
    return ImageUser(None, None, None)


SERVE = ServeContract()
