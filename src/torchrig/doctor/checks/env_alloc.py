"""PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF against the allocator's grammar (``envrules.parse_alloc_conf``,
the keys and value types of c10's parser) and, where the torch probe asked it, torch's own parser."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor import envrules
from torchrig.doctor.checks.common import Context
from torchrig.doctor.checks.env_common import finding, undo, var
from torchrig.doctor.findings import Finding, Severity

_NATIVE_ONLY = ("max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions")


def alloc_conf(ctx: Context) -> Iterator[Finding]:
    torch_error = ctx.facts.torch.alloc_conf_error
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        v = var(ctx, name)
        if v is None:
            continue
        problems = envrules.parse_alloc_conf(v.value)
        if problems or torch_error:
            severity = Severity.ERROR if ctx.has_gpu_hardware else Severity.WARNING
            said = (f"torch's parser: {torch_error}",) if torch_error else ()
            yield finding(
                "env.alloc_conf",
                severity,
                v,
                f"{name}={v.value} is malformed: " + (problems[0] if problems else torch_error or ""),
                envrules.rule(name).breaks,
                undo(v),
                (
                    *problems[1:],
                    *said,
                    "form: key:value,key:value, e.g. expandable_segments:True,max_split_size_mb:512",
                ),
            )
            torch_error = None  # said once
            continue
        if envrules.alloc_backend(v.value) == "cudaMallocAsync" and any(k in v.value for k in _NATIVE_ONLY):
            yield finding(
                "env.alloc_conf",
                Severity.INFO,
                v,
                f"{name}: backend:cudaMallocAsync ignores {', '.join(k for k in _NATIVE_ONLY if k in v.value)}",
                "those options belong to the native caching allocator (the parser warns and ignores them)",
                undo(v),
            )
    both = [var(ctx, n) for n in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")]
    if all(both) and both[0] and both[1] and both[0].value != both[1].value:
        yield finding(
            "env.alloc_conf",
            Severity.WARNING,
            both[1],
            "PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF are both set, to different values",
            "PyTorch reads PYTORCH_ALLOC_CONF first; PYTORCH_CUDA_ALLOC_CONF is its older alias and is ignored",
            undo(both[1]),
            (f"PYTORCH_ALLOC_CONF={both[0].value!r}",),
        )
