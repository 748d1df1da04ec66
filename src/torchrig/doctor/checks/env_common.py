"""What every environment-variable check says the same way: the variable, its value, where it was probably
set, the fix at that place, and the page that documents it."""

from __future__ import annotations

import shlex

from torchrig.doctor import envrules
from torchrig.doctor.checks.common import Context
from torchrig.doctor.facts import EnvVar
from torchrig.doctor.findings import Finding, Severity

CONTAINER = "container"


def var(ctx: Context, name: str) -> EnvVar | None:
    for v in ctx.facts.env.variables or ():
        if v.name == name:
            return v
    return None


def where(v: EnvVar) -> str:
    files = [p for p in v.set_in if p != CONTAINER]
    parts = []
    if files:
        parts.append("set in " + ", ".join(files))
    if CONTAINER in v.set_in:
        parts.append("in the container's start environment (the image's ENV or docker run -e)")
    if not parts:
        return (
            "set in this process's environment only (the shell that ran doctor, a module load, the job "
            "launcher), not in a profile file doctor read"
        )
    return "; ".join(parts)


def undo(v: EnvVar, better: str | None = None) -> tuple[str, ...]:
    """The fix at each place the variable is set, then for this shell."""
    now = f"export {v.name}={shlex.quote(better)}" if better is not None else f"unset {v.name}"
    steps = []
    for place in v.set_in:
        if place == CONTAINER:
            steps.append(
                "in the Dockerfile's ENV or the docker run -e of this container: "
                + (f"{v.name}={better}" if better is not None else f"remove {v.name}")
            )
        else:
            path, _, line = place.rpartition(":")
            steps.append(
                f"edit {path} line {line}: "
                + (f"set {v.name}={better}" if better is not None else f"remove the {v.name} line")
            )
    steps.append(f"{now}   # this shell, now")
    return tuple(steps)


def finding(
    id: str,
    severity: Severity,
    v: EnvVar,
    summary: str,
    cause: str,
    fix: tuple[str, ...],
    evidence: tuple[str, ...] = (),
) -> Finding:
    r = envrules.rule(v.name) if v.name in envrules.names() else None
    doc = (f"documented: {r.source}",) if r else ()
    reader = f" ({r.reader} reads it)" if r else ""
    return Finding(
        id,
        severity,
        summary,
        cause + reader,
        fix,
        (f"{v.name}={v.value!r}", where(v), *evidence, *doc),
    )
