"""``torchrig up`` as steps: validate → inventory → image → lease → pre-flight → plan → create → start → wait.

Everything after the lease runs under one clean-up guard: any failure (or Ctrl-C) removes the container
and frees the lease, so nothing half-started is left behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from torchrig import userdirs
from torchrig.contract import (
    AUTHORIZED_KEYS_FILE,
    ENV_LABEL_PREFIX,
    JUPYTER_TOKEN_FILE,
    LABEL_SERVICES,
    host_key_path,
)
from torchrig.errors import InputError, JobFailed
from torchrig.findings import Finding
from torchrig.inputfiles import read_text
from torchrig.runtime import hostkey
from torchrig.runtime import ports as kept_ports
from torchrig.runtime.engine import Engine
from torchrig.runtime.inventory import Inventory
from torchrig.runtime.lease import acquire, preview
from torchrig.runtime.ledger import Ledger
from torchrig.runtime.nvml import current
from torchrig.runtime.placement import resolve_named
from torchrig.runtime.plan import (
    LOCALHOST,
    HostFacts,
    UpPlan,
    UpRequest,
    default_ulimits,
    make_plan,
    volume_labels,
)
from torchrig.runtime.preflight import Preflight, preflight

SSH_KEY_NAMES = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")
LABEL_OWNER_UID = f"{ENV_LABEL_PREFIX}uid"


class PreflightRefused(JobFailed):
    """The image's build cannot run on this host's driver or GPUs (exit 1)."""


@dataclass(frozen=True)
class UpResult:
    plan: UpPlan
    state: str  # "planned" | "created" | "running"
    preflight: tuple[Finding, ...]
    jupyter_url: str | None = None
    ssh_command: str | None = None
    host_ports: dict[str, int] = field(default_factory=dict)
    known_hosts_line: str | None = None  # "NAME ssh-ed25519 ..." (also written to the known_hosts file)
    workspace_new: bool | None = None  # the workspace volume was made now (False: kept from before)


def find_ssh_key(explicit: str | None) -> str:
    """The public key to authorise: ``--ssh-key FILE``, else the first of ~/.ssh/id_{ed25519,ecdsa,rsa}.pub."""
    if explicit:
        path = Path(explicit).expanduser()
        candidates = [path]
    else:
        candidates = [Path.home() / ".ssh" / n for n in SSH_KEY_NAMES]
    for p in candidates:
        if p.is_file() or (explicit and os.path.lexists(p)):  # a FIFO or a device given: said, not waited on
            text = read_text(p, "SSH public key", max_bytes=2**20).strip()
            if not text.startswith(("ssh-", "ecdsa-", "sk-")):
                raise InputError(
                    f"{p} is not an SSH public key",
                    hint="pass the .pub file, e.g. --ssh-key ~/.ssh/id_ed25519.pub",
                )
            return text + "\n"
    where = explicit or "~/.ssh (id_ed25519.pub, id_ecdsa.pub, id_rsa.pub)"
    raise InputError(
        f"no SSH public key found in {where}",
        hint="create one with 'ssh-keygen -t ed25519', pass --ssh-key FILE, or use --no-ssh",
    )


def path_owners(req: UpRequest) -> dict[str, tuple[int, int]]:
    """Owner (UID, GID) of each writable host directory the request mounts."""
    out = {}
    for v in req.volumes:
        if v.kind == "bind" and not v.read_only:
            st = os.stat(v.host_path)
            out[v.host_path] = (st.st_uid, st.st_gid)
    return out


def hand_over(root: str, uid: int, gid: int) -> int:
    """``chown`` the root-owned entries under ``root`` (itself included) to ``uid:gid``; how many.

    Symlinks are changed, not followed, and other filesystems mounted below are left alone."""
    device = os.lstat(root).st_dev
    n = 0

    def own(path: str) -> None:
        nonlocal n
        if os.lstat(path).st_uid == 0:
            os.chown(path, uid, gid, follow_symlinks=False)
            n += 1

    own(root)
    for here, dirs, files in os.walk(root):  # symlinked directories are listed in dirs, never entered
        for name in files + dirs:
            own(os.path.join(here, name))
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(here, d)).st_dev == device]
    return n


def host_facts(engine: Engine) -> HostFacts:
    uid: int | None = os.getuid()
    gid: int | None = os.getgid()
    if uid == 0:  # under sudo, the files belong to the invoking user; as plain root keep the image's user
        sudo_uid, sudo_gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
        uid, gid = (int(sudo_uid), int(sudo_gid)) if sudo_uid and sudo_gid else (None, None)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return HostFacts(
        uid=uid, gid=gid, memory_total_bytes=mem, hostname=socket.gethostname(), cdi=engine.cdi_available()
    )


def default_name(user: str) -> str:
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in user).strip("-_.") or "user"
    return f"{safe}-{secrets.token_hex(2)}"


def services_of_image(req: UpRequest, labels: dict[str, str]) -> tuple[UpRequest, list[str]]:
    """Drop the services an image was built without (its ``org.torchrig.services`` label), with a note."""
    raw = labels.get(LABEL_SERVICES)
    if raw is None:
        return req, []
    have = set(raw.split())
    notes = [
        f"the image has no {s} (built without it): not started"
        for s, on in (("jupyter", req.jupyter), ("ssh", req.ssh))
        if on and s not in have
    ]
    return replace(req, jupyter=req.jupyter and "jupyter" in have, ssh=req.ssh and "ssh" in have), notes


def _check(pf: Preflight) -> None:
    bad = pf.failures()
    if bad:
        f = bad[0]
        more = f" (+{len(bad) - 1} more: {', '.join(b.id for b in bad[1:])})" if len(bad) > 1 else ""
        raise PreflightRefused(
            f"pre-flight refused the image: {f.summary}{more}",
            hint=f"fix: {'; '.join(f.fix)}" if f.fix else None,
        )


def _wait_ready(engine: Engine, cid: str, ports: dict[str, int], timeout_s: float) -> None:
    """Until JupyterLab answers /api and sshd sends its banner; a container that exits is a failure."""
    deadline = time.monotonic() + timeout_s
    pending = dict(ports)
    while True:
        _check_running(engine, cid)
        if not pending:
            return
        for service, port in list(pending.items()):
            if _answers(service, port):
                del pending[service]
        if pending and time.monotonic() > deadline:
            raise JobFailed(
                f"{', '.join(pending)} did not answer within {timeout_s:.0f}s",
                hint="raise --wait, or start with --wait 0 and check 'torchrig logs NAME'",
            )
        if pending:
            time.sleep(0.3)


def _check_running(engine: Engine, cid: str) -> None:
    """A container that is not running (its entrypoint exited) is a failed start, with its last log lines."""
    state = engine.inspect(cid)["State"]
    if state["Status"] == "running":
        return
    tail = b"".join(engine.logs(cid, tail=8, follow=False, timestamps=False)).decode(errors="replace")
    last = " | ".join(line for line in tail.strip().splitlines()[-3:]) or "no output"
    raise JobFailed(
        f"the environment exited during start (exit code {state.get('ExitCode')}): {last}",
        hint="check the image's entrypoint ('torchrig serve'); 'docker run IMAGE' shows the same",
    )


def _answers(service: str, port: int) -> bool:
    try:
        if service == "jupyter":
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2) as r:
                return bool(r.status == 200)
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def remap_user(engine: Engine, cid: str, plan: UpPlan) -> None:
    """Give the image's user the host UID/GID inside the created container (see torchrig.runtime.identity)."""
    from torchrig.runtime.identity import RemapConflict, remap_group, remap_passwd

    assert plan.run_as is not None and plan.container_user is not None
    uid, gid = plan.run_as
    try:
        passwd, home = remap_passwd(
            engine.get_file(cid, "/etc/passwd").decode(), plan.container_user, uid, gid
        )
    except RemapConflict as err:
        raise InputError(
            f"cannot run the image's user as your UID {uid}: {err}",
            hint=f"build the image with [user] uid = {uid} gid = {gid}",
        ) from None
    group = remap_group(engine.get_file(cid, "/etc/group").decode(), plan.container_user, plan.image_gid, gid)
    engine.put_files(cid, {"/etc/passwd": passwd.encode(), "/etc/group": group.encode()}, uid=0, mode=0o644)
    engine.own_dirs(cid, [d for d in dict.fromkeys((home, plan.image_workdir)) if d and d != "/"], uid, gid)


def urls(
    plan: UpPlan, host_ports: dict[str, int], host: str, token: str | None, known_hosts: Path | None = None
) -> tuple[str | None, str | None]:
    where = host if any(p.host_ip == "0.0.0.0" for p in plan.ports) else "127.0.0.1"
    jupyter = ssh = None
    if "jupyter" in host_ports:
        jupyter = f"http://{where}:{host_ports['jupyter']}/lab" + (f"?token={token}" if token else "")
    if "ssh" in host_ports:
        ssh = hostkey.ssh_command(
            host_ports["ssh"], plan.name, plan.container_user or "root", where, known_hosts
        )
    return jupyter, ssh


def _home_of(engine: Engine, cid: str, user: str) -> str | None:
    for line in engine.get_file(cid, "/etc/passwd").decode(errors="replace").splitlines():
        f = line.split(":")
        if len(f) >= 7 and f[0] == user:
            return f[5]
    return None


def _provision(
    engine: Engine, cid: str, plan: UpPlan, token: str | None, key: str | None, hk: hostkey.HostKey | None
) -> None:
    """Before start: the secrets into /run/secrets (readable by the image's user only), the UID remap, the
    host key into ~/.torchrig/ssh (where torchrig serve looks), the named volumes' roots to the user."""
    files = {}
    if token:
        files[JUPYTER_TOKEN_FILE] = token.encode()
    if key:
        files[AUTHORIZED_KEYS_FILE] = key.encode()
    owner = plan.container_uid
    if files:
        engine.put_files(cid, files, uid=owner or 0, mode=0o400 if owner is not None else 0o444, parents=True)
    if plan.run_as:
        remap_user(engine, cid, plan)
    gid = plan.run_as[1] if plan.run_as else (plan.image_gid or 0)
    if hk is not None and plan.container_user and owner is not None:
        home = _home_of(engine, cid, plan.container_user)
        if home:
            key_path = host_key_path(home)
            d = str(Path(key_path).parent)
            engine.own_dirs(cid, [str(Path(d).parent), d], owner, gid, mode=0o700)
            engine.put_files(cid, {key_path: hk.private}, uid=owner, gid=gid, mode=0o600)
            engine.put_files(
                cid,
                {f"{key_path}.pub": hk.public.encode() + b"\n"},
                uid=owner,
                gid=gid,
                mode=0o644,
            )
    roots = [m.target for m in plan.mounts if m.type == "volume" and not m.read_only]
    if roots and owner is not None:
        engine.own_dirs(cid, roots, owner, gid)


def _start(engine: Engine, cid: str, plan: UpPlan, wait_s: float | None) -> dict[str, int]:
    """Start, read the host ports the engine picked, and wait until the services answer."""
    engine.start(cid)
    bindings = engine.inspect(cid)["NetworkSettings"]["Ports"] or {}
    ports = {
        p.service: int(bindings[f"{p.container_port}/tcp"][0]["HostPort"])
        for p in plan.ports
        if bindings.get(f"{p.container_port}/tcp")
    }
    if wait_s:
        _wait_ready(engine, cid, ports, wait_s)
    else:
        _check_running(engine, cid)
    missing = [p.service for p in plan.ports if p.service not in ports]
    if missing:
        raise JobFailed(
            f"the engine published no host port for {', '.join(missing)}", hint="see 'docker port NAME'"
        )
    return ports


@dataclass(frozen=True)
class DaemonContext:
    """``up`` run by the host daemon for a caller: their ids and key, the daemon's own ledger."""

    ledger: Ledger
    uid: int
    gid: int
    ssh_key: str | None
    # the owner's folder in the daemon's root-only state: the environments' kept host keys and ports
    owner_state: Path | None = None

    def host_facts(self, engine: Engine) -> HostFacts:
        return replace(host_facts(engine), uid=self.uid, gid=self.gid)


def stable_ports(
    engine: Engine, req: UpRequest, base: Path | None = None
) -> tuple[UpRequest, tuple[str, ...]]:
    """Ask for the host ports this environment name had before, where no one else holds them now."""
    services = tuple(s for s, on in (("jupyter", req.jupyter), ("ssh", req.ssh)) if on)
    recorded = kept_ports.remembered(req.name, base)
    if not recorded or not services:
        return req, ()
    holders = {
        port: f"{r.user}'s environment {r.name}"
        for r in engine.environments()
        if r.alive and r.name != req.name
        for _, port in r.ports.values()
    }
    host_ip = "0.0.0.0" if req.public else LOCALHOST
    free = {p for p in recorded.values() if kept_ports.can_bind(host_ip, p)}
    choice = kept_ports.choose(req.name, recorded, services, holders, free)
    return replace(req, host_ports=tuple(choice.ask.items())), choice.notes


def make_volumes(engine: Engine, req: UpRequest, plan: UpPlan) -> bool | None:
    """Create the plan's named volumes that are missing; whether the workspace volume was made now (None:
    the plan has none). Another owner's workspace volume is refused, never mounted."""
    new = None
    for m in plan.mounts:
        if m.type != "volume":
            continue
        is_ws = plan.workspace is not None and m.source == plan.workspace.source
        if is_ws:
            have = engine.volume_labels(m.source)
            owner = have.get(LABEL_OWNER_UID) if have is not None else None
            if have is not None and req.owner_uid is not None and owner not in (None, str(req.owner_uid)):
                raise InputError(
                    f"volume {m.source!r} (the workspace of {plan.name!r}) belongs to UID {owner}, not you",
                    hint="pick another --name, or mount your own with -v NAME:" + m.target,
                )
        made = engine.ensure_volume(m.source, volume_labels(req, workspace=is_ws))
        if is_ws:
            new = made
    return new


def run_up(
    req: UpRequest,
    *,
    inventory_path: str | None,
    ssh_key_path: str | None,
    dry_run: bool,
    create_only: bool,
    wait_s: float | None,
    daemon: DaemonContext | None = None,
) -> UpResult:
    key = (daemon.ssh_key if daemon else find_ssh_key(ssh_key_path)) if req.ssh else None
    inv = current(inventory_path) if req.gpus.wants_gpus else Inventory("not needed", None, None, ())
    if req.gpus.wants_gpus and req.gpus.kind != "count":
        resolve_named(req.gpus, inv)  # unknown indices/UUIDs fail before the engine is asked
    engine = Engine.connect()
    image = engine.image(req.image)
    req, service_notes = services_of_image(req, image.labels)
    overridden = {n for n, _, _ in req.ulimits}
    wanted = tuple(u for u in default_ulimits() if u.name not in overridden)
    host = replace(
        daemon.host_facts(engine) if daemon else host_facts(engine),
        ulimit_max=engine.ulimit_max(image.id, wanted, dict(req.extra_labels)),
        path_owners=path_owners(req),
    )
    from torchrig.compat.kb import load_kb  # called only when pre-flight needs the facts

    ledger = daemon.ledger if daemon else Ledger.open()
    req, port_notes = stable_ports(engine, req, daemon.owner_state if daemon else None)
    service_notes += port_notes
    if dry_run:  # the same choice a real up makes, recording nothing
        live, listed_at = engine.live_names()
        units = preview(ledger, inv, req.gpus, share=req.share, live=live, listed_at_s=listed_at)
        pf = preflight(image.labels, inv, units, load_kb)
        plan = make_plan(req, image, host, units)
        return UpResult(replace(plan, notes=plan.notes + tuple(service_notes)), "planned", pf.findings)
    if engine.exists(req.name):
        raise InputError(
            f"a container named {req.name!r} already exists",
            hint="pick another --name, or 'torchrig down' it",
        )
    live, listed_at = engine.live_names()
    units = acquire(
        ledger,
        inv,
        req.gpus,
        user=req.user,
        container=req.name,
        share=req.share,
        live=live,
        listed_at_s=listed_at,
    )
    cid = None
    made: list[str] = []  # a workspace volume made by this up: removed with it when the up fails (empty)
    try:
        pf = preflight(image.labels, inv, units, load_kb)
        _check(pf)
        plan = make_plan(req, image, host, units)
        plan = replace(plan, notes=plan.notes + tuple(service_notes))
        workspace_new = make_volumes(engine, req, plan)
        if workspace_new and plan.workspace is not None:
            made.append(plan.workspace.source)
        cid = engine.create(plan)
        ledger.bind(plan.name, cid)
        for path in plan.handover:
            if plan.container_uid is not None:
                hand_over(path, plan.container_uid, plan.run_as[1] if plan.run_as else (plan.image_gid or 0))
        token = secrets.token_hex(24) if req.jupyter else None
        keys = daemon.owner_state if daemon else userdirs.state_dir()
        hk = hostkey.ensure(plan.name, base=keys) if req.ssh and keys is not None else None
        if req.ssh and hk is None:
            note = (
                "no ssh-keygen where the host daemon runs: the environment makes a new host key at every start"
                if daemon
                else "no ssh-keygen on this host: the environment makes a new host key at every start"
            )
            plan = replace(plan, notes=(*plan.notes, note))
        _provision(engine, cid, plan, token, key if req.ssh else None, hk)
        # through the daemon the key is kept in root's state: the caller records the line in their own
        # known_hosts ('torchrig up' does), since the daemon writes nothing into a user's folders
        line = (hk.known_hosts_line(plan.name) if daemon else hostkey.record(hk, plan.name)) if hk else None
        if create_only:
            return UpResult(plan, "created", pf.findings, known_hosts_line=line, workspace_new=workspace_new)
        ports = _start(engine, cid, plan, wait_s)
        kept_ports.remember(plan.name, ports, daemon.owner_state if daemon else None)
        jupyter, ssh = urls(
            plan, ports, host.hostname, token, hk.known_hosts_file if hk and not daemon else None
        )
        return UpResult(plan, "running", pf.findings, jupyter, ssh, ports, line, workspace_new)
    except BaseException:
        if cid is not None:
            engine.remove(cid, stop_timeout_s=2)
        else:  # interrupted inside the create call: the engine may have made it without telling us
            engine.remove_own(req.name, req.extra_labels, owner_uid=req.owner_uid)
        ledger.release(req.name)
        for v in made:
            with contextlib.suppress(Exception):
                engine.remove_volume(v)
        raise
