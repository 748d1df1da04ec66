"""What ``torchrig serve`` starts, read from the image (``/etc/torchrig/image.json``), the environment and
mounted secrets. Pure functions of those inputs, so they are tested without a container.

Secrets, first found wins:
- Jupyter token: the file ``$JUPYTER_TOKEN_FILE`` (default ``/run/secrets/jupyter_token``), else
  ``$JUPYTER_TOKEN``, else a generated one (printed in the logs). Never empty.
- SSH keys: the file ``$SSH_AUTHORIZED_KEYS_FILE`` (default ``/run/secrets/authorized_keys``), else
  ``$SSH_AUTHORIZED_KEYS`` (keys, one per line), else ``~/.ssh/authorized_keys`` if mounted there.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig import contract as K
from torchrig.errors import UsageError

_KEY_RE = re.compile(
    r"^(?:[^\s]+\s+)?(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp\d+|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com)\s+[A-Za-z0-9+/=]{40,}(\s.*)?$"
)
# Never copied into SSH sessions: per-login values sshd sets itself, and the services' secrets.
_ENV_SKIP = re.compile(
    r"^(HOME|USER|LOGNAME|SHELL|PWD|OLDPWD|SHLVL|HOSTNAME|TERM|MAIL|_|SSH_.*|JUPYTER_TOKEN.*|"
    r"TORCHRIG_SERVE_.*)$"
)


@dataclass(frozen=True)
class Secret:
    value: str
    source: str  # "file:/run/secrets/jupyter_token" | "env:JUPYTER_TOKEN" | "generated" | ...


@dataclass(frozen=True)
class ServeConfig:
    services: tuple[str, ...]
    user: str
    home: Path
    workdir: str
    jupyter_port: int
    ssh_port: int
    state_dir: Path  # ~/.torchrig: host keys, sshd_config, env.sh, serve.json


def read_image_config(path: str | Path = K.IMAGE_CONFIG) -> dict[str, Any]:
    from torchrig.inputfiles import InputError, read_json

    if not Path(path).exists():
        return {}
    try:
        data = read_json(path, "image config")  # bounded size and depth, UTF-8, no NaN
    except InputError as err:
        raise UsageError(err.message, hint="rebuild the image with torchrig image build") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the image config is not a JSON object", hint="rebuild the image")
    return data


def parse_services(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [n for n in names if n not in K.SERVICES]
    if bad:
        raise UsageError(
            f"unknown service {bad[0]!r}", hint=f"allowed: {', '.join(K.SERVICES)} (comma-separated)"
        )
    return names


def make_config(
    image: Mapping[str, Any], env: Mapping[str, str], home: Path, user: str, services_arg: str | None = None
) -> ServeConfig:
    if services_arg is not None:
        services = parse_services(services_arg)
    elif env.get(K.ENV_SERVICES) is not None:
        services = parse_services(env[K.ENV_SERVICES])
    else:
        services = tuple(_image_field(image, "services", list, list(K.SERVICES)))
        if not all(isinstance(s, str) for s in services):
            raise UsageError(
                "the image config's 'services' must be a list of names", hint="rebuild the image"
            )
    return ServeConfig(
        services=services,
        user=user,
        home=home,
        workdir=_image_field(image, "workdir", str, str(home)),
        jupyter_port=_port(env, image, K.ENV_JUPYTER_PORT, "jupyter_port", K.JUPYTER_PORT),
        ssh_port=_port(env, image, K.ENV_SSH_PORT, "ssh_port", K.SSH_PORT_IMAGE),
        state_dir=home / K.SERVE_STATE_DIR,
    )


def _image_field(image: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    from torchrig.inputfiles import InputError, field

    try:
        return field(dict(image), key, kind, "the image config", default=default)
    except InputError as err:
        raise UsageError(err.message, hint="rebuild the image with torchrig image build") from None


def _port(env: Mapping[str, str], image: Mapping[str, Any], var: str, key: str, default: int) -> int:
    """A TCP port from the environment, else the image config: an integer 1..65535 or a UsageError."""
    value = env.get(var, image.get(key, default))
    where = f"${var}" if var in env else f"the image config's {key}"
    try:
        port = int(str(value).strip())
    except ValueError:
        port = 0
    if isinstance(value, bool) or not 1 <= port <= 65535:
        raise UsageError(f"{where} must be a TCP port (1-65535), got {value!r:.40}")
    return port


def _read_secret_file(path: Path, what: str) -> str | None:
    from torchrig.inputfiles import InputError, read_text

    if not path.exists():
        return None
    try:
        return read_text(path, what, max_bytes=2**20)  # UTF-8 text, bounded
    except InputError as err:
        raise UsageError(err.message, hint="mount it readable by the container's user") from None


def jupyter_token(env: Mapping[str, str]) -> Secret:
    """The token from a mounted file or the environment, else a fresh one; an empty one is refused."""
    path = Path(env.get("JUPYTER_TOKEN_FILE", K.JUPYTER_TOKEN_FILE))
    text = _read_secret_file(path, "Jupyter token")
    if text is not None:
        token = text.strip()
        if not token:
            raise UsageError(
                f"{path}: the Jupyter token file is empty", hint="put a token in it, or do not mount it"
            )
        return Secret(token, f"file:{path}")
    if "JUPYTER_TOKEN" in env:
        if not env["JUPYTER_TOKEN"].strip():
            raise UsageError(
                "JUPYTER_TOKEN is empty: Jupyter without a token is open to anyone who reaches the port",
                hint="unset it to get a generated token, or set a long random one",
            )
        return Secret(env["JUPYTER_TOKEN"].strip(), "env:JUPYTER_TOKEN")
    return Secret(secrets.token_hex(24), "generated")


def authorized_keys(env: Mapping[str, str], home: Path) -> Secret | None:
    """Validated public keys (one per line), or None when none were given."""
    path = Path(env.get("SSH_AUTHORIZED_KEYS_FILE", K.AUTHORIZED_KEYS_FILE))
    candidates = [
        (_read_secret_file(path, "authorized keys"), f"file:{path}"),
        (env.get("SSH_AUTHORIZED_KEYS"), "env:SSH_AUTHORIZED_KEYS"),
        (_read_secret_file(home / ".ssh" / "authorized_keys", "authorized keys"), "~/.ssh/authorized_keys"),
    ]
    for text, source in candidates:
        if text is None or not text.strip():
            continue
        if "PRIVATE KEY" in text:
            raise UsageError(
                f"{source} holds a PRIVATE key",
                hint="give the public key (the .pub file), and rotate that key",
            )
        lines = [
            ln.strip()
            for ln in text.replace("\\n", "\n").splitlines()
            if ln.strip() and not ln.startswith("#")
        ]
        bad = [ln for ln in lines if not _KEY_RE.match(ln)]
        if bad:
            raise UsageError(
                f"{source}: not an OpenSSH public key: {bad[0][:40]!r}",
                hint="one key per line, e.g. 'ssh-ed25519 AAAA... you@host'",
            )
        return Secret("\n".join(lines) + "\n", source)
    return None


def session_env(env: Mapping[str, str]) -> dict[str, str]:
    """The container's environment as SSH sessions should see it (CUDA, NCCL, PATH, venv, ...)."""
    return {
        k: v
        for k, v in sorted(env.items())
        if not _ENV_SKIP.match(k) and "\n" not in v and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
    }
