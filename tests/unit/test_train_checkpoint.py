"""Checkpoints in one process (no process group): a run folder's owner, pruning by step within a run,
checksums that name a damaged file, the fall-back to the newest intact checkpoint, durable pointer
writes, a full disk told apart from other failures, and DCP's .metadata read without running code."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchrig.errors import InputError, UsageError  # noqa: E402
from torchrig.train import checkpoint as ckpt  # noqa: E402
from torchrig.train import rundir, runstart  # noqa: E402


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
    return m, opt


def _save(root: Path, step: int, run_id: str = "run-a", keep: int = 2) -> Path:
    m, opt = _model()
    with torch.no_grad():
        m[0].weight.fill_(float(step))
    return ckpt.save(root, step, m, opt, {"global_batch": 4}, keep=keep, run_id=run_id)


def _flip(path: Path, n: int = 100) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(n):
        data[mid + i] ^= 0xFF
    path.write_bytes(bytes(data))


def _shard(folder: Path) -> Path:
    return next(folder.glob("*.distcp"))


# ---------------------------------------------------------------- saving records checksums


def test_a_save_records_each_files_sha256_and_the_run(tmp_path):
    root = tmp_path / "checkpoints"
    final = _save(root, 2)
    meta = ckpt.read_meta(final)
    assert meta["run_id"] == "run-a" and meta["step"] == 2
    names = sorted(p.name for p in final.iterdir() if p.name != "meta.json")
    assert sorted(meta["files"]) == names and ".metadata" in names
    for name, rec in meta["files"].items():
        data = (final / name).read_bytes()
        assert rec == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert rundir.pointer(root) == "step-000002"
    assert not list(root.glob("*.tmp")) and not list(root.glob(".*tmp"))


def test_a_step_graph_checkpoint_loads_into_an_ordinary_run_and_back(tmp_path):
    # the step graph holds lr as a tensor and sets capturable (train/stepgraph.py): a checkpoint saves them as
    # every run has them, so runs with and without --step-graph resume each other's checkpoints
    m, opt = _model()
    for g in opt.param_groups:
        g["lr"], g["capturable"] = torch.tensor(3e-3), True
    final = ckpt.save(tmp_path / "checkpoints", 1, m, opt, {"global_batch": 4}, keep=2, run_id="run-a")
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)  # the running optimizer keeps its own
    m2, opt2 = _model()
    ckpt.load(final, m2, opt2)
    assert opt2.param_groups[0]["lr"] == pytest.approx(3e-3) and opt2.param_groups[0]["capturable"] is False
    for a, b in zip(opt.state.values(), opt2.state.values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"])
    ckpt.save(tmp_path / "again", 1, m2, opt2, {"global_batch": 4}, keep=2, run_id="run-a")
    for g in opt.param_groups:
        g["lr"] = torch.tensor(1.0)
    ckpt.load(tmp_path / "again" / "step-000001", m, opt)  # the step graph's run resumes an ordinary one
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(3e-3)


def test_flipped_bytes_in_a_shard_are_found_and_the_file_named(tmp_path):
    root = tmp_path / "checkpoints"
    final = _save(root, 2)
    _flip(_shard(final))
    problems = rundir.verify(final)
    assert len(problems) == 1 and str(_shard(final)) in problems[0] and "damaged" in problems[0]


def test_a_missing_or_truncated_shard_is_named(tmp_path):
    root = tmp_path / "checkpoints"
    final = _save(root, 2)
    shard = _shard(final)
    shard.write_bytes(shard.read_bytes()[:100])
    assert "has 100 bytes" in rundir.verify(final)[0]
    shard.unlink()
    assert rundir.verify(final) == [f"{shard} is missing"]


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_says_why(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 2, keep=0)
    _save(root, 4, keep=0)
    newest = _save(root, 6, keep=0)
    _flip(_shard(newest))
    found, skipped = ckpt.find_intact(root)
    assert found == root / "step-000004"
    assert len(skipped) == 1 and skipped[0].startswith("step-000006: ") and str(_shard(newest)) in skipped[0]
    # the weights loaded are step 4's
    m, opt = _model()
    assert ckpt.load(found, m, opt)["step"] == 4
    assert float(m[0].weight.detach()[0, 0]) == 4.0


def test_a_dangling_latest_falls_back_and_says_so(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 2)
    (root / "latest").write_text("step-000009\n")
    found, skipped = ckpt.find_intact(root)
    assert found == root / "step-000002"
    assert skipped == ["latest names step-000009, which is not a complete checkpoint"]


def test_every_checkpoint_damaged_finds_none(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        _flip(_shard(_save(root, step)))
    found, skipped = ckpt.find_intact(root)
    assert found is None and [s[:11] for s in skipped] == ["step-000004", "step-000002"]


# ---------------------------------------------------------------- pruning


def test_pruning_keeps_by_step_within_this_run_and_never_another_runs(tmp_path):
    root = tmp_path / "checkpoints"
    # another run's checkpoints with higher numbers (the folder name order of the old pruning)
    for step in (100, 200):
        _save(root, step, run_id="run-other", keep=0)
    for step in (2, 4, 6, 8):
        _save(root, step, run_id="run-a", keep=2)
    names = sorted(p.name for p in root.glob("step-*"))
    assert names == ["step-000006", "step-000008", "step-000100", "step-000200"]
    assert rundir.pointer(root) == "step-000008"


def test_to_prune_never_takes_the_latest_nor_steps_above_the_save():
    saved = [rundir.Saved(Path(f"step-{s:06d}"), s, "a") for s in (2, 4, 6, 12)]
    # a resume went back from 12 to 4 and now saved 6: 12 stays until it is written again
    assert [s.step for s in rundir.to_prune(saved, "a", 1, 6, "step-000006")] == [2, 4]
    assert [s.step for s in rundir.to_prune(saved, "a", 1, 6, "step-000004")] == [2]
    assert rundir.to_prune(saved, "a", 0, 6, "step-000006") == []
    assert rundir.to_prune(saved, "b", 1, 6, "step-000006") == []


def test_to_prune_never_takes_the_newest_finite_checkpoint():
    # 2 and 4 were checked finite; 6 and 8 come from a torchrig that did not check (an old save)
    saved = [rundir.Saved(Path(f"step-{s:06d}"), s, "a", finite=s <= 4) for s in (2, 4, 6, 8)]
    assert [s.step for s in rundir.to_prune(saved, "a", 1, 8, "step-000008")] == [2, 6]
    assert [s.step for s in rundir.to_prune(saved, "a", 2, 8, "step-000008")] == [2]


# ---------------------------------------------------------------- who owns a run folder


def _folder_with_a_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    _save(out / "checkpoints", 4)
    (out / "run.json").write_text(json.dumps({"run_id": "run-a"}))
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    return out


def test_a_new_run_in_a_folder_with_another_run_is_refused_naming_the_ways_out(tmp_path):
    out = _folder_with_a_run(tmp_path)
    with pytest.raises(UsageError) as e:
        runstart.plan_start(out, resume=False, if_possible=False, overwrite=False)
    line = e.value.one_line()
    assert "\n" not in line and e.value.exit_code == 2
    for word in ("--resume", "--overwrite", "fresh --out", "run-a", "step-000004"):
        assert word in line
    assert (out / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n'  # nothing touched


def test_a_folder_with_only_metrics_is_a_run_too(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UsageError, match=r"a metrics\.jsonl"):
        runstart.plan_start(tmp_path, resume=False, if_possible=False, overwrite=False)


def test_overwrite_removes_the_previous_runs_outputs_and_says_so(tmp_path):
    out = _folder_with_a_run(tmp_path)
    (out / "logs").mkdir()
    start = runstart.plan_start(out, resume=False, if_possible=False, overwrite=True)
    said = runstart.claim(out, start, "run-b")
    assert sorted(p.name for p in out.iterdir()) == ["logs", "run.json"]
    assert runstart.run_id_of(out) == "run-b"
    assert any("metrics.jsonl" in s for s in said) and any("checkpoints" in s for s in said)


def test_resume_with_nothing_to_resume_is_an_error_unless_if_possible(tmp_path):
    with pytest.raises(UsageError, match="--resume: no checkpoint to resume from") as e:
        runstart.plan_start(tmp_path / "typo", resume=True, if_possible=False, overwrite=False)
    assert "--resume-if-possible" in e.value.one_line()
    start = runstart.plan_start(tmp_path / "typo", resume=True, if_possible=True, overwrite=False)
    assert start.mode == "resume-if-possible"
    with pytest.raises(UsageError, match="--overwrite replaces") as e2:
        runstart.plan_start(tmp_path, resume=True, if_possible=False, overwrite=True)
    assert "choose one" in e2.value.one_line()


def test_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        runstart.plan_start(tmp_path / "f", resume=False, if_possible=False, overwrite=False)
    with pytest.raises(UsageError, match="cannot create or write in"):
        runstart.plan_start(tmp_path / "f" / "run", resume=False, if_possible=False, overwrite=False)
    with pytest.raises(UsageError, match="not a folder"):
        runstart.plan_start(Path("/dev/null"), resume=False, if_possible=False, overwrite=False)


# ---------------------------------------------------------------- durability


def test_latest_is_replaced_atomically_with_the_file_and_its_folder_fsynced(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    rundir.atomic_write(tmp_path / "latest", "step-000002\n")
    assert synced == [str(tmp_path / ".latest.tmp"), str(tmp_path)]
    assert (tmp_path / "latest").read_text() == "step-000002\n" and not (tmp_path / ".latest.tmp").exists()


# ---------------------------------------------------------------- a full disk


def test_a_full_disk_is_recognised_inside_dcps_exceptions():
    from torch.distributed.checkpoint.api import CheckpointException

    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert rundir.is_disk_full(CheckpointException("save", {1: (enospc, traceback.StackSummary())}))
    assert rundir.is_disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 123"))
    try:
        try:
            raise enospc
        except OSError as inner:
            raise RuntimeError("writer failed") from inner
    except RuntimeError as outer:
        assert rundir.is_disk_full(outer)
    other = CheckpointException("save", {0: (ValueError("bad tensor"), traceback.StackSummary())})
    assert not rundir.is_disk_full(other)


# ---------------------------------------------------------------- .metadata is data, never code


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_metadata_is_refused_and_never_run(tmp_path):
    final = _save(tmp_path / "checkpoints", 2)
    marker = tmp_path / "ran"
    (final / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(InputError) as e:
        ckpt.read_dcp_metadata(final / ".metadata")
    line = e.value.one_line()
    assert "refused" in line and "system" in line and "\n" not in line
    m, opt = _model()
    with pytest.raises(InputError, match="refused"):
        ckpt.load(final, m, opt)
    with pytest.raises(InputError, match="refused"):
        ckpt.load_model_only(final, m)
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps(print),  # a builtin callable
        pickle.dumps(Path.write_text),  # a method of an admitted module's class
        b"ctorch\nload\n(S'x'\ntR.",  # torch.load, from the module whose dtypes are admitted
        b"ctorch.distributed.checkpoint.metadata\nfield\n(tR.",  # not a record of DCP's module
        b"cos\nsystem\n(S'true'\ntR.",  # protocol 0 os.system
    ],
)
def test_other_callables_are_refused(tmp_path, payload):
    (tmp_path / ".metadata").write_bytes(payload)
    with pytest.raises(InputError, match="refused"):
        ckpt.read_dcp_metadata(tmp_path / ".metadata")


@pytest.mark.filterwarnings("ignore:.*assuming the intent is to save in a single process")
def test_real_dcp_metadata_loads_through_the_restricted_unpickler(tmp_path):
    """torch's own save of every kind of entry: tensors of several dtypes, bytes entries, the optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import Metadata

    m, opt = _model()
    state = {
        "model": {k: v.to(torch.bfloat16) for k, v in m.state_dict().items()},
        "optim": opt.state_dict(),
        "extra": {"name": "x", "n": 3, "ints": torch.arange(4, dtype=torch.int64)},
    }
    dcp.save(state, checkpoint_id=str(tmp_path))
    md = ckpt.read_dcp_metadata(tmp_path / ".metadata")
    assert isinstance(md, Metadata)
    with open(tmp_path / ".metadata", "rb") as f:
        plain = pickle.load(f)  # what DCP itself reads: the same records
    assert md.state_dict_metadata == plain.state_dict_metadata
    assert md.storage_data == plain.storage_data


def test_the_load_uses_the_metadata_it_checked_and_reads_it_once(tmp_path, monkeypatch):
    """The storage records DCP follows are those check_storage passed: .metadata is read once, so a file
    swapped in between the check and the load is never read."""
    final = _save(tmp_path / "checkpoints", 3)
    reads = []
    real = ckpt.read_dcp_metadata
    monkeypatch.setattr(ckpt, "read_dcp_metadata", lambda path: reads.append(path) or real(path))
    m, _ = _model()
    ckpt.load_model_only(final, m)
    assert reads == [final / ".metadata"]
    assert torch.equal(m[0].weight, torch.full_like(m[0].weight, 3.0))


def test_a_per_rank_metadata_gets_the_same_storage_check(tmp_path):
    """DCP without collectives reads ``__RANK.metadata``: its storage records are checked like .metadata's."""
    final = _save(tmp_path / "checkpoints", 2)
    md = ckpt.read_dcp_metadata(final / ".metadata")
    for info in md.storage_data.values():
        info.relative_path = "../../etc/passwd"
    (final / "__0.metadata").write_bytes(pickle.dumps(md))
    reader = ckpt.SafeReader(str(final))
    with pytest.raises(InputError, match="not a file of"):
        reader.read_metadata(rank=0)
    assert reader.read_metadata().storage_data  # the folder's own .metadata still reads


def test_export_names_the_damaged_file_and_an_intact_older_checkpoint(tmp_path):
    from torchrig.export.core import _verify

    root = tmp_path / "checkpoints"
    _save(root, 2)
    bad = _save(root, 4)
    _flip(_shard(bad))
    with pytest.raises(InputError) as e:
        _verify(bad, ckpt.read_meta(bad))
    line = e.value.one_line()
    assert str(_shard(bad)) in line and str(root / "step-000002") in line


def test_metrics_on_a_full_disk_say_disk_full_and_name_the_last_checkpoint(tmp_path):
    """/dev/full answers every write with ENOSPC, as a full filesystem does."""
    from torchrig.train.metrics import Metrics

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    _save(tmp_path / "checkpoints", 2)
    metrics = Metrics(tmp_path, 10, enabled=True, tensorboard=False)
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    with pytest.raises(rundir.DiskFull) as e:
        metrics.event(event="start", step=0)
    line = e.value.one_line()
    assert line.startswith(f"disk full: writing {tmp_path / 'metrics.jsonl'} failed with")
    assert f"the last good checkpoint is {tmp_path / 'checkpoints' / 'step-000002'}" in line
    assert e.value.exit_code == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--batch", "0"], "--batch must be at least 1"),
        (["--batch", "99999999999"], "--batch must be"),
        (["--tolerance", "nan"], "--tolerance must be a finite number"),
        (["--tolerance", "-1"], "--tolerance must be positive"),
        (["--out", "/dev/null"], "is not a folder"),
    ],
)
def test_export_refuses_bad_options_in_one_line(tmp_path, capsys, args, says):
    from torchrig.cli import main

    assert main(["export", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_export_of_nothing_and_of_a_dangling_latest_is_one_line(tmp_path, capsys):
    from torchrig.cli import main

    assert main(["export", str(tmp_path / "nowhere")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    root = tmp_path / "checkpoints"
    _save(root, 2)
    (root / "latest").write_text("step-000009\n")
    assert main(["export", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        "names 'step-000009', which is not a complete checkpoint" in err and str(root / "step-000002") in err
    )


def test_a_metadata_file_larger_than_any_real_one_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / ".metadata"
    with open(big, "wb") as f:  # sparse: no disk, no memory
        f.truncate(ckpt.MAX_DCP_METADATA_BYTES + 1)
    with pytest.raises(InputError, match=r"\.metadata' is 1,073,741,825 bytes"):
        ckpt.read_dcp_metadata(big)


def test_exports_example_input_is_the_context_at_most_2048_tokens():
    from torchrig.export.core import _example

    spec = {"model": "gpt", "vocab": 50, "context": 1 << 20}
    assert tuple(_example(spec, 2, None).shape) == (2, 2048)
    assert tuple(_example({**spec, "context": 64}, 2, None).shape) == (2, 64)
    assert tuple(_example(spec, 1, 4096).shape) == (1, 4096)  # what the user asked for
