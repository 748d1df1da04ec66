"""Which devices CUDA enumerates for a ``CUDA_VISIBLE_DEVICES`` value: CUDA's own rule, as plain code.

Doctor judges the variable with it (``torchrig.doctor.checks.visibility``); the launcher plans from NVML with
it before CUDA is touched (``torchrig.launch.gpuplan``). No imports: both read it at start-up.
"""

from __future__ import annotations


def visible_prefix(value: str, count: int | None, uuids: list[str]) -> tuple[list[str], str | None]:
    """The devices CUDA enumerates for ``CUDA_VISIBLE_DEVICES=value``, and the first invalid entry.

    CUDA reads the comma-separated list left to right and stops at the first entry that is not a valid
    index or (prefix of a) GPU/MIG UUID: "0,7,1" on a 2-GPU machine exposes only device 0.
    (CUDA C Programming Guide, "CUDA Environment Variables".)
    """
    seen: list[str] = []
    for raw in value.split(","):
        tok = raw.strip()
        if tok.startswith(("GPU-", "MIG-")):
            match = [u for u in uuids if u.startswith(tok)]
            if len(match) != 1 and uuids:
                return seen, tok
            seen.append(tok)
            continue
        try:
            idx = int(tok)
        except ValueError:
            return seen, tok
        if idx < 0 or (count is not None and idx >= count):
            return seen, tok
        seen.append(tok)
    return seen, None


def visible_ids(count: int, env: dict[str, str]) -> tuple[int, ...]:
    """Physical ids of the visible GPUs: the parent's numeric CUDA_VISIBLE_DEVICES, or 0..count-1."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd:
        parts = [p.strip() for p in cvd.split(",") if p.strip()]
        if all(p.isdigit() for p in parts) and len(parts) >= count:
            return tuple(int(p) for p in parts[:count])
    return tuple(range(count))
