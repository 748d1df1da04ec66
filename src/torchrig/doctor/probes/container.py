"""Container and limits: are we in a container, /dev/shm, the memlock and stack ulimits, cgroup CPU and memory
limits; and on a host, the Docker engine (through its Engine API socket), its runtimes, the NVIDIA Container
Toolkit and CDI specs.
"""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchrig.doctor.facts import ContainerFacts, DockerFacts, ProbeStatus
from torchrig.inputfiles import read_proc

CGROUP_HINTS = {
    "docker": "docker",
    "kubepods": "kubernetes",
    "containerd": "containerd",
    "libpod": "podman",
    "lxc": "lxc",
    "crio": "cri-o",
}
OVERLAY_FS = (
    "overlay",
    "fuse-overlayfs",
    "aufs",
    "zfs",
    "btrfs",
)  # root fs types of image-layered containers
TOOLKIT_BINARIES = (
    "nvidia-ctk",
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
    "nvidia-container-cli",
)
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def _read(path: str | Path) -> str | None:
    return read_proc(path, max_bytes=4 * 2**20)  # mountinfo of a host with thousands of mounts fits


def root_fs_type() -> str | None:
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and len(fields) >= 5 and fields[4] == "/":
            return right.split()[0]
    return None


def detect_container(env: Mapping[str, str]) -> tuple[bool, str | None, tuple[str, ...]]:
    """What ``systemd-detect-virt --container`` answers, from files any user can read."""
    evidence: list[str] = []
    runtime = None
    if os.path.exists("/run/.containerenv"):
        evidence.append("/run/.containerenv exists (podman)")
        runtime = "podman"
    if env.get("KUBERNETES_SERVICE_HOST"):
        evidence.append("KUBERNETES_SERVICE_HOST is set")
        runtime = runtime or "kubernetes"
    cgroup = _read("/proc/1/cgroup") or ""
    for hint, name in CGROUP_HINTS.items():
        if f"/{hint}" in cgroup:
            evidence.append(f"/proc/1/cgroup names {hint}")
            runtime = runtime or name
            break
    fs = root_fs_type()
    if os.path.exists("/.dockerenv"):
        if fs in OVERLAY_FS:
            evidence.append(f"/.dockerenv exists and / is {fs}")
            runtime = runtime or "docker"
        elif not evidence:
            # A VM or host built from a container image keeps /.dockerenv; its root is a block device.
            return (
                False,
                None,
                (f"/.dockerenv exists but / is {fs or 'unknown'} (a host or VM made from an image)",),
            )
    return bool(evidence), runtime, tuple(evidence)


def _limit(which: int) -> tuple[int | None, bool | None]:
    try:
        soft, _hard = resource.getrlimit(which)
    except (OSError, ValueError):
        return None, None
    return (None, True) if soft == resource.RLIM_INFINITY else (int(soft), False)


def _own_cgroup(controller: str) -> str:
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (controller in parts[1].split(",") or (controller == "" and parts[0] == "0")):
            return parts[2]
    return "/"


def cgroup_limits() -> tuple[int | None, float | None, int | None]:
    """(cgroup version, CPU limit in cores, memory limit in bytes); limits None when unlimited or unknown."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        base = "/sys/fs/cgroup" + _own_cgroup("").rstrip("/")
        cpu_max = _read(f"{base}/cpu.max") or _read("/sys/fs/cgroup/cpu.max")
        mem_max = _read(f"{base}/memory.max") or _read("/sys/fs/cgroup/memory.max")
        cores = None
        if cpu_max and not cpu_max.startswith("max"):
            q, per = cpu_max.split()[:2]
            cores = int(q) / int(per)
        return 2, cores, int(mem_max) if mem_max and mem_max.strip().isdigit() else None
    quota = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or _read(
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"
    )
    period = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") or _read(
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"
    )
    mem = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if quota is None and mem is None:
        return None, None, None
    cores = int(quota) / int(period) if quota and period and int(quota) > 0 else None
    mem_bytes = (
        int(mem) if mem and mem.strip().isdigit() and int(mem) < 2**62 else None
    )  # 2^63-4096 = unlimited
    return 1, cores, mem_bytes


def _mem_total() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def probe_container(env: Mapping[str, str] | None = None) -> ContainerFacts:
    env = os.environ if env is None else env
    inside, runtime, evidence = detect_container(env)
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_blocks * st.f_frsize
    except OSError:
        shm = None
    memlock, memlock_unlimited = _limit(resource.RLIMIT_MEMLOCK)
    stack, stack_unlimited = _limit(resource.RLIMIT_STACK)
    version, cores, mem = cgroup_limits()
    # RDMA verbs devices this process can use (what NCCL's IB transport opens); /sys/class/infiniband would
    # also list a host's adapters inside a container that was given none.
    rdma = tuple(sorted(glob.glob("/dev/infiniband/uverbs*")))
    return ContainerFacts(
        ProbeStatus.OK,
        in_container=inside,
        runtime=runtime,
        evidence=evidence,
        shm_bytes=shm,
        memlock_bytes=memlock,
        memlock_unlimited=memlock_unlimited,
        stack_bytes=stack,
        stack_unlimited=stack_unlimited,
        cgroup_version=version,
        cgroup_cpu_limit=cores,
        cgroup_memory_limit_bytes=mem,
        cpu_count=os.cpu_count(),
        memory_total_bytes=_mem_total(),
        rdma_devices=rdma,
    )


def engine_get(path: str, endpoint: str, timeout_s: float = 3.0) -> dict[str, Any]:
    """``GET endpoint`` of the Docker Engine API over the unix socket (HTTP/1.0, so the reply ends at EOF;
    plain sockets keep doctor's start-up free of http.client and ssl). OSError when it does not answer 200."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(f"GET {endpoint} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200 " not in f"{status} ":
        raise OSError(f"GET {endpoint} answered {status!r}")
    return dict(json.loads(body))


def engine_info(path: str, timeout_s: float = 3.0) -> dict[str, Any]:
    """``docker info``: the Engine API's ``GET /info``."""
    return engine_get(path, "/info", timeout_s)


def docker_socket(env: Mapping[str, str] | None = None) -> str | None:
    """The local Docker engine socket's path (``DOCKER_HOST`` or the default), None when it is not local."""
    env = os.environ if env is None else env
    host = env.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host[len("unix://") :] if host.startswith("unix://") else None


def cdi_specs(dirs: tuple[str, ...] = CDI_DIRS) -> tuple[str, ...]:
    """CDI spec files that declare NVIDIA GPUs (``nvidia-ctk cdi list``)."""
    found = []
    for d in dirs:
        for path in sorted(glob.glob(f"{d}/*.yaml") + glob.glob(f"{d}/*.json")):
            if "nvidia.com/gpu" in (_read(path) or ""):
                found.append(path)
    return tuple(found)


def probe_docker(env: Mapping[str, str] | None = None) -> DockerFacts:
    env = os.environ if env is None else env
    binaries = tuple(b for b in TOOLKIT_BINARIES if shutil.which(b, path=env.get("PATH")))
    specs = cdi_specs()
    host = env.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return DockerFacts(
            ProbeStatus.SKIPPED,
            error=f"DOCKER_HOST={host} is not a local socket",
            toolkit_binaries=binaries,
            cdi_specs=specs,
        )
    path = host[len("unix://") :]
    if not os.path.exists(path):
        return DockerFacts(
            ProbeStatus.MISSING,
            error=f"no Docker engine socket at {path}",
            toolkit_binaries=binaries,
            cdi_specs=specs,
        )
    try:
        info = engine_info(path)
    except PermissionError:
        return DockerFacts(
            ProbeStatus.DENIED,
            error=f"permission denied on {path} (not in the docker group?)",
            toolkit_binaries=binaries,
            cdi_specs=specs,
        )
    except (OSError, ValueError) as err:
        return DockerFacts(
            ProbeStatus.FAILED,
            error=f"Docker engine at {path}: {err}",
            toolkit_binaries=binaries,
            cdi_specs=specs,
        )
    return DockerFacts(
        ProbeStatus.OK,
        server_version=info.get("ServerVersion"),
        runtimes=tuple(sorted(info.get("Runtimes") or {})),
        default_runtime=info.get("DefaultRuntime"),
        cdi_spec_dirs=tuple(info.get("CDISpecDirs") or ()),
        cdi_specs=specs,
        toolkit_binaries=binaries,
    )
