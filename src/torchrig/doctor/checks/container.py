"""The container and the limits around it: GPU access, /dev/shm, memlock and stack, cgroups; and on a host,
whether Docker can hand GPUs to containers."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor import fixes
from torchrig.doctor.checks.common import Context, gib
from torchrig.doctor.facts import ProbeStatus
from torchrig.doctor.findings import Finding, Severity


def no_gpu_access(ctx: Context) -> Iterator[Finding]:
    """In a container with no /dev/nvidiaN: it was started without --gpus / the NVIDIA runtime / CDI."""
    c, k, e = ctx.facts.container, ctx.facts.kernel, ctx.facts.env
    if not ctx.in_container or k.wsl:
        return
    nvd = e.nvidia_visible_devices
    evidence = [
        f"container: {c.runtime or 'yes'} ({'; '.join(c.evidence)})",
        "/dev/nvidia*: " + (", ".join(sorted(ctx.node_paths)) or "none"),
        f"NVIDIA_VISIBLE_DEVICES: {'unset' if nvd is None else repr(nvd)}",
    ]
    if not ctx.gpu_nodes:
        if nvd in ("void", "none", ""):
            why = (
                f"NVIDIA_VISIBLE_DEVICES={nvd!r} tells the NVIDIA runtime to pass no GPU, and no /dev/nvidiaN "
                "device exists in this container"
            )
        elif nvd is None:
            why = (
                "no /dev/nvidiaN device exists in this container and NVIDIA_VISIBLE_DEVICES is unset: it was "
                "started without --gpus, the NVIDIA runtime or a CDI device"
            )
        else:
            why = (
                f"the image asks for GPUs (NVIDIA_VISIBLE_DEVICES={nvd}) but no /dev/nvidiaN device exists: the "
                "container was started without --gpus (or the NVIDIA runtime) so the request was ignored"
            )
        fix = [
            "docker run --gpus all ...   # Docker with the NVIDIA Container Toolkit",
            "docker run --device nvidia.com/gpu=all ...   # CDI (Docker 25+, podman: podman run --device nvidia.com/gpu=all)",
            "Kubernetes: resources.limits: {nvidia.com/gpu: 1} (needs the NVIDIA device plugin)",
        ]
        if c.runtime == "kubernetes":
            fix.insert(0, fix.pop())
        steps, _src = fixes.steps("container_toolkit_install", **ctx.os_args())
        fix.append("if the host lacks the NVIDIA Container Toolkit, install it there:")
        fix.extend(steps)
        yield Finding(
            "container.no_gpu_access",
            Severity.ERROR,
            "container started without GPU access",
            why,
            tuple(fix),
            tuple(evidence),
        )
    elif not ctx.driver_libs:
        yield Finding(
            "container.driver_libs_missing",
            Severity.ERROR,
            "GPU device nodes are here but the driver libraries are not",
            "the container got /dev/nvidia* (e.g. docker run --device /dev/nvidia0) but not libcuda.so.1 and "
            "libnvidia-ml.so.1, which the NVIDIA runtime mounts from the host driver",
            (
                "docker run --gpus all ...   # instead of --device /dev/nvidia*",
                "docker run --device nvidia.com/gpu=all ...   # CDI",
            ),
            tuple(evidence),
        )


def shm(ctx: Context) -> Iterator[Finding]:
    size = ctx.facts.container.shm_bytes
    th = fixes.thresholds()
    floor = int(th["shm_min_bytes"])
    if size is None:
        return
    if size >= floor:
        yield Finding("limits.shm", Severity.OK, f"/dev/shm is {gib(size)}")
        return
    fix = (
        (
            "docker run --ipc=host ...   # or --shm-size=16g; Kubernetes: an emptyDir {medium: Memory} at /dev/shm",
        )
        if ctx.in_container
        else ("sudo mount -o remount,size=16G /dev/shm",)
    )
    yield Finding(
        "limits.shm",
        Severity.WARNING,
        f"/dev/shm is only {gib(size)}",
        f"DataLoader workers pass batches through /dev/shm and NCCL puts its intra-node buffers there; "
        f"below {gib(floor)} they die with 'bus error' / 'No space left on device' (Docker's default is 64 MB)",
        fix,
        (f"/dev/shm: {size} bytes", f"threshold {floor} bytes: {th['shm_source']}"),
    )


def memlock(ctx: Context) -> Iterator[Finding]:
    c = ctx.facts.container
    if c.memlock_unlimited is not False:
        return
    rdma = bool(c.rdma_devices)
    fix = (
        ("docker run --ulimit memlock=-1 ...",)
        if ctx.in_container
        else (
            "add '* soft memlock unlimited' and '* hard memlock unlimited' to /etc/security/limits.conf, then log in again",
        )
    )
    why = (
        "NCCL over InfiniBand/RoCE (GPUDirect RDMA) registers (locks) large buffers; a memlock limit makes it "
        "fail or fall back to slow paths"
    )
    yield Finding(
        "limits.memlock",
        Severity.WARNING if rdma else Severity.INFO,
        f"locked memory is limited to {gib(c.memlock_bytes)}" + ("" if rdma else " (matters only for RDMA)"),
        why,
        fix,
        (
            f"ulimit -l: {c.memlock_bytes} bytes",
            "RDMA devices: " + (", ".join(c.rdma_devices) or "none"),
            f"source: {fixes.thresholds()['memlock_source']}",
        ),
    )


def stack(ctx: Context) -> Iterator[Finding]:
    c = ctx.facts.container
    floor = int(fixes.thresholds()["stack_min_bytes"])
    if (
        ctx.in_container
        and c.stack_unlimited is False
        and c.stack_bytes is not None
        and c.stack_bytes < floor
    ):
        yield Finding(
            "limits.stack",
            Severity.INFO,
            f"stack limit is {gib(c.stack_bytes)}",
            f"NVIDIA's framework containers are started with a {gib(floor)} stack",
            (f"docker run --ulimit stack={floor} ...",),
            (f"ulimit -s: {c.stack_bytes} bytes",),
        )


def cgroup_limits(ctx: Context) -> Iterator[Finding]:
    c = ctx.facts.container
    parts = []
    if c.cgroup_cpu_limit is not None:
        parts.append(f"{c.cgroup_cpu_limit:g} CPUs (of {c.cpu_count})")
    if c.cgroup_memory_limit_bytes is not None:
        parts.append(f"{gib(c.cgroup_memory_limit_bytes)} memory (of {gib(c.memory_total_bytes)})")
    if parts:
        yield Finding(
            "limits.cgroup",
            Severity.INFO,
            "cgroup limits: " + ", ".join(parts),
            "DataLoader workers and torchrun ranks share these; size num_workers to the CPU limit, not os.cpu_count()",
            evidence=(f"cgroup v{c.cgroup_version}",),
        )


def docker_toolkit(ctx: Context) -> Iterator[Finding]:
    """On a GPU host with Docker: can the engine give containers GPUs?"""
    d = ctx.facts.docker
    if (
        ctx.in_container
        or d.status is not ProbeStatus.OK
        or not (ctx.driver_loaded or ctx.facts.kernel.pci_gpus)
    ):
        return
    evidence = (
        f"Docker {d.server_version}: runtimes {', '.join(d.runtimes) or 'none'} (default {d.default_runtime})",
        "toolkit binaries: " + (", ".join(d.toolkit_binaries) or "none"),
        "CDI specs with nvidia.com/gpu: " + (", ".join(d.cdi_specs) or "none"),
    )
    if "nvidia" in d.runtimes or d.cdi_specs or "nvidia-container-runtime-hook" in d.toolkit_binaries:
        how = (
            "--gpus all" if ("nvidia" in d.runtimes or d.toolkit_binaries) else "--device nvidia.com/gpu=all"
        )
        yield Finding(
            "docker.gpu_ready", Severity.OK, f"Docker can give containers GPUs ({how})", evidence=evidence
        )
        return
    steps, source = fixes.steps("container_toolkit_install", **ctx.os_args())
    yield Finding(
        "docker.no_nvidia_toolkit",
        Severity.WARNING,
        "Docker cannot give containers GPUs",
        "the NVIDIA Container Toolkit is not installed: 'docker run --gpus all' fails with "
        "'could not select device driver \"\" with capabilities: [[gpu]]'",
        (*steps, f"(source: {source})"),
        evidence,
    )
