"""Which GPUs CUDA is allowed to see: CUDA_VISIBLE_DEVICES, and MIG mode without instances."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor.checks.common import Context
from torchrig.doctor.findings import Finding, Severity
from torchrig.hw.visible import visible_prefix

__all__ = ["cuda_visible_devices", "mig_without_instances", "visible_prefix"]


def cuda_visible_devices(ctx: Context) -> Iterator[Finding]:
    value = ctx.facts.env.cuda_visible_devices
    if value is None:
        return
    count = ctx.gpu_count
    uuids = [g.uuid for g in ctx.facts.nvml.gpus if g.uuid] + [
        m.uuid for g in ctx.facts.nvml.gpus for m in g.mig_instances if m.uuid
    ]
    indices = ",".join(str(i) for i in range(count)) if count else None
    fix = (
        "unset CUDA_VISIBLE_DEVICES   # all GPUs",
        *((f"export CUDA_VISIBLE_DEVICES={indices}   # or a subset of these",) if indices else ()),
    )
    torch_ev = (
        (f"torch sees {ctx.facts.torch.device_count} device(s)",)
        if ctx.facts.torch.device_count is not None
        else ()
    )
    gpus_ev = f"GPUs on this machine: {count if count is not None else 'unknown'}"
    if value.strip() == "":
        yield Finding(
            "env.cuda_visible_devices",
            Severity.ERROR,
            "CUDA_VISIBLE_DEVICES is set but empty: CUDA sees no GPU",
            "an empty CUDA_VISIBLE_DEVICES hides every GPU from CUDA (torch.cuda.is_available() is False)",
            fix,
            ("CUDA_VISIBLE_DEVICES=''", gpus_ev, *torch_ev),
        )
        return
    seen, bad = visible_prefix(value, count, uuids)
    if bad is None:
        return
    if not seen:
        what = (
            "-1 is the conventional way to hide all GPUs"
            if bad == "-1"
            else f"{bad!r} names no GPU here" + (f" (valid indices: {indices})" if indices else "")
        )
        yield Finding(
            "env.cuda_visible_devices",
            Severity.ERROR,
            f"CUDA_VISIBLE_DEVICES={value} hides every GPU",
            f"{what}; CUDA stops at the first invalid entry, "
            "so it enumerates no device and torch.cuda.is_available() is False",
            fix,
            (f"CUDA_VISIBLE_DEVICES={value!r}", gpus_ev, *torch_ev),
        )
        return
    yield Finding(
        "env.cuda_visible_devices",
        Severity.WARNING,
        f"CUDA_VISIBLE_DEVICES={value}: only {','.join(seen)} visible, the rest is ignored",
        f"{bad!r} names no GPU here and CUDA ignores it and every entry after it",
        (f"export CUDA_VISIBLE_DEVICES={','.join(seen)}   # what CUDA uses now", *fix),
        (f"CUDA_VISIBLE_DEVICES={value!r}", gpus_ev, *torch_ev),
    )


def mig_without_instances(ctx: Context) -> Iterator[Finding]:
    gpus = ctx.facts.nvml.gpus
    bare = [g for g in gpus if g.mig_mode and not g.mig_instances]
    if not bare:
        return
    every = len(bare) == len(gpus)
    fix = []
    for g in bare:
        fix.append(
            f"sudo nvidia-smi mig -i {g.index} -lgip   # list the instance profiles, then: "
            f"sudo nvidia-smi mig -i {g.index} -cgi <profile> -C"
        )
    fix.append(
        "or turn MIG off: "
        + " && ".join(f"sudo nvidia-smi -i {g.index} -mig 0" for g in bare)
        + "   # then reset the GPU or reboot"
    )
    yield Finding(
        "gpu.mig_no_instances",
        Severity.ERROR if every else Severity.WARNING,
        "MIG is enabled with no instance: CUDA cannot use " + ", ".join(f"GPU {g.index}" for g in bare),
        "a GPU in MIG mode runs CUDA only inside MIG instances (a GPU instance plus a compute instance), "
        "and none exist" + ("; CUDA sees no device at all" if every else ""),
        tuple(fix),
        tuple(f"GPU {g.index} ({g.name}): MIG mode on, 0 MIG devices" for g in bare),
    )
