"""The log step's reads on a GPU (train/logstep.py): a pinned copy behind a CUDA event, read after the next step
is queued. Logging every step keeps every record and the loss curve of logging every 5th; a diverging run
without checkpoints still stops at the record that first sees the NaN/inf.

Run on the GPU machine: ``python3 -m pytest -q tests/gpu/test_train_logstep_gpu.py``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

RUN = ["train", "--model", "gpt", "--size", "tiny", "--precision", "bf16", "--device", "cuda", "--workers", "0",
       "--no-tensorboard", "--data", "generated", "--seed", "3"]  # fmt: skip


def torchrig(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID")}
    return subprocess.run(
        [sys.executable, "-m", "torchrig", *args], capture_output=True, text=True, env=env, timeout=900
    )


def rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_reads_are_a_pinned_copy_behind_an_event(tmp_path):
    from types import SimpleNamespace

    from torchrig.train.finite import NonFiniteWatch
    from torchrig.train.logstep import LogReader
    from torchrig.train.metrics import Metrics

    job = SimpleNamespace(skipped=[], rt=SimpleNamespace(world=1, restart=0), watch=None, units_per_step=1,
                          unit="tokens", flops_per_unit=1.0, nonfinite=NonFiniteWatch(torch.device("cuda")),
                          cfg=SimpleNamespace(on_nonfinite="stop"))  # fmt: skip
    seen = []
    reader = LogReader(job, Metrics(tmp_path, 3, enabled=True, tensorboard=False), None,
                       {"step": 0, "t": time.perf_counter()}, lambda f, at: seen.append(f), lambda s: 0.0)  # fmt: skip
    loss_sum = torch.tensor(6.0, device="cuda")
    torch.cuda._sleep(50_000_000)  # the GPU is busy: queueing must not wait for it
    reader.queue(3, loss_sum, torch.tensor(2.0, device="cuda"))
    loss_sum.zero_()
    assert reader.pending is not None and reader.pending.event is not None and reader.pending.host.is_pinned()
    assert math.isclose(reader.finish() or 0.0, 2.0) and seen == [None]


@pytest.mark.parametrize("extra", [[], ["--compile"]], ids=["eager", "compiled"])
def test_logging_every_step_keeps_every_record_and_the_curve(tmp_path, extra):
    runs = {}
    for every in ("1", "5"):
        out = tmp_path / f"every{every}"
        r = torchrig(*RUN, *extra, "--steps", "20", "--log-every", every, "--out", str(out))
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        runs[every] = [x for x in rows(out) if "loss" in x and "event" not in x]
    assert [x["step"] for x in runs["1"]] == list(range(1, 21))
    assert [x["step"] for x in runs["5"]] == [5, 10, 15, 20]
    for rec in runs["5"]:
        mean = sum(x["loss"] for x in runs["1"] if rec["step"] - 5 < x["step"] <= rec["step"]) / 5
        assert abs(mean - rec["loss"]) < 0.005, (rec, mean)


def test_a_diverging_run_without_checkpoints_stops_at_the_record_that_sees_it(tmp_path):
    out = tmp_path / "run"
    r = torchrig(*RUN, "--compile", "--steps", "30", "--lr", "100", "--warmup-steps", "20", "--log-every", "3",
                 "--out", str(out))  # fmt: skip
    text = r.stdout + r.stderr
    assert r.returncode == 1, text[-4000:]
    first = int(re.search(r"training diverged: NaN/inf loss or gradient at step (\d+)", text).group(1))
    found = [x for x in rows(out) if x.get("event") == "nonfinite"]
    assert found and found[0]["step"] == first and found[0]["found_at"].startswith("log of step ")
    seen_at = int(found[0]["found_at"].rsplit(" ", 1)[1])
    assert first <= seen_at < first + 3 and seen_at % 3 == 0
    logged = [x["step"] for x in rows(out) if "loss" in x and "event" not in x]
    assert logged == list(range(3, seen_at, 3)), logged  # every interval before it kept its record
