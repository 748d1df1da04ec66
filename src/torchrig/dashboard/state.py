"""What the page shows, collected through the CLI's own adapters: the GPU inventory (NVML, or a recorded
inventory), the lease ledger reconciled with the engine, the engine's environments, the latest bench report
and doctor's verdict. Returns plain JSON-ready dictionaries; :mod:`torchrig.dashboard.page` renders them.

Tokens: the Jupyter link (with its token) and the ssh command are added only for the viewer's own running
environments, read from that environment's secrets inside the container. No other user's token is ever read.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrig.accounts import account_name
from torchrig.errors import EngineUnavailable, InputError, TorchrigError

MAX_BENCH_FILE_BYTES = 64 * 2**20  # a bench report is ~1 MB


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the user who started the dashboard (its real uid)."""

    uid: int
    name: str

    @classmethod
    def current(cls) -> Viewer:
        uid = os.getuid()
        return cls(uid, account_name(uid) or str(uid))


def _owned(env: Any, viewer: Viewer) -> bool:
    owned_by = getattr(env, "owned_by", None)
    if callable(owned_by):  # the environment records its owner's uid
        return bool(owned_by(viewer.uid))
    return bool(env.user == viewer.name)


def _readings(temperature_c: int | None, power_w: float | None, processes: Any) -> dict[str, Any]:
    """One GPU's row readings; ``processes`` are GpuProcess records or (pid, user, memory MiB, name)."""
    rows = [p if isinstance(p, tuple) else (p.pid, p.user, p.used_memory_mib, p.name) for p in processes]
    return {
        "temperature_c": temperature_c,
        "power_w": None if power_w is None else round(power_w),
        "processes": [{"pid": a, "user": u, "memory_mib": m, "name": n} for a, u, m, n in rows],
    }


def live_readings(inv: Any) -> dict[int, dict[str, Any]]:
    """Temperature, power and the processes of each GPU, read now through torchrig's NVML adapter
    (``nvidia-smi``'s figures and process table); for a recorded inventory, what the recording holds; {}
    when NVML cannot start."""
    if not str(inv.source).startswith("nvml"):
        return {g.index: _readings(g.temperature_c, g.power_draw_w, g.processes) for g in inv.gpus}
    from torchrig.doctor.probes.processes import user_of
    from torchrig.hw import nvml as hw

    out: dict[int, dict[str, Any]] = {}
    try:
        with hw.session() as nv:
            for g in inv.gpus:
                now, health = nv.sensors(g.index), nv.health(g.index)
                procs = [(p.pid, user_of(p.pid), p.used_memory_mib, p.name) for p in health.processes]
                out[g.index] = _readings(now.temperature_c, now.power_draw_w, procs)
    except hw.NvmlError:
        return {}
    return out


def _gpus(inv: Any, leases: list[Any]) -> list[dict[str, Any]]:
    held: dict[str, list[Any]] = {}
    for lease in leases:
        held.setdefault(lease.unit_uuid, []).append(lease)
    rows = []
    live = live_readings(inv)
    for g in inv.gpus:
        now = live.get(g.index, {})
        uuids = [m.uuid for m in g.mig_instances] if g.mig_mode else [g.uuid]
        holders = [
            {
                "user": lease.user,
                "environment": lease.container,
                "since_s": lease.acquired_at_s,
                "shared": bool(lease.shared),
                "unit": lease.unit_label,
            }
            for u in uuids
            for lease in held.get(u, [])
        ]
        rows.append(
            {
                "index": g.index,
                "name": g.name,
                "memory_used_mib": g.memory_used_mib,
                "memory_total_mib": g.memory_total_mib,
                "utilization_gpu_pct": g.utilization_pct,
                "temperature_c": now.get("temperature_c"),
                "power_w": now.get("power_w"),
                "processes": now.get("processes", []),
                "mig": [m.name for m in g.mig_instances] if g.mig_mode else [],
                "holders": holders,
            }
        )
    return rows


def _access(engine: Any, env: Any) -> dict[str, str]:
    """The viewer's own environment: its Jupyter link with the token, and the ssh command."""
    from torchrig.contract import JUPYTER_TOKEN_FILE

    out: dict[str, str] = {}
    if "jupyter" in env.ports:
        ip, port = env.ports["jupyter"]
        url = f"http://{ip if ip not in ('0.0.0.0', '') else '127.0.0.1'}:{port}/lab"
        try:
            token = engine.get_file(env.id, JUPYTER_TOKEN_FILE).decode().strip()
        except Exception:  # the container's secrets are unreadable: the link still helps
            token = ""
        out["jupyter"] = url + (f"?token={token}" if token else "")
    if "ssh" in env.ports:
        from torchrig.runtime import hostkey

        ip, port = env.ports["ssh"]
        host = ip if ip not in ("0.0.0.0", "") else "127.0.0.1"
        known = hostkey.known_hosts_file()
        out["ssh"] = hostkey.ssh_command(
            port, env.name, env.container_user or "root", host, known if known.is_file() else None
        )
    return out


def _environments(engine: Any, envs: list[Any], viewer: Viewer) -> list[dict[str, Any]]:
    rows = []
    for e in envs:
        mine = _owned(e, viewer)
        rows.append(
            {
                "name": e.name,
                "owner": e.user,
                "state": e.state,
                "status": e.status,
                "gpus": list(e.gpu_labels),
                "image": e.image,
                "created": e.created,
                "mine": mine,
                "access": _access(engine, e) if mine and e.alive else {},
                "ports": sorted(p for _, p in e.ports.values()) if mine and e.alive else [],
            }
        )
    return rows


def bench_summary(bench_dir: str | None) -> dict[str, Any] | None:
    """The latest bench report in ``bench_dir`` (what ``torchrig bench --out DIR`` wrote), or None."""
    if not bench_dir:
        return None
    from torchrig.bench import render
    from torchrig.bench.records import Grade
    from torchrig.bench.run import read_report

    try:
        report = read_report(Path(bench_dir) / "bench.json", max_bytes=MAX_BENCH_FILE_BYTES)
    except InputError as err:  # missing, a FIFO, a device, a runaway file, not a report: said on the page
        return {"verdict": f"no readable bench report: {err.one_line()}", "summary": {}, "has_plot": False}
    meta = report.measurements.meta
    return {
        "verdict": render.verdict(report.counts, report.measurements),
        "summary": report.counts,
        "date_utc": meta.date_utc,
        "command": meta.command_line,
        "failed": [f.id for f in report.findings if f.grade is Grade.FAIL][:20],
        "has_plot": (Path(bench_dir) / "bench.png").is_file(),
    }


def doctor_verdict() -> dict[str, Any]:
    """doctor's verdict for this host, without the torch probe (the areas that need no interpreter)."""
    from torchrig.doctor import diagnose
    from torchrig.doctor.probes import ProbeOptions, collect

    try:
        report = diagnose(
            collect(ProbeOptions(python=None, torch=False, timeout_s=10)), ["driver", "gpu", "container"]
        )
        data = report.to_json()
    except TorchrigError as err:
        return {"verdict": f"doctor could not run: {err.one_line()}", "findings": []}
    findings = [
        {"severity": f.severity.value, "summary": f.summary, "id": f.id}
        for f in report.findings
        if not f.severity.passed
    ]
    v = data.get("verdict") or {}
    text = (
        f"{v.get('status', '?')}: {v.get('error', 0)} error(s), {v.get('warning', 0)} warning(s), "
        f"{v.get('info', 0)} note(s) (driver, GPUs, container; 'torchrig doctor' for the whole check)"
        if isinstance(v, dict)
        else str(v)
    )
    return {"verdict": text, "findings": findings[:20]}


def collect(
    viewer: Viewer, inventory: str | None, bench_dir: str | None, doctor: dict[str, Any] | None
) -> dict[str, Any]:
    """Everything the page shows, now."""
    from torchrig.hostd.client import daemon_socket
    from torchrig.runtime.ledger import Ledger
    from torchrig.runtime.nvml import current

    sock = daemon_socket()
    if sock is not None:  # the host daemon decides what this viewer may see
        return _collect_via_daemon(sock, viewer, bench_dir, doctor)
    notes: list[str] = []
    inv = current(inventory)
    ledger = Ledger.open()
    envs: list[Any] = []
    engine = None
    try:
        from torchrig.runtime.engine import Engine
        from torchrig.runtime.lease import reconcile

        engine = Engine.connect(timeout_s=5)
        reconcile(ledger, engine)
        envs = engine.environments()
    except EngineUnavailable as err:
        notes.append(f"environments unknown: {err.one_line()}")
    gpus = _gpus(inv, ledger.leases())
    environments = _environments(engine, envs, viewer) if engine is not None else []
    return _page(viewer, inv, gpus, environments, bench_dir, doctor, notes)


def _page(
    viewer: Viewer,
    inv: Any,
    gpus: list[dict[str, Any]],
    environments: list[dict[str, Any]],
    bench_dir: str | None,
    doctor: dict[str, Any] | None,
    notes: list[str],
) -> dict[str, Any]:
    """The page's data, whichever way it was collected (the engine and ledger, or the host daemon)."""
    return {
        "viewer": viewer.name,
        "at_s": time.time(),
        "driver": inv.driver_version,
        "cuda": inv.cuda_driver_version,
        "inventory": inv.source,
        "gpus": gpus,
        "environments": environments,
        "bench": bench_summary(bench_dir),
        "doctor": doctor,
        "notes": notes,
    }


class _NoSecrets:
    """Through the host daemon the dashboard reads no container's files: links come without tokens."""

    def get_file(self, container_id: str, path: str) -> bytes:
        raise PermissionError(path)


def _collect_via_daemon(
    sock: Path, viewer: Viewer, bench_dir: str | None, doctor: dict[str, Any] | None
) -> dict[str, Any]:
    """The page's data from the host daemon: the GPU board, and the viewer's own environments only."""
    from torchrig.hostd.client import call
    from torchrig.hostd.wire import from_jsonable
    from torchrig.runtime.engine import EnvRecord
    from torchrig.runtime.inventory import from_dict
    from torchrig.runtime.ledger import Lease

    board = call(sock, "gpus", {"free": False})
    inv = from_dict(board["inventory"], board["source"])
    ps = call(sock, "ps", {"mine": True})
    envs = [
        from_jsonable(EnvRecord, {k: v for k, v in e.items() if k != "alive"}) for e in ps["environments"]
    ]
    notes = [
        *board["notes"],
        "through the host daemon: your environments only; Jupyter tokens as 'up' printed them",
    ]
    gpus = _gpus(inv, [from_jsonable(Lease, x) for x in board["leases"]])
    return _page(viewer, inv, gpus, _environments(_NoSecrets(), envs, viewer), bench_dir, doctor, notes)
