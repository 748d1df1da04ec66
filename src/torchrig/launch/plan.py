"""The launch plan: a pure function from a request and the host's facts to argv, environment and devices.

Nothing here touches the host. ``build_plan(request, host)`` is what ``torchrig launch --dry-run`` prints
and what ``torchrig.launch.supervise.execute`` runs; other front ends (Slurm, Kubernetes) call it too.

>>> host = HostFacts(visible_gpus=(0, 1, 2, 3), cpu_count=32, python="python3", env={})
>>> plan = build_plan(LaunchRequest(script="train.py", gpus="0,2"), host)
>>> plan.nproc_per_node, [r.device for r in plan.ranks]
(2, ['cuda:0', 'cuda:1'])
>>> plan.env["CUDA_VISIBLE_DEVICES"]
'0,2'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torchrig.errors import UsageError
from torchrig.jsonrecords import Count
from torchrig.launch import options
from torchrig.launch.envdefaults import FR_DUMP_FILE, defaults_for, name_for
from torchrig.launch.flightrec import PREFIX
from torchrig.runtime import placement
from torchrig.runtime.inventory import Unit

if TYPE_CHECKING:  # the ledger module imports sqlite3: only the type is needed here
    from torchrig.runtime.ledger import Lease

DEFAULT_PORT = 29500
_ENDPOINT_RE = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>\d{1,5}))?$")
_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


# torchrun's options for the per-rank logs: stdout and stderr in files under --log-dir (which the failure
# summary reads), and a copy on the console prefixed by rank. `torchrig cluster`'s plain torchrun renders them too.
RANK_LOG_FLAGS = ("--redirects=3", "--tee=3")
# what --tee puts in front of a rank's line on torchrun's console: "[default0]:" (or "[rank0]:")
TEE_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:")

FLIGHT_RECORD_REQUEST = (
    ".flight-record-request"  # + ".<attempt>": the launcher asks the ranks for their records
)


@dataclass(frozen=True)
class GpuProbe:
    """What torch in the ranks' interpreter says of the GPUs (``probe.probe_gpus``), or NVML's answer standing
    for it (``gpuplan.from_nvml``)."""

    count: Count  # sizes loops: bounded when read from the probe's cache
    names: tuple[str, ...]
    no_p2p: tuple[tuple[int, int], ...]  # (i, j) in torch's numbering where i cannot access j
    error: str | None = None
    torch_version: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """What the plan needs from the host, gathered by ``torchrig.launch.probe.host_facts``.

    ``visible_gpus`` are the physical indices CUDA can see (after any ``CUDA_VISIBLE_DEVICES`` of the
    parent), in order; empty when there is no GPU.
    """

    visible_gpus: tuple[int, ...]
    cpu_count: int
    python: str
    env: Mapping[str, str] = field(default_factory=dict)
    no_p2p: tuple[tuple[int, int], ...] = ()  # physical id pairs (i, j) where i cannot access j's memory
    torch_version: str | None = None  # the ranks' torch (``torch.__version__``), when the GPU probe ran
    # The lease ledger, read by ``probe.lease_facts`` (empty on a host without one: nothing is leased):
    gpu_units: tuple[Unit, ...] = ()  # the inventory's whole GPUs (UUIDs) among the visible ones, when read
    leases: tuple[Lease, ...] = ()  # who holds which GPU
    user: str | None = None  # who runs this launch: a GPU leased to them is theirs to take


@dataclass(frozen=True)
class LaunchRequest:
    """The user's request, as ``torchrig launch`` options. Validated on construction."""

    script: str
    script_args: tuple[str, ...] = ()
    module: bool = False  # run ``script`` as ``python -m script``
    gpus: str | None = (
        None  # ``--gpus`` (runtime.placement's grammar); None: all yours, or CPU if none are visible
    )
    force: bool = False  # take GPUs leased to someone else anyway (said out loud: LaunchPlan.forced_gpus)
    cpu: bool = False  # gloo ranks on the CPU, no GPU
    nproc_per_node: int | None = None  # CPU ranks per node (default 1 with --cpu)
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT of node 0; default localhost and a free port
    rdzv_id: str = "torchrig"
    rdzv_backend: str = "c10d"
    rdzv_timeout_s: int = 300
    max_restarts: int = 0
    log_dir: str = "torchrig-logs"
    collective_timeout_s: int = 600
    hang_timeout_s: int = 0  # 0: off; else no rank output for this long counts as a hang
    # after a rank's NCCL watchdog logs a collective timeout, the job is stopped if it has not ended this many
    # seconds later (0: never): torch 2.11 on H200 logged the timeout, dumped the flight record and kept the
    # process running (docs/benchmarks.md, "NCCL's watchdog and the end of the job")
    nccl_timeout_grace_s: int = 30
    # a rank stopped by a signal (process state T) this long, while another rank waits in a collective (its
    # flight record), is a hang: the job is stopped and summarised (0: never)
    stopped_grace_s: int = 30
    extra_env: tuple[tuple[str, str], ...] = ()
    monitor_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.script:
            raise UsageError("no script given", hint="e.g. torchrig launch --gpus 2 train.py --epochs 3")
        if self.nnodes < 1:
            raise UsageError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError(
                "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (node 0's address)",
                hint="e.g. --rdzv-endpoint node0:29500 on every node",
            )
        if self.rdzv_endpoint is not None:
            parse_endpoint(self.rdzv_endpoint)
        if not _ID_RE.match(self.rdzv_id):
            raise UsageError(f"--rdzv-id {self.rdzv_id!r} must be 1-64 letters, digits, '_', '.', '-'")
        if self.rdzv_backend not in ("c10d", "static"):
            raise UsageError(f"--rdzv-backend must be c10d or static, got {self.rdzv_backend!r}")
        options.check({o.field: getattr(self, o.field) for o in options.LAUNCH_OPTIONS})
        if self.cpu and self.gpus is not None:
            raise UsageError("--cpu and --gpus exclude each other", hint="drop one of them")
        if self.gpus is not None and not placement.parse_gpus(self.gpus).wants_gpus:
            raise UsageError(f"--gpus {self.gpus!r} asks for no GPU", hint="for CPU ranks use --cpu")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.nproc_per_node is not None and self.gpus is not None:
            raise UsageError("--nproc-per-node is for --cpu runs; with GPUs the count comes from --gpus")


@dataclass(frozen=True)
class RankPlan:
    """One process of this node: its local rank, expected global rank, device and log file."""

    local_rank: int
    global_rank: int  # node_rank * nproc + local_rank (c10d may order nodes differently)
    device: str  # "cuda:i" within the job's CUDA_VISIBLE_DEVICES, or "cpu"
    physical_gpu: int | None
    log_hint: str


@dataclass(frozen=True)
class EnvSetting:
    name: str
    value: str
    reason: str
    source: str | None
    overridden_by_user: bool = False  # the parent environment already had it; the user's value wins


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to run the job on this node, and nothing that needs the host to compute."""

    argv: tuple[str, ...]
    preflight_argv: tuple[str, ...]  # the same topology running torchrig.launch.pgprobe instead of the script
    env: dict[str, str]  # what the launcher sets on top of the parent environment
    env_settings: tuple[EnvSetting, ...]
    ranks: tuple[RankPlan, ...]
    nproc_per_node: int
    nnodes: int
    node_rank: int
    world_size: int
    backend: str  # "nccl" or "gloo"
    rdzv_host: str
    rdzv_port: int
    rdzv_id: str
    max_restarts: int
    log_dir: str
    hang_timeout_s: int
    collective_timeout_s: int
    nccl_timeout_grace_s: int = 30
    stopped_grace_s: int = 30
    forced_gpus: tuple[str, ...] = ()  # "GPU 1 held by bob/env since …": leased to others, taken with --force


def parse_endpoint(text: str) -> tuple[str, int | None]:
    """``"node0:29500"`` -> ``("node0", 29500)``; the port may be left out."""
    m = _ENDPOINT_RE.match(text.strip())
    if not m:
        raise UsageError(
            f"malformed --rdzv-endpoint {text!r}", hint="expected HOST:PORT, e.g. 10.0.0.1:29500"
        )
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--rdzv-endpoint port must be 1..65535, got {port}")
    return m.group("host"), port


def select_gpus(req: LaunchRequest, host: HostFacts) -> placement.Placement:
    """``--gpus`` against the visible GPUs and the lease ledger, by the placement rule of every command
    (:func:`torchrig.runtime.placement.place`): indices are physical ids, a count takes the first N visible
    GPUs that are yours to take, ``all`` (the default) every one of them; a GPU leased to someone else is
    refused unless ``--force``."""
    request = placement.parse_gpus(req.gpus) if req.gpus is not None else placement.GpuRequest("all")
    if any(u.upper().startswith("MIG-") for u in request.uuids):
        raise UsageError(
            "--gpus MIG-…: launch starts one rank per whole GPU",
            hint="for a MIG instance run with CUDA_VISIBLE_DEVICES=MIG-… and --gpus 1",
        )
    if request.kind == "count" and request.count > len(host.visible_gpus):
        raise UsageError(
            f"--gpus {request.count} asks for more GPUs than the {len(host.visible_gpus)} visible",
            hint=f"visible: {','.join(map(str, host.visible_gpus)) or 'none'}; check CUDA_VISIBLE_DEVICES",
        )
    known = {u.gpu_index: u for u in host.gpu_units if not u.is_mig}
    units = [known.get(i) or Unit("", i, str(i), False, None, None) for i in host.visible_gpus]
    return placement.place(
        request,
        units,
        host.leases,
        mine=lambda lease: host.user is not None and lease.user == host.user,
        force=req.force,
        locality=False,  # CUDA's order, as torchrun's ranks count them
    )


def _rank_plans(req: LaunchRequest, gpus: tuple[int, ...], nproc: int) -> tuple[RankPlan, ...]:
    out = []
    for i in range(nproc):
        gid = req.node_rank * nproc + i
        out.append(
            RankPlan(
                local_rank=i,
                global_rank=gid,
                device=f"cuda:{i}" if gpus else "cpu",
                physical_gpu=gpus[i] if gpus else None,
                log_hint=f"{req.log_dir}/<run>/attempt_<k>/{i}/stderr.log",
            )
        )
    return tuple(out)


def _env(
    req: LaunchRequest, host: HostFacts, gpus: tuple[int, ...], nproc: int
) -> tuple[dict[str, str], tuple[EnvSetting, ...]]:
    """The environment the ranks get on top of the parent's, and each setting with its reason."""
    settings = _host_settings(host, gpus, nproc) + _torchrig_settings(req, host, gpus)
    for k, v in req.extra_env:
        settings.append(EnvSetting(k, v, "given with --env", None))
    env = {s.name: s.value for s in settings if not s.overridden_by_user}
    env.update(dict(req.extra_env))
    return env, tuple(settings)


def _host_settings(host: HostFacts, gpus: tuple[int, ...], nproc: int) -> list[EnvSetting]:
    """The field's defaults (each with its reason), and what this host's GPUs need: P2P off for a pair
    that cannot use it, the chosen GPUs."""
    settings: list[EnvSetting] = []
    omp = max(1, host.cpu_count // max(1, nproc))
    for d in defaults_for(uses_nccl=bool(gpus), omp_threads=omp, torch_version=host.torch_version):
        settings.append(
            EnvSetting(d.name, d.value, d.reason, d.source, overridden_by_user=d.set_by(host.env))
        )
    blocked = [(i, j) for i, j in host.no_p2p if i in gpus and j in gpus]
    if blocked:
        i, j = blocked[0]
        settings.append(
            EnvSetting(
                "NCCL_P2P_DISABLE",
                "1",
                f"GPU {i} cannot access GPU {j} directly (pre-flight); NCCL would otherwise "
                "try P2P and hang or fail, so it goes through host memory instead (slower)",
                "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-p2p-disable",
                overridden_by_user="NCCL_P2P_DISABLE" in host.env,
            )
        )
    if gpus:
        settings.append(
            EnvSetting(
                "CUDA_VISIBLE_DEVICES",
                ",".join(map(str, gpus)),
                "each node sees exactly the chosen GPUs; local rank i uses cuda:i",
                None,
            )
        )
    return settings


def _torchrig_settings(req: LaunchRequest, host: HostFacts, gpus: tuple[int, ...]) -> list[EnvSetting]:
    """What torchrig's own parts read in the ranks: the collective timeout, where logs and flight records go."""
    settings = [
        EnvSetting(
            "TORCHRIG_COLLECTIVE_TIMEOUT_S",
            str(req.collective_timeout_s),
            "the process-group timeout torchrig's trainer and pre-flight pass to "
            "init_process_group (read it in your script too)",
            None,
        )
    ]
    if gpus:
        old, renamed = FR_DUMP_FILE
        settings.append(
            EnvSetting(
                name_for(old, renamed, host.torch_version),
                f"{req.log_dir}/{PREFIX}",
                "the flight record a timed-out rank dumps goes next to the rank logs (file name + global rank; "
                "PyTorch's default is /tmp/nccl_trace_rank_<rank>)",
                "https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html",
                overridden_by_user=old in host.env or renamed[0] in host.env,
            )
        )
    settings.append(EnvSetting("TORCHRIG_LOG_DIR", req.log_dir, "where the per-rank logs go", None))
    settings.append(
        EnvSetting(
            "TORCHRIG_FR_REQUEST",
            f"{req.log_dir}/{FLIGHT_RECORD_REQUEST}",
            "when the launcher stops a hung job it creates this file (+ '.<attempt>'), and every rank that keeps a "
            f"flight record writes it to {req.log_dir}/{PREFIX}<rank>, not only on an NCCL timeout "
            "(gloo ranks too: torch 2.13 records their collectives by default)",
            None,
        )
    )
    return settings


def _torchrun_argv(
    req: LaunchRequest, python: str, nproc: int, endpoint: str, rdzv_id: str, max_restarts: int
) -> list[str]:
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={req.nnodes}",
        f"--nproc-per-node={nproc}",
        f"--node-rank={req.node_rank}",
        f"--rdzv-backend={req.rdzv_backend}",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
    ]
    conf = [f"join_timeout={req.rdzv_timeout_s}"]
    if req.rdzv_backend == "c10d":
        # The node that hosts the store is node 0; saying so avoids guessing from hostnames (NAT, netns).
        conf.append(f"is_host={'true' if req.node_rank == 0 else 'false'}")
    return [
        *argv,
        f"--rdzv-conf={','.join(conf)}",
        f"--max-restarts={max_restarts}",
        f"--monitor-interval={req.monitor_interval_s:g}",
        f"--log-dir={req.log_dir}",
        *RANK_LOG_FLAGS,
        # Every worker starts in torchrig's thin shim: stack dumps on demand, error file, then the script.
        "-m",
        "torchrig.launch.worker",
    ]


def build_plan(
    req: LaunchRequest, host: HostFacts, *, free_port: int | None = None, preflight_port: int | None = None
) -> LaunchPlan:
    """The plan for this node. ``free_port`` is a port the caller found free, used when none is given;
    ``preflight_port``, another one for the pre-flight probe when it runs beside the job (one node only)."""
    forced: tuple[str, ...] = ()
    if req.cpu:
        gpus: tuple[int, ...] = ()
        nproc = req.nproc_per_node or 1
    else:
        if not host.visible_gpus and req.gpus is not None:
            raise UsageError(
                "--gpus given but no GPU is visible",
                hint="check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --cpu for gloo ranks",
            )
        if host.visible_gpus:
            chosen = select_gpus(req, host)
            gpus, forced = tuple(u.gpu_index for u in chosen.units), chosen.forced
        else:
            gpus = ()
        nproc = len(gpus) if gpus else (req.nproc_per_node or 1)
    if req.rdzv_endpoint:
        rhost, rport = parse_endpoint(req.rdzv_endpoint)
        port = rport or DEFAULT_PORT
    else:
        rhost, port = "localhost", free_port or DEFAULT_PORT
    env, settings = _env(req, host, gpus, nproc)
    argv = _torchrun_argv(req, host.python, nproc, f"{rhost}:{port}", req.rdzv_id, req.max_restarts)
    argv += ["--module", req.script] if req.module else [req.script]
    argv += list(req.script_args)
    pre_endpoint = f"{rhost}:{preflight_port or port}"
    pre = _torchrun_argv(req, host.python, nproc, pre_endpoint, f"{req.rdzv_id}-preflight", 0)
    pre += ["--module", "torchrig.launch.pgprobe"]
    return LaunchPlan(
        argv=tuple(argv),
        preflight_argv=tuple(pre),
        env=env,
        env_settings=settings,
        ranks=_rank_plans(req, gpus, nproc),
        nproc_per_node=nproc,
        nnodes=req.nnodes,
        node_rank=req.node_rank,
        world_size=nproc * req.nnodes,
        backend="nccl" if gpus else "gloo",
        rdzv_host=rhost,
        rdzv_port=port,
        rdzv_id=req.rdzv_id,
        max_restarts=req.max_restarts,
        log_dir=req.log_dir,
        hang_timeout_s=req.hang_timeout_s,
        collective_timeout_s=req.collective_timeout_s,
        nccl_timeout_grace_s=req.nccl_timeout_grace_s,
        stopped_grace_s=req.stopped_grace_s,
        forced_gpus=forced,
    )
