"""The systemd unit that runs the host daemon as root, and ``torchrig host install`` which writes it.

The unit keeps the daemon's state in a root-only folder (``StateDirectory=``, mode 0700) and its socket in
``/run/torchrig`` (``RuntimeDirectory=``, 0755; the socket itself is 0666: the kernel says who asks). It
starts after dockerd and restarts on failure. Shell equivalent of the install:
``torchrig host install --dry-run > /etc/systemd/system/torchrig-host.service && systemctl daemon-reload
&& systemctl enable --now torchrig-host``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from torchrig.errors import EngineUnavailable, UsageError

UNIT_NAME = "torchrig-host.service"
UNIT_DIR = Path("/etc/systemd/system")


@dataclass(frozen=True)
class UnitPlan:
    path: Path
    text: str
    commands: tuple[tuple[str, ...], ...]  # run after writing the file, in order


def render_unit(python: str, socket_path: Path, state_dir: Path, admin_group: str) -> str:
    """The unit file's text (``python``: an absolute interpreter that can import torchrig)."""
    if not Path(python).is_absolute():
        raise UsageError(f"the interpreter {python!r} must be an absolute path")
    if socket_path.parent != Path("/run/torchrig") or state_dir.parent != Path("/var/lib"):
        raise UsageError(
            "the systemd unit keeps its socket in /run/torchrig and its state in /var/lib/NAME",
            hint="give --socket /run/torchrig/FILE and --state-dir /var/lib/NAME (or run 'host serve' yourself)",
        )
    argv = [python, "-m", "torchrig", "host", "serve", "--socket", str(socket_path),
            "--state-dir", str(state_dir), "--admin-group", admin_group]  # fmt: skip
    # systemd's ExecStart= is not a shell: quote each word as systemd reads it (no $, no %)
    for word in argv:
        if any(c in word for c in "$%\\\"'\n ;"):
            raise UsageError(f"{word!r} cannot be written into a unit file", hint="use a plain path or name")
    return "\n".join(
        [
            "[Unit]",
            "Description=torchrig host daemon: GPU leases and environments for the users of this server",
            "After=docker.service",
            "Requires=docker.service",
            "",
            "[Service]",
            "Type=simple",
            f"ExecStart={shlex.join(argv)}",
            "Restart=on-failure",
            "RestartSec=2",
            "# the socket's folder (0755); the socket is 0666 and the daemon asks the kernel who connects",
            "RuntimeDirectory=torchrig",
            "RuntimeDirectoryMode=0755",
            "# the ledger and the audit log: root only",
            f"StateDirectory={state_dir.name}",
            "StateDirectoryMode=0700",
            "UMask=0077",
            "# /usr and /etc read-only for the daemon; no ProtectHome: it checks access to users' folders",
            "ProtectSystem=full",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def plan_install(socket_path: Path, state_dir: Path, admin_group: str, unit_dir: Path = UNIT_DIR) -> UnitPlan:
    text = render_unit(sys.executable, socket_path, state_dir, admin_group)
    return UnitPlan(
        unit_dir / UNIT_NAME,
        text,
        (("systemctl", "daemon-reload"), ("systemctl", "enable", "--now", UNIT_NAME)),
    )


def install(plan: UnitPlan, *, enable: bool) -> list[str]:
    """Write the unit (0644, replacing an older one atomically) and enable it; the steps done."""
    import os

    if os.geteuid() != 0:
        raise UsageError("installing the host daemon is root's", hint="sudo torchrig host install")
    tmp = plan.path.with_name(f".{plan.path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(plan.text)
    os.replace(tmp, plan.path)
    done = [f"wrote {plan.path}"]
    for argv in plan.commands if enable else ():
        try:
            r = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise EngineUnavailable(
                f"{shlex.join(argv)} failed: {err}", hint="is this host run by systemd?"
            ) from None
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise EngineUnavailable(
                f"{shlex.join(argv)} failed: {last}", hint="see 'journalctl -u torchrig-host'"
            )
        done.append(f"ran {shlex.join(argv)}")
    return done
