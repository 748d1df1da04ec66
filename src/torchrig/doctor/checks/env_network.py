"""The variables that choose NCCL's and gloo's network (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA)
against the interfaces and InfiniBand devices of this host, and the ones that switch a transport off
(NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, NCCL_IB_DISABLE) on a host that has it."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor import envrules
from torchrig.doctor.checks.common import Context
from torchrig.doctor.checks.env_common import finding, undo, var
from torchrig.doctor.findings import Finding, Severity

_TRUE = ("1", "true", "yes", "on")


def _usable(ifaces: tuple[str, ...]) -> list[str]:
    return [i for i in ifaces if i != "lo"] or list(ifaces)


def socket_ifname(ctx: Context) -> Iterator[Finding]:
    ifaces = ctx.facts.env.net_interfaces
    if ifaces is None:
        return
    v = var(ctx, "NCCL_SOCKET_IFNAME")
    if v is not None and v.value.strip():
        picked = envrules.select_interfaces(v.value.strip(), ifaces)
        if not picked:
            good = _usable(ifaces)
            yield finding(
                "env.nccl_socket_ifname",
                Severity.ERROR,
                v,
                f"NCCL_SOCKET_IFNAME={v.value} selects no network interface of this host: NCCL cannot bootstrap",
                envrules.rule(v.name).breaks,
                undo(v, f"={good[0]}" if good else None),
                (f"interfaces here: {', '.join(ifaces) or 'none'}",),
            )
    g = var(ctx, "GLOO_SOCKET_IFNAME")
    if g is not None and g.value.strip():
        # gloo takes a comma-separated list of exact names (ProcessGroupGloo's createDeviceForInterface)
        missing = [n for n in g.value.split(",") if n and n not in ifaces]
        if missing:
            good = _usable(ifaces)
            yield finding(
                "env.gloo_socket_ifname",
                Severity.ERROR,
                g,
                f"GLOO_SOCKET_IFNAME names {', '.join(missing)}, which this host does not have",
                envrules.rule(g.name).breaks,
                undo(g, good[0] if good else None),
                (f"interfaces here: {', '.join(ifaces) or 'none'}",),
            )


def ib_hca(ctx: Context) -> Iterator[Finding]:
    v = var(ctx, "NCCL_IB_HCA")
    devs = ctx.facts.env.ib_devices
    if v is None or not v.value.strip() or devs is None:
        return
    present = {d.name: d.ports for d in devs}
    listing = ", ".join(f"{d.name} (ports {', '.join(map(str, d.ports)) or '?'})" for d in devs) or "none"
    if not present:
        yield finding(
            "env.nccl_ib_hca",
            Severity.INFO,
            v,
            f"NCCL_IB_HCA={v.value} is set, but this host has no InfiniBand/RoCE device",
            "NCCL uses sockets here whatever it says; the setting belongs to another machine's profile",
            undo(v),
            ("/sys/class/infiniband: no devices",),
        )
        return
    _exclude, entries = envrules.parse_ib_hca(v.value.strip())
    bad_ports = [e for e in entries if e.port == -1]
    picked = envrules.select_hcas(v.value.strip(), present)
    if picked and not bad_ports:
        return
    why = (
        f"a port that is not a number ({', '.join(e.name for e in bad_ports)})"
        if bad_ports
        else "it selects none of the devices (or ports) this host has"
    )
    yield finding(
        "env.nccl_ib_hca",
        Severity.WARNING,
        v,
        f"NCCL_IB_HCA={v.value} selects no InfiniBand device of this host: NCCL falls back to sockets",
        f"{why}; " + envrules.rule(v.name).breaks,
        undo(v, "=" + ",".join(present) if present else None),
        (f"InfiniBand devices here: {listing}",),
    )


def transports_disabled(ctx: Context) -> Iterator[Finding]:
    gpus = ctx.facts.nvml.gpus
    n_gpus = len(gpus) or (ctx.facts.torch.device_count or 0)
    nvlink = any((g.nvlink_active or 0) > 0 for g in gpus)
    ib = bool(ctx.facts.env.ib_devices)
    for name, has, what in (
        ("NCCL_P2P_DISABLE", n_gpus > 1, "NVLink between the GPUs" if nvlink else f"{n_gpus} GPUs"),
        ("NCCL_SHM_DISABLE", n_gpus > 1, f"{n_gpus} GPUs"),
        ("NCCL_IB_DISABLE", ib, "InfiniBand/RoCE devices"),
    ):
        v = var(ctx, name)
        if v is None or v.value.strip().lower() not in _TRUE or not has:
            continue
        yield finding(
            "env.nccl_transport_disabled",
            Severity.WARNING,
            v,
            f"{name}={v.value} switches off a transport this host has ({what})",
            envrules.rule(name).breaks,
            undo(v),
            (f"{what} here",),
        )
