"""The installed PyTorch, inspected in a child interpreter with a timeout, so a wedged driver (a ``cuInit``
that never returns) cannot hang doctor. The child runs :mod:`torchrig.doctor.probes.torch_script`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from torchrig.doctor.facts import NcclFacts, ProbeStatus, TorchFacts
from torchrig.doctor.probes.trace import describe, trace

SCRIPT = Path(__file__).with_name("torch_script.py")


def _from_child(data: dict[str, Any], requested: str | None = None) -> TorchFacts:
    """The child's facts line as :class:`TorchFacts`, read by :func:`torchrig.jsonrecords.structure` (the
    child names the origin ``torch_origin``; a status other than ok/missing is a failure). A value of the wrong
    kind is a :class:`~torchrig.jsonrecords.RecordError` naming its key; a key the child did not write is
    unknown."""
    from torchrig.jsonrecords import structure

    status = {"ok": ProbeStatus.OK, "missing": ProbeStatus.MISSING}.get(
        data.get("status", ""), ProbeStatus.FAILED
    )
    facts = {k: v for k, v in data.items() if k not in ("torch_origin", "nccl", "trace")}
    facts |= {"status": status.value, "origin": data.get("torch_origin"), "python_requested": requested}
    return structure(facts, TorchFacts, "torch probe", unknown={})


def probe_torch(
    python: str | None = None, timeout_s: float = 60.0, *, trace_failures: bool = True
) -> TorchFacts:
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
    script = SCRIPT.read_text()  # raw-read: package source
    env = dict(os.environ)
    try:
        code, out, err = _run(exe, script, env, timeout_s)
    except OSError as e:
        return TorchFacts(
            ProbeStatus.MISSING, python_executable=exe, error=f"cannot run {exe}: {e.strerror}", **req
        )
    main, nccl = _lines(out)
    if main is None and code is None:
        return TorchFacts(
            ProbeStatus.TIMEOUT,
            python_executable=exe,
            **req,
            error=f"'import torch; torch.cuda.init()' did not finish in {timeout_s:g} s",
        )
    if main is None:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        facts = TorchFacts(
            ProbeStatus.FAILED,
            python_executable=exe,
            **req,
            error=f"the torch probe {'was ' if (code or 0) < 0 else ''}{describe(code, tail)}"[:2000],
        )
    else:
        try:
            facts = _from_child(main, python)
        except (ValueError, TypeError) as e:
            return TorchFacts(
                ProbeStatus.FAILED, python_executable=exe, error=f"unreadable torch probe output: {e}", **req
            )
        if (
            main.get("is_available")
            and main.get("nccl_version")
            and env.get("TORCHRIG_DOCTOR_NCCL", "1") != "0"
        ):
            facts = dataclasses.replace(facts, nccl=_nccl(nccl, code, err))
    origin = facts.origin or ""
    # a torch/ folder ahead of the installed package is said as such (checks/pytorch.py), not traced
    shadowed = bool(origin) and not any(d in origin for d in ("site-packages", "dist-packages"))
    if facts.status is ProbeStatus.FAILED and trace_failures and not shadowed:
        failure = " ".join((facts.error or "failed").split())[:300]
        facts = dataclasses.replace(
            facts, trace=trace(lambda e: _outcome(exe, script, e, min(timeout_s, 60.0)), env, failure)
        )
    return facts


def _run(exe: str, script: str, env: dict[str, str], timeout_s: float) -> tuple[int | None, str, str]:
    """Run the probe script: (exit status, or None on timeout; stdout; stderr), keeping what a timed-out
    child printed before it was killed."""
    try:
        proc = subprocess.run([exe, "-c", script], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        return None, _text(e.stdout), _text(e.stderr)
    return proc.returncode, proc.stdout, proc.stderr


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


def _lines(stdout: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The child's facts line and its NCCL line (each a JSON object on a line of its own)."""
    main = nccl = None
    for ln in stdout.splitlines():
        if not ln.startswith("{"):
            continue
        try:
            data = json.loads(ln)
        except ValueError:
            continue
        if isinstance(data, dict) and "nccl" in data and isinstance(data["nccl"], dict):
            nccl = data["nccl"]
        elif isinstance(data, dict) and "status" in data:
            main = data
    return main, nccl


def _nccl(data: dict[str, Any] | None, code: int | None, stderr: str) -> NcclFacts:
    if data is None:  # the child died or hung after its facts: in the NCCL check
        tail = (stderr.strip().splitlines() or [""])[-1][:500] or None
        status = "timeout" if code is None else "crashed"
        return NcclFacts(
            status, describe(code, tail) if code is not None else "the torch probe's time ran out"
        )
    from torchrig.jsonrecords import RecordError, structure

    try:  # read as the facts line is; "pairs" is doctor's own (--deep), never the child's
        answer = {k: v for k, v in data.items() if k != "pairs"} | {"status": data.get("status") or "failed"}
        return structure(answer, NcclFacts, "NCCL check", unknown={})
    except RecordError as err:
        return NcclFacts("failed", f"unreadable NCCL check output: {err}")


def _outcome(exe: str, script: str, env: dict[str, str], timeout_s: float) -> str | None:
    """None when the probe works under ``env``; else its failure in words."""
    env = {**env, "TORCHRIG_DOCTOR_NCCL": "0"}  # the import and CUDA are what is traced, not NCCL
    try:
        code, out, err = _run(exe, script, env, timeout_s)
    except OSError as e:
        return f"cannot run {exe}: {e.strerror}"
    main, _ = _lines(out)
    if main is None:
        return (
            describe(code, (err.strip().splitlines() or ["no output"])[-1]) if code is not None else "timeout"
        )
    if main.get("status") != "ok":
        return " ".join(str(main.get("error") or main.get("status")).split())[:300]
    return None
