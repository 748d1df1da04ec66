"""The plan for one environment: everything ``torchrig up`` will ask the engine for, as one frozen record.

:func:`make_plan` is a pure function of the user's request, the image's facts, the host's facts and the
leased GPUs; ``torchrig up --dry-run`` prints the plan and :mod:`torchrig.runtime.engine` executes it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace

from torchrig.contract import (
    DEFAULT_WORKDIR,
    ENV_LABEL_PREFIX,
    LABEL_WORKSPACE,
    SERVE,
    ImageUser,
    ServeContract,
    image_user,
)
from torchrig.data import load
from torchrig.runtime.inventory import Unit
from torchrig.runtime.options import Volume
from torchrig.runtime.placement import GpuRequest

LOCALHOST = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"


@dataclass(frozen=True)
class UpRequest:
    image: str
    name: str
    user: str
    gpus: GpuRequest
    volumes: tuple[Volume, ...] = ()
    memory_bytes: int | None = None
    nano_cpus: int | None = None
    shm_size_bytes: int | None = None
    jupyter: bool = True
    ssh: bool = True
    public: bool = False
    share: bool = False
    ulimits: tuple[tuple[str, int, int], ...] = ()  # overrides of the defaults: (name, soft, hard)
    pids_limit: int | None = None  # None: the default (container_defaults.toml)
    owner_uid: int | None = None  # the real UID that owns the environment (ledger.owner_uid)
    extra_labels: tuple[tuple[str, str], ...] = ()  # $TORCHRIG_LABELS: on every container torchrig makes
    workspace: bool = True  # a named volume of its own on the image's workdir, unless a --volume is there
    host_ports: tuple[tuple[str, int], ...] = ()  # (service, host port) to ask for; others: the engine picks


@dataclass(frozen=True)
class ImageFacts:
    ref: str
    id: str
    labels: dict[str, str]
    user: str | None  # the image's USER (the account JupyterLab and sshd serve)
    workdir: str | None = None  # the image's WORKDIR


@dataclass(frozen=True)
class HostFacts:
    uid: int | None  # the invoking user's; None when that is root (the image's own user is kept)
    gid: int | None
    memory_total_bytes: int
    hostname: str
    cdi: bool  # the engine and host have CDI specs for nvidia.com/gpu
    # The most each ulimit may be in a container of this engine (-1: unlimited), read by a probe container
    # (Engine.ulimit_max); {} when the defaults fit, None when the probe could not tell.
    ulimit_max: dict[str, int] | None = field(default_factory=dict)
    path_owners: dict[str, tuple[int, int]] = field(default_factory=dict)  # bind sources -> (uid, gid)


@dataclass(frozen=True)
class DeviceRequest:
    driver: str  # "nvidia" (the NVIDIA Container Toolkit hook) or "cdi"
    device_ids: tuple[str, ...]
    capabilities: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Port:
    service: str  # "jupyter" | "ssh"
    container_port: int
    host_ip: str
    host_port: int | None  # None: the engine picks a free one at start


@dataclass(frozen=True)
class Mount:
    source: str  # a host path (bind) or a volume name (volume)
    target: str
    read_only: bool
    purpose: str  # "volume"
    type: str = "bind"  # "bind" | "volume" (a Docker named volume)


@dataclass(frozen=True)
class Ulimit:
    name: str
    soft: int
    hard: int


@dataclass(frozen=True)
class UpPlan:
    name: str
    image: str
    image_id: str
    user: str
    gpus: tuple[Unit, ...]
    share: bool
    device_requests: tuple[DeviceRequest, ...]
    ports: tuple[Port, ...]
    mounts: tuple[Mount, ...]
    env: dict[str, str]
    ulimits: tuple[Ulimit, ...]
    shm_size_bytes: int
    memory_bytes: int | None
    nano_cpus: int | None
    labels: dict[str, str]
    secret_files: tuple[str, ...]  # copied into the container before it starts (contents never in the plan)
    container_user: str | None  # the image's user name (ssh logs in as it)
    container_uid: int | None
    run_as: tuple[int, int] | None  # the host UID:GID the image's user is remapped to (None: the image's own)
    image_workdir: str | None
    image_gid: int | None  # the image user's own GID (its group moves with it)
    command: tuple[str, ...] | None  # None: the image's CMD (torchrig serve)
    security_opt: tuple[str, ...] = ()
    cap_drop: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    pids_limit: int | None = None
    handover: tuple[str, ...] = ()  # host directories whose root-owned files go to the container's user
    workspace: Mount | None = None  # the environment's own named volume on its workdir (None: a --volume is)
    steps: tuple[str, ...] = ()  # what up does besides creating the container, in order
    notes: tuple[str, ...] = field(default=())

    def docker_run(self) -> str:
        """The ``docker run`` command line that asks the engine for exactly what ``up`` creates.

        Flag for flag the same settings as :meth:`torchrig.runtime.engine.Engine.create_kwargs` (a test
        creates a container from this line and compares the engine's inspection with ``up``'s). What ``up``
        does besides (secrets copied in, the user's UID remapped, the host key) is listed in ``steps``."""
        argv = ["docker", "run", "-d", "--name", self.name, "--hostname", self.name]
        argv.append(f"--shm-size={self.shm_size_bytes}")
        for u in self.ulimits:
            argv.append(
                f"--ulimit={u.name}={u.soft}" if u.soft == u.hard else f"--ulimit={u.name}={u.soft}:{u.hard}"
            )
        if self.memory_bytes:
            argv.append(f"--memory={self.memory_bytes}")
        if self.nano_cpus:
            argv.append(f"--cpus={self.nano_cpus / 1e9:g}")
        for d in self.device_requests:
            argv += (
                [f"--device={i}" for i in d.device_ids]
                if d.driver == "cdi"
                else ["--gpus", f'"device={",".join(d.device_ids)}"']
            )
        argv += [f"--security-opt={o}" for o in self.security_opt]
        argv += [f"--cap-drop={c}" for c in self.cap_drop]
        argv += [f"--cap-add={c}" for c in self.cap_add]
        if self.pids_limit:
            argv.append(f"--pids-limit={self.pids_limit}")
        if self.run_as:
            argv.append(f"--user={self.run_as[0]}:{self.run_as[1]}")
        argv += [f"--publish={p.host_ip}:{p.host_port or ''}:{p.container_port}" for p in self.ports]
        for m in self.mounts:
            argv.append(
                f"--mount=type={m.type},source={m.source},target={m.target}"
                + (",readonly" if m.read_only else "")
            )
        argv += [f"--env={k}={v}" for k, v in self.env.items()]
        argv += [f"--label={k}={v}" for k, v in self.labels.items()]
        argv.append(self.image_id)
        return shlex.join(argv + list(self.command or ()))


def default_ulimits() -> tuple[Ulimit, ...]:
    return tuple(
        Ulimit(r["name"], int(r["soft"]), int(r["hard"])) for r in load("container_defaults")["ulimit"]
    )


def _size(n: int) -> str:
    return "unlimited" if n == -1 else f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"


def fit_ulimits(
    wanted: tuple[Ulimit, ...], engine_max: dict[str, int] | None
) -> tuple[tuple[Ulimit, ...], list[str]]:
    """Each default ulimit, lowered to the most this engine allows, with a note for each lowered one.

    dockerd (through containerd and runc) can only raise a container's limit above its own with
    CAP_SYS_RESOURCE; a stock engine may then refuse memlock=-1 at start. Asking for what it can give
    beats failing: the note says what was taken and how an admin lets the engine give more."""
    out, notes = [], []
    if engine_max is None:
        notes.append("could not read this engine's ulimits (the image has no sh): asked for the defaults")
        return wanted, notes
    for u in wanted:
        cap = engine_max.get(u.name)
        if cap is None or cap == -1 or (u.hard != -1 and u.hard <= cap):
            out.append(u)
            continue
        out.append(Ulimit(u.name, cap if u.soft == -1 or u.soft > cap else u.soft, cap))
        notes.append(
            f"{u.name}: this Docker engine allows at most {_size(cap)} ({cap}), not {_size(u.hard)}: took "
            f"{cap}; to allow more set Limit{u.name.upper()}=infinity for docker.service and containerd.service"
        )
    return tuple(out), notes


def merge_ulimits(
    defaults: tuple[Ulimit, ...], overrides: tuple[tuple[str, int, int], ...]
) -> tuple[Ulimit, ...]:
    merged = {u.name: u for u in defaults}
    merged.update({n: Ulimit(n, soft, hard) for n, soft, hard in overrides})
    return tuple(merged.values())


def default_shm_bytes(memory_limit_bytes: int | None, host_memory_bytes: int) -> int:
    rule = load("container_defaults")["shm"][0]
    if memory_limit_bytes:  # tmpfs pages count against the memory limit: never more than the fraction
        return int(memory_limit_bytes * rule["fraction_of_memory_limit"])
    else:
        want = min(int(host_memory_bytes * rule["fraction_of_host_memory"]), int(rule["max_bytes"]))
    return max(want, int(rule["min_bytes"]))


@dataclass(frozen=True)
class Hardening:
    security_opt: tuple[str, ...]
    cap_drop: tuple[str, ...]
    cap_add: tuple[str, ...]
    pids_limit: int


def default_hardening(pids_limit: int | None = None) -> Hardening:
    """no-new-privileges, capabilities dropped to seven, a pids limit (container_defaults.toml says why)."""
    row = load("container_defaults")["security"][0]
    return Hardening(
        security_opt=("no-new-privileges",) if row["no_new_privileges"] else (),
        cap_drop=tuple(row["cap_drop"]),
        cap_add=tuple(row["cap_add"]),
        pids_limit=pids_limit or int(row["pids_limit"]),
    )


def device_requests(units: tuple[Unit, ...], cdi: bool) -> tuple[DeviceRequest, ...]:
    """GPU device requests by UUID: CDI device names where the host has CDI specs, else the NVIDIA hook."""
    if not units:
        return ()
    ids = tuple(u.uuid for u in units)
    if cdi:
        return (DeviceRequest("cdi", tuple(f"nvidia.com/gpu={i}" for i in ids), ()),)
    return (DeviceRequest("nvidia", ids, (("gpu", "compute", "utility"),)),)


def _labels(
    req: UpRequest, units: tuple[Unit, ...], container_user: str | None, ports: list[Port]
) -> dict[str, str]:
    """The container's ``torchrig.*`` labels: who holds it, which GPUs and ports (never a secret)."""
    flags = {"share": req.share, "jupyter": req.jupyter, "ssh": req.ssh, "public": req.public}
    return {
        **dict(req.extra_labels),
        f"{ENV_LABEL_PREFIX}managed": "1",
        f"{ENV_LABEL_PREFIX}user": req.user,
        **({f"{ENV_LABEL_PREFIX}uid": str(req.owner_uid)} if req.owner_uid is not None else {}),
        f"{ENV_LABEL_PREFIX}image": req.image,
        f"{ENV_LABEL_PREFIX}gpus": ",".join(u.uuid for u in units),
        f"{ENV_LABEL_PREFIX}gpu_labels": ",".join(u.label for u in units),
        **{f"{ENV_LABEL_PREFIX}{k}": "1" if v else "0" for k, v in flags.items()},
        f"{ENV_LABEL_PREFIX}container_user": container_user or "",
        **{f"{ENV_LABEL_PREFIX}{p.service}_port": str(p.container_port) for p in ports},
    }


@dataclass(frozen=True)
class Identity:
    run_as: tuple[int, int] | None  # the UID:GID the image's user is remapped to (None: the image's own)
    handover: tuple[str, ...]  # root's host directories handed to the environment's user (plain root only)
    notes: tuple[str, ...]


def _identity(req: UpRequest, host: HostFacts, who: ImageUser) -> Identity:
    """Who the image's user runs as, so that the workspace is the user's and writable.

    * a user (or ``sudo`` by one): their UID:GID, so files on volumes are theirs;
    * plain root: the owner of the first writable host directory when that is not root (root works on
      someone's files as them); a root-owned writable directory is handed to the environment's user
      (``chown`` of its root-owned entries; root keeps access whatever the owner)."""
    notes = []
    if req.public:
        notes.append(
            "--public: ports listen on every interface; Docker's published ports bypass ufw/firewalld rules, "
            "and Jupyter's token crosses the network in plain HTTP (an SSH tunnel keeps it private)"
        )
    binds = [v for v in req.volumes if v.kind == "bind" and not v.read_only]
    invoker = (host.uid, host.gid) if host.uid is not None and host.gid is not None else None
    if invoker is None:
        owned = [(v.host_path, host.path_owners.get(v.host_path)) for v in binds]
        first = next(((path, o) for path, o in owned if o and o[0] != 0), None)
        if first and who.uid is not None and first[1][0] != who.uid:
            invoker = first[1]
            notes.append(
                f"running as root on {first[0]}: the environment works as its owner, UID {invoker[0]}"
            )
    run_as = None
    if who.name and who.uid is not None and invoker and invoker[0] != who.uid:
        run_as = invoker
        if host.uid is not None:
            notes.append(
                f"the image's user {who.name} runs as your UID {invoker[0]}:{invoker[1]} (the image has {who.uid})"
            )
    uid = run_as[0] if run_as else who.uid
    gid = run_as[1] if run_as else who.gid
    handover = []
    for v in binds:
        owner = host.path_owners.get(v.host_path)
        if owner is None or uid is None or owner[0] == uid:
            continue
        if host.uid is None and owner[0] == 0 and uid != 0:
            handover.append(v.host_path)
            notes.append(
                f"{v.host_path} is root's: its root-owned files go to the environment's user, UID {uid}:{gid} (root keeps access)"
            )
        else:
            notes.append(
                f"{v.host_path} belongs to UID {owner[0]}: the environment (UID {uid}) may not write it"
            )
    return Identity(run_as, tuple(handover), tuple(notes))


def _steps(req: UpRequest, ident: Identity, contract: ServeContract, user: str | None) -> tuple[str, ...]:
    """What ``up`` does around creating the container, in order (shown by ``--dry-run``)."""
    steps = [
        f"keep {v.container_path} on volume {v.host_path} (made if missing, kept across down/up)"
        if i == 0 and req.workspace and v.host_path == workspace_volume_name(req.name, req.user)
        else f"create volume {v.host_path} if missing"
        for i, v in enumerate(req.volumes)
        if v.kind == "volume"
    ]
    steps += [f"hand {path}'s root-owned files to the environment's user" for path in ident.handover]
    secrets = contract.secret_files(req.jupyter, req.ssh)
    if secrets:
        steps.append(
            f"copy {', '.join(secrets)} into the created container (readable by {user or 'root'} only)"
        )
    if req.ssh:
        steps.append("copy this environment's SSH host key in (kept across down/up of the same name)")
    if ident.run_as:
        steps.append(f"give {user} UID:GID {ident.run_as[0]}:{ident.run_as[1]} in /etc/passwd and /etc/group")
    rw_volumes = [v.container_path for v in req.volumes if v.kind == "volume" and not v.read_only]
    if rw_volumes:
        steps.append(f"give the environment's user the volumes' roots: {', '.join(rw_volumes)}")
    steps.append("start, then wait until the services answer" if req.jupyter or req.ssh else "start")
    return tuple(steps)


def workspace_volume_name(env: str, user: str) -> str:
    """The named volume that holds an environment's workdir: one per (owner, environment name), so a
    ``down`` then ``up`` of the same name finds its work again and two users' ``exp1`` never meet."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in user).strip("-_.") or "user"
    return f"torchrig-{safe}-{env}-workspace"


def workspace_of(req: UpRequest, image: ImageFacts) -> Volume | None:
    """The environment's own volume on the image's workdir (``/workspace``); None when a ``--volume``
    already mounts something there (it replaces the default) or the request asks for none."""
    target = image.workdir if image.workdir and image.workdir != "/" else DEFAULT_WORKDIR
    if not req.workspace or any(v.container_path == target for v in req.volumes):
        return None
    return Volume(workspace_volume_name(req.name, req.user), target, False, "volume")


def volume_labels(req: UpRequest, workspace: bool) -> dict[str, str]:
    """Labels of a volume ``up`` creates: torchrig's, who owns it, and (the workspace) whose it is."""
    return {
        **dict(req.extra_labels),
        f"{ENV_LABEL_PREFIX}volume": "1",
        f"{ENV_LABEL_PREFIX}user": req.user,
        **({f"{ENV_LABEL_PREFIX}uid": str(req.owner_uid)} if req.owner_uid is not None else {}),
        **({LABEL_WORKSPACE: req.name} if workspace else {}),
    }


def make_plan(
    req: UpRequest,
    image: ImageFacts,
    host: HostFacts,
    units: tuple[Unit, ...],
    contract: ServeContract = SERVE,
) -> UpPlan:
    ports: list[Port] = []
    host_ip = ALL_INTERFACES if req.public else LOCALHOST
    wanted = dict(req.host_ports)
    if req.jupyter:
        ports.append(Port("jupyter", contract.jupyter_port, host_ip, wanted.get("jupyter")))
    if req.ssh:
        ports.append(Port("ssh", contract.ssh_port, host_ip, wanted.get("ssh")))
    ws = workspace_of(req, image)
    if ws is not None:
        req = replace(req, volumes=(ws, *req.volumes))  # first: a --volume below it mounts over it
    mounts = [
        Mount(v.host_path, v.container_path, v.read_only, "workspace" if v == ws else "volume", v.kind)
        for v in req.volumes
    ]
    env = contract.env(jupyter=req.jupyter, ssh=req.ssh)
    who = image_user(image.labels, image.user)
    labels = _labels(req, units, who.name, ports)
    ident = _identity(req, host, who)
    run_as = ident.run_as
    overridden = {name for name, _, _ in req.ulimits}
    fitted, ulimit_notes = fit_ulimits(
        tuple(u for u in default_ulimits() if u.name not in overridden), host.ulimit_max
    )
    hard = default_hardening(req.pids_limit)
    return UpPlan(
        name=req.name,
        image=req.image,
        image_id=image.id,
        user=req.user,
        gpus=units,
        share=req.share,
        device_requests=device_requests(units, host.cdi),
        ports=tuple(ports),
        mounts=tuple(mounts),
        env=env,
        ulimits=merge_ulimits(fitted, req.ulimits),
        shm_size_bytes=req.shm_size_bytes or default_shm_bytes(req.memory_bytes, host.memory_total_bytes),
        memory_bytes=req.memory_bytes,
        nano_cpus=req.nano_cpus,
        labels=labels,
        secret_files=contract.secret_files(req.jupyter, req.ssh),
        container_user=who.name,
        container_uid=run_as[0] if run_as else who.uid,
        run_as=run_as,
        image_workdir=image.workdir,
        image_gid=who.gid,
        command=contract.command(jupyter=req.jupyter, ssh=req.ssh),
        security_opt=hard.security_opt,
        cap_drop=hard.cap_drop,
        cap_add=hard.cap_add,
        pids_limit=hard.pids_limit,
        handover=ident.handover,
        workspace=mounts[0] if ws is not None else None,
        steps=_steps(req, ident, contract, who.name),
        notes=tuple(ulimit_notes) + ident.notes,
    )
