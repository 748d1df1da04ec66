"""The cluster job: one frozen record that both renderers read, validated on construction.

Its options are ``torchrig launch``'s (nodes, processes per node, rendezvous, restarts, timeouts, logs,
pre-flight) plus the scheduler's (partition, time, image). :func:`launcher_argv` writes the per-node
command: ``torchrig launch`` with exactly the options it takes, or plain torchrun for nodes without
torchrig. The environment is ``torchrig launch``'s own defaults (``torchrig.launch.envdefaults``), so a job
gets the same settings on one box, under Slurm and on Kubernetes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

from torchrig.cluster import fields
from torchrig.errors import UsageError
from torchrig.launch import options
from torchrig.launch.envdefaults import defaults_for
from torchrig.launch.plan import RANK_LOG_FLAGS

NAME_MAX = 52  # a DNS label of 63, less room for the suffixes the controllers add to pod names
# Set by `torchrig launch` on each node from that node's core count (and by torchrun to 1 when unset), so
# a render, which does not know the nodes' cores, leaves it to them.
PER_NODE_DEFAULTS = ("OMP_NUM_THREADS",)


class ContainerRuntime(str, enum.Enum):
    NONE = "none"
    PYXIS = "pyxis"  # srun --container-image (NVIDIA pyxis + enroot)
    APPTAINER = "apptainer"  # apptainer exec --nv


class K8sKind(str, enum.Enum):
    PYTORCHJOB = "pytorchjob"  # Kubeflow Training Operator
    JOB = "job"  # plain indexed batch/v1 Job + headless Service: no operator needed
    JOBSET = "jobset"  # Kubernetes SIG-Apps JobSet (jobset.x-k8s.io/v1alpha2): one replicatedJob of N pods


@dataclass(frozen=True)
class NodeVar:
    """A value each node's environment provides at run time (``SLURM_NODEID``, ``JOB_COMPLETION_INDEX``).

    Only torchrig writes these; every other part of a command is literal text. Each renderer writes a
    ``NodeVar`` in its engine's own syntax (``"$NAME"`` for bash, ``$(NAME)`` for the kubelet) and quotes
    everything else so that it stays literal.
    """

    name: str


Part = Union[str, NodeVar]  # noqa: UP007 - a runtime alias, and the package supports Python 3.10
Word = Union[str, tuple[Part, ...]]  # noqa: UP007 - a literal word, or literal text and NodeVars joined


def cat(*parts: Part) -> tuple[Part, ...]:
    """One word made of literal text and node variables, e.g. ``cat(log_dir, "/node", NodeVar("SLURM_NODEID"))``."""
    return tuple(p for p in parts if p != "")


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    reason: str


@dataclass(frozen=True)
class ClusterJob:
    """What to run, where and how: ``torchrig launch``'s options and the scheduler's.

    ``None`` in a launch option means "launch's own default", and the option is left out of the command.
    """

    script: str
    script_args: tuple[str, ...] = ()
    module: bool = False  # ``script`` is a module, run as ``python -m`` (e.g. torchrig.train)
    name: str = "torchrig-train"
    nodes: int = 1
    gpus_per_node: int = 8
    cpu_procs_per_node: int = 1  # processes per node of a CPU job (gpus_per_node == 0)
    cpus_per_task: int | None = None
    rdzv_port: int = 29500
    rdzv_timeout_s: int | None = None
    max_restarts: int = 0
    collective_timeout_s: int | None = None
    hang_timeout_s: int | None = None
    nccl_timeout_grace_s: int | None = None
    stopped_grace_s: int | None = None
    preflight: bool = True
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    image: str | None = None
    container_runtime: ContainerRuntime = ContainerRuntime.NONE
    container_mounts: tuple[str, ...] = ()
    log_dir: str = "torchrig-logs"
    namespace: str = "default"
    k8s_kind: K8sKind = K8sKind.PYTORCHJOB
    shm_size: str = "16Gi"
    pvc_mounts: tuple[str, ...] = ()  # "CLAIM:/path": a PersistentVolumeClaim every pod mounts (checkpoints)
    env: dict[str, str] = field(default_factory=dict)
    use_torchrig_launch: bool = True

    def __post_init__(self) -> None:
        if not self.script:
            raise UsageError(
                "no training script given", hint="put it after '--', e.g. -- train.py --epochs 3"
            )
        fields.no_control("the script", self.script)
        if self.script.startswith("-"):
            raise UsageError(f"the script {self.script!r} starts with '-'", hint="name a file or a module")
        for arg in self.script_args:
            fields.text_arg("a script argument", arg)
        if self.nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise UsageError(f"--gpus-per-node must be 0 or more, got {self.gpus_per_node}")
        if self.cpu_procs_per_node < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, got {self.cpu_procs_per_node}")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise UsageError(f"--cpus-per-task must be at least 1, got {self.cpus_per_task}")
        if self.gpus_per_node and self.cpu_procs_per_node != 1:
            raise UsageError(
                "--nproc-per-node is for CPU jobs (--gpus-per-node 0)",
                hint="with GPUs there is one process per GPU",
            )
        self._check_launch_options()
        self._check_names()
        fields.log_dir(self.log_dir)
        if self.container_runtime is not ContainerRuntime.NONE and not self.image:
            raise UsageError(
                f"--container-runtime {self.container_runtime.value} needs an image",
                hint="pass --container IMAGE, or --spec torchrig.toml for the image `torchrig image build` makes",
            )
        if self.image is not None:
            fields.image_ref("--image" if self.container_runtime is ContainerRuntime.NONE else "--container",
                             self.image)  # fmt: skip
        for mount in self.container_mounts:
            fields.bind_mount(mount)
        for mount in self.pvc_mounts:
            fields.claim_mount(mount)
        fields.quantity("--shm-size", self.shm_size)
        for key, value in self.env.items():
            fields.env_name(key)
            fields.text_arg(f"--env {key}=", value)

    def _check_names(self) -> None:
        fields.dns_label("--name", self.name, max_len=NAME_MAX)
        fields.dns_label("--namespace", self.namespace)
        if self.partition is not None:
            fields.slurm_name("--partition", self.partition, allow_list=True)
        if self.account is not None:
            fields.slurm_name("--account", self.account)
        if self.time_limit is not None:
            fields.slurm_time(self.time_limit)

    def _check_launch_options(self) -> None:
        if not 1024 <= self.rdzv_port <= 65535:
            raise UsageError(f"--rdzv-port must be 1024..65535, got {self.rdzv_port}")
        options.check({o.field: getattr(self, o.field) for o in options.LAUNCH_OPTIONS})

    @property
    def nproc_per_node(self) -> int:
        """One process per GPU; a CPU job runs ``cpu_procs_per_node``."""
        return self.gpus_per_node or self.cpu_procs_per_node

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def environment(self) -> tuple[EnvVar, ...]:
        """``torchrig launch``'s defaults for this job's backend (NCCL with GPUs), then the user's ``--env``."""
        out = {
            d.name: EnvVar(d.name, d.value, d.reason)
            for d in defaults_for(uses_nccl=self.gpus_per_node > 0, omp_threads=1)
            if d.name not in PER_NODE_DEFAULTS
        }
        for key, value in self.env.items():
            out[key] = EnvVar(key, value, "given with --env")
        return tuple(out.values())


def launcher_argv(
    job: ClusterJob, *, nnodes: Word, node_rank: Word, endpoint: Word, rdzv_id: Word, log_dir: Word
) -> list[Word]:
    """The per-node launcher command; :class:`NodeVar` parts are left for each node to fill in."""
    if not job.use_torchrig_launch:
        return _torchrun_argv(job, nnodes=nnodes, endpoint=endpoint, rdzv_id=rdzv_id, log_dir=log_dir)
    argv: list[Word] = ["torchrig", "launch"]
    argv += ["--gpus", str(job.gpus_per_node)] if job.gpus_per_node else ["--cpu", "--nproc-per-node",
                                                                        str(job.cpu_procs_per_node)]  # fmt: skip
    argv += ["--nnodes", nnodes, "--node-rank", node_rank, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    argv += options.argv({o.field: getattr(job, o.field) for o in options.LAUNCH_OPTIONS})
    argv += ["--log-dir", log_dir]
    if not job.preflight:
        argv.append("--no-preflight")
    if job.module:
        argv.append("-m")
    return [*argv, "--", job.script, *job.script_args]


def _flag(flag: str, value: Word) -> Word:
    """``--flag=value`` as one word, keeping the value's node variables."""
    return cat(f"{flag}=", *((value,) if isinstance(value, str) else value))


def _torchrun_argv(
    job: ClusterJob, *, nnodes: Word, endpoint: Word, rdzv_id: Word, log_dir: Word
) -> list[Word]:
    """Plain torchrun, for nodes without torchrig: the same rendezvous, restarts and per-rank logs."""
    argv: list[Word] = [
        "python3",
        "-m",
        "torch.distributed.run",
        _flag("--nnodes", nnodes),
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        _flag("--rdzv-endpoint", endpoint),
        _flag("--rdzv-id", rdzv_id),
    ]
    if job.rdzv_timeout_s is not None:
        argv.append(f"--rdzv-conf=join_timeout={job.rdzv_timeout_s}")
    argv += [
        f"--max-restarts={job.max_restarts}",
        # Per-rank stdout/stderr files under the log dir and a rank-prefixed copy on the console, as
        # `torchrig launch` does (its own flags).
        _flag("--log-dir", log_dir),
        *RANK_LOG_FLAGS,
    ]
    if job.module:
        argv.append("-m")
    return [*argv, job.script, *job.script_args]


def literal(word: Word, values: dict[str, str]) -> str:
    """A word with its node variables filled in from ``values``: what the node's process receives."""
    if isinstance(word, str):
        return word
    return "".join(p if isinstance(p, str) else values[p.name] for p in word)
