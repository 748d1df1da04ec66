"""The kernel side: the NVIDIA kernel module and its device nodes, the user-space driver libraries, the GPUs
on the PCI bus, Fabric Manager on NVSwitch systems, WSL, and the distribution (for fix commands).

Everything here reads ``/proc``, ``/sys`` and ``/dev``; the only subprocesses (``ldconfig -p``, ``modinfo``,
``systemctl``) run with a short timeout and a missing one just leaves its field unknown.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import subprocess
from pathlib import Path

from torchrig.doctor.facts import DeviceNode, KernelFacts, PciDevice, ProbeStatus

NVIDIA_PCI_VENDOR = "0x10de"
# PCI class codes (PCI Code and ID Assignment spec): 0x0300 VGA, 0x0302 3D controller -> GPUs;
# 0x0680 "other bridge" is how NVSwitch enumerates.
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
)
MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem", "nouveau")
_VERSION_RE = re.compile(r"\b(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b")


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def _run(argv: list[str], timeout_s: float = 2.0) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def os_release(root: str = "/") -> dict[str, str]:
    text = _read(Path(root, "etc/os-release")) or _read(Path(root, "usr/lib/os-release")) or ""
    out = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            out[key.strip()] = value.strip().strip('"')
    return out


def module_version() -> tuple[str | None, str | None]:
    """``cat /proc/driver/nvidia/version``: the loaded kernel module's version and flavour."""
    text = _read("/proc/driver/nvidia/version")
    if not text:
        return None, None
    first = text.splitlines()[0]
    m = _VERSION_RE.search(first)
    return (m.group(1) if m else None), ("open" if "Open Kernel Module" in first else "proprietary")


def loaded_modules() -> tuple[str, ...]:
    """``lsmod | grep -E 'nvidia|nouveau'`` from /proc/modules (global, also seen inside containers)."""
    text = _read("/proc/modules") or ""
    names = {line.split()[0] for line in text.splitlines() if line.strip()}
    return tuple(m for m in MODULES if m in names)


def device_nodes() -> tuple[DeviceNode, ...]:
    """``ls -l /dev/nvidia*`` with whether this user may open each node read-write."""
    paths = sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dxg"))
    return tuple(DeviceNode(p, os.access(p, os.R_OK | os.W_OK)) for p in paths if not os.path.isdir(p))


def find_library(soname: str) -> tuple[str | None, str | None]:
    """Where the dynamic loader would find ``soname`` (``ldconfig -p``), and the version in the real file name."""
    path = None
    for d in LIB_DIRS:
        if os.path.exists(os.path.join(d, soname)):
            path = os.path.join(d, soname)
            break
    if path is None:
        for line in (_run(["ldconfig", "-p"]) or "").splitlines():
            if line.strip().startswith(soname + " ") and "=>" in line:
                path = line.split("=>", 1)[1].strip()
                break
    if path is None:
        return None, None
    real = os.path.realpath(path)
    m = _VERSION_RE.search(os.path.basename(real))
    return real, (m.group(1) if m else None)


def pci_devices() -> tuple[tuple[PciDevice, ...], tuple[PciDevice, ...]]:
    """``lspci -d 10de:``: NVIDIA GPUs and NVSwitches on the PCI bus, from /sys (no driver needed)."""
    gpus, switches = [], []
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        if (_read(f"{dev}/vendor") or "").strip() != NVIDIA_PCI_VENDOR:
            continue
        klass = (_read(f"{dev}/class") or "").strip()
        rec = PciDevice(os.path.basename(dev), (_read(f"{dev}/device") or "").strip(), klass)
        if klass.startswith(GPU_CLASSES):
            gpus.append(rec)
        elif klass.startswith(NVSWITCH_CLASS):
            switches.append(rec)
    return tuple(gpus), tuple(switches)


def fabric_manager_state() -> str | None:
    """``systemctl is-active nvidia-fabricmanager``, or a running ``nv-fabricmanager`` process; None if unknowable."""
    for comm in glob.glob("/proc/[0-9]*/comm"):
        if (_read(comm) or "").strip().startswith("nv-fabricmanag"):
            return "active"
    out = _run(["systemctl", "show", "-p", "LoadState,ActiveState", "nvidia-fabricmanager"])
    if out is None:
        return None
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if props.get("LoadState") == "not-found":
        return "not_installed"
    return props.get("ActiveState") or None


def secure_boot() -> bool | None:
    """``mokutil --sb-state`` from the EFI variable (the 5th byte is the state)."""
    for path in glob.glob("/sys/firmware/efi/efivars/SecureBoot-*"):
        try:
            data = Path(path).read_bytes()
        except OSError:
            return None
        return bool(data[4]) if len(data) > 4 else None
    return None


def probe_kernel() -> KernelFacts:
    version, flavor = module_version()
    pci_gpus, pci_switches = pci_devices()
    nodes = device_nodes()
    has_switch = bool(pci_switches) or any("nvswitch" in n.path for n in nodes)
    proc_version = (_read("/proc/version") or "").lower()
    wsl = "microsoft" in proc_version or "wsl" in proc_version
    nvml_lib, nvml_lib_version = find_library("libnvidia-ml.so.1")
    cuda_lib, cuda_lib_version = find_library("libcuda.so.1")
    installed = None
    if version is None:  # only worth a subprocess when the module is not loaded
        out = _run(["modinfo", "-F", "version", "nvidia"])
        installed = out.strip() or None if out else None
    rel = os_release()
    return KernelFacts(
        ProbeStatus.OK,
        kernel_release=platform.release(),
        module_version=version,
        module_flavor=flavor,
        modules_loaded=loaded_modules(),
        module_installed_version=installed,
        device_nodes=nodes,
        nvml_library=nvml_lib,
        nvml_library_version=nvml_lib_version,
        cuda_library=cuda_lib,
        cuda_library_version=cuda_lib_version,
        pci_gpus=pci_gpus,
        pci_nvswitches=pci_switches,
        fabric_manager=fabric_manager_state() if has_switch else None,
        wsl=wsl,
        wsl_driver_libs=os.path.exists("/usr/lib/wsl/lib/libcuda.so.1") if wsl else None,
        secure_boot=secure_boot(),
        os_id=rel.get("ID"),
        os_version_id=rel.get("VERSION_ID"),
        os_like=tuple(rel.get("ID_LIKE", "").split()),
        os_pretty=rel.get("PRETTY_NAME"),
        machine=platform.machine() or None,
        tegra_release=next(iter((_read("/etc/nv_tegra_release") or "").splitlines()), None),
    )
