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

from torchrig import inputfiles
from torchrig.doctor.facts import (
    DeviceNode,
    DriverLibrary,
    KernelFacts,
    PciDevice,
    ProbeStatus,
    driver_version_in,
)
from torchrig.errors import InputError
from torchrig.inputfiles import read_head, read_proc

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
DRIVER_SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1")
# Where NVIDIA's forward-compatibility package puts its libcuda: /usr/local/cuda-X.Y/compat (the
# cuda-compat-X-Y package; https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html).
COMPAT_GLOBS = ("/usr/local/cuda/compat", "/usr/local/cuda-*/compat")
# A driver's libcuda is tens of MB and its libnvidia-ml about 2 MB; the toolkit's link-time stubs
# (lib64/stubs/libcuda.so, libnvidia-ml.so) are well under this.
STUB_MAX_BYTES = 512 * 1024
_XID_RE = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)")
MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem", "nouveau")
UVM_NODE = "/dev/nvidia-uvm"


def _read(path: str | Path) -> str | None:
    return read_proc(path, max_bytes=4 * 2**20)  # /proc/modules, os-release, a PCI attribute: far smaller


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
    return driver_version_in(first), ("open" if "Open Kernel Module" in first else "proprietary")


def loaded_modules() -> tuple[str, ...]:
    """``lsmod | grep -E 'nvidia|nouveau'`` from /proc/modules (global, also seen inside containers)."""
    text = _read("/proc/modules") or ""
    names = {line.split()[0] for line in text.splitlines() if line.strip()}
    return tuple(m for m in MODULES if m in names)


def device_nodes() -> tuple[DeviceNode, ...]:
    """``ls -l /dev/nvidia*`` with whether this user may open each node read-write (by its mode bits)."""
    return tuple(DeviceNode(p, ok) for p, ok in inputfiles.device_nodes(("/dev/nvidia*", "/dev/dxg")))


def uvm_major() -> int | None:
    """``grep nvidia-uvm /proc/devices``: the major number the loaded nvidia_uvm module was given."""
    for line in (_read("/proc/devices") or "").splitlines():
        number, _, name = line.strip().partition(" ")
        if name.strip() == "nvidia-uvm" and number.isdigit():
            return int(number)
    return None


def uvm_node_error(nodes: tuple[DeviceNode, ...]) -> str | None:
    """Why ``/dev/nvidia-uvm`` is no use to CUDA though it is listed; None where it opens read-write as
    nvidia-uvm, or is absent. Its mode bits may allow what a container's device cgroup refuses, and a node
    made with another major number (a CDI spec written with a fixed one, NVIDIA/nvidia-container-toolkit#1934)
    opens another device: only the open and the number tell."""
    if not any(n.path == UVM_NODE for n in nodes):
        return None
    number, major = inputfiles.char_device_number(UVM_NODE), uvm_major()
    if number is None:
        return "not a character device"
    if major is not None and number[0] != major:
        return f"another device ({number[0]}:{number[1]}), not nvidia-uvm (major {major} in /proc/devices)"
    error = inputfiles.device_open_error(UVM_NODE)
    return f"refused when opened read-write ({error})" if error else None


def find_library(soname: str, cache: dict[str, list[str]] | None = None) -> tuple[str | None, str | None]:
    """Where the dynamic loader would find ``soname`` (``ldconfig -p``; ``cache``: its listing, already read by
    :func:`ld_cache`), and the version in the real file name."""
    path = None
    for d in LIB_DIRS:
        if os.path.exists(os.path.join(d, soname)):
            path = os.path.join(d, soname)
            break
    if path is None:
        path = next(iter((ld_cache() if cache is None else cache).get(soname, [])), None)
    if path is None:
        return None, None
    real = os.path.realpath(path)
    return real, driver_version_in(os.path.basename(real))


def _driver_library(soname: str, path: str, origin: str) -> DriverLibrary:
    real = os.path.realpath(path)
    try:
        size: int | None = os.stat(real).st_size
    except OSError:
        size = None
    stub = "/stubs/" in f"{path}/" or "/stubs/" in real or (size is not None and size < STUB_MAX_BYTES)
    return DriverLibrary(soname, path, real, driver_version_in(os.path.basename(real)), origin, size, stub)


def ld_cache(text: str | None = None) -> dict[str, list[str]]:
    """``ldconfig -p``: soname -> paths in the cache's order (what the loader uses after LD_LIBRARY_PATH)."""
    out: dict[str, list[str]] = {}
    listing = _run(["ldconfig", "-p"]) if text is None else text
    for line in (listing or "").splitlines():
        name, arrow, path = line.strip().partition("=>")
        if arrow:
            out.setdefault(name.split(" ", 1)[0], []).append(path.strip())
    return out


def driver_libraries(
    ld_library_path: str | None = None, cache: dict[str, list[str]] | None = None
) -> tuple[DriverLibrary, ...]:
    """Every ``libcuda.so.1`` / ``libnvidia-ml.so.1`` where the loader looks, in its order (ld.so(8)):
    ``LD_LIBRARY_PATH``, then ``/etc/ld.so.cache``, then the default directories; then the CUDA
    forward-compatibility package's copies, which load only when one of those points at them.
    ``ls -l $(ldconfig -p | grep -e libcuda.so.1 -e libnvidia-ml.so.1)`` and ``ls /usr/local/cuda*/compat``."""
    env = os.environ.get("LD_LIBRARY_PATH", "") if ld_library_path is None else ld_library_path
    cache = ld_cache() if cache is None else cache
    found: list[DriverLibrary] = []
    seen: set[str] = set()
    for soname in DRIVER_SONAMES:
        places = [(os.path.join(d, soname), "ld_library_path") for d in env.split(":") if d]
        places += [(p, "ld_cache") for p in cache.get(soname, [])]
        places += [(os.path.join(d, soname), "default_dir") for d in LIB_DIRS]
        places += [(os.path.join(d, soname), "compat") for g in COMPAT_GLOBS for d in sorted(glob.glob(g))]
        for path, origin in places:
            key = os.path.normpath(path)
            if key in seen or not os.path.exists(path):
                continue
            seen.add(key)
            found.append(_driver_library(soname, path, origin))
    return tuple(found)


def xid_events(text: str) -> tuple[str, ...]:
    """The kernel log's ``NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.`` lines (the
    last 20), trimmed to the message."""
    lines = [ln.strip() for ln in text.splitlines() if _XID_RE.search(ln)]
    return tuple(ln[ln.index("NVRM: Xid") :][:300] for ln in lines[-20:])


def kernel_log() -> tuple[tuple[str, ...] | None, str | None]:
    """``dmesg | grep 'NVRM: Xid'``: the Xid events, or None and why the log could not be read (dmesg needs
    CAP_SYSLOG where kernel.dmesg_restrict=1, and a container rarely has it)."""
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=3.0, errors="replace")
    except FileNotFoundError:
        return None, "dmesg is not installed"
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"dmesg: {err}"
    if proc.returncode != 0:
        return None, (proc.stderr.strip().splitlines() or [f"dmesg exited {proc.returncode}"])[-1][:200]
    return xid_events(proc.stdout), None


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
            data = read_head(path, "EFI variable", max_bytes=64)  # 4 attribute bytes, then the value
        except InputError:
            return None
        return bool(data[4]) if len(data) > 4 else None
    return None


def probe_kernel(nodes: tuple[DeviceNode, ...] | None = None) -> KernelFacts:
    """The kernel side. ``nodes``: ``/dev/nvidia*`` as listed before anything used CUDA (:func:`collect`
    lists them first); listed here otherwise."""
    version, flavor = module_version()
    pci_gpus, pci_switches = pci_devices()
    nodes = device_nodes() if nodes is None else nodes
    has_switch = bool(pci_switches) or any("nvswitch" in n.path for n in nodes)
    proc_version = (_read("/proc/version") or "").lower()
    wsl = "microsoft" in proc_version or "wsl" in proc_version
    cache = ld_cache()  # one ldconfig -p for every library looked up
    nvml_lib, nvml_lib_version = find_library("libnvidia-ml.so.1", cache)
    cuda_lib, cuda_lib_version = find_library("libcuda.so.1", cache)
    installed = None
    if version is None:  # only worth a subprocess when the module is not loaded
        out = _run(["modinfo", "-F", "version", "nvidia"])
        installed = out.strip() or None if out else None
    rel = os_release()
    xids, log_error = kernel_log() if version is not None else (None, None)
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
        driver_libraries=driver_libraries(cache=cache),
        xid_events=xids,
        kernel_log_error=log_error,
        uvm_node_error=uvm_node_error(nodes),
    )
