"""CUDA_DEVICE_ORDER: CUDA numbers GPUs fastest first unless it is PCI_BUS_ID, while nvidia-smi, NVML and
doctor's own tables number them by PCI bus id. On a host with different GPUs the two orders differ."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor import envrules
from torchrig.doctor.checks.common import Context
from torchrig.doctor.checks.env_common import finding, undo, var
from torchrig.doctor.facts import EnvVar
from torchrig.doctor.findings import Finding, Severity

ORDERS = ("FASTEST_FIRST", "PCI_BUS_ID")


def device_order(ctx: Context) -> Iterator[Finding]:
    v = var(ctx, "CUDA_DEVICE_ORDER")
    if v is not None and v.value not in ORDERS:
        yield finding(
            "env.cuda_device_order",
            Severity.WARNING,
            v,
            f"CUDA_DEVICE_ORDER={v.value} is not FASTEST_FIRST or PCI_BUS_ID",
            "CUDA ignores the value and numbers the GPUs fastest first",
            undo(v, "PCI_BUS_ID"),
        )
        return
    if ctx.facts.env.variables is None or (v is not None and v.value == "PCI_BUS_ID"):
        return
    models = sorted({g.name for g in ctx.facts.nvml.gpus if g.name})
    if len(models) < 2:
        return
    shown = v or EnvVar("CUDA_DEVICE_ORDER", "FASTEST_FIRST (unset: the default)")
    order = ", ".join(f"{g.index}: {g.name}" for g in ctx.facts.nvml.gpus)
    yield finding(
        "env.cuda_device_order",
        Severity.WARNING,
        shown,
        "this host has different GPUs and CUDA numbers them fastest first: cuda:N is not GPU N of nvidia-smi",
        envrules.rule("CUDA_DEVICE_ORDER").breaks,
        (
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID   # CUDA numbers GPUs as nvidia-smi does (put it in your profile)",
        ),
        (f"nvidia-smi order (PCI bus id): {order}",),
    )
