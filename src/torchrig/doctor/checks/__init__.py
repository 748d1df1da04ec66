"""The checks: pure functions from :class:`~torchrig.doctor.facts.Facts` to findings.

They run in order, root causes first: a later check sees the findings before it (``ctx.found``) so that,
for example, "CUDA is unavailable for an unexplained reason" only appears when nothing else explains it.
Each check belongs to an area, which ``torchrig doctor --only AREA`` selects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torchrig.doctor.areas import AREAS as AREAS
from torchrig.doctor.checks import (
    container,
    driver,
    env_alloc,
    env_debug,
    env_devices,
    env_network,
    gpu,
    libraries,
    nccl,
    pytorch,
    visibility,
)
from torchrig.doctor.checks.common import Context
from torchrig.doctor.facts import Facts
from torchrig.doctor.findings import Finding, Severity, sort_findings

Check = Callable[[Context], Iterable[Finding]]


# (area, check) in the order they run: what blocks CUDA first, then what bites later.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("driver", driver.probe_failures),
    ("container", container.no_gpu_access),
    ("driver", driver.missing),
    ("driver", driver.module_not_loaded),
    ("driver", libraries.driver_libraries),
    ("driver", driver.version_mismatch),
    ("driver", driver.device_nodes),
    ("driver", driver.uvm_node),
    ("driver", driver.uvm),
    ("driver", driver.nvml_failed),
    ("driver", driver.fabric_manager),
    ("driver", driver.ok),
    ("env", visibility.cuda_visible_devices),
    ("env", env_devices.device_order),
    ("env", env_alloc.alloc_conf),
    ("env", env_network.socket_ifname),
    ("env", env_network.ib_hca),
    ("env", env_network.transports_disabled),
    ("env", env_debug.ld_preload),
    ("gpu", visibility.mig_without_instances),
    ("torch", pytorch.not_installed),
    ("torch", pytorch.cpu_build),
    ("torch", pytorch.driver_too_old),
    ("torch", pytorch.arch_not_covered),
    ("env", pytorch.shadowed_libraries),
    ("torch", pytorch.unexplained),
    ("env", pytorch.nvcc_mismatch),
    ("torch", pytorch.newer_build),
    ("torch", pytorch.works),
    ("torch", nccl.bootstrap),
    ("env", env_debug.debug_settings),
    ("driver", driver.nvml_bindings),
    ("container", container.shm),
    ("container", container.memlock),
    ("container", container.stack),
    ("container", container.cgroup_limits),
    ("container", container.docker_toolkit),
    ("gpu", gpu.p2p),
    ("gpu", gpu.mixed_architectures),
    ("gpu", gpu.persistence),
    ("gpu", gpu.ecc),
    ("gpu", gpu.throttling),
    ("gpu", gpu.nvlink),
    ("gpu", gpu.processes),
    ("gpu", gpu.pcie_link),
    ("gpu", gpu.xid),
)


def run_checks(
    facts: Facts,
    kb_loader: Callable[[], Any] | None = None,
    areas: Iterable[str] | None = None,
    *,
    strict: bool = True,
) -> tuple[list[Finding], str]:
    """All findings for ``facts``, most severe first, and whether the knowledge base was loaded/needed.

    ``kb_loader`` returns the compatibility knowledge base (or None); it is called only if a check needs it.
    A check that raises is a bug and reaches the CLI's internal-error handler (exit 3, with a report). With
    ``strict=False`` (the diagnosis ``torchrig install`` runs after installing) it becomes a note instead, so
    a doctor bug does not hide an install that worked.
    """
    wanted = set(areas) if areas else set(AREAS)
    ctx = Context(facts, kb_loader)
    for area, check in CHECKS:
        try:
            found = list(check(ctx))
        except Exception as err:
            if strict:
                raise
            found = [
                Finding(
                    f"doctor.check_failed.{check.__name__}",
                    Severity.INFO,
                    f"the {check.__name__} check failed: {type(err).__name__}: {err}",
                    "a bug in torchrig doctor; the other checks ran",
                    (
                        "torchrig doctor --debug --record facts.json   # and attach facts.json to a bug report",
                    ),
                )
            ]
        ctx.found.extend(found)  # later checks see every earlier finding, even of unselected areas
        if area in wanted:
            ctx.shown.extend(found)
    return sort_findings(ctx.shown), ctx.kb_state
