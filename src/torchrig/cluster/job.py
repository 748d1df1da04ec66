"""The cluster job: one frozen record that both renderers read, validated on construction."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from torchrig.errors import UsageError

# Defaults every multi-node torchrig job carries, each with its reason. The same values `torchrig launch`
# sets on a single machine, so a job behaves the same on one box, under Slurm and on Kubernetes.
NCCL_ENV: dict[str, str] = {
    # Async error handling: a failed or timed-out collective tears the process group down instead of
    # hanging forever, so torchrun sees the failure and can restart the job (PyTorch ProcessGroupNCCL docs).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # Record a flight-recorder trace of the last collectives, dumped on timeout: names the stuck rank.
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    # Log NCCL's init (transport and interface choices) once, so a slow or wrong path is visible in the logs.
    "NCCL_DEBUG": "WARN",
    # Keep multi-node jobs off loopback and docker bridges when choosing the socket interface.
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    # Python output unbuffered so per-rank logs are current when a job hangs.
    "PYTHONUNBUFFERED": "1",
}

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")
_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")


class ContainerRuntime(str, enum.Enum):
    NONE = "none"
    PYXIS = "pyxis"  # srun --container-image (NVIDIA pyxis + enroot)
    APPTAINER = "apptainer"  # apptainer exec --nv


class K8sKind(str, enum.Enum):
    PYTORCHJOB = "pytorchjob"  # Kubeflow Training Operator
    JOB = "job"  # plain indexed batch/v1 Job + headless Service: no operator needed


@dataclass(frozen=True)
class ClusterJob:
    """What to run, where and how: the union of `launch`'s options and the scheduler's."""

    script: str
    script_args: tuple[str, ...] = ()
    name: str = "torchrig-train"
    nodes: int = 1
    gpus_per_node: int = 8
    cpus_per_task: int | None = None
    rdzv_port: int = 29500
    max_restarts: int = 0
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    image: str | None = None
    container_runtime: ContainerRuntime = ContainerRuntime.NONE
    container_mounts: tuple[str, ...] = ()
    log_dir: str = "logs"
    namespace: str = "default"
    k8s_kind: K8sKind = K8sKind.PYTORCHJOB
    shm_size: str = "16Gi"
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
        if not 1024 <= self.rdzv_port <= 65535:
            raise UsageError(f"--rdzv-port must be 1024..65535, got {self.rdzv_port}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        if not _NAME_RE.match(self.name):
            raise UsageError(
                f"job name {self.name!r} is not a DNS label",
                hint="use lowercase letters, digits and '-', at most 52 characters",
            )
        if self.time_limit is not None and not _TIME_RE.match(self.time_limit):
            raise UsageError(
                f"--time {self.time_limit!r} is not a Slurm time", hint="use MINUTES, HH:MM:SS or D-HH:MM:SS"
            )
        if self.container_runtime is not ContainerRuntime.NONE and not self.image:
            raise UsageError(f"--container-runtime {self.container_runtime.value} needs --container IMAGE")

    @property
    def nproc_per_node(self) -> int:
        """One process per GPU; a CPU-only job (0 GPUs) runs one process per node."""
        return self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def environment(self) -> dict[str, str]:
        merged = dict(NCCL_ENV)
        merged.update(self.env)
        return merged
