"""The installed PyTorch, inspected in a child interpreter with a timeout, so a wedged driver (a ``cuInit``
that never returns) cannot hang doctor. The child runs :mod:`torchrig.doctor.probes.torch_script`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from torchrig.doctor.facts import PeerAccess, ProbeStatus, TorchDevice, TorchFacts

SCRIPT = Path(__file__).with_name("torch_script.py")


def _from_child(data: dict[str, Any], requested: str | None = None) -> TorchFacts:
    status = {"ok": ProbeStatus.OK, "missing": ProbeStatus.MISSING}.get(
        data.get("status", ""), ProbeStatus.FAILED
    )
    return TorchFacts(
        status=status,
        error=data.get("error"),
        python_executable=data.get("python_executable"),
        python_version=data.get("python_version"),
        python_requested=requested,
        pid=data.get("pid"),
        origin=data.get("torch_origin"),
        version=data.get("version"),
        cuda_version=data.get("cuda_version"),
        hip_version=data.get("hip_version"),
        arch_list=tuple(data.get("arch_list") or ()),
        cudnn_version=data.get("cudnn_version"),
        nccl_version=data.get("nccl_version"),
        is_available=data.get("is_available"),
        device_count=data.get("device_count"),
        init_error=data.get("init_error"),
        warnings=tuple(data.get("warnings") or ()),
        devices=tuple(TorchDevice(**d) for d in data.get("devices") or ()),
        peer_access=tuple(PeerAccess(**p) for p in data.get("peer_access") or ()),
        loaded_libraries=tuple(data.get("loaded_libraries") or ()),
        wheel_libraries=tuple(data.get("wheel_libraries") or ()),
        import_ms=data.get("import_ms"),
        steps_ms={str(k): float(v) for k, v in (data.get("steps_ms") or {}).items()},
    )


def probe_torch(python: str | None = None, timeout_s: float = 60.0) -> TorchFacts:
    """``python -c 'import torch; print(torch.__version__, torch.cuda.is_available(), ...)'``, done carefully.

    ``python`` is used as given, relative to the working directory when relative (never looked up on
    ``PATH``: ``--python python`` means ./python); the facts keep it as ``python_requested``."""
    if python is not None:
        python = os.path.abspath(os.path.expanduser(python))
    exe = python or sys.executable
    req: dict[str, Any] = {"python_requested": python}
    if python is None and importlib.util.find_spec("torch") is None:
        # This interpreter has no torch: say so without paying for a child interpreter.
        from torchrig.doctor.probes.torch_script import wheel_libraries

        return TorchFacts(
            ProbeStatus.MISSING,
            error="ModuleNotFoundError: No module named 'torch'",
            python_executable=exe,
            python_version=platform.python_version(),
            wheel_libraries=tuple(wheel_libraries()),
        )
    try:
        proc = subprocess.run(
            [exe, "-c", SCRIPT.read_text()], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return TorchFacts(
            ProbeStatus.TIMEOUT,
            python_executable=exe,
            **req,
            error=f"'import torch; torch.cuda.init()' did not finish in {timeout_s:g} s",
        )
    except OSError as err:
        return TorchFacts(
            ProbeStatus.MISSING, python_executable=exe, error=f"cannot run {exe}: {err.strerror}", **req
        )
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return TorchFacts(
            ProbeStatus.FAILED,
            python_executable=exe,
            **req,
            error=f"the torch probe exited with status {proc.returncode}: {tail}"[:2000],
        )
    try:
        return _from_child(json.loads(line), python)
    except (ValueError, TypeError) as err:
        return TorchFacts(
            ProbeStatus.FAILED, python_executable=exe, error=f"unreadable torch probe output: {err}", **req
        )
