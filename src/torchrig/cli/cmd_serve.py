"""The image's entrypoint: start JupyterLab and an OpenSSH server as the container's non-root user.

JupyterLab (port 8888) always has a token: read from /run/secrets/jupyter_token (or $JUPYTER_TOKEN_FILE),
else $JUPYTER_TOKEN, else generated and printed in the logs; an empty token is refused. sshd (port 22)
accepts public keys only (no passwords, no root), from /run/secrets/authorized_keys (or
$SSH_AUTHORIZED_KEYS_FILE), $SSH_AUTHORIZED_KEYS, or a mounted ~/.ssh/authorized_keys; without keys it is
not started (a warning says so). SSH sessions see the container's environment (PATH, venv, CUDA_*, NCCL_*,
NVIDIA_*). Signals are forwarded; if a service dies the container exits non-zero; logs go to stdout.

Services: the image's (torchrig.toml [services]), or --services / $TORCHRIG_SERVICES ("jupyter,ssh", "ssh").

examples:
  docker run --gpus all -p 8888:8888 -p 2222:22 -v data:/workspace/data \\
      -v ~/.ssh/id_ed25519.pub:/run/secrets/authorized_keys:ro IMAGE
  docker run -e TORCHRIG_SERVICES=jupyter -v ./token:/run/secrets/jupyter_token:ro -p 8888:8888 IMAGE
  ssh -p 2222 torch@localhost                  # then: python -c "import torch"
  torchrig serve --check                       # the HEALTHCHECK: every started service answers
  torchrig serve --dry-run --json              # the plan: argv and files, secrets redacted
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sys
from pathlib import Path
from typing import Any

from torchrig.contract import IMAGE_CONFIG, SERVE_STATE_FILE
from torchrig.errors import UsageError
from torchrig.report import SimpleReport


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--services", metavar="LIST", help="comma-separated: jupyter,ssh (default: the image's)"
    )
    parser.add_argument(
        "--check", action="store_true", help="health check: probe the running services, exit 0/1"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (argv, files; secrets redacted)"
    )


def _config(args: argparse.Namespace) -> Any:
    from torchrig.serve import config as C

    entry = pwd.getpwuid(os.getuid())
    image = C.read_image_config(os.environ.get("TORCHRIG_IMAGE_CONFIG", IMAGE_CONFIG))
    return C.make_config(image, os.environ, Path(entry.pw_dir), entry.pw_name, args.services)


def _plans(cfg: Any, warn: Any) -> tuple[list[Any], dict[str, str]]:
    from torchrig.serve import config as C
    from torchrig.serve import plan as P

    plans, notes = [], {}
    if "jupyter" in cfg.services:
        token = C.jupyter_token(os.environ)
        notes["jupyter_token_source"] = token.source
        plans.append(P.jupyter_plan(cfg, sys.executable, token.value, os.environ))
        if token.source == "generated":
            notes["jupyter_token"] = token.value
    if "ssh" in cfg.services:
        keys = C.authorized_keys(os.environ, cfg.home)
        if keys is None:
            warn(
                "ssh: no public key given (mount one at /run/secrets/authorized_keys or set SSH_AUTHORIZED_KEYS); "
                "sshd not started"
            )
        elif not Path(P.SSHD).exists():
            raise UsageError(
                f"ssh is enabled but {P.SSHD} is missing", hint="rebuild with [services] ssh = true"
            )
        else:
            notes["ssh_keys_source"] = keys.source
            sftp = next((s for s in P.SFTP_SERVERS if Path(s).exists()), None)
            plans.append(P.ssh_plan(cfg, keys.value, C.session_env(os.environ), sftp))
    return plans, notes


def run(args: argparse.Namespace) -> Any:
    from torchrig.serve import health

    cfg = _config(args)
    if args.check:
        probes = health.check(cfg)
        bad = [p for p in probes if not p.ok]
        text = "\n".join(f"{'ok  ' if p.ok else 'FAIL'} {p.service}: {p.detail}" for p in probes)
        return SimpleReport(data={"healthy": not bad, "probes": probes}, text=text, code=1 if bad else 0)
    if os.getuid() == 0 and not args.dry_run:
        raise UsageError(
            "torchrig serve runs the services as a non-root user, not root",
            hint="run the container without --user root (the image's USER is the spec's user)",
        )
    from torchrig.serve.supervisor import Supervisor, ensure_host_key, hold_serve_lock, log

    if not args.dry_run:
        hold_serve_lock(cfg.state_dir)  # before anything is written: a second serve changes nothing
    plans, notes = _plans(cfg, lambda msg: log("serve", "warning: " + msg))
    if args.dry_run:
        data = {
            "services": [{"name": p.name, "argv": list(p.argv), "files": sorted(p.files)} for p in plans],
            "user": cfg.user,
            "notes": {k: v for k, v in notes.items() if k != "jupyter_token"},
        }
        text = "\n".join(f"{p.name}: {' '.join(p.argv)}" for p in plans) or "no services to start"
        return SimpleReport(data=data, text=text)
    if not plans:
        raise UsageError(
            "no service to start", hint="enable jupyter or give ssh a public key; see torchrig serve --help"
        )
    if any(p.name == "ssh" for p in plans):
        from torchrig.serve.plan import ssh_paths

        ensure_host_key(ssh_paths(cfg)["host_key"])
    if "jupyter_token" in notes:
        log("serve", f"jupyter token (generated): {notes['jupyter_token']}")
    elif "jupyter_token_source" in notes:
        log("serve", f"jupyter token from {notes['jupyter_token_source']}")
    if shutil.which("nvidia-smi") is None and os.environ.get("NVIDIA_VISIBLE_DEVICES"):
        log(
            "serve",
            "note: no NVIDIA driver in the container (run with --gpus all and the NVIDIA Container Toolkit)",
        )
    sup = Supervisor(plans, cfg.state_dir / SERVE_STATE_FILE)
    sup.start()
    code = sup.wait()
    return SimpleReport(data={"exit_code": code}, text="", code=code)
