"""The environment variables that decide what CUDA sees, which libraries load and how NCCL connects; where each
is probably set (shell profiles, /etc/environment, NCCL's own config files, the container's start environment);
the network interfaces and InfiniBand devices they name; and the CUDA toolkit (nvcc).

Cheap by design: one pass over the environment, each profile file read once, two directory listings; no
subprocess per variable."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping

from torchrig.doctor.facts import EnvFacts, EnvVar, IbDevice, ProbeStatus
from torchrig.errors import InputError
from torchrig.inputfiles import read_head

# Libraries PyTorch's CUDA wheels ship in site-packages/nvidia/*/lib; the same names earlier on the search
# path (LD_LIBRARY_PATH beats the wheel's RUNPATH, see ld.so(8)) replace them.
CUDA_LIB_PREFIXES = (
    "libcudnn",
    "libcublas",
    "libnccl",
    "libcudart",
    "libnvrtc",
    "libcusparse",
    "libcufft",
    "libcurand",
    "libcusolver",
    "libnvJitLink",
    "libcupti",
    "libnvshmem",
)
_NVCC_RE = re.compile(r"release (\d+\.\d+)")


def cuda_libs_in(dirs: tuple[str, ...]) -> tuple[str, ...]:
    found: list[str] = []
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        found.extend(os.path.join(d, n) for n in names if n.startswith(CUDA_LIB_PREFIXES) and ".so" in n)
    return tuple(found)


def nvcc(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``nvcc --version``: the CUDA toolkit that builds extensions (torch.utils.cpp_extension uses CUDA_HOME)."""
    candidates = [shutil.which("nvcc", path=env.get("PATH"))]
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        candidates.insert(0, os.path.join(home, "bin", "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for path in candidates:
        if path and os.access(path, os.X_OK):
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                return path, None
            m = _NVCC_RE.search(out)
            return path, (m.group(1) if m else None)
    return None, None


# Where users and images set variables, in the order a login shell reads them (bash(1) INVOCATION); NCCL also
# reads KEY=VALUE lines from its own files (NCCL env docs: /etc/nccl.conf, NCCL_CONF_FILE, ~/.nccl.conf).
PROFILE_FILES = (
    "/etc/environment",
    "/etc/profile",
    "/etc/profile.d/*.sh",
    "/etc/bash.bashrc",
    "/etc/bashrc",
    "/etc/nccl.conf",
    "~/.profile",
    "~/.bash_profile",
    "~/.bash_login",
    "~/.bashrc",
    "~/.zshenv",
    "~/.zshrc",
    "~/.nccl.conf",
)
_MAX_PROFILE_BYTES = 1 << 20


def relevant(name: str) -> bool:
    from torchrig.doctor import envrules

    return name.startswith(envrules.PREFIXES) or name in envrules.names()


def _profile_paths(home: str | None) -> list[str]:
    import glob

    out: list[str] = []
    for pattern in PROFILE_FILES:
        if pattern.startswith("~"):
            if not home:
                continue
            pattern = home + pattern[1:]
        out.extend(sorted(glob.glob(pattern)) if "*" in pattern else [pattern])
    return out


def where_set(
    names: list[str],
    home: str | None,
    extra: tuple[str, ...] = (),
    container_env: Mapping[str, str] | None = None,
) -> dict[str, list[str]]:
    """``file:line`` of each assignment of ``names`` in the shell profiles (``export NAME=...``, ``NAME=...``,
    ``setenv NAME``), and ``container`` for a name in the container's start environment."""
    found: dict[str, list[str]] = {n: [] for n in names}
    if not names:
        return found
    pattern = re.compile(
        r"^\s*(?:export\s+|declare\s+-x\s+|setenv\s+)?(" + "|".join(map(re.escape, names)) + r")(?:=|\s)"
    )
    for path in [*_profile_paths(home), *extra]:
        try:
            text = read_head(path, "shell profile", max_bytes=_MAX_PROFILE_BYTES).decode("utf-8", "replace")
        except InputError:  # missing, unreadable, or not a regular file (a FIFO would block a plain open)
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            m = pattern.match(line)
            if m:
                found[m.group(1)].append(f"{path}:{lineno}")
    for n in names:
        if container_env is not None and n in container_env:
            found[n].append("container")
    return found


def _container_env() -> dict[str, str] | None:
    """The environment PID 1 started with: in a container, the image's ENV plus ``docker run -e`` (None: not
    in a container, or not readable)."""
    if not (os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")):
        return None
    try:
        raw = read_head("/proc/1/environ", "PID 1's environment", max_bytes=_MAX_PROFILE_BYTES)
    except InputError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.decode("utf-8", "replace").partition("=")
        if sep:
            out[k] = v
    return out


def interfaces(root: str = "/sys/class/net") -> tuple[str, ...] | None:
    try:
        return tuple(sorted(os.listdir(root)))
    except OSError:
        return None


def ib_devices(root: str = "/sys/class/infiniband") -> tuple[IbDevice, ...] | None:
    """RDMA devices and their ports (``/sys/class/infiniband/DEV/ports/N``); () none; None: no such class."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return ()
    except OSError:
        return None
    out = []
    for n in names:
        try:
            ports = tuple(sorted(int(p) for p in os.listdir(os.path.join(root, n, "ports")) if p.isdigit()))
        except OSError:
            ports = ()
        out.append(IbDevice(n, ports))
    return tuple(out)


def variables(env: Mapping[str, str]) -> tuple[EnvVar, ...]:
    picked = sorted(n for n in env if relevant(n) or n == "LD_PRELOAD")
    origins = where_set(
        picked, env.get("HOME"), tuple(p for p in (env.get("NCCL_CONF_FILE"),) if p), _container_env()
    )
    return tuple(EnvVar(n, env[n], tuple(origins.get(n, ()))) for n in picked)


def probe_env(env: Mapping[str, str] | None = None) -> EnvFacts:
    env = os.environ if env is None else env
    ld = tuple(p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p)
    nvcc_path, nvcc_version = nvcc(env)
    return EnvFacts(
        ProbeStatus.OK,
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        nvidia_visible_devices=env.get("NVIDIA_VISIBLE_DEVICES"),
        ld_library_path=ld,
        ld_library_libs=cuda_libs_in(ld),
        ld_preload=env.get("LD_PRELOAD"),
        nvcc_path=nvcc_path,
        nvcc_version=nvcc_version,
        cuda_home=env.get("CUDA_HOME") or env.get("CUDA_PATH"),
        variables=variables(env),
        net_interfaces=interfaces(),
        ib_devices=ib_devices(),
    )
