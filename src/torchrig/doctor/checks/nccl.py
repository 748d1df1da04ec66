"""The NCCL bootstrap check: a one-process communicator on each visible GPU (the torch probe builds it). A
failure here is what the first ``init_process_group("nccl")`` of a job would meet."""

from __future__ import annotations

from collections.abc import Iterator

from torchrig.doctor.checks.common import Context
from torchrig.doctor.facts import NcclPairCheck
from torchrig.doctor.findings import Finding, Severity


def bootstrap(ctx: Context) -> Iterator[Finding]:
    n = ctx.facts.torch.nccl
    if n is None or n.status == "skipped":
        return
    env = (f"NCCL environment: {' '.join(n.env_used)}",) if n.env_used else ()
    if n.status == "ok":
        yield from _pairs(n.pairs, env)
        ms = sum(d.elapsed_ms or 0 for d in n.devices)
        paired = (
            f"; {len(n.pairs)} GPU pair(s) all-reduce across two ranks"
            if n.pairs and all(p.ok for p in n.pairs)
            else ""
        )
        yield Finding(
            "nccl.ok",
            Severity.OK,
            f"NCCL: a communicator bootstraps and all-reduces on each of {len(n.devices)} GPU(s) ({ms:.0f} ms)"
            + paired,
            evidence=env,
        )
        return
    bad = [d for d in n.devices if not d.ok]
    first = next((d.error for d in bad if d.error), None) or n.error or "no error text"
    named = [f for f in ctx.found if f.id in ("env.nccl_socket_ifname", "env.nccl_ib_hca")]
    cause = (
        f"the environment explains it: {named[0].summary}"
        if named
        else "NCCL could not set up a communicator even inside one process: its bootstrap (an IP interface), "
        "or its transport, or the GPU failed"
    )
    where = ", ".join(f"GPU {d.index}" for d in bad) or "the GPUs"
    yield Finding(
        "nccl.bootstrap_failed",
        Severity.ERROR,
        f"NCCL fails on {where}: {first.splitlines()[0][:200]}"
        if n.status == "failed"
        else f"the NCCL check {n.status}: {first.splitlines()[0][:200]}",
        cause,
        (
            *(named[0].fix if named else ()),
            "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET torchrig doctor --only torch   # NCCL's own account",
        ),
        (*(f"GPU {d.index}: {d.error}" for d in bad if d.error), *env),
    )


def _pairs(pairs: tuple[NcclPairCheck, ...], env: tuple[str, ...]) -> Iterator[Finding]:
    bad = [p for p in pairs if not p.ok]
    if not bad:
        return
    first = (bad[0].error or "no error text").splitlines()[0][:200]
    yield Finding(
        "nccl.pair_failed",
        Severity.ERROR,
        f"NCCL between {', '.join(f'GPU {p.a} and {p.b}' for p in bad[:4])}"
        + (f" and {len(bad) - 4} more pairs" if len(bad) > 4 else "")
        + f" fails: {first}",
        "one process per GPU works, two ranks across these GPUs do not: their transport (P2P over NVLink or PCIe, "
        "shared memory) fails; see gpu.p2p_unavailable and the NCCL_P2P_*/NCCL_SHM_* variables",
        (
            "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM torchrig doctor --deep --only torch   # NCCL's account",
            "nvidia-smi topo -m   # how the pair is connected",
        ),
        (*(f"GPU {p.a}-{p.b}: {p.error}" for p in bad if p.error), *env),
    )
