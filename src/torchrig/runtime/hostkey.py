"""Each environment's SSH host key, kept across ``down``/``up`` of the same name, and its known_hosts line.

A container's sshd would otherwise make a new host key at every start, and the user's ssh client would
rightly refuse the next environment of the same name ("REMOTE HOST IDENTIFICATION HAS CHANGED"). So ``up``
keeps one ed25519 key per environment name in the user's own state directory (``hostkeys/NAME/`` in
``torchrig.userdirs.state_dir()``, ``~/.local/state/torchrig`` by default; directory 0700, key 0600), copies
it into the container before it starts (where ``torchrig serve`` looks: ``~/.torchrig/ssh/``), and records
``NAME ssh-ed25519 …`` in ``…/torchrig/known_hosts``. The printed ssh command names both
(``-o HostKeyAlias=NAME -o UserKnownHostsFile=…``), so strict host-key checking works from the first login.
Shell equivalent: ``ssh-keygen -t ed25519 -N '' -f KEY``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from torchrig import userdirs
from torchrig.contract import SSH_HOST_KEY_NAME
from torchrig.errors import InputError
from torchrig.inputfiles import read_bytes, read_text

_MAX_KEY_BYTES = 64 * 1024


@dataclass(frozen=True)
class HostKey:
    private: bytes
    public: str  # "ssh-ed25519 AAAA... comment"
    known_hosts_file: Path

    def known_hosts_line(self, alias: str) -> str:
        kind, blob = self.public.split()[:2]
        return f"{alias} {kind} {blob}"


def ensure(name: str, base: Path | None = None) -> HostKey | None:
    """The environment's host key, made on first use; None when this host has no ``ssh-keygen``."""
    root = base or userdirs.state_dir()  # the user's own, never the shared ledger's: private keys
    d = root / "hostkeys" / name
    key = d / SSH_HOST_KEY_NAME  # the same file name as in the container
    if not key.exists():
        keygen = shutil.which("ssh-keygen")
        if keygen is None:
            return None
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        proc = subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"torchrig-{name}", "-f", str(key)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if proc.returncode != 0:
            raise InputError(
                f"ssh-keygen could not make a host key in {d}: {proc.stderr.strip() or proc.returncode}",
                hint=f"check that {root} is yours and writable",
            )
    try:  # an ed25519 key is ~400 bytes, its public half ~100
        private = read_bytes(key, "host key", max_bytes=_MAX_KEY_BYTES, follow=False)
        public = read_text(
            Path(str(key) + ".pub"), "host key", max_bytes=_MAX_KEY_BYTES, follow=False
        ).strip()
    except InputError as err:
        raise InputError(err.message, hint=f"remove {d} to make a new one") from None
    if len(public.split()) < 2:
        raise InputError(f"the host key {str(key) + '.pub'!r} is not an SSH public key", hint=f"remove {d}")
    return HostKey(private, public, known_hosts_file(root))


def known_hosts_file(base: Path | None = None) -> Path:
    """The known_hosts file :func:`record` writes (this user's)."""
    return (base or userdirs.state_dir()) / "known_hosts"


def ssh_command(port: int, alias: str, user: str, host: str, known_hosts: Path | None) -> str:
    """The ssh command line for an environment, one for ``up`` and the dashboard alike: the kept host key
    is checked under ``alias`` in ``known_hosts`` (strict checking works from the first login)."""
    import shlex

    argv = ["ssh", "-p", str(port), "-o", f"HostKeyAlias={alias}"]
    if known_hosts is not None:
        argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
    return shlex.join([*argv, f"{user}@{host}"])


def record(hk: HostKey, alias: str) -> str:
    """Put ``alias``'s line into the known_hosts file (replacing an older one); the line."""
    line = hk.known_hosts_line(alias)
    _replace_line(hk.known_hosts_file, alias, line)
    return line


def record_line(line: str, base: Path | None = None) -> Path:
    """Put a known_hosts ``line`` (``ALIAS ssh-ed25519 AAAA…``, as the host daemon sends it) into this
    user's known_hosts file, replacing the alias's older line; the file. A line that is not one is refused."""
    parts = line.split()
    if len(parts) != 3 or not parts[1].startswith("ssh-") or any(c in line for c in "\n\r"):
        raise InputError(f"not a known_hosts line: {line!r:.80}")
    path = known_hosts_file(base)
    _replace_line(path, parts[0], line)
    return path


def _replace_line(path: Path, alias: str, line: str) -> None:
    old = read_text(path, "known_hosts file", follow=False).splitlines() if os.path.lexists(path) else []
    kept = [x for x in old if x.split(" ", 1)[0] != alias]
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{x}\n" for x in [*kept, line]))
    os.replace(tmp, path)
