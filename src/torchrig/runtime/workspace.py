"""Which named volumes hold an environment's /workspace: the ones labelled with its name and made by its owner.

Shared by ``down`` run directly and ``down`` run by the host daemon, so both keep or delete the same volumes.
"""

from __future__ import annotations

from typing import Any

from torchrig.contract import ENV_LABEL_PREFIX

_UID = f"{ENV_LABEL_PREFIX}uid"


def workspace_volumes(engine: Any, env: Any) -> list[str]:
    """The workspace volume(s) of the live environment ``env`` (a volume with no owner label counts as its)."""
    return [
        name
        for name, labels in engine.workspace_volumes(env.name)
        if env.owner_uid is None or labels.get(_UID) in (None, str(env.owner_uid))
    ]


def volumes_left(engine: Any, name: str, owner: int | None) -> list[str]:
    """The workspace volumes of ``name`` (whose container is gone) that ``owner`` made (None: anyone's)."""
    return [
        v for v, labels in engine.workspace_volumes(name) if owner is None or labels.get(_UID) == str(owner)
    ]


def take_down(
    engine: Any, ledger: Any, env: Any, *, timeout_s: float, delete_volumes: bool
) -> dict[str, Any]:
    """Remove ``env``'s container, free its GPU lease and (only when asked) delete its workspace volumes:
    what ``down`` does for one environment, by the CLI and by the host daemon alike. The record ``down``
    reports: the GPUs freed, the volumes deleted and those kept."""
    engine.remove(env.id, stop_timeout_s=timeout_s)
    freed = ledger.release(env.name)
    volumes = workspace_volumes(engine, env)  # kept unless asked: the files of its /workspace
    deleted = [v for v in volumes if delete_volumes and engine.remove_volume(v)]
    return {
        "name": env.name,
        "user": env.user,
        "freed_gpus": [f.unit_label for f in freed],
        "volumes_deleted": deleted,
        "volumes_kept": [v for v in volumes if v not in deleted],
    }
