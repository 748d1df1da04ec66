"""The log step's reads (train/logstep.py): queued at the log step, written as a record once read."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from torchrig.train.finite import NonFiniteWatch
from torchrig.train.logstep import LogReader
from torchrig.train.metrics import Metrics


class Stop(Exception):
    pass


def _reader(tmp_path, *, skipped=(), nonfinite=None, on_nonfinite="stop"):
    job = SimpleNamespace(
        skipped=list(skipped),
        rt=SimpleNamespace(world=1, restart=0),
        nonfinite=nonfinite,
        cfg=SimpleNamespace(on_nonfinite=on_nonfinite),
        watch=None,
        units_per_step=100,
        unit="tokens",
        flops_per_unit=6.0,
    )
    metrics = Metrics(tmp_path, 10, enabled=True, tensorboard=False)
    checked: list[tuple[int | None, str]] = []

    def check(first, at):
        checked.append((first, at))
        if first is not None:
            raise Stop(f"step {first} at the {at}")

    last = {"step": 0, "t": time.perf_counter()}
    reader = LogReader(job, metrics, 1.0, last, check, lambda step: 0.1 * step)
    return reader, metrics, checked, last


def _records(metrics):
    if not metrics.path.exists():
        return []
    return [json.loads(line) for line in metrics.path.read_text().splitlines()]


def test_a_queued_log_step_is_written_only_when_finished_with_the_intervals_mean(tmp_path):
    reader, metrics, checked, last = _reader(tmp_path, nonfinite=NonFiniteWatch(torch.device("cpu")))
    loss_sum = torch.tensor(12.0)  # the losses of steps 1..4
    reader.queue(4, loss_sum, torch.tensor(0.5))
    loss_sum.zero_()  # the loop zeroes it right after: the record keeps its own copy
    assert _records(metrics) == []
    assert reader.finish() == pytest.approx(3.0)
    (rec,) = _records(metrics)
    assert rec["step"] == 4 and rec["loss"] == pytest.approx(3.0) and rec["grad_norm"] == pytest.approx(0.5)
    assert rec["lr"] == pytest.approx(0.4) and rec["tokens_per_s"] > 0 and rec["mfu"] is not None
    assert checked == [(None, "log of step 4")] and last["step"] == 4
    assert reader.finish() is None and len(_records(metrics)) == 1  # nothing queued: nothing written


def test_the_first_non_finite_step_stops_at_the_record_and_skipped_steps_leave_the_mean(tmp_path):
    watch = NonFiniteWatch(torch.device("cpu"))
    watch.note(3, torch.tensor(True))
    watch.note(4, torch.tensor(True))
    reader, metrics, _, _ = _reader(tmp_path, nonfinite=watch)
    reader.queue(5, torch.tensor(float("nan")), None)
    with pytest.raises(Stop, match="step 3 at the log of step 5"):
        reader.finish()
    assert _records(metrics) == [] and reader.pending is None

    reader, metrics, _, _ = _reader(tmp_path / "skip", skipped=[2, 3], on_nonfinite="skip")
    reader.queue(4, torch.tensor(3.0), torch.tensor(float("inf")))  # steps 1 and 4 count
    assert reader.finish() == pytest.approx(1.5)
    (rec,) = _records(metrics)
    assert rec["grad_norm"] is None  # JSON has no inf


def test_an_interval_whose_steps_were_all_skipped_has_no_loss(tmp_path):
    reader, metrics, _, _ = _reader(tmp_path, skipped=[1, 2], on_nonfinite="skip")
    assert reader.now(2, torch.tensor(0.0), None) is None
    (rec,) = _records(metrics)
    assert rec["loss"] is None and rec["step"] == 2


def test_a_run_that_stops_with_an_error_keeps_the_queued_record_or_drops_it_quietly(tmp_path):
    reader, metrics, _, _ = _reader(tmp_path)
    reader.queue(2, torch.tensor(4.0), None)
    reader.abandon()
    assert [r["step"] for r in _records(metrics)] == [2]

    watch = NonFiniteWatch(torch.device("cpu"))
    watch.note(1, torch.tensor(True))
    reader, metrics, _, _ = _reader(tmp_path / "bad", nonfinite=watch)
    reader.queue(2, torch.tensor(4.0), None)
    reader.abandon()  # its own check fails: the run's first error is the one reported
    assert _records(metrics) == [] and reader.pending is None


def test_a_second_queue_before_the_first_is_finished_is_a_bug_not_a_lost_record(tmp_path):
    reader, _, _, _ = _reader(tmp_path)
    reader.queue(1, torch.tensor(1.0), None)
    with pytest.raises(AssertionError):
        reader.queue(2, torch.tensor(1.0), None)


class _Event:
    """A CUDA event as the reader sees it (query/synchronize): the device boundary."""

    def __init__(self, done: bool) -> None:
        self.done, self.waited = done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True


@pytest.mark.parametrize("done", [True, False])
def test_a_stopping_run_never_waits_for_the_gpu_to_write_the_queued_record(tmp_path, done):
    reader, metrics, _, _ = _reader(tmp_path)
    reader.queue(2, torch.tensor(4.0), None)
    assert reader.pending is not None
    event = reader.pending.event = _Event(done)  # type: ignore[assignment]
    reader.abandon()
    assert [r["step"] for r in _records(metrics)] == ([2] if done else [])
    assert reader.pending is None and event.waited is done  # a finished copy only: no wait on a stuck GPU
