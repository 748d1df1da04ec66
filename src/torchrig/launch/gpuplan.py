"""The GPUs a launch plans with before CUDA is touched, and torch's check of that plan beside the job.

Pure: no NVML, no torch, no files here; ``probe`` gathers the records, ``run`` decides when each runs.

On a host where the GPU probe's answer is not cached (the first launch, or after a change of driver, GPU
device nodes, torch, interpreter or ``CUDA_VISIBLE_DEVICES``), asking torch takes seconds (importing torch and
initialising CUDA: 6-7 s on an H200). NVML answers the plan's questions in milliseconds: how many GPUs the
ranks will see (NVML's list narrowed by ``CUDA_VISIBLE_DEVICES`` as CUDA narrows it), their names, and which
pairs lack P2P. What NVML cannot answer is whether the ranks' torch can use those GPUs (a CPU build of
torch, a CUDA runtime newer than the driver, a wedged driver). So the job starts on NVML's answer, and the
torch probe runs beside it: :func:`judge` compares the two, and an error stops the job.

>>> from torchrig.hw.nvml_records import NvmlIdentity
>>> gpus = (NvmlIdentity(0, "GPU-a", "NVIDIA H200", False), NvmlIdentity(1, "GPU-b", "NVIDIA H200", False))
>>> from_nvml(gpus, (), {"CUDA_VISIBLE_DEVICES": "1"}, "2.11.0+cu130")
GpuProbe(count=1, names=('NVIDIA H200',), no_p2p=(), error=None, torch_version='2.11.0+cu130')
"""

from __future__ import annotations

from collections.abc import Mapping

from torchrig.findings import Finding, Severity
from torchrig.hw.nvml_records import NvmlIdentity, NvmlPair, p2p_verdict
from torchrig.hw.visible import visible_ids, visible_prefix
from torchrig.launch.plan import GpuProbe, LaunchPlan

# NCCL asks CUDA the same question before it uses P2P for a pair (p2pCanConnect calls cudaDeviceCanAccessPeer
# and picks another transport when it says no), so a pair torch finds without P2P after the job started on
# NVML's "yes" costs bandwidth, not a hang: a warning, and the next launch sets NCCL_P2P_DISABLE itself.
CUDA_ORDER_SOURCE = (
    "https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html"
)
NCCL_P2P_CHECK = "https://github.com/NVIDIA/nccl/blob/master/src/transport/p2p.cc (p2pCanConnect)"


def cuda_order(gpus: tuple[NvmlIdentity, ...], env: Mapping[str, str]) -> tuple[int, ...] | None:
    """NVML's index of each device CUDA will enumerate, in CUDA's order; None when NVML cannot say.

    ``CUDA_VISIBLE_DEVICES`` is read as CUDA reads it (left to right, up to the first entry that names no
    GPU; indices or UUID prefixes). A GPU in MIG mode makes CUDA enumerate its instances instead: NVML's
    list of whole GPUs is then not what CUDA sees, and the caller asks torch. So does a host with GPUs of more
    than one kind: unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (NVML's order), CUDA puts the fastest first
    (``FASTEST_FIRST``, its default; CUDA_ORDER_SOURCE).
    """
    if any(g.mig_mode for g in gpus):
        return None
    if len({g.name for g in gpus}) > 1 and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return None
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return tuple(g.index for g in gpus)
    uuids = [g.uuid for g in gpus if g.uuid]
    seen, _bad = visible_prefix(value, len(gpus), uuids)
    out: list[int] = []
    for tok in seen:
        if tok.startswith(("GPU-", "MIG-")):
            match = [g.index for g in gpus if g.uuid and g.uuid.startswith(tok)]
            if len(match) != 1:
                return None
            out.append(match[0])
        else:
            out.append(int(tok))
    if len(set(out)) != len(out):  # CUDA refuses a list that names a GPU twice: ask torch
        return None
    return tuple(out)


def no_p2p(pair: NvmlPair) -> bool:
    """NVML says this pair has no P2P: a read or write status it gave is not "ok" (doctor reads it alike)."""
    return p2p_verdict(pair.read, pair.write) is False


def from_nvml(
    gpus: tuple[NvmlIdentity, ...],
    pairs: tuple[NvmlPair, ...],
    env: Mapping[str, str],
    torch_version: str | None,
) -> GpuProbe | None:
    """The answer torch's probe would give, from NVML's records (in CUDA's numbering); None where NVML's
    answer may differ from CUDA's (MIG, an ambiguous ``CUDA_VISIBLE_DEVICES``): then torch is asked first."""
    order = cuda_order(gpus, env)
    if order is None:
        return None
    by_index = {g.index: g for g in gpus}
    blocked = {frozenset((p.a, p.b)) for p in pairs if no_p2p(p)}
    return GpuProbe(
        count=len(order),
        names=tuple(by_index[i].name or "GPU" for i in order),
        no_p2p=tuple(
            (a, b)
            for a in range(len(order))
            for b in range(len(order))
            if a != b and frozenset((order[a], order[b])) in blocked
        ),
        torch_version=torch_version,
    )


def _physical(found: GpuProbe, env: Mapping[str, str]) -> tuple[tuple[int, ...], set[tuple[int, int]]]:
    ids = visible_ids(found.count, dict(env))
    return ids, {(ids[i], ids[j]) for i, j in found.no_p2p if i < len(ids) and j < len(ids)}


def _p2p_finding(
    blocked: set[tuple[int, int]], chosen: list[int], plan: LaunchPlan, env: Mapping[str, str]
) -> Finding | None:
    """A WARNING when torch finds a pair of the job's GPUs without P2P that NVML said had it (and the job
    runs without NCCL_P2P_DISABLE); None otherwise."""
    p2p_off = any(e.name == "NCCL_P2P_DISABLE" for e in plan.env_settings) or "NCCL_P2P_DISABLE" in env
    new = sorted((i, j) for i, j in blocked if i in chosen and j in chosen)
    if not new or p2p_off:
        return None
    i, j = new[0]
    return Finding(
        "cuda",
        Severity.WARNING,
        f"torch: GPU {i} cannot access GPU {j}'s memory, where NVML said it could; this job runs "
        "without NCCL_P2P_DISABLE, the next launch sets it",
        cause="NCCL asks CUDA the same question and sends that pair's traffic through host memory",
        fix=("expect lower all_reduce bandwidth; check IOMMU/ACS settings ('torchrig doctor')",),
        evidence=(f"torch.cuda.can_device_access_peer: False for {len(new)} pair(s)", NCCL_P2P_CHECK),
    )


def judge(planned: GpuProbe, found: GpuProbe, plan: LaunchPlan, env: Mapping[str, str]) -> Finding:
    """torch's answer (``found``, from the ranks' interpreter) against NVML's (``planned``) that the job
    started on: ERROR when torch cannot use a GPU the ranks were given (the job is stopped), WARNING when the
    job runs but differs from what torch would have planned, OK when they agree."""
    chosen = [r.physical_gpu for r in plan.ranks if r.physical_gpu is not None]
    torch_name = f"torch {found.torch_version or planned.torch_version or ''}".rstrip()
    fix_torch = (
        "run 'torchrig doctor': it names the cause (a CPU build of torch, the driver, CUDA_VISIBLE_DEVICES)",
        "or run on the CPU: torchrig launch --cpu",
    )
    listed = f"NVML lists {planned.count} GPU(s) the ranks would see"
    if found.error:
        return Finding(
            "cuda",
            Severity.ERROR,
            f"{torch_name} cannot use the GPUs: {found.error}",
            cause=f"{listed}; the ranks' interpreter failed the same probe",
            fix=fix_torch,
            evidence=(found.error,),
        )
    ids, blocked = _physical(found, env)
    missing = [g for g in chosen if g not in ids]
    if missing:
        what = (
            "sees no CUDA device" + (" (a CPU build)" if (found.torch_version or "").endswith("+cpu") else "")
            if found.count == 0
            else f"sees {found.count} GPU(s), not GPU {','.join(map(str, missing))}"
        )
        return Finding(
            "cuda",
            Severity.ERROR,
            f"{torch_name} {what}; the job was given GPU(s) {','.join(map(str, chosen))}",
            cause=f"{listed}; the ranks' torch cannot use the GPUs it was given",
            fix=fix_torch,
            evidence=(f"torch.cuda.device_count() = {found.count}", listed),
        )
    p2p = _p2p_finding(blocked, chosen, plan, env)
    if p2p is not None:
        return p2p
    if found.count != planned.count:
        return Finding(
            "cuda",
            Severity.WARNING,
            f"{torch_name} sees {found.count} GPU(s) where NVML listed {planned.count}; the job's GPUs are "
            "among them, the next launch plans with torch's answer",
        )
    return Finding(
        "cuda",
        Severity.OK,
        f"{torch_name} can use the {found.count} GPU(s) NVML listed (checked beside the job)",
    )
