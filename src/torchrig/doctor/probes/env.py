"""The environment variables that decide what CUDA sees and which libraries load, and the CUDA toolkit (nvcc)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping

from torchrig.doctor.facts import EnvFacts, ProbeStatus

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
    )
