"""--gpus parsing and locality-aware picking, on recorded inventories."""

from __future__ import annotations

import pytest

from torchrig.errors import InputError, UsageError
from torchrig.runtime.inventory import Inventory, Unit, load_snapshot
from torchrig.runtime.placement import parse_gpus, pick, resolve_named


@pytest.fixture
def h200(request) -> Inventory:
    from pathlib import Path

    return load_snapshot(Path(request.config.rootpath) / "tests/fixtures/runtime/inventory-8xh200.json")


@pytest.fixture
def mig(request) -> Inventory:
    from pathlib import Path

    return load_snapshot(Path(request.config.rootpath) / "tests/fixtures/runtime/mig-1xh100-3-instances.json")


@pytest.mark.parametrize(
    "text,kind",
    [
        ("all", "all"),
        ("2", "count"),
        ("0,2", "indices"),
        ("device=1", "indices"),
        ("GPU-5f0e2a6c-0000-4b1e-9c3d-8a7e6f5d4c00", "uuids"),
        (None, "none"),
    ],
)
def test_parse_gpus_forms(text, kind):
    assert parse_gpus(text).kind == kind


def test_device_equals_is_an_index_not_a_count():
    assert parse_gpus("device=1").indices == (1,)
    assert parse_gpus("1").count == 1


@pytest.mark.parametrize("text", ["0", "two", "0,,x", "1,1", "GPU-zz", "-1"])
def test_parse_gpus_rejects(text):
    with pytest.raises(UsageError):
        parse_gpus(text)


def test_pick_prefers_one_numa_node_within_nvlink(h200):
    units = h200.units()
    got = pick(units, 4)
    assert [u.gpu_index for u in got] == [0, 1, 2, 3]
    # with 0 and 1 taken, 2 GPUs come from one NUMA node, the best fitting one (2,3 rather than 4..7)
    got = pick([u for u in units if u.gpu_index not in (0, 1)], 2)
    assert [u.gpu_index for u in got] == [2, 3]
    got = pick([u for u in units if u.gpu_index not in (0, 1)], 3)
    assert {u.numa_node for u in got} == {1}


def test_pick_pcie_groups_by_numa():
    units = [Unit(f"GPU-{i}", i, str(i), False, 0 if i in (0, 3) else 1, None) for i in range(4)]
    assert [u.gpu_index for u in pick(units, 2)] == [0, 3]


def test_pick_spreads_when_no_group_fits():
    units = [Unit(f"GPU-{i}", i, str(i), False, i % 2, "nv-a" if i < 2 else "nv-b") for i in range(4)]
    got = pick(units, 3)
    assert len(got) == 3 and len({u.uuid for u in got}) == 3


def test_pick_none_when_too_few(h200):
    assert pick(h200.units()[:3], 4) is None


def test_mig_instances_are_units_and_whole_mig_gpu_is_not(mig):
    units = mig.units()
    assert sum(u.is_mig for u in units) == 3
    assert [u.gpu_index for u in units if not u.is_mig] == [1]
    with pytest.raises(InputError, match="MIG mode"):
        resolve_named(parse_gpus("0" + ","), mig)
    inst = resolve_named(parse_gpus(units[0].uuid), mig)
    assert inst[0].is_mig
    assert pick(units, 1)[0].gpu_index == 1  # a count never picks MIG instances


def test_unknown_index_and_uuid(h200):
    with pytest.raises(InputError, match="no GPU 9"):
        resolve_named(parse_gpus("1,9"), h200)
    with pytest.raises(InputError, match="no GPU or MIG"):
        resolve_named(parse_gpus("GPU-00000000-0000-0000-0000-000000000000"), h200)


def test_shared_pick_prefers_a_free_gpu_in_another_group():
    """Two PCIe GPUs on two NUMA nodes, one shared already: a sharer gets the free one."""
    a = Unit(uuid="GPU-a", gpu_index=0, label="0", is_mig=False, nvlink_domain=None, numa_node=0)
    b = Unit(uuid="GPU-b", gpu_index=1, label="1", is_mig=False, nvlink_domain=None, numa_node=1)
    assert pick([a, b], 1, {"GPU-a": 1}) == (b,)
    assert pick([a, b], 1, {"GPU-a": 1, "GPU-b": 1}) == (a,)
    assert pick([a, b], 1) == (a,)


def test_dry_run_preview_is_the_lease_choice(tmp_path):
    """preview (up --dry-run) and acquire (up) choose the same units, --share and tie-break included."""
    import time
    from pathlib import Path

    from torchrig.runtime.lease import NoFreeGpu, acquire, preview
    from torchrig.runtime.ledger import Ledger

    inv = load_snapshot(str(Path(__file__).parents[1] / "fixtures/runtime/driver-535-2xa100-pcie.json"))
    led = Ledger.open(tmp_path)
    req = parse_gpus("1")
    kw = {"live": None, "listed_at_s": time.time()}
    for name in ("a", "b"):
        acquire(led, inv, req, user="u", container=name, share=True, **kw)
    with pytest.raises(NoFreeGpu):
        preview(led, inv, req, share=False, **kw)
    planned = preview(led, inv, req, share=True, **kw)
    assert planned == acquire(led, inv, req, user="u", container="c", share=True, **kw)
