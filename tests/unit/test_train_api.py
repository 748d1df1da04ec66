"""The train API: ``TrainRequest`` -> ``build_plan`` (pure) -> ``run`` -> ``TrainResult``, as launch's.

How a run starts in its folder (new, --resume, --overwrite) is decided once, by the plan, and rank 0 follows
that decision: in the same process (the plan's ``Start``), or in the ranks the launcher starts (through
``TORCHRIG_TRAIN_START``, only while the launcher holds the folder). The plan reads nothing and changes
nothing: the same request on the same facts is the same plan."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchrig.errors import UsageError
from torchrig.launch.run import GpuChoice
from torchrig.train import plan, rundir, runstart
from torchrig.train.config import TrainConfig
from torchrig.train.plan import TrainFacts, TrainRequest, build_plan
from torchrig.train.record import TrainSummary
from torchrig.train.run import TrainResult

SUMMARY = Path(__file__).parents[1] / "fixtures/train/summary-gpt-ddp-fp8-2gpus.json"


def _facts(out: Path, *, placed: GpuChoice | None = None, torchrun: bool = False, restart: int = 0):
    return TrainFacts(
        folder=runstart.observe(out),
        under_torchrun=torchrun,
        restart=restart,
        placed=placed,
        gpu_refusal=None,
        holder="4242@host",
    )


def _with_a_run(out: Path, step: int = 2) -> Path:
    """A folder holding run "run-a" with a complete checkpoint at ``step`` (meta.json only: enough for the
    start decision, which reads no weights)."""
    ckpt = out / "checkpoints" / rundir.step_name(step)
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": step, "run_id": "run-a"}))
    (out / "run.json").write_text(json.dumps({"schema_version": 1, "run_id": "run-a"}))
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    return out


def _tree(path: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(path)), p.stat().st_mtime_ns) for p in path.rglob("*"))


TWO_GPUS = GpuChoice(gpus=(0, 1), visible=(0, 1), forced=())


def test_the_same_request_on_the_same_facts_is_the_same_plan_and_touches_nothing(tmp_path):
    out = _with_a_run(tmp_path / "run")
    request = TrainRequest(TrainConfig(out=str(out), resume=True, steps=4), gpus="2")
    facts = _facts(out, placed=TWO_GPUS)
    before = _tree(out)
    first, second = build_plan(request, facts), build_plan(request, facts)
    assert first == second
    assert _tree(out) == before  # nothing made, removed or written
    assert first.start == runstart.Start("resume", "run-a")
    assert first.config.device == "cuda"  # --gpus means GPUs
    assert first.launch is not None and first.launch.gpus == "2" and first.launch.rdzv_id == plan.LAUNCH_ID


def test_the_plan_hands_its_start_to_the_ranks_it_launches(tmp_path):
    out = _with_a_run(tmp_path / "run")
    (out / "tensorboard").mkdir()
    request = TrainRequest(TrainConfig(out=str(out), overwrite=True, device="cpu"), nproc_per_node=2)
    p = build_plan(request, _facts(out))
    assert p.start.mode == "new" and p.holds_folder
    env = dict(p.launch.extra_env)
    assert env[rundir.LOCK_HOLDER_ENV] == "4242@host"
    handed = json.loads(env[runstart.START_ENV])
    assert handed == {
        "mode": "new",
        "run_id": None,
        "remove": ["run.json", "checkpoints", "metrics.jsonl", "tensorboard"],
    }
    assert runstart.from_env(out, env[runstart.START_ENV]) == p.start  # what rank 0 reads back


def test_rank_0_follows_the_launchers_decision_and_decides_nothing_itself(tmp_path, monkeypatch):
    """Under the launcher's lock, rank 0 takes the start from TORCHRIG_TRAIN_START: no second decision."""
    from torchrig.train import resume

    out = _with_a_run(tmp_path / "run")
    cfg = TrainConfig(out=str(out), resume=True)
    decided = build_plan(TrainRequest(cfg), _facts(out)).start

    def no_second_decision(*_a, **_k):
        raise AssertionError("rank 0 decided again")

    monkeypatch.setattr(runstart, "plan_start", no_second_decision)
    monkeypatch.setattr(runstart, "decide", no_second_decision)
    launcher = subprocess.Popen(  # holds the folder, as torchrig train does for the ranks it starts
        [sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == "held\n"
        monkeypatch.setenv(rundir.LOCK_HOLDER_ENV, f"{launcher.pid}@{socket.gethostname()}")
        monkeypatch.setenv(runstart.START_ENV, decided.to_env())
        with rundir.hold(out):  # rank 0: passes on the launcher's token
            assert rundir.launcher_holds(out)
            assert resume._decision(cfg, SimpleNamespace(restart=0), out, None) == decided
            # an elastic restart continues the run, whatever the first attempt was handed
            again = resume._decision(cfg, SimpleNamespace(restart=1), out, None)
            assert again == runstart.Start("resume-if-possible", "run-a")
    finally:
        launcher.kill()
        launcher.wait()


HOLDER = (
    "import sys, time\nfrom pathlib import Path\nfrom torchrig.train import rundir\n"
    "with rundir.hold(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)"
)


def test_a_handed_start_is_ignored_without_the_launchers_lock(tmp_path, monkeypatch):
    """A stale TORCHRIG_TRAIN_START (a shell that kept it) is no decision: rank 0, holding the folder itself,
    decides on what the folder holds (here: it holds another run, so a new one is refused)."""
    from torchrig.train import resume

    out = _with_a_run(tmp_path / "run")
    monkeypatch.setenv(runstart.START_ENV, runstart.Start("new", None, (out / "checkpoints",)).to_env())
    monkeypatch.delenv(rundir.LOCK_HOLDER_ENV, raising=False)
    with rundir.hold(out), pytest.raises(UsageError, match="already holds another run"):
        resume._decision(TrainConfig(out=str(out)), SimpleNamespace(restart=0), out, None)
    assert (out / "checkpoints").is_dir()


@pytest.mark.parametrize(
    "value",
    [
        "{",
        "[]",
        '{"mode": "new", "run_id": null, "remove": ["../../etc"]}',
        '{"mode": "new", "run_id": null, "remove": ["/tmp"]}',
        '{"mode": "wipe", "run_id": null, "remove": []}',
        '{"mode": "new", "run_id": "a\\nb", "remove": []}',
        '{"mode": "new", "remove": []}',
    ],
)
def test_a_handed_start_that_torchrig_did_not_write_is_refused(tmp_path, value):
    with pytest.raises(UsageError, match=runstart.START_ENV) as e:
        runstart.from_env(tmp_path, value)
    assert e.value.exit_code == 2 and "\n" not in e.value.one_line()


def test_in_place_the_loop_gets_the_plans_start_and_the_result_is_typed(tmp_path, monkeypatch):
    from torchrig.train import loop
    from torchrig.train.run import run

    out = _with_a_run(tmp_path / "run")
    request = TrainRequest(TrainConfig(out=str(out), resume_if_possible=True, device="cpu"))
    p = build_plan(request, _facts(out))
    got = {}

    summary = TrainSummary.from_json(json.loads(SUMMARY.read_text()))

    def fake_train(cfg, start=None):
        got["cfg"], got["start"] = cfg, start
        assert rundir.launcher_holds(out) is False and os.path.realpath(out) in rundir._held  # held here
        return summary

    monkeypatch.setattr(loop, "train", fake_train)
    result = run(p)
    assert got["start"] is p.start and got["cfg"] == p.config
    assert result == TrainResult(summary, None, str(out))
    # the keys and values train --json printed
    assert result.to_json() == {"summary": json.loads(SUMMARY.read_text()), "out": str(out)}
    assert result.exit_code == 0


def test_a_folder_changed_between_the_plan_and_the_lock_is_refused(tmp_path, monkeypatch):
    from torchrig.train import loop
    from torchrig.train.run import run

    out = tmp_path / "run"
    p = build_plan(TrainRequest(TrainConfig(out=str(out), device="cpu")), _facts(out))
    _with_a_run(out)  # another run wrote here after the plan was made
    monkeypatch.setattr(loop, "train", lambda *a, **k: pytest.fail("trained on a stale decision"))
    with pytest.raises(UsageError, match="changed while this run was starting") as e:
        run(p)
    assert "again" in e.value.one_line()


def test_under_torchrun_the_plan_trains_in_place_and_a_restart_continues_the_run(tmp_path):
    out = _with_a_run(tmp_path / "run")
    request = TrainRequest(TrainConfig(out=str(out)), gpus="2")
    p = build_plan(request, _facts(out, torchrun=True, restart=1))
    assert p.launch is None and not p.holds_folder  # rank 0 takes the folder in the loop
    assert p.start == runstart.Start("resume-if-possible", "run-a")
    with pytest.raises(UsageError, match="already holds another run"):  # the first attempt: a new run
        build_plan(request, _facts(out, torchrun=True, restart=0))


def test_where_the_ranks_run(tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig(out=str(out))
    in_place = build_plan(TrainRequest(cfg, gpus="1"), _facts(out, placed=GpuChoice((0,), (0, 1), ())))
    assert in_place.launch is None and in_place.holds_folder
    other = build_plan(TrainRequest(cfg, gpus="device=1"), _facts(out, placed=GpuChoice((1,), (0, 1), ())))
    assert other.launch is not None and other.launch.gpus == "device=1"  # not CUDA's first: launched
    forced = GpuChoice((0,), (0, 1), ("GPU 0 held by x/env since y",))
    taken = build_plan(TrainRequest(cfg, gpus="1", force=True), _facts(out, placed=forced))
    assert taken.forced_gpus == forced.forced
    cpu = build_plan(TrainRequest(dataclasses.replace(cfg, device="cpu")), _facts(out))
    assert cpu.launch is None and cpu.config.device == "cpu"


def test_the_requests_own_refusals(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "r"), device="cpu")
    with pytest.raises(UsageError, match="--gpus asks for GPUs"):
        TrainRequest(cfg, gpus="2")
    with pytest.raises(UsageError, match="--gpus"):
        TrainRequest(dataclasses.replace(cfg, device="auto"), gpus="0")


def test_an_out_under_a_file_is_refused_as_before(tmp_path):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" / "run"
    request = TrainRequest(TrainConfig(out=str(out)))
    facts = _facts(out)
    with pytest.raises(UsageError, match=r"is not a folder") as e:
        build_plan(request, facts)
    assert str(tmp_path / "f") in e.value.one_line()


def test_the_cli_only_parses_and_hands_the_request_to_the_api(monkeypatch, tmp_path):
    import argparse

    import torchrig.train
    from torchrig.cli import cmd_train

    parser = argparse.ArgumentParser()
    cmd_train.configure(parser)
    args = parser.parse_args(["--out", str(tmp_path / "r"), "--steps", "3", "--max-restarts", "2"])
    seen = []
    monkeypatch.setattr(torchrig.train, "train", lambda req: seen.append(req) or TrainResult(None, None))
    cmd_train.run(args)
    (req,) = seen
    assert req.config.steps == 3 and dict(req.launch_options)["max_restarts"] == 2 and req.preflight


def test_observing_the_host_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    out = tmp_path / "typo" / "run"
    facts = plan.observe(TrainRequest(TrainConfig(out=str(out), device="cpu")))
    assert not (tmp_path / "typo").exists()
    assert facts.folder.outputs == () and facts.folder.run_id is None and not facts.under_torchrun
    assert facts.holder == rundir.holder_token() and facts.placed is None
    with pytest.raises(UsageError, match="--resume: no checkpoint to resume from"):
        build_plan(TrainRequest(TrainConfig(out=str(out), device="cpu", resume=True)), facts)
    assert not (tmp_path / "typo").exists()
