"""Run the planned services: logs to stdout with a ``[name]`` prefix, SIGTERM/SIGINT/SIGHUP forwarded, and if
one service dies the others are stopped and serve exits non-zero (so the container exits and restarts)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from torchrig.contract import SERVE_STATE_FILE
from torchrig.errors import InputError
from torchrig.inputfiles import read_json
from torchrig.serve.plan import ServicePlan

STOP_GRACE_S = 10.0


def log(name: str, line: str) -> None:
    sys.stdout.write(f"[{name}] {line}\n")
    sys.stdout.flush()


def write_files(plan: ServicePlan) -> None:
    for path, text in plan.files.items():
        p = Path(path)
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(p, 0o600)


def ensure_host_key(path: Path) -> None:
    """A per-container ed25519 host key (never baked into the image)."""
    if path.exists():
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "torchrig-serve", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def hold_serve_lock(state_dir: Path) -> int:
    """Take ``~/.torchrig/serve.lock`` for this serve's lifetime (the kernel drops it when the process
    ends); a second ``torchrig serve`` in the same container is refused before it touches anything, so
    the first one's state (what the health check probes) stays as it is."""
    import fcntl

    from torchrig.errors import UsageError

    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(state_dir / "serve.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        try:
            running = read_json(state_dir / SERVE_STATE_FILE, "serve state file", max_bytes=2**20)
            what = ", ".join(running.get("services", {})) or "no services"
        except (InputError, AttributeError, TypeError):
            what = "its services"
        raise UsageError(
            f"torchrig serve is already running in this container ({what})",
            hint="use the running services; to change them, restart the container with TORCHRIG_SERVICES",
        ) from None
    os.set_inheritable(fd, False)
    return fd


def _pump(name: str, stream: object) -> None:
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        log(name, raw.decode("utf-8", "replace").rstrip("\n"))


class Supervisor:
    def __init__(self, plans: Sequence[ServicePlan], state_file: Path) -> None:
        self.plans = list(plans)
        self.state_file = state_file
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping: int | None = None  # the signal that asked us to stop

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.stopping is None:
            log("serve", f"received {signal.Signals(signum).name}; stopping services")
        self.stopping = signum
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def start(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        for plan in self.plans:
            write_files(plan)
            proc = subprocess.Popen(
                list(plan.argv),
                env=plan.env or None,
                cwd=plan.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            self.procs[plan.name] = proc
            threading.Thread(target=_pump, args=(plan.name, proc.stdout), daemon=True).start()
            log("serve", f"started {plan.name} (pid {proc.pid})")
        self.state_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.state_file.write_text(
            json.dumps(
                {"services": {n: p.pid for n, p in self.procs.items()}, "started_unix_s": int(time.time())}
            )
            + "\n",
            encoding="utf-8",
        )

    def wait(self) -> int:
        """Block until a service exits or a signal stops us; the exit status for the container."""
        failed: tuple[str, int] | None = None
        while self.stopping is None:
            for name, proc in self.procs.items():
                code = proc.poll()
                if code is not None:
                    failed = (name, code)
                    break
            if failed:
                break
            time.sleep(0.2)
        if failed:
            log("serve", f"{failed[0]} exited with status {failed[1]}; stopping the others")
            self._stop_all(signal.SIGTERM)
            code = failed[1]
            return 128 - code if code < 0 else (code or 1)  # killed by signal N -> 128+N, like a shell
        self._stop_all(self.stopping or signal.SIGTERM)
        log("serve", "all services stopped")
        return 0

    def _stop_all(self, signum: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)
        deadline = time.monotonic() + STOP_GRACE_S
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log("serve", f"{name} did not stop in {STOP_GRACE_S:.0f} s; killing it")
                proc.kill()
                proc.wait()
