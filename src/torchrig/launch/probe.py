"""Host adapters for the launcher: GPUs and P2P as torch and NVML see them, a free port, the CPU count.

Each returns plain values; decisions are in ``plan``, ``gpuplan`` and ``preflight``. The GPU probe runs torch
in a subprocess with a timeout, so a wedged driver cannot hang ``torchrig launch`` itself; its answer is
cached (``probe_gpus_cached``). Without that answer, ``gpu_answer`` plans from NVML (milliseconds) and leaves
the torch probe to run beside the job (``torchrig.launch.run``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchrig.hw.nvml_records import NvmlIdentity, NvmlPair
from torchrig.hw.visible import visible_ids
from torchrig.inputfiles import read_proc
from torchrig.launch.plan import GpuProbe, HostFacts
from torchrig.runtime.inventory import Unit

if TYPE_CHECKING:
    from torchrig.runtime.ledger import Lease

_GPU_PROBE = """
import json, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
pairs = [[i, j] for i in range(n) for j in range(n) if i != j and not torch.cuda.can_device_access_peer(i, j)]
names = [torch.cuda.get_device_name(i) for i in range(n)]
print(json.dumps({"count": n, "no_p2p": pairs, "names": names, "torch_version": torch.__version__}))
"""


def probe_gpus(timeout_s: float = 60.0) -> GpuProbe:
    """``python -c 'torch.cuda.device_count(); can_device_access_peer(i, j)'`` in a subprocess."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _GPU_PROBE], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return GpuProbe(0, (), (), error=f"the CUDA probe did not answer within {timeout_s:.0f} s")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return GpuProbe(0, (), (), error=f"the CUDA probe failed: {last}")
    from torchrig.jsonrecords import structure

    try:  # the last line is the answer (torch may print warnings before it)
        return structure(json.loads((out.stdout.strip().splitlines() or ["null"])[-1]), GpuProbe, "answer")
    except ValueError as err:  # json's, or jsonrecords' RecordError
        return GpuProbe(0, (), (), error=f"the CUDA probe answered no GPUs: {err}")


def _cache_path() -> str:
    from torchrig import userdirs

    return str(userdirs.cache_dir() / "launch-gpu-probe.json")


def probe_key() -> dict[str, object]:
    """What the GPU probe's answer depends on, read without CUDA: the interpreter and its torch, the driver
    (``/proc/driver/nvidia/version``), the GPU device nodes, and the variables that choose and order the GPUs
    CUDA sees. Any change to one of them probes again."""
    driver = read_proc("/proc/driver/nvidia/version", max_bytes=4096)
    nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    return {
        "python": sys.executable,
        "torch": torch_version(),
        "driver": driver,
        "devices": nodes,
        "env": {
            k: os.environ.get(k)
            for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
        },
    }


def cached(key: dict[str, object]) -> GpuProbe | None:
    """The last probe's answer, if it was taken under ``key`` (``probe_key``); else None (a cache that does
    not read as a probe is no answer: the GPUs are probed again)."""
    from torchrig.errors import InputError
    from torchrig.inputfiles import read_json
    from torchrig.jsonrecords import RecordError, structure

    try:
        saved = read_json(_cache_path(), "GPU probe cache", max_bytes=1 << 20)  # bounded: a FIFO never waits
        if isinstance(saved, dict) and saved.get("key") == key:
            return structure(saved.get("probe"), GpuProbe, "GPU probe cache")
    except (InputError, OSError, RecordError):
        pass
    return None


def remember(key: dict[str, object], found: GpuProbe) -> None:
    """Keep a successful probe's answer for the next launch under ``key``; a read-only home keeps nothing."""
    if found.error is not None:
        return
    path = _cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"key": key, "probe": dataclasses.asdict(found)}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: probe every time


def probe_gpus_cached(timeout_s: float = 60.0) -> GpuProbe:
    """``probe_gpus``, answered from the last probe when nothing it depends on changed (``probe_key``): the
    probe imports torch and initialises CUDA, seconds before every launch on a GPU host. Only successful
    probes are kept."""
    key = probe_key()
    found = cached(key)
    if found is None:
        found = probe_gpus(timeout_s)
        remember(key, found)
    return found


def read_nvml() -> tuple[tuple[NvmlIdentity, ...], tuple[NvmlPair, ...]] | None:
    """NVML's GPUs (``nvidia-smi -L``) and, with two or more, their P2P status (``nvidia-smi topo -p2p rw``);
    None when NVML cannot be used (no nvidia-ml-py, no driver, ...): the caller asks torch instead."""
    from torchrig.hw import nvml

    try:
        with nvml.session() as gpus:
            found = gpus.identities()
            return found, gpus.pairs() if len(found) > 1 else ()
    except nvml.NvmlError:
        return None


def torch_version() -> str | None:
    """The installed torch's version from its package metadata, without importing torch."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class GpuAnswer:
    """The GPUs to plan with: torch's answer (probed or cached), or NVML's, which torch checks beside the job
    (``unconfirmed``). ``key`` is what the answer depends on (``probe_key``), to keep torch's once it agrees."""

    gpus: GpuProbe
    unconfirmed: bool
    key: dict[str, object]


def gpu_answer(timeout_s: float = 60.0, *, nvml_first: bool = True) -> GpuAnswer:
    """The cached torch answer; else (``nvml_first``) NVML's, when it can stand for CUDA's; else torch's,
    probed now and kept."""
    from torchrig.launch.gpuplan import from_nvml

    key = probe_key()
    found = cached(key)
    if found is not None:
        return GpuAnswer(found, False, key)
    if nvml_first:
        read = read_nvml()
        fast = None if read is None else from_nvml(*read, dict(os.environ), torch_version())
        if fast is not None:
            return GpuAnswer(fast, True, key)
    found = probe_gpus(timeout_s)
    remember(key, found)
    return GpuAnswer(found, False, key)


def host_facts(gpus: GpuProbe | None) -> HostFacts:
    env = dict(os.environ)
    return HostFacts(
        visible_gpus=visible_ids(gpus.count, env) if gpus else (),
        cpu_count=os.cpu_count() or 1,
        python=sys.executable,
        env=env,
        torch_version=gpus.torch_version if gpus else None,
    )


def lease_facts(gpus: str | None, visible: tuple[int, ...]) -> dict[str, object]:
    """The lease ledger's word on this host's GPUs, as :class:`HostFacts` fields (``gpu_units``, ``leases``,
    ``user``): read-only, and nothing at all where there is no ledger (a personal machine). The inventory
    (NVML, or ``$TORCHRIG_GPU_INVENTORY``) is read only when a lease or a UUID in ``--gpus`` needs it."""
    from torchrig.runtime import placement
    from torchrig.runtime.ledger import current_user

    found = leases_now()
    uuids = gpus is not None and placement.parse_gpus(gpus).kind == "uuids"
    leases = tuple(found or ())
    units: tuple[Unit, ...] = ()
    if visible and (leases or uuids):
        from torchrig.runtime.nvml import current

        units = tuple(u for u in current().units() if not u.is_mig and u.gpu_index in visible)
    return {"gpu_units": units, "leases": leases, "user": current_user() if found is not None else None}


def leases_now() -> list[Lease] | None:
    """Who holds which GPU now: the host daemon's answer where one runs (its ledger, reconciled with the
    containers), else the ledger read directly (read-only, without a pending lease whose owner died: the next
    'up' or 'gpus' deletes it); None where there is neither (a personal machine: nothing is leased)."""
    import time

    from torchrig.hostd.client import daemon_socket
    from torchrig.runtime.ledger import Lease, read_leases, stale

    sock = daemon_socket()
    if sock is not None:
        from torchrig.hostd.client import call
        from torchrig.hostd.wire import from_jsonable

        return [from_jsonable(Lease, x) for x in call(sock, "gpus", {"free": False})["leases"]]
    found = read_leases()
    return None if found is None else [x for x in found[1] if not stale(x, None, time.time())]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
