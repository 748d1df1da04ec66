"""What every GPU test's child processes share: NVLink multicast off (NCCL's NVLS, torch's symmetric memory,
NVSHMEM), and whether this interpreter's torch sees a GPU, asked in a child so that the test process itself
never creates a CUDA context."""

from __future__ import annotations

import subprocess
import sys

SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def cuda_in_child() -> bool:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
