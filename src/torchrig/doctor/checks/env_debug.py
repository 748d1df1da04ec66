"""Debugging settings left on (CUDA_LAUNCH_BLOCKING=1, NCCL_DEBUG=TRACE, TORCH_NCCL_BLOCKING_WAIT=1, ...): each
is right for an afternoon of debugging and wrong in a profile; and LD_PRELOAD, which forces libraries into
every process."""

from __future__ import annotations

import os
from collections.abc import Iterator

from torchrig.doctor import envrules
from torchrig.doctor.checks.common import Context
from torchrig.doctor.checks.env_common import finding, undo, var
from torchrig.doctor.findings import Finding, Severity

# Libraries that define what CUDA, NCCL or PyTorch's allocator provide: preloaded, they replace it.
_INTERPOSERS = (
    "libcuda",
    "libcudart",
    "libnccl",
    "libnvidia-ml",
    "libc10",
    "libtorch",
    "libcublas",
    "libcudnn",
)


def _on(value: str, on: tuple[str, ...]) -> bool:
    v = value.strip()
    if "*" in on:
        return bool(v)
    return v.upper() in {o.upper() for o in on}


def debug_settings(ctx: Context) -> Iterator[Finding]:
    rules = envrules.load()["vars"]
    for name, r in rules.items():
        if r.rule != "debug_on":
            continue
        v = var(ctx, name)
        if v is None or not _on(v.value, r.on):
            continue
        if r.needs:
            dep = var(ctx, r.needs)
            dep_rule = rules[r.needs]
            if dep is None or not _on(dep.value, dep_rule.on):
                continue
        yield finding(
            "env.debug_setting",
            Severity.WARNING,
            v,
            f"{name}={v.value} is a debugging setting left on: it slows every run",
            r.breaks,
            undo(v),
        )


def ld_preload(ctx: Context) -> Iterator[Finding]:
    v = var(ctx, "LD_PRELOAD")
    if v is None or not v.value.strip():
        return
    libs = [p for p in v.value.replace(":", " ").split() if p]
    interposing = [p for p in libs if os.path.basename(p).startswith(_INTERPOSERS)]
    if interposing:
        yield finding(
            "env.ld_preload",
            Severity.WARNING,
            v,
            f"LD_PRELOAD forces {', '.join(interposing)} into every process, ahead of PyTorch's own",
            envrules.rule("LD_PRELOAD").breaks,
            undo(v),
            (f"preloaded: {', '.join(libs)}",),
        )
        return
    yield finding(
        "env.ld_preload",
        Severity.INFO,
        v,
        f"LD_PRELOAD loads {', '.join(libs)} into every process",
        envrules.rule("LD_PRELOAD").breaks,
        undo(v),
    )
