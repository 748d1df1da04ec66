"""One grammar for "these GPUs" and one placement rule: ``up``, ``launch``, ``train`` and ``bench`` all parse
``--gpus`` with ``runtime.placement.parse_gpus`` and choose with ``runtime.placement.place``; a GPU someone
else leased is refused (exit 2, who and since) before any process starts, and ``--force`` says it out loud.

The machine is the recorded 2x H200 (NVML's answers replayed at the pynvml boundary); the ledger is a real
SQLite ledger in tmp_path, with a lease held by another user."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchrig.cli import main
from torchrig.errors import InputError, UsageError
from torchrig.launch import probe
from torchrig.runtime import placement
from torchrig.runtime.inventory import Unit, load_snapshot
from torchrig.runtime.ledger import Lease, Ledger
from torchrig.runtime.placement import GpuHeld, NoFreeGpu, parse_gpus, place

pytest.importorskip("pynvml")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the NVML replay
from nvmlreplay import FIX, recorded, replay

H200 = ("GPU-ab2a08d6-ef8c-084b-4c48-9ab327f58ba1", "GPU-f4e4fe0e-0e5e-080b-17fa-3fd049dc36fc")
OTHER = "someone-else"


# --- the grammar ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        ("all", placement.GpuRequest("all")),
        (" 2 ", placement.GpuRequest("count", count=2)),
        ("0,2", placement.GpuRequest("indices", indices=(0, 2))),
        ("device=1", placement.GpuRequest("indices", indices=(1,))),
        ("1,", placement.GpuRequest("indices", indices=(1,))),
        (H200[1], placement.GpuRequest("uuids", uuids=(H200[1],))),
        (
            "MIG-0b1c2d3e-0001-5f6a-8b9c-0d1e2f3a4b01",
            placement.GpuRequest("uuids", uuids=("MIG-0b1c2d3e-0001-5f6a-8b9c-0d1e2f3a4b01",)),
        ),
        ("none", placement.NO_GPUS),
        (None, placement.NO_GPUS),
    ],
)
def test_the_grammar(text, want):
    assert parse_gpus(text) == want
    if want.wants_gpus:  # what a command line that passes the request on says parses back to it
        assert parse_gpus(want.text) == want


@pytest.mark.parametrize(
    "text, says",
    [
        ("-1", "0 or more"),
        ("0", "at least 1"),
        ("", "empty"),
        ("  ", "empty"),
        ("0,,1", "empty entry"),
        (",", "empty entry"),
        ("two", "malformed"),
        ("1,1", "twice"),
        (f"{H200[0]},{H200[0].upper()}", "twice"),
        ("0,GPU-ab2a08d6", "malformed"),
        ("device=all", "malformed"),
        ("٣", "malformed"),  # a digit to str.isdigit, not to the user
    ],
)
def test_every_malformed_value_is_one_usage_line(text, says):
    with pytest.raises(UsageError, match=says) as err:
        parse_gpus(text)
    assert err.value.exit_code == 2 and "\n" not in err.value.one_line()


# --- the rule ------------------------------------------------------------------------------------------


def lease(index: int, user: str, *, shared: bool = False, uuid: str | None = None) -> Lease:
    return Lease(
        uuid or f"GPU-{index}", index, str(index), user, f"{user}-env", "cid", shared, 1, 1.7e9, 1.7e9
    )


UNITS = [Unit(f"GPU-{i}", i, str(i), False, None, None) for i in range(4)]


def got(text: str, leases, **kw) -> list[int]:
    return [u.gpu_index for u in place(parse_gpus(text), UNITS, leases, locality=False, **kw).units]


def test_free_or_yours_is_yours_to_take():
    leases = [lease(0, OTHER), lease(1, "me")]
    mine = {"mine": lambda x: x.user == "me"}
    assert got("all", leases, **mine) == [1, 2, 3]
    assert got("2", leases, **mine) == [1, 2]
    assert got("device=1", leases, **mine) == [1]
    assert got("all", leases) == [2, 3]  # a new environment's lease is its own: only free GPUs (up)


def test_a_named_gpu_someone_else_holds_is_refused_with_who_and_since():
    with pytest.raises(GpuHeld) as err:
        got("0,2", [lease(0, OTHER)])
    line = err.value.one_line()
    assert err.value.exit_code == 2 and "GPU 0 held by someone-else/someone-else-env since 20" in line
    assert "--force" in line and "\n" not in line


def test_force_takes_it_and_says_whose():
    p = place(parse_gpus("device=0"), UNITS, [lease(0, OTHER)], force=True)
    assert [u.gpu_index for u in p.units] == [0]
    assert len(p.forced) == 1 and p.forced[0].startswith("GPU 0 held by someone-else/someone-else-env since")
    # a count with --force takes free ones first, others' only when it must
    p = place(parse_gpus("4"), UNITS, [lease(0, OTHER)], force=True, locality=False)
    assert sorted(u.gpu_index for u in p.units) == [0, 1, 2, 3] and len(p.forced) == 1


def test_too_few_yours_for_a_count_is_no_free_gpu():
    with pytest.raises(NoFreeGpu, match="2 wanted, 1 of 4 yours to take") as err:
        got("2", [lease(i, OTHER) for i in (0, 1, 2)])
    assert err.value.exit_code == 1
    with pytest.raises(NoFreeGpu, match="none of the 4 GPU"):
        got("all", [lease(i, OTHER) for i in range(4)])


def test_a_leased_mig_instance_holds_its_gpu_for_a_whole_gpu_user():
    with pytest.raises(GpuHeld, match="GPU 2 held by"):
        got("device=2", [lease(2, OTHER, uuid="MIG-0b1c2d3e-0001-5f6a-8b9c-0d1e2f3a4b01")])


def test_up_names_mig_mode_from_the_inventory():
    inv = load_snapshot(FIX / "runtime/mig-1xh100-3-instances.json")
    with pytest.raises(InputError, match="MIG mode"):
        place(parse_gpus("device=0"), inv.units(), [], inventory=inv)


# --- every command reaches the same two functions ------------------------------------------------------


@pytest.fixture
def shared_h200x2(monkeypatch, tmp_path):
    """The recorded 2x H200 (NVML replayed), a ledger in which another user holds GPU 0, and spies on the
    two placement functions (the real ones run: the spies only count the calls)."""
    monkeypatch.setitem(sys.modules, "pynvml", replay(recorded("h200x2-driver580-cu130")))
    for k in ("CUDA_VISIBLE_DEVICES", "TORCHRIG_GPU_INVENTORY", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TORCHRIG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHRIG_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(probe, "probe_gpus", lambda *a, **k: pytest.fail("torch probed: NVML answers first"))
    led = Ledger.open(tmp_path / "state")
    with led.transaction() as db:  # held by a live process (this one): not a stale pending lease
        led.insert_in(db, [(H200[0], 0, "0")], OTHER, "their-env", False)
    led.close()
    calls: list[str] = []
    real_parse, real_place = placement.parse_gpus, placement.place

    def parse_spy(text):
        calls.append(f"parse {text}")
        return real_parse(text)

    def place_spy(req, units, leases, **kw):
        calls.append(f"place {req.kind}")
        return real_place(req, units, leases, **kw)

    monkeypatch.setattr(placement, "parse_gpus", parse_spy)
    monkeypatch.setattr(placement, "place", place_spy)
    return calls


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--dry-run", "--gpus", "device=0", "job.py"],
        ["train", "--gpus", "device=0", "--model", "gpt", "--size", "tiny", "--steps", "1"],
        ["bench", "--dry-run", "--gpus", "device=0"],
    ],
    ids=["launch", "train", "bench"],
)
def test_launch_train_bench_refuse_the_gpu_another_user_leased(shared_h200x2, argv, tmp_path, capsys):
    out = ["--out", str(tmp_path / "run")] if argv[0] == "train" else []
    assert main([*argv, *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPU 0 held by someone-else/their-env since" in err, err
    assert "parse device=0" in shared_h200x2 and "place indices" in shared_h200x2


def test_launch_takes_the_free_one_and_all_means_yours(shared_h200x2, capsys):
    assert main(["--json", "launch", "--dry-run", "--gpus", "1", "job.py"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert main(["--json", "launch", "--dry-run", "--gpus", "all", "job.py"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert "place count" in shared_h200x2 and "place all" in shared_h200x2


def test_bench_workers_get_the_free_one(shared_h200x2, capsys, monkeypatch):
    from torchrig.cli import cmd_bench

    # this host's torch is a CPU build: in-process it would see no GPU where the replayed NVML sees two
    monkeypatch.setattr(cmd_bench, "_device", lambda args: ("cuda", 2))
    assert main(["--json", "bench", "--dry-run", "--gpus", "1", "--only", "gemm"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["env"]["CUDA_VISIBLE_DEVICES"] == "1" and plan["nproc"] == 1


def test_bench_workers_on_gpu_0_are_an_index_not_a_count(shared_h200x2, capsys, monkeypatch):
    # GPU 0 alone once reached the launcher as "0": a count of zero, refused (seen on a 1-GPU H200)
    from torchrig.cli import cmd_bench

    monkeypatch.setattr(cmd_bench, "_device", lambda args: ("cuda", 2))
    assert main(["--json", "bench", "--dry-run", "--force", "--gpus", "device=0", "--only", "gemm"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["env"]["CUDA_VISIBLE_DEVICES"] == "0" and plan["nproc"] == 1


@given(st.lists(st.integers(0, 63), min_size=1, max_size=8, unique=True))
def test_indices_text_reads_back_as_the_same_indices(ids):
    assert placement.parse_gpus(placement.indices_text(ids)) == placement.GpuRequest(
        "indices", indices=tuple(ids)
    )


def test_force_says_so_on_stderr_and_in_json(shared_h200x2, capsys):
    assert main(["--json", "launch", "--dry-run", "--force", "--gpus", "device=0", "job.py"]) == 0
    cap = capsys.readouterr()
    forced = json.loads(cap.out)["plan"]["forced_gpus"]
    assert len(forced) == 1 and forced[0].startswith("GPU 0 held by someone-else/their-env since")
    assert "warning: --force: taking GPU 0 held by someone-else" in cap.err


def test_up_parses_and_places_with_the_same_functions(shared_h200x2, tmp_path):
    from torchrig.cli import cmd_up
    from torchrig.runtime.lease import preview
    from torchrig.runtime.nvml import current

    parser = __import__("argparse").ArgumentParser()
    cmd_up.configure(parser)
    args = parser.parse_args(["--image", "x", "--gpus", "device=0", "--no-ssh"])
    req = cmd_up.request_from(args)  # what 'torchrig up' builds
    with pytest.raises(GpuHeld, match="GPU 0 held by someone-else/their-env since"):
        preview(Ledger.open(), current(), req.gpus, share=False, live=None, listed_at_s=0.0)  # up's choice
    assert shared_h200x2 == ["parse device=0", "place indices"]


@pytest.mark.parametrize("value", ["-1", "0", "", "two"])
def test_train_refuses_a_malformed_gpus_before_anything_runs(value, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code = main(["train", "--gpus", value, "--out", str(tmp_path / "r"), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--gpus" in err, err
    assert not (tmp_path / "r" / "run.json").exists()


def test_no_ledger_changes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHRIG_STATE_DIR", str(tmp_path / "none-here"))
    assert probe.lease_facts("device=0", (0, 1)) == {"gpu_units": (), "leases": (), "user": None}
    assert not (tmp_path / "none-here").exists()  # consulting creates nothing


def test_train_without_gpus_takes_the_first_gpu_that_is_yours(shared_h200x2, tmp_path, monkeypatch):
    """No --gpus: one GPU, as always, but where another user holds GPU 0 it is GPU 1, started through the
    launcher (a process training in place would get GPU 0: CUDA's first)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    from torchrig.train import plan
    from torchrig.train.config import TrainConfig

    request = plan.TrainRequest(TrainConfig(out=str(tmp_path / "run")))
    assert plan._others_hold_gpus()
    placed = plan._place(request)
    assert placed.gpus == (1,) and placed.visible == (0, 1) and plan.wants_launch(request, placed, False)
    facts = plan.observe(request)
    assert facts.placed == placed
    launch = plan.build_plan(request, facts).launch
    assert launch is not None and launch.gpus == "1,"  # the launcher starts the one rank on GPU 1
    assert "place all" in shared_h200x2
