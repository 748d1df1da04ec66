"""The SQLite lease ledger: exclusive leases, sharing, reconciliation, and concurrent acquisition."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from torchrig.runtime.inventory import load_snapshot
from torchrig.runtime.lease import NoFreeGpu, acquire
from torchrig.runtime.ledger import Ledger
from torchrig.runtime.placement import GpuHeld, parse_gpus

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/runtime/inventory-8xh200.json"


@pytest.fixture
def inv():
    return load_snapshot(FIXTURE)


def take(ledger, inv, gpus, name, share=False, live=None):
    return acquire(
        ledger,
        inv,
        parse_gpus(gpus),
        user="u",
        container=name,
        share=share,
        live=live,
        listed_at_s=time.time(),
    )


def test_exclusive_then_no_free_names_holders(tmp_path, inv):
    led = Ledger.open(tmp_path)
    assert [u.gpu_index for u in take(led, inv, "6", "a")] == [0, 1, 2, 3, 4, 5]
    take(led, inv, "2", "b")
    with pytest.raises(NoFreeGpu) as err:
        take(led, inv, "1", "c")
    msg = err.value.one_line()
    assert "no free GPU" in msg and "u/a" in msg and "u/b" in msg and "\n" not in msg


def test_named_busy_gpu_is_refused(tmp_path, inv):
    led = Ledger.open(tmp_path)
    take(led, inv, "0,1", "a")
    with pytest.raises(GpuHeld, match="GPU 1 held by u/a since ") as err:  # named: exit 2, who and since
        take(led, inv, "1,2", "b")
    assert err.value.exit_code == 2


def test_share_only_with_other_sharers(tmp_path, inv):
    led = Ledger.open(tmp_path)
    take(led, inv, "device=0", "a", share=True)
    take(led, inv, "device=0", "b", share=True)
    with pytest.raises(GpuHeld):
        take(led, inv, "device=0", "c")  # exclusive request on a shared GPU
    take(led, inv, "device=1", "x")
    with pytest.raises(GpuHeld):
        take(led, inv, "device=1", "y", share=True)  # sharing never breaks an exclusive lease


def test_reconcile_frees_gone_containers_but_not_fresh_binds(tmp_path, inv):
    led = Ledger.open(tmp_path)
    take(led, inv, "2", "dead")
    led.bind("dead", "id-dead")
    take(led, inv, "2", "alive")
    led.bind("alive", "id-alive")
    listed_at = time.time()
    take(led, inv, "1", "late")
    led.bind("late", "id-late")  # bound after the list was taken: must survive
    freed = led.reconcile({"alive"}, listed_at)
    assert {f.container for f in freed} == {"dead"}
    assert {lease.container for lease in led.leases()} == {"alive", "late"}


def test_pending_lease_of_dead_process_is_freed(tmp_path, inv):
    led = Ledger.open(tmp_path)
    take(led, inv, "1", "crashed")
    led.db.execute("UPDATE leases SET owner_pid=?", (2**22 + 12345,))  # a pid that does not run
    assert [f.container for f in led.reconcile(set(), time.time())] == ["crashed"]
    take(led, inv, "1", "pending-mine")
    assert led.reconcile(set(), time.time()) == []  # our own pending lease stays


def _worker(state: str, name: str, queue) -> None:
    led = Ledger.open(Path(state))
    try:
        units = acquire(
            led,
            load_snapshot(FIXTURE),
            parse_gpus("1"),
            user="u",
            container=name,
            share=False,
            live=None,
            listed_at_s=time.time(),
        )
        queue.put((name, units[0].uuid))
    except NoFreeGpu as err:
        queue.put((name, f"ERR {err.one_line()}"))


def test_concurrent_processes_get_distinct_gpus(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), f"c{i}", queue)) for i in range(10)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ok = [g for _, g in got if not g.startswith("ERR")]
    errs = [g for _, g in got if g.startswith("ERR")]
    assert len(ok) == 8 and len(set(ok)) == 8
    assert len(errs) == 2 and all("no free GPU" in e for e in errs)


def test_wal_mode(tmp_path):
    led = Ledger.open(tmp_path)
    assert led.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert os.path.exists(tmp_path / "leases.sqlite3")


def test_same_name_twice_is_refused(tmp_path, inv):
    from torchrig.errors import InputError

    led = Ledger.open(tmp_path)
    take(led, inv, "1", "same")
    with pytest.raises(InputError, match="being started or holds GPUs"):
        take(led, inv, "1", "same")
    assert len(led.leases()) == 1


def test_no_gpu_host_says_so(tmp_path):
    from torchrig.runtime.inventory import Inventory

    with pytest.raises(NoFreeGpu, match="no NVIDIA GPU on this host"):
        take(
            Ledger.open(tmp_path), Inventory("nvml (NVML Shared Library Not Found)", None, None, ()), "1", "a"
        )


def test_empty_state_dir_is_an_error_not_unset(monkeypatch):
    import pytest

    from torchrig.errors import UsageError
    from torchrig.runtime import ledger

    monkeypatch.setenv("TORCHRIG_STATE_DIR", "")
    with pytest.raises(UsageError, match="set but empty"):
        ledger.state_dir()
    monkeypatch.delenv("TORCHRIG_STATE_DIR")
    assert ledger.state_dir() == ledger.SYSTEM_STATE_DIR  # one system location, never a per-user fallback


def test_root_creates_a_shared_ledger_setgid_sticky_and_group_writable(tmp_path):
    import grp
    import os
    import stat

    import pytest

    from torchrig.runtime.ledger import Ledger

    if os.geteuid() != 0:
        pytest.skip("creating the shared directory is root's")
    d = tmp_path / "shared"
    led = Ledger.open(d)
    led.leases()
    st = d.stat()
    group = next((g for g in ("torchrig", "docker") if _has_group(g)), None)
    if group:
        assert st.st_gid == grp.getgrnam(group).gr_gid and stat.S_IMODE(st.st_mode) == 0o3775
    db = d / "leases.sqlite3"
    assert stat.S_IMODE(db.stat().st_mode) == 0o664 and db.stat().st_gid == st.st_gid


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def test_a_link_planted_as_the_ledger_or_its_journal_is_refused_and_its_target_untouched(tmp_path):
    """A member of the ledger's group replaces leases.sqlite3 (or its -wal) with a link: the next command
    (root's too) refuses with one line naming the link, and the link's target is neither created nor
    chmodded nor written."""

    import pytest

    from torchrig.runtime.ledger import Ledger
    from torchrig.safefs import UnsafePath

    d = tmp_path / "state"
    Ledger.open(d).close()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    for name in ("leases.sqlite3", "leases.sqlite3-wal", "leases.sqlite3-shm"):
        for p in d.iterdir():
            p.unlink()
        Ledger.open(d).close()
        planted = d / name
        if planted.exists():
            planted.unlink()
        planted.symlink_to(victim)
        with pytest.raises(UnsafePath, match="symbolic link") as err:
            Ledger.open(d)
        assert "\n" not in err.value.one_line() and str(planted) in err.value.one_line()
        assert victim.read_text() == "precious\n" and (victim.stat().st_mode & 0o777) == 0o600
        planted.unlink()
    dangling = d / "leases.sqlite3"
    for p in d.iterdir():
        p.unlink()
    dangling.symlink_to(tmp_path / "made-by-the-link")
    with pytest.raises(UnsafePath):
        Ledger.open(d)
    assert not (tmp_path / "made-by-the-link").exists()


def test_a_ledger_folder_that_is_a_link_is_refused(tmp_path):
    import pytest

    from torchrig.runtime.ledger import Ledger
    from torchrig.safefs import UnsafePath

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "state").symlink_to(real)
    with pytest.raises(UnsafePath, match="symbolic link"):
        Ledger.open(tmp_path / "state")
    assert list(real.iterdir()) == []


def test_a_ledger_everyone_may_write_is_refused(tmp_path):
    import os

    import pytest

    from torchrig.runtime.ledger import Ledger
    from torchrig.safefs import UnsafePath

    d = tmp_path / "state"
    Ledger.open(d).close()
    db = d / "leases.sqlite3"
    db.chmod(0o666)
    with pytest.raises(UnsafePath, match="written by everyone"):
        Ledger.open(d)
    db.chmod(0o644)
    Ledger.open(d).close()
    if os.geteuid() == 0:  # root refuses a folder anyone may write without the sticky bit
        other = tmp_path / "open"
        other.mkdir()
        os.chown(other, 65534, 65534)
        other.chmod(0o777)
        with pytest.raises(UnsafePath, match="root does not use a ledger there"):
            Ledger.open(other)
