"""The driver: installed, loaded, matching its libraries, with device nodes, nvidia_uvm and Fabric Manager."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor import fixes
from torchrig.doctor.checks.common import Context, branch
from torchrig.doctor.facts import ProbeStatus
from torchrig.doctor.findings import Finding, Severity

SHADOWED = ("driver.stub_library", "driver.library_mismatch", "driver.cuda_compat_mismatch")
UVM_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
RELOAD_MODULES = "sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia && sudo modprobe nvidia_uvm"


def _pci_evidence(ctx: Context) -> str:
    gpus = ctx.facts.kernel.pci_gpus
    if not gpus:
        return "PCI bus: no NVIDIA device (vendor 0x10de) found in /sys/bus/pci/devices"
    return "PCI bus: " + ", ".join(f"{d.bus_id} (device {d.device_id})" for d in gpus)


def _driver_absent_evidence(ctx: Context) -> tuple[str, ...]:
    k = ctx.facts.kernel
    return (
        "/proc/driver/nvidia/version: absent (no NVIDIA kernel module loaded)",
        f"libnvidia-ml.so.1: {k.nvml_library or 'not found'}; libcuda.so.1: {k.cuda_library or 'not found'}",
        "/dev/nvidia*: " + (", ".join(sorted(ctx.node_paths)) or "none"),
        f"NVML: {ctx.facts.nvml.error or ctx.facts.nvml.status.value}",
        _pci_evidence(ctx),
    )


def probe_failures(ctx: Context) -> Iterator[Finding]:
    f = ctx.facts
    for name, part in (("nvml", f.nvml), ("kernel", f.kernel), ("env", f.env), ("container", f.container)):
        if part.status is ProbeStatus.TIMEOUT:
            yield Finding(
                f"probe.{name}.timeout",
                Severity.WARNING,
                f"the {name} probe timed out",
                "a query hung; on a GPU host this usually means a wedged driver",
                ("sudo dmesg | grep -i -e NVRM -e Xid   # look for driver errors",),
                (getattr(part, "error", None) or "timeout",),
            )


def missing(ctx: Context) -> Iterator[Finding]:
    """No NVIDIA driver at all (kernel module, libraries and nodes all absent)."""
    k = ctx.facts.kernel
    if ctx.in_container or ctx.driver_loaded or ctx.driver_libs or k.module_installed_version:
        return
    if "nvidia" in k.modules_loaded:
        return
    if k.wsl:
        yield Finding(
            "driver.missing",
            Severity.ERROR,
            "no NVIDIA driver visible in WSL",
            "WSL 2 uses the Windows NVIDIA driver, which maps its libraries into /usr/lib/wsl/lib; "
            "/usr/lib/wsl/lib/libcuda.so.1 is absent, so the Windows driver is missing or too old",
            (
                "install the current NVIDIA driver for Windows (https://www.nvidia.com/Download/index.aspx), "
                "then run 'wsl --shutdown' in PowerShell",
                "do not install a Linux NVIDIA driver inside WSL",
            ),
            _driver_absent_evidence(ctx),
        )
        return
    if not k.pci_gpus:
        yield Finding(
            "driver.no_gpu",
            Severity.INFO,
            "no NVIDIA GPU on this machine: CUDA is not available, PyTorch runs on the CPU",
            "no NVIDIA device is on the PCI bus and no NVIDIA driver is installed; a CPU build of PyTorch is "
            "the one that works here",
            (
                "torchrig resolve   # without --gpu: the pip command of the CPU build for this machine",
                "for CUDA: a machine with an NVIDIA GPU (on a cloud VM: a GPU instance type, or attach one), "
                "then run torchrig doctor there",
            ),
            _driver_absent_evidence(ctx),
        )
        return
    steps, source = fixes.steps("driver_install", **ctx.os_args())
    cause = (
        "no NVIDIA kernel module is loaded or installed, and the driver's user-space libraries "
        "(libnvidia-ml, libcuda) are absent, so CUDA has nothing to talk to"
    )
    distro = k.os_pretty or k.os_id or "this distribution"
    yield Finding(
        "driver.missing",
        Severity.ERROR,
        "no NVIDIA driver",
        cause,
        (*steps, f"(commands for {distro}; source: {source})"),
        _driver_absent_evidence(ctx),
    )


def module_not_loaded(ctx: Context) -> Iterator[Finding]:
    """The driver is installed (libraries or module on disk) but the kernel module is not loaded."""
    k = ctx.facts.kernel
    if (
        ctx.in_container
        or k.wsl
        or k.module_version is not None
        or ctx.has("driver.missing", "driver.no_gpu")
    ):
        return
    if not (ctx.driver_libs or k.module_installed_version):
        return
    steps = []
    why = "the NVIDIA driver is installed but its kernel module is not loaded, so there is no /proc/driver/nvidia"
    if "nouveau" in k.modules_loaded:
        why += "; the open-source nouveau module holds the GPU and blocks it"
        steps += [
            "echo -e 'blacklist nouveau\\noptions nouveau modeset=0' | sudo tee /etc/modprobe.d/blacklist-nouveau.conf",
            "sudo update-initramfs -u   # dracut -f on RHEL/Fedora",
            "sudo reboot",
        ]
    elif k.module_installed_version is None:
        why += (
            f"; modinfo finds no nvidia module for the running kernel {k.kernel_release}: it was not "
            "built for it (a kernel update without the matching headers/DKMS build)"
        )
        steps += [
            "sudo apt-get install -y linux-headers-$(uname -r) && sudo dkms autoinstall   "
            "# dnf install kernel-devel-$(uname -r) on RHEL",
            "sudo modprobe nvidia && nvidia-smi",
        ]
    else:
        steps += [
            "sudo modprobe nvidia && nvidia-smi",
            "sudo dmesg | grep -i -e nvidia -e NVRM   # if modprobe fails",
        ]
        if k.secure_boot:
            why += "; Secure Boot is on, and an unsigned module is refused"
            steps.append(
                "sign the module (enroll the DKMS key: sudo mokutil --import /var/lib/dkms/mok.pub) or "
                "disable Secure Boot"
            )
    yield Finding(
        "driver.module_not_loaded",
        Severity.ERROR,
        "NVIDIA driver installed but its kernel module is not loaded",
        why,
        tuple(steps),
        (
            f"libnvidia-ml.so.1: {k.nvml_library or 'not found'} (version {k.nvml_library_version or '?'})",
            f"modinfo nvidia: {k.module_installed_version or 'no module for ' + str(k.kernel_release)}",
            "loaded modules: " + (", ".join(k.modules_loaded) or "none of nvidia*/nouveau"),
            f"Secure Boot: {'on' if k.secure_boot else 'off' if k.secure_boot is False else 'unknown'}",
        ),
    )


def version_mismatch(ctx: Context) -> Iterator[Finding]:
    """NVML/driver version mismatch: the libraries were upgraded but the old kernel module is still loaded."""
    k, nv = ctx.facts.kernel, ctx.facts.nvml
    if ctx.has(*SHADOWED):  # a library off the loader's path explains it; a reboot would not help
        return
    nvml_says = bool(nv.error and "version mismatch" in nv.error.lower())
    differ = bool(k.module_version and k.nvml_library_version and k.module_version != k.nvml_library_version)
    if not (nvml_says or differ):
        return
    fix: tuple[str, ...] = (
        "sudo reboot   # loads the new kernel module",
        f"or, with no process using the GPU: {RELOAD_MODULES}",
    )
    if ctx.in_container:
        fix = (
            "on the host: sudo reboot (the host's kernel module is older than the libraries mounted here)",
        )
    yield Finding(
        "driver.version_mismatch",
        Severity.ERROR,
        "NVML/driver version mismatch (driver upgraded without a reboot)",
        f"the loaded kernel module is {k.module_version or '?'} but the user-space libraries are "
        f"{k.nvml_library_version or '?'}; NVML and CUDA refuse to run until they match",
        fix,
        (
            f"/proc/driver/nvidia/version: {k.module_version or '?'}",
            f"{k.nvml_library or 'libnvidia-ml.so.1'}: {k.nvml_library_version or '?'}",
            f"NVML: {nv.error or nv.status.value}",
        ),
    )


def device_nodes(ctx: Context) -> Iterator[Finding]:
    """The module is loaded but /dev/nvidia* nodes are missing or not accessible."""
    k = ctx.facts.kernel
    if ctx.in_container or k.wsl or k.module_version is None:
        return
    nodes = ctx.node_paths
    missing = [p for p in ("/dev/nvidiactl",) if p not in nodes] + (
        [] if ctx.gpu_nodes else ["/dev/nvidia0.."]
    )
    if missing:
        yield Finding(
            "driver.device_nodes_missing",
            Severity.ERROR,
            "NVIDIA device nodes are missing",
            "the kernel module is loaded but " + ", ".join(missing) + " do not exist (normally created "
            "by udev or nvidia-modprobe); CUDA opens them to reach the GPU",
            (
                "sudo nvidia-modprobe -c 0 -u   # creates /dev/nvidiactl, /dev/nvidia0 and /dev/nvidia-uvm",
                "or: sudo nvidia-smi   # run once as root, it creates the nodes",
            ),
            ("/dev/nvidia*: " + (", ".join(sorted(nodes)) or "none"), f"kernel module {k.module_version}"),
        )
        return
    denied = [
        n.path
        for n in k.device_nodes
        if not n.accessible and n.path.startswith("/dev/nvidia") and not n.path.startswith("/dev/nvidia-caps")
    ]
    if denied and not set(denied) <= set(UVM_NODES):  # the uvm nodes alone: uvm_node names them
        yield Finding(
            "driver.device_nodes_denied",
            Severity.ERROR,
            "no permission to open the NVIDIA device nodes",
            "this user cannot open " + ", ".join(denied) + " read-write, so CUDA finds no device",
            (
                "ls -l /dev/nvidia*   # see their group and mode",
                "sudo usermod -aG video $USER && newgrp video   # if they belong to group video",
            ),
            tuple(f"{p}: not readable+writable" for p in denied),
        )


def _uvm_node_problem(ctx: Context) -> str | None:
    """What is wrong with /dev/nvidia-uvm as listed before CUDA's first use ("missing", "refused ..."), or None."""
    k = ctx.facts.kernel
    node = next((n for n in k.device_nodes if n.path == UVM_NODES[0]), None)
    if node is None:
        return "missing"
    if not node.accessible:
        return "not readable and writable for this user"
    return k.uvm_node_error


def uvm_node(ctx: Context) -> Iterator[Finding]:
    """The nvidia_uvm module is loaded but /dev/nvidia-uvm is missing or cannot be opened: CUDA opens it when it
    starts and fails with 'unknown error' (999) or 'no CUDA-capable device' (100)."""
    k, t = ctx.facts.kernel, ctx.facts.torch
    if (
        k.wsl
        or k.module_version is None
        or ctx.has("driver.device_nodes_missing", "driver.device_nodes_denied", "container.no_gpu_access")
    ):
        return
    # /proc/modules may be unreadable (then it lists no nvidia at all): judge by the device node alone
    if "nvidia" in k.modules_loaded and "nvidia_uvm" not in k.modules_loaded:
        return  # the module itself is missing: driver.uvm
    problem = _uvm_node_problem(ctx)
    if problem is None:
        return
    row = fixes.load()["uvm_node"]
    evidence = [
        "/dev/nvidia*: " + (", ".join(sorted(ctx.node_paths)) or "none") + " (listed before CUDA started)",
        f"nvidia_uvm loaded: {'yes' if 'nvidia_uvm' in k.modules_loaded else 'unknown'}",
        *((f"/dev/nvidia-uvm: {k.uvm_node_error}",) if k.uvm_node_error else ()),
    ]
    ran = bool(t.is_available and t.devices and all(d.kernel_ok for d in t.devices))
    if ran:
        # CUDA's first use recreates the node through nvidia-modprobe (setuid root) where that is installed:
        # what broke nothing here breaks a container given the host's nodes at its start
        yield Finding(
            "driver.uvm_node_missing",
            Severity.WARNING,
            f"/dev/nvidia-uvm was {problem} (CUDA ran all the same)",
            f"/dev/nvidia-uvm was {problem} when doctor started, yet CUDA then ran kernels: the driver's first "
            "use recreates the node through nvidia-modprobe where that is installed; a container started with "
            "the host's device nodes before that, or a machine without nvidia-modprobe, fails with 'unknown "
            "error' (999) instead",
            (*row["host"], f"(source: {row['source']})"),
            (*evidence, f"torch ran a kernel on {len(t.devices)} GPU(s)"),
        )
        return
    why = ""
    if ctx.in_container:
        why = (
            ": the container was started without it (a --device list that lacks it)"
            if problem == "missing"
            else ": the container's device rules refuse it (a --device list or CDI spec without it, or with "
            "another major number than the host's)"
        )
    yield Finding(
        "driver.uvm_node_missing",
        Severity.ERROR,
        f"/dev/nvidia-uvm is {problem}: CUDA cannot start",
        f"/dev/nvidia-uvm is {problem} in this {'container' if ctx.in_container else 'machine'}{why}; CUDA "
        "opens it (Unified Memory, the nvidia_uvm module) when it initialises and fails with 'unknown error' "
        "(999) or 'no CUDA-capable device' (100) without it",
        (*row["container" if ctx.in_container else "host"], f"(source: {row['source']})"),
        (*evidence, *((f"torch: {t.init_error}",) if t.init_error else ())),
    )


def uvm(ctx: Context) -> Iterator[Finding]:
    """nvidia_uvm not loaded, or loaded with its node in place but wedged (CUDA error 999 after suspend/resume).
    Its node missing or refused with the module loaded is :func:`uvm_node`."""
    k, t = ctx.facts.kernel, ctx.facts.torch
    if (
        k.wsl
        or k.module_version is None
        or ctx.has("driver.device_nodes_missing", "container.no_gpu_access", "driver.uvm_node_missing")
    ):
        return
    node = UVM_NODES[0] in ctx.node_paths
    # /proc/modules may be unreadable (then it lists no nvidia at all): judge by the device node alone
    loaded = "nvidia_uvm" in k.modules_loaded or "nvidia" not in k.modules_loaded
    err = t.init_error or ""
    unknown = "unknown error" in err.lower() or "error 999" in err.lower()
    if loaded and node and not unknown:
        return
    ran = bool(t.is_available and t.devices and all(d.kernel_ok for d in t.devices))
    evidence = (
        f"nvidia_uvm loaded: {'yes' if loaded else 'no'}",
        f"/dev/nvidia-uvm: {'present' if node else 'absent'}",
    )
    if ran and not loaded:
        yield Finding(
            "driver.uvm",
            Severity.WARNING,
            "nvidia_uvm was not loaded (CUDA ran all the same)",
            "the module was not loaded when doctor looked, yet CUDA ran kernels: the driver's first use loads it "
            "through nvidia-modprobe where that is installed; a container or a machine without nvidia-modprobe "
            "fails with 'unknown error' (999) instead",
            ("sudo nvidia-modprobe -u -c=0   # loads nvidia_uvm and creates /dev/nvidia-uvm now",),
            (*evidence, f"torch ran a kernel on {len(t.devices)} GPU(s)"),
        )
        return
    if not loaded:
        fix: tuple[str, ...] = ("sudo modprobe nvidia_uvm && sudo nvidia-modprobe -u -c=0",)
        if ctx.in_container:
            fix = (
                "on the host: sudo modprobe nvidia_uvm && sudo nvidia-modprobe -u -c=0, then restart the container",
            )
        summary = "nvidia_uvm is not available"
        cause = (
            "the nvidia_uvm module is not loaded; CUDA needs Unified Memory (nvidia_uvm) to initialise and "
            "fails with 'unknown error' (999)"
        )
    else:
        summary = "nvidia_uvm is in a bad state (CUDA unknown error 999)"
        cause = (
            "the driver and nvidia_uvm are loaded but CUDA initialisation fails with 'unknown error'; the "
            "usual cause is a suspend/resume that left nvidia_uvm wedged"
        )
        fix = (
            "sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm   # with no CUDA process running",
            "or: sudo reboot",
        )
    yield Finding(
        "driver.uvm",
        Severity.ERROR,
        summary,
        cause,
        fix,
        (*evidence, *((f"torch: {err}",) if err else ())),
    )


def nvml_failed(ctx: Context) -> Iterator[Finding]:
    """NVML is installed and the driver loaded, but nvmlInit fails for another reason."""
    nv = ctx.facts.nvml
    if nv.status not in (ProbeStatus.FAILED, ProbeStatus.DENIED) or ctx.has(
        "driver.version_mismatch",
        "container.no_gpu_access",
        "driver.module_not_loaded",
        "driver.missing",
        "driver.device_nodes_denied",  # NVML says "Insufficient Permissions": the nodes are the cause
        "driver.device_nodes_missing",
        *SHADOWED,
    ):
        return
    if not ctx.driver_loaded and not ctx.driver_libs:
        return
    fix: tuple[str, ...] = ("nvidia-smi   # shows the same error", "sudo dmesg | grep -i -e NVRM -e Xid")
    if ctx.in_container and "unknown error" in (nv.error or "").lower():
        fix = (
            "restart the container (a host 'systemctl daemon-reload' can revoke its GPU device access)",
            "long-term, on the host: run containers with the NVIDIA runtime's CDI mode (nvidia-ctk cdi generate)",
        )
    yield Finding(
        "driver.nvml_failed",
        Severity.ERROR,
        "NVML cannot talk to the driver",
        f"nvmlInit failed: {nv.error}",
        fix,
        (f"NVML: {nv.error}",),
    )


def fabric_manager(ctx: Context) -> Iterator[Finding]:
    """NVSwitch systems need Fabric Manager running before CUDA works (else CUDA error 802)."""
    k, nv, t = ctx.facts.kernel, ctx.facts.nvml, ctx.facts.torch
    unready = [g for g in nv.gpus if g.fabric_state in ("not_started", "in_progress")]
    fm_down = bool(k.pci_nvswitches) and k.fabric_manager in ("inactive", "failed", "not_installed")
    err802 = "802" in (t.init_error or "") or "system not yet initialized" in (t.init_error or "").lower()
    if not (unready or fm_down or err802):
        return
    cuda_runs = bool(t.is_available and t.devices and all(d.kernel_ok for d in t.devices))
    if cuda_runs:  # CUDA ran kernels, so the fabric state does not block it (e.g. a VM's partition)
        yield Finding(
            "driver.fabric_state",
            Severity.INFO,
            "NVSwitch fabric registration is not complete, but CUDA runs",
            "NVML reports the GPU fabric as not (yet) set up by Fabric Manager; peer traffic over NVSwitch may "
            "be unavailable until it is",
            ("nvidia-smi -q | grep -A3 -i fabric",),
            tuple(f"GPU {g.index}: fabric state {g.fabric_state}" for g in unready),
        )
        return
    drv = ctx.driver_version
    if k.fabric_manager == "not_installed" or (not k.fabric_manager and not ctx.in_container):
        fix: tuple[str, ...] = (
            f"sudo apt-get install -y nvidia-fabricmanager-{branch(drv) or '<branch>'}   # NVIDIA's repository; "
            f"its version must equal the driver's ({drv or '?'})",
            "sudo systemctl enable --now nvidia-fabricmanager",
        )
    else:
        fix = (
            "sudo systemctl restart nvidia-fabricmanager && systemctl status nvidia-fabricmanager",
            f"journalctl -u nvidia-fabricmanager   # a version other than the driver's ({drv or '?'}) refuses to start",
        )
    if ctx.in_container:
        fix = tuple(f"on the host: {f}" for f in fix)
    evidence = [f"GPU {g.index}: fabric state {g.fabric_state}" for g in unready]
    if k.pci_nvswitches:
        evidence.append(
            f"{len(k.pci_nvswitches)} NVSwitch(es) on the PCI bus; nvidia-fabricmanager: {k.fabric_manager or 'unknown'}"
        )
    if err802:
        evidence.append(f"torch: {t.init_error}")
    yield Finding(
        "driver.fabric_manager",
        Severity.ERROR,
        "NVSwitch fabric not initialised: Fabric Manager is missing or stopped",
        "on NVSwitch (HGX) systems the GPUs only accept CUDA work after Fabric Manager has set up the "
        "NVLink fabric; until then CUDA fails with error 802 'system not yet initialized'",
        fix,
        tuple(evidence),
    )


def ok(ctx: Context) -> Iterator[Finding]:
    nv = ctx.facts.nvml
    if nv.status is ProbeStatus.OK and not ctx.blocking():
        flavor = ctx.facts.kernel.module_flavor
        yield Finding(
            "driver.ok",
            Severity.OK,
            f"driver {nv.driver_version or 'of unknown version'} ({flavor + ' kernel module, ' if flavor else ''}"
            f"{'CUDA ' + nv.cuda_driver_version if nv.cuda_driver_version else 'CUDA version unknown'}), "
            f"{len(nv.gpus)} GPU(s) visible to NVML",
            evidence=tuple(
                f"GPU {g.index}: {g.name or 'name unknown'}, "
                + (f"{g.memory_total_mib} MiB" if g.memory_total_mib is not None else "memory unknown")
                + f", cc {g.compute_capability or 'unknown'}, {g.pci_bus_id or 'bus id unknown'}"
                for g in nv.gpus
            ),
        )


def nvml_bindings(ctx: Context) -> Iterator[Finding]:
    nv = ctx.facts.nvml
    if nv.status is ProbeStatus.MISSING and "not installed" in (nv.error or "") and ctx.has_gpu_hardware:
        yield Finding(
            "driver.nvml_bindings_missing",
            Severity.WARNING,
            "nvidia-ml-py is not installed: GPU health, MIG and P2P checks were skipped",
            "doctor reads GPU facts through NVML's Python bindings (module pynvml)",
            ("pip install nvidia-ml-py   # or: pip install 'torchrig[nvml]'",),
            (nv.error or "",),
        )
