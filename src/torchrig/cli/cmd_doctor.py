"""Inspect this machine or container: what is wrong, in order of severity, why, and the exact fix.

With no arguments doctor examines the machine it runs on: the NVIDIA driver and kernel module, the GPUs
(through NVML: MIG, persistence, ECC, throttling, NVLink, P2P for every pair), the installed PyTorch (in a
child process with a timeout, so a wedged driver cannot hang it), the environment (CUDA_VISIBLE_DEVICES,
LD_LIBRARY_PATH, nvcc), the container and its limits (/dev/shm, memlock, cgroups) and, on a host, whether
Docker can give containers GPUs. It names the root cause when torch.cuda.is_available() is False.

Findings are errors (CUDA cannot work), warnings (it will bite later), notes and passed checks.
Exit status: 0 healthy, 1 errors or warnings found, 2 bad usage or an unreadable --facts file.

examples:
  torchrig doctor                               # this machine
  torchrig doctor --json                        # the stable JSON schema, facts included
  torchrig doctor --only torch,env              # just the PyTorch and environment checks
  torchrig doctor --python ~/venvs/train/bin/python   # inspect the torch of another interpreter
  torchrig doctor --deep                        # also NCCL across each GPU pair (two ranks)
  torchrig doctor --record facts.json           # also write the probed facts (attach them to a bug report)
  torchrig doctor --facts facts.json            # replay recorded facts through the checks, no probing
  CUDA_VISIBLE_DEVICES=7 torchrig doctor        # what a bad device list does

areas: driver, container, env, torch, gpu.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

from torchrig.argtypes import MAX_SECONDS, float_in
from torchrig.errors import InputError, UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        metavar="AREAS",
        action="append",
        default=[],
        help="comma-separated areas to report: driver, container, env, torch, gpu (repeatable)",
    )
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="the interpreter whose torch to inspect, as given (relative to here, never looked up on PATH; "
        "default: this one)",
    )
    parser.add_argument("--facts", metavar="FILE", help="replay a recorded facts snapshot instead of probing")
    parser.add_argument("--record", metavar="FILE", help="write the probed facts to FILE (JSON) as well")
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also all-reduce over each GPU pair with two NCCL ranks, one process per GPU (seconds per pair)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float_in(0, MAX_SECONDS, lo_open=True),
        default=60.0,
        help="limit for the torch probe (import torch + CUDA init), default 60",
    )


def _areas(only: list[str]) -> tuple[str, ...]:
    from torchrig.doctor.areas import AREAS

    picked: list[str] = []
    for chunk in only:
        for name in (p.strip() for p in chunk.split(",")):
            if not name:
                continue
            if name not in AREAS:
                from torchrig.fuzzy import did_you_mean

                raise UsageError(
                    f"unknown area {name!r} for --only",
                    hint=did_you_mean(name, AREAS) or f"choose from {', '.join(AREAS)}",
                )
            if name not in picked:
                picked.append(name)
    return tuple(picked)


def _validate(args: argparse.Namespace) -> None:
    if args.facts and args.record:
        raise UsageError("--facts replays a snapshot and --record writes one: use one of them")
    if args.facts and args.deep:
        raise UsageError("--deep probes the GPUs, but --facts replays without probing: use one of them")
    if args.facts and args.python:
        raise UsageError(
            "--python chooses what to probe, but --facts replays without probing: use one of them"
        )
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    if args.python:
        exe = Path(args.python).expanduser()
        if not exe.exists():
            raise InputError(
                f"--python {args.python!r} does not exist", hint="give the path of a python executable"
            )
        if not os.access(exe, os.X_OK) or exe.is_dir():
            raise InputError(f"--python {args.python!r} is not an executable file")
    if args.record:
        parent = Path(args.record).expanduser().resolve().parent
        if not parent.is_dir():
            raise InputError(
                f"cannot write --record {args.record!r}: directory {str(parent)!r} does not exist"
            )


# Where an NVIDIA driver shows itself (the host's, also inside a container; /dev/dxg: WSL).
_NVIDIA_SIGNS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/dxg")


def _load_kb_meanwhile() -> threading.Thread | None:
    """Load the knowledge base (~0.1 s) while the torch child imports torch, when the checks will want it:
    the build checks consult it once a driver is there. The load is cached; the caller joins the thread; an
    error is raised again on the main thread by the check that needs the knowledge base."""
    if not any(os.path.exists(p) for p in _NVIDIA_SIGNS):
        return None
    from torchrig.doctor import kb

    thread = threading.Thread(target=kb.preload, name="doctor-kb", daemon=True)
    thread.start()
    return thread


def run(args: argparse.Namespace):  # -> DoctorReport
    t0 = time.perf_counter()
    areas = _areas(args.only)
    _validate(args)
    from torchrig.doctor import diagnose
    from torchrig.doctor.facts import facts_to_json, load_facts

    if args.facts:
        facts = load_facts(args.facts)
    else:
        from torchrig.doctor.probes import ProbeOptions, collect

        want_torch = bool(args.record) or not areas or bool({"torch", "env"} & set(areas))
        python = os.path.abspath(Path(args.python).expanduser()) if args.python else None
        kb_threads: list[threading.Thread | None] = []

        def meanwhile() -> None:
            """While the probes run and the torch child imports torch (loading these before would delay them):
            the knowledge base in a thread, and the checks' modules (~0.1-0.2 s of imports) here."""
            kb_threads.append(_load_kb_meanwhile())
            import torchrig.doctor.checks  # noqa: F401

        facts = collect(
            ProbeOptions(python=python, torch=want_torch, timeout_s=args.timeout, deep=bool(args.deep)),
            meanwhile=meanwhile if want_torch else None,
        )
        for kb_thread in kb_threads:
            if kb_thread is not None:
                kb_thread.join(30.0)  # a second load would race the first: it is cached once this one ends
        if args.record:
            data = facts_to_json(facts)
            data["source"] = f"recorded by torchrig doctor --record at {facts.recorded_at}"
            try:
                Path(args.record).expanduser().write_text(json.dumps(data, indent=2) + "\n")
            except OSError as err:
                raise InputError(f"cannot write --record {args.record!r}: {err.strerror}") from None
    return diagnose(facts, areas or None, started=t0)  # a check that raises is a bug: exit 3, reported
