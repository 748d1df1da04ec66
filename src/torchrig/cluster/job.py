"""The cluster job: one frozen record that both renderers read, validated on construction.

Its options are ``torchrig launch``'s (nodes, processes per node, rendezvous, restarts, timeouts, logs,
pre-flight) plus the scheduler's (partition, time, image). :func:`launcher_argv` writes the per-node
command: ``torchrig launch`` with exactly the options it takes, or plain torchrun for nodes without
torchrig. The environment is ``torchrig launch``'s own defaults (``torchrig.launch.envdefaults``), so a job
gets the same settings on one box, under Slurm and on Kubernetes.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from torchrig.errors import UsageError
from torchrig.launch.envdefaults import defaults_for

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")
# a namespace is an RFC 1123 DNS label (kubernetes.io/docs/concepts/overview/working-with-objects/names)
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")
_CLAIM_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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
        if self.nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise UsageError(f"--gpus-per-node must be 0 or more, got {self.gpus_per_node}")
        if self.cpu_procs_per_node < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, got {self.cpu_procs_per_node}")
        if self.gpus_per_node and self.cpu_procs_per_node != 1:
            raise UsageError(
                "--nproc-per-node is for CPU jobs (--gpus-per-node 0)",
                hint="with GPUs there is one process per GPU",
            )
        self._check_launch_options()
        if not _NAME_RE.match(self.name):
            raise UsageError(
                f"job name {self.name!r} is not a DNS label",
                hint="use lowercase letters, digits and '-', at most 52 characters",
            )
        if not _NAMESPACE_RE.match(self.namespace):  # what the API server refuses, refused here
            raise UsageError(
                f"--namespace {self.namespace!r} is not a Kubernetes namespace name",
                hint="use lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63",
            )
        if self.time_limit is not None and not _TIME_RE.match(self.time_limit):
            raise UsageError(
                f"--time {self.time_limit!r} is not a Slurm time", hint="use MINUTES, HH:MM:SS or D-HH:MM:SS"
            )
        if self.container_runtime is not ContainerRuntime.NONE and not self.image:
            raise UsageError(
                f"--container-runtime {self.container_runtime.value} needs an image",
                hint="pass --container IMAGE, or --spec torchrig.toml for the image `torchrig image build` makes",
            )
        for mount in self.pvc_mounts:
            claim, _, path = mount.partition(":")
            if not _CLAIM_RE.match(claim) or not path.startswith("/"):
                raise UsageError(
                    f"--volume {mount!r} is not CLAIM:/path", hint="e.g. --volume shared-runs:/shared"
                )
        for key in self.env:
            if not _ENV_NAME_RE.match(key):
                raise UsageError(f"--env {key!r} is not an environment variable name")

    def _check_launch_options(self) -> None:
        if not 1024 <= self.rdzv_port <= 65535:
            raise UsageError(f"--rdzv-port must be 1024..65535, got {self.rdzv_port}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        for flag, value in (
            ("--rdzv-timeout", self.rdzv_timeout_s),
            ("--collective-timeout", self.collective_timeout_s),
        ):
            if value is not None and value < 1:
                raise UsageError(f"{flag} must be at least 1 second, got {value}")
        if self.hang_timeout_s is not None and self.hang_timeout_s < 0:
            raise UsageError(f"--hang-timeout must be 0 (off) or more seconds, got {self.hang_timeout_s}")

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
    job: ClusterJob, *, nnodes: str, node_rank: str, endpoint: str, rdzv_id: str, log_dir: str
) -> list[str]:
    """The per-node launcher command; shell words (``$VAR``) are left for the node's shell to expand."""
    if not job.use_torchrig_launch:
        return _torchrun_argv(job, nnodes=nnodes, endpoint=endpoint, rdzv_id=rdzv_id, log_dir=log_dir)
    argv = ["torchrig", "launch"]
    argv += ["--gpus", str(job.gpus_per_node)] if job.gpus_per_node else ["--cpu", "--nproc-per-node",
                                                                        str(job.cpu_procs_per_node)]  # fmt: skip
    argv += ["--nnodes", nnodes, "--node-rank", node_rank, "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
    if job.rdzv_timeout_s is not None:
        argv += ["--rdzv-timeout", str(job.rdzv_timeout_s)]
    argv += ["--max-restarts", str(job.max_restarts)]
    if job.collective_timeout_s is not None:
        argv += ["--collective-timeout", str(job.collective_timeout_s)]
    if job.hang_timeout_s is not None:
        argv += ["--hang-timeout", str(job.hang_timeout_s)]
    argv += ["--log-dir", log_dir]
    if not job.preflight:
        argv.append("--no-preflight")
    if job.module:
        argv.append("-m")
    return [*argv, "--", job.script, *job.script_args]


def _torchrun_argv(job: ClusterJob, *, nnodes: str, endpoint: str, rdzv_id: str, log_dir: str) -> list[str]:
    """Plain torchrun, for nodes without torchrig: the same rendezvous, restarts and per-rank logs."""
    argv = [
        "python3",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
    ]
    if job.rdzv_timeout_s is not None:
        argv.append(f"--rdzv-conf=join_timeout={job.rdzv_timeout_s}")
    argv += [
        f"--max-restarts={job.max_restarts}",
        # Per-rank stdout/stderr files under the log dir and a rank-prefixed copy on the console, as
        # `torchrig launch` does.
        f"--log-dir={log_dir}",
        "--redirects=3",
        "--tee=3",
    ]
    if job.module:
        argv.append("-m")
    return [*argv, job.script, *job.script_args]
