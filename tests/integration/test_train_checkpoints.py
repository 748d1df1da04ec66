"""Checkpoints used as a careless or unlucky user would, through the real CLI (one process, and 2 gloo
ranks through torchrun): a second run in the same folder, a typo in --out with --resume, flipped bytes in a
shard, a crafted .metadata, another run's checkpoint in the folder, a disk that fills during a save. The
refusals docs/checkpoints.md shows run as the page writes them, and print the line it shows."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import docblocks  # tests/docblocks.py

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

TRAIN = [
    "train",
    "--model", "gpt", "--size", "tiny", "--steps", "6", "--log-every", "1", "--lr", "1e-2",
    "--warmup-steps", "2", "--workers", "0", "--no-tensorboard", "--device", "cpu",
    "--ckpt-every", "2", "--keep-ckpts", "0", "--micro-batch", "8",
]  # fmt: skip
TWO_RANKS = ["--nproc-per-node", "2", "--no-preflight", "--micro-batch", "4"]  # the same global batch


def torchrig(*args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "torchrig", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def doc_says(node: str, cwd: Path) -> tuple[str, subprocess.CompletedProcess]:
    """Run the docs/checkpoints.md command that names ``node`` (its one ``$`` line, through bash, in
    ``cwd``); return the line the page shows after it and the result."""
    (block,) = docblocks.tested_by(docblocks.ROOT / "docs" / "checkpoints.md", f"tests/integration/{node}")
    ((cmd, shown),) = block.steps()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, env=env, timeout=400)
    (line,) = docblocks.shown_lines(shown)
    return line, r


def error_line(r: subprocess.CompletedProcess) -> str:
    """The one error line (and no traceback)."""
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("torchrig: error: ")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def steps(out: Path) -> list[int]:
    return [r["step"] for r in records(out) if "loss" in r and r.get("event") is None]


def flip(path: Path, n: int = 100) -> None:
    data = bytearray(path.read_bytes())
    for i in range(n):
        data[len(data) // 2 + i] ^= 0xFF
    path.write_bytes(bytes(data))


def shard(folder: Path) -> Path:
    return max(folder.glob("*.distcp"), key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    """One finished run: checkpoints at steps 2, 4 and 6."""
    out = tmp_path_factory.mktemp("first") / "run"
    r = torchrig(*TRAIN, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture
def run(first, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(first, out)
    return out


def test_a_second_run_in_the_same_folder_is_refused_and_overwrite_is_explicit(run):
    ck = run / "checkpoints"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    r = torchrig(*TRAIN, "--out", str(run))
    assert r.returncode == 2
    line = error_line(r)
    for word in ("already holds another run", "--resume", "--overwrite", "fresh --out"):
        assert word in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # metrics.jsonl too
    old_id = json.loads((run / "run.json").read_text())["run_id"]

    # as docs/checkpoints.md shows it (its run's id and last step are this run's)
    run1 = run.rename(run.parent / "run1")
    shown, r = doc_says(
        "test_train_checkpoints.py::test_a_second_run_in_the_same_folder_is_refused_and_overwrite_is_explicit",
        run1.parent,
    )
    run = run1.rename(run1.parent / "run")
    ck = run / "checkpoints"
    shown = re.sub(
        r"\(run \S+, checkpoints up to step-\d+\)", f"(run {old_id}, checkpoints up to step-000006)", shown
    )
    assert r.returncode == 2 and error_line(r) == shown

    r = torchrig(*TRAIN, "--out", str(run), "--overwrite", "--steps", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--overwrite: removed the previous run's" in r.stderr and "metrics.jsonl" in r.stderr
    new_id = json.loads((run / "run.json").read_text())["run_id"]
    assert new_id != old_id
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-000002", "step-000004"]
    assert all(json.loads((p / "meta.json").read_text())["run_id"] == new_id for p in ck.glob("step-*"))
    assert steps(run) == [1, 2, 3, 4]


def test_resume_with_nothing_to_resume_from_is_exit_2(tmp_path, run):
    r = torchrig(*TRAIN, "--out", str(tmp_path / "tpyo"), "--resume")
    assert r.returncode == 2
    assert "--resume: no checkpoint to resume from" in error_line(r) and "--resume-if-possible" in r.stderr
    assert not (tmp_path / "tpyo").exists()
    # a latest that names nothing, and no checkpoint left: the same, nothing deleted
    for p in (run / "checkpoints").glob("step-*"):
        shutil.rmtree(p)
    r = torchrig(*TRAIN, "--out", str(run), "--resume", *TWO_RANKS)
    assert r.returncode == 2 and "no checkpoint to resume from" in error_line(r)
    assert (run / "metrics.jsonl").is_file()


def test_resuming_with_options_that_build_another_model_says_which_and_changes_nothing(run):
    """Not "the checkpoint is damaged": the options differ from the saved model's, and the error says how."""
    # the run folder's lock file says who held it last (rundir.LOCK_FILE): no data of the run
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".torchrig.lock"}
    r = torchrig(*TRAIN, "--out", str(run), "--resume", "--seq-len", "32")
    assert r.returncode == 2
    line = error_line(r)
    assert "holds another model than this run builds: context 64 (saved) vs 32" in line, line
    assert "saved with --size tiny" in line and "damaged" not in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".torchrig.lock"} == before


def test_flipped_bytes_in_a_shard_export_refuses_and_resume_falls_back_on_two_ranks(run):
    ck = run / "checkpoints"
    bad = shard(ck / "step-000006")
    flip(bad)
    r = torchrig("export", str(run), "--format", "pt2")
    assert r.returncode == 2
    line = error_line(r)
    assert str(bad) in line and "damaged" in line and str(ck / "step-000004") in line
    assert not (run / "export").exists()

    r = torchrig(*TRAIN, "--out", str(run), "--resume", "--steps", "8", *TWO_RANKS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming from {ck / 'step-000004'}, not a newer one: step-000006: {bad}" in r.stderr
    resume = [x for x in records(run) if x.get("event") == "resume"]
    assert resume[-1]["step"] == 4 and resume[-1]["world_size"] == 2
    assert steps(run) == list(range(1, 9))  # each step once: 5 and 6 again, from the intact checkpoint
    assert (ck / "latest").read_text() == "step-000008\n"
    r = torchrig("export", str(run), "--format", "pt2")
    assert r.returncode == 0, r.stderr[-3000:]


def test_every_checkpoint_damaged_is_exit_2_even_if_possible(run):
    ck = run / "checkpoints"
    for p in ck.glob("step-*"):
        flip(shard(p))
    metrics = (run / "metrics.jsonl").read_bytes()
    for flag in ("--resume", "--resume-if-possible"):
        r = torchrig(*TRAIN, "--out", str(run), flag, "--steps", "8")
        assert r.returncode == 2
        line = error_line(r)
        assert "no intact checkpoint to resume from" in line
        assert all(str(shard(p)) in line for p in ck.glob("step-*"))
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert len(list(ck.glob("step-*"))) == 3


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_metadata_is_refused_by_export_and_resume_and_never_runs(run, tmp_path):
    """The attacker also rewrites meta.json's checksums, so only the unpickler stands in the way."""
    ck = run / "checkpoints"
    marker = tmp_path / f"ran-{uuid.uuid4().hex[:6]}"
    for p in ck.glob("step-*"):
        data = pickle.dumps(_Payload(marker))
        (p / ".metadata").write_bytes(data)
        meta = json.loads((p / "meta.json").read_text())
        meta["files"][".metadata"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (p / "meta.json").write_text(json.dumps(meta))
    r = torchrig("export", str(run), "--format", "pt2")
    assert r.returncode == 2
    line = error_line(r)
    assert "refused" in line and "system" in line and str(ck / "step-000006" / ".metadata") in line
    r = torchrig(*TRAIN, "--out", str(run), "--resume", "--steps", "8")
    assert r.returncode == 2 and "refused" in error_line(r)
    assert not marker.exists()

    # as docs/checkpoints.md shows it
    suspicious = run.rename(run.parent / "suspicious-run")
    shown, r = doc_says(
        "test_train_checkpoints.py::test_a_crafted_metadata_is_refused_by_export_and_resume_and_never_runs",
        suspicious.parent,
    )
    assert r.returncode == 2 and error_line(r) == shown.replace("step-000500", "step-000006")
    assert not marker.exists()


def test_pruning_never_deletes_another_runs_checkpoint(run):
    ck = run / "checkpoints"
    foreign = ck / "step-000100"  # another run's, with a higher number (the old pruning sorted by name)
    shutil.copytree(ck / "step-000002", foreign)
    meta = json.loads((foreign / "meta.json").read_text())
    (foreign / "meta.json").write_text(json.dumps({**meta, "step": 100, "run_id": "another-run"}))
    r = torchrig(*TRAIN, "--out", str(run), "--resume", "--steps", "10", "--keep-ckpts", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-000010", "step-000100"]
    assert (ck / "latest").read_text() == "step-000010\n"
    assert steps(run) == list(range(1, 11))


def _mount_tmpfs(path: Path, size: str) -> str | None:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return "needs root to mount a small tmpfs"
    path.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "torchrig-test", str(path)])
    return None if r.returncode == 0 else "mount -t tmpfs failed"


def test_a_full_disk_is_reported_as_one_and_the_rank_logs_survive(tmp_path):
    disk = tmp_path / "disk"
    why = _mount_tmpfs(disk, "5M")  # a tiny GPT checkpoint takes ~1.9 MiB: the third save does not fit
    if why:
        pytest.skip(why)
    try:
        out = disk / "run"
        r = torchrig(*TRAIN, "--out", str(out), "--steps", "12", *TWO_RANKS)
        assert r.returncode == 1, r.stderr[-3000:]
        ck = out / "checkpoints"
        good = ck / (ck / "latest").read_text().strip()
        expected = f"the last good checkpoint is {good}"
        lines = [x for x in r.stderr.splitlines() if "torchrig: error: disk full: saving step-" in x]
        assert lines, r.stderr[-3000:]
        assert f"to {ck} failed with" in lines[0] and "left on that filesystem" in lines[0]
        assert expected in lines[0]
        # the rank logs on the same disk hold the same line; the partial save is gone; latest is intact
        logs = list((out / "logs").rglob("stderr.log"))
        assert len(logs) == 2 and all("disk full: saving" in p.read_text() for p in logs)
        assert not list(ck.glob("*.tmp"))
        from torchrig.train import rundir

        assert rundir.verify(good) == []
    finally:
        subprocess.run(["umount", str(disk)])
