"""GPU health that bites later: P2P between pairs, mixed architectures, persistence mode, ECC and row
remapping, throttling at idle, NVLink links down, other processes on the GPUs."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor import fixes
from torchrig.doctor.checks.common import Context
from torchrig.doctor.checks.visibility import visible_prefix
from torchrig.doctor.facts import GpuFacts, GpuProcess, P2PPair, ProbeStatus
from torchrig.doctor.findings import Finding, Severity
from torchrig.hw.nvml_records import p2p_verdict

# PCIe common ancestors under which P2P is expected to work (nvidia-smi topo -m: PIX, PXB, PHB); across
# CPU sockets (NODE/SYS) it commonly is not, and NCCL routes through host memory by design.
NEAR = ("internal", "single", "multiple", "hostbridge")
TOPO_NAME = {
    "internal": "same board",
    "single": "PIX",
    "multiple": "PXB",
    "hostbridge": "PHB",
    "node": "NODE",
    "system": "SYS",
}
# Clock-event reasons that, at idle, mean power or cooling trouble (nvml.h nvmlClocksEventReason*): a software
# power cap at idle means a power limit set far below the GPU's draw at rest
BAD_THROTTLE = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sw_power_cap",
)
XID_CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


def cuda_to_nvml(ctx: Context) -> dict[int, int]:
    """CUDA device ordinal -> NVML index, for the GPUs the torch probe saw; empty when that is not known.

    NVML ignores CUDA_VISIBLE_DEVICES, CUDA renumbers what it leaves visible: with CUDA_VISIBLE_DEVICES=2,3
    torch's pair (0, 1) is NVML's (2, 3). A mapping whose GPU names disagree with NVML's is not trusted.
    """
    t, gpus = ctx.facts.torch, ctx.facts.nvml.gpus
    if t.status is not ProbeStatus.OK or not t.device_count:
        return {}
    value = ctx.facts.env.cuda_visible_devices
    if value is None:
        mapping = {i: i for i in range(t.device_count)}
    else:
        seen, _ = visible_prefix(value, len(gpus) or None, [g.uuid for g in gpus if g.uuid])
        mapping = {}
        for ordinal, tok in enumerate(seen[: t.device_count]):
            if tok.startswith("GPU-"):
                match = [g.index for g in gpus if g.uuid and g.uuid.startswith(tok)]
                if len(match) == 1:
                    mapping[ordinal] = match[0]
            elif not tok.startswith("MIG-"):
                mapping[ordinal] = int(tok)
    if gpus:
        names = {g.index: g.name for g in gpus}
        for d in t.devices:
            n = mapping.get(d.index)
            if n is not None and (n not in names or (d.name and names[n] and d.name != names[n])):
                return {}
    return mapping


def cuda_peer_answers(ctx: Context) -> dict[tuple[int, int], bool]:
    """torch.cuda.can_device_access_peer per NVML pair (lower index first), only for pairs CUDA saw both of."""
    mapping = cuda_to_nvml(ctx)
    answers: dict[tuple[int, int], bool] = {}
    for p in ctx.facts.torch.peer_access:
        a, b = mapping.get(p.a), mapping.get(p.b)
        if a is not None and b is not None:
            answers[(min(a, b), max(a, b))] = answers.get((min(a, b), max(a, b)), True) and p.can_access
    return answers


def why_no_cuda_answer(ctx: Context) -> str:
    t = ctx.facts.torch
    if t.status is not ProbeStatus.OK:
        return f"torch probe {t.status.value}"
    if t.device_count is not None:
        shown = ctx.facts.env.cuda_visible_devices
        cvd = "" if shown is None else f" with CUDA_VISIBLE_DEVICES={shown}"
        return f"torch saw {t.device_count} GPU(s){cvd}"
    return "torch did not report its GPUs"


def nvml_says(p: P2PPair) -> bool | None:
    """NVML's P2P verdict from the read/write statuses it gave (None: it answered neither)."""
    return p2p_verdict(p.read, p.write)


def classify_pairs(ctx: Context) -> tuple[list[str], list[str], list[str], list[str]]:
    """GPU pairs as (broken: should have P2P but do not, far: across sockets without it, good, unknown).

    CUDA's answer wins, but only for a pair whose two GPUs CUDA saw; otherwise NVML's read/write status
    decides, and a pair neither answered for is unknown.
    """
    pairs = ctx.facts.nvml.p2p
    if not pairs:  # no NVML: judge from CUDA alone, in CUDA's own numbering
        peers = ctx.facts.torch.peer_access
        return (
            [
                f"GPU {p.a} <-> GPU {p.b}: torch.cuda.can_device_access_peer: False"
                for p in peers
                if not p.can_access
            ],
            [],
            [f"GPU {p.a} <-> GPU {p.b}: peer access OK (CUDA)" for p in peers if p.can_access],
            [],
        )
    cuda = cuda_peer_answers(ctx)
    broken, far, good, unknown = [], [], [], []
    for p in pairs:
        nvlink = p.nvlink == "ok"
        via = "NVLink" if nvlink else TOPO_NAME.get(p.topology or "", p.topology or "?")
        line = f"GPU {p.a} <-> GPU {p.b}: NVML read {p.read or 'no answer'}, write {p.write or 'no answer'}, via {via}"
        ok = cuda.get((min(p.a, p.b), max(p.a, p.b)))
        if ok is not None:  # CUDA's own answer wins over NVML's
            line += f"; torch.cuda.can_device_access_peer: {ok}"
        else:
            ok = nvml_says(p)
            line += f"; judged by NVML ({why_no_cuda_answer(ctx)})"
        if ok is None:
            unknown.append(line)
        elif ok:
            good.append(line)
        elif nvlink or p.topology in NEAR:
            broken.append(line)
        else:
            far.append(line)
    return broken, far, good, unknown


def p2p(ctx: Context) -> Iterator[Finding]:
    broken, far, good, unknown = classify_pairs(ctx)
    if broken:
        yield Finding(
            "gpu.p2p_unavailable",
            Severity.WARNING,
            f"P2P is unavailable between {len(broken)} GPU pair(s) that should have it",
            "these GPUs share NVLink or a PCIe switch/host bridge but cannot access each other's memory; "
            "the usual causes are PCIe ACS redirecting peer traffic through the root complex, or an IOMMU in "
            "translation mode; NCCL then copies through host memory (slow) or, with ACS, may hang",
            (
                "nvidia-smi topo -p2p rw   # the P2P matrix",
                "bare metal: disable PCIe ACS in the firmware and boot with iommu=pt (intel_iommu=on iommu=pt)",
                "VM: P2P needs the hypervisor to expose it; until then NCCL_P2P_DISABLE=1 avoids hangs",
            ),
            tuple(broken + far),
        )
    elif far:
        yield Finding(
            "gpu.p2p_cross_socket",
            Severity.INFO,
            f"no P2P across CPU sockets for {len(far)} pair(s)",
            "expected for GPUs on different CPU sockets; NCCL routes through host memory",
            (),
            tuple(far),
        )
    if unknown:
        yield Finding(
            "gpu.p2p_unknown",
            Severity.INFO,
            f"P2P between {len(unknown)} GPU pair(s) was not judged",
            "CUDA did not see both GPUs of the pair and NVML gave no P2P read/write status for it",
            ("nvidia-smi topo -p2p rw   # the P2P matrix",),
            tuple(unknown),
        )
    if good and not broken:
        yield Finding(
            "gpu.p2p",
            Severity.OK,
            f"P2P works between all {len(good)} GPU pair(s)"
            if not far and not unknown
            else f"P2P works between {len(good)} GPU pair(s)",
            evidence=tuple(good),
        )


def mixed_architectures(ctx: Context) -> Iterator[Finding]:
    ccs = {g.compute_capability for g in ctx.facts.nvml.gpus if g.compute_capability}
    if len(ccs) > 1:
        yield Finding(
            "gpu.mixed_architectures",
            Severity.WARNING,
            "GPUs of different architectures: " + ", ".join(sorted(ccs)),
            "one build must carry kernels for every architecture, and in data-parallel training the slowest "
            "GPU sets the pace for all",
            ("export CUDA_VISIBLE_DEVICES=<the indices of one kind>   # train on identical GPUs",),
            tuple(f"GPU {g.index}: {g.name} (cc {g.compute_capability})" for g in ctx.facts.nvml.gpus),
        )


def persistence(ctx: Context) -> Iterator[Finding]:
    off = [g for g in ctx.facts.nvml.gpus if g.persistence_mode is False]
    if off and not ctx.facts.kernel.wsl:
        host = "on the host: " if ctx.in_container else ""
        yield Finding(
            "gpu.persistence_off",
            Severity.INFO,
            "persistence mode is off on " + ", ".join(f"GPU {g.index}" for g in off),
            "without it the driver tears GPU state down whenever no process holds the GPU, so every CUDA "
            "start pays the re-initialisation (seconds on large GPUs) and clock/ECC settings can reset",
            (f"{host}sudo systemctl enable --now nvidia-persistenced", f"or {host}sudo nvidia-smi -pm 1"),
            tuple(f"GPU {g.index}: persistence mode off" for g in off),
        )


def ecc(ctx: Context) -> Iterator[Finding]:
    for g in ctx.facts.nvml.gpus:
        now, past = [], []
        if g.ecc_uncorrected_volatile:
            now.append(f"{g.ecc_uncorrected_volatile} uncorrected ECC error(s) since the driver loaded")
        if g.retired_pages_pending or g.remapped_rows_pending:
            now.append("a page retirement / row remap is pending until the GPU is reset")
        if g.remapped_rows_failed:
            now.append("row remapping FAILED (no spare rows left)")
        if g.ecc_uncorrected_aggregate:
            past.append(f"{g.ecc_uncorrected_aggregate} uncorrected ECC error(s) over the GPU's life")
        if g.retired_pages:
            past.append(f"{g.retired_pages} page(s) retired for double-bit errors")
        if g.remapped_rows_uncorrectable:
            past.append(f"{g.remapped_rows_uncorrectable} row(s) remapped for uncorrectable errors")
        if not now and not past:
            continue
        fix = (
            f"sudo nvidia-smi -r -i {g.index}   # reset (no process may use it), or reboot",
            f"nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT -i {g.index}   # details for an RMA",
        )
        if now:
            yield Finding(
                "gpu.ecc",
                Severity.WARNING,
                f"GPU {g.index} ({g.name}) has memory errors",
                "uncorrected ECC errors kill the process that hits them; a pending remap takes effect at "
                "the next reset; a failed remap means the GPU should be replaced",
                fix,
                tuple(now + past),
            )
        else:
            yield Finding(
                "gpu.ecc_history",
                Severity.INFO,
                f"GPU {g.index} ({g.name}) had memory errors in the past (already remapped/retired)",
                "repaired history; a count that keeps growing means the GPU is failing",
                fix[1:],
                tuple(past),
            )


def throttling(ctx: Context) -> Iterator[Finding]:
    for g in ctx.facts.nvml.gpus:
        idle = "gpu_idle" in g.throttle_reasons or (g.utilization_pct is not None and g.utilization_pct <= 5)
        bad = [r for r in g.throttle_reasons if r in BAD_THROTTLE]
        if idle and bad:
            yield Finding(
                "gpu.throttling",
                Severity.WARNING,
                f"GPU {g.index} is throttled while idle: {', '.join(bad)}",
                "thermal or power slowdown with no load points at cooling, airflow or the power supply; "
                "under load it will run well below its clocks",
                (f"nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {g.index}",),
                (
                    f"temperature {g.temperature_c} C, power {g.power_draw_w} / {g.power_limit_w} W, "
                    f"SM clock {g.sm_clock_mhz} / {g.sm_clock_max_mhz} MHz, utilization {g.utilization_pct}%",
                ),
            )


def nvlink(ctx: Context) -> Iterator[Finding]:
    for g in ctx.facts.nvml.gpus:
        if g.nvlink_active and g.nvlink_inactive:
            yield Finding(
                "gpu.nvlink_down",
                Severity.WARNING,
                f"GPU {g.index}: {g.nvlink_inactive} of {g.nvlink_active + g.nvlink_inactive} NVLink links are down",
                "links down lower peer bandwidth and can make NCCL pick slower paths",
                (
                    f"nvidia-smi nvlink -s -i {g.index}",
                    f"nvidia-smi nvlink -e -i {g.index}   # error counters",
                ),
                (f"{g.nvlink_active} active, {g.nvlink_inactive} inactive",),
            )


def _others(ctx: Context, g: GpuFacts) -> list[GpuProcess]:
    """The processes on GPU ``g`` other than doctor's own torch probe (it holds a context while it runs)."""
    return [p for p in g.processes if p.pid != ctx.facts.torch.pid]


def _who(p: GpuProcess) -> str:
    parts = [f"pid {p.pid}", p.name or "(name unknown)"]
    parts.append(f"user {p.user}" if p.user else "user unknown")
    if p.container:
        parts.append(f"container {p.container}")
    parts.append("memory unknown" if p.used_memory_mib is None else f"{p.used_memory_mib} MiB")
    if p.sm_util_pct is not None:
        parts.append(f"SM {p.sm_util_pct}%")
    return ", ".join(parts)


def processes(ctx: Context) -> Iterator[Finding]:
    """Who else is on the GPUs (``nvidia-smi``'s process table): a warning when they hold much of one."""
    th = fixes.thresholds()
    heavy, light, unlisted, evidence = [], [], [], []
    for g in ctx.facts.nvml.gpus:
        others = _others(ctx, g)
        total = g.memory_total_mib or 0
        held = sum(p.used_memory_mib or 0 for p in others)
        mine = sum(p.used_memory_mib or 0 for p in g.processes if p not in others)
        for p in others:
            evidence.append(f"GPU {g.index}: {_who(p)}")
        dark = (g.memory_used_mib or 0) - held - mine
        if total and dark > th["unlisted_memory_fraction"] * total:
            unlisted.append(g.index)
            evidence.append(
                f"GPU {g.index}: {dark} of {total} MiB in use by processes NVML does not list here "
                "(another container, VM or pid namespace)"
            )
        else:
            dark = 0  # the driver's own reserve, or nothing
        big = bool(total) and held + dark >= th["busy_memory_fraction"] * total
        busy_sm = any((p.sm_util_pct or 0) >= th["busy_sm_pct"] for p in others)
        if big or busy_sm:
            heavy.append(g)
            evidence.append(
                f"GPU {g.index}: {held + dark} of {total} MiB held by others, utilisation "
                f"{g.utilization_pct if g.utilization_pct is not None else 'unknown'}%"
            )
        elif others or g.index in unlisted:
            light.append(g)
    if not heavy and not light:
        return
    free = [
        g.index for g in ctx.facts.nvml.gpus if g not in heavy and g not in light and g.index not in unlisted
    ]
    pids = sorted({p.pid for g in heavy + light for p in _others(ctx, g)})
    names = sorted({p.container for g in heavy + light for p in _others(ctx, g) if p.container})
    fix = ["nvidia-smi   # the process table, live"]
    if pids:
        fix.append(f"ps -o user,pid,etime,args -p {','.join(map(str, pids))}   # who, since when, what")
    if names:
        fix.append(f"docker ps --filter name={names[0]}   # the container it runs in")
    if free:
        fix.append(f"export CUDA_VISIBLE_DEVICES={','.join(map(str, free))}   # the GPUs no one else is on")
    fix.append("ask the owner to stop it; if it is yours and stuck: kill <pid>")
    severity = Severity.WARNING if heavy else Severity.INFO
    which = heavy or light
    yield Finding(
        "gpu.busy",
        severity,
        "other processes are using "
        + ", ".join(f"GPU {g.index}" for g in which)
        + (" and hold much of it" if heavy else ""),
        "their memory and compute are not available to your job: a job sized for the whole GPU runs out of "
        "memory ('CUDA out of memory') or runs slower while they share it",
        tuple(fix),
        tuple(evidence),
    )


def pcie_link(ctx: Context) -> Iterator[Finding]:
    """A PCIe link narrower than it can be, or slower while the GPU works (``nvidia-smi -q -d PCIE``)."""
    for g in ctx.facts.nvml.gpus:
        narrow = (
            g.pcie_width_current is not None
            and g.pcie_width_max is not None
            and g.pcie_width_current < g.pcie_width_max
        )
        idle = "gpu_idle" in g.throttle_reasons or (g.utilization_pct is not None and g.utilization_pct <= 5)
        # the generation drops at idle to save power (the driver raises it under load): only a busy GPU counts
        slow = (
            not idle
            and g.pcie_gen_current is not None
            and g.pcie_gen_max is not None
            and g.pcie_gen_current < g.pcie_gen_max
        )
        if not (narrow or slow):
            continue
        what = []
        if narrow:
            what.append(f"x{g.pcie_width_current} of x{g.pcie_width_max} lanes")
        if slow:
            what.append(f"Gen{g.pcie_gen_current} of Gen{g.pcie_gen_max} under load")
        yield Finding(
            "gpu.pcie_link_degraded",
            Severity.WARNING,
            f"GPU {g.index}: PCIe link below its maximum ({', '.join(what)})",
            "host-to-GPU copies (data loading, checkpoints) and PCIe peer traffic run at the reduced rate; "
            "the usual causes are a card not fully seated, a riser or slot wired narrower, or a link that "
            "trained down after errors",
            (
                f"nvidia-smi -q -d PCIE -i {g.index}   # current and max generation and width, replay counters",
                f"sudo lspci -vv -s {(g.pci_bus_id or '')[-12:].lower() or '<bus id>'} | grep -e LnkCap -e LnkSta",
                "reseat the card or move it to a full-width slot; check the firmware's PCIe settings",
            ),
            (
                f"PCIe Gen{g.pcie_gen_current} x{g.pcie_width_current} now, Gen{g.pcie_gen_max} "
                f"x{g.pcie_width_max} max; utilisation {g.utilization_pct}%",
            ),
        )


def xid(ctx: Context) -> Iterator[Finding]:
    """Xid events in the kernel log: the driver's own record of GPU faults (``dmesg | grep Xid``)."""
    events = ctx.facts.kernel.xid_events
    if events is None:
        return
    if not events:
        yield Finding("gpu.xid", Severity.OK, "no Xid error in the kernel log")
        return
    codes = sorted({e.split("):", 1)[1].split(",", 1)[0].strip() for e in events if "):" in e})
    yield Finding(
        "gpu.xid",
        Severity.WARNING,
        f"the kernel log holds {len(events)} Xid error(s) (Xid {', '.join(codes)})",
        "Xid events are the driver's reports of GPU faults since boot: some point at an application's bug, "
        "others at the GPU itself, its memory, power or bus; each code's meaning and the action to take are "
        "in NVIDIA's Xid catalog",
        (
            "sudo dmesg -T | grep -e 'NVRM: Xid' -e 'NVRM: GPU at'   # when, and which GPU",
            f"look each code up in NVIDIA's Xid catalog: {XID_CATALOG}",
            "nvidia-smi -q -d ECC,ROW_REMAPPER -i <gpu>   # memory errors behind 48/63/64/94/95",
        ),
        events[-8:],
    )
