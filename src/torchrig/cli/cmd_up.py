"""Start an environment on this GPU server: a container of your image with its GPUs leased to you,
JupyterLab and SSH on private ports, your volumes, and limits fit for deep learning.

It prints the Jupyter URL with its token (shown only this once) and the exact ssh command. On a shared
server the GPUs are leased in a ledger (see 'torchrig gpus'): nobody else gets them until you
'torchrig down' the environment, or it dies.

examples:
  torchrig up --image torchrig/env:dev --gpus 1                 # one free GPU, picked for you
  torchrig up --image torchrig/env:dev --gpus 2 --volume ~/data:/home/dev/data --memory 64g --cpus 16
  torchrig up --image torchrig/env:dev --gpus 0,2 --name alice-exp1
  torchrig up --image torchrig/env:dev --gpus MIG-4f5c1d2e-...  # one MIG instance
  torchrig up --spec torchrig.toml --gpus all --dry-run          # print the plan, start nothing
  torchrig up --image torchrig/env:dev --no-jupyter --no-ssh     # just a container, CPU only

defaults (safe and sane):
  ports        bound to 127.0.0.1 (use an SSH tunnel or --public); host ports picked by the engine the
               first time, then kept per environment name across down/up (unless taken meanwhile)
  /dev/shm     half of --memory, else a quarter of host RAM (1 GiB to 64 GiB): DataLoader workers and
               NCCL need more than Docker's 64 MB
  ulimits      memlock=-1, stack=67108864, as NVIDIA runs its deep learning containers
               (https://docs.nvidia.com/deeplearning/frameworks/user-guide/index.html#setincshmem),
               or the most this engine allows (a probe asks it; up says what it took)
  security     no-new-privileges, capabilities dropped to seven, at most 16384 processes
  workspace    the image's workdir (/workspace) is a named volume of its own, kept across down/up of
               the same name (deleted only by 'down --volumes'); -v SRC:/workspace replaces it
  user         your UID/GID, so files written to volumes are yours; as root, a root-owned
               workspace is handed to the environment's user; NAME:/path is a named volume
  ssh key      ~/.ssh/id_ed25519.pub (or id_ecdsa.pub, id_rsa.pub); --ssh-key FILE to choose
  host key     kept per environment name across down/up; known_hosts line recorded for it
  pre-flight   the image's torch/CUDA/arch labels are checked against this host's driver and GPUs; a
               build that cannot run is refused with the reason and the fix

--gpus: all | N (free GPUs, NVLink/NUMA-local) | 0,2 or device=1 (indices) | GPU-UUID,... | MIG-UUID
testing hook: TORCHRIG_GPU_INVENTORY=FILE (or --inventory FILE) uses a recorded NVML snapshot
('torchrig gpus --record FILE') instead of this host's GPUs; TORCHRIG_STATE_DIR moves the ledger;
TORCHRIG_LABELS=KEY=VALUE,... adds labels to every container up makes (accounting, test clean-up).
exit status: 0 started, 1 no free GPU / pre-flight refused / failed to start, 2 bad input (a GPU named
that someone else holds, too) or no engine.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.argtypes import MAX_SECONDS, float_in
from torchrig.errors import UsageError
from torchrig.report import jsonable


def configure(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--image", metavar="REF", help="the image to run (e.g. one 'torchrig image build' made)")
    src.add_argument("--spec", metavar="FILE", help="a torchrig.toml image spec: runs the image it builds")
    parser.add_argument(
        "--gpus", metavar="WHICH", help="all | N | 0,2 | GPU-UUID,... | MIG-UUID (default: none)"
    )
    parser.add_argument(
        "--share", action="store_true", help="share the GPUs with other --share leases, deliberately"
    )
    parser.add_argument(
        "--user", metavar="NAME", help="who owns it and its lease (default: you; another account: root only)"
    )
    parser.add_argument("--name", metavar="NAME", help="the environment's name (default: USER-xxxx)")
    parser.add_argument(
        "--volume",
        "-v",
        metavar="HOST:CONTAINER[:ro]",
        action="append",
        default=[],
        help="mount a host directory (must exist) or a named volume (NAME:/path, made if missing); repeatable",
    )
    parser.add_argument("--memory", metavar="SIZE", help="memory limit, e.g. 64g")
    parser.add_argument("--cpus", metavar="N", help="CPU limit, e.g. 16 or 2.5")
    parser.add_argument("--shm-size", metavar="SIZE", help="size of /dev/shm (default: see above)")
    parser.add_argument(
        "--ulimit",
        metavar="NAME=SOFT[:HARD]",
        action="append",
        default=[],
        help="set a ulimit as asked (repeatable), e.g. memlock=-1 (default: the most the engine allows)",
    )
    parser.add_argument(
        "--pids-limit", metavar="N", type=int, help="most processes+threads in the container (default 16384)"
    )
    parser.add_argument("--no-jupyter", action="store_true", help="do not start JupyterLab")
    parser.add_argument("--no-ssh", action="store_true", help="do not start sshd")
    parser.add_argument(
        "--ssh-key", metavar="FILE", help="the public key to authorise (default: from ~/.ssh)"
    )
    parser.add_argument(
        "--public",
        action="store_true",
        help="publish ports on every interface (Docker's published ports bypass ufw)",
    )
    parser.add_argument("--inventory", metavar="FILE", help="use a recorded GPU inventory (testing hook)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; lease and start nothing")
    parser.add_argument(
        "--create-only",
        action="store_true",
        help="create the container and take its lease, but do not start it",
    )
    parser.add_argument(
        "--wait",
        metavar="SECONDS",
        type=float_in(0, MAX_SECONDS),
        default=120.0,
        help="wait until JupyterLab and sshd answer (default 120; 0: do not wait)",
    )


def _image_ref(args: argparse.Namespace) -> str:
    if args.image:
        return str(args.image)
    if not args.spec:
        raise UsageError(
            "no image given", hint="pass --image REF (see 'docker images') or --spec torchrig.toml"
        )
    from torchrig.image.ref import image_of_spec

    return image_of_spec(Path(args.spec), must_be_built=True)


def request_from(args: argparse.Namespace) -> Any:
    from torchrig.labels import labels_from_env
    from torchrig.runtime.ledger import owner_uid, user_name
    from torchrig.runtime.options import check_name, parse_cpus, parse_ulimit, parse_volume
    from torchrig.runtime.placement import parse_gpus
    from torchrig.runtime.plan import UpRequest
    from torchrig.runtime.up import default_name
    from torchrig.sizes import parse_size

    uid = owner_uid()
    if args.user:
        uid = _uid_for(check_name(args.user), uid)
    user = user_name(uid)
    return UpRequest(
        image=_image_ref(args),
        name=check_name(args.name) if args.name else default_name(user),
        user=user,
        gpus=parse_gpus(args.gpus),
        volumes=tuple(parse_volume(v, Path.cwd()) for v in args.volume),
        memory_bytes=parse_size(args.memory, "--memory") if args.memory else None,
        nano_cpus=parse_cpus(args.cpus, os.cpu_count() or 1) if args.cpus else None,
        shm_size_bytes=parse_size(args.shm_size, "--shm-size") if args.shm_size else None,
        jupyter=not args.no_jupyter,
        ssh=not args.no_ssh,
        public=args.public,
        share=args.share,
        ulimits=tuple(parse_ulimit(u) for u in args.ulimit),
        pids_limit=_pids_limit(args.pids_limit),
        owner_uid=uid,
        extra_labels=labels_from_env(),
    )


def _uid_for(name: str, mine: int) -> int:
    """``--user NAME``: root (an admin) may start an environment for another account; a user only for
    themselves. Ownership is that account's UID."""
    import pwd

    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        raise UsageError(f"--user {name}: no such account on this host", hint="see 'getent passwd'") from None
    if uid != mine and os.getuid() != 0:
        raise UsageError(
            f"--user {name}: only root may start an environment for another user", hint="leave --user out"
        )
    return uid


def _pids_limit(n: int | None) -> int | None:
    if n is not None and n < 64:
        raise UsageError(f"--pids-limit {n} is too small", hint="give at least 64 (default 16384)")
    return n


@dataclass(frozen=True)
class UpReport:
    result: Any  # torchrig.runtime.up.UpResult

    @property
    def exit_code(self) -> int:
        return 0

    def to_json(self) -> dict[str, Any]:
        from torchrig.runtime.preflight import finding_json

        r = self.result
        return {
            "state": r.state,
            "name": r.plan.name,
            "jupyter_url": r.jupyter_url,
            "ssh_command": r.ssh_command,
            "known_hosts_line": r.known_hosts_line,
            "host_ports": r.host_ports,
            "preflight": [finding_json(f) for f in r.preflight],
            "plan": jsonable(r.plan),
            "docker_run": r.plan.docker_run(),
            "workspace": None
            if r.plan.workspace is None
            else {"volume": r.plan.workspace.source, "path": r.plan.workspace.target, "new": r.workspace_new},
        }

    def render_text(self) -> str:
        r = self.result
        p = r.plan
        gpus = ", ".join(u.label for u in p.gpus) or "none"
        lines = []
        if r.state == "planned":
            lines += [
                f"plan for {p.name} (dry run: nothing leased or started)",
                f"  image    {p.image}",
                f"  GPUs     {gpus}",
                f"  shm      {p.shm_size_bytes / 2**30:.1f} GiB",
                "  ulimits  " + ", ".join(f"{u.name}={u.soft}" for u in p.ulimits),
                f"  security {', '.join(p.security_opt)}; capabilities {', '.join(p.cap_add) or 'none'}; "
                f"pids ≤ {p.pids_limit}",
                "  ports    "
                + (
                    ", ".join(
                        f"{x.service} {x.host_ip}:{x.host_port or 'auto'}->{x.container_port}"
                        for x in p.ports
                    )
                    or "none"
                ),
                f"  as       {p.docker_run()}",
            ]
            lines += [f"  then     {step}" for step in p.steps]
            lines += _workspace_lines(r)
        elif r.state == "created":
            lines += [
                f"environment {p.name} created, not started (GPUs {gpus} leased to {p.user})",
                f"  start it  docker start {p.name}",
                f"  remove it torchrig down {p.name}",
            ]
            lines += _workspace_lines(r)
        else:
            lines += [f"environment {p.name} is up: image {p.image}, GPUs {gpus}, leased to {p.user}"]
            if r.jupyter_url:
                lines.append(f"  Jupyter  {r.jupyter_url}")
                lines.append("           (the token is shown only now; keep this URL)")
            if r.ssh_command:
                lines.append(f"  SSH      {r.ssh_command}")
            if r.known_hosts_line:
                lines.append(f"  host key {r.known_hosts_line.split(' ', 1)[1]} (kept for this name)")
            lines += _workspace_lines(r)
            lines.append(f"  stop it  torchrig down {p.name}")
        for f in r.preflight:
            if f.severity.is_problem:  # caveats and failures
                lines.append(f"  note     {f.summary}")
        lines += [f"  note     {n}" for n in p.notes]
        return "\n".join(lines)


def _workspace_lines(r: Any) -> list[str]:
    """Where the work is kept: the volume on the workdir, or the --volume that replaces it."""
    ws = r.plan.workspace
    if ws is None:
        return []
    state = {True: "new", False: "kept from before", None: "made if missing"}[r.workspace_new]
    return [
        f"  workspace {ws.target} is volume {ws.source} ({state}); kept across down/up, "
        f"deleted only by 'torchrig down --volumes {r.plan.name}'"
    ]


def run(args: argparse.Namespace) -> UpReport:
    from torchrig.hostd.client import daemon_socket
    from torchrig.runtime.up import run_up

    if args.wait < 0:
        raise UsageError("--wait must be ≥ 0")
    sock = daemon_socket()
    if sock is not None:
        return _via_daemon(sock, args)
    req = request_from(args)
    result = run_up(
        req,
        inventory_path=args.inventory,
        ssh_key_path=args.ssh_key,
        dry_run=args.dry_run,
        create_only=args.create_only,
        wait_s=args.wait or None,
    )
    return UpReport(result)


def _via_daemon(sock: Any, args: argparse.Namespace) -> UpReport:
    """Through the host daemon: it leases, checks volumes against your own permissions and runs the
    container as you; your SSH public key travels with the request (the daemon cannot read your home)."""
    from torchrig.hostd.client import call
    from torchrig.hostd.wire import from_jsonable
    from torchrig.labels import labels_from_env
    from torchrig.runtime.options import parse_volume
    from torchrig.runtime.up import UpResult, find_ssh_key

    if args.inventory:
        raise UsageError(
            "--inventory: the host daemon uses its own GPU inventory", hint="leave --inventory out"
        )
    volumes = []
    for text in args.volume:
        v = parse_volume(text, Path.cwd())  # your paths, resolved as you; the daemon checks them as you
        volumes.append(f"{v.host_path}:{v.container_path}" + (":ro" if v.read_only else ""))
    request = {
        "image": _image_ref(args),
        "name": args.name,
        "user": args.user,
        "gpus": args.gpus,
        "share": bool(args.share),
        "volumes": volumes,
        "memory": args.memory,
        "cpus": args.cpus,
        "shm_size": args.shm_size,
        "ulimits": list(args.ulimit),
        "pids_limit": args.pids_limit,
        "jupyter": not args.no_jupyter,
        "ssh": not args.no_ssh,
        "ssh_key": find_ssh_key(args.ssh_key) if not args.no_ssh else None,
        "public": bool(args.public),
        "dry_run": bool(args.dry_run),
        "create_only": bool(args.create_only),
        "wait_s": float(args.wait),
        "labels": [list(kv) for kv in labels_from_env()],
    }
    data = call(sock, "up", request)
    return UpReport(_known_host(from_jsonable(UpResult, data["result"])))


def _known_host(r: Any) -> Any:
    """The daemon keeps each environment's host key in its own state and sends the known_hosts line: it
    goes into this user's known_hosts, and the ssh command checks the key there."""
    from dataclasses import replace

    from torchrig.runtime import hostkey

    if not r.known_hosts_line:
        return r
    path = hostkey.record_line(r.known_hosts_line)
    ports = r.host_ports
    if r.ssh_command and "ssh" in ports:
        where = r.ssh_command.rsplit("@", 1)[-1]
        user = r.plan.container_user or "root"
        return replace(r, ssh_command=hostkey.ssh_command(ports["ssh"], r.plan.name, user, where, path))
    return r
