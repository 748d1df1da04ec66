"""The contract of a torchrig image: its labels, ports, paths and secrets, in one module every side imports.

Writers and readers of each name:

- **Image labels** (``org.torchrig.*``, written by ``torchrig image build``, :mod:`torchrig.image.render`):
  read by ``up``'s pre-flight (:mod:`torchrig.runtime.preflight`: torch, CUDA, arch list, PTX, driver floor),
  by ``up`` itself (services, user) and by ``image build``'s summary. Shell equivalent:
  ``docker image inspect -f '{{json .Config.Labels}}' IMAGE``.
- **Environment labels** (``torchrig.*``) on the containers and volumes ``up`` makes; ``ps``, ``down``,
  ``gpus`` and the lease ledger read them back (``docker ps --filter label=torchrig.managed=1``).
- **Ports inside the container.** JupyterLab listens on :data:`JUPYTER_PORT`. sshd listens on
  :data:`SSH_PORT_IMAGE` (22) by default: the image's ``EXPOSE`` and ``/etc/torchrig/image.json`` say so, and
  ``docker run -p 2222:22 IMAGE`` works because Docker ≥ 20.10 lets a non-root process bind ports below 1024
  in a container (``net.ipv4.ip_unprivileged_port_start=0``). ``up`` does not rely on that sysctl: it sets
  ``TORCHRIG_SSH_PORT`` to :data:`SSH_PORT_UP` (2222), so sshd, still non-root, binds an unprivileged port
  anywhere. The host ports that ``up`` publishes them on are chosen by the engine (free ports), never these.
- **Secrets** are files under :data:`SECRETS_DIR`, copied in before the container starts (``up``) or mounted
  (``docker run -v KEY.pub:/run/secrets/authorized_keys:ro``); never environment variables or labels, where
  ``docker inspect`` shows them. ``torchrig serve`` (:mod:`torchrig.serve.config`) reads them.
- **Paths inside the image**: the venv, ``/etc/torchrig`` (``image.json``: what ``serve`` starts; the lock's
  constraints), the default workdir, and ``serve``'s state directory in the user's home (host key,
  ``sshd_config``, ``serve.json``: what the ``HEALTHCHECK`` probes). ``up`` copies the environment's kept SSH
  host key to :func:`host_key_path` before the start, where ``serve`` looks for it.

Nothing here imports more than the standard library, so render, pre-flight, serve and the CLI all import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# ---- image labels (org.torchrig.*, OCI annotations): written by image.render, read by up and its pre-flight
IMAGE_LABEL_PREFIX = "org.torchrig."
LABEL_OCI_TITLE = "org.opencontainers.image.title"
LABEL_OCI_BASE_NAME = "org.opencontainers.image.base.name"
LABEL_VERSION = IMAGE_LABEL_PREFIX + "version"  # the torchrig that built the image
LABEL_TORCH = IMAGE_LABEL_PREFIX + "torch"  # "2.8.0+cu128"
LABEL_PYTHON = IMAGE_LABEL_PREFIX + "python"
LABEL_VARIANT = IMAGE_LABEL_PREFIX + "variant"  # "runtime" | "devel"
LABEL_CUDA = IMAGE_LABEL_PREFIX + "cuda"  # "12.8"; "none" for CPU builds; "unknown"
LABEL_ARCH_LIST = IMAGE_LABEL_PREFIX + "arch-list"  # "sm_80 sm_90 ..."
LABEL_PTX = IMAGE_LABEL_PREFIX + "ptx"  # "compute_120 ..."
LABEL_MIN_DRIVER = IMAGE_LABEL_PREFIX + "min-driver"
LABEL_MIN_DRIVER_MINOR_COMPAT = IMAGE_LABEL_PREFIX + "min-driver-minor-compat"
LABEL_CUDNN = IMAGE_LABEL_PREFIX + "cudnn"
LABEL_NCCL = IMAGE_LABEL_PREFIX + "nccl"
LABEL_SERVICES = IMAGE_LABEL_PREFIX + "services"  # "jupyter ssh", "jupyter", "none"
LABEL_USER = IMAGE_LABEL_PREFIX + "user"  # "NAME:UID:GID"
LABEL_BASE_REFERENCE = IMAGE_LABEL_PREFIX + "base.reference"  # the base digest (the build adds it)
LABEL_NONE = "none"  # the build has none (a CPU build, no PTX)
LABEL_UNKNOWN = "unknown"  # built from a wheel the knowledge base does not list

# ---- environment labels (torchrig.*) on what `up` creates: read back by ps, down, gpus and the ledger
ENV_LABEL_PREFIX = "torchrig."
# on the named volume that holds an environment's workdir: the environment's name (its owner: torchrig.uid)
LABEL_WORKSPACE = ENV_LABEL_PREFIX + "workspace"

# ---- services and ports inside the container (torchrig serve listens; up publishes on free host ports)
SERVICES = ("jupyter", "ssh")
JUPYTER_PORT = 8888
SSH_PORT_IMAGE = 22  # sshd's default in the image (EXPOSE, image.json): `docker run -p HOST:22`
SSH_PORT_UP = 2222  # what `up` tells serve (TORCHRIG_SSH_PORT): unprivileged, needs no sysctl
ENV_SERVICES = "TORCHRIG_SERVICES"  # "jupyter,ssh": which services serve starts
ENV_JUPYTER_PORT = "TORCHRIG_JUPYTER_PORT"
ENV_SSH_PORT = "TORCHRIG_SSH_PORT"

# ---- secrets: files, readable by the image's user only
SECRETS_DIR = "/run/secrets"
JUPYTER_TOKEN_FILE = f"{SECRETS_DIR}/jupyter_token"
AUTHORIZED_KEYS_FILE = f"{SECRETS_DIR}/authorized_keys"

# ---- paths inside the image
VENV = "/opt/venv"
IMAGE_ETC = "/etc/torchrig"
IMAGE_CONFIG = f"{IMAGE_ETC}/image.json"  # what serve starts: services, user, workdir, ports, stack
DEFAULT_WORKDIR = "/workspace"
SERVE_STATE_DIR = ".torchrig"  # in the user's home: ssh/, env.sh, serve.json, serve.lock
SERVE_STATE_FILE = "serve.json"  # the services serve started and their ports: what the HEALTHCHECK probes
SSH_HOST_KEY_NAME = "ssh_host_ed25519_key"  # in SERVE_STATE_DIR/ssh/; up copies the kept key there


def host_key_path(home: str) -> str:
    """Where ``serve`` looks for the SSH host key (and ``up`` puts the environment's kept one)."""
    return f"{home.rstrip('/')}/{SERVE_STATE_DIR}/ssh/{SSH_HOST_KEY_NAME}"


@dataclass(frozen=True)
class ImageUser:
    name: str | None
    uid: int | None
    gid: int | None


@dataclass(frozen=True)
class ServeContract:
    """What ``up`` gives ``torchrig serve``: the services (``TORCHRIG_SERVICES``), the ports and the secrets."""

    jupyter_port: int = JUPYTER_PORT
    ssh_port: int = SSH_PORT_UP
    idle_command: tuple[str, ...] = ("sleep", "infinity")  # no service asked for: keep it up for exec

    def secret_files(self, jupyter: bool, ssh: bool) -> tuple[str, ...]:
        return tuple(f for f, on in ((JUPYTER_TOKEN_FILE, jupyter), (AUTHORIZED_KEYS_FILE, ssh)) if on)

    def env(self, *, jupyter: bool, ssh: bool) -> dict[str, str]:
        services = [s for s, on in zip(SERVICES, (jupyter, ssh), strict=True) if on]
        if not services:
            return {}
        return {
            ENV_SERVICES: ",".join(services),
            ENV_JUPYTER_PORT: str(self.jupyter_port),
            ENV_SSH_PORT: str(self.ssh_port),
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
